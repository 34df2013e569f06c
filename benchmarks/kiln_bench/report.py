"""Reports: machine description, Markdown tables, JSON and the speedup bar chart."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .measure import geomean

REPO_ROOT = Path(__file__).resolve().parents[2]


def machine_info(device: str | None = None, module: str | None = None,
                 threads: int | None = None) -> dict[str, Any]:
    """What the numbers were measured on (kept with every result)."""
    import torch

    argv = ["-m", module, *sys.argv[1:]] if module else sys.argv
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", *argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_threads": threads or torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "git": _git_commit(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - optional
        info["triton"] = None
    if torch.cuda.is_available() and (device is None or device.startswith("cuda")):
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or '?'} ({os.cpu_count()} cores)"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_line(info: dict[str, Any]) -> str:
    dev = f"GPU {info['gpu']} (CUDA {info.get('cuda')}), " if info.get("gpu") else ""
    return (f"{dev}CPU {info['cpu']}, {info['cpu_threads']} torch threads, load average "
            f"{info.get('load_avg_1m')} at start; Python {info['python']},"
            f" torch {info['torch']}, triton {info.get('triton')}; git {info.get('git')};"
            f" {info['date_utc']}")


# --------------------------------------------------------------------------- formatting


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return str(value)


def na(error: str, limit: int = 70) -> str:
    """Table cell for a failed row: ``n/a (<reason>)``, reason shortened; full text in notes."""
    reason = error if len(error) <= limit else error[: limit - 3] + "..."
    return f"n/a ({reason.replace('|', '/')})"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(c) for c in r) + " |")
    return "\n".join(lines)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def geomean_cell(values: Sequence[float | None]) -> str:
    g = geomean(v for v in values if v is not None)
    n = sum(1 for v in values if v is not None)
    return "-" if g is None else f"{g:.2f} (n={n})"


# --------------------------------------------------------------------------- chart


def bar_chart(path: Path, groups: dict[str, list[tuple[str, dict[str, float | None]]]],
              title: str, ylabel: str = "speedup over eager (x)") -> str | None:
    """Grouped bars: one subplot per group (e.g. mode), one bar per series per label.

    ``groups``: group name -> [(x label, {series name: value or None})]. Returns None on success
    or the reason no chart was written (matplotlib missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001 - the chart is optional; say why it is missing
        return f"no chart: matplotlib unavailable ({type(exc).__name__}: {exc})"
    groups = {k: v for k, v in groups.items() if v}
    if not groups:
        return "no chart: nothing measured"
    fig, axes = plt.subplots(len(groups), 1, figsize=(max(6.0, 1.3 * max(
        len(v) for v in groups.values()) + 2), 3.6 * len(groups)), squeeze=False)
    colors = {"kiln": "#d95f02", "torch.compile": "#1b9e77", "eager": "#7570b3"}
    for ax, (group, items) in zip(axes[:, 0], groups.items()):
        series = sorted({s for _, vals in items for s in vals}, key=lambda s: s != "kiln")
        width = 0.8 / max(1, len(series))
        for i, name in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(items))]
            ys = [vals.get(name) for _, vals in items]
            ax.bar(xs, [y if y is not None else 0.0 for y in ys], width, label=name,
                   color=colors.get(name))
            for x, y in zip(xs, ys):
                ax.text(x, (y if y is not None else 0) + 0.02, "n/a" if y is None else f"{y:.2f}",
                        ha="center", va="bottom", fontsize=7, rotation=90 if y is None else 0)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlim(-0.6, len(items) - 0.4)
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels([label for label, _ in items], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} - {group}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_micro(out: Path, name: str, title: str, info: dict[str, Any], body_md: str,
                payload: dict[str, Any]) -> str:
    """Write ``<name>.md`` and ``<name>.json`` for a micro-benchmark; return the Markdown."""
    md = (f"## {title}\n\nCommand: `{info['command']}`\n\nMachine: {machine_line(info)}\n\n"
          f"{body_md}\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(md)
    write_json(out / f"{name}.json", {"meta": info, **payload})
    return md
