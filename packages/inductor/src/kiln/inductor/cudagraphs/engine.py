"""Graph engines: the device-specific half of a CUDA graph tree (pools, capture, replay, sync watching).

``CudaGraphEngine`` drives ``torch.cuda.CUDAGraph``. ``EmulatedGraphEngine`` reproduces the semantics
that matter to the tree's bookkeeping on CPU tensors: a capture has no side effects and its outputs live
at fixed addresses; a replay recomputes from the graph's input slots and *overwrites* those outputs in
place. It lets CI test liveness tracking, relocation and re-recording without a GPU.

Note: only the public ``CUDAGraph.capture_begin/capture_end/replay`` and ``graph_pool_handle`` are used
(stable from torch 2.0 to now); ``torch.cuda.graph``'s context manager gained many options over
versions and runs ``empty_cache`` on entry, which we do not want per recording.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen ops that wait for the device (their result size or value lives on the host).
_SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::repeat_interleave", "aten::bincount", "aten::histc", "aten::_assert_async",
})


class CaptureFailed(RuntimeError):
    """Recording a graph failed; the function runs without CUDA graphs from now on."""


class SyncOpDetector(TorchDispatchMode):
    """Notes ATen ops that synchronise with the host (``.item()``, ``nonzero``, device->CPU copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _SYNC_OPS:
            self.found.append(f"{name.removeprefix('aten::')} (a host synchronisation)")
        elif name in ("aten::_to_copy", "aten::copy_") and _device_to_host(name, args, kwargs):
            self.found.append(f"{name.removeprefix('aten::')} from the device to the CPU")
        return func(*args, **kwargs)


def _device_to_host(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if name == "aten::copy_":
        dst, src = args[0], args[1]
        return (isinstance(src, torch.Tensor) and src.device.type == "cuda"
                and isinstance(dst, torch.Tensor) and dst.device.type == "cpu")
    src, dev = args[0], kwargs.get("device")
    return (isinstance(src, torch.Tensor) and src.device.type == "cuda"
            and dev is not None and torch.device(dev).type == "cpu")


class GraphEngine(Protocol):
    device_type: str

    def new_pool(self, device: torch.device) -> object: ...

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: object,
                device: torch.device, capture_error_mode: str) -> tuple[object, Any]: ...

    def replay(self, graph: object) -> None: ...

    def watch_syncs(self) -> contextlib.AbstractContextManager[list[str]]: ...


class CudaGraphEngine:
    """Records into ``torch.cuda.CUDAGraph`` on a per-device side stream, into one shared pool."""

    device_type = "cuda"

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}

    def new_pool(self, device: torch.device) -> object:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: object,
                device: torch.device, capture_error_mode: str) -> tuple[object, Any]:
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # inputs copied into slots, warm-up work finished
            stream = self._stream(device)
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
                try:
                    outputs = fn(*args)
                except BaseException as e:
                    with contextlib.suppress(Exception):
                        graph.capture_end()  # leave the stream out of capture mode
                    raise CaptureFailed(f"{type(e).__name__}: {e}") from e
                try:
                    graph.capture_end()
                except Exception as e:
                    raise CaptureFailed(f"{type(e).__name__}: {e}") from e
            torch.cuda.current_stream().wait_stream(stream)
        return graph, outputs

    def replay(self, graph: object) -> None:
        graph.replay()  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def watch_syncs(self) -> Iterator[list[str]]:
        found: list[str] = []
        previous = torch.cuda.get_sync_debug_mode()
        detector = SyncOpDetector()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with detector:
                    yield found
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        found.extend(detector.found)
        # (the mode itself warns that it is a prototype: only the per-operation warnings count)
        found.extend(str(w.message).splitlines()[0] for w in caught
                     if "called a synchronizing" in str(w.message))


class _EmulatedGraph:
    __slots__ = ("args", "fn", "outputs")

    def __init__(self, fn: Callable[..., Any], args: list[Any], outputs: Any) -> None:
        self.fn, self.args, self.outputs = fn, args, outputs


class EmulatedGraphEngine:
    """CPU stand-in with CUDA graph semantics, for testing the tree's bookkeeping without a GPU."""

    device_type = "cpu"

    def new_pool(self, device: torch.device) -> object:
        return object()

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: object,
                device: torch.device, capture_error_mode: str) -> tuple[object, Any]:
        # A capture runs nothing: give the function copies so in-place updates of static inputs do
        # not happen twice (the replay that follows a recording applies them once).
        scratch = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with SyncOpDetector() as detector:
            try:
                outputs = fn(*scratch)
            except Exception as e:
                raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        if detector.found:
            raise CaptureFailed(f"operation not permitted when stream is capturing: {detector.found[0]}")
        return _EmulatedGraph(fn, list(args), outputs), outputs

    def replay(self, graph: object) -> None:
        assert isinstance(graph, _EmulatedGraph)
        fresh = graph.fn(*graph.args)
        fresh_seq = fresh if isinstance(fresh, (tuple, list)) else (fresh,)
        static_seq = graph.outputs if isinstance(graph.outputs, (tuple, list)) else (graph.outputs,)
        with torch.no_grad():
            for static, value in zip(static_seq, fresh_seq):
                if isinstance(static, torch.Tensor) and static.data_ptr() != value.data_ptr():
                    static.copy_(value)  # overwrite in place, as a replay does

    @contextlib.contextmanager
    def watch_syncs(self) -> Iterator[list[str]]:
        found: list[str] = []
        detector = SyncOpDetector()
        with detector:
            yield found
        found.extend(detector.found)
