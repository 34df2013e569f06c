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
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..knobs import KNOBS
from .liveness import CAN_DONATE

# ATen ops that wait for the device (their result size or value lives on the host).
_SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::repeat_interleave", "aten::bincount", "aten::histc", "aten::_assert_async",
})


class CaptureFailed(RuntimeError):
    """Recording a graph failed; the function runs without CUDA graphs from now on."""


@dataclass(slots=True)
class WarmupReport:
    """What a warm-up run did that a CUDA graph cannot replay faithfully."""

    syncs: list[str] = field(default_factory=list)  # host synchronisations
    mutated: set[int] = field(default_factory=set)  # argument indices written in place


class WarmupWatcher(TorchDispatchMode):
    """Watches a warm-up run's ATen ops for host synchronisation (``.item()``, ``nonzero``, device->CPU
    copies) and for in-place writes to the storages in ``watch`` (data_ptr -> argument index).

    Note: version counters also reveal in-place writes, but inference tensors have none, and a
    decode loop typically runs under ``torch.inference_mode()``; the dispatcher sees both.
    """

    def __init__(self, watch: dict[int, int] | None = None) -> None:
        super().__init__()
        self.report = WarmupReport()
        self.watch = watch or {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        name = schema.name
        if name in _SYNC_OPS:
            self.report.syncs.append(f"{name.removeprefix('aten::')} (a host synchronisation)")
        elif name in ("aten::_to_copy", "aten::copy_") and _device_to_host(name, args, kwargs):
            self.report.syncs.append(f"{name.removeprefix('aten::')} from the device to the CPU")
        if self.watch:
            self._note_writes(schema, args, kwargs)
        return func(*args, **kwargs)

    def _note_writes(self, schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and t.numel() > 0:
                    index = self.watch.get(t.untyped_storage().data_ptr())
                    if index is not None:
                        self.report.mutated.add(index)


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
    donates: bool  # a capture can free an input's memory after its last read (tree.py, donation)

    def new_pool(self, device: torch.device) -> object: ...

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: object, device: torch.device,
                capture_error_mode: str, owned: bool = False, expandable: bool = False) -> tuple[object, Any]: ...

    def replay(self, graph: object) -> None: ...

    def memory(self, device: torch.device) -> tuple[int, int] | None:
        """(bytes the allocator holds, the device's bytes); None where unknown."""
        ...

    def watch_warmup(self, watch: dict[int, int],
                     device: torch.device) -> contextlib.AbstractContextManager[WarmupReport]: ...


class CudaGraphEngine:
    """Records into ``torch.cuda.CUDAGraph`` on a per-device side stream, into one shared pool.

    ``expandable``: the recordings of a training tree (``capture(expandable=True)``: a forward whose saved
    activations a backward will take over, the backward that frees them as it goes) allocate in
    expandable segments (one virtual range, pages mapped as needed), so what the backward frees serves its
    own requests whatever their sizes. With fixed segments a request that fits no hole takes a new
    segment, and a training pool grows well past its allocated peak. Inference recordings keep fixed
    segments: a single graph's pool is then exactly the segments the same graph takes without CUDA
    graphs (expandable ones are not smaller there: better for transformers, worse for CNNs).
    benchmarks/RESULTS.md has the measurements."""

    device_type = "cuda"
    donates = CAN_DONATE

    def __init__(self, expandable: bool | None = None, allocator: AllocatorSettings | None = None) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        self.allocator = allocator if allocator is not None else AllocatorSettings()
        self.expandable = self.allocator.expandable_default() if expandable is None else expandable

    def new_pool(self, device: torch.device) -> object:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: Any, device: torch.device,
                capture_error_mode: str, owned: bool = False, expandable: bool = False) -> tuple[object, Any]:
        """``owned``: ``fn.call_owned(args)`` takes the list's references over and drops each input after
        its last read, so the allocator can give that memory to the rest of the capture. ``expandable``:
        allocate in expandable segments (if this engine may: ``self.expandable``)."""
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # inputs copied into slots, warm-up work finished
            stream = self._stream(device)
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream), self.allocator.expandable_segments(self.expandable and expandable):
                graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
                try:
                    outputs = fn.call_owned(args) if owned else fn(*args)  # type: ignore[attr-defined]
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

    def memory(self, device: torch.device) -> tuple[int, int] | None:
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.memory_reserved(device)), int(torch.cuda.get_device_properties(device).total_memory)

    @contextlib.contextmanager
    def watch_warmup(self, watch: dict[int, int], device: torch.device) -> Iterator[WarmupReport]:
        """Run the warm-up on the capture stream (as ``make_graphed_callables`` does): lazy per-stream
        state such as cuBLAS workspaces is then set up before the capture, not inside it."""
        watcher = WarmupWatcher(watch)
        previous = torch.cuda.get_sync_debug_mode()
        with torch.cuda.device(device):
            ambient = torch.cuda.current_stream()
            stream = self._stream(device)
            stream.wait_stream(ambient)  # inputs are ready; blocks freed earlier are done with
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with torch.cuda.stream(stream), watcher:
                        yield watcher.report
                finally:
                    torch.cuda.set_sync_debug_mode(previous)
                    ambient.wait_stream(stream)  # the caller's stream sees the outputs
        # the mode itself warns that it is a prototype: only the per-operation warnings count
        for w in caught:
            text = str(w.message)
            if "called a synchronizing" in text:
                watcher.report.syncs.append(text.splitlines()[0])
            elif "debug mode is a prototype" not in text:  # give the user's own warnings back
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


