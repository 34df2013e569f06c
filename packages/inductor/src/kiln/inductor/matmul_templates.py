"""Triton matmul templates (autotune/matmul_template_kernel.py): a matmul with the pointwise kernel
consuming its product fused into it.

In every mode, a large mm/addmm whose result rows are misaligned (graph_passes/pad_matmuls.py
``templated``: GPT-2's and BERT's LM heads) runs as the template in its untuned configuration, with
its epilogue (``template_misaligned_matmuls``): cuBLAS is several times slower on such a result, and
padding costs copies. Under max-autotune, every other static mm/addmm/bmm extern of a scheduled
program on the Triton backend competes with the template:

1. the epilogue: the first step reading the product, when it is a pointwise kernel over the
   product's elements (its loop space is the product's shape, maybe with dimensions merged) that
   reads the product only at the point it computes -- bias add, activation, residual add, dtype cast,
   several outputs (horizontal fusion) alike. Anything else leaves the template without an epilogue.
2. the candidates: cuBLAS (the extern, then the epilogue kernel as generated) and the template over
   block/warp/stage configurations with the epilogue fused; benchmarked on the device on scratch
   buffers (results cached in kiln.runtime's compile cache; the tuner prints progress).
3. when a template wins, it replaces the extern and the epilogue kernel at the epilogue's place in
   the schedule and memory is planned again (the operands now live until the template runs).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from kiln.graph import log

from .autotune import (
    Autotuner,
    Choice,
    CompileJob,
    Config,
    Problem,
    TuningSession,
    buffers_for,
    tune_key,
)
from .autotune.matmul_template_kernel import (
    Epilogue,
    MatmulSpec,
    MatmulTritonKernel,
    Operand,
    TemplateKernel,
    default_config,
    render,
    smem_limit,
    template_configs,
    template_kernel,
)
from .codegen.triton.kernel import TritonKernel, generate_kernels
from .codegen.triton.launcher import KilnLaunch, Launch, launch_context
from .codegen.triton.wrapper import load_triton_module, module_source
from .graph_passes.pad_matmuls import templated
from .ir import (
    ConstArg,
    ExternKernel,
    Kernel,
    KernelGroup,
    KernelNode,
    Layout,
    Load,
    LoopProgram,
    ScheduledProgram,
    TensorRef,
    args_buffers,
    index_vars,
    substitute_hints,
    substitute_index,
    walk,
)
from .options import InductorOptions, MisalignedMatmuls
from .scheduler.memory import plan_memory

TARGETS = {"aten.mm.default": "mm", "aten.addmm.default": "addmm", "aten.bmm.default": "bmm"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _int(e: Any) -> int | None:
    try:
        return int(e) if sympy.sympify(e).is_Integer else None
    except (TypeError, ValueError, sympy.SympifyError):
        return None


def _ints(xs: Sequence[Any]) -> tuple[int, ...] | None:
    out = tuple(_int(x) for x in xs)
    return None if any(x is None for x in out) else out  # type: ignore[return-value]


def _operand(r: Any, rank: int, rows: bool = False) -> tuple[Operand, tuple[Any, ...]] | None:
    """A TensorRef of ``rank`` dims as an Operand (batch, row, col strides) and its shape; ``rows``:
    its first dim may be symbolic (then a sympy expression in the shape; strides stay static)."""
    if not isinstance(r, TensorRef) or len(r.shape) != rank:
        return None
    shape: Any = _ints(r.shape)
    if shape is None and rows and rank == 2 and _ints(r.shape[1:]) is not None:
        shape = (sympy.sympify(r.shape[0]), *_ints(r.shape[1:]))  # type: ignore[misc]
    stride, off = _ints(r.stride), _int(r.offset)
    if shape is None or stride is None or off is None:
        return None
    st = stride if rank == 3 else (0, *stride)
    return Operand(r.buffer, off, st), shape  # type: ignore[arg-type]


def _bias(r: Any, m: int, n: int) -> Operand | None:
    """addmm's bias broadcast to [m, n] (shape [n], [1, n], [m, 1], [m, n], ...): size-1 dims get stride 0."""
    if not isinstance(r, TensorRef) or len(r.shape) not in (1, 2):
        return None
    shape, stride, off = _ints(r.shape), _ints(r.stride), _int(r.offset)
    if shape is None or stride is None or off is None:
        return None
    shape, stride = (1,) * (2 - len(shape)) + shape, (0,) * (2 - len(stride)) + stride
    if shape[0] not in (1, m) or shape[1] not in (1, n):
        return None
    return Operand(r.buffer, off, (0, stride[0] if shape[0] != 1 else 0, stride[1] if shape[1] != 1 else 0))


