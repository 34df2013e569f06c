"""Every decomposition against eager on op_db sample inputs, forward and backward.

One generated test per (OpInfo, table) runs its samples under CrossRefMode: each op the table
decomposes is compared with eager, after the rule is applied to its fixpoint (so the ``prims`` run
checks the whole chain down to kiln_prims). One generated test per rule then checks that the rule was
exercised and matched; ``hand_samples.py`` covers ops no OpInfo reaches (composite ops among them).
"""

from __future__ import annotations

import pytest

from kiln.decomp import table
from kiln.decomp.crossref import VALUES_UNSPECIFIED, CrossRefMode, CrossRefReport
from kiln.decomp.opinfo_check import opinfo_id, run_opinfo, selected_opinfos
from kiln.decomp.registry import op_name

from .hand_samples import HAND_SAMPLES

# The per-rule and count tests read REPORTS, which the op_db tests fill in this process: the whole file
# runs on one xdist worker, in collection order (tools/pytest_order.py keeps it).
pytestmark = pytest.mark.xdist_group("packages/decomp/tests/test_opdb.py")

TABLES = ("core_aten", "prims")
REPORTS = {name: CrossRefReport() for name in TABLES}
MIN_CHECKED_OPS = 150
OPINFOS = selected_opinfos()


def _merge(name: str, local: CrossRefReport) -> None:
    for k, v in local.checked.items():
        REPORTS[name].checked[k] = REPORTS[name].checked.get(k, 0) + v
    REPORTS[name].failures.extend(local.failures)


@pytest.mark.parametrize("table_name", TABLES)
@pytest.mark.parametrize("opinfo", OPINFOS, ids=opinfo_id)
def test_opinfo_samples(opinfo, table_name):
    local = CrossRefReport()
    run_opinfo(opinfo, local, table_name)
    _merge(table_name, local)
    assert not local.failures, "\n".join(local.failures[:10])


@pytest.mark.parametrize("table_name", TABLES)
@pytest.mark.parametrize("name", sorted(HAND_SAMPLES))
def test_hand_samples(name, table_name):
    local = CrossRefReport()
    mode = CrossRefMode(table(table_name), local)
    for op, args, kwargs in HAND_SAMPLES[name]:
        mode.check(op, tuple(args), dict(kwargs))
    _merge(table_name, local)
    assert not local.failures, "\n".join(local.failures[:10])
    assert name in local.checked, f"the hand-written samples never reached {name}"


@pytest.mark.parametrize("table_name", TABLES)
@pytest.mark.parametrize("name", table("core_aten").names())
def test_decomposition(name, table_name):
    report = REPORTS[table_name]
    if not report.checked:
        pytest.skip("run together with the op_db tests of this module (they collect the results)")
    if name not in report.checked:
        pytest.skip(f"{name}: no op_db or hand-written sample reaches it")
    failed = [f for f in report.failures if f.startswith(name + ":") or f.startswith(name + " ")]
    assert not failed, failed[:5]


@pytest.mark.slow  # counts the whole op_db run: CI checks it on the default Python (noxfile.py)
@pytest.mark.parametrize("table_name", TABLES)
def test_at_least_150_ops_checked(table_name):
    report = REPORTS[table_name]
    if not report.checked:
        pytest.skip("run together with the op_db tests of this module")
    unspecified = {op_name(op) for op in VALUES_UNSPECIFIED}
    checked = {name for name in report.checked if name not in unspecified}
    assert len(checked) >= MIN_CHECKED_OPS, (len(checked), sorted(checked))
