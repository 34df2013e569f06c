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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

MB = 2**20


@dataclass(slots=True)
class StaticPeak:
    inputs: int  # bytes of the graph's inputs (weights and activations), live throughout
    peak: int  # most bytes of the graph's own buffers live at once
    at_peak: list[tuple[int, str, str]]  # (bytes, buffer, what wrote it)

    @property
    def total(self) -> int:
        return self.inputs + self.peak


def _layout_bytes(layout: Any) -> int:
    """Storage bytes of a layout: the extent its strides reach, times the element size."""
    shape = [int(s) for s in layout.shape]
    if any(s == 0 for s in shape):
        return 0
    extent = 1 + sum((s - 1) * int(st) for s, st in zip(shape, layout.stride))
    return (extent + int(layout.offset or 0)) * torch.empty((), dtype=layout.dtype).element_size()


def static_peak(scheduled: Any, program: Any) -> StaticPeak:
    """Walk ``scheduled.steps`` as the generated wrapper does: an allocation that reuses a dead
    buffer costs nothing, a buffer that will be reused stays live until then (the wrapper keeps it)."""
    from kiln.inductor.ir import ExternKernel, Kernel

    layouts = program.layouts()
    inputs = sum(_layout_bytes(layouts[b.name]) for b in program.inputs if b.name in layouts)
    reused = {a.reuse for st in scheduled.steps for a in st.allocate if a.reuse}
    live: dict[str, tuple[int, str]] = {}
    peak, at_peak = 0, []
    input_names = {b.name for b in program.inputs}
    for st in scheduled.steps:
        work = st.work
        for a in st.allocate:
            if a.reuse and a.reuse in live:
                live[a.buffer] = live.pop(a.reuse)
            elif not a.reuse:
                live[a.buffer] = (_layout_bytes(a.layout), getattr(work, "name", "?"))
        if isinstance(work, ExternKernel):
            for o in work.outputs:
                if o.buffer not in live and o.buffer not in input_names:
                    live[o.buffer] = (_layout_bytes(o.layout), f"{work.kind} {work.target}")
        elif not isinstance(work, Kernel):
            pass
        now = sum(n for n, _ in live.values())
        # (kiln_inductor.mm_padded keeps its workspace inside its own result: nothing to add)
        if now > peak:
            peak = now
            at_peak = sorted(((n, b, w) for b, (n, w) in live.items()), reverse=True)
        for b in st.free:
            if b not in reused:
                live.pop(b, None)
    return StaticPeak(inputs, peak, at_peak)


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
    graphs (each with ``scheduled`` and ``loop_program``)."""
    import kiln.inductor as KI
    from kiln import aot, capture
    from kiln.backends import _inductor
    from kiln.settings import CompileOptions

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
        sp = static_peak(cg.scheduled, cg.loop_program)
        print(f"  kiln (static)       peak {sp.total / MB:9.1f} MB  (graph inputs {sp.inputs / MB:8.1f}, "
              f"buffers {sp.peak / MB:8.1f})")
        for n, b, w in sp.at_peak[:top]:
            print(f"    {n / MB:9.2f} MB  {b:<10} {w}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_base_patch16_224,bert_base,gpt2")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--gpu-shapes", action="store_true", help="the GPU suite's batch and sizes")
    ap.add_argument("--gpu-attention", action="store_true",
                    help="attention picks the fused kernel an H200 would (flash / memory-efficient), not MATH")
    a = ap.parse_args(argv)
    simulate_cudnn()
    if a.gpu_attention:
        simulate_gpu_attention_choice()
    if a.gpu_shapes:  # fake tensors cost nothing; only capture runs on CPU at that size
        from benchmarks.kiln_bench import models
        models.SHAPES[("cpu", False)] = models.SHAPES[("cuda", False)]
    for name in a.models.split(","):
        probe_static_cuda(name, small=a.small, top=a.top)


if __name__ == "__main__":
    main()
