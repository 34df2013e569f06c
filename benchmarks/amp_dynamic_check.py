"""Correctness check: a suite LM trained under CUDA AMP (bf16) with ``dynamic=True``, against eager, step by step.

    python -m benchmarks.amp_dynamic_check [--model llama_350m] [--layers 24]

The model (the suite's full config, random weights) takes training steps (forward with labels, backward;
no optimizer step, so both see the same weights) at a list of (batch, length) sizes with fresh random
tokens each, repeated sizes included (a repeated call reuses memory: reads of stale memory show there).
Each step runs in eager, then through ``kiln.compile(model, dynamic=True)``; the losses and every
parameter's gradient norm are compared. Prints one line per step and ``RESULT PASS`` or ``RESULT FAIL n``
(exit status 1). The check that found fp32 q/k beside a bf16 v reaching memory-efficient attention in
Llama-350M's dynamic AMP step (an illegal memory access; a NaN loss on a repeated call).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

SIZES = ((4, 512), (4, 512), (2, 300), (4, 512), (3, 77), (2, 300), (4, 511))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama_350m", help="a suite LM: llama_350m, gpt2, bert_base")
    p.add_argument("--layers", type=int, default=0, help="keep only the first N decoder layers (0: all)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device (CUDA autocast)")
        return 2
    import kiln
    from benchmarks.kiln_bench.models import build

    model = build(args.model, small=False, device="cuda").model
    if args.layers:
        layers = model.model.layers if hasattr(model, "model") else model.transformer.h
        del layers[args.layers:]
    vocab = model.config.vocab_size
    compiled = kiln.compile(model, dynamic=True)
    bad = 0
    for i, (b, s) in enumerate(SIZES):
        gen = torch.Generator(device="cuda").manual_seed(100 + i)
        ids = torch.randint(0, vocab, (b, s), device="cuda", generator=gen)
        labels = torch.randint(0, vocab, (b, s), device="cuda", generator=gen)
        want_loss, want_norms = _step(model, model, ids, labels)
        t0 = time.perf_counter()
        loss, norms = _step(model, compiled, ids, labels)
        seconds = time.perf_counter() - t0
        rel = ((norms - want_norms).abs() / want_norms.abs().clamp_min(1e-6)).max().item()
        ok = (bool(torch.isfinite(norms).all()) and abs(loss - want_loss) <= 2e-2 * abs(want_loss)
              and rel < 0.1 and loss == loss)
        bad += not ok
        print(f"step {i} ({b}, {s}): loss eager {want_loss:.5f} kiln {loss:.5f}, gradient norms max rel err "
              f"{rel:.3g}, {'ok' if ok else 'WRONG'} ({seconds:.2f} s)", flush=True)
    print("RESULT", "PASS" if not bad else f"FAIL {bad}")
    return 1 if bad else 0


def _step(model: torch.nn.Module, fn: object, ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fn(input_ids=ids, labels=labels)  # type: ignore[operator]
    out.loss.backward()
    norms = torch.stack([p.grad.float().norm() for p in model.parameters() if p.grad is not None])
    return float(out.loss.detach()), norms


if __name__ == "__main__":
    sys.exit(main())
