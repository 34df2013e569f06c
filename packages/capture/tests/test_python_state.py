"""Python-side state a traced call reads or changes (module flags and counters, methods of C
extension objects, hooks of distributed wrappers) is guarded, replayed or run in Python on every
call, never cached away: each program is called several times with fresh inputs against eager."""

from __future__ import annotations

import collections
import copy
import warnings

import torch
from torch import nn

import kiln.capture as kc


class FlagCounter(nn.Module):
    """Flips a flag and bumps a counter every call, and computes with both."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.flag = False
        self.count = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.flag = not self.flag
        self.count += 1
        y = self.lin(x)
        return y * 2 + self.count if self.flag else y - self.count


def test_flag_and_counter_follow_eager(recorder):
    torch.manual_seed(0)
    m = FlagCounter()
    e = copy.deepcopy(m)
    f = kc.optimize(m, recorder)
    for _ in range(6):
        x = torch.randn(3, 4)
        torch.testing.assert_close(f(x), e(x))
        assert (m.flag, m.count) == (e.flag, e.count)
    assert recorder.count >= 2


class ReseedsGenerator(nn.Module):
    """Calls a method of a C extension object (torch.Generator) that changes its state."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.gen.manual_seed(self.gen.initial_seed() + 1)  # no Python-side value to guard on
        return x.sin() + 1


def test_method_of_c_object_runs_every_call(recorder):
    m = ReseedsGenerator()
    f = kc.optimize(m, recorder)
    for i in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(f(x), x.sin() + 1)
        assert m.gen.initial_seed() == i + 1  # the reseed happened on this call, not only at capture


class _Opaque:
    """An object whose state changes through a C method not named like a container mutation."""

    def __init__(self) -> None:
        self.gen = torch.Generator()


def test_c_method_result_is_not_baked_in(recorder):
    box = _Opaque()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * box.gen.initial_seed()

    f = kc.optimize(fn, recorder)
    for seed in (2, 3, 7):
        box.gen.manual_seed(seed)
        x = torch.randn(3)
        torch.testing.assert_close(f(x), x * seed)


def test_grad_of_an_input_is_read_in_the_graph(recorder):
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g = y.grad  # an input's .grad: a graph input of its own (read when the graph starts), None guarded
        return x.sin() if g is None else x.sin() * g.cos()

    f = kc.optimize(fn, recorder)
    for k in range(4):
        x, y = torch.randn(4), torch.randn(4, requires_grad=True)
        y.grad = torch.randn(4) if k != 2 else None
        torch.testing.assert_close(f(x, y), fn(x, y))
    assert kc.explain(fn)(x, y).break_count == 0


def test_torch_function_and_profiler_blocks_do_not_break():
    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.profiler.record_function("block"):
            with torch._C.DisableTorchFunctionSubclass():
                y = x.sin() * 2
        return y + 1

    out = kc.explain(fn)(torch.randn(4))
    assert out.break_count == 0 and out.graph_count == 1
    f = kc.optimize(fn, lambda gm, ex: gm.forward)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(f(x), fn(x))


def _distributed_hook(module: nn.Module, args: tuple) -> None:
    module.hook_calls += 1


_distributed_hook.__module__ = "torch.distributed.fsdp.test_stand_in"  # as FSDP2's hooks are


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.hook_calls = 0
        self.register_forward_pre_hook(_distributed_hook)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sigmoid()


def test_distributed_hooks_run_every_call_with_forward_compiled(recorder):
    torch.manual_seed(0)
    inner = Hooked()
    twin = copy.deepcopy(inner)

    def fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x.cos()).relu() + 1

    f = kc.optimize(fn, recorder)
    for i in range(4):
        x = torch.randn(2, 4)
        torch.testing.assert_close(f(inner, x), fn(twin, x))
        assert inner.hook_calls == twin.hook_calls == i + 1
    assert "forward" not in inner.__dict__  # the routing is undone after each call
    # the module's own forward was captured as a graph (with the linear), not run eagerly
    assert any("linear" in str(gm.graph) for gm in recorder.graphs)


