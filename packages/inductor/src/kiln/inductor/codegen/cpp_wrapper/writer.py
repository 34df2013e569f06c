"""The C++ wrapper: the scheduled program as one C++ function over libtorch, no Python.

It follows the Python wrapper (codegen/wrapper.py) step by step: the same allocations and hand-overs
of the memory plan, the same kernel launches (kiln's C++ kernels, called by symbol) and the same
extern calls (ATen, through the dispatcher: aten_calls.py), the same re-striding of what ATen returns.
Buffers are reference-counted ``at::Tensor`` handles: a free is ``reset()``, a hand-over a view of
the dead buffer's storage.

Inputs and constants arrive as data pointers in the layouts the manifest declares; outputs are written
into buffers the caller allocated in the manifest's layouts: an output the program allocates itself
with exactly that layout is computed there directly (no copy), others are copied in at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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
)
from ..cpp.kernel import kernel_params
from .aten_calls import (
    CppWrapperUnsupported,
    boxed_arguments,
    n_returns,
    scalar_type,
    schema_name,
    typed_call,
)
from .prelude import ABI, ABI_VERSION, HEAD


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a program input comes from: the caller's input ``index`` or constant ``index``."""

    kind: str  # "input" | "constant"
    index: int


def _ints(xs: tuple) -> str:
    return "{" + ", ".join(f"{int(x)}" for x in xs) + "}"


