"""Bindings: where each source root lives after a load (see the Note in sources.py).

``bind_sources`` runs at save time against the live frame; ``Resolver`` runs at load time against
``f_globals`` and ``external_data`` and rewrites sources to expressions over ``L`` and ``G`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ArtifactError
from .sources import CallFrame, evaluate, has_prefix, prefixes, root_of, root_text

logger = logging.getLogger("kiln.runtime")

BINDING_KINDS = ("argument", "external", "constant", "global")


@dataclass(frozen=True, slots=True)
class Binding:
    prefix: str  # a normalized source prefix, e.g. "L['model']"
    kind: str  # one of BINDING_KINDS
    key: str  # parameter name, external_data key, constant name or global name
    requires_grad: bool = False  # constants: restore as a leaf that requires grad

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"prefix": self.prefix, "kind": self.kind, "key": self.key}
        if self.requires_grad:
            d["requires_grad"] = True
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Binding:
        if d.get("kind") not in BINDING_KINDS:
            raise ArtifactError(f"manifest has an unknown binding kind {d.get('kind')!r}")
        return Binding(str(d["prefix"]), str(d["kind"]), str(d["key"]), bool(d.get("requires_grad")))


@dataclass(frozen=True)
class BoundSources:
    bindings: tuple[Binding, ...]
    constants: dict[str, object]  # constant key -> tensor or Python number
    kept_guard_sources: frozenset[str]  # guard sources still meaningful after a load


def _find(bindings: list[Binding], source: str) -> Binding | None:
    for b in bindings:
        if has_prefix(source, b.prefix):
            return b
    return None


def bind_sources(input_sources: Sequence[str], guard_sources: Sequence[str],
                 params: Sequence[str], frame: CallFrame | None,
                 external_data: Mapping[str, object]) -> BoundSources:
    """Decide a binding for the root of every input and guard source (sources normalized)."""
    bindings: list[Binding] = []
    constants: dict[str, object] = {}
    ext_ids = {id(v): k for k, v in external_data.items()}
    kept: set[str] = set()
    for is_input, source in [(True, s) for s in input_sources] + [(False, s) for s in guard_sources]:
        root = root_of(source)
        if root is None:
            kept.add(source)
            continue
        scope, name = root
        if scope == "L" and name in params:
            if _find(bindings, source) is None:
                bindings.append(Binding(root_text(scope, name), "argument", name))
            kept.add(source)
            continue
        if _find(bindings, source) is not None:
            kept.add(source)
            continue
        b = _bind_free(source, is_input, frame, ext_ids, len(constants))
        if b is None:
            continue  # a guard on state the artifact freezes
        if b.kind == "constant":
            assert frame is not None
            constants[b.key] = _constant_value(evaluate(source, frame.scope()))
        bindings.append(b)
        kept.add(source)
    return BoundSources(tuple(bindings), constants, frozenset(kept))


def _bind_free(source: str, is_input: bool, frame: CallFrame | None, ext_ids: dict[int, str],
               n_constants: int) -> Binding | None:
    scope, name = root_of(source)  # type: ignore[misc]
    if frame is None:  # no live values: a global is looked up at load, a closure cannot be
        if scope == "G":
            return Binding(root_text(scope, name), "global", name)
        if is_input:
            raise ArtifactError(f"input {source} is not an argument of the compiled function and "
                                "no frame was given to save it from")
        return None
    module_prefix: str | None = None
    value: object = None
    for prefix in prefixes(source):
        try:
            value = evaluate(prefix, frame.scope())
        except Exception as e:  # noqa: BLE001 - report it as what it is
            if is_input:
                raise ArtifactError(f"cannot read input {source} at save time: {prefix} raised "
                                    f"{type(e).__name__}: {e}") from e
            return None
        if id(value) in ext_ids:
            return Binding(prefix, "external", ext_ids[id(value)])
        if isinstance(value, torch.nn.Module) and prefix != source and module_prefix is None:
            module_prefix = prefix
    if not is_input:
        return Binding(root_text(scope, name), "global", name) if scope == "G" else None
    if module_prefix is not None:
        key = root_of(module_prefix)[1]  # type: ignore[index]
        raise ArtifactError(
            f"cannot save input {source}: it is read from the module {module_prefix}, which is not an "
            f"argument of the compiled function, and modules are not saved in artifacts. Pass it as "
            f"external data: save_compiled_function(path, external_data={{{key!r}: <the module>}}) and "
            f"load_compiled_function(file, external_data={{{key!r}: <the module>}}).")
    if not isinstance(value, (torch.Tensor, bool, int, float)):
        raise ArtifactError(f"cannot save input {source}: a {type(value).__name__} is neither a "
                            "tensor nor a number; pass it in external_data")
    requires_grad = isinstance(value, torch.Tensor) and value.requires_grad
    if requires_grad:
        logger.info("input %s is saved as a constant leaf tensor; pass it in external_data to keep "
                    "the live object (for example to train it)", source)
    return Binding(source, "constant", f"c{n_constants}", requires_grad)


def _constant_value(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach()
    return value


class Resolver:
    """Load-time rewriting of sources to expressions over ``L`` and ``G`` (see sources.py)."""

    def __init__(self, bindings: Sequence[Binding], constants: Mapping[str, object],
                 f_globals: Mapping[str, object] | None,
                 external_data: Mapping[str, object] | None) -> None:
        self.static: dict[str, object] = {}
        self.rewrites: list[tuple[Binding, str | None]] = []  # None: guard no longer applies
        external = external_data or {}
        missing: dict[str, list[str]] = {}
        for b in bindings:
            target: str | None = b.prefix
            if b.kind == "external":
                if b.key not in external:
                    missing.setdefault(b.key, []).append(b.prefix)
                    continue
                target = self._static(f"<external:{b.key}>", external[b.key])
            elif b.kind in ("constant", "global"):
                root = root_of(b.prefix)
                live = (root is not None and root[0] == "G" and f_globals is not None
                        and root[1] in f_globals)
                if live:
                    target = b.prefix
                elif b.kind == "constant":
                    value = constants[b.key]
                    if b.requires_grad and isinstance(value, torch.Tensor):
                        value = value.detach().requires_grad_()  # a leaf again, as it was saved
                    target = self._static(f"<constant:{b.key}>", value)
                    target = f"{target}\0constant"
                elif b.key in external:
                    target = self._static(f"<external:{b.key}>", external[b.key])
                else:
                    target = None
            self.rewrites.append((b, target))
        if missing:
            needs = "; ".join(f"{k!r} (for {', '.join(v)})" for k, v in missing.items())
            keys = ", ".join(f"{k!r}: ..." for k in missing)
            raise ArtifactError(f"this artifact needs external data it does not contain: {needs}. "
                                f"Pass load_compiled_function(file, external_data={{{keys}}}) with "
                                "the same keys used when saving.")

    def _static(self, key: str, value: object) -> str:
        self.static[key] = value
        return f"L[{key!r}]"

    def rewritten_prefixes(self) -> tuple[str, ...]:
        """Prefixes whose sources this load rewrites (or drops); a source under none of them is its
        own expression (an identity binding, such as an argument's, leaves it as it is)."""
        return tuple(b.prefix for b, target in self.rewrites if target != b.prefix)

    def _lookup(self, source: str) -> tuple[Binding | None, str | None]:
        for b, target in self.rewrites:
            if has_prefix(source, b.prefix):
                return b, target
        return None, source

    def input_expr(self, source: str) -> str:
        b, target = self._lookup(source)
        if b is None:
            return source
        if target is None:
            raise ArtifactError(f"input {source} reads global {b.key!r}: pass "
                                f"load_compiled_function(file, f_globals=...) with it, or "
                                f"external_data={{{b.key!r}: ...}}")
        return target.removesuffix("\0constant") + source[len(b.prefix):]

    def guard_expr(self, source: str) -> str | None:
        """The rewritten guard source, or None when the guard checks nothing after a load."""
        if not source:
            return source
        b, target = self._lookup(source)
        if b is None:
            return source
        if target is None or target.endswith("\0constant"):
            return None  # a global nobody supplies, or a constant saved with the artifact
        return target + source[len(b.prefix):]
