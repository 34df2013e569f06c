"""Command-line options shared by the suite runner and the micro-benchmarks."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from .backends import BACKENDS

DEFAULT_OUT = Path("benchmarks/out")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_common(p: argparse.ArgumentParser, *, backends: bool = True) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    if backends:
        p.add_argument("--backends", type=csv, default=list(BACKENDS),
                       help="comma list of eager,kiln,torch_compile (default: all three)")
    p.add_argument("--kiln-backend", default="inductor",
                   help="backend passed to kiln.compile: inductor|aot_eager|eager")
    p.add_argument("--tc-backend", default=None,
                   help="backend passed to torch.compile (default: same as --kiln-backend)")
    p.add_argument("--small", action="store_true", help="tiny configs for quick runs")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/out/<name>-<time>)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds before one isolated child process is killed")
    p.add_argument("--kiln-options", type=json.loads, default={},
                   help='kiln.compile(options=...) as JSON, e.g. \'{"wrapper": "cpp"}\'')
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of every child (OMP_NUM_THREADS); default: torch's default. "
                        "1 gives steadier numbers on a shared machine")


def finish(args: argparse.Namespace, name: str) -> argparse.Namespace:
    if args.device is None:
        args.device = default_device()
    if getattr(args, "backends", None):
        bad = [b for b in args.backends if b not in BACKENDS]
        if bad:
            raise SystemExit(f"unknown backend(s) {bad}; use {', '.join(BACKENDS)}")
    if args.tc_backend is None:
        args.tc_backend = args.kiln_backend
    if args.out is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = DEFAULT_OUT / f"{name}-{stamp}"
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for isolated children derived from the common options."""
    env: dict[str, str] = {}
    if getattr(args, "threads", None):
        env["OMP_NUM_THREADS"] = str(args.threads)
    return env
