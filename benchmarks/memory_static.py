"""Static peak memory of kiln's CUDA path, estimated on a CPU host (no GPU needed).

The model is captured on CPU, then kiln's ``inductor`` backend compiles the captured graph for fake
CUDA bf16 inputs (the GPU path: padded matmuls, fused attention, channels-last). The estimate walks
each compiled graph's schedule (``compiled.scheduled``) as the wrapper runs it: buffers a step
allocates (or an extern returns) are live from that step until the step that frees them; inputs are
live throughout. Eager's reference is the same model run op by op on fake CUDA tensors under
``memory_probe.LiveBytes`` (bytes of live storages, as ``torch.cuda.max_memory_allocated``).

    python benchmarks/memory_static.py --models gpt2 --small
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

MB = 2**20


def static_peak(scheduled: Any, program: Any = None) -> Any:
    """``kiln.inductor.planned_peak`` of one compiled schedule (inputs live throughout)."""
    from kiln.inductor import planned_peak
    return planned_peak(scheduled)


def _h200_attention(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: Any = None, enable_gqa: bool = False) -> Any:
    """The fused kernel an H200 runs for 16-bit 4-D attention (flash without a mask, memory-efficient
    with one), as the ATen op; None where it would run MATH."""
    aten, mask = torch.ops.aten, attn_mask
    if q.dtype not in (torch.float16, torch.bfloat16) or q.dim() != 4 or q.shape[-1] > 256 or dropout_p or enable_gqa:
        return None
    if mask is None:
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[0]
    if mask.dtype == torch.bool:
        mask = aten.masked_fill.Scalar(aten.zeros.default(list(mask.shape), dtype=q.dtype, device=q.device),
                                       aten.logical_not(mask), float("-inf"))
    if mask.dtype != q.dtype or mask.shape[-1] % 16:
        return None
    mask = aten.expand(mask, [q.shape[0], q.shape[1], q.shape[2], k.shape[2]])
    return aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, 0.0, is_causal, scale=scale)[0]


class _H200Attention(torch.overrides.TorchFunctionMode):
    """Eager on fake CUDA tensors, with the attention kernel choice of a GPU (this host has none)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from kiln.autograd.attention import SDPA_TARGETS
        if func in SDPA_TARGETS:
            out = _h200_attention(*args, **(kwargs or {}))
            if out is not None:
                return out
        return func(*args, **(kwargs or {}))


GPU_ATTENTION = False
_REAL_SELECT_CONV_BACKEND = torch._C._select_conv_backend


def _cudnn_conv_backend(input: Any, weight: Any, *args: Any, **kwargs: Any) -> Any:
    """Fake CUDA tensors on a host without a GPU make fake-tensor propagation pick ``Slow2d`` (or the
    depthwise kernel) for a convolution, whose output is NCHW; an H200 runs cuDNN, whose output follows
    a channels-last input or weight. The stride matters: the compiled program copies an extern output
    whose stride differs from the trace's, so the estimate must trace what the GPU returns."""
    backend = _REAL_SELECT_CONV_BACKEND(input, weight, *args, **kwargs)
    if input.device.type == "cuda" and input.dim() == 4:
        return torch._C._ConvBackend.Cudnn
    return backend


def simulate_cudnn() -> None:
    """Fake-tensor convolutions on CUDA take cuDNN's memory format (see ``_cudnn_conv_backend``)."""
    torch._C._select_conv_backend = _cudnn_conv_backend


def simulate_gpu_attention_choice() -> None:
    """On a host without a GPU, fake CUDA tensors make ``scaled_dot_product_attention`` pick MATH (the
    fp32 bmm-softmax-bmm decomposition); an H200 picks flash or memory-efficient attention. Eager runs
    under ``_H200Attention``; kiln's tracer (kiln.autograd.joint.fused_attention) gets the same choice."""
    global GPU_ATTENTION
    import kiln.autograd.joint as joint

    def fused(args: tuple, kwargs: dict) -> Any:
        return _h200_attention(*args, **kwargs)
    joint.fused_attention = fused
    GPU_ATTENTION = True


def _fake_cuda(t: Any, mode: FakeTensorMode, dtype: torch.dtype) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    dt = dtype if t.is_floating_point() else t.dtype
    with mode:
        return torch.empty_strided(t.shape, t.stride(), dtype=dt, device="cuda")


def _retarget_devices(gm: torch.fx.GraphModule) -> None:
    """Factory calls captured on CPU (``arange(..., device=x.device)``) create CUDA tensors instead."""
    def cuda(v: Any) -> Any:
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device("cuda")
        return "cuda" if v == "cpu" else v
    for n in gm.graph.nodes:
        if "device" in n.kwargs:
            n.kwargs = {**n.kwargs, "device": cuda(n.kwargs["device"])}
        if any(isinstance(a, torch.device) for a in n.args):
            n.args = tuple(cuda(a) for a in n.args)
    gm.recompile()


