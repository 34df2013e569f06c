"""A ``torch._guards.Source`` naming a kiln guard source, which ShapeEnv needs to create symbols.

Note: ShapeEnv only reads the name and the guard source kind; ``name`` became a property in newer
torch (it was a method in older ones), so the subclass is built to match the running torch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from torch._guards import GuardSource, Source

_NAME_IS_PROPERTY = isinstance(inspect.getattr_static(Source, "name"), (property, functools.cached_property))


@dataclasses.dataclass(frozen=True)
class _KilnSourceBase(Source):
    expr: str = ""

    @property
    def _name_template(self) -> str:
        return self.expr

    @property
    def guard_source(self):  # type: ignore[override]
        return GuardSource.LOCAL

    def __hash__(self) -> int:
        return hash(self.expr)


if _NAME_IS_PROPERTY:
    @dataclasses.dataclass(frozen=True)
    class KilnSource(_KilnSourceBase):
        @property
        def name(self) -> str:  # type: ignore[override]
            return self.expr

        def __hash__(self) -> int:
            return hash(self.expr)
else:
    @dataclasses.dataclass(frozen=True)
    class KilnSource(_KilnSourceBase):  # type: ignore[no-redef]
        def name(self) -> str:  # type: ignore[override]
            return self.expr

        def __hash__(self) -> int:
            return hash(self.expr)
