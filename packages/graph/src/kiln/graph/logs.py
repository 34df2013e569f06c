"""Named logs (KILN_LOGS=graph_code,guards,...) shared by every stage.

Each artifact has a logger ``kiln.<name>``; enabling one sets it to INFO with a concise handler.
Stages call ``log(name).info(...)``, or check ``enabled(name)`` before building expensive text.
"""

from __future__ import annotations

import logging
import sys

LOG_NAMES: dict[str, str] = {
    "graph_code": "captured torch-dialect graphs as Python code",
    "guards": "the guards of each compiled cache entry",
    "recompiles": "why a cache entry missed and the function recompiled",
    "graph_breaks": "each graph break with its reason and user location",
    "aot_graphs": "forward/backward ATen graphs and saved-activation bytes",
    "ir_pre_fusion": "loop IR before scheduling",
    "ir_post_fusion": "loop IR after fusion",
    "output_code": "generated wrapper and kernel source",
    "cudagraphs": "CUDA graph recording, replays and skip reasons",
    "perf_hints": "fallbacks and missed optimisations",
    "cache": "compile cache hits, misses and rebuilt entries (graph-level cache)",
    "distributed": "calls that run in Python on every call (DDP, FSDP2 hooks) and collectives",
}

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[kiln.%(short)s] %(message)s"))


class _ShortName(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.short = record.name.removeprefix("kiln.")
        return True


_handler.addFilter(_ShortName())


def log(name: str) -> logging.Logger:
    """The logger for one named log; unknown names are a programming error."""
    if name not in LOG_NAMES:
        raise KeyError(f"unknown kiln log {name!r}; known: {', '.join(LOG_NAMES)}")
    return logging.getLogger(f"kiln.{name}")


def enabled(name: str) -> bool:
    return log(name).isEnabledFor(logging.INFO)


def set_logs(*names: str, **flags: bool) -> None:
    """Enable exactly the given logs (``set_logs("guards", recompiles=True)``); others are silenced."""
    wanted = set(names) | {k for k, v in flags.items() if v}
    if "all" in wanted:
        wanted = set(LOG_NAMES)
    unknown = wanted - set(LOG_NAMES)
    if unknown:
        raise ValueError(f"unknown kiln logs {sorted(unknown)}; known: {', '.join(LOG_NAMES)}")
    for name in LOG_NAMES:
        logger = log(name)
        logger.propagate = False
        if _handler not in logger.handlers:
            logger.addHandler(_handler)
        logger.setLevel(logging.INFO if name in wanted else logging.WARNING)


def parse_log_spec(spec: str) -> list[str]:
    return [s.strip() for s in spec.split(",") if s.strip()]


def apply_env_logs(spec: str) -> None:
    """Enable the logs named in KILN_LOGS (read once, in kiln.graph.knobs)."""
    if spec:
        set_logs(*parse_log_spec(spec))
