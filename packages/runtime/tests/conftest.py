"""Shared fixtures: a private compile cache per session (never ~/.cache), verification on."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("KILN_VERIFY", "1")
# Before kiln.runtime reads its knobs: the default cache of this test session is a temp dir.
_SESSION_CACHE = tempfile.mkdtemp(prefix="kiln-runtime-tests-")
os.environ["KILN_CACHE_DIR"] = _SESSION_CACHE

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # runtime_testlib: programs shared by the tests


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
