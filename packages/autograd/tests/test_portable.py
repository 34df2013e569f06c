"""Portable programs: the compiled forward/backward and the autograd wrapper as self-contained Python."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from torch import fx

from kiln.autograd import aot_eager, load_program, render_graph_module


def _f(x, w, b):  # type: ignore[no-untyped-def]
    b.add_(1)
    y = torch.relu(x @ w) + torch.ones_like(x[0]).cumsum(0)
    return y.sum(), y.t(), x[0]


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g).requires_grad_(), torch.zeros(3)]


def test_training_program_matches_compiled() -> None:
    x, w, b = _inputs()
    c = aot_eager(fx.symbolic_trace(_f), [x, w, b])
    prog = c.portable
    assert prog is not None
    # the wrapper code is kiln.runtime's (imported, not compiled per program); nothing else of kiln
    assert "from kiln.runtime.program_helpers import autograd_program" in prog.source
    head = prog.source.split("FW_SOURCE")[0]  # the parts come after: they define their own functions
    assert "class " not in head and "def " not in head
    assert [ln for ln in prog.source.splitlines() if "kiln" in ln and "import" in ln] == [
        "from kiln.runtime.program_helpers import autograd_program"]
    assert "kiln.runtime" in prog.requires
    call = load_program(prog)
    w2 = w.detach().clone().requires_grad_()
    b2 = b.clone()
    s1, t1, r1 = c(x, w, b)
    s2, t2, r2 = call([x, w2, b2])
    torch.testing.assert_close(s2, s1)
    torch.testing.assert_close(t2, t1)
    assert r2.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # alias rebuilt
    torch.testing.assert_close(b2, b)  # input mutation written back
    s1.backward()
    s2.backward()
    torch.testing.assert_close(w2.grad, w.grad)


def test_program_runs_in_fresh_process_without_the_compiler(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x, w, b = _inputs()
    prog = aot_eager(fx.symbolic_trace(_f), [x, w, b]).portable
    assert prog is not None
    (tmp_path / "prog.py").write_text(prog.source)
    for name, data in prog.files.items():
        (tmp_path / name.replace("/", "__")).write_bytes(data)
    script = textwrap.dedent(f"""
        import sys, pathlib, torch
        for stage in ('kiln.capture', 'kiln.autograd', 'kiln.decomp', 'kiln.inductor'):
            sys.modules[stage] = None  # the program needs kiln.runtime only
        root = pathlib.Path({str(tmp_path)!r})
        files = {{p.name.replace('__', '/'): p.read_bytes() for p in root.iterdir() if p.name != 'prog.py'}}
        ns = {{'FILES': files, 'FILES_DIR': str(root)}}
        exec(compile((root / 'prog.py').read_text(), 'prog', 'exec'), ns)
        x = torch.ones(4, 4); w = torch.ones(4, 4, requires_grad=True); b = torch.zeros(3)
        s, t, r = ns['call']([x, w, b])
        s.backward()
        print(float(s), float(w.grad.sum()), float(b.sum()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["104.0", "64.0", "3.0"]


def test_graph_constants_travel_as_files() -> None:
    captured = []

    def be(gm, ex):  # type: ignore[no-untyped-def]
        c = aot_eager(gm, ex)
        captured.append(c)
        return c

    def f(x):  # type: ignore[no-untyped-def]
        return x * torch.tensor([1.0, 2.0, 3.0])
    torch._dynamo.reset()
    x = torch.randn(3, requires_grad=True)
    torch.compile(f, backend=be, dynamic=False)(x)
    prog = captured[0].portable
    assert prog is not None and prog.files
    out = load_program(prog)([x])
    torch.testing.assert_close(out[0], f(x))


def test_inference_program() -> None:
    gm = fx.symbolic_trace(lambda x: (x.sin() * 2,))
    with torch.no_grad():
        c = aot_eager(gm, [torch.randn(3)])
    call = load_program(c.portable)
    x = torch.randn(3)
    torch.testing.assert_close(call([x])[0], x.sin() * 2)


def test_render_graph_module_defines_call() -> None:
    gm = fx.symbolic_trace(lambda x: (x.cos(),))
    prog = render_graph_module(gm)
    assert "def call(args)" in prog.source