def cross_compile(case: Any, dtype: torch.dtype = torch.bfloat16) -> list[Any]:
    """kiln's inductor backend on ``case``'s captured graph for fake CUDA inputs; the compiled
    graphs (each with ``scheduled`` and ``loop_program``). The model and its inputs are cast to ``dtype``
    before capture (in place), as the GPU suite runs them: a model that branches on its weights' dtype (T5's
    norm casting back to half precision) is captured as it runs there."""
    import kiln.inductor as KI
    from benchmarks.kiln_bench.models import cast_inputs
    from kiln import aot, capture
    from kiln.backends import _inductor
    from kiln.settings import CompileOptions

    case.model.to(dtype)
    cast_inputs(case, dtype)
    mod = case.model
    fn = type(mod).forward
    args, kwargs = (mod, *case.args), dict(case.kwargs)
    captured = capture.capture_graph(fn, args, kwargs)
    _retarget_devices(captured.gm)
    frame = aot._frame(fn, args, kwargs)
    inputs = aot._example_inputs(captured.input_sources, dict(frame.locals), dict(frame.globals))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [_fake_cuda(t, mode, dtype) for t in inputs]
    compiled: list[Any] = []
    real = KI.compile_graph

    def keep(*a: Any, **k: Any) -> Any:
        cg = real(*a, **k)
        compiled.append(cg)
        return cg
    KI.compile_graph = keep
    try:
        with torch.no_grad():
            _inductor(CompileOptions())(captured.gm, fakes)
    finally:
        KI.compile_graph = real
    return compiled


def eager_fake_cuda_peak(case: Any, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, list]:
    """(bytes before the step, step peak, live buffers at the peak) of eager on fake CUDA tensors."""
    from benchmarks.memory_probe import LiveBytes, _storage_key
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    model = case.model
    fake_model = _to_fake(model, mode, dtype)
    args = [_fake_cuda(a, mode, dtype) for a in case.args]
    kwargs = {k: _fake_cuda(v, mode, dtype) for k, v in case.kwargs.items()}
    held = [t for t in [*fake_model.parameters(), *fake_model.buffers(), *args, *kwargs.values()]
            if isinstance(t, torch.Tensor)]
    storages = {_storage_key(t): t.untyped_storage().nbytes() for t in held}
    before = sum(storages.values())
    # views of weights (W.t() for a linear) are not new memory
    probe = LiveBytes(keep_snapshots=True, fake_ok=True, known=set(storages))
    attention = _H200Attention() if GPU_ATTENTION else contextlib.nullcontext()
    with mode, probe, torch.no_grad(), attention:
        out = fake_model(*args, **kwargs)
        del out
    return before, probe.peak, sorted(probe.at_peak, key=lambda e: -e.nbytes)


def _to_fake(model: torch.nn.Module, mode: FakeTensorMode, dtype: torch.dtype) -> torch.nn.Module:
    import copy
    m = copy.deepcopy(model)
    memo: dict[int, torch.nn.Parameter] = {}  # tied weights stay tied
    for mod in m.modules():
        for k, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in memo:
                    memo[id(p)] = torch.nn.Parameter(_fake_cuda(p, mode, dtype), requires_grad=False)
                mod._parameters[k] = memo[id(p)]
        for k, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[k] = _fake_cuda(b, mode, dtype)
    return m


def probe_static_cuda(name: str, *, small: bool, top: int) -> None:
    from benchmarks.kiln_bench.models import build_for_mode
    case = build_for_mode(name, small=small, device=torch.device("cpu"), training=False)
    shape = "small" if small else "CPU"
    print(f"## {name}: CUDA bf16 path, static estimate ({shape} batch {case.shape.batch} x {case.shape.size})")
    try:
        base, step, at_peak = eager_fake_cuda_peak(case)
        print(f"  eager (fake CUDA)   peak {(base + step) / MB:9.1f} MB  (weights+inputs {base / MB:8.1f}, "
              f"step {step / MB:8.1f})")
        for e in at_peak[:top]:
            print(f"    {e.nbytes / MB:9.2f} MB  {str(tuple(e.shape)):<24} {str(e.dtype)[6:]:<9} {e.origin}")
    except Exception as exc:  # noqa: BLE001
        print(f"  eager (fake CUDA): failed: {type(exc).__name__}: {str(exc)[:300]}")
    graphs = cross_compile(case)
    for cg in graphs:
        sp = static_peak(cg.scheduled)
        print(f"  kiln (static)       peak {(sp.inputs + sp.peak) / MB:9.1f} MB  (graph inputs {sp.inputs / MB:8.1f}, "
              f"buffers {sp.peak / MB:8.1f})")
        for n, b, w in sp.at_peak[:top]:
            print(f"    {n / MB:9.2f} MB  {b:<10} {w}")


