"""Shape rules: the fake result of a few common torch functions without running their meta kernel.

Why: capture runs every recorded call on fake tensors only to learn its result's metadata (shape,
strides, dtype, device, requires_grad). For ``batch_norm`` that means torch's Python decomposition
of ``native_batch_norm`` (~20 fake ops, and the fake-tensor cache misses for each new shape or
every training-mode call): about 45 % of a full ResNet-50's warm-start capture on CPU. Its output's
metadata is the input's, which is cheap to produce.

Each rule returns the fake result, or ``None`` to take the ordinary path (running the function on
fake tensors), which it does for anything it is not sure of: symbolic sizes, layouts other than
dense contiguous / channels-last, autocast, inference mode, mismatched parameter shapes (so that a
user error is still raised by torch, with torch's message). A test checks every rule against the
ordinary path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

FastRule = Callable[[tuple, dict], Any]


def _autocast_on() -> bool:
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                return True
        except TypeError:  # torch without the device argument (not the versions kiln supports)
            return True
    return False


def _static_dense(t: Any) -> bool:
    """A fake tensor with int sizes whose memory is dense in a standard format: every meta kernel
    and ``empty_like`` agree on its strides."""
    if type(t) is not FakeTensor or t.is_sparse or t.layout is not torch.strided:
        return False
    if any(not isinstance(s, int) for s in t.shape) or any(not isinstance(s, int) for s in t.stride()):
        return False
    if t.is_contiguous():
        return True
    if t.dim() == 4:
        return t.is_contiguous(memory_format=torch.channels_last)
    if t.dim() == 5:
        return t.is_contiguous(memory_format=torch.channels_last_3d)
    return False


def _needs_grad(differentiable: tuple[Any, ...]) -> bool:
    """Whether autograd would make the op's output require grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in differentiable)


def like_input(x: torch.Tensor, differentiable: tuple[Any, ...]) -> torch.Tensor:
    """A fresh fake tensor with ``x``'s (dense) metadata that requires grad (as a non-leaf) exactly when
    autograd would make the op's output require grad. Runs under the capture's fake mode."""
    if x.requires_grad and _needs_grad(differentiable):
        return x.clone()  # a non-leaf with x's strides (dense: preserve_format keeps them)
    # empty_like(x) for a dense x is empty_strided with x's strides; the fake empty_like runs a
    # Python decomposition (~1 ms a call for each new shape), empty_strided does not
    out = new_fake(x, tuple(x.shape), x.stride(), x.dtype)
    return out.requires_grad_().clone() if _needs_grad(differentiable) else out


_NO_DISPATCH = getattr(torch._C, "_DisableTorchDispatch", None)


