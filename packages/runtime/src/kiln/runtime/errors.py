"""The runtime's user-facing errors; all derive from kiln.graph.KilnError."""

from __future__ import annotations

from kiln.graph import KilnError


class ArtifactError(KilnError):
    """An artifact cannot be saved or loaded: corrupt, truncated, incompatible or incomplete."""


class GuardError(KilnError):
    """A loaded compiled function was called with inputs its guards reject.

    ``input_name``, ``expected`` and ``actual`` say which input and how it differs.
    """

    def __init__(self, message: str, *, input_name: str = "", expected: object = None,
                 actual: object = None, guard: object = None) -> None:
        super().__init__(message)
        self.input_name = input_name
        self.expected = expected
        self.actual = actual
        self.guard = guard


class KernelBuildError(KilnError):
    """A kernel (C++ shared library or Triton module) could not be built or loaded."""
