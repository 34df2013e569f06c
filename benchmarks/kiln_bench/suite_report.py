"""Tables, geomeans and the chart of the model suite (rows from ``suite_worker``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .backends import LABELS
from .measure import geomean
from .report import bar_chart, fmt, geomean_cell, machine_line, markdown_table, na, ratio

HEADERS = (
    "model", "mode", "dtype", "batch x size", "eager ms", "kiln ms", "kiln x", "torch.compile ms",
    "torch.compile x", "kiln / tc", "compile s (kiln / tc)", "peak MB (eager / kiln / tc)",
    "graphs/breaks (kiln / tc)", "out rel err (kiln / tc)", "grad rel err (kiln / tc)",
)


COMPILERS = ("kiln", "torch_compile")
DYNAMIC_HEADERS = (
    "model", "mode", "kiln static ms", "kiln dynamic ms", "kiln dynamic / static speed",
    "torch.compile static ms", "torch.compile dynamic ms", "torch.compile dynamic / static speed",
    "graphs/breaks dynamic (kiln / tc)", "out rel err dynamic (kiln / tc)",
)


def row_backend(backend: str, dynamic: bool) -> str:
    """The row name of ``backend`` compiled with dynamic=True (``kiln_dynamic``) or not."""
    return f"{backend}_dynamic" if dynamic and backend != "eager" else backend


def group_rows(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict]]:
    grouped: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        grouped.setdefault((r["model"], r["mode"]), {})[r["backend"]] = r
    return grouped


def speedups(by_backend: dict[str, dict]) -> dict[str, float | None]:
    eager = by_backend.get("eager", {}).get("median_ms")
    return {b: ratio(eager, by_backend.get(b, {}).get("median_ms"))
            for b in ("kiln", "torch_compile")}


def _ms(row: dict | None, show_error: bool = False) -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return na(row["error"]) if show_error else "-"
    return fmt(row.get("median_ms"))


def _x(row: dict | None, value: float | None) -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return na(row["error"])
    return fmt(value) if value is not None else "-"


def _pair(rows: Sequence[dict | None], key: str, digits: int = 1) -> str:
    return " / ".join("-" if r is None or r.get(key) is None else fmt(r[key], digits)
                      for r in rows)


def _graphs(row: dict | None) -> str:
    if row is None or row.get("error"):
        return "-"
    gi = row.get("graph_info") or {}
    if gi.get("error"):
        return "?"
    op_by_op = f" ({gi['op_by_op']} op by op)" if gi.get("op_by_op") else ""
    return f"{gi.get('graphs', '?')}/{gi.get('breaks', '?')}{op_by_op}"


def _err(row: dict | None, key: str) -> str:
    if row is None or row.get("error") or not row.get(key):
        return "-"
    acc = row[key]
    return acc["mismatch"] if acc.get("mismatch") else fmt(acc["max_rel"])


def row_cells(model: str, mode: str, by: dict[str, dict]) -> list[str]:
    e, k, t = by.get("eager"), by.get("kiln"), by.get("torch_compile")
    any_row = e or k or t or {}
    sp = speedups(by)
    k_ok = k is not None and not k.get("error")
    t_ok = t is not None and not t.get("error")
    # kiln / torch.compile as a speedup: torch.compile ms / kiln ms (> 1: kiln is faster).
    kt = ratio(t.get("median_ms"), k.get("median_ms")) if k_ok and t_ok else None
    return [
        model, mode, any_row.get("dtype", "-"), f"{any_row.get('batch', '?')}x{any_row.get('size', '?')}",
        _ms(e, show_error=True), _ms(k), _x(k, sp["kiln"]), _ms(t), _x(t, sp["torch_compile"]), fmt(kt),
        f"{_pair([k, t], 'compile_s')}", _pair([e, k, t], "peak_mb", 1),
        f"{_graphs(k)} / {_graphs(t)}",
        f"{_err(k, 'acc_out')} / {_err(t, 'acc_out')}",
        f"{_err(k, 'acc_grad')} / {_err(t, 'acc_grad')}",
    ]


def tables(rows: Sequence[dict[str, Any]]) -> str:
    grouped = group_rows(rows)
    out = []
    for mode in ("inference", "training"):
        keys = [k for k in grouped if k[1] == mode]
        if not keys:
            continue
        body = [row_cells(model, mode, grouped[(model, mode)]) for model, _ in keys]
        sps = [speedups(grouped[k]) for k in keys]
        kt = [ratio(grouped[k].get("torch_compile", {}).get("median_ms"),
                    grouped[k].get("kiln", {}).get("median_ms")) for k in keys]
        compile_ratio = [ratio(grouped[k].get("kiln", {}).get("compile_s"),
                               grouped[k].get("torch_compile", {}).get("compile_s")) for k in keys]
        body.append(["**geomean**", mode, "", "", "", "", geomean_cell([s["kiln"] for s in sps]), "",
                     geomean_cell([s["torch_compile"] for s in sps]), geomean_cell(kt),
                     "kiln/tc " + geomean_cell(compile_ratio), "", "", "", ""])
        out.append(f"### {mode}\n\n" + markdown_table(HEADERS, body))
    return "\n\n".join(out)


def dynamic_loss(grouped: dict[tuple[str, str], dict[str, dict]], mode: str,
                 compiler: str) -> dict[str, float | None]:
    """One compiler's dynamic=True against its static rows of ``mode``, over the models where both
    ran: geomean speedups over eager of each, and ``loss`` = 1 - dynamic geomean / static geomean
    (> 0: dynamic=True is slower)."""
    stat, dyn = [], []
    for (_, m), by in grouped.items():
        eager = by.get("eager", {}).get("median_ms")
        s_ms = by.get(compiler, {}).get("median_ms")
        d_ms = by.get(f"{compiler}_dynamic", {}).get("median_ms")
        if m == mode and eager and s_ms and d_ms:
            stat.append(eager / s_ms)
            dyn.append(eager / d_ms)
    gs, gd = geomean(stat), geomean(dyn)
    return {"static": gs, "dynamic": gd, "loss": (1 - gd / gs) if gs and gd else None, "models": len(stat)}


def dynamic_tables(rows: Sequence[dict[str, Any]]) -> str:
    """The dynamic=True rows beside each compiler's static ones (empty without ``--dynamic`` rows)."""
    grouped = group_rows(rows)
    if not any(b.endswith("_dynamic") for by in grouped.values() for b in by):
        return ""
    out = []
    for mode in ("inference", "training"):
        keys = [k for k in grouped if k[1] == mode]
        if not keys:
            continue
        body = []
        for model, _ in keys:
            by = grouped[(model, mode)]
            cells = [model, mode]
            for c in COMPILERS:
                st, dy = by.get(c), by.get(f"{c}_dynamic")
                ok = st and dy and st.get("median_ms") and dy.get("median_ms")
                cells += [_ms(st), _ms(dy, show_error=True), fmt(ratio(st["median_ms"], dy["median_ms"])) if ok else "-"]
            kd, td = by.get("kiln_dynamic"), by.get("torch_compile_dynamic")
            cells += [f"{_graphs(kd)} / {_graphs(td)}", f"{_err(kd, 'acc_out')} / {_err(td, 'acc_out')}"]
            body.append(cells)
        summary = ["**geomean**", mode]
        for c in COMPILERS:
            d = dynamic_loss(grouped, mode, c)
            summary += [f"{fmt(d['static'])}x eager", f"{fmt(d['dynamic'])}x eager",
                        "loss " + (f"{d['loss'] * 100:.1f}%" if d["loss"] is not None else "-")]
        body.append(summary + ["", ""])
        out.append(f"### {mode}, dynamic=True against static\n\n" + markdown_table(DYNAMIC_HEADERS, body))
    return "\n\n".join(out)


