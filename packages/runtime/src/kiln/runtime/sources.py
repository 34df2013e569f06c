"""Input sources: where each graph input of a compiled function comes from, and how a load finds it.

Note: the source-resolution scheme.
A captured graph names each input by a *source*, a Python expression over ``L`` (the compiled
function's frame locals: its arguments and closure variables) and ``G`` (its globals), e.g. ``L['x']``
or ``L['self'].fc.weight``. Guards use the same expressions. An artifact keeps them verbatim and adds
*bindings*, decided at save time against the live frame, that say where the *root* of each source
lives after a load:

- ``argument``: ``L['name']`` is a parameter of the function; a call binds it from its arguments
  (``compiled(model, x)`` binds ``L['self']`` to ``model`` for a module's ``forward``).
- ``external``: a prefix of the source is (by identity) a value of the ``external_data`` given at
  save time; a load resolves it from the ``external_data`` given at load under the same key. This is
  how modules referenced from closures or globals are supplied: their parameters and buffers are
  read through the prefix on every call, so training updates are seen.
- ``constant``: the whole source is a tensor or number reached from a closure or global (not through
  a module): its value is saved in the artifact (safetensors-style bytes, no pickle).
- ``global``: ``G['name']`` with nothing saved; a load reads it from ``f_globals`` or, failing that,
  ``external_data[name]``.

When ``f_globals`` is given at load, a ``constant`` or ``global`` binding rooted at ``G['name']``
reads the live ``f_globals[name]`` instead (torch's behaviour: the caller's scope wins).
A load rewrites every source to an expression over ``L`` and ``G`` alone, with external and constant
roots turned into reserved keys of ``L`` (``L['<external:model>']``, ``L['<constant:c0>']``) that
cannot clash with Python names. So guard checks and input gathering stay compiled, single calls.
Guards whose root is none of the above (a closure variable that was baked into the program) are
dropped at save time: they described state that the artifact now freezes.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import ArtifactError

_ROOT = re.compile(r"""^(L|G)\[('([^'\\]*)'|"([^"\\]*)")\]""")


def normalize(source: str) -> str:
    """The canonical text of a source expression (``L["x"]`` and ``L['x']`` are one source)."""
    if not source:
        return source
    try:
        return ast.unparse(ast.parse(source, mode="eval"))
    except SyntaxError as e:
        raise ArtifactError(f"input source {source!r} is not a Python expression: {e}") from e


def root_of(source: str) -> tuple[str, str] | None:
    """('L' or 'G', name) of a normalized source's root, or None if it has none."""
    m = _ROOT.match(source)
    if not m:
        return None
    return m.group(1), m.group(3) if m.group(3) is not None else m.group(4)


def root_text(scope: str, name: str) -> str:
    return f"{scope}[{name!r}]"


def display_name(source: str) -> str:
    """A readable input name: ``L['self'].fc.weight`` -> ``self.fc.weight``."""
    out = _ROOT.sub(lambda m: m.group(3) if m.group(3) is not None else m.group(4), source)
    return out or source


def prefixes(source: str) -> list[str]:
    """The attribute/index chain of a source from its root outwards, each as normalized text."""
    node: ast.expr = ast.parse(source, mode="eval").body
    chain: list[ast.expr] = []
    while True:
        chain.append(node)
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("L", "G")):
            node = node.value
        else:
            break
    return [ast.unparse(n) for n in reversed(chain)]


def has_prefix(source: str, prefix: str) -> bool:
    return source == prefix or (source.startswith(prefix) and source[len(prefix)] in ".[")


# ---- the call convention: parameters of the compiled function ------------------------------------

_KINDS = {k.name: k for k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY,
                               inspect.Parameter.VAR_KEYWORD)}
_JSON_SCALARS = (bool, int, float, str, type(None))


