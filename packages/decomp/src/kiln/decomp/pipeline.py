"""kiln.decomp's passes, in order: an ATen (or torch-dialect) graph down to core ATen, then to prims.

    to_core_aten  decompose with table("core_aten"): everything outside CORE_ATEN_OPS, to a fixpoint
    to_prims      decompose with table("prims"): core ATen -> kiln_prims (explicit broadcast/promotion)

``lower(gm, "core_aten" | "prims")`` runs them with ``run_pipeline`` (verifying after each pass under
KILN_VERIFY=1, and keeping each pass's printed graph when asked), so a caller can list every
intermediate program and its timing.
"""

from __future__ import annotations

from torch import fx

from kiln.graph import KNOBS, KeepText, Pass, PipelineResult, print_graph, run_pipeline, verify

from .retrace import decompose
from .tables import table


def _to_core_aten(gm: fx.GraphModule, ctx: object) -> fx.GraphModule:
    return decompose(gm, table("core_aten"))


def _to_prims(gm: fx.GraphModule, ctx: object) -> fx.GraphModule:
    return decompose(gm, table("prims"))


PASSES: dict[str, Pass[fx.GraphModule]] = {
    "core_aten": Pass("to_core_aten", _to_core_aten, "decompose non-core ATen ops to a fixpoint"),
    "prims": Pass("to_prims", _to_prims, "map core ATen to kiln_prims"),
}
ORDER = ("core_aten", "prims")


def lower(gm: fx.GraphModule, to: str = "core_aten", *, keep_text: bool = False) -> PipelineResult[fx.GraphModule]:
    """Run the passes up to dialect ``to`` ("core_aten" or "prims")."""
    if to not in ORDER:
        raise ValueError(f"kiln.decomp.lower(to={to!r}): expected one of {', '.join(ORDER)}")
    passes = [PASSES[name] for name in ORDER[: ORDER.index(to) + 1]]
    instruments: list = []
    if KNOBS.verify:
        instruments.append(_VerifyEach({"to_core_aten": "core_aten", "to_prims": "prims"}))
    if keep_text:
        instruments.append(KeepText(print_graph))
    return run_pipeline(passes, gm, None, instruments)


class _VerifyEach:
    """Verify each pass's output against the dialect that pass promises."""

    def __init__(self, dialect_of: dict[str, str]) -> None:
        self.dialect_of = dialect_of

    def after(self, name: str, value: fx.GraphModule, seconds: float, records: list) -> None:
        verify(value, self.dialect_of[name])
