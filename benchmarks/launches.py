"""Every launch of a compiled step, in order, for the GPU path compiled on a host without a GPU.

    uv run python -m benchmarks.launches --models gpt2,llama_350m --modes inference,training \
        [--small] [--cpu-shapes] [--out DIR] [--list]

The model is captured on the CPU and its graphs compiled for CUDA with fake inputs (as
``benchmarks.compile_time --cross-cuda`` does; training: joint trace on the CPU under CPU autocast,
forward and backward compiled for CUDA). No Triton kernel is compiled or run: this reads the
scheduled program each graph's wrapper runs. Each launch is one of

- ``triton``: a generated kernel (what it fuses, from its nodes); ``copy`` when every value it stores
  is a load of one buffer (a pure layout change: ``.contiguous()``, a materialised transpose, a
  ``clone``, a ``cat`` piece) and ``cast copy`` when the load is only converted;
- ``extern``: a library call (cuBLAS mm/bmm/addmm, attention, convolution) with its operands' strides;
- ``fallback``: an ATen op kiln does not lower.

Prints per graph the launch list (``--list``) and a summary per model: launches, Triton kernels,
copies (elements moved), externs, fallbacks. ``--out DIR`` writes ``launches-<model>-<mode>.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("KILN_GRAPH_CACHE", "0")  # a cache hit compiles nothing: nothing to list

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


@dataclass(frozen=True, slots=True)
class Launch:
    kind: str  # "triton" | "copy" | "cast copy" | "extern" | "fallback"
    name: str
    what: str
    elements: int  # elements written (copies), 0 when unknown / symbolic


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        try:
            n *= int(s)
        except TypeError:
            return 0
    return n


def classify_kernel(k: Any, layouts: dict[str, Any]) -> Launch:
    """A Triton kernel's launch: a copy when each stored value is a (converted) load of a buffer."""
    from kiln.inductor.ir import Cast, Load

    stored = [n for n in k.nodes if n.store]
    kinds = set()
    for n in stored:
        body = n.body
        if n.kind != "pointwise" or n.role != "full" and k.inner:
            kinds.add("compute")
        elif isinstance(body, Load) and not body.indirect:
            kinds.add("copy")
        elif isinstance(body, Cast) and isinstance(body.x, Load) and not body.x.indirect:
            kinds.add("cast copy")
        else:
            kinds.add("compute")
    elements = sum(_numel(layouts[o].shape) for o in k.outputs if o in layouts)
    if kinds and kinds <= {"copy"}:
        kind = "copy"
    elif kinds and kinds <= {"copy", "cast copy"}:
        kind = "cast copy"
    else:
        kind = "triton"
    src = ", ".join(k.inputs)
    dst = ", ".join(f"{o}{_layout_text(layouts.get(o))}" for o in k.outputs)
    return Launch(kind, k.name, f"reads ({src}) writes ({dst})", elements)


def _layout_text(layout: Any) -> str:
    if layout is None:
        return ""
    return f"[{','.join(map(str, layout.shape))}]({','.join(map(str, layout.stride))})"


def _arg_text(a: Any) -> str:
    from kiln.inductor.ir import ListArg, TensorRef

    if isinstance(a, TensorRef):
        off = f"+{a.offset}" if a.offset != 0 else ""
        return f"{a.buffer}[{','.join(map(str, a.shape))}]({','.join(map(str, a.stride))}){off}"
    if isinstance(a, ListArg):
        return "[" + ", ".join(_arg_text(x) for x in a.items) + "]"
    return repr(getattr(a, "value", a))


