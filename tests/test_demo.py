"""``kiln demo``: one summary table by default; graphs and guards with --verbose."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from kiln.cli import app

runner = CliRunner()


# the verbose run repeats the whole demo: model-scale, so the default Python only (noxfile.py)
@pytest.mark.parametrize("verbose", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_demo_prints_one_summary_table(verbose: bool) -> None:
    args = ["demo", "--device", "cpu", "--backend", "aot_eager"] + (["--verbose"] if verbose else [])
    result = runner.invoke(app, args, env={"COLUMNS": "100"})
    out = result.output
    assert result.exit_code == 0, out
    assert "demo OK" in out
    header = next(line for line in out.splitlines() if "compile s" in line and "speedup" in line)
    assert header.split()[:3] == ["model", "graphs", "breaks"]
    for model in ("transformer", "mlp"):
        row = next(line for line in out.splitlines() if line.strip().startswith(model + " "))
        cells = row.split()
        assert cells[1:3] == ["1", "0"], row  # one graph, no break: counted by kiln.stats()
        assert re.fullmatch(r"\d+\.\d+x", cells[6]), row  # speedup, no MISMATCH mark
        assert cells[7] == "ok", row  # the artifact matched eager in a fresh process
    assert ("guards" in out.lower()) == verbose  # --verbose adds captured graphs and guards
