"""pytest plugin (tools/run_tests.py loads it): longest test files first.

run_tests.py hands whole files to the xdist workers (``--dist loadfile``): a module-scoped fixture (a
package built with g++, a model exported once) is then set up by one worker only, where ``--dist load``
split a file's tests between both workers and built it twice. Files are sent in collection order, so
this plugin orders the collection by each file's recorded seconds (tools/test_durations.json, written
by ``tools/run_tests.py --record-durations``), longest first: the long files start while the other
worker works through the short ones, instead of one long file left running alone at the end of a root.
A file the table does not know keeps its place after the known ones (a stable sort; the table is a
schedule, never a test selection).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "test_durations.json"


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """File (relative to the repository root) -> seconds; empty when the table is missing or unreadable."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in table.items()} if isinstance(table, dict) else {}


def order(nodeids: list[str], durations: dict[str, float]) -> list[int]:
    """Indices of ``nodeids`` with the longest files first; within a file, and among unknown files,
    the collection order is kept."""
    return sorted(range(len(nodeids)), key=lambda i: -durations.get(nodeids[i].split("::")[0], 0.0))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    durations = load_durations()
    if durations:
        items[:] = [items[i] for i in order([it.nodeid for it in items], durations)]
