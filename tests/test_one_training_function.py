"""One compiled-training ``autograd.Function`` (STYLE.md rule 11): kiln.graph's ``training_function``
runs compiled forward/backward graphs for kiln.autograd, for loaded programs (kiln.runtime) and for
tensor-parallel frames over DTensors (kiln.capture's dtensor_frames.py, through fw/bw adapters)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# every autograd.Function subclass in kiln, and why it is not a second compiled-training Function
ALLOWED = {
    "packages/graph/src/kiln/graph/compiled_call.py:CompiledFunction": "the one",
    "packages/graph/src/kiln/graph/compiled_call.py:CompiledBackward": "its backward under create_graph",
    "packages/graph/src/kiln/graph/compiled_call.py:InGraphLeaves":
        "a forward graph whose outputs require grad through leaves it made: no backward graph to run",
    "packages/capture/src/kiln/capture/pending.py:_Waited": "waits for a collective; identity gradient",
}


def function_classes(source: str) -> list[str]:
    """Names of the classes in ``source`` deriving from ``autograd.Function`` (any spelling)."""
    return [cls.name for cls in ast.walk(ast.parse(source)) if isinstance(cls, ast.ClassDef)
            and any(ast.unparse(b) == "Function" or ast.unparse(b).endswith("autograd.Function") for b in cls.bases)]


def test_kiln_has_one_compiled_training_function() -> None:
    found = [f"{path.relative_to(ROOT)}:{name}"
             for path in sorted([*ROOT.glob("src/**/*.py"), *ROOT.glob("packages/*/src/**/*.py")])
             for name in function_classes(path.read_text())]
    assert sorted(found) == sorted(ALLOWED), "an autograd.Function outside kiln.graph's compiled_call.py"


def test_the_rule_sees_functions() -> None:
    source = ("import torch\nfrom torch.autograd import Function\nclass F(torch.autograd.Function): pass\n"
              "class G(Function): pass\nclass H(torch.nn.Module): pass\n")
    assert function_classes(source) == ["F", "G"]
