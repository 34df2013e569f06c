"""A Triton compile worker process: generated kernels compiled into triton's on-disk cache, one a line.

Run as a script (``python compile_worker.py``), not imported through kiln, so a worker starts in the
time it takes to import torch and triton (started early, while the parent captures and lowers).
Protocol: one JSON job per stdin line (``compile_job``'s arguments); one JSON ``[status, seconds,
error, cpu seconds]`` per stdout line.

Each job goes through the JIT's own path, ``fn.warmup(dtypes..., constexprs, num_warps,
num_stages)``, with triton's driver replaced by one that only names the target (``TargetOnlyDriver``):
the worker never touches the GPU (no CUDA context, no device memory), and the binary lands in
triton's cache under the very key the parent's first launch computes -- same function source, same
specialisation (``warmup`` treats every pointer as 16-byte aligned, as the wrapper's buffers are), same
options -- so that launch loads it from disk instead of compiling. The target is the parent's device
(``cuda``, arch 90 on an H100/H200) or, cross-compiling on a host without a GPU, the one asked for.

Only the standard library and triton are imported in a worker -- not torch: importing torch took
2-4 s of each worker's start (16 workers on a 16-core GPU host: every core busy for seconds while the
parent captures and lowers), triton alone 0.3 s. Pointer arguments are triton's ``MockTensor`` over
a stand-in dtype that prints as ``torch.<name>`` (all triton reads of it: ``canonicalize_dtype`` takes
``str(dtype)``), and triton 3.6's one import of torch (its argument specializer's first call, to recognise
``torch.Tensor``) gets a stand-in module (``_torch_stub``), so the kernel's signature, and its cache key,
are the ones a launch with real tensors computes (tested). The parent may also call ``compile_job``
in-process (the fallback when worker processes cannot be used): there torch is loaded, and its dtypes
are used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

_MODULES: dict[str, types.ModuleType] = {}


class TargetOnlyDriver:
    """Stands in for triton's active driver while threads compile for a target without using a device:
    a compiling thread gets what ``JITFunction.warmup`` and ``triton.compile`` ask of a driver for its
    target, and nothing else; any other thread gets the driver that was active before (``previous``,
    or triton's default made when first asked), so a kernel launch in another thread of the parent
    (a model running while a tiered wrapper's C++ program is built in the background) is not
    answered by a driver that cannot launch."""

    def __init__(self, previous: Any = None) -> None:
        self.previous = previous
        self.targets: dict[int, Any] = {}  # compiling thread id -> its GPUTarget

    def _target(self) -> Any:
        return self.targets.get(threading.get_ident())

    def get_current_device(self) -> int:
        return 0 if self._target() is not None else self._real().get_current_device()

    def get_current_stream(self, device: int | None = None) -> int:
        return 0 if self._target() is not None else self._real().get_current_stream(device)

    def get_current_target(self) -> Any:
        target = self._target()
        return target if target is not None else self._real().get_current_target()

    def _real(self) -> Any:
        if self.previous is None:
            from triton.runtime import driver

            self.previous = driver.default
        return self.previous

    def __getattr__(self, name: str) -> Any:
        if self._target() is None:
            return getattr(self._real(), name)
        raise AttributeError(f"kiln compile worker: triton asked the target-only driver for {name!r} "
                             "(only compiling is possible here)")


# In the parent, several threads compile at once (compile_pool's helpers, a tiered wrapper's build)
# while others launch kernels: the driver is process-global, so one TargetOnlyDriver is active while
# any thread compiles for a target, answers each compiling thread with its own target and every other
# thread with the driver it replaced; the last compiling thread out restores that driver. A module is
# imported by one thread while the others wait (a half-executed module has no kernels yet).
_LOCK = threading.Lock()
_ACTIVE: list[TargetOnlyDriver] = []  # the one installed while some thread compiles for a target


@contextlib.contextmanager
def target_driver(target: tuple[str, Any, int]) -> Iterator[None]:
    """triton's active driver answers this thread as a ``TargetOnlyDriver`` for ``target`` (backend,
    arch, warp size) inside; other threads keep the real driver."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    me = threading.get_ident()
    with _LOCK:
        if not _ACTIVE:
            _ACTIVE.append(TargetOnlyDriver(getattr(driver, "_active", None)))
            driver.set_active(_ACTIVE[0])
        stand_in = _ACTIVE[0]
        outer = stand_in.targets.get(me)
        stand_in.targets[me] = GPUTarget(*target)
    try:
        yield
    finally:
        with _LOCK:
            if outer is None:
                del stand_in.targets[me]
            else:
                stand_in.targets[me] = outer
            if not stand_in.targets:
                driver._active = stand_in.previous  # None: the default driver is made again when next asked for
                _ACTIVE.clear()


def load_module(path: str, name: str) -> types.ModuleType:
    """The generated kernel module at ``path``, imported once under the parent's module name."""
    with _LOCK:
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
            return sys.modules[name]
        if name in _MODULES:
            return _MODULES[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _MODULES[name] = module
        return module


def build_launcher(kernel: Any) -> None:
    """triton <= 3.6 builds a C launcher per kernel signature with the host compiler at the kernel's
    first launch (0.5-1 s each, serial in the parent, cached on disk by source): build it here, so the
    launch finds it. Later tritons launch through one generic launcher: nothing to build (the
    target-only driver refuses what they ask for)."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001, S110 - an optimisation: the launch builds it otherwise
        pass


def build_driver_utils() -> None:
    """triton's CUDA driver helpers (a C module built on first use of a fresh cache), built ahead."""
    try:
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except Exception:  # noqa: BLE001, S110 - the parent builds it on its first launch otherwise
        pass


class _DtypeName:
    """A torch dtype as triton reads it, in a process without torch: ``str()`` gives ``torch.<name>``.
    One object per name (triton's specializer caches by the dtype's hash)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash(("torch.dtype", self.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _DtypeName) and other.name == self.name


_DTYPES: dict[str, _DtypeName] = {}

def _pointer_args(names: list[str]) -> list[Any]:
    """What ``fn.warmup`` takes for pointer parameters of these dtypes: torch's dtypes when this process
    has torch (the parent), else mock tensors over stand-in dtypes (a worker)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return [getattr(torch, d) for d in names]
    from triton.runtime.jit import MockTensor

    return [MockTensor(_DTYPES.setdefault(d, _DtypeName(d))) for d in names]


@contextlib.contextmanager
def _torch_stub() -> Iterator[None]:
    """In a process without torch: ``import torch`` gives a module with only a ``Tensor`` class inside.
    triton 3.6's argument specializer imports torch at its first call, only to recognise
    ``torch.Tensor`` arguments (none here: mock tensors); the real import would cost 2-4 s."""
    if "torch" in sys.modules:
        yield
        return
    stub = types.ModuleType("torch", "kiln compile worker: torch is not loaded here")
    stub.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    sys.modules["torch"] = stub
    try:
        yield
    finally:
        if sys.modules.get("torch") is stub:
            del sys.modules["torch"]


def _cpu() -> float:
    """CPU seconds of this process and the compilers it waited for (ptxas, the launcher's cc)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def compile_kernel(job: dict[str, Any], target: tuple[str, Any, int] | None, launcher: bool = False) -> Any:
    """Compile one kernel specialisation (``compile_job``'s job) through the JIT's own path and return
    triton's compiled kernel (its ``asm["cubin"]`` and ``metadata``); ``target`` None: the current device."""
    fn = getattr(load_module(job["path"], job["module"]), job["function"])
    # size arguments are declared unspecialised (i64, ``do_not_specialize``): any value gives the key
    # every launch computes; 0 stands for all of them
    args = _pointer_args(job["dtypes"]) + [0] * int(job.get("sizes", 0))
    with target_driver(target) if target is not None else contextlib.nullcontext(), _torch_stub():
        kernel = fn.warmup(*args, grid=(1,), **dict(job["constants"]), num_warps=job["num_warps"],
                           num_stages=job["num_stages"])
        if launcher and kernel is not None:
            build_launcher(kernel)
    return kernel


def compile_job(job: dict[str, Any], target: tuple[str, Any, int] | None) -> tuple[str, float, str, float]:
    """Compile one kernel specialisation; ("ok" | "failed", seconds, error text, CPU seconds).
    ``target`` None: the current device (in-process on a GPU). ``job["launcher"]``: also build its C
    launcher."""
    t0, c0 = time.perf_counter(), _cpu()
    try:
        compile_kernel(job, target, launcher=bool(job.get("launcher")))
    except Exception as e:  # noqa: BLE001 - reported to the parent; the kernel compiles again at launch
        first = str(e).splitlines()[0] if str(e) else ""
        return ("failed", time.perf_counter() - t0, f"{type(e).__name__}: {first}", _cpu() - c0)
    return ("ok", time.perf_counter() - t0, "", _cpu() - c0)


def warm_up(target: tuple[str, Any, int]) -> None:
    """Compile ``compile_warmup.warm`` for ``target``: triton's one-time costs (its cache key's hash of its
    own library, its code generator's imports, ptxas's first run) paid now, not on the first job."""
    job = {"path": os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_warmup.py"),
           "module": "kiln_compile_warmup", "function": "warm", "dtypes": ["float32"], "sizes": 0,
           "constants": [["XBLOCK", 128]], "num_warps": 4, "num_stages": 1}
    compile_job(job, target)  # a failure is the first real job's to report


def main() -> None:
    out = os.fdopen(os.dup(1), "w")  # the protocol's channel; whatever triton prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # below the parent: a pool started at kiln.compile starts on every core while the parent captures
    # (or, on a warm start, only loads cached graphs and needs no worker at all)
    with contextlib.suppress(AttributeError, OSError):
        os.nice(5)
    if "--with-torch" in sys.argv:
        import torch  # noqa: F401
    import triton  # noqa: F401 - paid now, while the parent is still capturing and lowering

    if "--driver-utils" in sys.argv:
        build_driver_utils()

    out.write(json.dumps(["ready", 0.0, "", 0.0]) + "\n")
    out.flush()
    warm = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--warm=")), "")
    if warm:  # before the first job is read: a job sent meanwhile waits in the pipe
        warm_up(tuple(json.loads(warm)))
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        target = tuple(job["target"]) if job.get("target") else None
        out.write(json.dumps(compile_job(job, target)) + "\n")  # type: ignore[arg-type]
        out.flush()


if __name__ == "__main__":
    main()
