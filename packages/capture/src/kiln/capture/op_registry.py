"""The one way an opcode-family module registers its handlers: ``HANDLERS, op = handler_table()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # frame.py imports the opcode table this module builds
    from .frame import Frame, Inst

# one opcode's semantics: reads the instruction, updates the frame's stack, locals and tracer
Handler = Callable[["Frame", "Inst"], None]


def handler_table() -> tuple[dict[str, Handler], Callable[..., Callable[[Handler], Handler]]]:
    """A fresh opcode-name -> handler dict and the ``@op("NAME", ...)`` decorator that fills it."""
    handlers: dict[str, Handler] = {}

    def op(*names: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            for n in names:
                handlers[n] = fn
            return fn
        return register
    return handlers, op
