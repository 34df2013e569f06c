"""Micro-benchmark (b): capture time of GPT-2 (12 layers) and BERT-base, kiln vs torch.compile.

    uv run python -m benchmarks.capture_time [--small] [--device cpu] [--out DIR]

Two measurements per model, each backend in a fresh process:

* ``forward/eager``: inference forward with backend ``"eager"`` -- capture only (issue 3's figure);
* ``train/aot_eager``: forward + backward with backend ``"aot_eager"`` -- capture + joint tracing +
  partitioning, run by graph interpreters (issue 4's figure).

Capture time = first call - steady-state call. Each child first compiles a trivial function with
the same backend so one-time imports and initialisation are not counted against the model.
``--small`` keeps all 12 layers (capture cost scales with layers, not width) but makes them tiny.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench import measure as M
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro

KINDS = {"forward/eager": "eager", "train/aot_eager": "aot_eager"}


def _model(name: str, small: bool, device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = dict(n_embd=64, n_head=2, vocab_size=1000, bos_token_id=0, eos_token_id=0) \
            if small else {}
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, use_cache=False, resid_pdrop=0.0,
                                           embd_pdrop=0.0, attn_pdrop=0.0, **cfg))
    else:
        from transformers import BertConfig, BertForMaskedLM

        cfg = dict(hidden_size=64, num_attention_heads=2, intermediate_size=128,
                   vocab_size=1000) if small else {}
        model = BertForMaskedLM(BertConfig(num_hidden_layers=12, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0, **cfg))
    ids = torch.randint(0, model.config.vocab_size, (1, 128))
    return model.to(device), ids.to(device)


def measure(*, backend: str, model: str, kind: str, small: bool, device: str) -> dict[str, Any]:
    """Child process: seconds of the first call above a steady-state call."""
    compiler_backend = KINDS[kind]
    spec = B.CompileSpec(kiln_backend=compiler_backend, tc_backend=compiler_backend)
    training = kind.startswith("train")
    result: dict[str, Any] = {"backend": backend, "model": model, "kind": kind}
    try:  # pay one-time imports / initialisation on a trivial function first
        warm = B.compile_fn(backend, lambda x: torch.relu(x) + 1, spec)
        warm(torch.randn(3, device=device))
        if backend == "torch_compile":
            from torch._dynamo.utils import counters

            counters.clear()
    except Exception as exc:  # noqa: BLE001
        return dict(result, error=B.short_error(exc))
    net, ids = _model(model, small, device)
    net.train(training)
    ctx = contextlib.nullcontext if training else torch.no_grad

    def step(fn: Any) -> Any:
        with ctx():
            out = fn(ids).logits
        if training:
            out.float().square().mean().backward()
        return out

    steady_eager = M.median_seconds(lambda: step(net), device, 3)
    try:
        compiled = B.compile_fn(backend, net, spec)
        first, out = M.timed_call(lambda: step(compiled), device)
        steady = M.median_seconds(lambda: step(compiled), device, 3)
    except Exception as exc:  # noqa: BLE001
        return dict(result, error=B.short_error(exc))
    torch.testing.assert_close(out.float(), step(net).float(), rtol=1e-3, atol=1e-3)
    counts = B.torch_compile_counters() if backend == "torch_compile" else {}
    return dict(result, capture_s=first - steady, first_call_s=first, steady_ms=steady * 1e3,
                eager_ms=steady_eager * 1e3, graphs=counts.get("graphs"),
                breaks=counts.get("breaks"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--models", type=cli.csv, default=["gpt2", "bert_base"])
    p.add_argument("--kinds", type=cli.csv, default=list(KINDS))
    args = cli.finish(p.parse_args(argv), "capture_time")
    backends = [b for b in args.backends if b != "eager"]
    info = machine_info(args.device, module="benchmarks.capture_time", threads=args.threads)
    results = []
    for kind in args.kinds:
        for model in args.models:
            for backend in backends:
                r = run_isolated("benchmarks.capture_time:measure",
                                 dict(backend=backend, model=model, kind=kind, small=args.small,
                                      device=args.device), timeout_s=args.timeout,
                             env=cli.child_env(args))
                r.update(backend=backend, model=model, kind=kind)
                print(f"{kind:<16} {model:<10} {B.LABELS[backend]:<13} "
                      + (na(r["error"], 200) if r.get("error") else
                         f"capture {fmt(r['capture_s'])} s"), flush=True)
                results.append(r)
    md = write_micro(args.out, "capture_time", "Capture time (first call - steady call, seconds)",
                     info, _table(results, args.kinds, args.models, args.small),
                     {"results": results, "small": args.small})
    print("\n" + md)
    return 0


def _table(results: list[dict], kinds: list[str], models: list[str], small: bool) -> str:
    headers = ["what", "model", "kiln s", "torch.compile s", "kiln / torch.compile",
               "graphs/breaks (tc)", "eager step ms"]
    body = []
    for kind in kinds:
        for model in models:
            rows = {r["backend"]: r for r in results if r["kind"] == kind and r["model"] == model}
            k, t = rows.get("kiln", {}), rows.get("torch_compile", {})
            body.append([
                kind, model + (" (12 tiny layers)" if small else " (12 layers)"),
                na(k["error"]) if k.get("error") else fmt(k.get("capture_s")),
                na(t["error"]) if t.get("error") else fmt(t.get("capture_s")),
                fmt(ratio(k.get("capture_s"), t.get("capture_s"))),
                f"{t.get('graphs', '-')}/{t.get('breaks', '-')}",
                fmt(t.get("eager_ms") or k.get("eager_ms")),
            ])
    return markdown_table(headers, body) + (
        "\n\nTarget (issues 3, 4): kiln / torch.compile <= 1 for both rows of each model.")


if __name__ == "__main__":
    sys.exit(main())
