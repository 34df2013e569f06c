"""The compile report as one self-contained HTML page: inline CSS and SVG, no scripts, no external assets.

Sections: a summary, compile time by stage (chart), graph breaks, recompiles, eager fallbacks, cache
lookups, then one collapsible block per captured graph with its user source lines, guards, and each
stage's program (torch graph, ATen forward/backward, core ATen, loop IR, generated code, kernels).
"""

from __future__ import annotations

import platform
import time
from html import escape

import torch

from .chart import bar_chart_svg, stage_breakdown
from .collect import GraphRecord, Program, RunRecord, code_at
from .style import CSS

# stage text name -> heading, in the order a reader follows the pipeline
STAGE_TITLES = {
    "aot_inference": "ATen graph (inference)", "aot_forward": "ATen forward graph",
    "aot_backward": "ATen backward graph", "aten": "ATen graph", "graph": "torch graph",
    "core_aten": "core ATen graph (after decompositions)", "ir_pre_fusion": "loop IR (before fusion)",
    "ir_post_fusion": "loop IR (scheduled, after fusion)", "kernels": "kernels and extern calls",
    "output_code": "generated code", "timings": "pass timings", "fallbacks": "fallbacks",
}


MAX_TEXT = 400_000  # characters of one program shown; a page stays quick to open with a large model's code


def _pre(text: str, cls: str = "") -> str:
    if len(text) > MAX_TEXT:
        rest = text[MAX_TEXT:].count("\n")
        text = text[:MAX_TEXT] + f"\n... {rest} more lines not shown (KILN_DEBUG_DIR=dir writes every stage in full)"
    return f'<pre class="{cls}">{escape(text)}</pre>' if cls else f"<pre>{escape(text)}</pre>"


def _details(summary: str, body: str, cls: str = "", is_open: bool = False) -> str:
    attrs = (f' class="{cls}"' if cls else "") + (" open" if is_open else "")
    return f"<details{attrs}><summary>{summary}</summary><div class=\"body\">{body}</div></details>"


def _stack(user_stack: tuple[str, ...]) -> str:
    """A break's user stack with each line's code, innermost first."""
    return "\n".join(f"{where}\n    {code_at(where)}" for where in user_stack)


def _summary_table(run: RunRecord, title: str) -> str:
    compile_s = sum(t.seconds for t in run.times if t.stage == "capture") + run.backend_seconds
    hits = sum(c.hit for c in run.cache)
    cells = [("graphs", len(run.graphs)), ("graph breaks", len(run.breaks)), ("recompiles", len(run.recompiles)),
             ("frames run eagerly", len(run.eager_frames)), ("graphs run op by op", len(run.eager_graphs)),
             ("cache hits / misses", f"{hits} / {len(run.cache) - hits}"), ("compile s", f"{compile_s:.2f}")]
    rows = "".join(f'<tr><th>{k}</th><td class="num" data-key="{escape(k)}">{v}</td></tr>' for k, v in cells)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
    error = (f'<details class="error" open><summary>the run raised</summary>{_pre(run.error)}</details>'
             if run.error else "")
    return (f"<h1>kiln compile report</h1><p class=\"meta\">{escape(title)} · {when} · Python "
            f"{platform.python_version()} · torch {torch.__version__}</p>{error}<table class=\"summary\">{rows}</table>")


def _events_section(run: RunRecord) -> str:
    breaks = "".join(f'<li class="break"><span class="reason">{escape(b.reason)}</span>'
                     f'<span class="where">in {escape(b.frame)}</span>{_pre(_stack(b.user_stack))}</li>'
                     for b in run.breaks)
    recompiles = "".join(f'<li class="recompile"><span class="reason">{escape(r.reason)}</span>'
                         f'<span class="where">{escape(r.frame)}</span></li>' for r in run.recompiles)
    eager = "".join(f'<li class="eager"><span class="reason">{escape(e.reason)}</span>'
                    f'<span class="where">{escape(e.frame)}</span></li>' for e in run.eager_frames)
    eager += "".join(f'<li class="eager"><span class="reason">{escape(e.reason)}</span></li>'
                     for e in run.eager_graphs)
    cache = "".join(f'<li>{"hit" if c.hit else "miss"} {escape(c.key)} ({escape(c.backend)})</li>' for c in run.cache)
    out = [_event_list("breaks", f"Graph breaks ({len(run.breaks)})", breaks),
           _event_list("recompiles", f"Recompiles ({len(run.recompiles)})", recompiles),
           _event_list("fallbacks", f"Run eagerly ({len(run.eager_frames) + len(run.eager_graphs)})", eager)]
    if run.cache:
        out.append(_details(f"Graph cache lookups ({len(run.cache)})", f"<ul>{cache}</ul>", "cache"))
    return "".join(out)