def matmul_spec(e: ExternKernel, hints: dict[str, int] | None = None) -> MatmulSpec | None:
    """The template's view of an mm/addmm/bmm extern, or None when the template cannot run it (symbolic
    sizes other than an mm/addmm's row count M, symbolic strides, other dtypes, addmm's beta/alpha).
    A symbolic M is ``m_expr``, with ``m`` its value at ``hints`` (the example sizes)."""
    op = TARGETS.get(e.target)
    if op is None or len(e.outputs) != 1 or e.outputs[0].path:
        return None
    args = list(e.args)
    if op == "addmm":
        extra = list(args[3:]) + [v for _, v in e.kwargs]
        if any(not isinstance(a, ConstArg) or a.value != 1 for a in extra):
            return None
        bias_ref, args = args[0], args[1:3]
    elif e.kwargs or len(args) != 2:
        return None
    rank = 3 if op == "bmm" else 2
    pa, pb = _operand(args[0], rank, rows=True), _operand(args[1], rank)
    out = e.outputs[0]
    po = _operand(TensorRef(out.buffer, out.layout.shape, out.layout.stride, out.layout.offset, out.layout.dtype), rank,
                  rows=True)
    if pa is None or pb is None or po is None:
        return None
    (a, ash), (b, bsh), (o, osh) = pa, pb, po
    batch, m, k = (ash if rank == 3 else (1, *ash))
    n = bsh[-1]
    if osh != ((batch, m, n) if rank == 3 else (m, n)) or bsh[-2] != k or (rank == 3 and bsh[0] != batch):
        return None
    m_expr = None
    if not isinstance(m, int):  # a symbolic row count: the kernel takes it, choices use its example value
        m_expr, m = m, _int(substitute_hints(m, hints or {}))
        if m is None:
            return None
    dtypes = {args[0].dtype, args[1].dtype, out.layout.dtype}  # type: ignore[union-attr]
    if len(dtypes) != 1 or out.layout.dtype not in DTYPES or min(batch, m, n, k) < 1 or batch > 65535:
        return None
    bias = None
    if op == "addmm":
        bias = _bias(bias_ref, m, n)
        if bias is None or bias_ref.dtype != out.layout.dtype:  # type: ignore[union-attr]
            return None
    return MatmulSpec(op, batch, m, n, k, a, b, bias, o, out.layout.dtype, m_expr)


def _groups(logical: tuple[int, ...], outer: tuple[int, ...]) -> list[list[int]] | None:
    """Which logical dims (size-1 ones dropped) make up each kernel loop dim, or None."""
    dims = [j for j, s in enumerate(logical) if s != 1]
    out: list[list[int]] = []
    pos = 0
    for o in outer:
        grp: list[int] = []
        size = 1
        while size < o and pos < len(dims):
            grp.append(dims[pos])
            size *= logical[dims[pos]]
            pos += 1
        if size != o:
            return None
        out.append(grp)
    return out if pos == len(dims) else None


