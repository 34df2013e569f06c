"""Training steps of HF models on CPU: kiln vs torch.compile vs eager, graph breaks and step time.

Each model is built from a small config (random weights, nothing downloaded), dropout off, and is
called with its labels so that the model computes its own loss inside ``forward`` (HF builds
``nn.CrossEntropyLoss()`` there). A step is ``model(**inputs).loss.backward()`` with the gradients
cleared first. Per model and compiler, one fresh reset: the graph and break counts (``kiln.explain``,
``torch._dynamo.explain``), the first step's seconds (compile included), and the median of
``--steps`` later steps (after two warm-up steps; kiln's after its C++ wrappers, which a training loop
gets once a graph is hot, are built and chosen: ``tiers``), timed interleaved across the three so that
load from other processes on a shared machine falls on all of them alike. The loss of the compiled step is compared with eager's on the same inputs.

    python -m benchmarks.hf_train_steps                      # all six, 10 timed steps each
    python -m benchmarks.hf_train_steps --models bert,gpt2 --steps 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from benchmarks.kiln_bench.backends import settle_tiered, short_error, wait_tiered

_TEXT = dict(vocab_size=1000)
_LAYERS = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, hidden_size=128)


def _no_dropout(cfg: Any) -> Any:
    for key, value in vars(cfg).items():
        if ("dropout" in key or "pdrop" in key or key == "dropout_rate") and isinstance(value, float):
            setattr(cfg, key, 0.0)
    return cfg


def _bert() -> tuple[nn.Module, dict]:
    import transformers as tf
    m = tf.BertForMaskedLM(_no_dropout(tf.BertConfig(**_LAYERS, **_TEXT)))
    ids = torch.randint(0, 1000, (4, 64))
    return m, dict(input_ids=ids, labels=ids.clone())


def _t5() -> tuple[nn.Module, dict]:
    import transformers as tf
    cfg = tf.T5Config(d_model=128, d_ff=256, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=32,
                      decoder_start_token_id=0, pad_token_id=0, **_TEXT)
    m = tf.T5ForConditionalGeneration(_no_dropout(cfg))
    return m, dict(input_ids=torch.randint(0, 1000, (4, 64)), labels=torch.randint(0, 1000, (4, 32)))


def _gpt2() -> tuple[nn.Module, dict]:
    import transformers as tf
    m = tf.GPT2LMHeadModel(_no_dropout(tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=128, **_TEXT)))
    ids = torch.randint(0, 1000, (4, 64))
    return m, dict(input_ids=ids, labels=ids.clone())


def _llama() -> tuple[nn.Module, dict]:
    import transformers as tf
    cfg = tf.LlamaConfig(**_LAYERS, num_key_value_heads=2, max_position_embeddings=128, **_TEXT)
    m = tf.LlamaForCausalLM(_no_dropout(cfg))
    ids = torch.randint(0, 1000, (4, 64))
    return m, dict(input_ids=ids, labels=ids.clone())


def _vit() -> tuple[nn.Module, dict]:
    import transformers as tf
    cfg = tf.ViTConfig(**_LAYERS, image_size=32, patch_size=4, num_labels=10)
    m = tf.ViTForImageClassification(_no_dropout(cfg))
    return m, dict(pixel_values=torch.randn(4, 3, 32, 32), labels=torch.randint(0, 10, (4,)))


def _resnet() -> tuple[nn.Module, dict]:
    import transformers as tf
    cfg = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10)
    m = tf.ResNetForImageClassification(cfg)
    return m, dict(pixel_values=torch.randn(4, 3, 64, 64), labels=torch.randint(0, 10, (4,)))


COMPILERS = ("eager", "kiln", "torch.compile")
MODELS: dict[str, Callable[[], tuple[nn.Module, dict]]] = {
    "bert_mlm": _bert, "t5": _t5, "gpt2": _gpt2, "llama": _llama, "vit_cls": _vit, "resnet": _resnet}


def _step(model: nn.Module, inputs: dict) -> float:
    for p in model.parameters():
        p.grad = None
    loss = model(**inputs).loss
    loss.backward()
    return float(loss.detach())


def _counts(compiler: str, model: nn.Module, inputs: dict) -> tuple[int, int]:
    if compiler == "kiln":
        import kiln
        kiln.reset()
        ex = kiln.explain(model)(**inputs)
        kiln.reset()
        return ex.graph_count, ex.break_count
    torch._dynamo.reset()
    ex = torch._dynamo.explain(model)(**inputs)
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count


def _compiled(compiler: str, model: nn.Module) -> nn.Module:
    if compiler == "eager":
        return model
    if compiler == "kiln":
        import kiln
        return kiln.compile(model)
    return torch.compile(model)


def _measure(name: str, steps: int) -> dict[str, dict[str, Any]]:
    """One model: counts and first steps per compiler, then the timed steps interleaved (eager, kiln,
    torch.compile, eager, ...) so that load from other processes falls on all three alike."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train()
    want = _step(model, inputs)
    row: dict[str, dict[str, Any]] = {}
    fast: dict[str, nn.Module] = {}
    for compiler in COMPILERS:
        try:
            copy_ = copy.deepcopy(model)
            graphs, breaks = _counts(compiler, copy_, inputs) if compiler != "eager" else (0, 0)
            fn = _compiled(compiler, copy_)
            t0 = time.perf_counter()
            got = _step(fn, inputs)
            row[compiler] = dict(graphs=graphs, breaks=breaks, first_s=time.perf_counter() - t0,
                                 loss_err=abs(got - want), times=[])
            for _ in range(2):  # warm-up (allocator, oneDNN primitive caches)
                _step(fn, inputs)
            if compiler == "kiln":  # the steady state of a training loop: its C++ wrappers (tiered)
                row[compiler]["tier_wait_s"] = wait_tiered("kiln")
                row[compiler]["tiers"] = settle_tiered("kiln", lambda fn=fn: _step(fn, inputs), limit=40)
            fast[compiler] = fn
        except Exception as e:  # noqa: BLE001 - a failing compiler is a cell that says why
            row[compiler] = dict(error=short_error(e, 160))
    for _ in range(steps):
        for compiler, fn in fast.items():
            t0 = time.perf_counter()
            _step(fn, inputs)
            row[compiler]["times"].append(time.perf_counter() - t0)
    for compiler in fast:
        row[compiler]["step_ms"] = 1e3 * statistics.median(row[compiler]["times"])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    print("| model | kiln graphs/breaks | torch.compile graphs/breaks | eager ms | kiln ms | torch.compile ms "
          "| kiln/tc | kiln first s | tc first s | kiln loss err | kiln graphs' wrappers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        print(_format(name, _measure(name, a.steps)), flush=True)
    return 0


def _format(name: str, row: dict[str, dict[str, Any]]) -> str:
    def cell(c: str, key: str, fmt: str) -> str:
        v = row[c].get(key)
        return row[c]["error"] if v is None and "error" in row[c] else (format(v, fmt) if v is not None else "-")
    k, t = row["kiln"], row["torch.compile"]
    ratio = f"{k['step_ms'] / t['step_ms']:.2f}" if "step_ms" in k and "step_ms" in t else "-"
    tiers = k.get("tiers")
    wrappers = ", ".join(f"{n} {w}" for w, n in tiers.items()) if tiers else "python"
    return (f"| {name} | {k.get('graphs', '-')}/{k.get('breaks', '-')} | {t.get('graphs', '-')}/{t.get('breaks', '-')} "
            f"| {cell('eager', 'step_ms', '.1f')} | {cell('kiln', 'step_ms', '.1f')} | "
            f"{cell('torch.compile', 'step_ms', '.1f')} | {ratio} | {cell('kiln', 'first_s', '.1f')} | "
            f"{cell('torch.compile', 'first_s', '.1f')} | {cell('kiln', 'loss_err', '.1e')} | {wrappers} |")


if __name__ == "__main__":
    raise SystemExit(main())
