"""Errors a user of kiln.autograd can hit; each says what happened, where, and what to do."""

from __future__ import annotations

from kiln.graph import KilnError


class AutogradTraceError(KilnError):
    """Tracing the torch-dialect graph into ATen failed (an unsupported op, mutation or input)."""


class DoubleBackwardError(RuntimeError):
    """A compiled graph's backward was itself differentiated (create_graph=True)."""