def epilogue_nodes(k: Kernel, spec: MatmulSpec) -> tuple[KernelNode, ...] | None:
    """``k``'s nodes over the product's logical variables when the template can run them as its
    epilogue (module docstring), else None."""
    if k.inner or isinstance(k, TemplateKernel) or any(n.kind != "pointwise" or n.role != "outer" for n in k.nodes):
        return None
    outer = _ints(k.outer)
    if outer is None:
        return None
    groups = _groups(spec.logical_shape, outer)
    if groups is None:
        return None
    new = spec.logical_vars()
    mapping: dict[sympy.Symbol, Any] = {}
    for old, grp in zip(index_vars("x", len(outer)), groups):
        expr: Any = sympy.Integer(0)
        for j in grp:  # row-major within the merged group
            expr = expr * spec.logical_shape[j] + new[j]
        mapping[old] = expr
    want = spec.store_index()
    nodes = []
    for n in k.nodes:
        body = substitute_index(n.body, mapping)
        for ld in walk(body):
            if isinstance(ld, Load) and ld.buffer == spec.out.buffer and (
                    ld.indirect or sympy.expand(ld.index - want) != 0):
                return None  # reads the product elsewhere than at this point
        if any(s.name[:1] not in ("x", "d") for e in walk(body) if isinstance(e, Load) for s in e.index.free_symbols):
            return None  # symbolic sizes
        nodes.append(KernelNode(n.buffer, n.role, n.kind, body, sympy.expand(n.store_index.xreplace(mapping)),
                                n.dtype, n.stage, n.store, n.reduction_type))
    return tuple(nodes)


def _bound_launch(run: Launch, grid: tuple[int, ...], args: list[torch.Tensor]) -> Callable[[], object]:
    """``run`` launched on ``grid`` with ``args``, as a call of no arguments (a timed candidate)."""
    return lambda: run(grid, launch_context(), *args)


@dataclass
class Site:
    step: int  # the extern's step
    extern: ExternKernel
    spec: MatmulSpec
    epilogue_step: int | None  # the step of the kernel fused as epilogue
    epilogue: Kernel | None  # that kernel as scheduled (cuBLAS's candidate runs it)
    template: TemplateKernel | None = None  # the epilogue over logical variables, config unset


def _readers(steps: Sequence[Any], buffer: str) -> list[int]:
    out = []
    for i, st in enumerate(steps):
        w = st.work
        reads = w.inputs if isinstance(w, Kernel) else args_buffers(w.args) + args_buffers(tuple(v for _, v in w.kwargs))
        if buffer in reads:
            out.append(i)
    return out


def find_sites(s: ScheduledProgram, wanted: Callable[[MatmulSpec], bool] | None = None) -> list[Site]:
    """The matmul externs the template can run (those ``wanted`` says, when given), each with its epilogue."""
    p = s.program
    assert isinstance(p, LoopProgram)
    outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    sites: list[Site] = []
    absorbed: set[int] = set()
    for i, st in enumerate(s.steps):
        if not isinstance(st.work, ExternKernel):
            continue
        spec = matmul_spec(st.work, p.hints)
        if spec is None or (wanted is not None and not wanted(spec)):
            continue
        readers = _readers(s.steps, spec.out.buffer)
        first = readers[0] if readers else None
        w = s.steps[first].work if first is not None else None
        # (a symbolic M: no epilogue yet, its loops would be over the symbolic rows too)
        nodes = epilogue_nodes(w, spec) if isinstance(w, Kernel) and first not in absorbed \
            and spec.m_expr is None else None
        if nodes is None:
            tk = TemplateKernel(f"tmpl_{spec.op}_{st.work.name}", _shape(spec), (), (), _inputs(spec, ()),
                                (spec.out.buffer,), spec=spec, config=Config(), store_product=True)
            sites.append(Site(i, st.work, spec, None, None, tk))
            continue
        assert isinstance(w, Kernel) and first is not None
        absorbed.add(first)
        store = len(readers) > 1 or spec.out.buffer in outputs
        outs = tuple(dict.fromkeys(((spec.out.buffer,) if store else ()) + tuple(w.outputs)))
        ins = _inputs(spec, tuple(b for b in w.inputs if b != spec.out.buffer))
        tk = TemplateKernel(f"tmpl_{spec.op}_{w.name}", _shape(spec), (), nodes, ins, outs, spec=spec, config=Config(),
                            store_product=store)
        sites.append(Site(i, st.work, spec, first, w, tk))
    return sites


