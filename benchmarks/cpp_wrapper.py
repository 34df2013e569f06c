"""Per-call time of kiln.compile's two wrappers: the generated Python wrapper (default) against
``options={"wrapper": "cpp"}`` (the same kernels and ATen calls from a C++ library called through ctypes),
beside eager and torch.compile, for small models whose calls are host-bound.

    uv run python -m benchmarks.cpp_wrapper [--models llama,gpt2,resnet18] [--iters 50] [--rounds 3]
    python -m benchmarks.cpp_wrapper --device cuda --dtype bfloat16      # on a GPU

Models: HF Llama and GPT-2 with tiny configs (4 layers, ``--width`` 256, vocab 1024; ``--batch`` x ``--seq``
tokens, logits only, no KV cache) and torchvision's ResNet-18 (10 classes, ``--batch`` x 3 x 64 x 64).
Inference under ``torch.no_grad``. Each method runs ``--iters`` calls back to back, then (CUDA) one
synchronize: ms per call is that loop's time / iters, so a host-bound method is timed by its host work.
Methods alternate in ``--rounds`` rounds; the table shows the median round, the best (on a shared,
busy host the least disturbed) and each round; ``--threads 1 --width 32`` isolates per-call overhead. Before
timing, each method's output is compared with eager's and the number of graphs that got the C++ wrapper
is printed (a graph it refused keeps the Python wrapper, said in kiln's perf_hints log).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import kiln
from kiln.graph import EVENTS, GraphCompiled


class LogitsOnly(nn.Module):
    """An HF causal LM called on token ids, returning its logits (no KV cache)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits  # type: ignore[no-any-return]


def build(name: str, batch: int, seq: int, width: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    if name in ("llama", "gpt2"):
        import transformers  # noqa: PLC0415 - only these models need it

        if name == "llama":
            config = transformers.LlamaConfig(vocab_size=1024, hidden_size=width, intermediate_size=width * 8 // 3,
                                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                              max_position_embeddings=512)
            lm = transformers.LlamaForCausalLM(config)
        else:
            config = transformers.GPT2Config(vocab_size=1024, n_embd=width, n_layer=4, n_head=4, n_positions=512,
                                             bos_token_id=0, eos_token_id=0)
            lm = transformers.GPT2LMHeadModel(config)
        return LogitsOnly(lm).eval(), (torch.randint(0, 1024, (batch, seq)),)
    if name == "resnet18":
        import torchvision  # noqa: PLC0415

        return torchvision.models.resnet18(num_classes=10).eval(), (torch.randn(batch, 3, 64, 64),)
    raise SystemExit(f"unknown model {name!r}: llama, gpt2, resnet18")


def on_device(model: nn.Module, inputs: tuple, device: str, dtype: str) -> tuple[nn.Module, tuple]:
    dt = getattr(torch, dtype)
    return model.to(device, dt), tuple(x.to(device, dt if x.is_floating_point() else x.dtype) for x in inputs)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ms_per_call(fn: Callable[[], object], iters: int, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return 1e3 * (time.perf_counter() - t0) / iters


class CppGraphs:
    """Counts the graphs kiln compiled while listening, and those that got the C++ wrapper."""

    def __init__(self) -> None:
        self.total = self.cpp = 0

    def __call__(self, event: object) -> None:
        if isinstance(event, GraphCompiled):
            self.total += 1
            portable = getattr(event.compiled, "portable", None)
            self.cpp += portable is not None and "_GraphLibrary(" in portable.source


def first_call(name: str, fn: Callable[[], object], reference: torch.Tensor, device: str,
               dtype: str) -> tuple[float, str]:
    """(seconds of the first call, a note on its output against eager's)."""
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    seconds = time.perf_counter() - t0
    assert isinstance(out, torch.Tensor)
    err = (out.float() - reference.float()).abs().max().item()
    tol = 5e-2 if dtype == "bfloat16" else 1e-3
    return seconds, f"max |diff| vs eager {err:.2e}" + ("" if err <= tol * max(1.0, reference.abs().max().item())
                                                          else "  ** MISMATCH **")


def bench(name: str, args: argparse.Namespace) -> list[str]:
    model, inputs = on_device(*build(name, args.batch, args.seq, args.width), args.device, args.dtype)
    methods: dict[str, Callable[[], object]] = {"eager": lambda: model(*inputs)}
    rows = [f"\n{name} ({args.batch} x {args.seq if name != 'resnet18' else '3x64x64'}) on {args.device} {args.dtype}"]
    with torch.no_grad():
        reference = model(*inputs)
        kiln.reset()
        kiln_py = kiln.compile(model)
        kiln_cpp = kiln.compile(model, options={"wrapper": "cpp"})
        wanted = {"kiln.compile": lambda: kiln_py(*inputs), "kiln wrapper=cpp": lambda: kiln_cpp(*inputs)}
        if not args.no_torch_compile:
            tc = torch.compile(model)
            wanted["torch.compile"] = lambda: tc(*inputs)
        for label, fn in wanted.items():
            graphs = CppGraphs()
            EVENTS.subscribe(graphs)
            try:
                seconds, note = first_call(label, fn, reference, args.device, args.dtype)
            finally:
                EVENTS.unsubscribe(graphs)
            extra = f"; {graphs.cpp} of {graphs.total} graph(s) on the C++ wrapper" if label == "kiln wrapper=cpp" else ""
            rows.append(f"  {label}: first call {seconds:.1f} s, {note}{extra}")
            methods[label] = fn
        for fn in methods.values():  # warm up
            for _ in range(3):
                fn()
        results: dict[str, list[float]] = {k: [] for k in methods}
        for _ in range(args.rounds):
            for k, fn in methods.items():
                results[k].append(ms_per_call(fn, args.iters, args.device))
    base = statistics.median(results["kiln.compile"])
    rows.append(f"  {'method':<18} {'ms/call':>9} {'best':>9} {'vs kiln.compile':>16}  (rounds)")
    for k, v in results.items():
        m = statistics.median(v)
        rows.append(f"  {k:<18} {m:>9.3f} {min(v):>9.3f} {base / m:>15.2f}x  ({', '.join(f'{x:.3f}' for x in v)})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama,gpt2,resnet18")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--width", type=int, default=256, help="the language models' hidden size")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (slow to compile here)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}", flush=True)
    for name in args.models.split(","):
        print("\n".join(bench(name, args)), flush=True)

if __name__ == "__main__":
    main()