def classify_extern(e: Any) -> list[Launch]:
    """An extern's launches: one, except kiln's own ``mm_padded`` (a product and a copy per chunk)."""
    args = ", ".join(_arg_text(a) for a in e.args if not (hasattr(a, "value") and a.value is None))
    if e.target != "kiln_inductor.mm_padded.default":
        return [Launch(e.kind, e.target, args, 0)]
    a, b, m, block = e.args[1], e.args[2], e.args[3].value, e.args[4].value
    n, align = int(b.shape[1]), max(1, 16 // a.dtype.itemsize)
    out: list[Launch] = []
    try:
        from kiln.inductor.graph_passes.pad_matmuls import mm_padded_plan
    except ImportError:  # kiln before 2026-11-22 14:30: blocks of ``block`` columns, a strided copy each
        bw = min(block, n - n % align)
        head = (m - -(-m * bw // (n + bw))) // align * align if bw > 0 else 0
        for c in range(-(-n // bw) if head > 0 else 0):
            out.append(Launch("extern", "aten.mm (mm_padded)", f"rows 0:{head}, column block {c}", 0))
            out.append(Launch("aten copy", "copy_ (mm_padded)", f"column block {c} into place", head * bw))
        if head < m:
            out.append(Launch("extern", "aten.mm (mm_padded)", f"rows {head}:{m} unaligned", 0))
        return out
    for r, h, start in mm_padded_plan(m, n, align, block):
        tail = " unaligned" if start < 0 and n % align else ""
        out.append(Launch("extern", "aten.mm (mm_padded)", f"rows {r}:{r + h}{tail}", 0))
        if start >= 0:
            out.append(Launch("aten copy", "copy_ (mm_padded)", f"rows {r}:{r + h} into place", h * n))
    return out


def classify_group(g: Any, layouts: dict[str, Any]) -> Launch:
    """A kernel group (independent kernels launched as one): a ``triton`` launch naming its parts."""
    parts = [classify_kernel(k, layouts) for k in g.parts]
    what = "; ".join(f"{p.name} {p.what}" for p in parts)
    return Launch("triton", g.name, f"group of {len(parts)}: {what}", sum(p.elements for p in parts))


def launches_of(compiled: Any) -> list[Launch]:
    from kiln.inductor.codegen.triton.backend import PrebuiltKernel
    from kiln.inductor.ir import Kernel, KernelGroup

    sched = compiled.scheduled
    layouts = sched.program.layouts()
    out = []
    for step in sched.steps:
        w = step.work
        if isinstance(w, KernelGroup):
            out.append(classify_group(w, layouts))
        elif isinstance(w, Kernel):
            # a template bringing several kernels (split-KV decode attention: the splits, then their sum)
            # launches each of them
            n = len(w.triton_kernels()) if isinstance(w, PrebuiltKernel) else 1
            out += [classify_kernel(w, layouts)] * n
        else:
            out += classify_extern(w)
    return out


def summary(launches: list[Launch]) -> dict[str, int]:
    copies = [x for x in launches if x.kind in ("copy", "cast copy", "aten copy")]
    return {"launches": len(launches), "triton": sum(x.kind in ("triton", "copy", "cast copy") for x in launches),
            "copies": sum(x.kind == "copy" for x in launches),
            "cast_copies": sum(x.kind == "cast copy" for x in launches),
            "aten_copies": sum(x.kind == "aten copy" for x in launches),
            "copy_elements": sum(x.elements for x in copies),
            "externs": sum(x.kind == "extern" for x in launches),  # library launches (mm_padded's products each)
            "fallbacks": sum(x.kind == "fallback" for x in launches)}


@contextlib.contextmanager
def gpu_attention(backend: str) -> Any:
    """kiln.autograd traces the fused attention kernel eager runs on the GPU (attention.py asks a real
    device which one); here there is none, so ``backend`` says which (``efficient``: what the H200 picks
    for the suite's masked bf16 attention, ``flash`` without a mask). ``math``: leave it as it is."""
    if backend == "math":
        yield
        return
    from torch.nn.attention import SDPBackend

    from kiln.autograd import attention as A
    from kiln.autograd import joint as J

    wanted = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    fused, available = A.fused_attention, torch.cuda.is_available

    def choice(a: dict[str, Any], dense_mask: bool = False) -> int:
        mask = a["attn_mask"]
        if mask is None:
            return int(SDPBackend.FLASH_ATTENTION if backend == "efficient" else wanted)
        if not dense_mask and any(st == 0 for st, n in zip(mask.stride(), mask.shape) if n > 1):
            return int(SDPBackend.MATH)  # an expanded (stride-0) mask: no fused kernel takes it (BERT's)
        return int(SDPBackend.EFFICIENT_ATTENTION if wanted == SDPBackend.FLASH_ATTENTION else wanted)

    def fused_attention(args: Any, kwargs: Any) -> Any:
        a = A._bind(args, kwargs)
        q = a["query"] if a is not None else None
        if (a is not None and a["attn_mask"] is None and a["dropout_p"] == 0.0 and not a["enable_gqa"]
                and isinstance(q, torch.Tensor) and q.device.type == "cuda" and q.dim() == 4
                and q.shape[1] == a["key"].shape[1] and choice(a) == int(SDPBackend.FLASH_ATTENTION)):
            # the composite picks flash on the GPU; on fake tensors here it would decompose (MATH)
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, a["key"], a["value"], 0.0, a["is_causal"], False, scale=a["scale"])[0]
        torch.cuda.is_available = lambda: True
        try:
            return fused(args, kwargs)
        finally:
            torch.cuda.is_available = available
    A.EAGER_CHOICES.choice, J.fused_attention = choice, fused_attention  # type: ignore[method-assign]
    try:
        yield
    finally:
        del A.EAGER_CHOICES.choice
        J.fused_attention = fused


def _decode_case(small: bool) -> Any:
    """``benchmarks.decode``'s model and one step's inputs (the previous token, its position)."""
    from types import SimpleNamespace

    from benchmarks.kiln_bench.llama_decode import TINY, DecodeConfig, build_decoder
    model = build_decoder(TINY if small else DecodeConfig(), "cpu", torch.bfloat16)
    return SimpleNamespace(model=model, args=(torch.zeros(1, 1, dtype=torch.long), torch.tensor([5])), kwargs={})


def compile_model(model: str, mode: str, small: bool, gpu_shapes: bool, sdpa: str = "efficient") -> list[Any]:
    """The CompiledGraphs of one step of ``model`` compiled for CUDA from this host."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import kiln  # noqa: F401 - registers the backends
    import kiln.inductor as kiln_inductor
    from benchmarks.compile_time import _fake_like, _retargeting, _to_cuda_graph
    from benchmarks.kiln_bench import models as M
    from kiln.backends import resolve_backend
    from kiln.capture import capture_graph
    from kiln.settings import CompileOptions

    training = mode == "training"
    if model == "decode":  # benchmarks.decode's bs=1 step (static KV cache, bf16), inference only
        case = _decode_case(small)
    else:
        saved = dict(M.SHAPES[("cpu", small)])
        if gpu_shapes:
            M.SHAPES[("cpu", small)] = dict(M.SHAPES[("cuda", small)])
        try:
            case = M.build_for_mode(model, small=small, device=torch.device("cpu"), training=training)
        finally:
            M.SHAPES[("cpu", small)] = saved
    if not training:
        case.model.to(torch.bfloat16)
        M.cast_inputs(case, torch.bfloat16)
    made: list[Any] = []
    original = kiln_inductor.compile_graph
    kiln_inductor.compile_graph = _retargeting(original, made, training, [])
    try:
        backend = resolve_backend("inductor", CompileOptions())
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if training else contextlib.nullcontext()
        with torch.set_grad_enabled(training), amp, gpu_attention(sdpa):
            captured = capture_graph(type(case.model).forward, (case.model, *case.args), case.kwargs)
            fake = FakeTensorMode(allow_non_fake_inputs=True)
            if not training:
                _to_cuda_graph(captured.gm)
            fakes = [_fake_like(s, fake, "cpu" if training else "cuda") for s in captured.input_specs]
            backend(captured.gm, fakes)
    finally:
        kiln_inductor.compile_graph = original
    return made


def report(model: str, mode: str, graphs: list[Any], listing: bool) -> tuple[str, dict[str, int]]:
    lines = [f"## {model} {mode}"]
    total: dict[str, int] = {}
    for g, compiled in enumerate(graphs):
        ls = launches_of(compiled)
        s = summary(ls)
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
        lines.append(f"graph {g}: " + ", ".join(f"{k} {v}" for k, v in s.items()))
        if listing:
            lines += [f"  {i:3d} {x.kind:<9} {x.name}: {x.what}" for i, x in enumerate(ls)]
    lines.append("total: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    return "\n".join(lines), total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2", help="suite models, or decode (benchmarks.decode's step)")
    p.add_argument("--modes", default="inference")
    p.add_argument("--small", action="store_true", help="tiny configs of the same architectures")
    p.add_argument("--cpu-shapes", action="store_true", help="the CPU suite's batch/sequence (default: the GPU's)")
    p.add_argument("--sdpa", default="efficient", choices=("efficient", "flash", "cudnn", "math"),
                   help="the attention kernel eager picks on the GPU (asked of the device there; assumed here)")
    p.add_argument("--list", action="store_true", help="print every launch")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            graphs = compile_model(model, mode, args.small, not args.cpu_shapes, args.sdpa)
            text, _ = report(model, mode, graphs, args.list)
            print(text, flush=True)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                full, _ = report(model, mode, graphs, True)
                (Path(args.out) / f"launches-{model}-{mode}.txt").write_text(full + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
