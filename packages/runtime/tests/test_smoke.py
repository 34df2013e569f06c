"""kiln.runtime stands alone: it imports only torch and kiln.graph, never torch's compiler.

(test_fresh_process also checks, in a clean interpreter, that loading pulls in no other stage.)
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "kiln" / "runtime"
BANNED = ("torch.compile", "torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp",
          "torch._refs", "torch._prims", "torch.export", "make_fx")


def test_sources_do_not_use_torch_compiler_or_other_stages():
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for banned in BANNED:
            assert banned not in text, f"{path.name} uses {banned}"
        for m in re.finditer(r"^\s*(?:from|import)\s+(kiln\.\w+)", text, re.M):
            assert m.group(1) in ("kiln.graph", "kiln.runtime"), f"{path.name} imports {m.group(1)}"