def _json_default(value: object) -> tuple[bool, object]:
    if isinstance(value, _JSON_SCALARS):
        return True, value
    if isinstance(value, tuple) and all(isinstance(v, _JSON_SCALARS) for v in value):
        return True, {"tuple": list(value)}
    return False, None


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: str = "POSITIONAL_OR_KEYWORD"  # an inspect.Parameter kind name
    has_default: bool = False
    default: object = None
    default_saved: bool = True  # False: it had a default we could not save; callers must pass it

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.has_default:
            d["default"] = ({"value": self.default} if self.default_saved else {"unsaved": True})
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Param:
        default = d.get("default")
        if default is None:
            return Param(d["name"], d.get("kind", "POSITIONAL_OR_KEYWORD"))
        value = default.get("value")
        if isinstance(value, dict) and set(value) == {"tuple"}:
            value = tuple(value["tuple"])
        return Param(d["name"], d.get("kind", "POSITIONAL_OR_KEYWORD"), True, value,
                     "unsaved" not in default)


def params_of(fn: Callable[..., Any]) -> tuple[Param, ...]:
    out = []
    # the signature of the code that runs (a functools.wraps wrapper's own *args, **kwargs): that is
    # the frame capture names its sources in, not the wrapped function's
    for p in inspect.signature(fn, follow_wrapped=False).parameters.values():
        if p.default is inspect.Parameter.empty:
            out.append(Param(p.name, p.kind.name))
        else:
            ok, value = _json_default(p.default)
            out.append(Param(p.name, p.kind.name, True, p.default if ok else None, ok))
    return tuple(out)


def make_binder(params: Sequence[Param]) -> Callable[[tuple, dict], dict[str, Any]]:
    """A function binding a call's (args, kwargs) to the parameter names, as the frame's L."""
    names = [p.name for p in params]
    simple = all(p.kind == "POSITIONAL_OR_KEYWORD" for p in params)
    sig = inspect.Signature([
        inspect.Parameter(p.name, _KINDS[p.kind],
                          default=(p.default if p.default_saved else _Unsaved(p.name))
                          if p.has_default else inspect.Parameter.empty)
        for p in params])
    n = len(names)

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if simple and not kwargs and len(args) == n:
            return dict(zip(names, args))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"compiled function{sig}: {e}") from None
        bound.apply_defaults()
        for value in bound.arguments.values():
            if isinstance(value, _Unsaved):
                raise TypeError(f"argument {value.name!r} has a default the artifact could not "
                                "save; pass it explicitly")
        return dict(bound.arguments)

    return bind


class _Unsaved:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return "<unsaved default>"


# ---- the live frame at save time -----------------------------------------------------------------

@dataclass(frozen=True)
class CallFrame:
    """How the compiled function is called, and the values its sources saw when it was compiled.

    ``CallFrame.of(fn, args, kwargs)`` binds the example call: ``locals`` are its arguments plus
    ``fn``'s closure variables, ``globals`` are ``fn.__globals__``. For a bound method the instance
    becomes the first argument (``compiled(model, x)``).
    """

    params: tuple[Param, ...]
    locals: Mapping[str, object] = field(default_factory=dict)
    globals: Mapping[str, object] = field(default_factory=dict)

    @staticmethod
    def of(fn: Callable[..., Any], args: Sequence[object] = (),
           kwargs: Mapping[str, object] | None = None) -> CallFrame:
        if inspect.ismethod(fn):
            args = (fn.__self__, *args)
            fn = fn.__func__
        if isinstance(fn, torch.nn.Module):
            return CallFrame.of(type(fn).forward, (fn, *args), kwargs)
        params = params_of(fn)
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **(kwargs or {}))
        bound.apply_defaults()
        local_values: dict[str, object] = {}
        code = getattr(fn, "__code__", None)
        for name, cell in zip(code.co_freevars if code else (), getattr(fn, "__closure__", None) or ()):
            try:
                local_values[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
        local_values.update(bound.arguments)
        return CallFrame(params, local_values, getattr(fn, "__globals__", {}))

    def scope(self) -> dict[str, Mapping[str, object]]:
        return {"L": self.locals, "G": self.globals}


def evaluate(source: str, scope: Mapping[str, Mapping[str, object]]) -> object:
    return eval(source, {"__builtins__": __builtins__, **scope})  # noqa: S307 - sources are ours
