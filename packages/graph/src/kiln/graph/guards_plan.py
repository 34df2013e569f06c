"""The guard checker: a GuardSet (and optionally sources to read) as one check function, built
without ``compile()``.

Note: a module's guard set is mostly many guards of a few kinds over attribute chains of one root
(mobilenet: 1,395 guards, 709 of them EQUALS_MATCH on module attributes, 267 TENSOR_MATCH on
parameters). One generated ``and``-expression per guard made ~130 KB of Python whose ``compile()``
alone cost more than a small model's first eager call, on every load of an artifact. So the check
is a plan of C-level steps instead:

- reads: each source is split into its attribute/subscript chain; each distinct prefix is one
  ``operator.attrgetter``/``itemgetter`` node, so ``L['self']._modules['features']`` is read once
  per call however many guards go through it; the nodes of one depth are read by one C-level
  ``map`` (a dozen Python-level steps for a whole model);
- checks: global state and guards on a bare argument (``L['x']``) first, one by one, so a call with
  another input shape fails before any module attribute is read; then one vectorised check per
  kind over the tuple of its values (``tuple(map(type, vs)) == types``, ``vs == values``, tensors'
  (dtype, requires_grad, shape, device) and strides compared as two tuples); then the guards that do not group; size symbols last, in order.

Every guard must hold, so the order does not change the answer; a source that no longer resolves
(an attribute gone because a type changed) raises inside the check, which then fails. Building the
plan is linear in the guards (~3 ms for 1,400); a call costs about what the generated code did.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import itertools
import operator
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._device import DeviceContext

_CHAIN = re.compile(r"""[LG]\[(?:'[^']*'|"[^"]*"|-?\d+)\](?:\.[A-Za-z_]\w*|\[(?:'[^']*'|"[^"]*"|-?\d+)\])*""")
_SEGMENT = re.compile(r"""\.[A-Za-z_]\w*|\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")
_BARE = re.compile(r"""[LG]\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")

Check = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]


# ---- helpers shared with guards.py ---------------------------------------------------------------

def default_device() -> str | None:
    """The device of the innermost ``with torch.device(...)`` / ``torch.set_default_device``, where
    factory calls without ``device=`` allocate; None for none (or ``cpu``, which means the same).
    Reads torch's function-mode stack directly: ``torch.get_default_device()`` costs ~10 us a call."""
    for i in range(_len_modes() - 1, -1, -1):
        mode = _mode_at(i)
        if isinstance(mode, DeviceContext):
            return None if mode.device.type == "cpu" else str(mode.device)
    return None


_len_modes = torch._C._len_torch_function_stack
_mode_at = torch._C._get_function_stack_at


def global_state() -> tuple[tuple[str, Any], ...]:
    """The global torch state a graph depends on, as a hashable snapshot."""
    return (
        ("grad_enabled", torch.is_grad_enabled()),
        ("autocast_cpu", torch.is_autocast_enabled("cpu")),
        ("autocast_cuda", torch.is_autocast_enabled("cuda")),
        ("autocast_cpu_dtype", str(torch.get_autocast_dtype("cpu"))),
        ("autocast_cuda_dtype", str(torch.get_autocast_dtype("cuda"))),
        ("default_dtype", str(torch.get_default_dtype())),
        ("deterministic", torch.are_deterministic_algorithms_enabled()),
        ("default_device", default_device()),
        # kiln's Triton matmul templates bake TF32 (or IEEE) into their dot: a switch must recompile
        ("matmul_tf32", torch._C._get_cublas_allow_tf32()),
    )


GLOBAL_STATE_KEYS = frozenset(k for k, _ in global_state())


def device_matches(actual: torch.device, expected: torch.device) -> bool:
    """``cuda`` (no index, as written by a cross-compiling host) matches any ``cuda:N``."""
    if expected.index is None:
        return actual.type == expected.type
    return actual == expected


_RESOLVED: dict[str, tuple[object, type]] = {}  # name -> (its module object, the class)


def resolve_type(name: str) -> type | None:
    """The class named ``'module:qualname'``, or None when it cannot be imported here. Memoized
    while the module object is the same (a reloaded module resolves again)."""
    module, _, qual = name.partition(":")
    hit = _RESOLVED.get(name)
    if hit is not None and sys.modules.get(module) is hit[0]:
        return hit[1]
    try:
        obj: Any = importlib.import_module(module)
        mod = obj
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    if not isinstance(obj, type):
        return None
    _RESOLVED[name] = (mod, obj)
    return obj


PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, torch.nn.parameter.Buffer})
_NO_DISPATCH = torch.Tensor.__torch_dispatch__


def plain_tensor(v: object) -> TypeGuard[torch.Tensor]:
    """A tensor compiled code may take: not a subclass with a ``__torch_dispatch__`` of its own (a
    DTensor, an AsyncCollectiveTensor: a wrapper whose memory kernels cannot read), save fake
    tensors (traced as they are). TENSOR_MATCH holds only for these: a plain tensor's entry fed a
    subclass of the same shape would hand its kernels a null pointer."""
    cls = type(v)
    if cls in PLAIN_TENSOR_TYPES:
        return True
    return isinstance(v, torch.Tensor) and (type(v).__torch_dispatch__ is _NO_DISPATCH or isinstance(v, FakeTensor))


def tensor_ok(v: object, dtype: torch.dtype, device: torch.device, shape: tuple, stride: tuple,
              requires_grad: bool) -> bool:
    """TENSOR_MATCH with dynamic dims (None in ``shape``/``stride`` is not checked)."""
    if not plain_tensor(v) or v.dtype is not dtype or v.requires_grad != requires_grad:
        return False
    if v.dim() != len(shape) or not device_matches(v.device, device):
        return False
    for want, got in zip(shape, v.shape):
        if want is not None and want != got:
            return False
    for want, got in zip(stride, v.stride()):
        if want is not None and want != got:
            return False
    return True


def typed_equal(value: object, expected: object) -> bool:
    """EQUALS_MATCH: ``value == expected`` with the same type, and for a tuple the same type at
    every position too (``(True, 1) == (1, 1)`` and ``(1.0,) == (1,)`` in Python, but a trace of
    either took other paths): one guard stands for a constant tuple (a conv's ``stride``)."""
    if type(value) is not type(expected) or value != expected:
        return False
    if type(expected) is tuple:
        return all(map(typed_equal, value, expected))  # type: ignore[call-overload]
    return True


def flat_tuple(expected: object) -> bool:
    """A tuple none of whose items is a tuple: its item types are checked as one flat tuple."""
    return type(expected) is tuple and not any(type(x) is tuple for x in expected)


def _tensors_ok(values: tuple, expected: tuple) -> bool:
    """Each value a tensor with exactly the (dtype, device, shape, stride, requires_grad) given; a
    device given as a string (``'cuda'``, no index) matches any index of that type."""
    for v, (dtype, device, shape, stride, rg) in zip(values, expected):
        if not plain_tensor(v) or v.dtype is not dtype or v.requires_grad is not rg:
            return False
        if v.shape != shape or v.stride() != stride:
            return False
        if device.__class__ is str:
            if v.device.type != device:
                return False
        elif v.device != device:
            return False
    return True


_PAYLOAD_PARTS: dict[tuple[str, str], tuple[torch.dtype, torch.device | str]] = {}


def _tensor_payload(expected: tuple) -> tuple:
    dtype, device, shape, stride, rg = expected
    parts = _PAYLOAD_PARTS.get((dtype, device))  # a model's hundreds of tensors share one or two
    if parts is None:
        dt = getattr(torch, str(dtype).removeprefix("torch."))
        dev = torch.device(device)
        parts = (dt, dev.type if dev.index is None and dev.type != "cpu" else dev)
        if type(dtype) is str and type(device) is str:
            _PAYLOAD_PARTS[(dtype, device)] = parts
    return (*parts, tuple(shape), tuple(stride), bool(rg))


def _static(expected: tuple) -> bool:
    return None not in expected[2] and None not in expected[3]


