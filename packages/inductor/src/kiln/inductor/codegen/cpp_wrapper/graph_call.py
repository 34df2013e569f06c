"""kiln.compile's C++ wrapper: a package's wrapper (writer.py) for a graph called in-process, per call.

What differs from a package's wrapper:

- every graph input, module parameters and buffers too, is the caller's per call (no constants): they
  may be updated in place or replaced between calls;
- an input that only kernels read is passed as its bare data pointer (no ``at::Tensor`` per call; on
  CUDA one that is not 16-byte aligned, as Triton's kernels assume, is copied first: ``aligned_data``);
- an output that is an input's own memory in the input's own layout (written in place: a KV cache by
  ``index_put_``, a buffer a kernel updated over its input) is not handed over: the caller returns that
  input, as the Python wrapper does, and the write-back after the call finds nothing to copy;
- every other output is the library's, handed over as the package's are (writer.py) but always in the
  view's own layout: the program's buffer or a view of it (strides and storage offset as the Python
  wrapper returns them), or, where the memory may be the caller's (a view of an input), a copy laid out
  as that view, at its storage offset.

``output_plan(scheduled)`` says, per output, which of these happens (``OutputPlan``). The caller allocates
nothing: an output's memory is allocated when the program computes it, from the same memory plan as the
intermediates, so it is not live through the whole call (a language model's logits) nor held twice.

Symbolic sizes: the same wrapper over ``SizeArgs`` (a package's: every size a C++ expression over the
size symbols the caller passes per call); an output plan's sizes are then expressions over those symbols
(``OutputPlan.as_json`` writes them as Python).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from ...ir import ExternKernel, Layout, ScheduledProgram, TensorRef, work_buffers
from ..common import input_last_uses
from ..triton.printer import python_index
from .aten_calls import CppWrapperUnsupported, op_overload, scalar_type
from .writer import CppWrapperWriter, CudaKernels, SizeArgs, Slot, _ints, size_cpp

OUTPUT_KINDS = ("direct", "copy", "input")


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How output k is made: ``direct`` (the library hands over the program's buffer, or a view of it,
    laid out as ``shape``/``stride``), ``copy`` (the library copies it into fresh memory laid out as that
    view at storage offset ``offset``) or ``input`` (the caller returns its input ``input``: the program
    wrote that input's memory). Symbolic sizes: ``shape``, ``stride`` and ``offset`` hold sympy expressions
    over the size symbols."""

    kind: str
    shape: tuple[int | sympy.Expr, ...]
    stride: tuple[int | sympy.Expr, ...]
    offset: int | sympy.Expr
    dtype: torch.dtype
    input: int = -1

    @property
    def static(self) -> bool:
        return all(isinstance(x, int) for x in (*self.shape, *self.stride, self.offset))

    def as_json(self) -> list:
        """``[kind, shape, stride, offset, dtype, input]``; a symbolic size as Python text over the symbols."""
        return [self.kind, [_size_json(x) for x in self.shape], [_size_json(x) for x in self.stride],
                _size_json(self.offset), str(self.dtype).removeprefix("torch."), self.input]


def _size(x: object) -> int | sympy.Expr:
    """A size as an int when it is one, else its sympy expression."""
    return int(x) if isinstance(x, (int, sympy.Integer)) else sympy.sympify(x)


def _size_json(x: int | sympy.Expr) -> int | str:
    return x if isinstance(x, int) else python_index(x)


def _equal(a: object, b: object) -> bool:
    """Equal for every size (symbolic sizes compared as expressions)."""
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def _writes_first_argument(e: ExternKernel) -> bool:
    """An in-place ATen op (``index_put_``): its result is its first argument, written."""
    try:
        returns = op_overload(e.target)._schema.returns
    except (CppWrapperUnsupported, AttributeError):
        return False
    info = returns[0].alias_info if returns else None
    return info is not None and bool(info.is_write)


