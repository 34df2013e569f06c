"""The C++ wrapper: the scheduled program as one C++ function over libtorch, no Python.

It follows the Python wrapper (codegen/wrapper.py) step by step: the same allocations and hand-overs
of the memory plan, the same kernel launches (kiln's C++ kernels, called by symbol) and the same
extern calls (ATen, through the dispatcher: aten_calls.py), the same re-striding of what ATen returns.
Buffers are reference-counted ``at::Tensor`` handles: a free is ``reset()``, a hand-over a view of
the dead buffer's storage (whose own handle is reset after the step, so the memory dies with its last
holder, as the Python wrapper's buffers do).

Inputs and constants arrive as data pointers in the layouts the manifest declares. Outputs are the
program's own: each is allocated where the memory plan allocates it (when the program computes it, as
every intermediate) and handed to the caller at the end (``kiln_rt::hand_over``: owned references to
at::TensorImpls) as the buffer itself or a view of it, when the program owns that memory and the view has
the output's declared layout (``output_layout``); otherwise (the caller's memory: an input, a constant, a
buffer written over one; or a view that is not dense) as a copy in the declared layout
(``CppWrapperWriter.output``). No output memory is live before the program computes it.

Symbolic sizes (``SizeArgs``): the caller passes every size symbol's value (read from the inputs, in
the order ``SizeArgs.symbols`` names them); every size the wrapper computes (layouts, views, kernel size
arguments, extern arguments) is a C++ expression over them, and ``check_sizes`` tests each relation the
program assumed before anything runs, throwing an error that names the relation and the sizes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ...ir import (
    ConstArg,
    ExternKernel,
    Kernel,
    KernelGroup,
    Layout,
    LoopProgram,
    ScheduledProgram,
    TensorRef,
    checks_indices,
    is_float_symbol,
    kernel_size_symbols,
    size_param_ctype,
    work_buffers,
)
from ..cpp.exprs import cindex
from ..cpp.kernel import kernel_params
from ..empty_attention import empty_check, fill_value
from ..triton.cubins import Cubin, CubinSite
from .aten_calls import (
    CppWrapperUnsupported,
    boxed_arguments,
    cdouble,
    cstr,
    n_returns,
    op_overload,
    scalar_type,
    schema_name,
    typed_call,
)
from .prelude import ABI, ABI_VERSION, CUDA_INCLUDE, CUDA_PROGRAM, HEAD, LOAD_CUDA

# the most arguments a kernel launch takes (kiln.runtime's model_support_cuda.cpp, kMax)
CUDA_LAUNCH_ARGS = 1024


def size_binding(i: int, name: str, what: str) -> str:
    """The C++ local of size symbol ``name`` from ``sizes[i]``: an int64, or a float argument's double
    (its IEEE bits travel in the int64 slot: the library's ABI takes one array of sizes)."""
    if is_float_symbol(name):
        return f"  const double {name} = kiln_double_of_bits(sizes[{i}]);  // {what}"
    return f"  const int64_t {name} = sizes[{i}];  // {what}"


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a program input comes from: the caller's input ``index`` or constant ``index``."""

    kind: str  # "input" | "constant"
    index: int


@dataclass(frozen=True)
class SizeArgs:
    """A symbolic program's size arguments: each symbol with what it is ("input 'x' dim 0"), in the order
    model.so receives their values, and the relations it checks as (C++, Python text)."""

    symbols: tuple[tuple[str, str], ...] = ()
    relations: tuple[tuple[str, str], ...] = ()


def _static(x: Any) -> bool:
    return isinstance(x, (int, sympy.Integer))


def size_cpp(x: Any) -> str:
    """A size as a C++ int64 expression: the integer, or the expression over the size symbols."""
    return str(int(x)) if _static(x) else cindex(x)


def _ints(xs: tuple) -> str:
    return "{" + ", ".join(size_cpp(x) for x in xs) + "}"


def dense_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """The strides of a non-overlapping, dense tensor (a permutation of a contiguous one)."""
    dims = sorted((int(st), int(n)) for n, st in zip(shape, stride) if int(n) != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


def contiguous_stride(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    acc: Any = 1
    for n in reversed(shape):
        out.append(acc)
        acc = acc * (max(int(n), 1) if _static(n) else n)  # a size symbol is at least 2
    return tuple(reversed(out))


def output_layout(o: TensorRef) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The layout an output is handed over in: the program's view when it is dense, else contiguous.
    Symbolic sizes: the view when it is contiguous for every size (with any stride on a dim of size 1)."""
    if all(_static(x) for x in (*o.shape, *o.stride)):
        shape = tuple(int(x) for x in o.shape)
        stride = tuple(int(x) for x in o.stride)
        return shape, stride if dense_stride(shape, stride) else contiguous_stride(shape)
    shape, want = tuple(o.shape), contiguous_stride(tuple(o.shape))
    same = all((_static(n) and int(n) == 1) or sympy.expand(sympy.sympify(a) - b) == 0
               for n, a, b in zip(shape, o.stride, want))
    return shape, tuple(o.stride) if same else want


def _may_alias_an_argument(e: ExternKernel) -> bool:
    """An ATen op whose schema lets a return alias an argument (a view op, an in-place op)."""
    try:
        returns = op_overload(e.target)._schema.returns
    except (CppWrapperUnsupported, AttributeError):
        return True
    return any(r.alias_info is not None for r in returns)


def caller_memory(s: ScheduledProgram) -> set[str]:
    """Buffers whose memory may be the caller's (an input's or a constant's): the program inputs, buffers
    planned over one (an update in place), and what an ATen op returns as a view of one (or written in
    place). The rest is memory the program allocated: an output there is handed over as it is."""
    out = {b.name for b in s.program.inputs}
    for st in s.steps:
        out |= {a.buffer for a in st.allocate if a.reuse in out}
        w = st.work
        if isinstance(w, ExternKernel) and _may_alias_an_argument(w) and set(work_buffers(w)) & out:
            out |= {o.buffer for o in w.outputs}
    return out


@dataclass(frozen=True)
class CudaKernels:
    """A CUDA program's Triton kernels as cubins (codegen/triton/cubins.py): each scheduled kernel's launches."""

    cubins: Sequence[Cubin]
    sites: Mapping[str, Sequence[CubinSite]]  # scheduled kernel name -> its generated kernels' launches
    arch: int
    folder: str = "kernels"  # where the package keeps the cubins


class CppWrapperWriter:
    def __init__(self, s: ScheduledProgram, symbols: dict[str, str], slots: dict[int, Slot],
                 cuda: CudaKernels | None = None, sizes: SizeArgs = SizeArgs()) -> None:
        p = s.program
        assert isinstance(p, LoopProgram)
        self.s, self.p, self.symbols, self.slots, self.cuda, self.sizes = s, p, symbols, slots, cuda, sizes
        self.layouts = p.layouts()
        self.lines: list[str] = []
        self.declared: set[str] = set()
        self.ops: list[tuple[str, str]] = []  # dispatcher (name, overload) per kiln_rt::init_ops index
        self.caller_memory = caller_memory(s)
        self.raw: set[str] = set()  # constants only kernels read: their data pointer, no at::Tensor per call

    def _extern_buffers(self) -> set[str]:
        """Buffers an ATen call takes or makes (kernels take bare pointers)."""
        return {b for st in self.s.steps if not isinstance(st.work, (Kernel, KernelGroup))
                for b in work_buffers(st.work)}

    def _tensor_users(self) -> set[str]:
        """Buffers some step needs as an at::Tensor: an extern's arguments, a program output, a reused block."""
        used = self._extern_buffers()
        used |= {o.buffer for o in self.p.outputs if isinstance(o, TensorRef)}
        return used | {a.reuse for st in self.s.steps for a in st.allocate if a.reuse}

    def assign(self, name: str, expr: str, note: str = "") -> None:
        decl = "" if name in self.declared else "Tensor "
        self.declared.add(name)
        self.lines.append(f"  {decl}{name} = {expr};{f'  // {note}' if note else ''}")

    def ref(self, r: TensorRef) -> str:
        lay = self.layouts[r.buffer]
        if tuple(r.shape) == tuple(lay.shape) and tuple(r.stride) == tuple(lay.stride) and r.offset == lay.offset:
            return r.buffer
        return f"kiln_rt::as_strided({r.buffer}, {_ints(r.shape)}, {_ints(r.stride)}, {size_cpp(r.offset)})"

    def op_index(self, target: str) -> int:
        key = schema_name(target)
        if key not in self.ops:
            self.ops.append(key)
        return self.ops.index(key)

    def inputs(self) -> None:
        users = self._tensor_users()
        for b in sorted(self.p.inputs, key=lambda b: b.position):
            slot = self.slots.get(b.position)
            if slot is None:
                raise CppWrapperUnsupported(f"program input {b.position} ({b.name}) has no source")
            if slot.kind == "constant" and b.name not in users:  # (the runners allocate constants aligned)
                self.raw.add(b.name)
                self.lines.append(f"  void* const {b.name} = constants[{slot.index}];  // constant {slot.index}")
                continue
            src = "inputs" if slot.kind == "input" else "constants"
            lay = b.layout
            self.assign(b.name, f"kiln_rt::wrap(dev, {src}[{slot.index}], {_ints(lay.shape)}, {_ints(lay.stride)}, "
                                f"{scalar_type(lay.dtype)})", f"{slot.kind} {slot.index}")

    def alloc(self, buffer: str, layout: Layout, reuse: str | None) -> None:
        shape, stride = _ints(layout.shape), _ints(layout.stride)
        if reuse and self.layouts[reuse] == layout:
            self.assign(buffer, reuse, f"reuse: {buffer} is {reuse}")
        elif reuse:
            self.assign(buffer, f"kiln_rt::reshaped_storage({reuse}, {shape}, {stride})", "reuse")
        else:
            self.assign(buffer, f"kiln_rt::empty_strided(dev, {shape}, {stride}, {scalar_type(layout.dtype)})")

    def kernel(self, k: Kernel | KernelGroup) -> None:
        if self.cuda is not None:
            for site in self.cuda.sites.get(k.name, ()):
                if len(site.pointer_args) + len(site.size_args) > CUDA_LAUNCH_ARGS:  # refused here, not mid-call
                    raise CppWrapperUnsupported(f"kernel {site.kernel} takes {len(site.pointer_args)} pointers and "
                                                f"{len(site.size_args)} sizes: the CUDA launcher takes at most "
                                                f"{CUDA_LAUNCH_ARGS} arguments")
                gx, gy, gz = site.grid
                args = ", ".join(self.pointer(b) for b in site.pointer_args)
                if not site.size_args:
                    self.lines.append(f"  launch({site.cubin}, {gx}, {gy}, {gz}, {{{args}}});  // {site.kernel}")
                    continue
                self.lines.append(f"  if ({site.numel} > 0)  // {site.kernel}")
                self.lines.append(f"    launch({site.cubin}, unsigned({gx}), unsigned({gy}), {gz}, {{{args}}}, "
                                  f"{{{', '.join(site.size_args)}}});")
            return
        ins, outs = kernel_params(k)
        args = ", ".join([self.pointer(b) for b in (*ins, *outs)] + kernel_size_symbols(k))
        if not checks_indices(k):
            self.lines.append(f"  {self.symbols[k.name]}({args});")
            return
        # an index out of range (the kernels' prelude: kiln_check_index) is eager's IndexError
        self.lines += ["  {", "    const int64_t* ierr = kiln_index_errors();", "    const int64_t before = ierr[0];",
                       f"    {self.symbols[k.name]}({args});",
                       "    if (ierr[0] != before)",
                       f"      throw std::out_of_range(\"IndexError: index \" + std::to_string(ierr[1]) + "
                       f"\" is out of bounds for a dimension of size \" + std::to_string(ierr[2]) + "
                       f"\" (kiln kernel {k.name})\");", "  }"]

    def pointer(self, buffer: str) -> str:
        return buffer if buffer in self.raw else f"{buffer}.data()"

    def extern(self, e: ExternKernel) -> None:
        """The call (``call_extern``); for an attention kernel that may see an empty sequence, behind a
        branch that makes its outputs instead (empty_attention.py)."""
        check = empty_check(e)
        if check is None:
            self.call_extern(e)
            return
        for o in e.outputs:  # bound inside the branches, used after them
            if o.buffer not in self.declared:
                self.lines.append(f"  Tensor {o.buffer};")
                self.declared.add(o.buffer)
        pad = "  "
        if not check.always:
            cond = " || ".join(f"{size_cpp(s)} == 0" for s in check.sizes)
            self.lines.append(f"  if (!({cond})) {{")
            start = len(self.lines)
            self.call_extern(e)
            self.lines[start:] = ["  " + line for line in self.lines[start:]]
            self.lines.append("  } else {  // an empty query or key sequence: the kernel is not called")
            pad = "    "
        fill = self.op_index("aten.fill_.Scalar")
        for o in e.outputs:
            lay = o.layout
            self.lines.append(f"{pad}{o.buffer} = kiln_rt::empty_strided(dev, {_ints(lay.shape)}, {_ints(lay.stride)}, "
                              f"{scalar_type(lay.dtype)});")
            self.lines.append(f"{pad}{{ kiln_rt::Stack s; s.tensor({o.buffer}).d({cdouble(fill_value(e, o))}); "
                              f"s.call({fill}); }}")
        if not check.always:
            self.lines.append("  }")

    def call_extern(self, e: ExternKernel) -> None:
        typed = typed_call(e, self.ref)
        if typed is not None and len(e.outputs) == 1 and not e.outputs[0].path:
            o = e.outputs[0]
            lay = o.layout
            self.assign(o.buffer, f"kiln_rt::restride(dev, {typed}, {_ints(lay.shape)}, {_ints(lay.stride)}, "
                                  f"{scalar_type(lay.dtype)})", f"{e.kind} {e.target}")
            return
        k = self.op_index(e.target)
        args = boxed_arguments(e, self.ref)
        for o in e.outputs:  # bound inside the call's block, used after it
            if o.buffer not in self.declared:
                self.lines.append(f"  Tensor {o.buffer};")
                self.declared.add(o.buffer)
        self.lines.append(f"  {{  // {e.kind} {e.target}")
        self.lines.append("    kiln_rt::Stack s;")
        self.lines.append(f"    s{''.join(args)};")
        self.lines.append(f"    s.call({k});")
        many = n_returns(e.target) > 1
        for o in e.outputs:
            path = list(o.path)
            first = path.pop(0) if many and path else 0
            if len(path) > 1:
                raise CppWrapperUnsupported(f"{e.target}: output path {o.path} is nested too deep")
            src = f"s.out_item({first}, {path[0]})" if path else f"s.out({first})"
            lay = o.layout
            self.lines.append(f"    {o.buffer} = kiln_rt::restride(dev, {src}, {_ints(lay.shape)}, {_ints(lay.stride)}, "
                              f"{scalar_type(lay.dtype)});")
        self.lines.append("  }")

    def free(self, names: list[str]) -> None:
        for n in names:
            if n in self.declared:
                self.lines.append(f"  {n}.reset();")

    def output(self, k: int, o: TensorRef) -> str:
        """Output ``k`` as a C++ Tensor expression (the package's: see the module docstring)."""
        shape, stride = output_layout(o)
        if o.buffer not in self.caller_memory and (tuple(o.shape), tuple(o.stride)) == (shape, stride):
            return self.ref(o)
        return f"kiln_rt::copy_as(dev, {self.ref(o)}, {_ints(shape)}, {_ints(stride)}, 0, {scalar_type(o.dtype)})"

    def outputs(self) -> None:
        refs = []
        for k, o in enumerate(self.p.outputs):
            if not isinstance(o, TensorRef):
                raise CppWrapperUnsupported(f"output {k} is the constant {o.as_text()}, not a tensor")
            refs.append(self.output(k, o))
        if len(refs) == 1:
            self.lines.append(f"  kiln_rt::hand_over(outputs, {{{refs[0]}}});")
            return
        self.lines.append("  kiln_rt::hand_over(outputs, {")
        self.lines += [f"      {r},  // output {k}" for k, r in enumerate(refs)]
        self.lines.append("  });")

    def dropped_inputs(self) -> dict[int, list[int]]:
        """Step index -> the input slots whose held reference the wrapper drops after that step (-1: before
        the first); a package's wrapper holds none."""
        return {}

    def drop_inputs(self, slots: list[int]) -> None:
        self.lines += [f"  kiln_rt::drop_input({k});  // input {k}: last read above" for k in slots]

    def body(self) -> None:
        reused = {a.reuse for st in self.s.steps for a in st.allocate if a.reuse}
        outputs = {o.buffer for o in self.p.outputs if isinstance(o, TensorRef)}
        last = {b: k for k, st in enumerate(self.s.steps) for b in work_buffers(st.work)}
        self.inputs()
        dropped = self.dropped_inputs()
        self.drop_inputs(dropped.get(-1, []))
        if self.p.seed_buffer:
            self.assign(self.p.seed_buffer, "kiln_rt::random_seed(dev)")
        for k, st in enumerate(self.s.steps):
            for a in st.allocate:
                self.alloc(a.buffer, a.layout, a.reuse)
            if isinstance(st.work, (Kernel, KernelGroup)):
                self.kernel(st.work)
            else:
                self.extern(st.work)
            # a buffer that took over a dead one's memory holds a second handle to it: the dead one's is
            # dropped after the step (its last reader when the work is written over it in place), or the
            # memory would stay held through the call once the new buffer is freed
            taken = [a.reuse for a in st.allocate
                     if a.reuse and a.reuse != a.buffer and a.reuse not in outputs and last.get(a.reuse, -1) <= k]
            self.free([b for b in st.free if b not in reused] + taken)
            self.drop_inputs(dropped.get(k, []))
        self.outputs()

    def declarations(self) -> str:
        """CPU: the kernels' C symbols; CUDA: the cubin table and its ``Program``."""
        if self.cuda is not None:
            rows = [f"    {{{json.dumps(f'{self.cuda.folder}/{c.file_name}')}, {json.dumps(c.sha256)}, "
                    f"{json.dumps(c.launch.symbol)}, {c.launch.num_warps}, {c.launch.shared_bytes}, "
                    f"{c.launch.scratch_params}, {c.launch.global_scratch_bytes}, {int(c.pdl)}}},  // {c.function}"
                    for c in self.cuda.cubins]
            if not rows:
                return f"static kiln_rt::cuda::Program PROGRAM(nullptr, 0, {self.cuda.arch});\n\n"
            return CUDA_PROGRAM.format(rows="\n".join(rows), n=len(rows), arch=self.cuda.arch)
        kernels = self.s.launched()
        decls = []
        for sym in dict.fromkeys(self.symbols[k.name] for k in kernels):
            k = next(k for k in kernels if self.symbols[k.name] == sym)
            n = sum(len(x) for x in kernel_params(k))
            params = ["void*"] * n + [size_param_ctype(s) for s in kernel_size_symbols(k)]
            decls.append(f'extern "C" void {sym}({", ".join(params)});')
        if any(checks_indices(k) for k in kernels):
            decls.append('extern "C" int64_t* kiln_index_errors();')
        return "\n".join(decls) + "\n\n"

    def size_functions(self) -> str:
        """``check_sizes``: every relation the program assumed, over the symbols' values."""
        bind = [size_binding(i, n, what) for i, (n, what) in enumerate(self.sizes.symbols)]
        bind += [f"  (void){n};" for n, _ in self.sizes.symbols]
        check = ["static void check_sizes(const int64_t* sizes) {", "  (void)sizes;", *bind]
        if self.sizes.relations:
            said = ' + ", " + '.join(f'{cstr(n + " = ")} + std::to_string({n}) + {cstr(f" ({what})")}'
                                      for n, what in self.sizes.symbols)
            check.append(f"  const auto sizes_said = [&]() -> std::string {{ return {said}; }};")
        for cpp, text in self.sizes.relations:
            msg = cstr(f"the input sizes break a relation the program was exported for: {text}; sizes: ")
            check.append(f"  if (!({cpp})) throw std::runtime_error(std::string({msg}) + sizes_said());")
        check.append("}")
        return "\n".join(check) + "\n\n"

    def write(self) -> str:
        self.body()
        device = "cuda" if self.cuda is not None else "cpu"
        head = HEAD.format(name=self.p.name, device=device, includes=CUDA_INCLUDE if self.cuda is not None else "")
        fn = ["static void run_graph(kiln_rt::Device dev, const int64_t* sizes, void* const* inputs, "
              "void* const* constants, void** outputs) {",
              "  (void)dev; (void)inputs; (void)constants; (void)outputs;",
              "  check_sizes(sizes);"]
        fn += [size_binding(i, n, what) for i, (n, what) in enumerate(self.sizes.symbols)]
        if self.cuda is not None:  # this call's stream and the device's kernels
            fn.append("  const kiln_rt::cuda::Launcher launch = PROGRAM.launcher(dev.index);")
        fn += [*self.lines, "}"]
        abi = ABI.format(abi=ABI_VERSION, name_c=json.dumps(self.p.name), n_ops=len(self.ops), device=device,
                         device_type=1 if self.cuda is not None else 0,
                         load=LOAD_CUDA if self.cuda is not None else "0",
                         names=", ".join(json.dumps(n) for n, _ in self.ops) or "nullptr",
                         overloads=", ".join(json.dumps(o) for _, o in self.ops) or "nullptr")
        return head + self.declarations() + self.size_functions() + "\n".join(fn) + "\n" + abi


def cpp_wrapper_source(s: ScheduledProgram, symbols: dict[str, str], slots: dict[int, Slot],
                       cuda: CudaKernels | None = None, sizes: SizeArgs = SizeArgs(),
                       writer: type[CppWrapperWriter] | None = None) -> str:
    """``writer``: a CppWrapperWriter subclass (graph_call.py's, for kiln.compile's C++ wrapper)."""
    return (writer or CppWrapperWriter)(s, symbols, slots, cuda, sizes).write()


def output_specs(p: LoopProgram) -> list[tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype]]:
    """(shape, stride, dtype) of each output as a package hands it over (sympy expressions for symbolic sizes)."""
    out = []
    for k, o in enumerate(p.outputs):
        if isinstance(o, ConstArg) or not isinstance(o, TensorRef):
            raise CppWrapperUnsupported(f"output {k} is not a tensor")
        shape, stride = output_layout(o)
        out.append((shape, stride, o.dtype))
    return out
