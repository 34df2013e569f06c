"""Test setup: verifier on after every pass, and the shared helpers (ag_util) importable."""

import os
import sys

os.environ.setdefault("KILN_VERIFY", "1")
sys.path.insert(0, os.path.dirname(__file__))
