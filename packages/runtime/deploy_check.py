"""Runtime-only deployment check (the nox session ``runtime_only`` runs it in two venvs).

    python deploy_check.py save DIR   # with the full kiln: aot_compile (inductor, C++) and save
    python deploy_check.py load DIR   # with only kiln-graph + kiln-runtime (+ torch): load and run

``save`` writes the artifact, the model's weights and the inputs with eager's outputs; ``load``
rebuilds the model from the weights, loads the artifact, checks the outputs against eager's (also
recomputed here), checks a wrong-shaped input raises GuardError, and fails if the compiler stages
(kiln.capture/autograd/decomp/inductor) or torch's compiler were imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

COMPILER_STAGES = ("kiln.capture", "kiln.autograd", "kiln.decomp", "kiln.inductor", "kiln.api")


class Net(nn.Module):
    """Convolution, batch norm, pointwise and a reduction: extern calls and C++ kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.silu(self.bn(self.conv(x)))
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), dim=-1) * 2 + x.sum()


def save(out: Path) -> None:
    import kiln
    from kiln.runtime.tensors import tensors_to_bytes

    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():  # inference: the artifact guards on grad mode being off
        compiled = kiln.compile(model, fullgraph=True, backend="inductor").forward.aot_compile(((x,), {}))
        expected = model(x)
        torch.testing.assert_close(compiled(model, x), expected)
    out.mkdir(parents=True, exist_ok=True)
    compiled.save_compiled_function(out / "net.kiln")
    (out / "weights.st").write_bytes(tensors_to_bytes(dict(model.state_dict())))
    (out / "io.st").write_bytes(tensors_to_bytes({"x": x, "expected": expected}))
    print(f"saved {out / 'net.kiln'}")


def load(src: Path) -> None:
    import kiln.runtime as runtime
    from kiln.runtime.tensors import tensors_from_bytes

    available = [m for m in COMPILER_STAGES[:-1] if _importable(m)]
    if available:
        raise SystemExit(f"this venv should hold kiln-graph and kiln-runtime only, found {available}")
    model = Net().eval()
    model.load_state_dict(tensors_from_bytes((src / "weights.st").read_bytes()))
    io = tensors_from_bytes((src / "io.st").read_bytes())
    fn = runtime.load_compiled_function(src / "net.kiln")
    with torch.no_grad():
        got = fn(model, io["x"])
        torch.testing.assert_close(got, io["expected"])
        torch.testing.assert_close(got, model(io["x"]))
        try:
            fn(model, torch.randn(2, 3, 9, 9))
        except runtime.GuardError as e:
            print(f"wrong shape: GuardError ({e})")
        else:
            raise SystemExit("a wrong-shaped input must raise GuardError")
    loaded = sorted(m for m in sys.modules if m.startswith(COMPILER_STAGES)
                    or m.startswith(("torch._dynamo", "torch._inductor")))
    if loaded:
        raise SystemExit(f"loading the artifact imported compiler modules: {loaded}")
    print(f"runtime-only load: ok (max abs err {float((got - io['expected']).abs().max()):.2e}; "
          "no compiler module imported)")


def _importable(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    {"save": save, "load": load}[mode](where)
