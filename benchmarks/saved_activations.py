"""Micro-benchmark (f): bytes saved for backward by one training step of each suite model.

    uv run python -m benchmarks.saved_activations [--small] [--device cpu] [--models ...]

Measured with ``torch.autograd.graph.saved_tensors_hooks`` around one training step (forward + loss;
the hooks see every tensor autograd saves: eager ops' saved tensors and a compiled graph's
``ctx.save_for_backward``), after a warm-up step that compiles. Reported per backend:

* ``activations MB``: unique storages saved that are not parameters, buffers or inputs (what a
  partitioner decides about), counted once per storage;
* ``params MB``: parameter/buffer storages saved (weights kept for matmul backward);
* ``tensors``: how many saves the hooks saw.

Defaults compare partitioners without code generation: kiln ``aot_eager`` (min-cut, issue 4) and
torch.compile ``aot_eager_decomp_partition`` (torch's min-cut); pass ``--kiln-backend inductor
--tc-backend inductor`` for the full compilers. Target (issue 4): kiln <= eager on every model.
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
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.models import SUITE, build
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro


class SavedTensorCounter:
    """Pack hook that records what autograd saves (storage identity, sizes); unpack is identity."""

    def __init__(self, exclude_storages: set[int]) -> None:
        self.exclude = exclude_storages
        self.n = 0
        self.storages: dict[int, int] = {}
        self.param_storages: dict[int, int] = {}
        self.tensor_bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.n += 1
        self.tensor_bytes += t.numel() * t.element_size()
        try:
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except Exception:  # noqa: BLE001 - e.g. tensor subclasses without storage
            key, size = id(t), t.numel() * t.element_size()
        (self.param_storages if key in self.exclude else self.storages)[key] = size
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def measure(*, backend: str, model: str, small: bool, device: str, kiln_backend: str,
            tc_backend: str) -> dict[str, Any]:
    """Child: saved bytes of one training step of ``model`` under ``backend``."""
    case = build(model, small=small, device=device)
    spec = B.CompileSpec(kiln_backend=kiln_backend, tc_backend=tc_backend)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
           else contextlib.nullcontext())
    try:
        run = B.compile_fn(backend, case.model, spec)

        def step(counter: SavedTensorCounter | None) -> None:
            case.model.zero_grad(set_to_none=True)
            hooks = (torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack)
                     if counter else contextlib.nullcontext())
            with hooks, amp:
                loss = case.loss_fn(run(*case.args, **case.kwargs), case.targets)
            loss.backward()

        step(None)  # compiles
        fixed = [*case.model.parameters(), *case.model.buffers(), *case.args,
                 *case.kwargs.values(), case.targets]
        counter = SavedTensorCounter({t.untyped_storage().data_ptr() for t in fixed})
        step(counter)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return {"error": B.short_error(exc)}
    return {"activations_mb": sum(counter.storages.values()) / 2**20,
            "params_mb": sum(counter.param_storages.values()) / 2**20,
            "tensor_mb": counter.tensor_bytes / 2**20, "tensors": counter.n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--models", type=cli.csv, default=list(SUITE))
    p.set_defaults(kiln_backend="aot_eager")
    args = p.parse_args(argv)
    if args.tc_backend is None:
        args.tc_backend = "aot_eager_decomp_partition" if args.kiln_backend == "aot_eager" \
            else args.kiln_backend
    args = cli.finish(args, "saved_activations")
    if "eager" not in args.backends:
        args.backends = ["eager", *args.backends]
    info = machine_info(args.device, module="benchmarks.saved_activations", threads=args.threads)
    results = []
    for model in args.models:
        for backend in args.backends:
            r = run_isolated("benchmarks.saved_activations:measure",
                             dict(backend=backend, model=model, small=args.small,
                                  device=args.device, kiln_backend=args.kiln_backend,
                                  tc_backend=args.tc_backend),
                             timeout_s=args.timeout, env=cli.child_env(args))
            r.update(backend=backend, model=model)
            print(f"{model:<22} {B.LABELS[backend]:<13} " + (
                na(r["error"], 200) if r.get("error") else
                f"activations {fmt(r['activations_mb'])} MB, params {fmt(r['params_mb'])} MB, "
                f"{r['tensors']} saves"), flush=True)
            results.append(r)
    md = write_micro(args.out, "saved_activations",
                     "Saved-for-backward bytes of one training step (MB)", info,
                     _table(results, args), {"results": results, "small": args.small,
                                             "kiln_backend": args.kiln_backend,
                                             "tc_backend": args.tc_backend})
    print("\n" + md)
    return 0


def _table(results: list[dict], args: argparse.Namespace) -> str:
    headers = ["model", "eager act. MB", f"kiln ({args.kiln_backend}) act. MB", "kiln / eager",
               f"torch.compile ({args.tc_backend}) act. MB", "tc / eager",
               "params MB saved (eager / kiln / tc)", "saves (eager / kiln / tc)"]
    body = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = {r["backend"]: r for r in results if r["model"] == model}
        e, k, t = (rows.get(b, {}) for b in ("eager", "kiln", "torch_compile"))

        def act(r: dict) -> str:
            return na(r["error"]) if r.get("error") else fmt(r.get("activations_mb"))

        body.append([model, act(e), act(k), fmt(ratio(k.get("activations_mb"),
                                                      e.get("activations_mb"))),
                     act(t), fmt(ratio(t.get("activations_mb"), e.get("activations_mb"))),
                     " / ".join(fmt(r.get("params_mb")) for r in (e, k, t)),
                     " / ".join(fmt(r.get("tensors")) for r in (e, k, t))])
    return markdown_table(headers, body) + (
        "\n\nact. = unique non-parameter, non-input storages saved for backward, each counted "
        "once. Target (issue 4): kiln <= eager per model.")


if __name__ == "__main__":
    sys.exit(main())