def _shape(spec: MatmulSpec) -> tuple[sympy.Expr, ...]:
    if spec.m_expr is not None:
        return (spec.m_expr, sympy.Integer(spec.n))
    return tuple(sympy.Integer(v) for v in spec.logical_shape)


def _inputs(spec: MatmulSpec, rest: tuple[str, ...]) -> tuple[str, ...]:
    own = (spec.a.buffer, spec.b.buffer) + ((spec.bias.buffer,) if spec.bias else ())
    return tuple(dict.fromkeys(own + rest))


def _arg_value(a: Any, bufs: dict[str, torch.Tensor]) -> Any:
    if isinstance(a, TensorRef):
        return bufs[a.buffer].as_strided([int(x) for x in a.shape], [int(x) for x in a.stride], int(a.offset))
    if isinstance(a, ConstArg):
        return a.value
    return [_arg_value(x, bufs) for x in a.items]


class _Bench:
    """Scratch buffers, kernels and launches for one site, made on first use (a cache hit needs none).
    Kernels launch through the wrapper's own fast launcher, so each candidate costs what it will in the
    program (triton's Python launch path would add ~20 us per kernel and favour one launch over two).
    ``jobs()`` lists the compiles the candidates need, for the session's parallel compile."""

    def __init__(self, site: Site, layouts: dict[str, Layout], device: str, configs: Sequence[Config]) -> None:
        self.site, self.layouts, self.device, self.configs = site, layouts, device, configs
        self._bufs: dict[str, torch.Tensor] | None = None
        self._kernels: dict[str, tuple[list[TritonKernel], Any]] = {}  # "templates"/"epilogue" -> (kernels, module)
        self._launches: dict[str, list[Callable[[], object]]] = {}

    @property
    def bufs(self) -> dict[str, torch.Tensor]:
        if self._bufs is None:
            s = self.site
            names = set(_inputs(s.spec, ())) | {s.spec.out.buffer}
            if s.epilogue is not None:
                names |= set(s.epilogue.inputs) | set(s.epilogue.outputs)
            self._bufs = buffers_for({b: self.layouts[b] for b in names}, None, self.device)
        return self._bufs

    def _group(self, which: str) -> tuple[list[TritonKernel], Any]:
        if which not in self._kernels:
            if which == "templates":
                tk = self.site.template
                assert tk is not None
                ks: list[TritonKernel] = [template_kernel(f"{tk.name}_c{i}", self.site.spec, cfg,
                                                          Epilogue(tk, tk.store_product))
                                          for i, cfg in enumerate(self.configs)]
            else:
                ks = generate_kernels(self.site.epilogue) if self.site.epilogue is not None else []
            self._kernels[which] = (ks, load_triton_module(module_source(ks)) if ks else None)
        return self._kernels[which]

    @staticmethod
    def _consts(k: TritonKernel) -> dict[str, int]:
        if isinstance(k, MatmulTritonKernel):
            return {}
        return {"XBLOCK": k.xblock, **({"RBLOCK": k.rblock} if k.rblock else {}),
                **({"YBLOCK": k.yblock} if k.yblock else {})}

    def jobs(self) -> list[CompileJob]:
        out = []
        for which in ("templates", "epilogue"):
            ks, module = self._group(which)
            for k in ks:
                if k.size_args:
                    continue
                out.append(CompileJob(getattr(module, k.name), tuple(self.layouts[b].dtype for b in k.pointer_args),
                                      tuple(sorted(self._consts(k).items())), k.num_warps, getattr(k, "num_stages", 1),
                                      k.name))
        return out

    def _launchers(self, which: str) -> list[Callable[[], object]]:
        if which not in self._launches:
            ks, module = self._group(which)
            out: list[Callable[[], object]] = []
            for k in ks:
                run = KilnLaunch(getattr(module, k.name), self._consts(k), k.num_warps, None, getattr(k, "num_stages", 1))
                grid = ast.literal_eval(k.grid)  # static sizes: a literal
                args = [self.bufs[b] for b in k.pointer_args]
                out.append(_bound_launch(run, grid, args))
            self._launches[which] = out
        return self._launches[which]

    def cublas(self) -> None:
        e = self.site.extern
        fn = getattr(torch, TARGETS[e.target])  # the binding the wrapper calls (codegen/wrapper.py)
        fn(*(_arg_value(a, self.bufs) for a in e.args), **{k: _arg_value(v, self.bufs) for k, v in e.kwargs})
        for launch in self._launchers("epilogue"):
            launch()

    def launch(self, c: Config) -> Callable[[], object]:
        if c.extern:
            return self.cublas
        i = list(self.configs).index(c)
        return lambda: self._launchers("templates")[i]()


