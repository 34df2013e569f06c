"""Every decomposition against eager on op_db sample inputs, forward and backward.

One generated test per OpInfo runs its samples under CrossRefMode; one generated test per rule in the
``core_aten`` table then checks that the rule was exercised and matched (hand-written samples in
``hand_samples.py`` cover ops no OpInfo reaches).
"""

from __future__ import annotations

import pytest
import torch

from kiln.decomp import table
from kiln.decomp.crossref import CrossRefMode, CrossRefReport
from kiln.decomp.registry import op_name

from .hand_samples import HAND_SAMPLES
from .opdb_support import opinfo_id, run_opinfo, selected_opinfos

REPORT = CrossRefReport()
MIN_CHECKED_OPS = 150


@pytest.mark.parametrize("opinfo", selected_opinfos(), ids=opinfo_id)
def test_opinfo_samples(opinfo):
    local = CrossRefReport()
    run_opinfo(opinfo, local)
    for k, v in local.checked.items():
        REPORT.checked[k] = REPORT.checked.get(k, 0) + v
    REPORT.failures.extend(local.failures)
    assert not local.failures, "\n".join(local.failures[:10])


@pytest.mark.parametrize("name", sorted(HAND_SAMPLES))
def test_hand_samples(name):
    local = CrossRefReport()
    mode = CrossRefMode(table("core_aten"), local)
    for op, args, kwargs in HAND_SAMPLES[name]:
        mode.check(op, tuple(args), dict(kwargs))
    for k, v in local.checked.items():
        REPORT.checked[k] = REPORT.checked.get(k, 0) + v
    assert not local.failures, "\n".join(local.failures[:10])
    assert name in local.checked, f"the hand-written samples never reached {name}"


@pytest.mark.parametrize("name", table("core_aten").names())
def test_decomposition(name):
    if not REPORT.checked and not REPORT.failures:
        pytest.skip("run with the op_db tests of this module (they collect the results)")
    if name not in REPORT.checked:
        pytest.skip(f"{name}: no op_db or hand-written sample reaches it")
    assert not [f for f in REPORT.failures if f.startswith(name + ":") or f.startswith(name + " ")]


def test_at_least_150_ops_checked():
    if not REPORT.checked:
        pytest.skip("run with the op_db tests of this module")
    assert len(REPORT.checked) >= MIN_CHECKED_OPS, sorted(REPORT.checked)
