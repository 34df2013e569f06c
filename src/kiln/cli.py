"""The ``kiln`` command line: demo (the main job), explain, backends, cache."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch
import typer
from rich.console import Console

import kiln
import kiln.runtime as runtime
from kiln import demo as demo_mod
from kiln.backends import backend_doc
from kiln.knobs import child_environment
from kiln.report import run_script

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kiln: a staged compiler for PyTorch programs.")
cache_app = typer.Typer(help="Inspect or clear the on-disk compile cache.")
app.add_typer(cache_app, name="cache")
console = Console()


@app.command()
def demo(device: str | None = typer.Option(None, help="cpu or cuda (default: cuda if present)"),
         backend: str | None = typer.Option(None, help="backend (default: the most complete)"),
         verbose: bool = typer.Option(False, "--verbose", "-v", help="also print captured graphs and guards")) -> None:
    """Compile the built-in models; one table: graphs, breaks, compile time, speed against eager, and
    each model's saved artifact loaded and run in a fresh process."""
    raise typer.Exit(demo_mod.run_demo(device, backend, verbose, console))


@app.command()
def explain(target: str = typer.Argument(..., help="FILE.py:FUNC"),
            shape: list[str] = typer.Option([], "--shape", "-s",
                                            help="an input tensor shape, e.g. 4,8 (repeatable)"),
            dtype: str = typer.Option("float32", help="dtype of the --shape inputs")) -> None:
    """Print captured graphs and graph-break reasons of FUNC in FILE.py.

    Inputs come from --shape options (random tensors), or from FUNC_inputs() / example_inputs()
    defined in the file."""
    file, _, func = target.rpartition(":")
    if not file or not func:
        raise typer.BadParameter("expected FILE.py:FUNC")
    spec = importlib.util.spec_from_file_location(Path(file).stem, file)
    if spec is None or spec.loader is None:
        raise typer.BadParameter(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, func)
    if shape:
        dt = getattr(torch, dtype)
        args = tuple(torch.randn(*[int(s) for s in sh.split(",")], dtype=dt) for sh in shape)
    else:
        maker = getattr(module, f"{func}_inputs", None) or getattr(module, "example_inputs", None)
        if maker is None:
            raise typer.BadParameter(f"give --shape, or define {func}_inputs() in {file}")
        args = tuple(maker())
    console.print(kiln.explain(fn)(*args).as_text(), markup=False, highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def report(ctx: typer.Context,
           script: Path = typer.Argument(..., help="the Python script to run"),
           out: Path = typer.Option(Path("kiln-report"), "--out", "-o", help="folder for the page"),
           no_graph_cache: bool = typer.Option(
               False, "--no-graph-cache", help="compile every graph instead of loading it from the graph cache, "
                                               "so the page shows every stage's program (runs in a new process)"),
           in_child: bool = typer.Option(False, "--in-child", hidden=True)) -> None:
    """Run SCRIPT [ARGS...] and write its compile report: one self-contained HTML page with every graph,
    break, recompile, guard, each stage's program, the kernels and compile time by stage."""
    if no_graph_cache and not in_child:  # settings are read at import: a new process reads KILN_GRAPH_CACHE=0
        cmd = [sys.executable, "-m", "kiln.cli", "report", "--out", str(out), "--no-graph-cache", "--in-child",
               str(script), *ctx.args]
        raise typer.Exit(subprocess.run(cmd, env=child_environment(KILN_GRAPH_CACHE="0")).returncode)
    path, error = run_script(script, list(ctx.args), out)
    console.print(f"compile report: {path}", markup=False, highlight=False)
    if error is not None:
        console.print(f"[red]{script} failed:[/] {type(error).__name__}: {error}")
        raise typer.Exit(1)


@app.command()
def backends() -> None:
    """List the backends kiln.compile accepts."""
    for name in kiln.list_backends():
        console.print(f"[bold]{name:<12}[/] {backend_doc(name)}")


CACHE_DIR = typer.Option(None, "--dir", help="cache folder (default: KILN_CACHE_DIR or ~/.cache/kiln)")


@cache_app.command("info")
def cache_info(cache_dir: Path | None = CACHE_DIR) -> None:
    """Entries and bytes per namespace of the compile cache."""
    console.print(runtime.cache_info_text(cache_dir), markup=False)


@cache_app.command("clear")
def cache_clear(cache_dir: Path | None = CACHE_DIR) -> None:
    """Delete every entry of the compile cache."""
    console.print(runtime.cache_clear(cache_dir), markup=False)


@app.command("check-artifact", hidden=True)
def check_artifact(device: str, items: list[str]) -> None:
    raise typer.Exit(demo_mod.check_artifacts(device, items))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