def _global_state_check(expected: tuple) -> Callable[[], bool]:
    want = dict(expected)
    any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
    if set(want) != GLOBAL_STATE_KEYS or want["autocast_cpu"] or want["autocast_cuda"] or any_autocast is None:
        return lambda: global_state() == expected  # autocast dtypes matter: the full snapshot
    grad, det, dtype = bool(want["grad_enabled"]), bool(want["deterministic"]), want["default_dtype"]
    tf32, allow_tf32 = bool(want["matmul_tf32"]), torch._C._get_cublas_allow_tf32
    is_grad, default_dtype = torch.is_grad_enabled, torch.get_default_dtype
    deterministic = torch.are_deterministic_algorithms_enabled
    device = want["default_device"]

    def check() -> bool:
        return (is_grad() is grad and any_autocast() is False and deterministic() is det and allow_tf32() is tf32
                and str(default_dtype()) == dtype and (_len_modes() == 0 and device is None
                                                       or default_device() == device))
    return check


# ---- reads ---------------------------------------------------------------------------------------

_GETTERS: dict[str, Callable[[Any], Any]] = {  # ``._modules``, ``['0']``... recur in every model
    # a size symbol's source (``L['x'].size()[0]``): read as a chain like any other, not as a whole
    # source evaluated from ``L`` (one Python-level read per symbol)
    ".size()": operator.methodcaller("size"),
    ".stride()": operator.methodcaller("stride"),
}


def _getter(segment: str) -> Callable[[Any], Any]:
    got = _GETTERS.get(segment)
    if got is not None:
        return got
    if segment[0] == ".":
        got = operator.attrgetter(segment[1:])
    else:
        inner = segment[1:-1]
        if inner[0] in "'\"":
            got = operator.itemgetter(inner[1:-1] if "\\" not in inner else ast.literal_eval(inner))
        else:
            got = operator.itemgetter(int(inner))
    if len(_GETTERS) < 65536:
        _GETTERS[segment] = got
    return got


_SYS_MODULES = "__import__('sys').modules"  # how capture roots sources in other modules' globals
_ROOTS = 4  # vals = [L, G, (L, G), sys.modules, ...one value per read node]


