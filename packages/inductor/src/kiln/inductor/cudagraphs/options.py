"""Options of kiln's CUDA graph trees (mode="reduce-overhead"), one frozen value passed down."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CUDAGraphOptions:
    # graphs recorded per function (one per input signature); then new signatures run without graphs. Also
    # none once the tree's recordings have grown the allocator's reserved memory by ``memory_fraction`` of
    # the device's: a decode loop with a growing cache keeps each length's outputs (H100, generate() of 64
    # tokens at batch 2, fp32: 20 MiB a recording for Llama-350M, 8 for GPT-2)
    max_recordings: int = 64
    memory_fraction: float = 0.1
    warmup_runs: int = 1  # eager runs of a new input signature before it is recorded (lazy init, autotuning)
    capture_error_mode: str = "thread_local"  # cudaStreamCaptureMode for the capture stream
    detect_syncs: bool = True  # watch warm-up runs for host synchronisation (which capture cannot hold)
    # an input the function writes in place is graphed at its own address, its layout checked per call
    # (else the function runs without graphs: a replay would write kiln's copy, not the caller's tensor)
    graph_written_inputs: bool = True
    relocate_outputs: bool = True  # move outputs the user still holds out of the way of a replay (else run eagerly)
    donate_saved: bool = True  # a backward's recording reuses the saved activations it reads (tree.py)

    def replace(self, **changes: object) -> CUDAGraphOptions:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