def input_aliases(s: ScheduledProgram) -> dict[str, int]:
    """Buffers that are an input's memory in that input's layout: buffer -> input position."""
    p = s.program
    layouts = p.layouts()
    alias: dict[str, int] = {b.name: b.position for b in p.inputs}
    for st in s.steps:
        for a in st.allocate:  # a buffer over its reused one's memory (an update in place)
            if a.reuse in alias and layouts[a.reuse] == a.layout:
                alias[a.buffer] = alias[a.reuse]
        w = st.work
        if isinstance(w, ExternKernel) and w.outputs and w.args and isinstance(w.args[0], TensorRef) \
                and _writes_first_argument(w):
            arg, out = w.args[0], w.outputs[0]
            if arg.buffer in alias and _whole(arg, layouts[arg.buffer]) and out.layout == layouts[arg.buffer] \
                    and not out.path:
                alias[out.buffer] = alias[arg.buffer]
    return alias


def _whole(r: TensorRef, lay: Layout) -> bool:
    return tuple(r.shape) == tuple(lay.shape) and tuple(r.stride) == tuple(lay.stride) and r.offset == lay.offset


class GraphCallWriter(CppWrapperWriter):
    def __init__(self, s: ScheduledProgram, symbols: dict[str, str], slots: dict[int, Slot],
                 cuda: CudaKernels | None = None, sizes: SizeArgs = SizeArgs()) -> None:
        super().__init__(s, symbols, slots, cuda, sizes)
        self.plan = self._plan()
        self._users: set[str] = set()

    def _plan(self) -> tuple[OutputPlan, ...]:
        aliases = input_aliases(self.s)
        inputs = {b.position: b for b in self.p.inputs}
        out: list[OutputPlan] = []
        for k, o in enumerate(self.p.outputs):
            if not isinstance(o, TensorRef):
                raise CppWrapperUnsupported(f"output {k} is the constant {o.as_text()}, not a tensor")
            lay = self.layouts[o.buffer]
            whole = _whole(o, lay)
            shape, stride = tuple(map(_size, o.shape)), tuple(map(_size, o.stride))
            offset = _size(lay.offset if whole else o.offset)
            pos = aliases.get(o.buffer)
            if pos is not None and whole and lay == inputs[pos].layout and _equal(lay.offset, 0):
                out.append(OutputPlan("input", shape, stride, 0, o.dtype, pos))
            elif o.buffer not in self.caller_memory:
                out.append(OutputPlan("direct", shape, stride, offset, o.dtype))
            else:
                out.append(OutputPlan("copy", shape, stride, offset, o.dtype))
        return tuple(out)

    def _tensor_users(self) -> set[str]:
        """The base writer's, but on the CPU a buffer over a reused block of the same layout (an update in
        place: an optimizer's parameters and moments) needs no at::Tensor when nothing else does, nor does
        the block it reuses, and an output the caller returns as its own input is no user: such chains stay
        bare pointers (an Adam step over 32 tensors wrapped all its 160 inputs, twice the Python
        wrapper's host time)."""
        if self.cuda is not None:  # an input written in place must be the caller's memory, not an aligned copy
            return super()._tensor_users()
        need = self._extern_buffers()
        need |= {o.buffer for o, plan in zip(self.p.outputs, self.plan)
                 if isinstance(o, TensorRef) and plan.kind != "input"}
        same: list[tuple[str, str]] = []
        for st in self.s.steps:
            for a in st.allocate:
                if a.reuse and self.layouts[a.reuse] == a.layout:
                    same.append((a.buffer, a.reuse))
                elif a.reuse:
                    need.add(a.reuse)  # kiln_rt::reshaped_storage takes the block as a Tensor
        for buffer, reuse in reversed(same):  # a block is reused after it was allocated: latest first
            if buffer in need:  # a buffer that needs a Tensor is its reused block: so is the block
                need.add(reuse)
        return need

    def alloc(self, buffer: str, layout: Layout, reuse: str | None) -> None:
        if reuse in self.raw and self.layouts[reuse] == layout and buffer not in self._users:
            self.raw.add(buffer)
            self.lines.append(f"  void* const {buffer} = {reuse};  // reuse: {buffer} is {reuse}")
            return
        super().alloc(buffer, layout, reuse)

    def inputs(self) -> None:
        users = self._users = self._tensor_users()
        for b in sorted(self.p.inputs, key=lambda b: b.position):
            slot = self.slots.get(b.position)
            if slot is None or slot.kind != "input":
                raise CppWrapperUnsupported(f"program input {b.position} ({b.name}) is not a per-call input")
            if b.name in users:
                lay = b.layout
                self.assign(b.name, f"kiln_rt::wrap(dev, inputs[{slot.index}], {_ints(lay.shape)}, "
                                    f"{_ints(lay.stride)}, {scalar_type(lay.dtype)})", f"input {slot.index}")
            elif self.cuda is not None:  # only kernels read it; Triton's want it 16-byte aligned
                self.raw.add(b.name)
                lay = b.layout
                self.lines.append(f"  Tensor {b.name}_hold;")
                self.lines.append(f"  void* const {b.name} = kiln_rt::aligned_data(dev, inputs[{slot.index}], "
                                  f"{_ints(lay.shape)}, {_ints(lay.stride)}, {scalar_type(lay.dtype)}, {b.name}_hold);"
                                  f"  // input {slot.index}")
            else:  # only kernels read it
                self.raw.add(b.name)
                self.lines.append(f"  void* const {b.name} = inputs[{slot.index}];  // input {slot.index}")

    def output(self, k: int, o: TensorRef) -> str:
        plan = self.plan[k]
        if plan.kind == "input":
            return "Tensor()"  # none: the caller returns its input
        if plan.kind == "direct":
            return self.ref(o)
        return (f"kiln_rt::copy_as(dev, {self.ref(o)}, {_ints(plan.shape)}, {_ints(plan.stride)}, "
                f"{size_cpp(plan.offset)}, {scalar_type(o.dtype)})")


