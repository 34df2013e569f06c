"""``opt.step()`` of torch.optim optimizers compiled by kiln.compile while an lr scheduler changes the learning
rate (and OneCycleLR Adam's beta1) every step: the scheduler's wrapper of ``optimizer.step`` is inlined (its
``_opt_called`` write replayed after the graph, so ``scheduler.step()`` does not warn), ``p.grad`` and
``opt.state[p]`` are graph inputs, the floats the step reads from ``param_groups`` are symbolic after they
first change, and parameters and optimizer state equal eager's after every step.

The first step runs in Python (the optimizer creates its state there: a visible graph break); the second
captures the step with every float that changed since already symbolic, so one compiled graph serves all
later steps."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kiln

OPTIMIZERS = {
    "sgd": lambda ps, foreach: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=foreach),
    "adam": lambda ps, foreach: torch.optim.Adam(ps, lr=0.01, foreach=foreach),
    "adamw": lambda ps, foreach: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01, foreach=foreach),
}
SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1.0 / (epoch + 1)),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20),  # betas change too
}
STEPS = 8


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _check_equal(model, ref, opt, ref_opt, step: int) -> None:
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, msg=lambda m, n=name: f"step {step}, {n}: {m}")
        assert opt.state[p].keys() == ref_opt.state[q].keys()
        for k, v in ref_opt.state[q].items():
            torch.testing.assert_close(opt.state[p][k], v, msg=lambda m, n=name, k=k: f"step {step}, {n} {k}: {m}")


def _train(optimizer: str, foreach: bool, scheduler: str, whole_step: bool) -> kiln.CompileStats:
    """STEPS steps of kiln and of eager side by side (fresh inputs each), compared after every step."""
    torch.manual_seed(0)
    model = _model()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[optimizer](model.parameters(), foreach), OPTIMIZERS[optimizer](ref.parameters(), foreach)
    schedule, ref_schedule = SCHEDULERS[scheduler](opt), SCHEDULERS[scheduler](ref_opt)

    def step() -> None:
        opt.step()

    def train_step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    kiln.reset()
    kiln.stats_reset()
    compiled_step, compiled_train_step = kiln.compile(step), kiln.compile(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(STEPS):
            x = torch.randn(4, 6)
            if whole_step:
                loss = compiled_train_step(model, x)
                ref_loss = ref(x).square().mean()
                ref_loss.backward()
                ref_opt.step()
                ref_opt.zero_grad()
                torch.testing.assert_close(loss, ref_loss)
            else:
                for m in (model, ref):
                    m.zero_grad()
                    m(x).square().mean().backward()
                compiled_step()
                ref_opt.step()
            schedule.step()
            ref_schedule.step()
            assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
            _check_equal(model, ref, opt, ref_opt, i)
    # torch's scheduler warns when the wrapper's ``_opt_called`` write was lost
    assert [str(w.message) for w in caught if "lr_scheduler" in str(w.message)] == []
    return kiln.stats()


@pytest.mark.slow
@pytest.mark.parametrize("foreach", [False, True], ids=["single_tensor", "foreach"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_optimizer_step_under_step_lr(optimizer, foreach):
    s = _train(optimizer, foreach, "step", whole_step=False)
    # the first step's break (state created in Python), then one graph with lr symbolic for every later step
    assert s.graphs_captured <= 2 and s.graphs_compiled <= 2, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["cosine", "lambda", "onecycle"])
def test_adam_step_under_each_scheduler(scheduler):
    s = _train("adam", True, scheduler, whole_step=False)
    assert s.graphs_captured <= 2 and s.graphs_compiled <= 2, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer", "foreach", "scheduler"),
                         [("sgd", False, "step"), ("adamw", True, "cosine"), ("adam", False, "onecycle")])
def test_train_step_with_backward_and_step_inside(optimizer, foreach, scheduler):
    """forward, backward, opt.step(), opt.zero_grad() in one compiled function, the scheduler stepped outside:
    backward() breaks the graph; the forward and the resumed optimizer step are each compiled."""
    s = _train(optimizer, foreach, scheduler, whole_step=True)
    assert s.graphs_compiled <= 4, s  # the forward and the optimizer step, each at most twice
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


def test_first_step_break_is_named_by_explain():
    """The step that creates the optimizer's state runs in Python, and explain() says why."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randn(2, 6)).sum().backward()

    def step() -> None:
        opt.step()

    out = kiln.explain(step)()
    # named as the first step's state creation, or (as CI's run saw) as the call of Adam._init_group, which
    # torch marks to run outside compiled code: either way the break says where the state is made
    assert any("first step" in b.reason or "_init_group" in b.reason for b in out.break_reasons), out


def test_grad_scaler_step_is_traced_not_run_eagerly():
    """A train step with ``torch.amp.GradScaler("cpu")``: ``scaler.step`` reads the scaler's
    ``_per_optimizer_states[id(optimizer)]``, a defaultdict, at a key it lacks. The traced copy had lost the
    factory, so tracing raised KeyError and the frame ran eagerly for good (with a warning). Parameters
    and the scale equal eager's every step, a step with an inf gradient skipped by both."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    eager = copy.deepcopy(model)
    opt, eager_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager))
    scaler, eager_scaler = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2) for _ in range(2))

    def step(m, o, s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x).float().pow(2).mean()
        s.scale(loss).backward()
        s.step(o)
        s.update()
        o.zero_grad()
        return loss.detach()
    compiled = kiln.compile(step, backend="aot_eager")
    for i in range(5):
        x = torch.randn(4, 6)
        if i == 2:
            x[0, 0] = float("inf")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(model, opt, scaler, x)
        assert not [w for w in caught if "EAGERLY" in str(w.message)], [str(w.message) for w in caught]
        step(eager, eager_opt, eager_scaler, x)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, msg=lambda m, i=i: f"step {i}: {m}")
        assert scaler.get_scale() == eager_scaler.get_scale()
