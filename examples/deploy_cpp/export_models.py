"""Export the example models as kiln packages, with inputs and eager outputs for main.cpp to check.

    uv run python examples/deploy_cpp/export_models.py --out /tmp/kiln_deploy [--small]
    g++ -O2 examples/deploy_cpp/main.cpp $(uv run python -m kiln.runtime.cxx --cflags --ldflags) -o /tmp/kiln_deploy/main
    /tmp/kiln_deploy/main /tmp/kiln_deploy/resnet18 /tmp/kiln_deploy/resnet18.inputs.safetensors \
        /tmp/kiln_deploy/resnet18.expected.safetensors 50

On a GPU: ``--device cuda [--dtype bfloat16]`` (the models are exported on the GPU, the cubins compiled
for it), the program built with ``--cuda`` flags and run with ``--cuda`` (``--tol 3e-2`` for bf16).

``--models padded_transformer``: one package for every batch in [2, 8] and sequence in [2, 64]
(``models.DYNAMIC``); its input and expected files hold a case per size in ``models.DYNAMIC_SIZES``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from models import DYNAMIC, DYNAMIC_SIZES, example, padded_inputs  # noqa: E402


def export_one(name: str, out: Path, small: bool, device: str = "cpu", dtype: str = "float32") -> None:
    model, inputs = example(name, small)
    dt = getattr(torch, dtype)
    model = model.to(device, dt)

    def place(xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(x.to(device, dt if x.is_floating_point() else x.dtype) for x in xs)
    inputs = place(inputs)
    dynamic = DYNAMIC if name == "padded_transformer" else None
    t0 = time.perf_counter()
    exported = kiln.export(model, inputs, dynamic_shapes=dynamic)
    t1 = time.perf_counter()
    report = kiln.package(exported, out / name, device=device)
    cases = [inputs]
    if dynamic:  # one case per size; the first is the export's example
        cases += [place(padded_inputs(b, t, seed=c)) for c, (b, t) in enumerate(DYNAMIC_SIZES[1:], 1)]
    ins, outs = {}, {}
    for c, xs in enumerate(cases):
        prefix = f"case{c}/" if c else ""
        with torch.no_grad():
            expected = model(*xs)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        ins.update({f"{prefix}input{k}": t.contiguous().cpu() for k, t in enumerate(xs)})
        outs.update({f"{prefix}output{k}": t.contiguous().cpu() for k, t in enumerate(expected)})
    save_file(ins, str(out / f"{name}.inputs.safetensors"))
    save_file(outs, str(out / f"{name}.expected.safetensors"))
    print(f"{name}: export {t1 - t0:.1f} s; {report.as_text()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="transformer,resnet18")
    ap.add_argument("--small", action="store_true", help="smaller configurations (CI)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        export_one(name, args.out, args.small, args.device, args.dtype)


if __name__ == "__main__":
    main()