# ---- training: forward + loss + backward under AMP (bf16 autocast), as the GPU suite runs it --------

_CUDA_FP32_OPS = ("layer_norm", "group_norm", "softmax", "log_softmax", "logsumexp", "cumsum", "cross_entropy",
                  "nll_loss", "mse_loss")


class CudaAmpPolicy(torch.overrides.TorchFunctionMode):
    """CPU autocast with CUDA autocast's float32 list: the training estimate traces on CPU (the autograd
    engine needs a real device for CUDA tensors, fake or not), where autocast leaves LayerNorm and
    softmax in bf16; CUDA autocast runs them in float32 (their outputs are fp32, as is what they save)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in _CUDA_FP32_OPS or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)

        def up(x: Any) -> Any:
            return x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16) else x
        with torch.autocast("cpu", enabled=False):
            return func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})


def _fake_cpu(t: Any, mode: FakeTensorMode, requires_grad: bool = False) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    with mode:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return torch.nn.Parameter(out, requires_grad=True) if requires_grad else out


def eager_training_peak(case: Any) -> tuple[int, int, list]:
    """(bytes before the step, step peak, live at the peak) of eager forward + loss + backward (AMP
    bf16), on fake tensors (CPU device: see ``CudaAmpPolicy``); gradients start as None."""
    import copy

    from benchmarks.memory_probe import LiveBytes, _storage_key
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    model = copy.deepcopy(case.model)
    for mod in model.modules():
        for k, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[k] = _fake_cpu(p, mode, requires_grad=p.requires_grad)
        for k, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[k] = _fake_cpu(b, mode)
    args = [_fake_cpu(a, mode) for a in case.args]
    kwargs = {k: _fake_cpu(v, mode) for k, v in case.kwargs.items()}
    targets = _fake_cpu(case.targets, mode)
    held = [t for t in [*model.parameters(), *model.buffers(), *args, *kwargs.values(), targets]
            if isinstance(t, torch.Tensor)]
    storages = {_storage_key(t): t.untyped_storage().nbytes() for t in held}
    probe = LiveBytes(keep_snapshots=True, fake_ok=True, known=set(storages))
    attention = _H200Attention() if GPU_ATTENTION else contextlib.nullcontext()
    with mode, probe, attention, torch.autocast("cpu", dtype=torch.bfloat16), CudaAmpPolicy():
        out = model(*args, **kwargs)
        loss = case.loss_fn(out, targets)
        del out
        loss.backward()
    return sum(storages.values()), probe.peak, sorted(probe.at_peak, key=lambda e: -e.nbytes)


def _cuda_compiler(compiled: list[Any]) -> Any:
    """A compiler for kiln.autograd's halves: the graph (traced on CPU) is compiled for fake CUDA
    tensors of the traced shapes, strides and dtypes."""
    from kiln.inductor import InductorOptions, compile_graph

    def compile_for_cuda(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [_fake_cuda(v, mode, v.dtype) if isinstance(v, torch.Tensor) else v for v in example_inputs]
        for n in gm.graph.nodes:  # re-propagated on the CUDA inputs by compile_graph
            n.meta.pop("val", None)
        _retarget_devices(gm)
        cg = compile_graph(gm, fakes, options=InductorOptions())
        compiled.append(cg)
        return cg
    return compile_for_cuda


def cross_compile_training(case: Any) -> tuple[Any, list[Any]]:
    """kiln.autograd + kiln.inductor on ``case``'s captured graph: the joint graph traced on CPU under
    AMP (``CudaAmpPolicy``), each half compiled for fake CUDA tensors. (partition, [forward, backward])."""
    from kiln import aot as kaot
    from kiln import capture
    from kiln.autograd import aot
    from kiln.inductor import inductor_decompositions

    mod = case.model
    fn = type(mod).forward
    args, kwargs = (mod, *case.args), dict(case.kwargs)
    captured = capture.capture_graph(fn, args, kwargs)
    frame = kaot._frame(fn, args, kwargs)
    inputs = kaot._example_inputs(captured.input_sources, dict(frame.locals), dict(frame.globals))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [_fake_cpu(t, mode, requires_grad=isinstance(t, torch.Tensor) and t.requires_grad) for t in inputs]
    compiled: list[Any] = []
    compiler = _cuda_compiler(compiled)
    with torch.autocast("cpu", dtype=torch.bfloat16), CudaAmpPolicy():
        result = aot(captured.gm, fakes, fw_compiler=compiler, bw_compiler=compiler,
                     decompositions=inductor_decompositions())
    return result.aot.partitioned, compiled


def training_static_peak(parts: Any, fw: Any, bw: Any) -> dict[str, Any]:
    """Peak of a training step from the two schedules: the forward with its inputs (weights, batch);
    then the weights, the saved activations (dropped by the backward after their last use) and the
    backward's buffers (gradients included; they stay as ``.grad``)."""
    from kiln.inductor import planned_peak
    from kiln.inductor.ir import TensorRef

    fwp, bwp = fw.loop_program, bw.loop_program
    fw_inputs = {b.name for b in fwp.inputs}
    saved_refs = fwp.outputs[len(fwp.outputs) - parts.n_saved:]
    bw_saved = sorted(bwp.inputs, key=lambda b: b.position)
    # saved tensors that are (views of) the forward's inputs: parameters, held by the module anyway
    shared = frozenset(b.name for b, r in zip(bw_saved, saved_refs)
                       if b.position < parts.n_saved and isinstance(r, TensorRef) and r.buffer in fw_inputs)
    f = planned_peak(fw.scheduled)
    b = planned_peak(bw.scheduled, owned_inputs=True, shared_inputs=shared)
    held = planned_peak(bw.scheduled, owned_inputs=False, shared_inputs=shared)
    fw_total = f.peak_with_inputs
    bw_total = f.inputs + b.peak_with_inputs
    return {"forward": fw_total, "backward": bw_total, "backward_saved_held": f.inputs + held.peak_with_inputs, "total": max(fw_total, bw_total), "weights_inputs": f.inputs,
            "saved": b.inputs, "fw_at_peak": f.at_peak, "bw_at_peak": b.at_peak}