def _event_list(section: str, title: str, items: str) -> str:
    body = f'<ol class="events">{items}</ol>' if items else '<p class="none dim">none</p>'
    return f'<section id="{section}"><h2>{title}</h2>{body}</section>'


def _program_block(p: Program, role: str) -> str:
    parts = []
    for stage, text in p.texts.items():
        title = STAGE_TITLES.get(stage, stage)
        lines = text.count("\n") + 1
        parts.append(_details(f"{escape(title)} <span class=\"dim\">{lines} lines</span>",
                              _pre(text), f"stage stage-{escape(stage)}"))
    return f'<div class="program"><h4>{escape(role)} <span class="dim">{escape(p.graph_id)}</span></h4>{"".join(parts)}</div>'


def _roles(g: GraphRecord) -> list[str]:
    """Names for the graph's programs: the ATen trace, then the compiled forward/backward/inference."""
    aot = next((p for p in g.programs if p.kind == "aot"), None)
    training = aot is not None and "aot_backward" in aot.texts
    names = iter(["forward", "backward"] if training else ["inference"])
    return ["ATen trace" if p.kind == "aot" else f"compiled {next(names, p.kind)}" for p in g.programs]


def _graph_block(g: GraphRecord) -> str:
    badges = [f'<span class="badge">{escape(g.backend or "not compiled")}</span>']
    if g.recompile_reason:
        badges.append('<span class="badge warn">recompile</span>')
    if g.breaks:
        badges.append('<span class="badge warn">break after</span>')
    if g.eager:
        badges.append('<span class="badge bad">runs op by op</span>')
    if any(c.hit for c in g.cache):
        badges.append('<span class="badge ok">cache hit</span>')
    nodes = len(g.captured.gm.graph.nodes) if g.captured is not None else 0
    head = (f"graph {g.index} · {escape(g.frame)} · {nodes} nodes · capture {g.capture_seconds:.3f} s · "
            f"backend {g.backend_seconds:.3f} s {''.join(badges)}")
    body = []
    if g.recompile_reason:
        body.append(f'<p class="recompile">recompiled because {escape(g.recompile_reason)}</p>')
    for b in g.breaks:
        body.append(f'<p class="break">graph break after this graph: <span class="reason">{escape(b.reason)}</span>'
                    f" at {escape(b.user_stack[0] if b.user_stack else '?')}</p>")
    for e in g.eager:
        body.append(f'<p class="eager">{escape(e.reason)}</p>')
    if any(c.hit for c in g.cache):
        body.append('<p class="dim">loaded from the graph cache: the compiler stages did not run in this '
                    "process; the programs below are the texts stored with the entry</p>")
    src = g.source_lines()
    if src:
        body.append("<h4>user source lines</h4>" + '<table class="source">' + "".join(
            f'<tr><td class="where">{escape(w)}</td><td><code>{escape(c)}</code></td></tr>' for w, c in src)
            + "</table>")
    if g.captured is not None:
        body.append(_details(f"guards <span class=\"dim\">{len(g.captured.guards.guards)}</span>",
                             _pre(g.captured.guards.as_text()), "guards"))
        body.append(_details("captured torch graph", _pre(g.captured.as_text()), "stage stage-torch"))
    for p, role in zip(g.programs, _roles(g)):
        body.append(_program_block(p, role))
    return _details(head, "".join(body), f"graph graph-{g.index}")


def render(run: RunRecord, title: str) -> str:
    """The whole page for one run."""
    rows = stage_breakdown(run)
    table = "".join(f'<tr><td>{escape(label)}</td><td class="num">{s:.3f}</td></tr>' for label, s in rows)
    time_section = (f'<section id="time"><h2>Compile time by stage</h2>{bar_chart_svg(rows)}'
                    f'<table class="times"><tr><th>stage</th><th>seconds</th></tr>{table}</table></section>')
    graphs = "".join(_graph_block(g) for g in run.graphs)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kiln compile report: "
            f"{escape(title)}</title><style>{CSS}</style></head><body>{_summary_table(run, title)}"
            f"{time_section}{_events_section(run)}<section id=\"graphs\"><h2>Graphs ({len(run.graphs)})</h2>"
            f"{graphs or '<p class=none>no graph was captured</p>'}</section></body></html>")
