"""The compile-time breakdown: seconds per stage (inductor per pass) and an inline SVG bar chart of it."""

from __future__ import annotations

from collections import defaultdict
from html import escape

from .collect import RunRecord

COLORS = {"capture": "#4e79a7", "autograd": "#f28e2b", "inductor": "#59a14f", "backend": "#9c9c9c"}
SMALL = 0.01  # inductor passes below this share of the total are summed into one bar


def stage_breakdown(run: RunRecord) -> list[tuple[str, float]]:
    """(label, seconds) in pipeline order: capture, autograd, each inductor pass, the rest of the backends.

    "backend (other)" is the backends' own time outside autograd and inductor's passes: graph-cache
    lookups and stores, loading generated code, CUDA-graph wrapping, the eager and aot_eager backends.
    """
    per_stage: dict[str, float] = defaultdict(float)
    passes: dict[str, float] = defaultdict(float)
    for t in run.times:
        per_stage[t.stage] += t.seconds
        if t.stage == "inductor":
            passes[t.step] += t.seconds
    rows = [("capture", per_stage.pop("capture", 0.0)), ("autograd", per_stage.pop("autograd", 0.0))]
    inductor = per_stage.pop("inductor", 0.0)
    total = max(run.backend_seconds + rows[0][1], 1e-9)
    small = 0.0
    for step, seconds in passes.items():
        if seconds >= SMALL * total:
            rows.append((f"inductor: {step}", seconds))
        else:
            small += seconds
    if small:
        rows.append(("inductor: other passes", small))
    rows += sorted(per_stage.items())  # stages of other packages that emit times
    other = run.backend_seconds - rows[1][1] - inductor - sum(per_stage.values())
    rows.append(("backend (other)", max(other, 0.0)))
    return [(label, s) for label, s in rows if s > 0]


def _color(label: str) -> str:
    return COLORS.get(label.split(":")[0].split(" ")[0], COLORS["backend"])


def bar_chart_svg(rows: list[tuple[str, float]], width: int = 720) -> str:
    """A horizontal bar per (label, seconds), labelled with the seconds and the share of the total."""
    if not rows:
        return '<p class="empty">nothing was compiled</p>'
    label_w, value_w, row_h = 210, 110, 22
    bar_w = width - label_w - value_w
    top = max(s for _, s in rows)
    total = sum(s for _, s in rows)
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{row_h * len(rows) + 8}" role="img" aria-label="compile time by stage">']
    for i, (label, seconds) in enumerate(rows):
        y = 4 + i * row_h
        w = max(1.0, bar_w * seconds / top)
        share = 100 * seconds / total
        parts.append(
            f'<g class="row"><title>{escape(label)}: {seconds:.3f} s ({share:.1f}%)</title>'
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="bar" data-stage="{escape(label)}" x="{label_w}" y="{y + 3}" width="{w:.1f}" '
            f'height="{row_h - 6}" fill="{_color(label)}" rx="2"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{seconds:.3f} s · {share:.0f}%</text></g>')
    parts.append("</svg>")
    return "".join(parts)