def probe_static_training(name: str, *, small: bool, top: int) -> None:
    from benchmarks.kiln_bench.models import build_for_mode
    case = build_for_mode(name, small=small, device=torch.device("cpu"), training=True)
    print(f"## {name}: training step (AMP bf16), CUDA path, static estimate (batch {case.shape.batch} x "
          f"{case.shape.size})")
    base, step, at_peak = eager_training_peak(case)
    print(f"  eager (fake)        peak {(base + step) / MB:9.1f} MB  (weights+inputs {base / MB:8.1f}, "
          f"step {step / MB:8.1f})")
    for e in at_peak[:top]:
        print(f"    {e.nbytes / MB:9.2f} MB  {str(tuple(e.shape)):<24} {str(e.dtype)[6:]:<9} {e.origin}")
    parts, graphs = cross_compile_training(case)
    if len(graphs) != 2:
        print(f"  kiln: {len(graphs)} compiled graphs (expected forward + backward)")
        return
    est = training_static_peak(parts, *graphs)
    print(f"  kiln (static)       peak {est['total'] / MB:9.1f} MB  (forward {est['forward'] / MB:8.1f}, backward "
          f"{est['backward'] / MB:8.1f}; weights+inputs {est['weights_inputs'] / MB:8.1f}, saved "
          f"{est['saved'] / MB:8.1f}, {parts.n_saved} tensors)  kiln / eager {est['total'] / (base + step):.3f}")
    print(f"  (backward if the saved tensors were held to its end: {est['backward_saved_held'] / MB:9.1f} MB)")
    for label, rows in (("forward", est["fw_at_peak"]), ("backward", est["bw_at_peak"])):
        print(f"    at the {label} peak:")
        for n, b, w in rows[:top]:
            print(f"    {n / MB:9.2f} MB  {b:<10} {w}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_base_patch16_224,bert_base,gpt2")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--gpu-shapes", action="store_true", help="the GPU suite's batch and sizes")
    ap.add_argument("--gpu-attention", action="store_true",
                    help="attention picks the fused kernel an H200 would (flash / memory-efficient), not MATH")
    ap.add_argument("--training", action="store_true", help="forward + loss + backward under AMP bf16")
    a = ap.parse_args(argv)
    simulate_cudnn()
    if a.gpu_attention:
        simulate_gpu_attention_choice()
    if a.gpu_shapes:  # fake tensors cost nothing; only capture runs on CPU at that size
        from benchmarks.kiln_bench import models
        models.SHAPES[("cpu", False)] = models.SHAPES[("cuda", False)]
        models.SHAPES[("cpu", True)] = models.SHAPES[("cuda", True)]
    for name in a.models.split(","):
        if a.training:
            probe_static_training(name, small=a.small, top=a.top)
        else:
            probe_static_cuda(name, small=a.small, top=a.top)


if __name__ == "__main__":
    main()
