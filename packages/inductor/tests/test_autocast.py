"""Compiling while the caller's torch.autocast is on (kiln compiles on the first call, inside it).

The ATen graph already holds autocast's casts and the compiled graph runs with autocast off, so every
extern kernel must see exactly the dtypes the graph's ``meta['val']`` says: a float32 bmm (BERT's SDPA
math path under CUDA AMP) must not be re-cast to bfloat16 while compiling.
"""

from __future__ import annotations

import contextlib

import torch
from helpers import STRICT, assert_close
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import flat_outputs, trace

from kiln.inductor import compile_graph
from kiln.inductor.ir.nodes import ExternKernel, ListArg, TensorRef

MATMULS = {"aten.mm.default", "aten.bmm.default", "aten.addmm.default"}


def _attention(x, wq, bq, wk, wv):
    # what autocast traces: bf16 linears, then a float32 attention core (SDPA's math path upcasts)
    bf = torch.bfloat16
    q = torch.nn.functional.linear(x.to(bf), wq.to(bf), bq.to(bf))
    k = torch.nn.functional.linear(x.to(bf), wk.to(bf))
    v = torch.nn.functional.linear(x.to(bf), wv.to(bf))
    s = torch.bmm(q.float(), k.float().transpose(1, 2)).softmax(-1)
    return torch.bmm(s, v.float()).to(bf).float().pow(2).sum()


def _args():
    torch.manual_seed(0)
    return [torch.randn(2, 8, 16), torch.randn(16, 16), torch.randn(16), torch.randn(16, 16), torch.randn(16, 16)]


def _refs(args):
    for a in args:
        if isinstance(a, TensorRef):
            yield a
        elif isinstance(a, ListArg):
            yield from _refs(a.items)


def _assert_extern_dtypes_match_graph(gm, cg):
    want = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target) in MATMULS:
            ins = [a.meta["val"].dtype for a in n.args if hasattr(a, "meta")]
            want.append((str(n.target), ins, n.meta["val"].dtype))
    prog = cg.loop_program
    layouts = prog.layouts()
    got = []
    for node in prog.nodes:
        if isinstance(node, ExternKernel) and node.target in MATMULS:
            refs = list(_refs(node.args))
            for r in refs:  # a view of a buffer has the buffer's dtype
                assert r.dtype == layouts[r.buffer].dtype, node.as_text()
            got.append((node.target, [r.dtype for r in refs], node.outputs[0].layout.dtype))
    assert want and got == want


@contextlib.contextmanager
def _autocast_on(device: str):
    # torch.autocast("cuda") disables itself without a GPU; the dispatcher's state is what matters
    prev = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    torch.set_autocast_enabled(device, True)
    torch.set_autocast_dtype(device, torch.bfloat16)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device, prev[0])
        torch.set_autocast_dtype(device, prev[1])


def test_compile_under_cpu_autocast_keeps_traced_dtypes():
    args = _args()
    gm = trace(_attention, *args)
    with _autocast_on("cpu"):
        cg = compile_graph(gm, args, options=STRICT)
    _assert_extern_dtypes_match_graph(gm, cg)
    got = cg.fn(*args)  # the runtime wrapper runs compiled graphs with autocast off
    assert_close(got[0], flat_outputs(_attention(*args))[0], atol=1e-2, rtol=1e-2)


def test_cross_compile_for_cuda_under_cuda_autocast_keeps_traced_dtypes():
    args = _args()
    gm = trace(_attention, *args)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda") for a in args]
        for n in gm.graph.nodes:  # re-describe the graph for the target device
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                n.meta["val"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
        with _autocast_on("cuda"):
            cg = compile_graph(gm, fakes)
    _assert_extern_dtypes_match_graph(gm, cg)
    assert "device='cuda'" in cg.portable.source


def test_graph_without_meta_compiled_under_autocast_keeps_its_dtypes():
    # hand-built graphs get meta['val'] by running them on fake tensors: with autocast off, too
    args = _args()
    gm = trace(_attention, *args)
    for n in gm.graph.nodes:
        n.meta.pop("val", None)
    with _autocast_on("cpu"):
        cg = compile_graph(gm, args, options=STRICT)
    _assert_extern_dtypes_match_graph(gm, cg)
    assert_close(cg.fn(*args)[0], flat_outputs(_attention(*args))[0], atol=1e-2, rtol=1e-2)
