"""The meta-package's tests compile into a private cache folder: kiln's graph cache must not hand
them entries from other runs (or from the user's own ~/.cache/kiln)."""

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-tests-cache-"))
sys.path.insert(0, str(Path(__file__).parent))  # the tests' shared helpers (cpp_wrapper_helpers.py)


def _load_distributed_helpers():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "distributed_helpers.py"
    spec = importlib.util.spec_from_file_location("kiln_distributed_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def run_ranks():
    """``run_ranks(rank_fn, *args, world=2, timeout=240)``: rank_fn on spawned gloo ranks
    (distributed_helpers.py); the results by rank."""
    return _load_distributed_helpers().run_ranks


@contextmanager
def _stage_texts(stage: str) -> Iterator[list]:
    from kiln.graph import EVENTS, StageText
    got: list = []

    def keep(event: object) -> None:
        if isinstance(event, StageText) and event.stage == stage:
            got.append(event)
    EVENTS.subscribe(keep, texts=True)
    try:
        yield got
    finally:
        EVENTS.unsubscribe(keep)


@pytest.fixture
def stage_texts():
    """``with stage_texts("output_code") as texts:`` the StageText events (``graph_id``, ``stage``,
    ``text``) of that stage kiln emits inside the block: the generated code of the graphs it compiled."""
    return _stage_texts
