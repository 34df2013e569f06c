"""Names of torch.distributed's functional collectives, as extern calls carry them (``ExternKernel.target``)."""

from __future__ import annotations

WAIT_TENSOR = "_c10d_functional.wait_tensor.default"

# the ops that start communication and return at once (their outputs are ready after a wait_tensor)
COLLECTIVES = tuple(f"_c10d_functional.{op}.default" for op in (
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast"))


def issues_collective(target: str) -> bool:
    """A ``_c10d_functional`` call that starts communication (anything in that namespace but the wait)."""
    return target.startswith("_c10d_functional.") and target != WAIT_TENSOR
