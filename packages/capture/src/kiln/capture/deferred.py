"""Calls replayed after the graph, in order, instead of graph breaks: ``print``, ``logging``,
``warnings.warn`` and ``torch.manual_seed``.

Note: these calls only *emit* (text, a warning) or *set* state no graph op reads, so running them
after the graph gives what eager gives: their tensor arguments become graph outputs, the call runs
with the real values. ``torch.manual_seed`` sets the RNG state a random op would read: it is replayed
after the graph as long as no random op follows it in the same graph; a random op after it breaks
the graph there, so the seed is set (after the first graph) before the op runs in Python.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch

from .errors import GraphBreak
from .values import TracedFunction, TracedMethod

if TYPE_CHECKING:
    from .frame import Frame

CALL = "()"  # the side-effect kind of a deferred call (capture.py / optimize.py)
# the real ``__exit__`` of a torch.autocast block entered before a graph break and left in the graph:
# called before the breaking instruction's stack is rebuilt (which may enter another block)
EXIT_CALL = "__exit__()"

# logging.Logger methods and module functions that only emit ("exception" reads sys.exc_info: not here)
_LOG_NAMES = frozenset({"debug", "info", "warning", "warn", "error", "critical", "log"})
_LOG_FUNCTIONS = frozenset({id(getattr(logging, n)) for n in _LOG_NAMES if hasattr(logging, n)} |
                           {id(getattr(logging.Logger, n)) for n in _LOG_NAMES if hasattr(logging.Logger, n)} |
                           {id(getattr(logging.LoggerAdapter, n)) for n in _LOG_NAMES
                            if hasattr(logging.LoggerAdapter, n)})
_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "multinomial", "normal", "poisson", "uniform", "exponential",
                 "geometric", "cauchy", "random", "rrelu", "gumbel")


def is_log_call(fn: Any) -> bool:
    return id(fn) in _LOG_FUNCTIONS


def defer(frame: Frame, fn: Any, args: list, kwargs: dict) -> None:
    """Record ``fn(*args, **kwargs)`` to run after the graph (the values rebuilt from its outputs)."""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if any(isinstance(a, (TracedFunction, TracedMethod)) for a in [*args, *kwargs.values()]):
        raise GraphBreak(f"passing a function defined in compiled code to {name}()")
    if frame.tracer.scopes:
        raise GraphBreak(f"{name}() inside a torch.cond branch (a side effect)")
    frame.tracer.deferred.append((fn, list(args), dict(kwargs)))


def replay_manual_seed(*args: Any, **kwargs: Any) -> None:
    """``torch.manual_seed`` as replayed after the graph (looked up then: importing torch's compiler
    rewraps it)."""
    torch.manual_seed(*args, **kwargs)


def seed_pending(deferred: list) -> bool:
    return any(fn is replay_manual_seed for fn, _, _ in deferred)


def is_random_target(target: Any) -> bool:
    """A recorded op that may draw from the global generator (by name: rand*, dropout, normal_...)."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    name = name.lower()
    return any(word in name for word in _RANDOM_WORDS)


def print_(frame: Frame, args: list, kwargs: dict) -> None:
    defer(frame, print, args, kwargs)


def warn_(frame: Frame, args: list, kwargs: dict) -> None:
    defer(frame, warnings.warn, args, kwargs)


def manual_seed_(frame: Frame, args: list, kwargs: dict) -> Any:
    defer(frame, replay_manual_seed, args, kwargs)
    return torch.default_generator