def new_fake(x: Any, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh fake tensor in ``x``'s fake mode, on its device: a meta tensor wrapped as the fake
    mode wraps every op's output. Why: ``torch.empty_strided`` under the fake mode costs a fake
    dispatch (0.2-0.5 ms for each new shape: a cache miss running the meta kernel), this ~20 us."""
    mode = getattr(x, "fake_mode", None)
    converter = getattr(mode, "fake_tensor_converter", None)
    if _NO_DISPATCH is None or not hasattr(converter, "from_meta_and_device"):
        return torch.empty_strided(shape, stride, dtype=dtype, device=x.device)
    with _NO_DISPATCH():
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return cast(Any, converter).from_meta_and_device(mode, meta, x.device)


def contiguous_strides(sizes: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The strides ``torch.empty(sizes)`` gets."""
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(out[::-1])


def fresh_contiguous(shape: tuple[int, ...], x: torch.Tensor, differentiable: tuple[Any, ...]) -> torch.Tensor:
    """A new contiguous fake tensor of ``shape`` with ``x``'s dtype and device, requiring grad (as
    a non-leaf) exactly when autograd would make the op's output require grad."""
    out = new_fake(x, shape, contiguous_strides(shape), x.dtype)
    if _needs_grad(differentiable):
        out = out.requires_grad_().clone()
    return out


def _same_kind(x: Any, *others: Any) -> bool:
    """Every given tensor a fake tensor with int sizes, on x's device, with x's dtype."""
    for t in others:
        if t is None:
            continue
        if type(t) is not FakeTensor or t.dtype != x.dtype or t.device != x.device or \
                any(type(s) is not int for s in t.shape):
            return False
    return True


def _linear(args: tuple, kwargs: dict) -> Any:
    """F.linear: the result is contiguous (matmul folds, or copies, the input to 2-D) with shape
    ``input.shape[:-1] + (out_features,)``; on a channels-last permuted input torch's own fake
    run takes ~7 ms per call (ConvNeXt)."""
    bound = _bind(("input", "weight", "bias"), (None, None, None), 2, args, kwargs)
    if bound is None or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    x, w, b = bound
    if type(x) is not FakeTensor or x.dim() < 1 or not x.is_floating_point() or \
            any(type(s) is not int for s in x.shape) or not _same_kind(x, w, b):
        return None
    if w.dim() != 2 or w.shape[1] != x.shape[-1] or (b is not None and tuple(b.shape) != (w.shape[0],)):
        return None
    return fresh_contiguous((*x.shape[:-1], w.shape[0]), x, (x, w, b))


def _layer_norm(args: tuple, kwargs: dict) -> Any:
    """F.layer_norm: the result is contiguous with the input's shape, whatever its layout."""
    bound = _bind(("input", "normalized_shape", "weight", "bias", "eps"),
                  (None, None, None, None, 1e-5), 2, args, kwargs)
    if bound is None or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    x, normalized, w, b, eps = bound
    if type(x) is not FakeTensor or not x.is_floating_point() or type(eps) not in (int, float) or \
            any(type(s) is not int for s in x.shape) or not _same_kind(x, w, b):
        return None
    if isinstance(normalized, int):
        normalized = (normalized,)
    if type(normalized) not in (tuple, list, torch.Size) or not normalized or \
            any(type(n) is not int for n in normalized) or len(normalized) > x.dim() or \
            tuple(x.shape[x.dim() - len(normalized):]) != tuple(normalized):
        return None
    for p in (w, b):
        if p is not None and tuple(p.shape) != tuple(normalized):
            return None
    return fresh_contiguous(tuple(x.shape), x, (x, w, b))


def _batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
                training: Any, momentum: Any, eps: Any) -> Any:
    if not (_static_dense(x) and x.dim() >= 2 and x.is_floating_point()):
        return None
    if type(training) is not bool or type(eps) not in (int, float) or \
            (momentum is not None and type(momentum) not in (int, float)):
        return None
    if torch.is_inference_mode_enabled() or _autocast_on():
        return None
    channels = x.shape[1]
    for p in (running_mean, running_var, weight, bias):
        if p is None:
            continue
        if type(p) is not FakeTensor or tuple(p.shape) != (channels,) or p.device != x.device:
            return None  # torch raises the error (or knows the rule) on the ordinary path
    if (running_mean is None) != (running_var is None) or (not training and running_mean is None):
        return None
    if training:
        per_channel = x.shape[0]
        for s in x.shape[2:]:
            per_channel *= s
        if per_channel == 1 or eps <= 0:
            return None  # F.batch_norm raises its ValueError on the ordinary path
    elif eps < 0:
        return None
    return like_input(x, (x, weight, bias))


def _f_batch_norm(args: tuple, kwargs: dict) -> Any:
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    defaults = (None, None, None, None, None, False, 0.1, 1e-5)
    bound = _bind(names, defaults, 3, args, kwargs)
    return None if bound is None else _batch_norm(*bound)


def _torch_batch_norm(args: tuple, kwargs: dict) -> Any:
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
             "cudnn_enabled")
    bound = _bind(names, (None,) * 9, 9, args, kwargs)
    if bound is None:
        return None
    x, weight, bias, mean, var, training, momentum, eps, _ = bound
    return _batch_norm(x, mean, var, weight, bias, training, momentum, eps)


def _addmm(args: tuple, kwargs: dict) -> Any:
    """torch.addmm(input, mat1, mat2): a new contiguous (n, m) tensor (HF GPT-2's Conv1D); its fake
    run is a Python meta function, ~1-3 ms for each new shape."""
    if not kwargs.keys() <= {"beta", "alpha"} or any(type(v) not in (int, float) for v in kwargs.values()):
        return None
    if len(args) != 3 or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    bias, m1, m2 = args
    if type(m1) is not FakeTensor or not m1.is_floating_point() or not _same_kind(m1, bias, m2) or \
            bias is None or m1.dim() != 2 or m2.dim() != 2 or m1.shape[1] != m2.shape[0]:
        return None
    out = (m1.shape[0], m2.shape[1])
    try:
        if tuple(torch.broadcast_shapes(tuple(bias.shape), out)) != out:
            return None
    except RuntimeError:
        return None
    return fresh_contiguous(out, m1, (bias, m1, m2))


