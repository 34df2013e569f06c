"""torch functions and Tensor methods: run on fake tensors and recorded as one node each."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln.graph import is_pure_op

from . import polyfills
from .aliasing import version
from .errors import GraphBreak
from .numpy_trace import tensor_to_numpy
from .semantics import contains_traced, refuse_overlapping_write
from .shape_env import FRESH_RESULT, VIEW_OR_COPY, CaptureShapeEnv
from .shape_rules.functions import FAST_META, fast_result, from_memo, memo_entry, memo_key
from .shape_rules.pointwise import FAST_POINTWISE
from .shape_rules.views import FAST_METHODS
from .size_polyfills import size_polyfill
from .tracer import Tracer, _has_traced
from .values import TracedFunction, TracedMethod

if TYPE_CHECKING:
    from .frame import Frame

_TORCH_NAMESPACES = [torch, torch.nn.functional, torch.linalg, torch.fft, torch.special, torch.functional,
                     torch._C._nn, torch._C._VariableFunctions,
                     torch._C._linalg, torch._C._fft, torch._C._special,  # type: ignore[attr-defined]
                     torch.nn.init]


def _collect() -> dict[int, Any]:
    out: dict[int, Any] = {}
    for ns in _TORCH_NAMESPACES:
        for name in dir(ns):
            v = getattr(ns, name, None)
            if callable(v) and not isinstance(v, (type, types.ModuleType)):
                out[id(v)] = v
    return out


TORCH_FUNCTIONS = _collect()
# Functions with global side effects: never recorded, always a graph break. Every ``torch.set_*``
# (set_num_threads, set_autocast_enabled, set_default_device, set_rng_state...) is one: run once at
# capture, its effect was missing from every later call.
_SIDE_EFFECTS = {id(f) for f in (torch.manual_seed, torch.seed, torch.use_deterministic_algorithms,
                                 torch.set_printoptions, torch.random.set_rng_state)} | {
    i for i, f in TORCH_FUNCTIONS.items() if getattr(f, "__name__", "").startswith("set_")}
# Readers of global state no guard covers (guards cover grad mode, autocast, the default dtype and
# device, deterministic algorithms, TF32): run at capture, their value was a constant of the graph
# (``torch.get_num_threads()`` kept the capture's count after ``torch.set_num_threads``). They run in
# Python on every call instead.
_STATE_READS = {id(f) for f in (getattr(torch, n, None) for n in (
    "get_rng_state", "get_num_threads", "get_num_interop_threads", "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled", "is_warn_always_enabled", "is_deterministic_algorithms_warn_only_enabled",
    "get_deterministic_debug_mode", "is_autocast_cache_enabled", "get_float32_matmul_precision",
    "is_inference_mode_enabled")) if f is not None}
DATA_DEPENDENT_METHODS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                                    "__index__", "__len__", "__iter__", "__repr__", "__str__",
                                    "__format__", "backward", "register_hook", "data_ptr",
                                    "untyped_storage", "storage", "retain_grad", "cpu_numpy"})
META_METHODS = frozenset({"size", "dim", "stride", "numel", "nelement", "is_contiguous",
                          "element_size", "get_device", "is_floating_point", "is_complex",
                          "storage_offset", "ndimension", "has_names", "is_signed",
                          "is_set_to", "is_pinned", "is_shared"})


def is_torch_function(fn: Any) -> bool:
    if id(fn) in TORCH_FUNCTIONS:
        return True
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return functional_op(fn)
    objclass = getattr(fn, "__objclass__", None)
    return objclass in (torch._C.TensorBase, torch.Tensor)


def functional_op(fn: Any) -> bool:
    """A dispatcher op (``torch.ops.ns.name[.overload]``: ATen, or a library's ``torch.library``
    custom op) that writes none of its arguments and returns no alias of them: recorded as one node
    and run on fake tensors through its fake kernel, as torch.compile does. HF's MoE layers call
    ``torch.ops.transformers.grouped_mm_fallback`` on CPU. An op that mutates (or has several
    overloads to choose from at run time) is left to the ordinary path: a graph break."""
    if isinstance(fn, torch._ops.OpOverloadPacket):
        overloads = fn.overloads()
        if len(overloads) != 1:
            return False
        fn = getattr(fn, overloads[0])
    return is_pure_op(fn)


def call_torch(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    if id(fn) in _SIDE_EFFECTS:
        raise GraphBreak(f"torch.{getattr(fn, '__name__', fn)} changes global state")
    if id(fn) in _STATE_READS:
        raise GraphBreak(f"torch.{getattr(fn, '__name__', fn)}() reads global state no guard covers",
                         "it runs in Python on every call")
    if getattr(fn, "__name__", "") in _RNN_OPS and torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for a in args for t in (a if isinstance(a, (list, tuple)) else [a])):
        # their backward on the CPU (mkldnn's, with a workspace the joint trace does not keep) failed or
        # crashed; torch's compiler leaves RNNs to Python too (allow_rnn)
        raise GraphBreak(f"torch.{fn.__name__}() (nn.{_RNN_OPS[fn.__name__]}) with gradients is not compiled",
                         "it runs in Python between graphs; in inference (no_grad or eval without grads) it is compiled")
    if any(isinstance(a, (TracedFunction, TracedMethod)) for a in [*args, *kwargs.values()]):
        # run for real it would keep the trace's own function object (torch.vmap(lambda t: ...)
        # returned a wrapper that failed when called)
        raise GraphBreak(f"torch.{getattr(fn, '__name__', fn)}() given a function defined in compiled code",
                         "it runs in Python between graphs (torch.func transforms are not traced)")
    objclass = getattr(fn, "__objclass__", None)
    if objclass in (torch._C.TensorBase, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
        return tensor_method(frame, args[0], fn.__name__, list(args[1:]), kwargs)
    polyfill = size_polyfill(fn, args, kwargs)
    if polyfill is not None:  # a symbolic number the schema would specialise (size_polyfills.py)
        return frame.call(polyfill, list(args), dict(kwargs))
    tracer = frame.tracer
    traced_in = any(contains_traced(a) for a in args) or any(contains_traced(v) for v in kwargs.values())
    if not traced_in:
        try:
            with tracer.fake_mode:
                probe = fast_result(fn, tuple(args), kwargs)  # a shape rule (torch.arange), else run it
                if probe is None:
                    probe = fn(*args, **kwargs)
        except Exception as e:
            raise GraphBreak(f"torch.{getattr(fn, '__name__', fn)} failed at capture: {e}") from e
        if not _has_traced(probe):
            return probe
        # a factory (torch.arange, torch.zeros...): record the probe's result instead of running the
        # function on fake tensors a second time (each run of a fake constructor is 0.1-7 ms)
        return tracer.record("call_function", fn, tuple(args), dict(kwargs), lambda: probe)
    env = tracer.shape_env
    if id(fn) in FRESH_RESULT and isinstance(env, CaptureShapeEnv) and env.may_be_one:
        return env.fresh_result(lambda: _record_traced(tracer, fn, args, kwargs))
    if kwargs.get("out") is not None:
        _refuse_resizing_out(tracer, fn, args, kwargs)
    written = _multi_tensor_writes(fn)
    versions = [[version(t) for t in _tensors_of(args, kwargs, at)] for at in written]
    result = _record_traced(tracer, fn, args, kwargs)
    for at, before in zip(written, versions, strict=True):  # fake tensors do not count the writes of
        # foreach and fused in-place ops (torch._foreach_add_, torch._fused_adam_): counted here, as eager
        # counts them, so the capture knows which inputs the graph writes (aliasing.py)
        for t, before_t in zip(_tensors_of(args, kwargs, at), before, strict=True):
            if before_t is not None and t._version == before_t:
                torch.autograd.graph.increment_version(t)
    return result


def _refuse_resizing_out(tracer: Tracer, fn: Any, args: Sequence[Any], kwargs: dict) -> None:
    """A call whose ``out=`` tensors have other sizes than its result breaks the graph: eager resizes
    them, and a graph writes values into the memory an input has, not sizes (a resized input came back
    with its old sizes, its new values written past its end)."""
    outs = kwargs["out"] if isinstance(kwargs["out"], (tuple, list)) else (kwargs["out"],)
    try:
        with tracer.fake_mode:
            result = fn(*args, **{k: v for k, v in kwargs.items() if k != "out"})
    except Exception:  # noqa: BLE001 - the call itself is traced (and fails) as before
        return
    results = result if isinstance(result, (tuple, list)) else (result,)
    for o, r in zip(outs, results):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and tuple(o.shape) != tuple(r.shape):
            raise GraphBreak(f"torch.{getattr(fn, '__name__', fn)}(out=...) resizes its out tensor from "
                             f"{tuple(o.shape)} to {tuple(r.shape)}", "it runs in Python between graphs")


_MULTI_TENSOR_WRITES: dict[str, tuple[tuple[int, str], ...]] = {}


def _multi_tensor_writes(fn: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of the tensor-list arguments a foreach or fused in-place op writes (its schema's
    ``!`` annotations); () for any other function."""
    name = getattr(fn, "__name__", "")
    if not (name.startswith(("_foreach_", "_fused_")) and name.endswith("_")):
        return ()
    if name not in _MULTI_TENSOR_WRITES:
        packet = getattr(torch.ops.aten, name, None)
        found: dict[str, int] = {}
        for overload in packet.overloads() if packet is not None else ():
            for i, arg in enumerate(getattr(packet, overload)._schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    found.setdefault(arg.name, i)
        _MULTI_TENSOR_WRITES[name] = tuple((i, n) for n, i in found.items())
    return _MULTI_TENSOR_WRITES[name]


def _tensors_of(args: list, kwargs: dict, at: tuple[int, str]) -> list[torch.Tensor]:
    value = args[at[0]] if at[0] < len(args) else kwargs.get(at[1])
    items = value if isinstance(value, (list, tuple)) else [value]
    return [t for t in items if isinstance(t, torch.Tensor)]


def _record_traced(tracer: Tracer, fn: Any, args: list, kwargs: dict) -> Any:
    """A torch function over traced values, recorded as one node: its result from a shape rule, the
    capture's memo of an equal call, or the function itself on fake tensors."""
    rule = FAST_META.get(id(fn)) or FAST_POINTWISE.get(id(fn))
    if rule is not None:  # a shape rule instead of the function's meta kernel (None: no shortcut)
        def run() -> Any:
            fast = rule(tuple(args), kwargs)
            return fn(*args, **kwargs) if fast is None else fast
        return tracer.record("call_function", fn, tuple(args), dict(kwargs), run)
    key = memo_key(fn, tuple(args), kwargs)
    if key is not None:  # the same call seen before in this capture: its result's metadata again
        memo = tracer.fake_memo

        def run_memo() -> Any:
            entry = memo.get(key)
            out = from_memo(entry) if entry is not None else None
            if out is None:
                out = fn(*args, **kwargs)
                entry = memo_entry(out)
                if entry is not None:
                    memo[key] = entry
            return out
        return tracer.record("call_function", fn, tuple(args), dict(kwargs), run_memo)
    return tracer.record("call_function", fn, tuple(args), dict(kwargs), lambda: fn(*args, **kwargs))


_RNN_OPS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}
_INPLACE_VIEWS = frozenset({"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_", "squeeze_", "as_strided_"})
# methods ending in "_" that write no element
_NOT_WRITES = _INPLACE_VIEWS | {"requires_grad_", "share_memory_", "detach_", "rename_", "refine_names_"}