class _Reads:
    """Sources as a tree of reads from ``L`` (node 0), ``G`` (1), ``(L, G)`` (2) and ``sys.modules``
    (3): one node per distinct attribute/subscript prefix, so shared prefixes are read once per call."""

    def __init__(self) -> None:
        self.parent: list[int] = [0] * _ROOTS
        self.getter: list[Callable[[Any], Any] | None] = [None] * _ROOTS
        self.depth: list[int] = [0] * _ROOTS
        self.text: list[str] = [""] * _ROOTS  # a node's segment (``.a``, ``['k']``), or its source (parent 2)
        self.known: dict[str, int] = {}

    def _node(self, parent: int, getter: Callable[[Any], Any], text: str) -> int:
        """A new node. Why no lookup by (parent, segment): a source not in ``known`` has a parent
        and segment no other source string has (the prefix string names the parent)."""
        node = len(self.getter)
        self.parent.append(parent)
        self.getter.append(getter)
        self.text.append(text)
        self.depth.append(self.depth[parent] + 1)
        return node

    def slot(self, source: str) -> int:
        """The node reading ``source`` (memoized; a source's parent is itself a source). Written for
        a new process's load (hundreds of sources, each getter made once): one slice per part, the
        parent looked up before recursing, the node appended inline."""
        known = self.known
        node = known.get(source)
        if node is not None:
            return node
        if source == _SYS_MODULES:
            return 3
        cut = source.rfind("[") if source[-1] == "]" else source.rfind(".")
        # cut > 1: ``L['x']`` is a root read (below), not ``L`` (no value) subscripted
        if cut > 1:
            segment = source[cut:]
            # every key of _GETTERS is a valid segment: the regex runs once per distinct segment
            getter = _GETTERS.get(segment)
            if getter is None and _SEGMENT.fullmatch(segment):
                getter = _getter(segment)
            prefix = source[:cut]
            if getter is not None and prefix != "__import__('sys')":
                parent = known.get(prefix)
                if parent is None:
                    parent = self.slot(prefix)
                node = len(self.getter)  # _node, inline
                self.parent.append(parent)
                self.getter.append(getter)
                self.text.append(segment)
                self.depth.append(self.depth[parent] + 1)
                known[source] = node
                return node
        if _BARE.fullmatch(source):
            node = self._node(0 if source[0] == "L" else 1, _getter(source[1:]), source[1:])
        else:  # not a chain (``len(L['x'])``, ``L['x'].size()``): one compiled read of the source
            fn = eval(f"lambda LG: (lambda L, G: {source})(*LG)")  # noqa: S307 - a guard source
            node = self._node(2, fn, source)
        known[source] = node
        return node

    def prime(self, tree: Sequence[tuple[str, int, str]], wanted: set[str]) -> None:
        """Nodes for the sources in ``wanted`` (and their prefixes) from a read tree saved with an
        artifact (``source_tree``): rows ``(source, parent row or -1, segment)``, parents first.
        Each node is what ``slot`` would make, without splitting source strings (about half of a
        mobilenet's plan build in a new process). Rows outside ``wanted`` make no node (every node
        is read at every call); sources not in the tree are left to ``slot``."""
        keep = [False] * len(tree)
        for i in range(len(tree) - 1, -1, -1):  # children after parents: one backward pass marks prefixes
            if keep[i] or tree[i][0] in wanted:
                keep[i] = True
                parent = tree[i][1]
                if parent >= 0:
                    keep[parent] = True
        known, getters = self.known, _GETTERS
        node_of = [0] * len(tree)
        for i, (source, parent, segment) in enumerate(tree):
            if not keep[i]:
                continue
            node = known.get(source)
            if node is None:
                getter = getters.get(segment) if parent >= 0 else None
                if getter is None and parent >= 0 and _SEGMENT.fullmatch(segment):
                    getter = _getter(segment)
                if getter is None or tree[parent][0] + segment != source:
                    node = self.slot(source)  # a root, or a row that is not a plain read
                else:
                    node = self._node(node_of[parent], getter, segment)
                    known[source] = node
            node_of[i] = node

    def program(self) -> tuple[list[int], list[list[tuple[int, str]]], list[Callable[[Any], Any]]]:
        """(position in ``vals`` of each node, levels, getters in ``vals`` order): nodes are laid out
        depth by depth, so each level is one C-level ``map`` over the values of the level before; a
        level is a list of (parent's position, node text)."""
        order = sorted(range(_ROOTS, len(self.getter)), key=self.depth.__getitem__)
        position = list(range(_ROOTS)) + [0] * (len(self.getter) - _ROOTS)
        for pos, node in enumerate(order, start=_ROOTS):
            position[node] = pos
        levels: list[list[tuple[int, str]]] = []
        depth = -1
        for n in order:
            if self.depth[n] != depth:
                depth = self.depth[n]
                levels.append([])
            levels[-1].append((position[self.parent[n]], self.text[n]))
        return position, levels, [self.getter[n] for n in order]  # type: ignore[misc]  # roots have none


