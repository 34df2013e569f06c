"""Micro-benchmark: HF ``generate()`` with a growing DynamicCache (issue 20), kiln vs eager vs torch.compile.

    uv run python -m benchmarks.generate [--models gpt2,llama] [--tokens 64] [--mode reduce-overhead]
        [--kiln-options '{"wrapper": "tiered"}'] [--cache static]

``--cache static`` runs HF's recipe for compiled decoding instead, ``generate(cache_implementation="static")``:
a StaticCache written in place, one shape for every decode step (the graph CUDA graphs replay per token).

Weights are fp32 unless ``--bf16``. ``model.forward`` is replaced by the compiled forward, as users do, and ``generate`` runs greedy
decoding of ``--tokens`` new tokens from a batch of 2 prompts of 16 tokens. Every step's sequence
length differs (the KV cache grows), so a compiler that specialises on sizes recompiles per token.
Each backend runs in its own process: the first ``generate`` (compiles included), then the best of
``--runs`` timed ones; compiles counted as in ``benchmarks.dynamic_stream``; tokens compared with
eager's (identical prefix length).

With tiered graphs (``--kiln-options '{"wrapper": "tiered"}'``, and kiln's default for CUDA inference graphs)
kiln's timed rounds start after ``kiln.inductor.wait_tiered()`` (its C++ wrappers built in the background; the
wait is reported) and after the trial that alternates the two wrappers (the wrappers chosen are reported).

``--together`` instead holds the three models (the same weights) in one process and alternates their
timed ``generate`` rounds, so per-token times are compared under the same load: the median wall and
CPU (process) ms per token. On a shared machine this is the table to read.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.dynamic_stream import CompileCounter, count_compiles, sync_device
from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.models import GPT2_12L, LLAMA_350M, TINY_LM
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro


def _build(name: str, small: bool, device: str, bf16: bool) -> torch.nn.Module:
    import transformers as T

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=TINY_LM["vocab"], n_positions=256) \
            if small else GPT2_12L
        config = T.GPT2Config(**cfg, attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
        cls: Any = T.GPT2LMHeadModel
    else:
        cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, vocab_size=TINY_LM["vocab"], max_position_embeddings=256,
                   tie_word_embeddings=False) if small else LLAMA_350M
        config = T.LlamaConfig(**cfg, attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
        cls = T.LlamaForCausalLM
    with torch.device(device):
        model = cls(config)
    model.eval()
    if bf16:
        model = model.to(torch.bfloat16)
    return model


def _generate(model: torch.nn.Module, prompt: torch.Tensor, tokens: int, cache: str = "dynamic") -> torch.Tensor:
    # static: HF would wrap the forward in torch.compile itself on CUDA (its auto-compile of compileable
    # caches); off, so that each row runs its own backend's forward
    extra = {"cache_implementation": "static", "disable_compile": True} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                              pad_token_id=0, use_cache=True, **extra)


def _spec(mode: str | None, kiln_options: dict[str, Any] | None) -> B.CompileSpec:
    return B.CompileSpec(kiln_backend="inductor", tc_backend="inductor", mode=mode,
                         kiln_options=tuple(sorted((kiln_options or {}).items())))


def measure(*, backend: str, name: str, small: bool, device: str, tokens: int, runs: int,
            mode: str | None, bf16: bool = False, kiln_options: dict[str, Any] | None = None,
            cache: str = "dynamic") -> dict[str, Any]:
    """Child: first generate (compiles included), best of ``runs`` timed ones, tokens vs eager."""
    model = _build(name, small, device, bf16)
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    reference = _generate(model, prompt, tokens, cache).cpu()
    spec = _spec(mode, kiln_options)
    counter = CompileCounter()
    logging.getLogger("kiln").addHandler(counter)
    result: dict[str, Any] = {"backend": backend, "model": name}
    try:
        model.forward = B.compile_fn(backend, model.forward, spec)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            got = _generate(model, prompt, tokens, cache)
            sync_device(device)
            first_s = time.perf_counter() - t0
            compiles = count_compiles(backend, counter)
            waited = B.wait_tiered(backend, kiln_options)
            tiers = B.settle_tiered(backend, lambda: _generate(model, prompt, tokens, cache), limit=20)
            best = float("inf")
            for _ in range(runs):
                t0 = time.perf_counter()
                got = _generate(model, prompt, tokens, cache)
                sync_device(device)
                best = min(best, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return dict(result, error=B.short_error(exc))
    got = got.cpu()
    same = int((got == reference).all(0).cumprod(0).sum()) - prompt.shape[1]
    eager_msgs = [str(w.message) for w in caught if "eager" in str(w.message).lower()]
    result.update(first_s=first_s, ms_per_token=best / tokens * 1e3, compiles=compiles,
                  same_tokens=same, tokens=tokens,
                  ran_eagerly=eager_msgs[0][:200] if eager_msgs else None, tier_wait_s=waited, tiers=tiers)
    return result


def measure_together(*, backends: list[str], name: str, small: bool, device: str, tokens: int, runs: int,
                     mode: str | None, bf16: bool = False,
                     kiln_options: dict[str, Any] | None = None, cache: str = "dynamic") -> dict[str, Any]:
    """Child: every backend's model in this process; first generates (compiles included), then
    ``runs`` rounds alternating between the backends; median wall and CPU ms per token."""
    spec = _spec(mode, kiln_options)
    models: dict[str, torch.nn.Module] = {}
    result: dict[str, Any] = {}
    for backend in backends:
        model = _build(name, small, device, bf16)
        try:
            model.forward = B.compile_fn(backend, model.forward, spec)
        except Exception as exc:  # noqa: BLE001
            result[backend] = {"error": B.short_error(exc)}
            continue
        models[backend] = model
    vocab = next(iter(models.values())).config.vocab_size if models else 2
    prompt = torch.randint(1, vocab, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    reference = _generate(_build(name, small, device, bf16), prompt, tokens, cache).cpu()
    counter = CompileCounter()
    logging.getLogger("kiln").addHandler(counter)
    wall: dict[str, list[float]] = {b: [] for b in models}
    cpu: dict[str, list[float]] = {b: [] for b in models}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for backend, model in list(models.items()):
            try:
                t0 = time.perf_counter()
                got = _generate(model, prompt, tokens, cache)
                sync_device(device)
            except Exception as exc:  # noqa: BLE001
                print(B.error_details(exc))
                result[backend] = {"error": B.short_error(exc)}
                del models[backend]
                continue
            same = int((got.cpu() == reference).all(0).cumprod(0).sum()) - prompt.shape[1]
            result[backend] = {"first_s": time.perf_counter() - t0, "compiles": count_compiles(backend, counter),
                               "same_tokens": same, "tokens": tokens}
        if "kiln" in models:
            result["kiln"]["tier_wait_s"] = B.wait_tiered("kiln", kiln_options)
            kiln_model = models["kiln"]
            result["kiln"]["tiers"] = B.settle_tiered("kiln", lambda: _generate(kiln_model, prompt, tokens, cache),
                                                      limit=20)
        for _ in range(runs):
            for backend, model in models.items():
                c0, t0 = time.process_time(), time.perf_counter()
                _generate(model, prompt, tokens, cache)
                sync_device(device)
                wall[backend].append((time.perf_counter() - t0) / tokens * 1e3)
                cpu[backend].append((time.process_time() - c0) / tokens * 1e3)
    eager_msgs = [str(w.message) for w in caught if "eager" in str(w.message).lower()]
    for backend in models:
        result[backend].update(ms_per_token=statistics.median(wall[backend]),
                               cpu_ms_per_token=statistics.median(cpu[backend]),
                               compiles_after=count_compiles(backend, counter))
        if backend == "kiln":
            result[backend]["ran_eagerly"] = eager_msgs[0][:200] if eager_msgs else None
    return result


def _together_rows(name: str, results: dict[str, Any]) -> list[list[Any]]:
    tc, eager = results.get("torch_compile", {}), results.get("eager", {})
    rows = []
    for backend, res in results.items():
        if "error" in res:
            rows.append([name, backend, na(res["error"])] + ["n/a"] * 7)
            continue
        rows.append([name, backend, res["compiles_after"], "yes" if res.get("ran_eagerly") else "no",
                     f"{res['same_tokens']}/{res['tokens']}", fmt(res["ms_per_token"], 3),
                     fmt(res["cpu_ms_per_token"], 3), fmt(ratio(eager.get("cpu_ms_per_token"), res["cpu_ms_per_token"])),
                     fmt(ratio(tc.get("cpu_ms_per_token"), res["cpu_ms_per_token"])), fmt(res["first_s"])])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--models", type=cli.csv, default=["gpt2", "llama"])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mode", default=None, help="compile mode for both compilers")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 weights (greedy tokens then differ from eager's by rounding, for every "
                        "compiler); the default fp32 makes the token comparison exact")
    p.add_argument("--together", action="store_true",
                   help="all backends in one process, timed rounds alternating (CPU and wall ms per token)")
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                   help="HF's KV cache: a DynamicCache that grows (a new length every token) or a StaticCache "
                        "(generate(cache_implementation='static'): fixed shapes, positions as tensors)")
    args = cli.finish(p.parse_args(argv), "generate")
    small = args.small or not args.device.startswith("cuda")
    info = machine_info(args.device, module="benchmarks.generate", threads=args.threads)
    rows = []
    payload: dict[str, Any] = {}
    if args.together:
        return _main_together(args, small, info)
    for name in args.models:
        results = {}
        for backend in args.backends:
            res = run_isolated("benchmarks.generate:measure",
                               dict(backend=backend, name=name, small=small, device=args.device,
                                    tokens=args.tokens, runs=args.runs, mode=args.mode,
                                    bf16=args.bf16, kiln_options=args.kiln_options, cache=args.cache),
                               timeout_s=args.timeout, env=cli.child_env(args))
            results[backend] = res
            print(name, res, flush=True)
        payload[name] = results
        eager, tc = results.get("eager", {}), results.get("torch_compile", {})
        for backend, res in results.items():
            if "error" in res:
                rows.append([name, backend, na(res["error"])] + ["n/a"] * 5)
                continue
            rows.append([name, backend, res["compiles"], "yes" if res["ran_eagerly"] else "no",
                         f"{res['same_tokens']}/{res['tokens']}", fmt(res["ms_per_token"], 3),
                         fmt(ratio(eager.get("ms_per_token"), res["ms_per_token"])),
                         fmt(ratio(tc.get("ms_per_token"), res["ms_per_token"]))])
    dtype = "bf16" if args.bf16 else "fp32"
    body = (f"{args.tokens} new tokens, batch 2, greedy, {'tiny' if small else 'full'} configs, {dtype}, "
            f"mode={args.mode or 'default'}, {args.cache} cache, kiln options={args.kiln_options or 'none'}.\n\n"
            + markdown_table(["model", "backend", "compiles", "ran eagerly", "tokens = eager's",
                              "ms/token", "speed vs eager", "speed vs torch.compile"], rows))
    print(write_micro(args.out, "generate", f"HF generate() with a {args.cache} cache", info, body, payload))
    return 0


def _main_together(args: argparse.Namespace, small: bool, info: Any) -> int:
    rows, payload = [], {}
    for name in args.models:
        res = run_isolated("benchmarks.generate:measure_together",
                           dict(backends=args.backends, name=name, small=small, device=args.device,
                                tokens=args.tokens, runs=args.runs, mode=args.mode, bf16=args.bf16,
                                kiln_options=args.kiln_options, cache=args.cache),
                           timeout_s=args.timeout, env=cli.child_env(args))
        print(name, res, flush=True)
        payload[name] = res
        if "error" in res:
            rows.append([name, "all", na(res["error"])] + ["n/a"] * 7)
            continue
        rows += _together_rows(name, {k: v for k, v in res.items() if isinstance(v, dict)})
    dtype = "bf16" if args.bf16 else "fp32"
    body = (f"{args.tokens} new tokens, batch 2, greedy, {'tiny' if small else 'full'} configs, {dtype}, "
            f"mode={args.mode or 'default'}, {args.cache} cache, kiln options={args.kiln_options or 'none'}; all "
            "backends in one process, "
            f"{args.runs} alternating rounds "
            "(medians).\n\n"
            + markdown_table(["model", "backend", "compiles", "ran eagerly", "tokens = eager's", "ms/token (wall)",
                              "CPU ms/token", "CPU speed vs eager", "CPU speed vs torch.compile",
                              "first generate s (compiles)"], rows))
    print(write_micro(args.out, "generate", f"HF generate() with a {args.cache} cache (one process)", info, body,
                      payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
