"""Micro-benchmark: a serving stream of changing shapes (issue 20), kiln vs eager vs torch.compile.

    uv run python -m benchmarks.dynamic_stream [--requests 40] [--small] [--dynamic auto|true]
        [--kiln-options '{"wrapper": "cpp"}']

A Llama-style ``LlamaForCausalLM`` (the suite's 350M config in bf16 on the GPU; a tiny fp32 config on
the CPU or with ``--small``) serves ``--requests`` forward calls whose batch is drawn from 1-8 and
sequence length from 8-512 (8-64 on the CPU), the same seeded stream for every backend. Each backend
runs in its own process:

- pass 1 (cold): the whole stream once, compiles included; wall time, compiles, eager fallbacks;
- pass 2 (steady): the same stream again, the sum of per-request times (device synchronised).

Compiles are the graphs each compiler built (kiln: ``kiln.stats()`` where present, else the
``recompiles`` log; torch.compile: dynamo's ``unique_graphs``). A backend that gave up and ran
eagerly shows ``ran eagerly`` with the warning's text. Outputs of every request are compared with
eager's logits in the same process (max |diff| relative to the logits' max).

``--together`` keeps every backend's model in one process instead: each runs its cold pass, then
``--runs`` steady passes alternate between the backends (medians of wall and CPU time per pass), so a
shared or loaded machine moves every backend's time alike. Use it on the CPU, where separate processes
run minutes apart under different load.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.models import LLAMA_350M, TINY_LM
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro


def stream(n: int, max_seq: int, seed: int = 0) -> list[tuple[int, int]]:
    """The request stream: ``n`` (batch, seq) pairs, batch 1-8, seq 8-``max_seq``."""
    rng = random.Random(seed)
    return [(rng.randint(1, 8), rng.randint(8, max_seq)) for _ in range(n)]


def _build(small: bool, device: str) -> tuple[torch.nn.Module, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=TINY_LM["vocab"], max_position_embeddings=1024,
               tie_word_embeddings=False) if small else dict(LLAMA_350M, max_position_embeddings=1024)
    config = LlamaConfig(**cfg, attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.eval()
    if device.startswith("cuda"):
        model = model.to(torch.bfloat16)
    return model, config.vocab_size


class CompileCounter(logging.Handler):
    """Counts kiln's ``recompiles``/``graph_code`` log records (used when kiln.stats is absent)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def _kiln_graphs() -> int | None:
    try:
        kiln = B.import_kiln()
    except B.BackendUnavailable:
        return None
    stats = getattr(kiln, "stats", None)
    if not callable(stats):
        return None
    return int(stats().graphs_compiled)


