"""Guard sources: Python expressions over ``L`` (frame locals) and ``G`` (globals).

Module attributes use the fast dict form (``._modules['fc']._parameters['weight']``) so checking a
guard and fetching a parameter on the hit path are plain dict lookups; ``pretty`` prints the
attribute form users recognise (``L['self'].fc.weight``).
"""

from __future__ import annotations

import keyword
import re

_FAST_PART = re.compile(r"\._(?:modules|parameters|buffers)\[('[^']*')\]")


def local_source(name: str) -> str:
    return f"L[{name!r}]"


def is_argument(source: str) -> bool:
    """``L['name']``: a frame argument (``dynamic=True`` makes ints symbolic only there)."""
    return source.startswith("L['") and source.endswith("']") and source.count("[") == 1


def global_source(name: str) -> str:
    return f"G[{name!r}]"


def attr_source(base: str, name: str) -> str:
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"{base}.{name}"
    return f"getattr({base}, {name!r})"


def item_source(base: str, key: object) -> str:
    return f"{base}[{key!r}]"


def module_member_source(base: str, table: str, name: str) -> str:
    return f"{base}.{table}[{name!r}]"


def pretty(source: str) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1)[1:-1]
        return f".{name}" if name.isidentifier() else f"[{m.group(1)}]"
    return _FAST_PART.sub(repl, source)


def placeholder_name(source: str) -> str:
    """A readable identifier for a placeholder: ``L['self'].fc.weight`` -> ``l_self_fc_weight``."""
    s = re.sub(r"[^0-9a-zA-Z]+", "_", pretty(source)).strip("_").lower()
    return s or "input"
