"""The opcode table: every family module contributes its handlers (listed here, in one place)."""

from __future__ import annotations

from typing import Any

from . import op_arith, op_build, op_call, op_control, op_names

HANDLERS: dict[str, Any] = {}
for _family in (op_names, op_build, op_arith, op_control, op_call):
    HANDLERS.update(_family.HANDLERS)
