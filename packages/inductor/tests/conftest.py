import os
import sys
from pathlib import Path

os.environ.setdefault("KILN_VERIFY", "1")
sys.path.insert(0, str(Path(__file__).parent))

from kiln.graph import add_update_golden_option  # noqa: E402 - read after KILN_VERIFY is set


def pytest_addoption(parser):
    # golden pass tests (kiln.graph.check_golden): --update-golden rewrites the expected parts
    add_update_golden_option(parser)
