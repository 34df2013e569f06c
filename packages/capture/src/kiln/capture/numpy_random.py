"""NumPy's random numbers in compiled code: where the state lives, and when the draws happen.

Note: the rule. NumPy's generator state lives in NumPy, never in the graph. Every draw
(``np.random.rand(3, 4)``, ``rng.normal(size=5)`` on a ``RandomState``/``Generator`` read from the
frame) whose arguments are constants becomes a graph input computed by that very call, in Python,
on every call of the compiled function, just before the graph runs, in program order; seeds
(``np.random.seed(0)``) run at the same place in the same order, or after the graph when no draw of
the graph follows them. Nothing in a graph reads or writes NumPy's state, so running its NumPy RNG
calls in order before it gives eager's values and leaves the state exactly as eager leaves it (the
draws are the same calls, with the same arguments, in the same order). At capture nothing is drawn:
the shape and dtype come from the same call on a scratch generator. What this cannot model breaks
the graph and runs in Python: draws returning a Python scalar, arguments that are arrays or
symbolic sizes, ``shuffle`` (writes its argument), ``get_state``/``set_state``, a generator made
inside the compiled code, and any NumPy RNG call inside a ``torch.cond`` branch.
(torch.compile's rule is a graph break at every ``np.random`` call.)
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import GraphBreak
from .numpy_trace import liftable
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

_GLOBAL = "__import__('numpy').random.mtrand._rand"  # the RandomState behind np.random.*
_SEEDS = frozenset({"seed"})
_BREAKS = frozenset({"get_state", "set_state", "shuffle", "spawn", "bit_generator", "__getstate__",
                     "__setstate__", "__reduce__", "jumped", "bytes"})


def rng_call(fn: Any) -> tuple[Any, str] | None:
    """``(generator, method name)`` when ``fn`` is a NumPy RNG call, else None."""
    if "numpy" not in sys.modules:
        return None
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, (np.random.RandomState, np.random.Generator)):
        return owner, getattr(fn, "__name__", "")
    if fn is np.random.seed:
        return np.random.mtrand._rand, "seed"
    if not isinstance(fn, type) and str(getattr(fn, "__module__", "")).startswith("numpy.random") and \
            fn is not np.random.default_rng:  # set_bit_generator and the like: run in Python
        return None, getattr(fn, "__name__", "")
    return None


def call(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    """A NumPy RNG call met in traced code (see the module's note)."""
    owner, name = rng_call(fn)  # type: ignore[misc]
    what = f"numpy random {name}()"
    if frame.tracer.scopes:
        raise GraphBreak(f"{what} inside a torch.cond branch")
    if owner is None or name in _BREAKS or name.startswith("_"):
        raise GraphBreak(f"{what} reads, writes or hands out generator state", "it runs in Python between graphs")
    owner_src = _GLOBAL if owner is np.random.mtrand._rand else frame.tracer.source_of.get(id(owner))
    if owner_src is None:
        raise GraphBreak(f"{what} on a generator made inside compiled code", "it runs in Python between graphs")
    text = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
    if any(t is None for t in text):
        raise GraphBreak(f"{what} with an argument that is not a constant (an array, a tensor, a symbolic size)",
                         "it runs in Python between graphs")
    expr = f"{owner_src}.{name}({', '.join(text)})"  # type: ignore[arg-type]
    if name in _SEEDS:
        if fn is np.random.seed:
            expr = f"__import__('numpy').random.seed({', '.join(text)})"  # type: ignore[arg-type]
        effect = fn if fn is np.random.seed else getattr(owner, name)
        frame.tracer.rng_pending = (*frame.tracer.rng_pending, (effect, list(args), dict(kwargs), expr))
        return None
    example = _example(owner, name, args, kwargs, what)
    before = [e for *_, e in frame.tracer.rng_pending]
    source = f"({', '.join([*before, expr])},)[-1]" if before else expr
    fake = frame.tracer.lift_draw(torch.from_numpy(example), f"__import__('torch').from_numpy({source})")
    frame.tracer.rng_pending = ()
    return NumpyArray(frame.tracer.on_numpy_device(fake))


def _example(owner: Any, name: str, args: list, kwargs: dict, what: str) -> np.ndarray:
    """The same call on a scratch generator of the same kind: shape and dtype, no state touched."""
    scratch = np.random.default_rng(0) if isinstance(owner, np.random.Generator) else np.random.RandomState(0)
    try:
        out = getattr(scratch, name)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - eager raises the same error when the call runs in Python
        raise GraphBreak(f"{what} failed on a scratch generator ({type(e).__name__}: {e})",
                         "it runs in Python between graphs") from e
    if not isinstance(out, np.ndarray):
        raise GraphBreak(f"{what} returns a {type(out).__name__}, not an array (a Python value read by the trace)",
                         "it runs in Python between graphs; pass size= to draw an array")
    if not liftable(out):
        raise GraphBreak(f"{what} gives dtype {out.dtype}, which has no tensor dtype")
    return out


def _literal(v: Any) -> str | None:
    """Python source text that evaluates to ``v`` (constants only), or None."""
    if v is None or type(v) in (bool, int, str):
        return repr(v)
    if type(v) is float:
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, np.generic) and np.ndim(v) == 0 and v.dtype.kind in "biuf":
        return f"__import__('numpy').{v.dtype.name}({v.item()!r})"
    if type(v) in (tuple, list):
        maybe = [_literal(x) for x in v]
        parts = [p for p in maybe if p is not None]
        if len(parts) != len(maybe):
            return None
        inner = ", ".join(parts) + ("," if type(v) is tuple and len(parts) == 1 else "")
        return f"({inner})" if type(v) is tuple else f"[{inner}]"
    if isinstance(v, type) and issubclass(v, (np.generic, bool, int, float)) or isinstance(v, np.dtype):
        return f"__import__('numpy').dtype({np.dtype(v).str!r})"
    return None


def flush_pending(frame_tracer: Any) -> list[tuple[Any, list, dict]]:
    """Seeds no draw of the graph followed: replayed after the graph (exact: nothing after them in
    this graph draws)."""
    out = [(fn, args, kwargs) for fn, args, kwargs, _ in frame_tracer.rng_pending]
    frame_tracer.rng_pending = ()
    return out
