"""pytest plugin (tools/run_tests.py loads it): longest test files first; a file with a module-scoped
fixture goes to one worker.

run_tests.py runs the workers with ``--dist loadgroup``: a test is sent alone, except the tests of a file
that use a module- (or class-, package-) scoped fixture -- a package built with g++, a model exported
once, one spawn of gloo ranks -- which this plugin puts in one ``xdist_group`` (the file), so that
fixture is set up by one worker only (``--dist load`` split such a file between both workers and built
it twice). A file of independent long tests (autograd's model suite) is still shared by both workers.
Work is sent in collection order, so the plugin orders the collection by each file's recorded seconds
(tools/test_durations.json, written by ``tools/run_tests.py --record-durations``), longest first: the
long files start while the other worker works through the short ones, instead of one long file left
running alone at the end of a root. A file the table does not know keeps its place after the known ones
(a stable sort; the table is a schedule, never a test selection).
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


def shares_setup(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture set up once for several tests of its file."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(getattr(d, "scope", "function") in ("class", "module", "package") for ds in defs for d in ds)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = {it.nodeid.split("::")[0] for it in items if shares_setup(it)}
    for it in items:
        if it.nodeid.split("::")[0] in grouped:
            it.add_marker(pytest.mark.xdist_group(it.nodeid.split("::")[0]))
    if config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False):
        for it in items:
            _group_in_nodeid(it)
    durations = load_durations()
    if durations:
        items[:] = [items[i] for i in order([it.nodeid for it in items], durations)]


def _group_in_nodeid(item: pytest.Item) -> None:
    """Append ``@group`` to the node id of an item in an ``xdist_group``, as xdist does.

    xdist 3.8 writes the suffix to ``item._nodeid``, which pytest 9.2 no longer reads (node ids are a
    structured ``_id`` there): the groups were silently ignored and a file's shared setup was split
    between the workers (the op_db count test saw 117 of its ops). Where ``_id`` exists the suffix goes
    there; xdist's own hook then finds the id already suffixed and changes nothing that is read.
    """
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    if not names or not hasattr(item, "_id"):
        return
    node_id = type(item._id)  # _pytest.nodeid.NodeId
    item._id = node_id.parse(f"{item.nodeid}@{'_'.join(names)}")
