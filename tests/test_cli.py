"""The kiln command line (typer), run in-process."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kiln.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_backends_lists_the_builtin_backends() -> None:
    result = runner.invoke(app, ["backends"])
    assert result.exit_code == 0, result.output
    for name in ("eager", "aot_eager", "inductor"):
        assert name in result.output


def test_explain_prints_graphs_and_break_reasons() -> None:
    target = f"{ROOT / 'examples' / 'explain_me.py'}:f"
    result = runner.invoke(app, ["explain", target, "--shape", "4,8"])
    assert result.exit_code == 0, result.output
    assert "relu" in result.output
    assert "break" in result.output.lower()


def test_explain_uses_the_files_example_inputs() -> None:
    result = runner.invoke(app, ["explain", f"{ROOT / 'examples' / 'explain_me.py'}:f"])
    assert result.exit_code == 0, result.output


def test_explain_rejects_a_bad_target() -> None:
    result = runner.invoke(app, ["explain", "no_colon_here"])
    assert result.exit_code != 0


def test_cache_info_and_clear(tmp_path) -> None:
    import kiln.runtime as runtime

    cache = runtime.CompileCache(tmp_path / "cache")
    cache.put("kernels", "k1", b"x" * 100)
    info = runner.invoke(app, ["cache", "info", "--dir", str(tmp_path / "cache")])
    assert info.exit_code == 0, info.output
    assert "kernels" in info.output
    cleared = runner.invoke(app, ["cache", "clear", "--dir", str(tmp_path / "cache")])
    assert cleared.exit_code == 0, cleared.output
    assert "removed 1 files" in cleared.output
    assert cache.get("kernels", "k1") is None