def notes(rows: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        if r.get("error"):
            lines.append(f"- {r['model']} {r['mode']} {LABELS.get(r['backend'], r['backend'])}: "
                         f"n/a ({r['error']})" + (f" [{r['error_stage']}]" if r.get("error_stage")
                                                   else ""))
        gi = r.get("graph_info") or {}
        if gi.get("error"):
            lines.append(f"- {r['model']} {r['mode']} {LABELS.get(r['backend'])}: graph count "
                         f"unavailable ({gi['error']})")
        elif gi.get("breaks"):
            lines.append(f"- {r['model']} {r['mode']} {LABELS.get(r['backend'])}: "
                         f"{gi['breaks']} graph breaks: {'; '.join(gi.get('reasons', []))}")
        if gi.get("op_by_op"):
            lines.append(f"- {r['model']} {r['mode']} {LABELS.get(r['backend'], r['backend'])}: {gi['op_by_op']} "
                         "graph(s) not compiled by kiln.inductor, run op by op through ATen (the log's perf_hints "
                         "say why)")
        if r.get("tiers"):
            lines.append(f"- {r['model']} {r['mode']} {LABELS.get(r['backend'], r['backend'])}: tiered graphs timed "
                         f"{r.get('tier_wait_s', 0):.1f} s after compiling, past the wrappers' trial; graphs per "
                         f"wrapper: {r['tiers']}")
    return "\n".join(lines)


def markdown(rows: Sequence[dict[str, Any]], info: dict[str, Any], settings: dict[str, Any]) -> str:
    parts = [
        "## Model suite: eager vs kiln vs torch.compile",
        f"Command: `{info['command']}`",
        f"Machine: {machine_line(info)}",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "Times are medians of individually timed steps after warm-up (synchronised on GPU), taken "
        "in alternating rounds over the backends of a model (eager, kiln, torch.compile, eager, ...) "
        "so that host-speed drift hits all alike; "
        "`x` = eager ms / backend ms; compile s = first call - steady-state call; peak MB = "
        + ("torch.cuda.max_memory_allocated over the timed steps" if info.get("gpu")
           and settings.get("device", "").startswith("cuda")
           else "increase of peak RSS over the timed steps (CPU)")
        + "; rel err = max|compiled - eager| / max|eager| (outputs; gradients for training).",
        tables(rows),
    ]
    dyn = dynamic_tables(rows)
    if dyn:
        parts.append("dynamic=True rows ran in a process of their own per model and mode (the compilers "
                     "only; speedups use the static process's eager time); loss = 1 - dynamic geomean / "
                     "static geomean over eager.\n\n" + dyn)
    n = notes(rows)
    if n:
        parts.append("Notes:\n\n" + n)
    return "\n\n".join(parts) + "\n"


def geomeans(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    grouped = group_rows(rows)
    result = {}
    for mode in ("inference", "training"):
        sps = [speedups(v) for k, v in grouped.items() if k[1] == mode]
        if sps:
            result[mode] = {b: geomean(s[b] for s in sps if s[b] is not None)
                            for b in ("kiln", "torch_compile")}
            for c in COMPILERS:
                d = dynamic_loss(grouped, mode, c)
                if d["models"]:
                    result[mode][f"{c}_dynamic"] = d["dynamic"]
                    result[mode][f"{c}_dynamic_loss"] = d["loss"]
    return result


def chart(path: Path, rows: Sequence[dict[str, Any]], title: str) -> str | None:
    grouped = group_rows(rows)
    groups: dict[str, list[tuple[str, dict[str, float | None]]]] = {}
    for (model, mode), by in grouped.items():
        sp = speedups(by)
        groups.setdefault(mode, []).append(
            (model, {"kiln": sp["kiln"], "torch.compile": sp["torch_compile"]}))
    for mode, g in geomeans(rows).items():
        if mode in groups:
            groups[mode].append(("geomean", {"kiln": g["kiln"], "torch.compile": g["torch_compile"]}))
    return bar_chart(path, groups, title)