def test_pybind_method_runs_every_call(recorder):
    store = torch.distributed.HashStore()  # a pybind11 object whose add() changes and reads a counter

    def fn(x: torch.Tensor) -> torch.Tensor:
        store.add("calls", 1)
        return x + 1

    f = kc.optimize(fn, recorder)
    for i in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(f(x), x + 1)
        assert store.add("calls", 0) == i + 1


def test_defaultdict_factory_runs_every_call(recorder):
    """A ``defaultdict`` made in compiled code calls its factory (the user's function) for a missing
    key: traced, not run for real. Before, the factory ran once at capture, so the counter it bumps
    moved only on the first call and the values it returned were constants of the graph."""
    made = [0]

    def factory():
        made[0] += 1
        return made[0]

    def f(x):
        d = collections.defaultdict(factory)
        return x * d["a"] + d["b"] + d["a"]
    opt = kc.optimize(f, recorder)
    for start in (0, 5, 9):
        x = torch.randn(3)
        made[0] = start
        want = f(x)
        made[0] = start
        torch.testing.assert_close(opt(x), want)
        assert made[0] == start + 2


def test_defaultdict_from_outside_reads_a_missing_key(recorder):
    """A ``defaultdict`` passed in (GradScaler's ``_per_optimizer_states``, keyed by ``id(optimizer)``) and
    read at a key it lacks: the traced copy lost its factory, so the read raised KeyError and the frame ran
    eagerly for good. Its factory now runs, and the new key is written back to the caller's dict."""
    def f(x, d, k):
        entry = d[k]
        entry["seen"] += 1
        return x * entry["scale"] + entry["seen"]

    def fresh() -> dict:
        return {"scale": 2.0, "seen": 0}
    opt = kc.optimize(f, recorder)
    ours, theirs = collections.defaultdict(fresh), collections.defaultdict(fresh)
    for k in (1, 2, 1, 3):
        x = torch.randn(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = opt(x, ours, k)
        assert not [w for w in caught if "EAGERLY" in str(w.message)], [str(w.message) for w in caught]
        torch.testing.assert_close(got, f(x, theirs, k))
        assert ours == theirs and ours.default_factory is fresh


class _CountingProperty(nn.Module):
    """A property whose getter has effects: it counts its reads and steps a buffer in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("steps", torch.zeros(()))
        self.reads = 0

    @property
    def scaled(self) -> torch.Tensor:
        self.reads += 1
        self.steps.add_(1)
        return self.lin.weight * self.steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.scaled


def test_module_property_getter_runs_once_per_call(recorder):
    """``self.scaled`` on a module was read for real, once for the guards and once for the graph's
    inputs (and once more by the capture): its effects ran two or three times a call. A spectral-norm
    parametrization's power iteration (``self.weight``) ran that many times per training step. The getter
    is traced now, its effects part of the graph."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    for make in (_CountingProperty, lambda: parametrizations.spectral_norm(nn.Linear(6, 3))):
        model = make()
        eager = copy.deepcopy(model)
        opt = kc.optimize(model, recorder)
        for _ in range(4):
            x = torch.randn(2, 3 if isinstance(model, _CountingProperty) else 6)
            torch.testing.assert_close(opt(x), eager(x))
            for (name, b), c in zip(model.named_buffers(), eager.buffers()):
                torch.testing.assert_close(b, c, msg=name)
        assert getattr(model, "reads", 0) == getattr(eager, "reads", 0)


class _Settings:
    """A plain object whose property counts its reads and computes with the count."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w, self.n = w, 0

    @property
    def weight(self) -> torch.Tensor:
        self.n += 1
        return self.w * self.n


def test_object_property_getter_runs_once_per_call(recorder):
    """The same for any object from outside: the getter ran twice a call, and the graph computed with the
    value of the second read (the output used ``n`` one ahead of eager's)."""
    def f(x, settings):
        return x * settings.weight
    opt = kc.optimize(f, recorder)
    w = torch.randn(3)
    ours, theirs = _Settings(w), _Settings(w.clone())
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(opt(x, ours), f(x, theirs))
        assert ours.n == theirs.n
