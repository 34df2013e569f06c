"""Identical generated kernels share one Triton function.

A transformer's layers generate the same kernels layer after layer, differing only in the kernel's
name and the names of its pointer (and symbolic size) parameters; Triton compiles each function
separately (a GPU cold compile is mostly that: 10-20 s for a 12-layer model on 16 threads). Kernels
whose source is the same once those names are numbered by position launch the first one's function;
each keeps its own launcher (its buffers and sizes passed by position, grid, constexprs), so a tuned
config of one twin does not affect another, and triton compiles one binary per distinct
specialization of the shared function.
"""

from __future__ import annotations

import dataclasses
import re

from .kernel import TritonKernel, ptr_name


def normalized_source(k: TritonKernel) -> str:
    """``k.source`` with its name, pointer and size parameter names replaced by positional ones."""
    names = {k.name: "KERNEL", **{h: f"KERNEL_H{i}" for i, h in enumerate(k.helpers)},
             **{ptr_name(b): f"ptr_P{i}" for i, b in enumerate(k.pointer_args)},
             **{s: f"kiln_size_S{i}" for i, s in enumerate(k.size_args)}}
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], k.source)


def share_identical_kernels(kernels: list[TritonKernel]) -> tuple[list[TritonKernel], int]:
    """``kernels`` with each later twin pointed at its first twin's function, and how many were."""
    first: dict[str, str] = {}
    out: list[TritonKernel] = []
    shared = 0
    for k in kernels:
        if k.function:
            out.append(k)
            continue
        key = normalized_source(k)
        owner = first.setdefault(key, k.name)
        if owner == k.name:
            out.append(k)
        else:
            out.append(dataclasses.replace(k, function=owner))
            shared += 1
    return out, shared
