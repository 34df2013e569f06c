"""Per-code-object caches of guarded entries, and automatic dynamic shapes.

A ``CodeCache`` holds the compiled entries of one code object under one ``optimize`` call, in
the order they were made; a call runs the first entry whose guards pass. Sizes seen at each
capture feed ``dynamic_dims``: a dimension that changed between captures is made symbolic.

Note: a dim made symbolic at a size >= 2 has the range [1, inf) (``shape_env.py``): a later call
with size 1 runs the same graph unless the trace decided something on the size being 1, which is a
guard (``x.squeeze()``, ``if x.shape[0] == 1: return x * 2``), and the size-1 call then compiles a
graph where 1 is a constant. A branch whose arm changes nothing at size 1 (HF's masking code expands
position ids only when ``batch != 1``) is traced without the guard (``size_one_branch.py``).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from kiln.graph import Guard, GuardSet, enabled, log

from .capture import Capture
from .controls import static_dims
from .knobs import CaptureOptions
from .pinned_layouts import PinnedLayouts
from .sources import is_argument

_MEMBER = re.compile(r"(.+)\._(parameters|buffers)\[('[^']*')\]")  # a module's parameter or buffer source


@dataclass
class CacheEntry:
    guards: GuardSet
    check: Callable[[dict, dict], bool]
    run: Callable[[dict, dict], Any]
    capture: Capture | None  # None for an entry that runs the frame eagerly
    compiled: Any = None
    hits: int = 0
    layouts: PinnedLayouts | None = None  # the pinned parameters' and buffers' layouts, checked per call


@dataclass
class CodeCache:
    code: types.CodeType
    entries: list[CacheEntry] = field(default_factory=list)
    recompiles: int = 0
    eager_reason: str | None = None  # set when the frame cannot be captured at all
    eager_reported: bool = False  # its FrameRunEagerly event was emitted (once per frame)
    failed_captures: int = 0  # captures in a row that fell back to eager (reset by a successful one)
    trace_error_warned: bool = False  # a tracing error eager did not raise was warned about (once per frame)
    limit_warned: bool = False
    ran_eagerly: bool = False  # set_stance('eager_then_compile'): the first call ran in Python
    seen_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dynamic: dict[str, set[int]] = field(default_factory=dict)
    seen_ints: dict[str, int] = field(default_factory=dict)
    dynamic_ints: set[str] = field(default_factory=set)
    dynamic_floats: set[str] = field(default_factory=set)  # float sources that changed: graph inputs
    static_floats: set[str] = field(default_factory=set)  # floats whose symbolic capture failed
    failures: dict[str, int] = field(default_factory=dict)  # recompile reason -> times seen
    new_modules: set[str] = field(default_factory=set)  # module sources guarded by type (note_new_modules)

    def note_failed_guard(self, g: Guard, ints: bool = True) -> None:
        """Automatic dynamic for ints beyond arguments: an int guarded as a constant (an attribute,
        an item of an argument) whose value changed becomes a symbolic int at the next capture
        (``ints``: automatic dynamic, not dynamic=True); a float that changed, a symbolic float."""
        if ints and g.kind == "EQUALS_MATCH" and type(g.expected) is int and g.source not in self.dynamic_ints:
            self.dynamic_ints.add(g.source)
            if enabled("recompiles"):
                log("recompiles").info("%s changed from %s: it is a symbolic int from now on", g.source, g.expected)
        # a float that changed (a resume function's ``loss.item()``, a learning rate) is a symbolic
        # float from then on, as torch's specialize_float=False makes every float: no graph per value
        if g.kind == "EQUALS_MATCH" and type(g.expected) is float and \
                g.source not in self.dynamic_floats and g.source not in self.static_floats:
            self.dynamic_floats.add(g.source)
            if enabled("recompiles"):
                log("recompiles").info("%s changed from %s: it is a symbolic float from now on", g.source,
                                       g.expected)

    def note_new_modules(self, guards: GuardSet, L: dict, G: dict) -> None:
        """Automatic unspecialisation of modules: a module source whose object changed (an
        ``nn.Linear`` built inside the compiled code before a graph break reaches the resume
        function as a new object on every call), or whose parameter or buffer is a new tensor, is
        guarded by type and what the trace reads from then on, its parameters read as graph inputs,
        instead of recompiling for every new object."""
        for g in guards:
            if g.kind != "ID_MATCH":
                continue
            m = _MEMBER.fullmatch(g.source)
            source = m.group(1) if m else g.source
            if source in self.new_modules:
                continue
            try:
                value = eval(g.source, {"L": L, "G": G})  # noqa: S307 (a source the capture generated)
                module = eval(source, {"L": L, "G": G}) if m else value  # noqa: S307
            except Exception:  # noqa: BLE001 - the source no longer resolves: nothing to learn
                continue
            if isinstance(module, torch.nn.Module) and id(value) != g.expected:
                self.new_modules.add(source)
                if enabled("recompiles"):
                    what = f"its {m.group(2)} {m.group(3)} is a new tensor" if m else \
                        f"it is a new {type(module).__name__}"
                    log("recompiles").info("%s: %s on this call, guarded by type from now on", source, what)

    def dynamic_dim_count(self) -> int:
        return sum(len(d) for d in self.dynamic.values())

    def may_be_dynamic(self, L: dict[str, Any], options: CaptureOptions) -> bool:
        """Whether this capture could make a size symbolic (so it needs a ShapeEnv)."""
        self._note_ints(L, options)
        if options.dynamic is True or any(self.dynamic.values()) or self.dynamic_ints or self.dynamic_floats:
            return True
        if options.dynamic is False:
            return any(getattr(v, "_kiln_dynamic_dims", None) for v in _top_tensors(L))
        for name, v in L.items():
            for src, t in _tensors_at(f"L[{name!r}]", v):
                if getattr(t, "_kiln_dynamic_dims", None):
                    return True
                prev = self.seen_shapes.get(src)
                if prev is not None and prev != tuple(t.shape):
                    return True
        return False

    def _note_ints(self, L: dict[str, Any], options: CaptureOptions) -> None:
        """Int arguments are specialised first; one that changed between captures turns symbolic."""
        if options.dynamic is not None:
            return
        for name, v in L.items():
            if type(v) is not int:
                continue
            src = f"L[{name!r}]"
            prev = self.seen_ints.get(src)
            self.seen_ints[src] = v
            if prev is not None and prev != v and src not in self.dynamic_ints:
                self.dynamic_ints.add(src)
                if enabled("recompiles"):
                    log("recompiles").info("%s changed from %s to %s: it is a symbolic int from now on",
                                           src, prev, v)

    def dynamic_policy(self, options: CaptureOptions) -> Callable[[str, torch.Tensor], frozenset[int]]:
        def policy(source: str, t: torch.Tensor | int) -> frozenset[int]:
            if type(t) is float:  # symbolic once it has changed (note_failed_guard), or dynamic=True's arguments
                return frozenset({0}) if options.dynamic is not False and source in self.dynamic_floats or \
                    options.dynamic is True and is_argument(source) and source not in self.static_floats \
                    else frozenset()
            if type(t) is int:  # symbolic once it has changed (_note_ints, note_failed_guard)
                if options.dynamic is True and is_argument(source) or \
                        options.dynamic is None and source in self.dynamic_ints:
                    return frozenset({0})
                return frozenset()
            t = cast(torch.Tensor, t)
            marked = set(getattr(t, "_kiln_dynamic_dims", ()))
            static = static_dims(t)  # kiln.mark_static
            if options.dynamic is True:
                return frozenset(range(t.dim())) - static
            if options.dynamic is False:
                return frozenset(marked - static)
            shape = tuple(int(s) for s in t.shape)
            prev = self.seen_shapes.get(source)
            dims = self.dynamic.setdefault(source, set())
            if prev is not None and len(prev) == len(shape):
                changed = {i for i, (a, b) in enumerate(zip(prev, shape)) if a != b}
                if changed - marked and not dims:  # a marked dim that varies says nothing new
                    changed |= _leading_dim(shape, changed, static)
                dims.update(changed)
            self.seen_shapes[source] = shape
            return frozenset((dims | marked) - static)
        return policy


def _leading_dim(shape: tuple[int, ...], changed: set[int], static: frozenset[int]) -> set[int]:
    """The leading dim, made symbolic beside the first dims of an input that changed size.

    Note: the leading dim of a batched input (token ids ``[batch, seq]``, activations ``[batch, seq,
    hidden]``) usually varies too, a few calls later (a serving stream: sequence lengths, then
    batch sizes); symbolic from the first recompile on, it costs no further graph when it does. An
    input whose only change is its leading dim (a partial last batch) keeps its other dims static,
    and a leading dim of 1 stays static (sizes 0 and 1 specialise)."""
    if 0 in changed or len(shape) < 2 or shape[0] < 2 or 0 in static:
        return set()
    return {0}


def _top_tensors(L: dict[str, Any]) -> list[torch.Tensor]:
    return [t for name, v in L.items() for _, t in _tensors_at(name, v)]


def _tensors_at(src: str, v: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(v, torch.Tensor):
        return [(src, v)]
    if type(v) in (list, tuple):
        return [(f"{src}[{i}]", x) for i, x in enumerate(v) if isinstance(x, torch.Tensor)]
    if type(v) is dict:
        return [(f"{src}[{k!r}]", x) for k, x in v.items() if isinstance(x, torch.Tensor)]
    return []
