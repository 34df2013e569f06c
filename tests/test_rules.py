"""Project rules that a test enforces: no torch compiler inside kiln, and DESIGN.md's layering."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_MODULES = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp",
                     "torch._refs", "torch._prims", "torch.export")
FORBIDDEN_NAMES = ("make_fx", "torch.compile")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _forbidden(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES + FORBIDDEN_NAMES) \
        or name.split(".")[-1] == "make_fx"


def forbidden_uses(source: str) -> list[tuple[int, str]]:
    """Uses of torch's compiler in code (imports, attribute chains, names) — not in strings."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [d] if (d := _dotted(node)) else []
        elif isinstance(node, ast.Name):
            names = [node.id]
        hits += [(node.lineno, n) for n in names if _forbidden(n)]
    return hits


def _sources() -> list[Path]:
    files = list((ROOT / "src").rglob("*.py"))
    for pkg in (ROOT / "packages").glob("*/src"):
        files += pkg.rglob("*.py")
    return files


def test_packages_do_not_use_torchs_compiler() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in _sources() for line, name in forbidden_uses(path.read_text())]
    assert not offenders, "torch's compiler used inside kiln:\n" + "\n".join(offenders)


def test_the_rule_catches_a_violation() -> None:
    assert forbidden_uses("from torch._dynamo import optimize")
    assert forbidden_uses("import torch._inductor.config")
    assert forbidden_uses("from torch import _dynamo")
    assert forbidden_uses("gm = make_fx(f)(x)")
    assert forbidden_uses("from torch.fx.experimental.proxy_tensor import make_fx")
    assert forbidden_uses("y = torch.compile(f)")
    assert forbidden_uses("torch._functorch.config.x = 1")
    assert not forbidden_uses("import torch.fx\ns = 'torch.compile(model) in a docstring'")


def test_import_layering() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "layering.py")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