# the allocator's run-time settings entry: torch._C's (torch >= 2.9), else the older cuda.memory one
_SET_ALLOCATOR: Callable[[str], None] | None = (
    getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    or getattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings", None))


@dataclass(frozen=True)
class AllocatorSettings:
    """The CUDA caching allocator's settings as a recording sees them: the user's own
    (``PYTORCH_CUDA_ALLOC_CONF``, or ``PYTORCH_ALLOC_CONF``), whether kiln may switch on expandable
    segments (``KILN_CUDAGRAPH_EXPANDABLE``), and torch's run-time setter (None: this torch has none)."""

    user_conf: str = KNOBS.alloc_conf
    expandable_allowed: bool = KNOBS.cudagraph_expandable
    setter: Callable[[str], None] | None = _SET_ALLOCATOR

    def expandable_default(self) -> bool:
        """Expandable pool segments unless switched off, the user already has them everywhere or runs
        another allocator backend, or this torch cannot set them at run time."""
        if not self.expandable_allowed:
            return False
        conf = self.user_conf.replace(" ", "").lower()
        if "expandable_segments:true" in conf or "cudamallocasync" in conf:
            return False
        return self.setter is not None

    @contextlib.contextmanager
    def expandable_segments(self, on: bool) -> Iterator[None]:
        """Segments the allocator creates meanwhile (the recording's, in the tree's pool) are
        expandable. The allocator reads its settings as one string (a parse may reset the keys it
        does not name), so the user's own settings are passed along each time."""
        if not on:
            yield
            return
        sep = "," if self.user_conf else ""
        assert self.setter is not None
        self.setter(f"{self.user_conf}{sep}expandable_segments:True")
        try:
            yield
        finally:
            self.setter(f"{self.user_conf}{sep}expandable_segments:False")


class _EmulatedGraph:
    __slots__ = ("args", "fn", "outputs")

    def __init__(self, fn: Callable[..., Any], args: list[Any], outputs: Any) -> None:
        self.fn, self.args, self.outputs = fn, args, outputs


class EmulatedGraphEngine:
    """CPU stand-in with CUDA graph semantics, for testing the tree's bookkeeping without a GPU. Its
    ``memory()`` counts the bytes of every captured output as held, of a device of ``total_bytes``."""

    device_type = "cpu"
    donates = False  # a CPU stand-in has no allocator pool to hand memory back to

    def __init__(self, total_bytes: int = 1 << 34) -> None:
        self.total_bytes = total_bytes
        self.held_bytes = 0

    def memory(self, device: torch.device) -> tuple[int, int] | None:
        return self.held_bytes, self.total_bytes

    def new_pool(self, device: torch.device) -> object:
        return object()

    def capture(self, fn: Callable[..., Any], args: list[Any], *, pool: object, device: torch.device,
                capture_error_mode: str, owned: bool = False, expandable: bool = False) -> tuple[object, Any]:
        # A capture runs nothing: give the function copies so in-place updates of static inputs do
        # not happen twice (the replay that follows a recording applies them once).
        scratch = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with WarmupWatcher() as watcher:
            try:
                outputs = fn(*scratch)
            except Exception as e:
                raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        if watcher.report.syncs:
            raise CaptureFailed(f"operation not permitted when stream is capturing: {watcher.report.syncs[0]}")
        flat = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        self.held_bytes += sum(o.untyped_storage().nbytes() for o in flat if isinstance(o, torch.Tensor))
        return _EmulatedGraph(fn, list(args), outputs), outputs

    def replay(self, graph: object) -> None:
        assert isinstance(graph, _EmulatedGraph)
        fresh = graph.fn(*graph.args)
        fresh_seq = fresh if isinstance(fresh, (tuple, list)) else (fresh,)
        static_seq = graph.outputs if isinstance(graph.outputs, (tuple, list)) else (graph.outputs,)
        with torch.no_grad():
            for static, value in zip(static_seq, fresh_seq):
                if isinstance(static, torch.Tensor) and static.data_ptr() != value.data_ptr():
                    static.data.copy_(value)  # overwrite in place, as a replay does (no version bump)

    @contextlib.contextmanager
    def watch_warmup(self, watch: dict[int, int], device: torch.device) -> Iterator[WarmupReport]:
        watcher = WarmupWatcher(watch)
        with watcher:
            yield watcher.report
