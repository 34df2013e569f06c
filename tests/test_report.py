"""The compile report: one self-contained HTML page per run, checked as text and rendered in Chromium."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kiln
from kiln.cli import app
from kiln.report import CompileReport

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: `apt-get install -y chromium` (Debian) to render "
                             "the compile report in a real browser")


@kiln.disable
def _opaque() -> None:
    """Runs in Python, never captured: calling it is a graph break."""


# a constant of this run, in the graphs: the graph cache (warm when KILN_CACHE_DIR is kept between runs)
# holds no entry for them, so every stage runs and shows on the page
NONCE = random.random() * 1e-6


def breaks_and_recompiles(x):
    y = torch.tanh(x) * 1.25 + NONCE
    _opaque()  # the graph break
    return (y - 0.75).exp().sum(-1)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """A run of two sizes (a break, then a recompile of both frames) compiled by inductor, as a page."""
    kiln.reset()
    f = kiln.compile(breaks_and_recompiles)
    with CompileReport("test_report") as report:
        for n in (8, 8, 12):
            x = torch.randn(3, n)
            torch.testing.assert_close(f(x), (torch.tanh(x) * 1.25 + NONCE - 0.75).exp().sum(-1))
    kiln.reset()
    return report.write(tmp_path_factory.mktemp("report"))


def test_the_page_holds_every_stage_of_every_graph(page: Path) -> None:
    html = page.read_text()
    assert html.count('<details class="graph graph-') == 4  # f and its resume function, twice (recompile)
    assert "marked kiln.disable" in html  # the break reason
    assert "guard failed: TENSOR_MATCH L[&#x27;x&#x27;]" in html  # the recompile reason
    for title in ("captured torch graph", "ATen graph (inference)", "core ATen graph", "loop IR (before fusion)",
                  "loop IR (scheduled, after fusion)", "generated code", "kernels and extern calls", "guards"):
        assert title in html, title
    assert "y = torch.tanh(x) * 1.25 + NONCE" in html  # the user's source line of the first graph
    assert '<svg class="chart"' in html and 'data-stage="capture"' in html and 'data-stage="autograd"' in html
    assert 'data-stage="inductor: ' in html  # inductor's passes (the larger ones by name)


def test_the_page_is_self_contained(page: Path) -> None:
    html = page.read_text()
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    assert not re.search(r"(src|href)\s*=", html)
    assert re.findall(r"https?://[^\"' ]+", html) == ["http://www.w3.org/2000/svg"]  # the SVG namespace only


def test_a_report_outside_its_block_collects_nothing() -> None:
    report = CompileReport("idle")
    kiln.compile(lambda x: x + 1, backend="eager")(torch.randn(2))
    assert report.collector.run.graphs == []


def test_kiln_report_runs_a_script_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import sys, torch, kiln\n"
                      "f = kiln.compile(lambda x: x.sin() * 3, backend='aot_eager')\n"
                      "f(torch.randn(4))\n"
                      "assert sys.argv[1:] == ['--steps', '2'], sys.argv\n")
    result = CliRunner().invoke(app, ["report", str(script), "--out", str(tmp_path / "out"), "--steps", "2"])
    assert result.exit_code == 0, result.output
    pages = list((tmp_path / "out").glob("kiln-report-*.html"))
    assert len(pages) == 1 and pages[0].name in result.output.replace("\n", "")
    assert pages[0].read_text().count('<details class="graph graph-') == 1


def test_kiln_report_env_writes_a_page_at_exit(tmp_path: Path) -> None:
    code = ("import torch, kiln\n"
            "kiln.compile(lambda x: x.cos() + 2, backend='aot_eager')(torch.randn(5))\n")
    env = {**os.environ, "KILN_REPORT": str(tmp_path), "KILN_CACHE_DIR": tempfile.mkdtemp()}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pages = list(tmp_path.glob("kiln-report-*.html"))
    assert len(pages) == 1, proc.stderr
    assert f"compile report written to {pages[0]}" in proc.stderr
    assert "ATen graph (inference)" in pages[0].read_text()


class _Dom(HTMLParser):
    """The elements of Chromium's serialized DOM that the test looks at."""

    def __init__(self) -> None:
        super().__init__()
        self.graphs = 0
        self.bars: list[str] = []
        self.svg = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "details" and "graph" in (a.get("class") or "").split():
            self.graphs += 1
        if tag == "svg":
            self.svg += 1
        if tag == "rect" and a.get("class") == "bar":
            self.bars.append(a.get("data-stage") or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp(prefix="kiln-chromium-")
    try:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--no-first-run", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@needs_chromium
def test_chromium_renders_the_page(page: Path, tmp_path: Path) -> None:
    proc = _chromium("--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    text = " ".join(dom.text)
    assert dom.graphs == 4
    assert "marked kiln.disable" in text
    assert dom.svg == 1 and {"capture", "autograd"} <= set(dom.bars)
    assert any(bar.startswith("inductor: ") for bar in dom.bars), dom.bars
    shot = tmp_path / "report.png"
    proc = _chromium("--window-size=1200,1600", f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 20_000, proc.stderr[-2000:]


def test_a_failing_script_still_gets_its_page(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import torch, kiln\n"
                      "kiln.compile(lambda x: x.tan(), backend='eager')(torch.randn(3))\n"
                      "raise RuntimeError('the script failed after compiling')\n")
    result = CliRunner().invoke(app, ["report", str(script), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    html = next((tmp_path / "out").glob("*.html")).read_text()
    assert "the run raised" in html and "the script failed after compiling" in html
    assert html.count('<details class="graph graph-') == 1


@pytest.mark.gpu
def test_a_cuda_run_shows_triton_kernels(tmp_path: Path) -> None:
    def f(x):
        return (x.sin() * 2.5).softmax(-1)
    kiln.reset()
    with CompileReport("gpu") as report:
        x = torch.randn(64, 128, device="cuda")
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
    html = report.write(tmp_path).read_text()
    assert "@triton.jit" in html and "kernels and extern calls" in html and "loop IR (before fusion)" in html


def test_a_graph_cache_hit_is_shown_as_such() -> None:
    def g(x):
        return torch.cosh(x) * 0.375 + 4  # constants of this test: the first compile misses the cache
    kiln.reset()
    kiln.compile(g, backend="aot_eager")(torch.randn(7))
    kiln.reset()  # the next call captures again and loads the stored program
    with CompileReport("cache") as report:
        x = torch.randn(7)
        torch.testing.assert_close(kiln.compile(g, backend="aot_eager")(x), torch.cosh(x) * 0.375 + 4)
    kiln.reset()
    run = report.collector.run
    assert [c.hit for c in run.cache] == [True] and len(run.graphs) == 1
    html = report.html()
    assert "cache hit" in html and "the compiler stages did not run in this process" in html


@pytest.mark.slow  # two fresh processes
def test_no_graph_cache_compiles_every_graph(tmp_path: Path) -> None:
    script = tmp_path / "twice.py"
    script.write_text("import torch, kiln\n"
                      "kiln.compile(lambda x: x.sinh() * 0.625, backend='aot_eager')(torch.randn(4))\n")
    env = {"KILN_CACHE_DIR": str(tmp_path / "cache")}
    for run in range(2):  # the second run would load the graph the first stored
        result = CliRunner().invoke(app, ["report", "--no-graph-cache", "--out", str(tmp_path / f"out{run}"),
                                          str(script)], env=env)
        assert result.exit_code == 0, result.output
        html = next((tmp_path / f"out{run}").glob("*.html")).read_text()
        assert 'data-key="cache hits / misses">0 / 0<' in html and "ATen graph (inference)" in html


def test_a_finished_report_stops_listening() -> None:
    from kiln.graph import EVENTS
    before = len(EVENTS.listeners)
    with CompileReport("short"):
        assert len(EVENTS.listeners) == before + 1
    assert len(EVENTS.listeners) == before and not EVENTS.keeps_texts()