class HandedOverInputsWriter(GraphCallWriter):
    """The wrapper of a graph whose caller hands over its inputs (``InductorOptions.drop_inputs``: a
    backward's saved activations): those read before the last step are dropped after their last use."""

    def dropped_inputs(self) -> dict[int, list[int]]:
        """The inputs a ``call_owned`` caller hands over that die before the last step, by the step after
        which each is dropped (``held_inputs``). Conservative where an input's memory may live on in another
        buffer (an ATen view of it, a buffer planned over it: ``caller_memory``): every input then lives
        until the last read of any such buffer, and none is dropped when one is an output."""
        reused = {a.reuse for st in self.s.steps for a in st.allocate if a.reuse}
        by_step = input_last_uses(self.s, reused)
        names = {b.name for b in self.p.inputs}
        derived = self.caller_memory - names
        if derived & {o.buffer for o in self.p.outputs if isinstance(o, TensorRef)}:
            return {}
        floor = max((k for k, st in enumerate(self.s.steps) if set(work_buffers(st.work)) & derived), default=-1)
        slot = {b.name: self.slots[b.position].index if b.position in self.slots else b.position for b in self.p.inputs}
        out: dict[int, list[int]] = {}
        for k, dying in by_step.items():
            at = max(k, floor)
            if at < len(self.s.steps) - 1:
                out.setdefault(at, []).extend(slot[b] for b in dying)
        return out


def output_plan(s: ScheduledProgram) -> tuple[OutputPlan, ...]:
    """Per output of ``s``, how its GraphCallWriter wrapper makes it."""
    return GraphCallWriter(s, {}, {}).plan


def held_inputs(s: ScheduledProgram) -> tuple[int, ...]:
    """The inputs (by position) that ``s``'s GraphCallWriter wrapper drops before it returns, when the
    caller hands them over (kiln.runtime's GraphLibrary ``held``)."""
    return tuple(sorted(k for ks in HandedOverInputsWriter(s, {}, {}).dropped_inputs().values() for k in ks))
