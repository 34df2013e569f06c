"""Joint tracing + partitioning time: kiln.autograd.aot_eager vs torch's aot_eager on the same dynamo graph,
plus saved-activation bytes (min-cut, save-all). Usage: uv run python packages/autograd/benchmarks/bench_trace.py [layers]

Both backends are warmed up first on a 1-layer GPT-2 graph (one-time imports and caches), then each
model's graph is compiled by each backend in turn, ``REPEAT`` times; the table gives the median."""

from __future__ import annotations

import statistics
import sys
import time

import torch
import transformers
from torch._dynamo.backends.debugging import aot_eager as torch_aot_eager

from kiln.autograd import aot_eager, partition


def capture(model, inputs):  # type: ignore[no-untyped-def]
    graphs = []

    def be(gm, ex):  # type: ignore[no-untyped-def]
        graphs.append((gm, ex))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(model, backend=be, dynamic=False)(*inputs)
    return max(graphs, key=lambda g: len(g[0].graph.nodes))


REPEAT = 3


def _timed(fn, gm, ex):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(gm, ex)
    return time.perf_counter() - t0, out


def main(layers: int) -> None:
    torch.manual_seed(0)
    warm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2))
    wgm, wex = capture(warm.train(), (torch.randint(0, 1000, (1, 8)),))
    aot_eager(wgm, wex)
    torch_aot_eager(wgm, wex)
    models = {
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=layers, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)),
        "bert": transformers.BertForMaskedLM(transformers.BertConfig(num_hidden_layers=layers, hidden_dropout_prob=0, attention_probs_dropout_prob=0)),
    }
    print(f"| model ({layers} layers) | graph nodes | kiln aot_eager s | torch aot_eager s | kiln / torch "
          "| min-cut MB | save-all MB |")
    print("|---|---|---|---|---|---|---|")
    for name, m in models.items():
        ids = torch.randint(0, 1000, (2, 128))
        gm, ex = capture(m.train(), (ids,))
        kiln_s, torch_s = [], []
        for _ in range(REPEAT):
            t, c = _timed(aot_eager, gm, ex)
            kiln_s.append(t)
            torch_s.append(_timed(torch_aot_eager, gm, ex)[0])
        t_kiln, t_torch = statistics.median(kiln_s), statistics.median(torch_s)
        mc = c.aot.partitioned.saved_bytes / 2**20
        sa = partition(c.aot.joint, "save_all").saved_bytes / 2**20
        print(f"| {name} | {len(gm.graph.nodes)} | {t_kiln:.2f} | {t_torch:.2f} | {t_kiln / t_torch:.2f} | {mc:.1f} | {sa:.1f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
