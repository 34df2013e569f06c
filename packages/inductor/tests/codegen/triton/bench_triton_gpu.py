"""GPU micro-benchmarks of the Triton path: kiln vs eager vs torch.compile (run by hand on the GPU machine).

    PYTHONPATH=... python packages/inductor/tests/codegen/triton/bench_triton_gpu.py
"""

import os
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tracer import trace  # noqa: E402

from kiln.inductor import compile_graph  # noqa: E402


def case(name, fn, *args):
    t0 = time.perf_counter()
    cg = compile_graph(trace(fn, *args), list(args))
    kiln_fn = lambda: cg.fn(*args)  # noqa: E731
    kiln_fn()
    torch.cuda.synchronize()
    t_kiln_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    tc = torch.compile(fn)
    tc(*args)
    torch.cuda.synchronize()
    t_tc_compile = time.perf_counter() - t0
    with torch.no_grad():
        ref = fn(*args)
        got = kiln_fn()[0]
        ref0 = ref[0] if isinstance(ref, tuple) else ref
        err = (got.float() - ref0.float()).abs().max().item()
        e = do_bench(lambda: fn(*args))
        k = do_bench(kiln_fn)
        c = do_bench(lambda: tc(*args))
    n = len(cg.scheduled.kernels())
    print(f"{name:<28} kernels={n} eager {e*1e3:8.1f}us kiln {k*1e3:8.1f}us torch.compile {c*1e3:8.1f}us "
          f"kiln/eager {e/k:5.2f}x kiln/tc {c/k:5.2f}x  compile kiln {t_kiln_compile:5.2f}s tc {t_tc_compile:5.2f}s "
          f"maxerr {err:.2e}", flush=True)


def main():
    dev = "cuda"
    torch.manual_seed(0)
    x = torch.randn(4096, 4096, device=dev)
    xb = x.to(torch.bfloat16)
    w = torch.randn(4096, device=dev)
    b = torch.randn(4096, device=dev)
    case("pointwise gelu(x*2+1)", lambda x: F.gelu(x * 2 + 1), x)
    case("add broadcast", lambda x, b: x + b, x, b)
    case("transpose contiguous", lambda x: x.t().contiguous() + 1, x)
    case("sum rows", lambda x: x.sum(-1), x)
    case("sum cols", lambda x: x.sum(0), x)
    case("softmax 4096", lambda x: torch.softmax(x, -1), x)
    case("softmax bf16 4096", lambda x: torch.softmax(x, -1), xb)
    case("softmax 1024x32000", lambda x: torch.softmax(x, -1), torch.randn(1024, 32000, device=dev))
    case("layer_norm+gelu", lambda x, w, b: F.gelu(F.layer_norm(x, (4096,), w, b)), x, w, b)
    case("layer_norm bf16", lambda x, w, b: F.layer_norm(x, (4096,), w, b), xb, w.bfloat16(), b.bfloat16())
    case("rms_norm", lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w)
    case("rms_norm 768", lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
         torch.randn(16384, 768, device=dev), torch.randn(768, device=dev))
    case("argmax rows", lambda x: x.argmax(-1), x)
    case("var_mean", lambda x: torch.var_mean(x, -1), x)


if __name__ == "__main__":
    main()