def count_compiles(backend: str, counter: CompileCounter) -> int | None:
    if backend == "torch_compile":
        return int(B.torch_compile_counters()["graphs"])
    if backend == "kiln":
        graphs = _kiln_graphs()
        return graphs if graphs is not None else sum("compiling" in r for r in counter.records) or None
    return 0


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(*, backend: str, small: bool, device: str, requests: int, dynamic: str,
            mode: str | None, kiln_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Child: run the stream twice with ``backend``; times, compiles, fallbacks, max error."""
    model, vocab = _build(small, device)
    pairs = stream(requests, 512 if device.startswith("cuda") and not small else 64)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, vocab, (b, s), generator=gen).to(device) for b, s in pairs]
    with torch.no_grad():
        reference = [model(ids).logits.float().cpu() for ids in inputs[:8]]
    spec = B.CompileSpec(kiln_backend="inductor", tc_backend="inductor", mode=mode,
                         dynamic={"auto": None, "true": True}[dynamic],
                         kiln_options=tuple(sorted((kiln_options or {}).items())))
    counter = CompileCounter()
    logging.getLogger("kiln").addHandler(counter)
    logging.getLogger("kiln.recompiles").setLevel(logging.INFO)  # each recompile's failing guard, reported
    result: dict[str, Any] = {"backend": backend, "pairs": pairs}
    try:
        step = B.compile_fn(backend, model, spec)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            outs = []
            for ids in inputs:
                outs.append(step(ids).logits)
            sync_device(device)
            cold_s = time.perf_counter() - t0
            compiles = count_compiles(backend, counter)
            steady = _timed_pass(step, inputs, device)[0]
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return dict(result, error=B.short_error(exc))
    eager_msgs = [str(w.message) for w in caught if "eager" in str(w.message).lower()]
    err = _max_rel_err(outs, reference)
    recompiles = [r[:300] for r in counter.records if r.startswith("recompiling")]
    result.update(cold_s=cold_s, steady_s=steady, compiles=compiles, rel_err=err,
                  ran_eagerly=eager_msgs[0][:200] if eager_msgs else None, recompiles=recompiles)
    return result


def _max_rel_err(outs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest |output - eager's| relative to eager's largest logit, over the requests compared."""
    return max(float((o.float().cpu() - r).abs().max() / r.abs().max().clamp_min(1e-6))
               for o, r in zip(outs, reference, strict=False))


def _timed_pass(step: Any, inputs: list[torch.Tensor], device: str) -> tuple[float, float]:
    """(wall s, CPU s) of one pass over the stream, each request synchronised."""
    wall = 0.0
    c0 = time.process_time()
    for ids in inputs:
        sync_device(device)
        t1 = time.perf_counter()
        step(ids)
        sync_device(device)
        wall += time.perf_counter() - t1
    return wall, time.process_time() - c0


def measure_together(*, backends: list[str], small: bool, device: str, requests: int, dynamic: str,
                     mode: str | None, runs: int, kiln_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Child: every backend's model in this process; cold passes one after another, then ``runs``
    steady passes alternating between the backends (medians)."""
    pairs = stream(requests, 512 if device.startswith("cuda") and not small else 64)
    spec = B.CompileSpec(kiln_backend="inductor", tc_backend="inductor", mode=mode,
                         dynamic={"auto": None, "true": True}[dynamic],
                         kiln_options=tuple(sorted((kiln_options or {}).items())))
    counter = CompileCounter()
    logging.getLogger("kiln").addHandler(counter)
    logging.getLogger("kiln.recompiles").setLevel(logging.INFO)
    steps: dict[str, Any] = {}
    result: dict[str, Any] = {"pairs": pairs}
    inputs: list[torch.Tensor] = []
    reference: list[torch.Tensor] = []
    for backend in backends:
        model, vocab = _build(small, device)
        if not inputs:
            gen = torch.Generator().manual_seed(1)
            inputs = [torch.randint(0, vocab, (b, s), generator=gen).to(device) for b, s in pairs]
            with torch.no_grad():
                reference = [model(ids).logits.float().cpu() for ids in inputs[:8]]
        try:
            steps[backend] = B.compile_fn(backend, model, spec)
        except Exception as exc:  # noqa: BLE001
            result[backend] = {"error": B.short_error(exc)}
    wall: dict[str, list[float]] = {b: [] for b in steps}
    cpu: dict[str, list[float]] = {b: [] for b in steps}
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for backend, step in list(steps.items()):
            try:
                t0 = time.perf_counter()
                outs = [step(ids).logits for ids in inputs]
                sync_device(device)
            except Exception as exc:  # noqa: BLE001
                print(B.error_details(exc))
                result[backend] = {"error": B.short_error(exc)}
                del steps[backend]
                continue
            err = _max_rel_err(outs, reference)
            result[backend] = {"cold_s": time.perf_counter() - t0, "compiles": count_compiles(backend, counter),
                               "rel_err": err}
        if "kiln" in steps:  # tiered: how long after the cold pass the C++ wrappers were still building
            result["kiln"]["tier_wait_s"] = B.wait_tiered("kiln", kiln_options)
            kiln_step = steps["kiln"]
            result["kiln"]["tiers"] = B.settle_tiered("kiln", lambda: [kiln_step(ids) for ids in inputs], limit=20)
        for _ in range(runs):
            for backend, step in steps.items():
                w, c = _timed_pass(step, inputs, device)
                wall[backend].append(w)
                cpu[backend].append(c)
    eager_msgs = [str(w.message) for w in caught if "eager" in str(w.message).lower()]
    for backend in steps:
        result[backend].update(steady_s=statistics.median(wall[backend]), cpu_s=statistics.median(cpu[backend]),
                               compiles=count_compiles(backend, counter))
        if backend == "kiln":
            result[backend]["ran_eagerly"] = eager_msgs[0][:200] if eager_msgs else None
            result[backend]["recompiles"] = [r[:300] for r in counter.records if r.startswith("recompiling")]
    return result


def _main_together(args: argparse.Namespace, small: bool, info: Any) -> int:
    res = run_isolated("benchmarks.dynamic_stream:measure_together",
                       dict(backends=args.backends, small=small, device=args.device, requests=args.requests,
                            dynamic=args.dynamic, mode=args.mode, runs=args.runs,
                            kiln_options=args.kiln_options),
                       timeout_s=args.timeout, env=cli.child_env(args))
    print({k: v for k, v in res.items() if k != "pairs"}, flush=True)
    results = {k: v for k, v in res.items() if isinstance(v, dict)}
    eager, tc = results.get("eager", {}), results.get("torch_compile", {})
    rows = []
    for backend, r in results.items():
        if "error" in r:
            rows.append([backend, na(r["error"])] + ["n/a"] * 8)
            continue
        rows.append([backend, r["compiles"], "yes" if r.get("ran_eagerly") else "no", fmt(r["cold_s"]),
                     fmt(r["steady_s"] * 1e3), fmt(r["cpu_s"] * 1e3),
                     fmt(ratio(eager.get("steady_s"), r["steady_s"])),
                     fmt(ratio(tc.get("steady_s"), r["steady_s"])),
                     fmt(ratio(tc.get("cpu_s"), r["cpu_s"])),
                     fmt(ratio(r["cold_s"], tc.get("cold_s")))])
    if "error" in res:
        rows.append(["all", na(res["error"])] + ["n/a"] * 8)
    waited = results.get("kiln", {}).get("tier_wait_s")
    tiers = results.get("kiln", {}).get("tiers")
    note = (f" kiln's background C++ wrapper builds (wrapper='tiered') finished {waited:.2f} s after its cold "
            f"pass; its steady passes ran after them and after the wrappers' trial (graphs per wrapper: {tiers})."
            if waited is not None else "")
    body = (f"Stream: {args.requests} requests, batch 1-8 x seq 8-{512 if not small else 64}, "
            f"{'tiny fp32' if small else 'Llama-350M bf16'}, dynamic={args.dynamic}, "
            f"mode={args.mode or 'default'}, kiln options={args.kiln_options or 'none'}; all backends in one "
            f"process, cold passes in turn, then {args.runs} steady passes alternating (medians).{note}\n\n"
            + markdown_table(["backend", "compiles", "ran eagerly", "stream wall s (cold)", "steady ms (stream)",
                              "steady CPU ms", "speed vs eager", "speed vs torch.compile",
                              "CPU speed vs torch.compile", "cold wall / torch.compile's"], rows))
    print(write_micro(args.out, "dynamic_stream", "Serving stream of changing shapes (one process)", info, body,
                      res))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--dynamic", choices=["auto", "true"], default="auto",
                   help="dynamic=None (automatic, the default) or dynamic=True for both compilers")
    p.add_argument("--mode", default=None, help="compile mode for both compilers")
    p.add_argument("--together", action="store_true",
                   help="all backends in one process, steady passes alternating (wall and CPU time)")
    p.add_argument("--runs", type=int, default=3, help="steady passes per backend with --together")
    args = cli.finish(p.parse_args(argv), "dynamic_stream")
    small = args.small or not args.device.startswith("cuda")
    info = machine_info(args.device, module="benchmarks.dynamic_stream", threads=args.threads)
    if args.together:
        return _main_together(args, small, info)
    rows, payload = [], {}
    for backend in args.backends:
        res = run_isolated("benchmarks.dynamic_stream:measure",
                           dict(backend=backend, small=small, device=args.device,
                                requests=args.requests, dynamic=args.dynamic, mode=args.mode,
                                kiln_options=args.kiln_options),
                           timeout_s=args.timeout)
        payload[backend] = res
        print(backend, {k: v for k, v in res.items() if k != "pairs"}, flush=True)
    eager = payload.get("eager", {})
    tc = payload.get("torch_compile", {})
    for backend, res in payload.items():
        if "error" in res:
            rows.append([backend, na(res["error"])] + ["n/a"] * 6)
            continue
        rows.append([backend, res["compiles"], "yes" if res["ran_eagerly"] else "no",
                     fmt(res["cold_s"]), fmt(res["steady_s"] * 1e3),
                     fmt(ratio(eager.get("steady_s"), res["steady_s"])),
                     fmt(ratio(tc.get("steady_s"), res["steady_s"])),
                     fmt(ratio(res["cold_s"], tc.get("cold_s")))])
    body = (f"Stream: {args.requests} requests, batch 1-8 x seq 8-{512 if not small else 64}, "
            f"{'tiny fp32' if small else 'Llama-350M bf16'}, dynamic={args.dynamic}, "
            f"mode={args.mode or 'default'}, kiln options={args.kiln_options or 'none'}.\n\n"
            + markdown_table(["backend", "compiles", "ran eagerly", "stream wall s (cold)",
                              "steady ms (stream)", "speed vs eager", "speed vs torch.compile",
                              "cold wall / torch.compile's"], rows))
    print(write_micro(args.out, "dynamic_stream", "Serving stream of changing shapes", info, body,
                      payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
