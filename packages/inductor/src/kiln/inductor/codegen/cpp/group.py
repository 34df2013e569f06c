"""C++ for a KernelGroup (scheduler/horizontal.py): its parts over one flattened range, one region.

The parts' element counts are laid end to end (offsets ``o0 = 0 <= o1 <= ... <= total``). The range
is cut into blocks (a few per thread, at least ``BLOCK_MIN`` elements) handed out dynamically: one
parallel region and no barrier between parts, and a thread held up on a shared machine delays one
block, not every part. Each block calls, for every part it overlaps, that part's serial range
function (``CppKernelWriter.write_range``: a simd loop over [lo, hi) of the part's flat points).

Range functions are shared: a 1-d part's function does not depend on its length, so the parts of an
optimizer step over tensors of many sizes (same update, other buffers) call one function.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from ...ir import Kernel, KernelGroup, Layout, kernel_size_symbols, product, size_param_ctype
from ...options import InductorOptions
from .dedup import kernel_key
from .exprs import cindex
from .kernel import CppKernelWriter, kernel_params
from .types import ctype

BLOCK_MIN = 4096  # elements: a block's loop runs long enough to hide the dynamic hand-out
BLOCKS_PER_THREAD = 4


def range_kernel(k: Kernel) -> Kernel:
    """The kernel a range function is generated from: a 1-d part's length is the caller's business
    (its range function loops over [lo, hi) only), so it is left out of the function and its key."""
    return replace(k, outer=(sympy.Integer(1),)) if len(k.outer) == 1 else k


@dataclass
class RangeFunctions:
    """The range functions of one translation unit's group parts, one per distinct part."""

    layouts: dict[str, Layout]
    options: InductorOptions
    sources: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # kernel_key of the range kernel -> function

    def name_for(self, k: Kernel) -> str:
        rk = range_kernel(k)
        key = kernel_key(rk, self.layouts)
        if key not in self.names:
            self.names[key] = name = f"kiln_range{len(self.names)}"
            self.sources.append(CppKernelWriter(rk, self.layouts, self.options).write_range(name))
        return self.names[key]


def _signature(g: KernelGroup, layouts: dict[str, Layout]) -> str:
    ins, outs = kernel_params(g)
    params = [f"const {ctype(layouts[b].dtype)}* __restrict__ p_{b}" for b in ins]
    params += [f"{ctype(layouts[b].dtype)}* __restrict__ p_{b}" for b in outs]
    params += [f"const {size_param_ctype(s)} {s}" for s in kernel_size_symbols(g)]
    return f'extern "C" void {g.name}({", ".join(params)})'


def _part_call(k: Kernel, fn: str, lo: str, hi: str) -> str:
    ins, outs = kernel_params(k)
    args = [f"p_{b}" for b in (*ins, *outs)] + kernel_size_symbols(range_kernel(k))
    return f"{fn}({', '.join([lo, hi, *args])})"


def group_source(g: KernelGroup, layouts: dict[str, Layout], options: InductorOptions,
                 functions: RangeFunctions) -> str:
    """The exported function of ``g``; the range functions it calls are added to ``functions``."""
    lines = [_signature(g, layouts) + " {", "  const int64_t o0 = 0;"]
    for j, k in enumerate(g.parts):
        lines.append(f"  const int64_t o{j + 1} = o{j} + {cindex(product(list(k.outer)))};  // {k.name}")
    n = len(g.parts)
    lines.append(f"  const int64_t total = o{n};")
    lines.append("  auto run = [&](const int64_t lo, const int64_t hi) {")
    for j, k in enumerate(g.parts):
        call = _part_call(k, functions.name_for(k), f"std::max<int64_t>(lo, o{j}) - o{j}",
                          f"std::min<int64_t>(hi, o{j + 1}) - o{j}")
        lines.append(f"    if (lo < o{j + 1} && hi > o{j}) {call};")
    lines.append("  };")
    total = sympy.expand(sum((product(list(k.outer)) for k in g.parts), sympy.Integer(0)))
    threshold = options.parallel_threshold
    if isinstance(total, sympy.Integer) and int(total) <= threshold:
        lines.append("  run(0, total);")
    else:
        lines += [f"  if (omp_get_max_threads() > 1 && total > {threshold}) {{",
                  "    const int64_t nt = omp_get_max_threads();",
                  f"    const int64_t bs = std::max<int64_t>({BLOCK_MIN}, "
                  f"(total / (nt * {BLOCKS_PER_THREAD}) + 15) / 16 * 16);",
                  "    const int64_t nb = (total + bs - 1) / bs;",
                  "    #pragma omp parallel for schedule(dynamic, 1)",
                  "    for (int64_t b = 0; b < nb; ++b) run(b * bs, std::min<int64_t>(total, (b + 1) * bs));",
                  "  } else {",
                  "    run(0, total);",
                  "  }"]
    lines.append("}")
    return "\n".join(lines)
