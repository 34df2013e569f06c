"""Errors a user of kiln.autograd can hit; each says what happened, where, and what to do."""

from __future__ import annotations

from kiln.graph import DoubleBackwardError, KilnError

__all__ = ["AutogradTraceError", "DoubleBackwardError"]


class AutogradTraceError(KilnError):
    """Tracing the torch-dialect graph into ATen failed (an unsupported op, mutation or input)."""
