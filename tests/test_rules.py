"""Project rules that a test enforces: no torch compiler inside kiln, and DESIGN.md's layering."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = re.compile(
    r"torch\._dynamo|torch\._inductor|torch\._functorch|torch\._decomp|torch\._refs"
    r"|torch\._prims(?!_common)\b|torch\.export|make_fx|torch\.compile\("
)


def _sources() -> list[Path]:
    files = list((ROOT / "src").rglob("*.py"))
    for pkg in (ROOT / "packages").glob("*/src"):
        files += pkg.rglob("*.py")
    return files


def test_packages_do_not_use_torchs_compiler() -> None:
    offenders = []
    for path in _sources():
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if FORBIDDEN.search(code):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "torch's compiler used inside kiln:\n" + "\n".join(offenders)


def test_the_rule_catches_a_violation() -> None:
    assert FORBIDDEN.search("from torch._dynamo import optimize")
    assert FORBIDDEN.search("gm = make_fx(f)(x)")
    assert not FORBIDDEN.search("import torch.fx")


def test_import_layering() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "layering.py")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
