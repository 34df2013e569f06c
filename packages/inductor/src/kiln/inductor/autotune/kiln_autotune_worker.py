"""A compile worker process: candidate kernels compiled into triton's on-disk cache, one a line.

Run as a script (``python kiln_autotune_worker.py``), not imported through kiln: a worker starts in
the time it takes to import triton, not the whole inductor. Protocol: one JSON list of
``compile_one``'s arguments per stdin line; one JSON ``[status, seconds, error]`` per stdout line.

triton compiles mostly under the GIL (its Python front end, and the MLIR passes as called here), so
compile threads barely overlap: measured on a 2-core host, 2 threads compiled 6 matmul templates slower
than 1. Worker processes do overlap. A worker loads the kernel's module from its file (generated
kernels live in real files) under the parent's module name, and then either

- ``fn.warmup(...)`` for the worker's GPU: the JIT path the parent's launch takes, so the binary lands
  in triton's cache under the very key the launch computes and the parent loads it from there; or
- ``triton.compile`` for an explicit target (cross-compiling without a GPU).

Only the standard library, torch and triton are imported here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from typing import Any

_MODULES: dict[str, types.ModuleType] = {}

_TRITON_TYPES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64", "int32": "i32",
    "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
}


def _module(path: str, name: str) -> types.ModuleType:
    if name in _MODULES:
        return _MODULES[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[name] = module
    return module


def compile_one(path: str, module: str, fn_name: str, dtypes: tuple[str, ...], constants: tuple[tuple[str, int], ...],
                num_warps: int, num_stages: int, target: tuple[str, int, int] | None,
                wall_deadline: float) -> tuple[str, float, str]:
    """("ok" | "failed" | "skipped", seconds, error text)."""
    if time.time() > wall_deadline:
        return ("skipped", 0.0, "")
    t0 = time.perf_counter()
    try:
        fn = getattr(_module(path, module), fn_name)
        consts = dict(constants)
        if target is None:
            import torch

            fn.warmup(*(getattr(torch, d) for d in dtypes), grid=(1,), **consts, num_warps=num_warps,
                      num_stages=num_stages)
        else:
            import triton
            from triton.backends.compiler import GPUTarget
            from triton.compiler import ASTSource

            it = iter(dtypes)
            sig = {n: "constexpr" if n in consts else "*" + _TRITON_TYPES[next(it)] for n in fn.arg_names}
            src = ASTSource(fn, signature=sig, constexprs={k: v for k, v in consts.items() if k in sig})
            triton.compile(src, target=GPUTarget(*target), options={"num_warps": num_warps, "num_stages": num_stages})
    except Exception as e:  # noqa: BLE001 - reported to the parent; the candidate fails again when timed
        return ("failed", time.perf_counter() - t0, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return ("ok", time.perf_counter() - t0, "")


def main() -> None:
    import os

    out = os.fdopen(os.dup(1), "w")  # the protocol's channel; whatever the compile prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        a = json.loads(line)
        target = tuple(a[7]) if a[7] else None
        result = compile_one(a[0], a[1], a[2], tuple(a[3]), tuple((k, v) for k, v in a[4]), a[5], a[6],
                             target, a[8])  # type: ignore[arg-type]
        out.write(json.dumps(result) + "\n")
        out.flush()


def job_args(job: Any, target: tuple[str, int, int] | None, wall_deadline: float) -> tuple[Any, ...] | None:
    """``compile_one``'s arguments for a CompileJob, or None when its function has no source file."""
    import inspect

    inner = getattr(job.fn, "fn", None)
    try:
        path = inspect.getsourcefile(inner) if inner is not None else None
    except TypeError:
        path = None
    if not path:
        return None
    dtypes = tuple(str(d).removeprefix("torch.") for d in job.dtypes)
    return (path, inner.__module__, inner.__name__, dtypes, job.constants, job.num_warps, job.num_stages, target,
            wall_deadline)


if __name__ == "__main__":
    main()
