"""The sm_90 machine code of a test function's generated Triton kernels, built here without a GPU.

The function (``module.function`` of this folder) is compiled for fake CUDA tensors in a subprocess
without the interpreter (this folder's tests run under it; kiln writes no PDL there), with
``KILN_TRITON_CROSS_TARGET=cuda:90``; its kernels go through ``compile_cubins`` (triton's own ptxas) and
``cuobjdump -sass``. Returns each cubin's function -> its opcodes in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

SCRIPT = textwrap.dedent("""
    import importlib, json, os, re, subprocess, sys, torch, triton
    from torch._subclasses.fake_tensor import FakeTensorMode
    out_dir, module, function, specs, options = sys.argv[1:6]
    sys.path[:0] = sys.argv[6:]
    from tracer import trace
    from kiln.inductor import InductorOptions, compile_graph
    from kiln.inductor.codegen.triton.backend import TritonBackend
    from kiln.inductor.codegen.triton.cubins import compile_cubins
    fn = getattr(importlib.import_module(module), function)
    opts = InductorOptions(strict_lowering=True, **json.loads(options))
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(*shape, device="cuda", dtype=getattr(torch, dtype)) for shape, dtype in json.loads(specs)]
        s = compile_graph(trace(fn, *args), args, options=opts).scheduled
    layouts = s.program.layouts()
    kernels, _ = TritonBackend("cuda").generate(s, layouts, opts)
    cubins, _ = compile_cubins(kernels, layouts, 90)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {}
    for c in cubins:
        path = os.path.join(out_dir, c.file_name)
        open(path, "wb").write(c.binary)
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
        out[c.function] = re.findall(r"/\\*[0-9a-f]{4,}\\*/\\s+(?:@!?U?P\\w+\\s+)?([A-Z][A-Z0-9_.]*)", sass)
    print(json.dumps(out))
""")


def cross_env(target: str = "cuda:90") -> dict[str, str]:
    """This process's environment without the interpreter, compiling Triton kernels for ``target``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KILN_TRITON_CROSS_TARGET"] = target
    return env


def subprocess_paths() -> list[str]:
    """This folder and the test roots on ``sys.path`` (``tracer``), for a subprocess."""
    return [os.path.dirname(__file__), *(p for p in sys.path if p.endswith("tests") and os.path.isdir(p))]


def sass_ops(out_dir: Path, module: str, function: str, args: list[tuple[list[int], str]],
             options: dict[str, Any]) -> dict[str, list[str]]:
    """Cubin function -> its SASS opcodes, for ``module.function`` over fake CUDA tensors ``args``
    (shape, torch dtype name) compiled with ``InductorOptions(strict_lowering=True, **options)``."""
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(out_dir), module, function, json.dumps(args),
                        json.dumps(options), *subprocess_paths()], capture_output=True, text=True, env=cross_env(),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
