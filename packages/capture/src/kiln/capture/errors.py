"""Capture's errors: the user-facing ``Unsupported`` and the internal graph-break signal."""

from __future__ import annotations

from torch._subclasses import fake_tensor
from torch.fx.experimental import symbolic_shapes

from kiln.graph import KilnError


class Unsupported(KilnError):
    """A construct capture cannot put in a graph, raised under ``fullgraph=True``.

    The message names the construct, the user's file:line and a hint.
    """


class GraphBreak(Exception):
    """Internal: the instruction being interpreted cannot be traced; the frame breaks here."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint
        self.user_stack: list[str] = []  # "file:line in fn" from the innermost inlined frame out


def _breaking_errors() -> tuple[type[BaseException], ...]:
    ft, ss = fake_tensor, symbolic_shapes
    names = [(ft, "DataDependentOutputException"), (ft, "DynamicOutputShapeException"),
             (ft, "UnsupportedOperatorException"), (ft, "UnsupportedFakeTensorException"),
             (ss, "GuardOnDataDependentSymNode")]
    found = [getattr(m, n) for m, n in names if isinstance(getattr(m, n, None), type)]
    return (*found, NotImplementedError)


# fake-tensor failures that mean 'cannot trace this', not 'the user's code is wrong'
BREAKING_ERRORS = _breaking_errors()


class SkipFrame(Exception):
    """Internal: the whole frame cannot be captured (generators, unknown bytecodes at the start)."""


def user_location(code, lineno: int | None) -> str:
    return f"{code.co_filename}:{lineno if lineno is not None else code.co_firstlineno} in {code.co_name}"