def _embedding(args: tuple, kwargs: dict) -> Any:
    """F.embedding: a new contiguous ``indices.shape + (dim,)`` tensor of the weight's dtype."""
    bound = _bind(("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"),
                  (None, None, None, None, 2.0, False, False), 2, args, kwargs)
    if bound is None or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    idx, w, padding_idx, max_norm, _, scale, sparse = bound
    if max_norm is not None or sparse is not False or type(scale) is not bool:
        return None  # max_norm renormalises the weight in place: the ordinary path
    if type(idx) is not FakeTensor or idx.dtype not in (torch.int64, torch.int32) or \
            type(w) is not FakeTensor or w.dim() != 2 or not w.is_floating_point() or \
            idx.device != w.device or any(type(s) is not int for s in (*idx.shape, *w.shape)):
        return None
    if padding_idx is not None and (type(padding_idx) is not int or not -w.shape[0] <= padding_idx < w.shape[0]):
        return None
    return fresh_contiguous((*idx.shape, w.shape[1]), w, (w,))


def _pair(v: Any) -> tuple[int, int] | None:
    if type(v) is int:
        return v, v
    if type(v) in (tuple, list) and len(v) == 2 and all(type(i) is int for i in v):
        return v[0], v[1]
    return None  # "same" / "valid" padding, or something torch reports


def _only_contiguous(t: Any) -> bool:
    """Contiguous and not also channels-last: no memory format for torch's conv to prefer."""
    return t.is_contiguous() and not t.is_contiguous(memory_format=torch.channels_last)


