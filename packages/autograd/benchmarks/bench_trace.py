"""Joint tracing + partitioning time: kiln.autograd.aot_eager vs torch's aot_eager on the same dynamo graph,
plus saved-activation bytes (min-cut, save-all). Usage: uv run python packages/autograd/benchmarks/bench_trace.py [layers]"""

from __future__ import annotations

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


def main(layers: int) -> None:
    torch.manual_seed(0)
    models = {
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=layers, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)),
        "bert": transformers.BertForMaskedLM(transformers.BertConfig(num_hidden_layers=layers, hidden_dropout_prob=0, attention_probs_dropout_prob=0)),
    }
    print(f"| model ({layers} layers) | kiln aot_eager s | torch aot_eager s | ratio | min-cut MB | save-all MB |")
    print("|---|---|---|---|---|---|")
    for name, m in models.items():
        ids = torch.randint(0, 1000, (2, 128))
        gm, ex = capture(m.train(), (ids,))
        t0 = time.perf_counter()
        c = aot_eager(gm, ex)
        t_kiln = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch_aot_eager(gm, ex)
        t_torch = time.perf_counter() - t0
        mc = c.aot.partitioned.saved_bytes / 2**20
        sa = partition(c.aot.joint, "save_all").saved_bytes / 2**20
        print(f"| {name} | {t_kiln:.2f} | {t_torch:.2f} | {t_kiln / t_torch:.2f} | {mc:.1f} | {sa:.1f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
