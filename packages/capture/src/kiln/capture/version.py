"""The running CPython version, for the few opcodes whose stack layout changed across 3.11-3.13."""

import sys

PY = sys.version_info[:2]
