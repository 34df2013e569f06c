"""The root of kiln's error hierarchy; each stage derives its own user-facing errors from it."""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class VerificationError(KilnError):
    """A graph does not satisfy the contract of the dialect it claims."""


class BackendUnavailable(KilnError):
    """A backend needs a stage (package) that is not installed or not built yet."""


class DoubleBackwardError(RuntimeError):
    """A compiled graph's backward was itself differentiated (create_graph=True, then backward again)."""
