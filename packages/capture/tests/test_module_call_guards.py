"""How a module call is traced depends on the module's hooks, the global module hooks and which
``forward`` it has; all three are guarded, so a hook registered (or removed) after the capture, or an
instance ``forward`` set later, changes what the compiled function does exactly as it changes eager.
Fresh inputs on every call, compared with eager."""

import torch
from torch import nn

import kiln.capture as kc

from .conftest import Recorder

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(3, 3), nn.ReLU())


def f(x):
    return MODEL(x) + 1


def _same(opt):
    x = torch.randn(2, 3)
    torch.testing.assert_close(opt(x), f(x), rtol=0, atol=0)


def test_hooks_and_forward_changed_between_calls():
    kc.reset()
    opt = kc.optimize(f, Recorder(), recompile_limit=20)
    _same(opt)
    h = MODEL[0].register_forward_hook(lambda mod, args, out: out * 0 - 5)
    _same(opt)
    _same(opt)
    h.remove()
    _same(opt)
    h = MODEL.register_forward_pre_hook(lambda mod, args: (args[0] * 100,))
    _same(opt)
    h.remove()
    _same(opt)
    MODEL[0].forward = lambda inp: inp * 7
    _same(opt)
    del MODEL[0].forward
    _same(opt)
    g = nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out + 1000 if isinstance(mod, nn.ReLU) else None)
    try:
        _same(opt)
    finally:
        g.remove()
    _same(opt)


def test_a_hook_added_then_kept_compiles_once_more():
    kc.reset()
    rec = Recorder()
    m = nn.Linear(3, 3)

    def g(x):
        return m(x).tanh()
    opt = kc.optimize(g, rec)
    x = torch.randn(2, 3)
    torch.testing.assert_close(opt(x), g(x))
    m.register_forward_hook(lambda mod, args, out: out * 3)
    for _ in range(4):
        x = torch.randn(2, 3)
        torch.testing.assert_close(opt(x), g(x))
    assert rec.count == 2, rec.count