def dense_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """The strides of a non-overlapping, dense tensor (a permutation of a contiguous one)."""
    dims = sorted((int(st), int(n)) for n, st in zip(shape, stride) if int(n) != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def output_layout(o: TensorRef) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The layout the caller allocates for an output: the program's view when it is dense, else contiguous."""
    shape = tuple(int(x) for x in o.shape)
    stride = tuple(int(x) for x in o.stride)
    return shape, stride if dense_stride(shape, stride) else contiguous_stride(shape)


class CppWrapperWriter:
    def __init__(self, s: ScheduledProgram, symbols: dict[str, str], slots: dict[int, Slot]) -> None:
        p = s.program
        assert isinstance(p, LoopProgram)
        self.s, self.p, self.symbols, self.slots = s, p, symbols, slots
        self.layouts = p.layouts()
        self.lines: list[str] = []
        self.declared: set[str] = set()
        self.ops: list[tuple[str, str]] = []  # dispatcher (name, overload) per kiln_rt::init_ops index
        self.direct = self._direct_outputs()

    def _direct_outputs(self) -> dict[str, int]:
        """Program outputs that a step allocates fresh in exactly the caller's layout: buffer -> output index."""
        fresh = {a.buffer for st in self.s.steps for a in st.allocate if a.reuse is None}
        inputs = {b.name for b in self.p.inputs}
        seen: dict[str, int] = {}
        twice: set[str] = set()
        for k, o in enumerate(self.p.outputs):
            if not isinstance(o, TensorRef):
                continue
            if o.buffer in seen:
                twice.add(o.buffer)
            lay = self.layouts[o.buffer]
            exact = (self.ref(o) == o.buffer and int(lay.offset) == 0
                     and output_layout(o) == (tuple(int(x) for x in o.shape), tuple(int(x) for x in o.stride)))
            if exact and o.buffer in fresh and o.buffer not in inputs:
                seen.setdefault(o.buffer, k)
        return {b: k for b, k in seen.items() if b not in twice}

    def assign(self, name: str, expr: str, note: str = "") -> None:
        decl = "" if name in self.declared else "Tensor "
        self.declared.add(name)
        self.lines.append(f"  {decl}{name} = {expr};{f'  // {note}' if note else ''}")

    def ref(self, r: TensorRef) -> str:
        lay = self.layouts[r.buffer]
        if tuple(r.shape) == tuple(lay.shape) and tuple(r.stride) == tuple(lay.stride) and r.offset == lay.offset:
            return r.buffer
        return f"kiln_rt::as_strided({r.buffer}, {_ints(r.shape)}, {_ints(r.stride)}, {int(r.offset)})"

    def op_index(self, target: str) -> int:
        key = schema_name(target)
        if key not in self.ops:
            self.ops.append(key)
        return self.ops.index(key)

    def inputs(self) -> None:
        for b in sorted(self.p.inputs, key=lambda b: b.position):
            slot = self.slots.get(b.position)
            if slot is None:
                raise CppWrapperUnsupported(f"program input {b.position} ({b.name}) has no source")
            src = "inputs" if slot.kind == "input" else "constants"
            lay = b.layout
            self.assign(b.name, f"kiln_rt::wrap({src}[{slot.index}], {_ints(lay.shape)}, {_ints(lay.stride)}, "
                                f"{scalar_type(lay.dtype)})", f"{slot.kind} {slot.index}")

    def alloc(self, buffer: str, layout: Layout, reuse: str | None) -> None:
        shape, stride = _ints(layout.shape), _ints(layout.stride)
        if buffer in self.direct:
            k = self.direct[buffer]
            self.assign(buffer, f"kiln_rt::wrap(outputs[{k}], {shape}, {stride}, {scalar_type(layout.dtype)})",
                        f"output {k}, computed in place")
        elif reuse and self.layouts[reuse] == layout:
            self.assign(buffer, reuse, f"reuse: {buffer} is {reuse}")
        elif reuse:
            self.assign(buffer, f"kiln_rt::reshaped_storage({reuse}, {shape}, {stride})", "reuse")
        else:
            self.assign(buffer, f"kiln_rt::empty_strided({shape}, {stride}, {scalar_type(layout.dtype)})")

    def kernel(self, k: Kernel | KernelGroup) -> None:
        ins, outs = kernel_params(k)
        args = ", ".join(f"{b}.data()" for b in (*ins, *outs))
        self.lines.append(f"  {self.symbols[k.name]}({args});")

    def extern(self, e: ExternKernel) -> None:
        typed = typed_call(e, self.ref)
        if typed is not None and len(e.outputs) == 1 and not e.outputs[0].path:
            o = e.outputs[0]
            lay = o.layout
            self.assign(o.buffer, f"kiln_rt::restride({typed}, {_ints(lay.shape)}, {_ints(lay.stride)}, "
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
            self.lines.append(f"    {o.buffer} = kiln_rt::restride({src}, {_ints(lay.shape)}, {_ints(lay.stride)}, "
                              f"{scalar_type(lay.dtype)});")
        self.lines.append("  }")

    def free(self, names: list[str]) -> None:
        for n in names:
            if n in self.declared:
                self.lines.append(f"  {n}.reset();")

    def outputs(self) -> None:
        for k, o in enumerate(self.p.outputs):
            if not isinstance(o, TensorRef):
                raise CppWrapperUnsupported(f"output {k} is the constant {o.as_text()}, not a tensor")
            if self.direct.get(o.buffer) == k:
                continue
            shape, stride = output_layout(o)
            self.lines.append(f"  kiln_rt::copy_into(outputs[{k}], {_ints(shape)}, {_ints(stride)}, "
                              f"{scalar_type(o.dtype)}, {self.ref(o)});")

    def body(self) -> None:
        reused = {a.reuse for st in self.s.steps for a in st.allocate if a.reuse}
        self.inputs()
        if self.p.seed_buffer:
            self.assign(self.p.seed_buffer, "kiln_rt::random_seed()")
        for st in self.s.steps:
            for a in st.allocate:
                self.alloc(a.buffer, a.layout, a.reuse)
            if isinstance(st.work, (Kernel, KernelGroup)):
                self.kernel(st.work)
            else:
                self.extern(st.work)
            self.free([b for b in st.free if b not in reused])
        self.outputs()

    def write(self) -> str:
        self.body()
        kernels = self.s.launched()
        decls = []
        for sym in dict.fromkeys(self.symbols[k.name] for k in kernels):
            k = next(k for k in kernels if self.symbols[k.name] == sym)
            n = sum(len(x) for x in kernel_params(k))
            decls.append(f'extern "C" void {sym}({", ".join(["void*"] * n)});')
        head = HEAD.format(name=self.p.name)
        fn = ["static void run_graph(void* const* inputs, void* const* constants, void* const* outputs) {",
              "  (void)inputs; (void)constants; (void)outputs;", *self.lines, "}"]
        abi = ABI.format(abi=ABI_VERSION, name_c=json.dumps(self.p.name), n_ops=len(self.ops),
                         names=", ".join(json.dumps(n) for n, _ in self.ops) or "nullptr",
                         overloads=", ".join(json.dumps(o) for _, o in self.ops) or "nullptr")
        return head + "\n".join(decls) + "\n\n" + "\n".join(fn) + "\n" + abi


def cpp_wrapper_source(s: ScheduledProgram, symbols: dict[str, str], slots: dict[int, Slot]) -> str:
    return CppWrapperWriter(s, symbols, slots).write()


def output_specs(p: LoopProgram) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]:
    """(shape, stride, dtype) the caller allocates for each output."""
    out = []
    for k, o in enumerate(p.outputs):
        if isinstance(o, ConstArg) or not isinstance(o, TensorRef):
            raise CppWrapperUnsupported(f"output {k} is not a tensor")
        shape, stride = output_layout(o)
        out.append((shape, stride, o.dtype))
    return out
