"""The Triton side of the Python wrapper: kernel module text, its loader, and launch statements.

Generated kernels are plain text inside the wrapper module (so kiln.runtime saves them with no
pickle). On first use the wrapper imports that text with kiln.runtime's ``load_triton_module``
(written to a file in the compile cache named by its hash: triton's ``@jit`` reads kernel source
through ``inspect``), and triton compiles each kernel on its first launch and caches the binary on
disk (``~/.triton/cache``). When the wrapper runs from a kiln artifact or graph-cache entry that
carries the binaries, the loader files them into triton's in-memory kernel cache
(``kiln.runtime.triton_preload.adopt_module``): no compile and no cache lookup at first launch.

How a wrapper uses this (see ``wrapper_prologue`` and ``TritonKernel.launch_code``)::

    <wrapper_prologue(kernels)>            # module level: source constant + loader + import
    ...
    s0 = arg0.shape[0]                     # size symbols bound as Python ints
    buf1 = torch.empty(...)                # outputs allocated by the wrapper
    <kernel.launch_code("triton_kernels")> # one statement per kernel, in schedule order
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

import torch

from kiln.runtime import load_triton_module

from ...ir import Kernel
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .kernel import TritonKernel, generate_kernels, size_arg_value
from .launcher import LAUNCHER
from .prelude import PRELUDE

MODULE_VAR = "triton_kernels"

# The wrapper's kernel loader: kiln.runtime's (the one loader, also used in-process below)
LOADER = "from kiln.runtime.triton_kernels import load_triton_module as _kiln_load_triton_module"


def module_source(kernels: Sequence[TritonKernel]) -> str:
    """The kernel module: prelude helpers then every kernel function (a kernel that launches another's
    identical function adds none)."""
    return PRELUDE + "\n\n" + "\n\n\n".join(k.source for k in kernels if not k.function) + "\n"


def wrapper_prologue(kernels: Sequence[TritonKernel], module_var: str = MODULE_VAR,
                     inputs: frozenset[str] | None = None,
                     dtypes: Mapping[str, torch.dtype] | None = None) -> str:
    """Module-level wrapper code defining ``module_var`` (the loaded kernel module) and each kernel's
    launcher; ``inputs`` names the graph's input buffers (see ``TritonKernel.launcher_definition``);
    with ``dtypes`` (buffer -> dtype) the kernels are compiled together when the module loads
    (``kiln.runtime.triton_compile.precompile``; a kernel's unspecialised size arguments warm up as 0)."""
    if not kernels:
        return ""
    src = module_source(kernels)
    # a raw triple-quoted literal keeps the kernels readable in the output_code log
    literal = f"r'''{src}'''" if "'''" not in src and not src.endswith("\\") else repr(src)
    lines = ["import triton", "", f"_TRITON_SOURCE = {literal}", "", LOADER,
             f"{module_var} = _kiln_load_triton_module(_TRITON_SOURCE)", "", LAUNCHER,
             *(k.launcher_definition(module_var, inputs) for k in kernels)]
    if dtypes is not None:
        items = [f"({k.launcher_var}, ({''.join(f'{dtypes[b]}, ' for b in k.pointer_args)}{'0, ' * len(k.size_args)}))"
                 for k in kernels if not k.function and k.xnumel != "0"
                 and all(b in dtypes for b in k.pointer_args)]  # (an empty kernel is never launched)
        # skipped when kiln.inductor's compile pool has them (load_wrapper sets _KILN_COMPILED_AHEAD)
        lines.append(f"_kiln_precompile([{', '.join(items)}], globals().get('_KILN_COMPILED_AHEAD', False))")
    return "\n".join([*lines, ""])


def launch_statement(k: TritonKernel, args: Sequence[str] | None = None, module_var: str = MODULE_VAR,
                     ctx: str = "_kiln_launch_context()") -> str:
    """A wrapper statement launching ``k``; skipped when the iteration space is empty."""
    return f"if {k.xnumel} > 0:\n    {k.launch_code(module_var, args, ctx)}" if k.size_args else (
        k.launch_code(module_var, args, ctx) if k.xnumel != "0" else "pass")


class TritonKernels:
    """Generated kernels of one program, loaded in-process (tests and direct use; wrappers embed text)."""

    def __init__(self, kernels: Sequence[Kernel], cfg: TritonConfig = DEFAULT_CONFIG) -> None:
        self.generated = [g for k in kernels for g in generate_kernels(k, cfg)]
        self.source = module_source(self.generated)
        self._module: types.ModuleType | None = None

    @property
    def module(self) -> types.ModuleType:
        if self._module is None:
            self._module = load_triton_module(self.source)
        return self._module

    def launch(self, index: int, buffers: Mapping[str, torch.Tensor], sizes: Mapping[str, int] | None = None
               ) -> None:
        """Run kernel ``index`` over ``buffers`` (name -> tensor, each its whole storage at offset 0)."""
        import triton

        k = self.generated[index]
        env = dict(sizes or {})
        xnumel = eval(k.xnumel, {}, env)  # noqa: S307 - our own printed size expression
        if xnumel == 0:
            return
        fn = getattr(self.module, k.name)
        args = [buffers[b] for b in k.pointer_args] + [size_arg_value(s, env[s]) for s in k.size_args]
        consts = {"XBLOCK": k.xblock, **({"RBLOCK": k.rblock} if k.rblock else {}),
                  **({"YBLOCK": k.yblock} if k.yblock else {})}
        ygrid = triton.cdiv(eval(k.ynumel, {}, env), k.yblock) if k.yblock else 1  # noqa: S307
        fn[(triton.cdiv(xnumel, k.xblock), ygrid, 1)](*args, **consts, num_warps=k.num_warps, num_stages=1)

    def run(self, buffers: Mapping[str, torch.Tensor], sizes: Mapping[str, int] | None = None) -> None:
        for i in range(len(self.generated)):
            self.launch(i, buffers, sizes)