def site_problem(site: Site, layouts: dict[str, Layout], device: str, options: InductorOptions) -> Problem:
    """The tuning problem of one matmul site: cuBLAS (the default) against the template configurations
    that fit the device (autotune/matmul_template_kernel.py ``template_configs``), keyed so that identical sites
    (the layers of a transformer) share it."""
    spec, tk = site.spec, site.template
    assert tk is not None
    at = options.autotune
    configs = template_configs(spec, at.matmul_configs, smem_limit(device, at.cross_target))
    bench = _Bench(site, layouts, device, configs)
    on_device = device == "cuda" and torch.cuda.is_available()
    dev_name = torch.cuda.get_device_name() if on_device else (
        f"{device} (Triton interpreter)" if device == "cpu" else at.cross_target or device)
    key = tune_key(problem_text(site, configs), dev_name, spec.logical_shape, (spec.dtype,))
    return Problem(tk.name, key, "matmul", [Config(extern="cublas"), *configs], bench.launch, bench.jobs)


def tune_site(site: Site, layouts: dict[str, Layout], device: str, tuner: Autotuner,
              options: InductorOptions) -> Choice:
    """One site on its own (tests and direct use): the cached choice or a measurement."""
    p = site_problem(site, layouts, device, options)
    return tuner.select(p.name, p.key, p.candidates())


def problem_text(site: Site, configs: Sequence[Config]) -> str:
    """What a tuning result depends on, free of buffer and kernel names (the twelve identical layers of
    a transformer share one result): the template as rendered for the first configuration, with its
    pointers numbered in order, plus the extern's call and the candidate list."""
    tk = site.template
    assert tk is not None
    source, ptrs = render("KERNEL", site.spec, configs[0], Epilogue(tk, tk.store_product))
    for i, b in enumerate(ptrs):
        source = re.sub(rf"\bptr_{re.escape(_ident(b))}\b", f"ptr{i}", source)
    body = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    consts = [a.value for a in site.extern.args if isinstance(a, ConstArg)] + [k for k, _ in site.extern.kwargs]
    return "\n".join([f"kiln mm template v1 {site.spec.key()} {site.extern.target} {consts!r}", body,
                      ";".join(c.label for c in configs)])


def _ident(buffer: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in buffer)


def count_matmul_sites(s: ScheduledProgram) -> int:
    return sum(1 for st in s.steps if isinstance(st.work, ExternKernel) and matmul_spec(st.work) is not None)


