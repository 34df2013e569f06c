"""Options of kiln's CUDA graph trees (mode="reduce-overhead"), one frozen value passed down."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CUDAGraphOptions:
    max_recordings: int = 8  # graphs recorded per function (one per input shape); then new shapes run without
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
