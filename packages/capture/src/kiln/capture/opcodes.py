"""The opcode table: every family module contributes its handlers (listed here, in one place)."""

from __future__ import annotations

from . import op_arith, op_build, op_call, op_control, op_names
from .op_registry import Handler

HANDLERS: dict[str, Handler] = {}
for _family in (op_names, op_build, op_arith, op_control, op_call):
    HANDLERS.update(_family.HANDLERS)
