"""The graph being built: fake tensors, placeholders for everything read from the frame, guards.

Values entering the trace from the outside world (frame locals, globals, closure cells, attributes
of modules and objects) pass through ``Tracer.wrap`` with their guard source: tensors become
placeholders (parameters and buffers included), constants are guarded by value, modules and
functions by identity, containers by type and length and are copied with wrapped elements.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import operator
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

from kiln.graph import (
    CHECKPOINT_TAG,
    SIZE_OPS,
    SIZE_UNARY_OPS,
    Guard,
    TensorSpec,
    global_state,
    symbolic_dispatch,
    tensor_expectation,
    type_name,
)

from .aliasing import InputTensors
from .checkpoint import guard_region_writes
from .deferred import is_random_target, seed_pending
from .errors import BREAKING_ERRORS, GraphBreak
from .foreign import is_immutable_constant, is_numpy_scalar, state_in_c
from .input_shapes import constrain_ranges, guard_strides
from .knobs import user_environment
from .module_calls import CallPath, call_path, global_hook_keys
from .numpy_trace import liftable
from .shape_env import CaptureShapeEnv
from .shape_source import KilnSource
from .sources import item_source, placeholder_name, pretty
from .values import (
    ContextExit,
    GradModeContext,
    ListIterator,
    NumpyArray,
    ResumedAutocast,
    ResumeIterator,
)

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_UNSET = object()  # an attribute that did not exist before a write
DELETED = object()
_GRAD_MODES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)  # an attribute deleted inside the trace
CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis))

# dim sets the cache decides for a source: which dims of this input tensor are dynamic
DynamicPolicy = Callable[[str, Any], frozenset[int]]  # (source, tensor or int arg) -> dynamic dims


@dataclass
class GraphInput:
    source: str
    value: Any  # the real value at trace time (an example input)
    fake: Any
    node: fx.Node


@dataclass
class SubgraphScope:
    """A torch.cond branch being recorded: its graph and the enclosing nodes it reads."""

    graph: fx.Graph
    parent: fx.Graph
    saved_exprs: dict
    lifted: dict = field(default_factory=dict)  # enclosing node -> placeholder here
    submodules: dict = field(default_factory=dict)  # branch graphs of torch.cond calls inside this one

    def placeholder(self, outer: fx.Node) -> fx.Node:
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        anchor = placeholders[-1] if placeholders else None
        first = next(iter(self.graph.nodes), None)
        ctx = self.graph.inserting_after(anchor) if anchor is not None else (
            self.graph.inserting_before(first) if first is not None else self.graph.inserting_after())
        with ctx:
            node = self.graph.placeholder(outer.name)
        node.meta.update({k: v for k, v in outer.meta.items() if k in ("val", "spec")})
        return node


class Tracer:
    """Owns the fx graph, the fake mode and shape env, the input placeholders and the guards."""

    def __init__(self, dynamic_policy: DynamicPolicy, symbolic: bool = True, duck: bool = False,
                 unspecialized: frozenset[str] = frozenset()) -> None:
        # Note: ShapeEnv is only built when a size may be symbolic; creating the first one imports a
        # large part of torch, which static captures do not need.
        self.shape_env = CaptureShapeEnv() if symbolic else None
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=False)
        self.graph = fx.Graph()  # the graph being recorded: the root, or a torch.cond branch
        self.root_graph = self.graph
        self.scopes: list[SubgraphScope] = []  # torch.cond branches being traced, innermost last
        self.submodules: dict[str, fx.GraphModule] = {}  # branch graphs, attributes of the root
        self.dynamic_policy = dynamic_policy
        # module sources whose object changed between calls (cache.note_new_modules): the modules
        # at and below them are guarded by type and what the trace reads, never by identity
        self.unspecialized = unspecialized
        # dynamic=True: dims not marked are duck-sized (equal sizes share one symbol), as torch does;
        # marked and automatically dynamic dims get a symbol each
        self.duck = duck
        self.node_of: dict[int, fx.Node] = {}
        self.node_of_expr: dict[sympy.Expr, fx.Node] = {}
        self.keep: list[Any] = []  # keeps ids in node_of unique for the trace's lifetime
        self.inputs: list[GraphInput] = []
        self.input_by_key: dict[Any, Any] = {}
        self.guards: dict[tuple[str, str], Guard] = {}
        self.pinned: list[Any] = []  # the objects ID_MATCH guards name (guard_identity)
        # parameters and buffers pinned by identity, whose layouts the entry checks (pinned_layouts.py)
        self.pinned_tensors: list[tuple[str, torch.Tensor]] = []
        self.input_tensors = InputTensors()  # how the input tensors alias (aliasing.py)
        # module calls traced, checked per call of the entry (module_calls.call_path_check)
        self.call_paths: dict[int, CallPath] = {}
        self.global_hooks: tuple | None = None
        self.source_of: dict[int, str] = {}
        self.made: set[int] = set()  # objects made during the trace that must be rebuilt per call
        # tensors a torch.nn module's initialisation made in the graph -> (its site, the module's
        # class name): they cannot leave the graph (module_init.py)
        self.built_state: dict[int, tuple[tuple[Any, int], str]] = {}
        self.opaque: set[int] = set()  # ids of values from the frame guarded by type only (foreign.py)
        self.symbol_sources: dict[str, list[str]] = {}
        # torch.utils.checkpoint regions (checkpoint.py): the one being traced, and how many were entered
        self.checkpoint_region: int | None = None
        self.checkpoint_regions = 0
        self.stride_relations: list[Guard] = []  # symbolic strides of inputs as relations (input_shapes.guard_strides)
        self.speculative: set[fx.Node] = set()
        self.param_fakes: set[int] = set()
        self.input_source_of_fake: dict[int, str] = {}
        # attribute writes on objects from outside the trace, replayed after the graph
        self.attr_writes: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        # lists/dicts read from a source are traced as copies; writes to them are replayed on the
        # real container after the graph (contents written back whole)
        self.owned_copies: dict[int, str] = {}
        self.copies_by_source: dict[str, Any] = {}
        self.copies_by_id: dict[int, tuple[Any, Any]] = {}  # id(real) -> (copy, real)
        self.container_writes: dict[int, tuple[Any, str]] = {}
        self.mutation_log: list[tuple[Any, Any, bool]] = []  # (copy, contents before, first write)
        # (id, node before): a value recorded again as another node's result. ``x.to(x.dtype)``,
        # ``x.contiguous()`` and in-place methods return ``x`` itself, so its entry moves to the new
        # node; rolling that node back must move it back (else a graph output names an erased node)
        self.rebinds: list[tuple[int, fx.Node]] = []
        # (object, name, value before or _UNSET): attributes set for real on objects the trace made
        # (an HF cache's ``self.keys = torch.cat(...)``), undone with the instruction that breaks
        self.setattr_log: list[tuple[Any, str, Any]] = []
        self.deferred: list[tuple[Any, list, dict]] = []  # calls replayed after the graph (deferred.py)
        # autocast blocks entered before a graph break and left in this trace (op_control.exit_context):
        # the node that enters their previous state, and where the real block's ``__exit__`` is read
        self.resumed_autocasts: list[tuple[fx.Node, str]] = []
        # NumPy RNG calls (numpy_random.py): draws are graph inputs computed on each call, before the
        # graph, in program order; seeds not yet followed by a draw wait in ``rng_pending``
        self.draws: list[GraphInput] = []
        # NumPy under ``with torch.device(d)``: arrays live on d (numpy_trace.on_device); each CPU
        # array moved there is (cpu tensor, device copy, the copy's version when made, array source)
        self.numpy_device = torch.get_default_device()
        self.device_copies: dict[int, tuple[torch.Tensor, torch.Tensor, int | None, str | None]] = {}
        self.rng_pending: tuple[tuple[Any, list, dict, str], ...] = ()
        self.advances: list[tuple[ListIterator, int]] = []  # interpreted iterators advanced (ListIterator)
        self.last_placeholder: fx.Node | None = None
        self.fake_memo: dict[tuple, tuple] = {}  # shape_rules/functions.py: memoized results of repeated calls
        self.location = ""  # the traced instruction as a traceback line, for node metadata
        self.where = ""  # the same as file:line, for guard notes
        self.start_state = global_state()
        self.add_guard("", "GLOBAL_STATE", self.start_state, "grad/autocast/dtype/device state at capture")

    # ---- guards -------------------------------------------------------------------------
    def add_guard(self, source: str, kind: str, expected: Any, note: str = "") -> None:
        key = (source, kind)
        if key not in self.guards:
            self.guards[key] = Guard(source, kind, expected, note or self.where)

    def guard_identity(self, source: str, value: Any) -> None:
        """An ID_MATCH guard; the entry keeps ``value`` alive (``pinned``), so a later object can
        never reuse its id and pass the guard in its place."""
        if (source, "ID_MATCH") not in self.guards:
            self.pinned.append(value)
        self.add_guard(source, "ID_MATCH", id(value))

    # ---- values entering the trace -----------------------------------------------------
    def wrap(self, value: Any, source: str | None) -> Any:
        """The interpreted form of a real value read from ``source`` (guarding what was assumed)."""
        if source is None:
            return self._wrap_unsourced(value)
        if isinstance(value, torch.Tensor):
            return self.lift_tensor(value, source)
        t = type(value)
        if value is None:
            self.add_guard(source, "IS_NONE", None)
            return value
        if t is int and self.shape_env is not None and self.dynamic_policy(source, value):
            lifted = self.lift_int(value, source)
            if lifted is not None:
                return lifted
        if t is float and self.shape_env is not None and math.isfinite(value) and \
                self.dynamic_policy(source, value):
            return self.lift_float(value, source)
        if t in (bool, int, float, str, bytes, complex, slice, range, torch.Size) or is_numpy_scalar(value):
            self.add_guard(source, "EQUALS_MATCH", value)
            return value
        if liftable(value):  # an ndarray: a graph input sharing its memory (numpy_trace.py)
            fake = self.lift_tensor(torch.from_numpy(value), f"__import__('torch').from_numpy({source})")
            array = NumpyArray(self.on_numpy_device(fake, source), source=source)
            self.keep.append(array)
            return array
        if t in (set, frozenset) and all(type(v) in _CONSTANT_TYPES for v in value):
            # a set of constants: its contents guarded as one frozenset (a set has no item sources)
            self.add_guard(source, "TYPE_MATCH", type_name(t))
            self.add_guard(f"frozenset({source})", "EQUALS_MATCH", frozenset(value))
            self._remember(value, source)
            return value
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum)):
            if isinstance(value, torch.device):
                self.add_guard(source, "EQUALS_MATCH", value)
            else:
                self.guard_identity(source, value)
            return value
        if isinstance(value, types.MethodType):
            if value.__name__ == "__exit__" and isinstance(value.__self__, _GRAD_MODES):
                # a grad-mode block entered before a graph break: model it, so its exit is recorded
                prev = bool(getattr(value.__self__, "prev", True))
                self.add_guard(f"{source}.__self__", "TYPE_MATCH", type_name(type(value.__self__)))
                self.add_guard(f"{source}.__self__.prev", "EQUALS_MATCH", prev)
                return ContextExit(GradModeContext(torch.is_grad_enabled(), prev=prev))
            if value.__name__ == "__exit__" and value.__func__ is torch.autocast.__exit__ and \
                    hasattr(value.__self__, "prev_fastdtype"):
                return self._resumed_autocast(value.__self__, source)
            self.guard_identity(f"{source}.__func__", value.__func__)
            self.wrap(value.__self__, f"{source}.__self__")
            return value
        if isinstance(value, types.ModuleType):
            # the module object is assumed stable, as in PyTorch's own compiler; its source guards
            # the attributes read from it (semantics.module_attr_source)
            self._remember(value, source)
            return value
        if isinstance(value, types.FunctionType):
            # the code, not the function object: closures re-created per call still hit the cache
            self.guard_identity(f"{source}.__code__", value.__code__)
            self._remember(value, source)
            return value
        if isinstance(value, nn.Module) and self.is_unspecialized(source):
            self._wrap_unspecialized_module(value, source)
            return value
        if isinstance(value, types.BuiltinMethodType) and type(value.__self__) in (list, dict):
            # ``log.append`` reached as a value (a resume function's stack): its list is traced as the frame's
            # are; called for real at trace time it put traced values (symbolic floats) in the caller's list
            self.add_guard(source, "TYPE_MATCH", type_name(t))
            self.add_guard(f"{source}.__name__", "EQUALS_MATCH", value.__name__)
            return getattr(self.wrap(value.__self__, f"{source}.__self__"), value.__name__)
        if isinstance(value, (types.BuiltinFunctionType, type, nn.Module,
                              types.MethodWrapperType)) or callable(value) and t.__module__ == "builtins":
            self.guard_identity(source, value)
            self._remember(value, source)
            return value
        if source in self.copies_by_source:  # read again: the same (possibly written) traced copy
            return self.copies_by_source[source]
        if id(value) in self.copies_by_id:  # the same list/dict reached through another source
            copy, real = self.copies_by_id[id(value)]
            if real is value:  # Note: aliasing is assumed, not guarded (as PyTorch's compiler does)
                return copy
        if t is tuple and _constant_tuple(value) and not self._has_dynamic_float(value, source):
            # one guard for a constant tuple (a conv's stride): EQUALS_MATCH compares every item's
            # type too, so it stands for TYPE_MATCH + LENGTH_MATCH + a guard per item
            self.add_guard(source, "EQUALS_MATCH", value)
            copy = tuple([*value])  # a traced value of its own, as the item-wise path made
            self._remember(copy, source)
            return copy
        if t in (tuple, list) or (isinstance(value, tuple) and hasattr(t, "_fields")):
            self.add_guard(source, "TYPE_MATCH", type_name(t))
            self.add_guard(source, "LENGTH_MATCH", len(value))
            items = [self.wrap(v, item_source(source, i)) for i, v in enumerate(value)]
            out: Any = t(items) if t is list else (tuple(items) if t is tuple else t(*items))
            self._remember(out, source)
            if t is list:
                self.owned_copies[id(out)] = source
                self.copies_by_source[source] = out
                self.copies_by_id[id(value)] = (out, value)
            return out
        if t is ResumeIterator:
            self.add_guard(source, "TYPE_MATCH", type_name(t))
            self.add_guard(source, "LENGTH_MATCH", len(value))
            return ListIterator([self.wrap(value.peek(i), f"{source}.peek({i})") for i in range(len(value))], self.advances)
        if t is dict or (isinstance(value, dict) and _plain_dict_subclass(t)):
            self.add_guard(source, "TYPE_MATCH", type_name(t))
            keys = list(value.keys())
            if all(type(k) in (str, int) for k in keys):
                self.add_guard(source, "DICT_KEYS", tuple(keys))
                out = {k: self.wrap(value[k], item_source(source, k)) for k in keys}
                if t is not dict:
                    d = value.copy()  # of its type, a defaultdict's factory kept (read for a missing key)
                    d.clear()
                    d.update(out)
                    out = d
                self._remember(out, source)
                self.owned_copies[id(out)] = source
                self.copies_by_source[source] = out
                self.copies_by_id[id(value)] = (out, value)
                return out
        self.add_guard(source, "TYPE_MATCH", type_name(t))
        self._remember(value, source)
        if value is user_environment():  # read through stdlib code run for real: its whole contents guarded
            self.add_guard(f"tuple({source}.items())", "EQUALS_MATCH", tuple(user_environment().items()))
            return value
        if isinstance(value, dict) and all(type(k) in (str, int) for k in value):
            # a dict subclass of a library (a registry): the object itself is used (its methods see
            # its real contents), so its keys and every value are guarded
            self.add_guard(source, "DICT_KEYS", tuple(value.keys()))
            for k in value:
                self.wrap(dict.__getitem__(value, k), item_source(source, k))
            return value
        if isinstance(value, list):
            self.add_guard(source, "LENGTH_MATCH", len(value))
            for i in range(len(value)):
                self.wrap(list.__getitem__(value, i), item_source(source, i))
            return value
        if state_in_c(value):
            self.opaque.add(id(value))  # only its type is guarded: no computing on it (foreign.py)
        return value

    def _has_dynamic_float(self, value: tuple, source: str) -> bool:
        """A float item of a constant tuple that changed between calls (Adam's ``betas`` under OneCycleLR):
        the tuple is guarded item by item, so that item is a symbolic float (automatic dynamic)."""
        return self.shape_env is not None and any(
            type(v) is float and math.isfinite(v) and self.dynamic_policy(item_source(source, i), v)
            for i, v in enumerate(value))

    def note_module_call(self, module: nn.Module) -> None:
        self.call_paths.setdefault(id(module), call_path(module))

    def note_global_hooks(self) -> None:
        if self.global_hooks is None:
            self.global_hooks = global_hook_keys()

    def _resumed_autocast(self, block: Any, source: str) -> ContextExit:
        """The bound ``__exit__`` of a torch.autocast block entered in Python before a graph break (a
        resume function's stack): modelled, so the block's end is not a second break. The state it
        restores is guarded."""
        self.add_guard(f"{source}.__self__", "TYPE_MATCH", type_name(type(block)))
        for attr in ("device", "prev", "prev_cache_enabled"):
            self.add_guard(f"{source}.__self__.{attr}", "EQUALS_MATCH", getattr(block, attr))
        self.add_guard(f"str({source}.__self__.prev_fastdtype)", "EQUALS_MATCH", str(block.prev_fastdtype))
        return ContextExit(ResumedAutocast(block.device, block.prev_fastdtype, block.prev, block.prev_cache_enabled,
                                           source))

    def is_unspecialized(self, source: str) -> bool:
        """Whether ``source`` is, or lies below, a module source guarded by type (see __init__)."""
        return any(source == p or source.startswith((f"{p}.", f"{p}[")) for p in self.unspecialized)

    def _wrap_unspecialized_module(self, module: nn.Module, source: str) -> None:
        """A module that is a new object on each call (built inside the compiled code before a graph
        break): its type is guarded here; what the trace reads from it (attributes, submodules,
        parameters as graph inputs; its hooks and forward when it is called) where it is read."""
        self.add_guard(source, "TYPE_MATCH", type_name(type(module)))
        self._remember(module, source)

    def note_made(self, value: Any) -> None:
        """``value`` was made during the trace (a constructed object, a mutable C object a call
        returned): after the graph it is rebuilt per call, or the frame runs in Python."""
        if id(value) not in self.source_of and not is_immutable_constant(value):
            self.made.add(id(value))
            self.keep.append(value)

    def is_opaque(self, value: Any) -> bool:
        return id(value) in self.opaque and id(value) in self.source_of

    def lift_int(self, value: int, source: str) -> Any:
        """A Python int argument as a symbolic int: a graph input bound by a SYMBOL guard.
        0 and 1 stay constants (ShapeEnv specialises them, as PyTorch's compiler does), and so do
        negative ints (None: the caller guards the value)."""
        if source in self.input_by_key:
            return self.input_by_key[source]
        assert self.shape_env is not None
        if value < 0:
            # a negative int stays a constant: size symbols are positive (ShapeEnv refuses a positive
            # symbol for it, and kiln.inductor's index algebra takes every symbol as non-negative)
            return None
        ksrc = KilnSource(source)
        sym = self.shape_env.create_symbol(value, ksrc, dynamic_dim=DimDynamic.DYNAMIC)
        if not isinstance(sym, sympy.Symbol):
            return None
        return self._symbolic_input(source, value, sym, self.shape_env.create_symintnode(sym, hint=value, source=ksrc))

    def lift_float(self, value: float, source: str) -> Any:
        """A Python float that varies between calls as a symbolic float: a graph input bound by a
        SYMBOL guard. What the trace decides on its value (a branch, ``int(s)``) is a guard."""
        if source in self.input_by_key:
            return self.input_by_key[source]
        assert self.shape_env is not None
        ksrc = KilnSource(source)
        sym = self.shape_env.create_unspecified_symbol(value, ksrc, dynamic_dim=DimDynamic.DYNAMIC)
        return self._symbolic_input(source, value, sym, self.shape_env.create_symfloatnode(sym, hint=value, source=ksrc))

    def _symbolic_input(self, source: str, value: int | float, sym: sympy.Symbol, symbolic: Any) -> Any:
        """A Python scalar's symbol as a graph input: guarded by its type, bound by a SYMBOL guard."""
        self.add_guard(source, "TYPE_MATCH", type_name(type(value)))
        node = self._placeholder(source, symbolic)
        self.symbol_sources.setdefault(str(sym), []).append(source)
        self.node_of_expr.setdefault(sym, node)
        self.register(symbolic, node)
        self.inputs.append(GraphInput(source, value, symbolic, node))
        self.input_by_key[source] = symbolic
        return symbolic

    def _wrap_unsourced(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            raise GraphBreak("a tensor without a guardable source (a constant or a value computed "
                             "outside the graph)", "pass the tensor as an argument")
        return value

    def _remember(self, value: Any, source: str) -> None:
        if id(value) not in self.source_of:
            self.source_of[id(value)] = source
            self.keep.append(value)

    def lift_tensor(self, value: torch.Tensor, source: str) -> torch.Tensor:
        is_state = isinstance(value, nn.Parameter) or "._parameters[" in source or "._buffers[" in source
        # parameters of a module built anew on each call are new tensors each call: read by source
        pinned = is_state and not self.is_unspecialized(source)
        key: Any = id(value) if pinned else source
        if pinned:
            self.guard_identity(source, value)
        if key in self.input_by_key:
            return self.input_by_key[key]
        if type(value) not in (torch.Tensor, nn.Parameter, nn.parameter.Buffer):
            if isinstance(value, FakeTensor):
                return value
            raise GraphBreak(f"tensor subclass {type(value).__name__}")
        earlier = self.input_tensors.fake_of(value)
        if earlier is not None:  # a second source of one tensor: an input checked to be that tensor (aliasing.py)
            self.inputs.append(GraphInput(source, value, earlier, self._placeholder(source, earlier)))
            self.input_tensors.lifted(value, source, earlier, pinned)
            self.input_by_key[key] = earlier
            return earlier  # the ops keep using the first input's node
        if is_state:
            if pinned:
                self.pinned_tensors.append((source, value))
            else:
                self.add_guard(source, "TENSOR_MATCH", tensor_expectation(value))
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
            if isinstance(value, nn.Parameter):
                self.param_fakes.add(id(fake))
        else:
            dims = self.dynamic_policy(source, value)
            dims = frozenset(d for d in dims if d < value.dim()) if self.shape_env is not None else frozenset()
            if dims:
                marked = getattr(value, "_kiln_dynamic_dims", ())
                ctx: StatelessSymbolicContext[..., Any] = StatelessSymbolicContext(dynamic_sizes=[
                    DimDynamic.STATIC if i not in dims else
                    DimDynamic.DUCK if self.duck and i not in marked else DimDynamic.DYNAMIC
                    for i in range(value.dim())])
                fake = self.fake_mode.from_tensor(value, source=KilnSource(source), symbolic_context=ctx)
                constrain_ranges(self.shape_env, value, fake, source)
            else:
                fake = self.fake_mode.from_tensor(value, static_shapes=True)
            dyn = frozenset(i for i, s in enumerate(fake.shape) if isinstance(s, torch.SymInt))
        node = self._placeholder(source, fake)
        for i, s in enumerate(fake.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                self.symbol_sources.setdefault(str(s.node.expr), []).append(f"{source}.size()[{i}]")
                if s.node.expr not in self.node_of_expr:
                    self.node_of_expr[s.node.expr] = self._size_node(node, i, s)
        if not is_state:
            strides = guard_strides(fake, source, self.symbol_sources, self.stride_relations) if dyn else None
            self.add_guard(source, "TENSOR_MATCH", tensor_expectation(value, dyn, strides))
        self.inputs.append(GraphInput(source, value, fake, node))
        self.input_tensors.lifted(value, source, fake, pinned)
        self.input_source_of_fake[id(fake)] = source
        self.input_by_key[key] = fake
        self.node_of[id(fake)] = node
        self.keep.append(fake)
        return fake

    def lift_draw(self, value: torch.Tensor, source: str) -> torch.Tensor:
        """A graph input computed by ``source`` on every call (a NumPy random draw): ``value`` is an
        example of its shape and dtype; nothing is guarded (the source's arguments are constants)."""
        fake = self.fake_mode.from_tensor(value, static_shapes=True)
        # one call's text can repeat (seed(3), draw, seed(3), draw): the name says which draw it is
        node = self._placeholder(source, fake, f"numpy_random_draw_{len(self.draws)}")
        graph_input = GraphInput(source, value, fake, node)
        self.inputs.append(graph_input)
        self.draws.append(graph_input)
        self.node_of[id(fake)] = node
        self.keep.append(fake)
        return fake

    def on_numpy_device(self, t: torch.Tensor, source: str | None = None) -> torch.Tensor:
        """A CPU array's tensor moved to the device of the ``torch.device`` context active at capture
        (NumPy code runs there, as torch.compile allows); writes to the copy are written back at
        the end of the graph (``write_back_device_copies``)."""
        d = self.numpy_device
        if d.type == "cpu" or t.device == d:
            return t
        dev = self.record("call_method", "to", (t, d), {}, lambda: t.to(d))
        self.device_copies[id(dev)] = (t, dev, None if dev.is_inference() else dev._version, source)
        return dev

    def write_back_device_copies(self) -> None:
        """In-place writes to arrays moved to a device reach the CPU memory they came from."""
        for cpu, dev, version, _ in list(self.device_copies.values()):
            if version is None or dev._version != version:  # (an inference tensor's writes are not counted)
                self.record("call_method", "copy_", (cpu, dev), {}, functools.partial(cpu.copy_, dev))

    def _drop_draws(self, keep: int) -> None:
        """Draws of an instruction rolled back: it runs in Python instead, so they must not run twice."""
        while len(self.draws) > keep:
            d = self.draws.pop()
            del self.inputs[next(k for k, i in enumerate(self.inputs) if i is d)]  # by identity (tensor fields)
            if self.last_placeholder is d.node:
                prev = d.node.prev
                self.last_placeholder = prev if prev.op == "placeholder" else None
            self.root_graph.erase_node(d.node)

    def _placeholder(self, source: str, fake: Any, name: str | None = None) -> fx.Node:
        if self.last_placeholder is None:
            root = self.root_graph
            first = next(iter(root.nodes), None)
            ctx = root.inserting_before(first) if first is not None else root.inserting_after()
        else:
            ctx = self.root_graph.inserting_after(self.last_placeholder)
        with ctx:
            node = self.root_graph.placeholder(name or placeholder_name(source))
        # fx writes a placeholder's target as the parameter name of the graph's forward; node names are
        # unique, targets are not (``out["loss"]`` and ``out.loss`` of a ModelOutput both read l_out_loss)
        node.target = node.name
        self.last_placeholder = node
        node.meta["val"] = fake
        node.meta["spec"] = TensorSpec.from_tensor(fake) if isinstance(fake, torch.Tensor) else None
        node.meta["source"] = pretty(source)
        # parameters and buffers of modules: reduce-overhead keeps them as static CUDA-graph inputs
        node.meta["module_state"] = "._parameters[" in source or "._buffers[" in source
        return node

    def _size_node(self, tensor_node: fx.Node, dim: int, sym: Any) -> fx.Node:
        with self.root_graph.inserting_after(self.last_placeholder):
            n = self.root_graph.call_method("size", (tensor_node, dim))
        n.meta["val"] = sym
        self.speculative.add(n)
        return n

    # ---- recording ----------------------------------------------------------------------
    def _symbolic(self) -> bool:
        """Whether this trace has symbolic sizes (torch 2.15 renamed the ShapeEnv's table)."""
        env = self.shape_env
        if env is None:
            return False
        return bool(getattr(env, "backed_var_to_val", None) if hasattr(env, "backed_var_to_val") else env.var_to_val)

    def record(self, kind: str, target: Any, args: tuple, kwargs: dict, run: Callable[[], Any],
               pure: bool = False) -> Any:
        """Run ``run`` on fake values and record one node computing its result."""
        self.refuse_random_after_seed(target)
        node_args = self.to_arg(args)
        node_kwargs = self.to_arg(kwargs)
        region = self.checkpoint_region
        check_writes = None if region is None else guard_region_writes(region, self.node_of, target, args, kwargs)
        try:
            with self.fake_mode:
                with symbolic_dispatch(self._symbolic()):
                    result = run()
        except GraphBreak:
            raise
        except Exception as e:
            if not isinstance(e, BREAKING_ERRORS):
                raise  # a genuine user error: the frame runs eagerly and raises it from user code
            raise GraphBreak(f"{_describe_target(target)} failed on fake tensors: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        if check_writes is not None:
            check_writes()
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        if self.location:
            node.meta["stack_trace"] = self.location
        if self.checkpoint_region is not None:
            node.meta[CHECKPOINT_TAG] = self.checkpoint_region
        if pure:
            self.speculative.add(node)
        self.register(result, node)
        return result

    def refuse_random_after_seed(self, target: Any) -> None:
        if self.deferred and seed_pending(self.deferred) and is_random_target(target):
            raise GraphBreak("a random op after torch.manual_seed in the same graph",
                             "the seed is set after the graph, then this op runs in Python")

    def register(self, value: Any, node: fx.Node) -> None:
        before = self.node_of.get(id(value)) if isinstance(value, (torch.Tensor, *SYM_TYPES)) else None
        if before is not None and before is not node:
            self.rebinds.append((id(value), before))
        if isinstance(value, torch.Tensor):
            self.node_of[id(value)] = node
            self.keep.append(value)
            node.meta["val"] = value
        elif isinstance(value, SYM_TYPES):
            node.meta["val"] = value
            self.node_of[id(value)] = node
            self.keep.append(value)
            expr = value.node.expr
            if not expr.is_number:
                self.node_of_expr.setdefault(expr, node)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if _has_traced(v):
                    with self.graph.inserting_after(node):
                        item = self.graph.call_function(operator.getitem, (node, i))
                    self.speculative.add(item)
                    self.register(v, item)

    def to_arg(self, value: Any) -> Any:
        """Map an interpreted value to an fx argument (fakes and symbolic sizes to their nodes)."""
        if isinstance(value, torch.Tensor):
            node = self.node_of.get(id(value))
            if node is None:
                raise GraphBreak("a tensor created outside the graph was used in it",
                                 "create tensors with torch functions inside the compiled code")
            return self.lift(node)
        if isinstance(value, SYM_TYPES):
            node = self.sym_node(value)
            return self.lift(node) if isinstance(node, fx.Node) else node
        if type(value) in (list, tuple):
            return type(value)(self.to_arg(v) for v in value)
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            return tuple(self.to_arg(v) for v in value)
        if type(value) is dict:
            return {k: self.to_arg(v) for k, v in value.items()}
        if type(value) is slice:
            return slice(self.to_arg(value.start), self.to_arg(value.stop), self.to_arg(value.step))
        if isinstance(value, torch.Size):
            return tuple(self.to_arg(v) for v in value)
        if is_numpy_scalar(value):  # torch treats numpy scalars as Python numbers
            return value.item()
        if isinstance(value, (*CONSTANT_TYPES, torch.dtype, torch.device, torch.layout,
                              torch.memory_format)):
            return value
        if isinstance(value, range):
            return value
        raise GraphBreak(f"cannot pass a {type(value).__name__} into the graph")

    def sym_node(self, value: Any) -> Any:
        node = self.node_of.get(id(value))
        if node is not None:
            return node
        expr = value.node.expr
        if expr.is_number:
            return int(expr) if isinstance(value, torch.SymInt) else (
                bool(expr) if isinstance(value, torch.SymBool) else float(expr))
        node = self._expr_node(expr)
        self.register(value, node)
        return node

    def _expr_node(self, expr: sympy.Expr) -> Any:
        """Build nodes computing a symbolic size expression from the symbols' size nodes."""
        if expr in self.node_of_expr:
            return self.lift(self.node_of_expr[expr])
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Float):
            return float(expr)
        name = type(expr).__name__  # a size the program derived (``math.ceil(n / 3)``, ``n * 0.5``)
        if name in SIZE_UNARY_OPS and len(expr.args) == 1:
            acc = self.graph.call_function(SIZE_UNARY_OPS[name], (self._expr_node(expr.args[0]),))
            self.speculative.add(acc)
        elif name in SIZE_OPS:
            args = [self._expr_node(a) for a in expr.args]
            acc = args[0]
            for a in args[1:]:
                acc = self.graph.call_function(SIZE_OPS[name], (acc, a))
                self.speculative.add(acc)
        else:
            raise GraphBreak(f"symbolic size {expr} has no graph value")
        self.node_of_expr[expr] = acc
        return acc

    # ---- torch.cond branches ---------------------------------------------------------------
    def push_scope(self) -> SubgraphScope:
        scope = SubgraphScope(fx.Graph(), self.graph, dict(self.node_of_expr))
        self.scopes.append(scope)
        self.graph = scope.graph
        return scope

    def pop_scope(self, scope: SubgraphScope) -> None:
        assert self.scopes and self.scopes[-1] is scope
        self.scopes.pop()
        self.graph = scope.parent
        self.node_of_expr = scope.saved_exprs  # sizes computed inside the branch stay inside it

    def lift(self, node: fx.Node) -> fx.Node:
        """A node of an enclosing graph used inside a branch becomes a branch placeholder."""
        if not self.scopes or node.graph is self.graph:
            return node
        return self._lift_into(len(self.scopes) - 1, node)

    def _lift_into(self, level: int, node: fx.Node) -> fx.Node:
        scope = self.scopes[level]
        if node.graph is scope.graph:
            return node
        if node.graph is not scope.parent:  # from further out: lift it into the parent first
            node = self._lift_into(level - 1, node)
        if node not in scope.lifted:
            scope.lifted[node] = scope.placeholder(node)
        return scope.lifted[node]

    # ---- writes to input containers -------------------------------------------------------
    def owns_copy(self, obj: Any) -> bool:
        return id(obj) in self.owned_copies and self.source_of.get(id(obj)) == self.owned_copies[id(obj)]

    def note_container_write(self, obj: Any) -> None:
        """Called before ``obj`` (an owned copy of an input list/dict) is changed in place."""
        first = id(obj) not in self.container_writes
        self.mutation_log.append((obj, list(obj) if isinstance(obj, list) else dict(obj), first))
        self.container_writes[id(obj)] = (obj, self.owned_copies[id(obj)])

    def note_setattr(self, obj: Any, name: str) -> None:
        """Called before ``obj.name`` is set or deleted for real (see ``setattr_log``)."""
        self.setattr_log.append((obj, name, getattr(obj, name, _UNSET)))

    # ---- checkpoints for rolling back an instruction that breaks -------------------------
    def checkpoint(self) -> tuple:
        return (self.graph._root.prev, torch.is_grad_enabled(), dict(self.attr_writes), len(self.mutation_log),
                len(self.advances), len(self.rebinds), len(self.setattr_log), len(self.deferred), len(self.draws),
                self.rng_pending)

    def rollback(self, cp: tuple) -> None:
        last, grad, writes, n_mutations, n_advances, n_rebinds, n_setattrs, n_deferred, n_draws, pending = cp
        self.attr_writes = writes
        del self.deferred[n_deferred:]
        self.rng_pending = pending
        while len(self.rebinds) > n_rebinds:
            key, node = self.rebinds.pop()
            self.node_of[key] = node
        while len(self.setattr_log) > n_setattrs:
            obj, name, before = self.setattr_log.pop()
            if before is _UNSET:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, before)
        while len(self.advances) > n_advances:
            it, index = self.advances.pop()
            it.index = index
        while len(self.mutation_log) > n_mutations:
            obj, before, first = self.mutation_log.pop()
            if isinstance(obj, list):
                obj[:] = before
            else:
                obj.clear()
                obj.update(before)
            if first:
                del self.container_writes[id(obj)]
        while self.graph._root.prev is not last and self.graph._root.prev is not self.graph._root:
            node = self.graph._root.prev
            if node.op == "placeholder":
                break
            for user in list(node.users):
                self.graph.erase_node(user)
            self.graph.erase_node(node)
        self._drop_draws(n_draws)
        torch.set_grad_enabled(grad)


_CONSTANT_TYPES = frozenset({bool, int, float, str, type(None)})


def _constant_tuple(value: tuple) -> bool:
    """A tuple of ints, floats, bools, strings and None (or tuples of them): data a guard can hold."""
    return all(type(v) in _CONSTANT_TYPES or (type(v) is tuple and _constant_tuple(v)) for v in value)


def _plain_dict_subclass(t: type) -> bool:
    return t.__module__ == "collections" and t.__name__ in ("OrderedDict", "defaultdict", "Counter")


def _has_traced(v: Any) -> bool:
    if isinstance(v, (torch.Tensor, *SYM_TYPES)):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_traced(x) for x in v)
    return False


def _describe_target(target: Any) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    return f"{mod + '.' if mod else ''}{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}"
