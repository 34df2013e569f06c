"""The fast Triton launcher (codegen/triton/launcher.py): triton's own path first, then the binary
directly while triton's specialisation still holds. GPU tests check results, that the fast path is
taken, and that an input with another alignment goes back through triton's path."""

from __future__ import annotations

import os

import pytest
import torch

from kiln.inductor import compile_graph
from kiln.inductor.codegen.triton.launcher import KilnLaunch, launch_context


def test_launch_context_without_cuda_initialised_is_the_slow_path_marker() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA already initialised in this process")
    assert launch_context() == (-1, 0, False)


def test_launcher_without_a_binary_stays_on_triton_path() -> None:
    calls = []

    class FakeJit:
        arg_names = ["a", "XBLOCK"]

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                calls.append((grid, args, kwargs))
                return None  # the interpreter returns no binary
            return run

    launch = KilnLaunch(FakeJit(), {"XBLOCK": 8}, 1)
    launch((1, 1, 1), (-1, 0), 5)
    launch((1, 1, 1), (-1, 0), 5)
    assert len(calls) == 2 and launch.run is None
    assert calls[0][2] == {"XBLOCK": 8, "num_warps": 1, "num_stages": 1}


def _fx_mul_add():
    from torch import fx

    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    out = g.call_function(torch.ops.aten.add.Tensor, (g.call_function(torch.ops.aten.mul.Tensor, (x, y)), 1.0))
    g.output((out,))
    return fx.GraphModule({}, g)


def _wrapper_globals(fn):
    """The generated wrapper module's namespace behind a compiled graph's callable (a closure, or an
    object holding the wrapper's ``call`` -- one that waits for pooled kernels holds another)."""
    while not hasattr(fn, "__globals__"):
        inner = getattr(fn, "call", None)
        fn = inner if inner is not None else next(c.cell_contents for c in fn.__closure__ if callable(c.cell_contents))
    return fn.__globals__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_path_is_taken_and_alignment_changes_go_back_through_triton() -> None:
    gm = _fx_mul_add()
    base = torch.randn(4097, device="cuda")
    y = torch.randn(4096, device="cuda")
    x = base[:4096]
    compiled = compile_graph(gm, [x, y])
    for _ in range(3):
        torch.testing.assert_close(compiled.fn(x, y)[0], x * y + 1)
    launchers = [v for v in _wrapper_globals(compiled.fn).values() if type(v).__name__ == "KilnLaunch"]
    assert launchers and all(launch.run is not None for launch in launchers), "fast path not adopted"
    shifted = base[1:]  # 4-byte offset: triton specialised the kernel on 16-byte alignment
    torch.testing.assert_close(compiled.fn(shifted, y)[0], shifted * y + 1)
    torch.testing.assert_close(compiled.fn(x, y)[0], x * y + 1)


def test_triton_launch_hooks_are_not_reported_installed_by_default() -> None:
    """triton >= 3.5 keeps empty HookChain objects: empty chains must not disable the fast path."""
    pytest.importorskip("triton")
    from kiln.inductor.codegen.triton.launcher import hooks_installed

    assert hooks_installed() is False


class _Launcher36:
    """The shape of triton 3.6's CudaLauncher: a Python __call__ in front of the C launch."""

    def __init__(self, scratch: int = 0) -> None:
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls: list[tuple] = []
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803 - triton's names
        global_scratch = profile_scratch = None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    global_scratch, profile_scratch, *args)


class _LauncherOther(_Launcher36):
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    args[0], None, None)


def test_direct_launch_passes_what_triton_would_pass() -> None:
    from kiln.inductor.codegen.triton.launcher import direct_launch

    run = _Launcher36()
    direct = direct_launch(run)
    assert direct is not None
    direct(4, 1, 1, 7, "fn", "meta", None, None, None, "a0", 3)
    run(4, 1, 1, 7, "fn", "meta", None, None, None, "a0", 3)
    assert run.calls[0] == run.calls[1]


def test_direct_launch_sets_the_pdl_attribute_a_launcher_asks_for() -> None:
    """codegen/triton/pdl.py: a kernel that waits for the previous one is launched with the attribute even
    though triton compiled it without (the attribute is the launch's, not the binary's)."""
    from kiln.inductor.codegen.triton.launcher import direct_launch

    run = _Launcher36()
    run.launch_pdl = False
    for pdl in (False, True):
        direct = direct_launch(run, pdl)
        assert direct is not None
        direct(4, 1, 1, 7, "fn", "meta", None, None, None, "a0")
    assert [c[6] for c in run.calls] == [False, True]


def test_direct_launch_declines_scratch_and_other_launcher_shapes() -> None:
    from kiln.inductor.codegen.triton.launcher import direct_launch

    assert direct_launch(_Launcher36(scratch=64)) is None  # needs scratch memory: triton allocates it
    assert direct_launch(_LauncherOther()) is None  # another argument order (triton 3.9's, say)
    assert direct_launch(object()) is None


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="compiles with cpu_backend='triton', which runs CPU tensors through the interpreter")
def test_wrapper_precompiles_static_kernels_with_their_pointer_dtypes() -> None:
    from tracer import trace

    from kiln.inductor import InductorOptions
    from kiln.inductor.codegen.triton.launcher import precompile

    x = torch.randn(8, 16)
    fn = lambda x: (torch.softmax(x, -1) * 2, x.sum(0).to(torch.bfloat16))  # noqa: E731
    cg = compile_graph(trace(fn, x), [x], options=InductorOptions(cpu_backend="triton"))
    line = next(ln for ln in cg.texts["output_code"].splitlines() if ln.startswith("_kiln_precompile("))
    assert "_launch_k" in line and "torch.float32" in line and "torch.bfloat16" in line, line

    class Launch:  # under the interpreter (or without CUDA) nothing is compiled ahead
        fn = None

    precompile([(Launch(), (torch.float32,)), (Launch(), (torch.float32,))])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="compiles with cpu_backend='triton', which runs CPU tensors through the interpreter")
def test_program_declares_the_kernel_module_it_imports() -> None:
    """The portable program says which Triton kernel module its wrapper imports
    (PortableProgram.triton_modules): what kiln.runtime ships binaries of, without reading the source."""
    import sys

    from tracer import trace

    from kiln.inductor import InductorOptions
    from kiln.runtime import collect_triton_binaries

    x = torch.randn(8, 16)
    cg = compile_graph(trace(lambda x: (torch.softmax(x, -1) * 2,), x), [x], options=InductorOptions(cpu_backend="triton"))
    assert cg.portable is not None
    (name,) = cg.portable.triton_modules
    torch.testing.assert_close(cg.fn(x)[0], torch.softmax(x, -1) * 2)
    assert name.startswith("kiln_triton_") and name in sys.modules  # the module the wrapper imported
    assert collect_triton_binaries(cg.portable.triton_modules) == {}  # the interpreter compiles nothing
