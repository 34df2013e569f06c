"""Rendering compiled graphs as self-contained Python (torch only), for kiln.runtime's artifacts.

``render_graph_module(gm)`` turns an ATen GraphModule into a ``PortableProgram`` whose source defines
``call(args)``; tensor constants travel as raw bytes in ``files``. ``training_program`` combines a
forward and a backward program with the run-time wrapper (the ``autograd.Function``) into one program,
so a saved artifact can train: each part's source is embedded as a string and executed in its own
namespace, with its files prefixed (``fw/``, ``bw/``).
"""

from __future__ import annotations

import json
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


_TRAINING_TEMPLATE = '''\
"""kiln.autograd training program: compiled forward and backward graphs with their autograd wrapper."""
import contextlib
import os
import torch
from torch.utils._pytree import treespec_loads, tree_unflatten

FW_SOURCE = {fw_source!r}
BW_SOURCE = {bw_source!r}
SIG = {sig_json}
OUT_SPEC = treespec_loads(SIG["out_spec"])


def _load_part(source, prefix):
    files = {{k[len(prefix):]: v for k, v in FILES.items() if k.startswith(prefix)}}
    root = globals().get("FILES_DIR")
    part_dir = os.path.join(root, prefix) if root else root
    ns = {{"FILES": files, "FILES_DIR": part_dir, "__name__": "kiln_part"}}
    exec(compile(source, "<kiln " + prefix + ">", "exec"), ns)
    # call_owned (kiln.inductor's wrappers) takes the list's references over
    return ns.get("call_owned", ns["call"])


_fw = _load_part(FW_SOURCE, "fw/")
_bw = _load_part(BW_SOURCE, "bw/") if BW_SOURCE else None


@contextlib.contextmanager
def _no_autocast():
    with contextlib.ExitStack() as stack:
        for dev in ("cpu", "cuda"):
            if torch.is_autocast_enabled(dev):
                stack.enter_context(torch.autocast(dev, enabled=False))
        yield


class CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *args):
        n_out, n_mut = SIG["n_out"], len(SIG["mutated"])
        with _no_autocast():
            outs = list(_fw(list(args)))
        ctx.save_for_backward(*outs[n_out + n_mut:])
        nondiff = [o for o, d in zip(outs[:n_out], SIG["diff"]) if not d and isinstance(o, torch.Tensor)]
        nondiff += outs[n_out:n_out + n_mut]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return tuple(outs[:n_out + n_mut])

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError("kiln: double backward through a compiled graph is not supported")
        tangents = [g.contiguous() for g, d in zip(grads[:SIG["n_out"]], SIG["diff"]) if d]
        bw_args = list(ctx.saved_tensors) + tangents
        del tangents
        if hasattr(ctx, "maybe_clear_saved_tensors"):  # the backward frees them as it goes
            ctx.maybe_clear_saved_tensors()
        with _no_autocast():
            gin = list(_bw(bw_args))
        result = [None] * SIG["n_inputs"]
        for idx, g in zip(SIG["grad_inputs"], gin):
            result[idx] = g
        return tuple(result)


def _finish(args, graph_outs, mutated):
    with torch.no_grad():
        for idx, new in zip(SIG["mutated"], mutated):
            if new is not args[idx]:  # a compiler that updated the input in place returns it
                args[idx].copy_(new)
    result = []
    for kind, index, size, stride, offset, rg, value in SIG["outputs"]:
        if kind == "graph":
            v = graph_outs[index]
        elif kind == "input":
            v = args[index]
        elif kind == "same":
            v = result[index]
        elif kind == "constant":
            v = value
        else:
            base = args[index] if kind == "alias_input" else result[index]
            v = base.as_strided(size, stride, offset)
            if not rg and v.requires_grad:
                v = v.detach()
        result.append(v)
    return tree_unflatten(result, OUT_SPEC)


def call(args):
    args = list(args)
    n_out = SIG["n_out"]
    if _bw is None:
        with _no_autocast():
            outs = list(_fw(list(args)))
    else:
        outs = list(CompiledFunction.apply(*args))
    return _finish(args, outs[:n_out], outs[n_out:])
'''


def _sig_json(sig: GraphSignature) -> str:
    outputs = []
    for o in sig.outputs:
        if o.kind is OutputKind.CONSTANT and not isinstance(o.value, (int, float, bool, type(None), str)):
            raise ValueError(f"cannot save constant output {o.value!r}")
        outputs.append([o.kind.value, o.index, list(o.size), list(o.stride), o.storage_offset,
                        o.requires_grad, o.value])
    data = {"n_out": sig.n_graph_outputs, "mutated": list(sig.mutated_inputs),
            "diff": list(sig.graph_output_differentiable), "grad_inputs": list(sig.grad_inputs),
            "n_inputs": sig.n_inputs, "outputs": outputs, "out_spec": treespec_dumps(sig.out_spec)}
    return repr(json.loads(json.dumps(data)))


def training_program(sig: GraphSignature, fw: PortableProgram, bw: PortableProgram | None) -> PortableProgram:
    """One self-contained program running ``fw`` (and ``bw`` for training) behind the wrapper."""
    files = {f"fw/{k}": v for k, v in fw.files.items()}
    if bw is not None:
        files.update({f"bw/{k}": v for k, v in bw.files.items()})
    src = _TRAINING_TEMPLATE.format(fw_source=fw.source, bw_source=bw.source if bw else "",
                                    sig_json=_sig_json(sig))
    requires = tuple(dict.fromkeys((*fw.requires, *(bw.requires if bw else ()))))
    return PortableProgram(src, files, requires)


def load_program(program: PortableProgram) -> Any:
    """Execute a program's source the way kiln.runtime does (for tests): returns its ``call``."""
    ns: dict[str, Any] = {"FILES": dict(program.files), "FILES_DIR": None, "__name__": "kiln_program"}
    exec(compile(program.source, "<kiln program>", "exec"), ns)
    return ns["call"]