def _take(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """``vals`` -> the tuple of ``vals[i]`` for ``indices``."""
    if len(indices) == 1:
        i = indices[0]
        return lambda vals: (vals[i],)
    return operator.itemgetter(*indices)


# ---- checks --------------------------------------------------------------------------------------

def _value_check(g: Any) -> Callable[[Any], bool]:
    """One guard (not GLOBAL_STATE, SYMBOL or SHAPE_EXPR) as a check of its source's value."""
    kind, expected = g.kind, g.expected
    if kind == "TENSOR_MATCH":
        if _static(expected):
            payload = (_tensor_payload(expected),)
            return lambda v: _tensors_ok((v,), payload)
        dt, _, shape, stride, rg = _tensor_payload(expected)
        dev = torch.device(expected[1])
        return lambda v: tensor_ok(v, dt, dev, shape, stride, rg)
    if kind == "TYPE_MATCH":
        cls = resolve_type(str(expected))
        if cls is not None:
            return lambda v: type(v) is cls
        return lambda v: f"{type(v).__module__}:{type(v).__qualname__}" == expected
    if kind == "ID_MATCH":
        return lambda v: id(v) == expected
    if kind == "EQUALS_MATCH":
        if type(expected) is tuple:
            return lambda v: typed_equal(v, expected)
        cls = type(expected)
        return lambda v: type(v) is cls and v == expected
    if kind == "LENGTH_MATCH":
        return lambda v: len(v) == expected
    if kind == "DICT_KEYS":
        keys = list(expected)  # type: ignore[call-overload]
        return lambda v: list(v.keys()) == keys
    if kind == "NOT_NONE":
        return lambda v: v is not None
    if kind == "IS_NONE":
        return lambda v: v is None
    raise AssertionError(kind)


_TENSOR_META = operator.attrgetter("dtype", "requires_grad", "shape", "device")
_STRIDE = operator.methodcaller("stride")
_PLAIN_TYPE = PLAIN_TENSOR_TYPES.__contains__  # the exact types first: a C-level pass over a model's tensors


def _group_check(kind: str, members: list, take: Callable[[list], tuple]) -> Callable[[list], bool]:
    if kind == "TENSOR_MATCH" and not all(_static(g.expected) for g in members):
        return _mixed_tensors_check(members, take)
    if kind == "TENSOR_MATCH":
        payloads = tuple(_tensor_payload(g.expected) for g in members)
        if any(isinstance(p[1], str) for p in payloads):  # an index-free device: the loop
            return lambda vals: _tensors_ok(take(vals), payloads)
        metas = tuple((p[0], p[4], p[2], p[1]) for p in payloads)
        strides = tuple(p[3] for p in payloads)

        def tensors(vals: list) -> bool:
            got = take(vals)
            return ((all(map(_PLAIN_TYPE, map(type, got))) or all(map(plain_tensor, got)))
                    and tuple(map(_TENSOR_META, got)) == metas and tuple(map(_STRIDE, got)) == strides)
        return tensors
    if kind == "TYPE_MATCH":
        types = tuple(resolve_type(str(g.expected)) for g in members)
        return lambda vals: tuple(map(type, take(vals))) == types
    if kind == "EQUALS_MATCH":
        return _equals_check(members, take)
    if kind == "ID_MATCH":  # modules of a model: hundreds per call, one comparison
        ids = tuple(g.expected for g in members)
        return lambda vals: tuple(map(id, take(vals))) == ids
    if kind == "LENGTH_MATCH":
        lengths = tuple(g.expected for g in members)
        return lambda vals: tuple(map(len, take(vals))) == lengths
    if kind == "IS_NONE":
        return lambda vals: all(v is None for v in take(vals))
    return lambda vals: all(v is not None for v in take(vals))  # NOT_NONE


_DYNAMIC_META = operator.attrgetter("dtype", "requires_grad", "device")
_SHAPE = operator.attrgetter("shape")


def _mixed_tensors_check(members: list, take: Callable[[list], tuple]) -> Callable[[list], bool]:
    """TENSOR_MATCH over tensors some of whose dims are symbolic (None, checked by SYMBOL guards):
    the static members as ``_group_check`` does; the others' metadata, ranks, and known sizes and
    strides as a few tuple comparisons over all of them (a decoder's KV cache: 2 per layer), where one
    ``tensor_ok`` each cost ~2.5 us."""
    static = [i for i, g in enumerate(members) if _static(g.expected)]
    dynamic = [i for i, g in enumerate(members) if not _static(g.expected)]
    static_ok = None
    if static:
        pick_static = _take(static)
        static_ok = _group_check("TENSOR_MATCH", [members[i] for i in static],
                                 lambda vals: pick_static(take(vals)))
    pick = _take(dynamic)
    payloads = tuple(_tensor_payload(members[i].expected) for i in dynamic)
    if any(isinstance(p[1], str) for p in payloads):  # an index-free device: one by one
        expected = tuple((dt, torch.device(dev) if isinstance(dev, str) else dev, shape, stride, rg)
                         for dt, dev, shape, stride, rg in payloads)

        def each(vals: list) -> bool:
            return all(tensor_ok(v, *e) for v, e in zip(pick(take(vals)), expected))
        dynamic_ok: Callable[[list], bool] = each
    else:
        metas = tuple((p[0], p[4], p[1]) for p in payloads)
        ranks = tuple(len(p[2]) for p in payloads)
        flat_sizes = [n for p in payloads for n in p[2]]
        flat_strides = [n for p in payloads for n in p[3]]
        size_at = [i for i, n in enumerate(flat_sizes) if n is not None]
        stride_at = [i for i, n in enumerate(flat_strides) if n is not None]
        sizes = tuple(flat_sizes[i] for i in size_at)
        strides = tuple(flat_strides[i] for i in stride_at)
        pick_sizes = _take(size_at) if size_at else None
        pick_strides = _take(stride_at) if stride_at else None
        chain = itertools.chain.from_iterable

        def vectorised(vals: list) -> bool:
            got = pick(take(vals))
            if not (all(map(_PLAIN_TYPE, map(type, got))) or all(map(plain_tensor, got))):
                return False
            if tuple(map(_DYNAMIC_META, got)) != metas:
                return False
            shapes = tuple(map(_SHAPE, got))
            if tuple(map(len, shapes)) != ranks:
                return False
            if pick_sizes is not None and pick_sizes(tuple(chain(shapes))) != sizes:
                return False
            return pick_strides is None or pick_strides(tuple(chain(map(_STRIDE, got)))) == strides
        dynamic_ok = vectorised
    if static_ok is None:
        return dynamic_ok
    return lambda vals: static_ok(vals) and dynamic_ok(vals)


def _equals_check(members: list, take: Callable[[list], tuple]) -> Callable[[list], bool]:
    """Types and values of every member as two tuple comparisons; then the item types of the
    constant tuples among them (a mobilenet's 186 conv stride/padding/dilation tuples) as one more,
    over their items chained, and nested tuples one by one."""
    classes = tuple(type(g.expected) for g in members)
    values = tuple(g.expected for g in members)
    flat = [i for i, g in enumerate(members) if flat_tuple(g.expected)]
    nested = [i for i, g in enumerate(members) if type(g.expected) is tuple and not flat_tuple(g.expected)]
    item_types = tuple(type(x) for i in flat for x in members[i].expected)
    pick_flat = _take(flat) if flat else None
    chain = itertools.chain.from_iterable

    def equals(vals: list) -> bool:
        got = take(vals)
        if tuple(map(type, got)) != classes or got != values:
            return False
        if pick_flat is not None and tuple(map(type, chain(pick_flat(got)))) != item_types:
            return False
        return all(typed_equal(got[i], values[i]) for i in nested)
    return equals


_GROUPED = ("TYPE_MATCH", "ID_MATCH", "LENGTH_MATCH", "IS_NONE", "NOT_NONE", "EQUALS_MATCH", "TENSOR_MATCH")


def _groupable(g: Any) -> bool:
    if g.kind == "TENSOR_MATCH":
        return True
    if g.kind == "TYPE_MATCH":
        return resolve_type(str(g.expected)) is not None
    return g.kind in _GROUPED


def _first_check(g: Any) -> Callable[[Mapping, Mapping], bool]:
    """GLOBAL_STATE, or a guard on a bare argument, read straight from L/G."""
    if g.kind == "GLOBAL_STATE":
        state = _global_state_check(g.expected)
        return lambda L, G: state()
    root = 0 if g.source[0] == "L" else 1
    key = _getter(g.source[1:])
    ok = _value_check(g)
    return (lambda L, G: ok(key(L))) if root == 0 else (lambda L, G: ok(key(G)))


_SHAPE_GLOBALS = {"__builtins__": builtins}  # what ``eval(code, {}, S)`` would make per call


def _sizes_check(guards: Sequence[Any], symbols: Sequence[Sequence[Any]]) -> Callable[[list], bool] | None:
    """The SYMBOL and SHAPE_EXPR guards (``symbols``: [guard index, read position or None]) as one
    check of ``vals``: a symbol read at several places (duck sizing) the same everywhere, as two
    tuples; then every relation over the symbols as one compiled ``and`` expression (one eval per
    call, where one per relation and a Python step per symbol cost ~10 us for a decoder's 40)."""
    first: dict[str, int] = {}
    again: list[tuple[int, int]] = []
    relations: list[str] = []
    for i, pos in symbols:
        g = guards[i]
        if g.kind == "SHAPE_EXPR":
            relations.append(f"({g.expected})")
            continue
        name = str(g.expected)
        if name in first:
            again.append((pos, first[name]))
        else:
            first[name] = pos
    if not first and not relations:
        return None
    names = tuple(first)
    read = _take(list(first.values())) if names else (lambda vals: ())
    seen, once = (_take([a for a, _ in again]), _take([b for _, b in again])) if again else (None, None)
    code = compile(" and ".join(relations), "<kiln shape guard>", "eval") if relations else None
    shape_globals = _SHAPE_GLOBALS

    def check(vals: list) -> bool:
        if seen is not None and seen(vals) != once(vals):  # type: ignore[misc]
            return False
        return code is None or bool(eval(code, shape_globals, dict(zip(names, read(vals)))))  # noqa: S307 - guards we saved
    return check


def split_source(source: str) -> tuple[str, str] | None:
    """(prefix, last segment) of a source the plan reads as a child of its prefix (``L['a'].b`` ->
    ``("L['a']", ".b")``), or None for one it reads as a root (``L['a']``, ``len(L['a'])``)."""
    if source == _SYS_MODULES or not source:
        return None
    cut = source.rfind("[") if source[-1] == "]" else source.rfind(".")
    if cut <= 1:
        return None
    segment, prefix = source[cut:], source[:cut]
    if prefix == "__import__('sys')" or not (segment in _GETTERS or _SEGMENT.fullmatch(segment)):
        return None
    return prefix, segment


def source_tree(sources: Sequence[str]) -> list[tuple[str, int, str]]:
    """The read tree of ``sources``: rows ``(source, parent row or -1, segment)``, parents before
    children, one row per distinct source and prefix (a root's segment is its whole source). Saved
    with an artifact, it lets a load build the guard plan without splitting sources
    (``plan_check(..., tree=...)``)."""
    rows: list[tuple[str, int, str]] = []
    index: dict[str, int] = {}

    def add(source: str) -> int:
        i = index.get(source)
        if i is None:
            split = split_source(source)
            parent, segment = (-1, source) if split is None else (add(split[0]), split[1])
            i = index[source] = len(rows)
            rows.append((source, parent, segment))
        return i
    for s in sources:
        if s:
            add(s)
    return rows


def plan_check(guards: Sequence[Any], outputs: Sequence[str] | None = None,
               tree: Sequence[tuple[str, int, str]] | None = None) -> Check:
    """``check(L, G)`` for ``guards``: True/False, or with ``outputs`` the list of their values
    (None when a guard fails). ``tree``: a ``source_tree`` holding (some of) the sources, which the
    plan then reads without splitting them (the same reads)."""
    layout, getters = _layout(guards, outputs, tree)
    return build_plan(layout, guards, getters)


def plan_layout(guards: Sequence[Any], outputs: Sequence[str] | None = None,
                tree: Sequence[tuple[str, int, str]] | None = None) -> dict[str, Any]:
    """The plan of ``plan_check(guards, outputs)`` as JSON data: reads level by level (parent
    position, segment or source), guards by index per group. ``build_plan(layout, guards)`` makes
    the same check again without splitting a source or classifying a guard: an artifact carries
    it, so a load builds a mobilenet's check from C-level maps instead of ~1,000 Python steps."""
    return _layout(guards, outputs, tree)[0]


def _layout(guards: Sequence[Any], outputs: Sequence[str] | None,
            tree: Sequence[tuple[str, int, str]] | None) -> tuple[dict[str, Any], list]:
    reads = _Reads()
    if tree:
        wanted = {g.source for g in guards if g.kind == "SYMBOL" or not (
            g.kind in ("GLOBAL_STATE", "SHAPE_EXPR") or _BARE.fullmatch(g.source))}
        reads.prime(tree, wanted.union(outputs or ()))
    first: list[int] = []
    groups: dict[str, list[tuple[int, int]]] = {k: [] for k in _GROUPED}
    single: list[tuple[int, int]] = []
    symbolic: list[tuple[int, int | None]] = []
    for i, g in enumerate(guards):
        if g.kind in ("SYMBOL", "SHAPE_EXPR"):
            continue
        if g.kind == "GLOBAL_STATE" or _BARE.fullmatch(g.source):
            first.append(i)
        else:
            (groups[g.kind] if _groupable(g) else single).append((i, reads.slot(g.source)))
    for i, g in enumerate(guards):
        if g.kind in ("SYMBOL", "SHAPE_EXPR"):
            symbolic.append((i, reads.slot(g.source) if g.kind == "SYMBOL" else None))
    out_nodes = [reads.slot(s) for s in outputs] if outputs is not None else None
    pos, levels, getters = reads.program()
    texts: dict[str, int] = {}  # a model's ~1,300 reads use a few dozen distinct segments
    level_rows = [[[p for p, _ in level], [texts.setdefault(t, len(texts)) for _, t in level]]
                  for level in levels]
    layout: dict[str, Any] = {
        "texts": list(texts),
        "levels": level_rows,
        "first": first,
        "groups": [[kind, [i for i, _ in members], [pos[n] for _, n in members]]
                   for kind, members in groups.items() if members],
        "single": [[i, pos[n]] for i, n in single],
        "symbols": [[i, None if n is None else pos[n]] for i, n in symbolic],
        "outputs": None if out_nodes is None else [pos[n] for n in out_nodes],
    }
    return layout, getters


def _level_getter(parent: int, text: str) -> Callable[[Any], Any]:
    if parent == 2:  # not a chain: one compiled read of the source
        return eval(f"lambda LG: (lambda L, G: {text})(*LG)")  # noqa: S307 - a guard source
    got = _GETTERS.get(text)
    if got is None:
        if not _SEGMENT.fullmatch(text):
            raise ValueError(f"guard plan: {text!r} is not an attribute or subscript")
        got = _getter(text)
    return got


def build_plan(layout: Mapping[str, Any], guards: Sequence[Any],
               getters: Sequence[Callable[[Any], Any]] | None = None) -> Check:
    """The check of ``plan_layout(guards, outputs)`` (``getters``: the reads' getters in order, when
    the caller has them). Raises ValueError/IndexError/TypeError/KeyError on a malformed layout."""
    levels: list[tuple[tuple, Callable[[list], Any]]] = []
    texts = layout["texts"]
    segment_getters: list[Any] = [None] * len(texts)  # made once per distinct segment
    at = 0
    for parents, ids in layout["levels"]:
        if len(parents) != len(ids) or min(parents) < 0 or max(parents) >= _ROOTS + at:
            raise ValueError("guard plan: a read's parent is not read before it")
        if getters is not None:
            level_getters = tuple(getters[at:at + len(ids)])
        elif 2 in parents:  # reads of whole sources (not chains): one compiled read each
            level_getters = tuple(map(_level_getter, parents, map(texts.__getitem__, ids)))
        else:
            for t in set(ids).difference(i for i, g in enumerate(segment_getters) if g is not None):
                segment_getters[t] = _level_getter(0, texts[t])
            level_getters = tuple(map(segment_getters.__getitem__, ids))
        at += len(ids)
        levels.append((level_getters, _take(parents)))
    n_vals = _ROOTS + at
    for positions in (*(g[2] for g in layout["groups"]), [p for _, p in layout["single"]],
                      [p for _, p in layout["symbols"] if p is not None], layout["outputs"] or ()):
        if positions and not (0 <= min(positions) and max(positions) < n_vals):
            raise ValueError("guard plan: a check reads a value the plan does not read")
    first = [_first_check(guards[i]) for i in layout["first"]]
    checks: list[Callable[[list[Any]], bool]] = [
        _group_check(kind, [guards[i] for i in members], _take(positions))
        for kind, members, positions in layout["groups"]]
    for i, p in layout["single"]:
        checks.append(lambda vals, i=p, ok=_value_check(guards[i]): ok(vals[i]))  # type: ignore[misc]
    sizes_hold = _sizes_check(guards, layout["symbols"])
    outputs = layout["outputs"]
    gather: Callable[[list[Any]], list[Any]] | None = (
        None if outputs is None else (lambda vals: []) if not outputs
        else (lambda vals, t=_take(outputs): list(t(vals))))  # type: ignore[misc]
    fail = None if gather is not None else False
    call = operator.call
    modules = sys.modules

    def check(L: Mapping[str, Any], G: Mapping[str, Any]) -> Any:
        try:
            for c in first:
                if not c(L, G):
                    return fail
            vals: list = [L, G, (L, G), modules]
            for level_getters, parents in levels:
                vals.extend(map(call, level_getters, parents(vals)))
            for vc in checks:
                if not vc(vals):
                    return fail
            if sizes_hold is not None and not sizes_hold(vals):
                return fail
            return True if gather is None else gather(vals)
        except Exception:  # a source that no longer resolves: the guard fails
            return fail

    check.__kiln_reads__ = at  # type: ignore[attr-defined]
    return check
