"""Names of torch.distributed's functional collectives, as extern calls carry them (``ExternKernel.target``)."""

from __future__ import annotations

WAIT_TENSOR = "_c10d_functional.wait_tensor.default"

# eager's wrapping of a collective's result in an AsyncCollectiveTensor: the identity in a graph
WRAP_TENSOR = "_c10d_functional._wrap_tensor_autograd.default"

# the ops that start communication and return at once (their outputs are ready after a wait_tensor)
COLLECTIVES = tuple(f"_c10d_functional.{op}.default" for op in (
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast"))
_IN_PLACE = ("_c10d_functional.all_reduce_.default", "_c10d_functional.all_reduce_coalesced_.default")


def issues_collective(target: str) -> bool:
    """A ``_c10d_functional`` call that starts communication."""
    return target in COLLECTIVES or target in _IN_PLACE