_TENSOR_VALUE_POLYFILLS = {"addcdiv": polyfills.add_quotient_, "addcdiv_": polyfills.add_quotient_,
                           "addcmul": polyfills.add_product_, "addcmul_": polyfills.add_product_}


def _tensor_value_polyfill(name: str, args: list, kwargs: dict) -> tuple[Any, list] | None:
    """addcdiv/addcmul given a tensor ``value``: (the polyfill, [tensor1, tensor2, value]), else None."""
    polyfill = _TENSOR_VALUE_POLYFILLS.get(name)
    if polyfill is None:
        return None
    operands = [*args, *(kwargs[k] for k in ("tensor1", "tensor2", "value") if k in kwargs)]
    if len(operands) != 3 or len(kwargs) > 3 or not isinstance(operands[2], torch.Tensor) or \
            any(k not in ("tensor1", "tensor2", "value") for k in kwargs):
        return None
    return polyfill, operands


def tensor_method(frame: Frame, t: torch.Tensor, name: str, args: list, kwargs: dict) -> Any:
    tracer = frame.tracer
    if name == "numpy" and not kwargs.get("force", False):
        return tensor_to_numpy(frame, t)
    if name in DATA_DEPENDENT_METHODS:
        raise GraphBreak(f"data-dependent operation Tensor.{name}()",
                         "move it out of the compiled region, or accept the graph break")
    if name == "set_":  # rebinds the tensor to another storage and shape: input write-back cannot model it
        raise GraphBreak("Tensor.set_() swaps the tensor's storage and metadata", "it runs in Python between graphs")
    if name in ("resize_", "resize_as_"):  # a caller's tensor resized in the graph came back unresized
        # (its new value could not be copied into the old shape: an error where eager ran)
        raise GraphBreak(f"Tensor.{name}() changes the tensor's shape and may reallocate its storage",
                         "it runs in Python between graphs")
    if name in _INPLACE_VIEWS and id(t) in tracer.input_source_of_fake:  # the caller's tensor changes
        # shape: graphs write back values, not sizes and strides (kiln.autograd refuses it)
        raise GraphBreak(f"Tensor.{name}() changes the sizes or strides of the tensor "
                         f"{tracer.input_source_of_fake[id(t)]} in place", "it runs in Python between graphs")
    if name.endswith("_") and name not in _NOT_WRITES and contains_traced(t):
        refuse_overlapping_write(t, (*args, *kwargs.values()), f"Tensor.{name}()")
    if name == "detach_" and id(t) in tracer.input_source_of_fake and t.requires_grad:  # the caller's tensor
        # stops requiring grad (the graph's copy did, the caller's kept its history)
        raise GraphBreak(f"Tensor.detach_() of the tensor {tracer.input_source_of_fake[id(t)]}",
                         "it runs in Python between graphs")
    tensor_value = _tensor_value_polyfill(name, args, kwargs)
    if tensor_value is not None:
        polyfill, operands = tensor_value
        return frame.call(polyfill, [t, *operands, name.endswith("_")], {})
    env = tracer.shape_env
    if name in VIEW_OR_COPY and not kwargs and isinstance(env, CaptureShapeEnv) and env.may_be_one:
        return env.view_or_copy(t, name, tuple(args), lambda: _traced_method(tracer, t, name, args, kwargs))
    return _traced_method(tracer, t, name, args, kwargs)


def _traced_method(tracer: Tracer, t: torch.Tensor, name: str, args: list, kwargs: dict) -> Any:
    method = getattr(t, name)
    if name in META_METHODS:
        with tracer.fake_mode:
            result = method(*args, **kwargs)
        if _has_traced(result):
            return tracer.record("call_method", name, (t, *args), kwargs, lambda: getattr(t, name)(*args, **kwargs),
                                 pure=True)
        return result
    rule = FAST_METHODS.get(name)
    if rule is not None:  # a view by its shape rule (None: the ordinary path)
        def run() -> Any:
            fast = rule(t, tuple(args), kwargs)
            return getattr(t, name)(*args, **kwargs) if fast is None else fast
        return tracer.record("call_method", name, (t, *args), dict(kwargs), run)
    return tracer.record("call_method", name, (t, *args), dict(kwargs),
                         lambda: getattr(t, name)(*args, **kwargs))


