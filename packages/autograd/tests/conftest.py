"""Test setup: verifier on after every pass, and the shared helpers (ag_util) importable."""

import os
import sys

os.environ.setdefault("KILN_VERIFY", "1")
sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    # golden pass tests (kiln.graph.check_golden): rewrite the expected parts instead of checking them
    try:
        parser.addoption("--update-golden", action="store_true",
                         default=os.environ.get("KILN_UPDATE_GOLDEN", "0") not in ("", "0"),
                         help="rewrite golden files (tests/golden/*.txt) instead of comparing; review the diff")
    except ValueError:  # already added by another package's conftest (one pytest over every root)
        pass