def _conv2d(args: tuple, kwargs: dict) -> Any:
    """F.conv2d on batched, unambiguously contiguous input and weight: a new contiguous
    ``(N, C_out, H_out, W_out)`` tensor. Why: each new shape runs torch's conv backend selection
    and meta kernel on fake tensors (~1-3 ms; most of a MobileNetV3 warm start's fake time).
    Channels-last or ambiguous layouts (a 1x1 spatial map, one channel), where torch picks the
    output's memory format by backend, take the ordinary path."""
    bound = _bind(("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                  (None, None, None, 1, 0, 1, 1), 2, args, kwargs)
    if bound is None or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    x, w, b, stride, padding, dilation, groups = bound
    if type(x) is not FakeTensor or x.dim() != 4 or not x.is_floating_point() or not _same_kind(x, w, b) or \
            type(w) is not FakeTensor or w.dim() != 4 or type(groups) is not int or groups < 1:
        return None
    if any(type(v) is not int for v in (*x.stride(), *w.stride())) or \
            not _only_contiguous(x) or not _only_contiguous(w):
        return None
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    if s is None or p is None or d is None or min(s) < 1 or min(p) < 0 or min(d) < 1:
        return None
    n, c_in, h, wd = x.shape
    c_out, c_per_group, kh, kw = w.shape
    if c_in != c_per_group * groups or c_out % groups or (b is not None and tuple(b.shape) != (c_out,)):
        return None
    h_out = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    w_out = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    # each size against 1 (not min() of them: comparing a symbolic batch with the channel count guards
    # on it, narrowing the sizes a dynamic capture serves)
    if any(v < 1 for v in (n, c_out, h_out, w_out)):
        return None
    return fresh_contiguous((n, c_out, h_out, w_out), x, (x, w, b))


_ARANGE_DTYPES = frozenset({torch.int64, torch.int32, torch.float32, torch.float64})
_ARANGE_KWARGS = frozenset({"dtype", "device", "requires_grad", "layout", "pin_memory"})


def _arange(args: tuple, kwargs: dict) -> Any:
    """torch.arange with Python int bounds: a new contiguous 1-D tensor of ``len(range(...))``
    elements. Why: on CUDA fake tensors torch (2.11) runs arange's Python decomposition, several ms
    a call in a GPT-2 warm start (position ids, attention masks). Anything else -- symbolic bounds,
    floats, keywords for the bounds, other dtypes, requires_grad, step 0 -- takes the ordinary path."""
    if not 1 <= len(args) <= 3 or any(type(a) is not int for a in args) or not kwargs.keys() <= _ARANGE_KWARGS:
        return None
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if (dtype is not None and dtype not in _ARANGE_DTYPES) or kwargs.get("requires_grad") or \
            kwargs.get("pin_memory") or kwargs.get("layout") not in (None, torch.strided) or \
            (device is not None and type(device) not in (str, torch.device)):
        return None
    if torch.is_inference_mode_enabled():
        return None
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    if step == 0:
        return None  # torch raises its error on the ordinary path
    return torch.empty((len(range(start, end, step)),), dtype=dtype or torch.int64, device=device)


def _bind(names: tuple[str, ...], defaults: tuple, required: int, args: tuple,
          kwargs: dict) -> list | None:
    """Arguments by position, or None when the call does not bind plainly (torch then reports it)."""
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    out = list(args) + [kwargs.get(n, d) for n, d in zip(names[len(args):], defaults[len(args):])]
    if any(n in kwargs for n in names[:len(args)]):
        return None
    if len(args) + sum(n in kwargs for n in names[len(args):required]) < required:
        return None
    return out


# id(torch function) -> its rule. One family per module would be the rule (STYLE.md) once this
# grows past normalisation layers.
FAST_META: dict[int, FastRule] = {
    id(F.batch_norm): _f_batch_norm,
    id(torch.batch_norm): _torch_batch_norm,
    id(F.linear): _linear,
    id(F.layer_norm): _layer_norm,
    id(torch.arange): _arange,
    id(torch.addmm): _addmm,
    id(F.embedding): _embedding,
    id(torch.conv2d): _conv2d,  # F.conv2d is the same builtin
}


# ---- memoized results ------------------------------------------------------------------------------
# Functional torch functions whose result is a fresh tensor with metadata fixed by the inputs'
# metadata and the constant arguments. Why: a transformer runs the same linear / layer_norm / attention
# on the same shapes in every layer; on fake tensors each call still costs 0.3-0.4 ms (cache hits
# inside torch's fake mode, for the view/mm/view they decompose into) or several ms (misses).
MEMO_FUNCTIONS: frozenset[int] = frozenset(id(f) for f in (
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.layer_norm, F.gelu, torch.conv2d, torch.layer_norm,
    torch.addmm, torch.mm, torch.bmm))  # addmm: HF GPT-2's Conv1D
# Not attention: its result's strides depend on the kernel torch picks, which an sdpa_kernel block
# inside the model can change between two calls with the same arguments.

MemoKey = tuple
MemoEntry = tuple  # (shape, stride, dtype, device, requires_grad) of the result


def _arg_key(a: Any) -> Any:
    """A hashable description of one argument, or ``_NO`` when it cannot be described soundly."""
    t = type(a)
    if t is FakeTensor:
        shape, stride = tuple(a.shape), a.stride()
        if not all(type(s) is int for s in shape) or not all(type(s) is int for s in stride):
            return _NO
        return ("T", shape, stride, a.dtype, a.device, a.requires_grad, a.storage_offset())
    if t in (int, float, bool, str, type(None)):
        return (t, a)
    if t in (tuple, list):
        items = tuple(_arg_key(x) for x in a)
        return _NO if _NO in items else (t, items)
    return _NO


_NO = object()


def memo_key(fn: Any, args: tuple, kwargs: dict) -> MemoKey | None:
    """The key of a memoizable call, or None (not in MEMO_FUNCTIONS, symbolic sizes, a value the
    key cannot describe, inference mode or autocast)."""
    if id(fn) not in MEMO_FUNCTIONS or torch.is_inference_mode_enabled() or _autocast_on():
        return None
    key: list[Hashable] = [id(fn), torch.is_grad_enabled()]
    for a in args:
        k = _arg_key(a)
        if k is _NO:
            return None
        key.append(k)
    for name in sorted(kwargs):
        k = _arg_key(kwargs[name])
        if k is _NO:
            return None
        key.append((name, k))
    return tuple(key)


def memo_entry(result: Any) -> MemoEntry | None:
    if type(result) is not FakeTensor or result.storage_offset() != 0:
        return None
    shape, stride = tuple(result.shape), result.stride()
    if not all(type(s) is int for s in shape) or not all(type(s) is int for s in stride):
        return None
    return (shape, stride, result.dtype, result.device, result.requires_grad)


def from_memo(entry: MemoEntry) -> Any:
    """A fresh fake tensor with the memoized metadata (under the capture's fake mode), or None."""
    shape, stride, dtype, device, requires_grad = entry
    out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if requires_grad:
        out = out.requires_grad_().clone()  # a non-leaf, as the function's own result is
        if out.stride() != stride:
            return None
    return out


def fast_result(fn: Any, args: tuple, kwargs: dict) -> Any:
    """The fake result of ``fn(*args, **kwargs)`` by its shape rule, or None (no rule applies).
    Called under the capture's fake mode."""
    rule = FAST_META.get(id(fn))
    return None if rule is None else rule(args, kwargs)
