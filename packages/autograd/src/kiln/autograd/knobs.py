"""Environment variables of kiln.autograd, read once (STYLE.md rule 4)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AutogradKnobs:
    partitioner: str  # KILN_PARTITIONER: default partitioner for the aot_eager backend
    recompute_norms: bool  # KILN_RECOMPUTE_NORMS=0: save what follows training BatchNorm (recompute.py)


def read_knobs(env: dict[str, str] | None = None) -> AutogradKnobs:
    e = os.environ if env is None else env
    return AutogradKnobs(partitioner=e.get("KILN_PARTITIONER", "min_cut"),
                         recompute_norms=e.get("KILN_RECOMPUTE_NORMS", "1") not in ("0", "false", "off"))


KNOBS = read_knobs()
