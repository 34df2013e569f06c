"""Capture time (GPT-2 12 layers, BERT-base; backend = eager) and hit-path overhead, kiln vs
torch.compile, measured in one run. Usage: uv run python packages/capture/benchmarks/capture_bench.py"""

from __future__ import annotations

import time
import timeit

import torch
from torch import nn

import kiln.capture as kc


def _eager_backend(gm, example_inputs):
    return gm.forward


def first_call_seconds(make_compiled, model, args) -> float:
    compiled = make_compiled(model)
    t = time.perf_counter()
    with torch.no_grad():
        compiled(*args)
    return time.perf_counter() - t


def capture_times() -> None:
    import transformers as tf

    torch.manual_seed(0)
    models = {
        "gpt2-12L": (tf.GPT2Model(tf.GPT2Config()).eval(), (torch.randint(0, 1000, (1, 64)),)),
        "bert-base": (tf.BertModel(tf.BertConfig()).eval(), (torch.randint(0, 1000, (1, 64)),)),
    }
    for name, (model, args) in models.items():
        with torch.no_grad():
            model(*args)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(*args)
        eager = time.perf_counter() - t0
        k = first_call_seconds(lambda m: kc.optimize(m.forward, _eager_backend), model, args) - eager
        c = first_call_seconds(lambda m: torch.compile(m, backend="eager"), model, args) - eager
        print(f"capture {name:10s} kiln {k:6.2f}s   torch.compile(backend=eager) {c:6.2f}s")


def _best(fn, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6


def overhead() -> None:
    def f(x, y):
        return x + y
    graphs = []

    def rec(gm, ex):
        graphs.append(gm)
        return gm.forward
    x, y = torch.randn(4), torch.randn(4)
    g = kc.optimize(f, rec)
    g(x, y)
    direct = _best(lambda: graphs[0].forward(x, y), 20000)
    kiln = _best(lambda: g(x, y), 20000) - direct
    tgraphs = []
    tc = torch.compile(f, backend=lambda gm, ex: (tgraphs.append(gm), gm.forward)[1])
    tc(x, y)
    tdirect = _best(lambda: tgraphs[0].forward(x, y), 20000)
    tcomp = _best(lambda: tc(x, y), 20000) - tdirect
    print(f"overhead f(x, y):          kiln {kiln:6.2f}us   torch.compile {tcomp:6.2f}us")

    m = nn.Sequential(*[nn.Linear(2, 2) for _ in range(50)])  # 100 parameters
    graphs.clear()
    gm_ = kc.optimize(m.forward, rec)
    xx = torch.randn(1, 2)
    gm_(xx)
    params = list(m.parameters())
    direct = _best(lambda: graphs[0].forward(xx, *params), 2000)
    kiln = _best(lambda: gm_(xx), 2000) - direct
    tm = torch.compile(m, backend="eager")
    tm(xx)
    eager = _best(lambda: m(xx), 2000)
    tcomp = _best(lambda: tm(xx), 2000) - eager
    print(f"overhead module(100 params): kiln {kiln:6.2f}us   torch.compile {tcomp:6.2f}us (vs eager call)")


if __name__ == "__main__":
    overhead()
    capture_times()
