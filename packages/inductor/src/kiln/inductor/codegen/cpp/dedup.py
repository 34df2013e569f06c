"""Kernels equal up to the names of their buffers share one compiled body (a transformer's layers)."""

from __future__ import annotations

import re

from ...ir import Kernel, KernelGroup, Layout


def _names(k: Kernel | KernelGroup) -> set[str]:
    if isinstance(k, KernelGroup):
        return {k.name}.union(*(_names(p) for p in k.parts))
    return {k.name, *k.inputs, *k.outputs, *(kn.buffer for kn in k.nodes)}


def _renamer(k: Kernel | KernelGroup) -> tuple[re.Pattern[str], list[str]]:
    names = _names(k)
    # a name is delimited by anything but a letter or digit: "_" joins it to its prefix/suffix
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(
        re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?![A-Za-z0-9])"), []


def _canonical(k: Kernel | KernelGroup, text: str) -> tuple[str, list[str]]:
    """``text`` with the kernel's name and every buffer name renamed in order of first appearance,
    and the names in that order."""
    pattern, order = _renamer(k)
    renamed: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in renamed:
            renamed[name] = f"N{len(renamed)}"
            order.append(name)
        return renamed[name]
    return pattern.sub(rename, text), order


def canonical_source(k: Kernel | KernelGroup, source: str) -> str:
    """``source`` with the kernel's name and every buffer name in it (pointer parameters ``p_buf3``,
    locals ``v_buf3``, ``acc_buf3_1``) renamed in order of first appearance."""
    return _canonical(k, source)[0]


def kernel_key(k: Kernel | KernelGroup, layouts: dict[str, Layout]) -> str:
    """The kernel up to the names of its buffers and itself: its complete dataclass repr (every field,
    bodies and indices included) renamed as ``canonical_source`` does, plus the dtype of each named
    buffer (the C++ parameter types). Kernels with equal keys are one kernel over other buffers
    (a transformer's layers), so one compiled body, called with each one's arguments, serves all."""
    text, order = _canonical(k, repr(k))
    return text + repr(tuple(str(layouts[b].dtype) if b in layouts else "-" for b in order))
