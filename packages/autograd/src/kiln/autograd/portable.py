"""Rendering compiled graphs as self-contained Python (torch only), for kiln.runtime's artifacts.

``render_graph_module(gm)`` turns an ATen GraphModule into a ``PortableProgram`` whose source defines
``call(args)``; tensor constants travel as raw bytes in ``files``. ``training_program`` combines a
forward and a backward program with the run-time wrapper (the ``autograd.Function``) into one program,
so a saved artifact can train: each part's source is embedded as a string and executed in its own
namespace, with its files prefixed (``fw/``, ``bw/``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import treespec_dumps

from kiln.graph import PortableProgram

from .signature import GraphSignature, OutputKind

_HEADER = """\
import math
import torch
from torch import device
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
inf, nan, NoneType = math.inf, math.nan, type(None)
"""


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().cpu().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _global_line(name: str, obj: Any) -> str | None:
    if name in ("inf", "nan", "NoneType", "torch", "device", "fx_pytree", "pytree", "math"):
        return None
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if mod and qual and "<" not in qual:
        return f"from {mod} import {qual} as {name}"
    raise ValueError(f"cannot render global {name}={obj!r} of the graph as portable source")


def render_graph_module(gm: fx.GraphModule) -> PortableProgram:
    """``gm`` as a module source defining ``call(args) -> tuple``; constants go to ``files``."""
    code = gm.graph.python_code(root_module="self")
    lines = [_HEADER]
    lines += [ln for ln in (_global_line(k, v) for k, v in code.globals.items()) if ln]
    lines.append("class _Consts:\n    pass\n\n_self = _Consts()")
    files: dict[str, bytes] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        t = getattr(gm, str(node.target))
        if not isinstance(t, torch.Tensor):  # a torch.cond branch (a submodule): no portable form yet
            raise ValueError(f"cannot render {node.target!r} ({type(t).__name__}) as portable source")
        key = f"const_{node.target}"
        files[key] = _tensor_bytes(t)
        lines.append(
            f"_self.{node.target} = _load({key!r}, {list(t.shape)}, {t.dtype}, {str(t.device)!r})")
    lines.append(code.src)
    lines.append("def call(args):\n    return forward(_self, *args)\n")
    loader = (
        "def _load(key, shape, dtype, dev):\n"
        "    raw = FILES[key]\n"
        "    if not raw:\n"
        "        return torch.empty(shape, dtype=dtype, device=dev)\n"
        "    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)\n"
        "    return t.clone().to(dev)\n")
    return PortableProgram("\n".join([lines[0], loader, *lines[1:]]), files, ("torch",))


# The program holds only its own data: the parts' sources, the signature. The code that runs them (the
# autograd.Function, output rebuilding) is kiln.runtime.program_helpers.autograd_program: imported, its
# bytecode cached by Python, where a template of it here was compiled again at every load in a new
# process (~0.5-1 ms). An inference program makes no autograd.Function.
_TRAINING_TEMPLATE = '''\
"""kiln.autograd program: compiled forward (and backward) graphs behind kiln.runtime's autograd wrapper."""
from kiln.runtime.program_helpers import autograd_program

FW_SOURCE = {fw_source!r}
BW_SOURCE = {bw_source!r}
SIG = {sig_json}
call = autograd_program(globals(), FW_SOURCE, BW_SOURCE, SIG)
'''


def _sig_json(sig: GraphSignature, grad_deps: Sequence[Sequence[int]] | None = None,
              n_saved_sizes: int = 0) -> str:
    outputs = []
    for o in sig.outputs:
        if o.kind is OutputKind.CONSTANT and not isinstance(o.value, (int, float, bool, type(None), str)):
            raise ValueError(f"cannot save constant output {o.value!r}")
        outputs.append([o.kind.value, o.index, list(o.size), list(o.stride), o.storage_offset,
                        o.requires_grad, o.value])
    data = {"n_out": sig.n_graph_outputs, "mutated": list(sig.mutated_inputs),
            "diff": list(sig.graph_output_differentiable), "grad_inputs": list(sig.grad_inputs),
            "n_inputs": sig.n_inputs, "outputs": outputs, "out_spec": treespec_dumps(sig.out_spec)}
    if grad_deps is not None:
        data["grad_deps"] = [list(d) for d in grad_deps]
    if n_saved_sizes:
        data["n_saved_sizes"] = n_saved_sizes
    if sig.symbols:
        data["symbols"] = [list(b) for b in sig.symbols]
    return repr(json.loads(json.dumps(data)))


def training_program(sig: GraphSignature, fw: PortableProgram, bw: PortableProgram | None,
                     grad_deps: Sequence[Sequence[int]] | None = None, n_saved_sizes: int = 0) -> PortableProgram:
    """One self-contained program running ``fw`` (and ``bw`` for training) behind the wrapper;
    ``grad_deps`` and ``n_saved_sizes`` as in ``make_training_callable``."""
    files = {f"fw/{k}": v for k, v in fw.files.items()}
    if bw is not None:
        files.update({f"bw/{k}": v for k, v in bw.files.items()})
    src = _TRAINING_TEMPLATE.format(fw_source=fw.source, bw_source=bw.source if bw else "",
                                    sig_json=_sig_json(sig, grad_deps, n_saved_sizes))
    requires = tuple(dict.fromkeys((*fw.requires, *(bw.requires if bw else ()), "kiln.runtime")))
    modules = tuple(dict.fromkeys((*fw.triton_modules, *(bw.triton_modules if bw else ()))))
    return PortableProgram(src, files, requires, modules)


def load_program(program: PortableProgram) -> Any:
    """Execute a program's source the way kiln.runtime does (for tests): returns its ``call``."""
    ns: dict[str, Any] = {"FILES": dict(program.files), "FILES_DIR": None, "__name__": "kiln_program"}
    exec(compile(program.source, "<kiln program>", "exec"), ns)
    return ns["call"]
