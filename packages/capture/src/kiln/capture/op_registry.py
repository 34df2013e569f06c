"""The one way an opcode-family module registers its handlers: ``HANDLERS, op = handler_table()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[..., Any]


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