def select_templates(s: ScheduledProgram, options: InductorOptions, device: str,
                     session: TuningSession) -> ScheduledProgram:
    """Tune every matmul site of ``s`` in ``session`` (identical sites once; all candidates compiled
    before any is timed); the program with the winning templates in place."""
    sites = find_sites(s, lambda spec: spec.m_expr is None)  # (timing needs static sizes)
    if not sites:
        return s
    p = s.program
    assert isinstance(p, LoopProgram)
    layouts = p.layouts()
    problems: list[Problem | None] = []
    for site in sites:
        try:
            problems.append(session.add(site_problem(site, layouts, device, options)))
        except Exception as e:  # noqa: BLE001 - tuning is an optimisation: the extern stays, loudly
            problems.append(None)
            _tuning_failed(site, e)
    session.run()
    chosen: dict[int, TemplateKernel] = {}  # step index the template takes -> template
    dropped: set[int] = set()
    for site, prob in zip(sites, problems):
        if prob is None:
            continue
        if prob.choice is None:
            if prob.defaulted not in ("budget", "compile-only"):
                _tuning_failed(site, RuntimeError(prob.defaulted or "not timed"))
            continue
        choice = prob.choice
        if choice.config.extern:
            log("perf_hints").info("max-autotune: %s stays a cuBLAS extern (%.4f ms)", site.extern.name, choice.ms)
            continue
        assert site.template is not None
        tk = _with_config(site.template, choice.config)
        at = site.epilogue_step if site.epilogue_step is not None else site.step
        chosen[at] = tk
        dropped.add(site.step)
        log("perf_hints").info("max-autotune: %s (%s) runs as Triton template %s [%s]%s, %.4f ms",
                               site.extern.name, site.spec.op, tk.name, choice.config.label,
                               f" with {site.epilogue.name} fused" if site.epilogue is not None else "", choice.ms)
    return _with_templates(s, chosen, dropped)


def _with_templates(s: ScheduledProgram, chosen: dict[int, TemplateKernel], dropped: set[int]) -> ScheduledProgram:
    """``s`` with each template at the step it takes and the externs it replaces ``dropped``, memory
    planned again (the operands now live until the template runs)."""
    if not chosen:
        return s
    p = s.program
    assert isinstance(p, LoopProgram)
    works: list[Kernel | KernelGroup | ExternKernel] = []
    for i, st in enumerate(s.steps):
        if i in chosen:
            works.append(chosen[i])
        elif i not in dropped:
            works.append(st.work)
    return ScheduledProgram(p, tuple(plan_memory(p, works)))


def template_misaligned_matmuls(s: ScheduledProgram, rules: MisalignedMatmuls, smem: int) -> tuple[ScheduledProgram, int]:
    """Default mode: every large matmul whose result rows are misaligned (graph_passes/pad_matmuls.py
    ``templated``, which left it unpadded) runs as the template in its untuned configuration
    (``default_config``), its pointwise consumer fused; nothing is measured. Returns the program and
    how many."""
    def wanted(spec: MatmulSpec) -> bool:
        return spec.op != "bmm" and templated(spec.m, spec.n, spec.k, spec.dtype, rules.min_macs, rules.min_dim)
    chosen: dict[int, TemplateKernel] = {}
    dropped: set[int] = set()
    for site in find_sites(s, wanted):
        assert site.template is not None
        tk = _with_config(site.template, default_config(site.spec, smem))
        chosen[site.epilogue_step if site.epilogue_step is not None else site.step] = tk
        dropped.add(site.step)
        log("perf_hints").info("misaligned matmul %s (%s, N=%d) runs as Triton template %s [%s]%s", site.extern.name,
                               site.spec.op, site.spec.n, tk.name, tk.config.label,
                               f" with {site.epilogue.name} fused" if site.epilogue is not None else "")
    return _with_templates(s, chosen, dropped), len(chosen)


def _tuning_failed(site: Site, e: Exception) -> None:
    log("perf_hints").warning("max-autotune: tuning %s (%s %s) failed, it stays a cuBLAS extern: %s: %s",
                              site.extern.name, site.spec.op, "x".join(map(str, site.spec.logical_shape)),
                              type(e).__name__, e)


def _with_config(tk: TemplateKernel, c: Config) -> TemplateKernel:
    return TemplateKernel(tk.name, tk.outer, tk.inner, tk.nodes, tk.inputs, tk.outputs, spec=tk.spec, config=c,
                          store_product=tk.store_product)
