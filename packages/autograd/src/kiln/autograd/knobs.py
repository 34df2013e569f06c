"""Environment variables of kiln.autograd, read once (STYLE.md rule 4)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AutogradKnobs:
    partitioner: str  # KILN_PARTITIONER: default partitioner for the aot_eager backend


def read_knobs(env: dict[str, str] | None = None) -> AutogradKnobs:
    e = os.environ if env is None else env
    return AutogradKnobs(partitioner=e.get("KILN_PARTITIONER", "min_cut"))


KNOBS = read_knobs()
