"""The pipeline as a table (pipeline.py): one stage list per backend, chosen once per compile; the frozen
compile state; the graph level's verifier after every graph pass; code generation apart from autotune."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import check
from tracer import trace

from kiln.graph import Pass, VerificationError, VerifyAfterPass, run_pipeline
from kiln.inductor import InductorOptions, decomp_bridge
from kiln.inductor.codegen.cpp import CppBackend
from kiln.inductor.codegen.triton.backend import TritonBackend
from kiln.inductor.graph_passes.verify import verify_graph
from kiln.inductor.passes import CompileState, matmul_templates
from kiln.inductor.pipeline import (
    CPP_STAGES,
    TRITON_STAGES,
    choose_backend,
    stages_for,
    verify_state,
)

GRAPH = ["propagate_meta", "decompose", "cse"]
LOOPS = ["lower", "remove_dead_code"]
CODE = ["generate_kernels", "generate_wrapper"]


def _names(stages: tuple) -> list[str]:
    return [p.name for p in stages]


def test_each_backend_has_its_stage_list() -> None:
    assert _names(CPP_STAGES) == [*GRAPH, "conv_layout", "reinplace", *LOOPS, "fuse_and_plan", "inplace_updates",
                                  "group_kernels", *CODE]
    assert _names(TRITON_STAGES) == [*GRAPH, "patch_convs", "conv_layout", "pad_stems", "conv_bias", "small_matmuls",
                                     "pad_matmuls", "reinplace", "lower", "index_width", "recompute_scalars", "remove_dead_code",
                                     "split_reductions", "fuse_and_plan", "decode_attention",
                                     "misaligned_matmuls", "matmul_templates", "inplace_updates", "group_kernels",
                                     *CODE]
    assert all(p.doc for p in (*CPP_STAGES, *TRITON_STAGES))  # every row says what it does


def test_the_backend_is_chosen_from_inputs_and_options() -> None:
    x = torch.randn(2)
    assert isinstance(choose_backend([x], InductorOptions()), CppBackend)
    triton_cpu = choose_backend([x], InductorOptions(cpu_backend="triton"))
    assert isinstance(triton_cpu, TritonBackend) and triton_cpu.device == "cpu"
    with torch._subclasses.fake_tensor.FakeTensorMode():
        on_cuda = torch.empty(2, device="cuda")  # fake: no GPU needed
    cuda = choose_backend([x, on_cuda], InductorOptions())
    assert isinstance(cuda, TritonBackend) and cuda.device == "cuda"
    assert stages_for(cuda) is TRITON_STAGES and stages_for(CppBackend()) is CPP_STAGES
    with pytest.raises(ValueError, match="cpu_backend='fortran'"):
        choose_backend([x], InductorOptions(cpu_backend="fortran"))


def test_a_cpp_compile_runs_the_cpp_stages_in_order() -> None:
    x = torch.randn(4, 8)
    for _ in range(3):  # fresh inputs each time, compared with eager
        cg = check(lambda a: torch.softmax(a, -1) * 2, x)
        ran = [line.split()[0] for line in cg.texts["timings"].splitlines()[:-1]]
        assert ran == _names(CPP_STAGES)
        x = torch.randn(4, 8)


def test_compile_state_is_frozen() -> None:
    gm = trace(lambda a: a + 1, torch.randn(3))
    s = CompileState(gm, (torch.randn(3),), InductorOptions(), "g", CppBackend())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "other"  # type: ignore[misc]
    assert s.with_text("k", "v").texts == {"k": "v"} and s.texts == {}


def test_a_triton_pass_refuses_a_cpp_compile() -> None:
    gm = trace(lambda a: a + 1, torch.randn(3))
    s = CompileState(gm, (torch.randn(3),), InductorOptions(max_autotune=True), "g", CppBackend())
    s = dataclasses.replace(s, scheduled=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Triton pass ran in a cpp compile"):
        matmul_templates(s)


def _decomposed(fn, *inputs: torch.Tensor):
    gm = trace(fn, *inputs)
    decomp_bridge.ensure_meta(gm, list(inputs))
    return decomp_bridge.decompose(gm, list(inputs))


def test_graph_verifier_accepts_what_the_graph_passes_make() -> None:
    gm = _decomposed(lambda x, w: F.gelu(F.linear(x, w)).softmax(-1), torch.randn(4, 8), torch.randn(5, 8))
    verify_graph(gm)


def test_graph_verifier_names_a_node_without_its_fake_value() -> None:
    gm = _decomposed(lambda x: x.relu() + 1, torch.randn(4))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_after(node):  # a rewrite that forgot to propagate metadata
        new = gm.graph.call_function(torch.ops.aten.neg.default, (node,))
    node.replace_all_uses_with(new, delete_user_cb=lambda u: u is not new)
    gm.recompile()
    with pytest.raises(VerificationError, match=f"%{new.name}.*no meta\\['val'\\]"):
        verify_graph(gm)


def test_graph_verifier_refuses_methods_and_prims() -> None:
    gm = _decomposed(lambda x: x * 2, torch.randn(4))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = torch.ops.prims.mul.default
    with pytest.raises(VerificationError, match="namespace 'prims'"):
        verify_graph(gm)
    node.op, node.target = "call_method", "mul"
    with pytest.raises(VerificationError, match="call_method"):
        verify_graph(gm)


def _forgets_meta(s: CompileState, _: object) -> CompileState:
    """A graph pass that adds a node and does not propagate its fake value."""
    out = next(n for n in s.gm.graph.nodes if n.op == "output")
    with s.gm.graph.inserting_before(out):
        neg = s.gm.graph.call_function(torch.ops.aten.neg.default, (out.args[0][0],))
    out.args = ((neg,),)
    s.gm.recompile()
    return s


def test_the_graph_is_verified_after_each_graph_pass() -> None:
    """Under verify, a graph pass that breaks the graph level's contract fails, naming the pass."""
    x = torch.randn(4)
    state = CompileState(trace(lambda a: a + 1, x), (x,), InductorOptions(), "g", CppBackend())
    stages = (*CPP_STAGES[:2], Pass("forgets_meta", _forgets_meta), *CPP_STAGES[2:])
    with pytest.raises(VerificationError, match="after pass 'forgets_meta'.*no meta"):
        run_pipeline(stages, state, None, [VerifyAfterPass(verify_state)])


def test_code_generation_imports_nothing_of_autotune() -> None:
    """The Triton backend takes a KernelTuner; autotune builds on codegen, never the other way round."""
    import kiln.inductor.codegen as codegen

    root = Path(codegen.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "autotune" in (node.module or ""):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU needs TRITON_INTERPRET=1")
def test_a_triton_compile_runs_the_triton_stages_in_order() -> None:
    x = torch.randn(4, 8)
    cg = check(lambda a: torch.softmax(a, -1) * 2, x, options=InductorOptions(cpu_backend="triton", strict_lowering=True))
    ran = [line.split()[0] for line in cg.texts["timings"].splitlines()[:-1]]
    assert ran == _names(TRITON_STAGES)
