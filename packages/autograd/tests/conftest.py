"""Test setup: verifier on after every pass, and the shared helpers (ag_util) importable."""

import os
import sys

os.environ.setdefault("KILN_VERIFY", "1")
sys.path.insert(0, os.path.dirname(__file__))

from kiln.graph import add_update_golden_option  # noqa: E402 - read after KILN_VERIFY is set


def pytest_addoption(parser):
    # golden pass tests (kiln.graph.check_golden): --update-golden rewrites the expected parts
    add_update_golden_option(parser)
