"""The fast Triton launcher generated wrappers use (kept as text: written into every wrapper module,
and exec'd here for in-process use and tests).

triton's ``fn[grid](*args, **consts)`` binds arguments, computes a specialisation key and looks the
binary up in Python on every launch: 10-40 us, which dominates a model of a few hundred small kernels
on a GPU. ``_KilnLaunch`` pays that once: the first call goes through triton (which compiles and
returns the binary); later calls hand the arguments straight to the binary's C launcher while what
triton specialised on is unchanged -- each tensor's 16-byte alignment and each int's "== 1" and
"multiple of 16" -- and the current device is the one it compiled for. Anything else (another
alignment, a launch hook installed by a profiler, the interpreter) takes triton's own path, so the
fast path never launches a binary that triton would not have chosen. A kernel's size arguments are
``free`` (codegen/triton/kernel.py SIZE_ARG_TYPE: declared ``i64`` and in ``do_not_specialize``, which
the launcher confirms with the JIT function's own parameters): triton keys them by that declared type
alone, so they are neither checked per launch nor part of the launch record, and every size runs the
one binary.

A first launch after a warm start (kernels handed to triton from a cache entry or artifact,
``kiln.runtime.triton_preload``) skips triton's path too: beside each binary kiln keeps a
``LaunchRecord`` (``kiln.runtime.triton_notes``: declared data, not an attribute set on triton's
object) of what the launch that made it passed -- the constexprs, warps, stages, triton's launch-option knobs
and, per argument, everything triton specialises on (a tensor's dtype and 16-byte alignment, an
int's "== 1", "multiple of 16" and 32/64-bit range; a free int only its declared type) -- recorded
when it was compiled and saved with it. A launcher whose first call describes its arguments exactly
so binds that binary directly: no ``JITFunction.run``, whose first specialisation in a process
imports triton's gluon packages (0.1 s). Any difference (or no description) takes triton's path,
which finds or compiles the binary as before.

The wrapper reads the CUDA device and stream once per call (``_kiln_launch_context(*inputs)``) and passes
them to every launch, with whether all the graph inputs its kernels take are 16-byte aligned (they do
not change within a call): a launcher adopted with its checked inputs aligned then skips its own
per-launch alignment check while they stay so. The binary's C ``launch`` is called with triton's fixed
arguments prepended once (``head``), no Python frame in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

LAUNCHER = '''\
def _kiln_make_launch_support():
    import torch
    from kiln.runtime.knobs import triton_interpret
    from kiln.runtime.triton_notes import KERNEL_NOTES as notes, LaunchRecord
    interpret = triton_interpret()
    try:
        from torch._C import _cuda_getCurrentRawStream as raw_stream
    except ImportError:  # torch without CUDA: only the interpreter runs kernels
        raw_stream = None

    def hooks_installed():
        """A profiler (proton, ...) set triton's launch hooks: keep triton's path, which calls them."""
        def active(hook):  # triton >= 3.5 keeps an always-present HookChain; older ones None or a function
            return hook is not None and bool(getattr(hook, "calls", True))
        try:
            from triton import knobs
            return active(knobs.runtime.launch_enter_hook) or active(knobs.runtime.launch_exit_hook)
        except (ImportError, AttributeError):
            from triton.compiler import CompiledKernel
            return active(getattr(CompiledKernel, "launch_enter_hook", None))

    def launch_context(*inputs):
        """(device index, raw stream, whether every tensor of ``inputs`` is 16-byte aligned: False with
        none) for this call's launches; (-1, 0, False) under the interpreter."""
        if interpret or raw_stream is None or not torch.cuda.is_initialized():
            return (-1, 0, False)
        device = torch.cuda.current_device()
        bits = 0
        for t in inputs:
            bits |= t.data_ptr()
        return (device, raw_stream(device), bool(inputs) and not bits & 15)

    def spec_key(args, check):
        """What triton specialised on, for the arguments that can change between calls (graph inputs
        and specialised ints; buffers the wrapper allocates are always aligned, free sizes are never
        specialised on): ``check`` is their positions."""
        return tuple((a.data_ptr() & 15) == 0 if isinstance(a, torch.Tensor) else
                     (a == 1, a % 16 == 0) if isinstance(a, int) else None
                     for a in (args if check is None else [args[i] for i in check]))

    def arg_spec(a):
        """What triton specialises a kernel on for one argument (JSON data); None: not known here."""
        if isinstance(a, torch.Tensor):
            return ["T", str(a.dtype), (a.data_ptr() & 15) == 0]
        if type(a) is int:
            return ["i", a == 1, a % 16 == 0, -2**31 <= a < 2**31, -2**63 <= a < 2**63]
        if type(a) is float:
            return ["f"]
        if type(a) is bool:
            return ["b", a]
        return None

    def declared_free(fn, free):
        """{position: declared type} of the ``free`` int arguments, when triton's own view of ``fn``
        agrees that none is specialised on (each in ``do_not_specialize`` with a declared type, so
        triton's key for it is that type alone); else {} (then they are keyed as any int)."""
        try:
            params = fn.params
            out = {i: params[i].annotation_type for i in free
                   if params[i].do_not_specialize and params[i].annotation_type}
        except (AttributeError, IndexError, TypeError):  # the interpreter's function, a test double
            return {}
        return out if len(out) == len(free) else {}

    def option_knobs():
        """triton's knobs that enter a kernel's launch options (so its key) besides the arguments."""
        try:
            from triton import knobs
        except ImportError:
            return []
        def read(group, name):
            return repr(getattr(getattr(knobs, group, None), name, None))
        return [read("runtime", "debug"), read("compilation", "instrumentation_mode"),
                read("compilation", "fpsan_homomorphic_casts"), read("runtime", "override_arch"),
                read("language", "default_fp_fusion"), read("language", "force_disable_fp_fusion"),
                read("language", "fp32_default"),
                getattr(getattr(knobs, "runtime", None), "add_stages_inspection_hook", None) is None]

    class KilnLaunch:
        """One kernel's launcher: triton's path first, then its binary directly (module docstring)."""
        __slots__ = ("fn", "consts", "num_warps", "check", "num_stages", "run", "function", "meta", "key", "device",
                     "tail", "bound_preloaded", "free", "head", "aligned", "pdl")

        def __init__(self, fn, consts, num_warps, check=None, num_stages=1, free=(), pdl=False):
            self.fn, self.consts, self.num_warps = fn, consts, num_warps
            self.pdl = pdl  # launched directly with programmatic dependent launch (codegen/triton/pdl.py)
            self.free = declared_free(fn, free) if free else {}
            if free and not self.free:  # triton specialises them after all: key them per launch
                check = None if check is None else tuple(check) + tuple(free)
            elif self.free and check is None:  # every argument but the free ones
                count = len(fn.arg_names) - len(consts)
                check = tuple(i for i in range(count) if i not in self.free)
            self.check = check
            self.num_stages = num_stages  # software pipelining depth (matmul templates use 3-5)
            self.run = None
            self.bound_preloaded = None  # None: not tried yet; then whether a preloaded binary was bound
            self.aligned = False  # adopted with every checked argument an aligned tensor (see __call__)

        def __call__(self, grid, ctx, *args):
            run = self.run
            # ctx[2]: the wrapper found all its kernels' graph inputs aligned this call, which is this
            # launcher's key when it was adopted with only aligned input tensors checked
            if run is not None and ctx[0] == self.device and (
                    not self.check or (self.aligned and ctx[2]) or spec_key(args, self.check) == self.key):
                try:
                    run(grid[0], grid[1], grid[2], ctx[1], self.function, *self.head, *args, *self.tail)
                    return
                except TypeError:  # a triton whose launcher takes other arguments: use triton's path
                    self.run = None
            if run is None and self.bound_preloaded is None and ctx[0] >= 0:
                self.bound_preloaded = self.bind_preloaded(ctx[0], args)
                if self.bound_preloaded:
                    return self(grid, ctx, *args)  # the fast path above, with the bound binary
            binary = self.fn[grid](*args, **self.consts, num_warps=self.num_warps, num_stages=self.num_stages)
            if binary is not None and notes.launch(binary) is None:
                try:  # what this launch specialised on, saved with the binary (triton_preload.kernel_record)
                    notes.note_launch(binary, LaunchRecord.of(self.describe(args)))
                except Exception:  # noqa: BLE001 - a binary without a description is never bound directly
                    pass
            if self.run is None and run is None and ctx[0] >= 0 and binary is not None and not hooks_installed():
                self.adopt(binary, ctx[0], args)

        def describe(self, args):
            """This launch as triton would key it, as JSON data (None when an argument is not known here)."""
            specs = [["n", self.free[i]] if i in self.free and type(a) in (int, float) else arg_spec(a)
                     for i, a in enumerate(args)]
            if any(s is None for s in specs):
                return None
            return [[[k, self.consts[k]] for k in sorted(self.consts)], self.num_warps, self.num_stages,
                    option_knobs(), specs]

        def bind_preloaded(self, device, args):
            """Bind a binary handed to triton at load (kiln.runtime.triton_preload) whose recorded launch is
            described exactly as this one: True when bound (no JITFunction.run), else triton's path."""
            try:
                caches = getattr(self.fn, "device_caches", None)
                if caches is None or device not in caches or getattr(self.fn, "pre_run_hooks", None):
                    return False
                kernels = [k for k in caches[device][0].values() if notes.launch(k) is not None]
                if not kernels or hooks_installed():
                    return False
                want = LaunchRecord.of(self.describe(args))
                kernel = next((k for k in kernels if notes.launch(k) == want), None) if want is not None else None
                if kernel is None:
                    return False
                self.adopt(kernel, device, args)
            except Exception:  # noqa: BLE001 - e.g. the binary does not load here: triton's path says why
                self.run = None
            return self.run is not None

        def adopt(self, binary, device, args):
            names = list(self.fn.arg_names)
            if set(names[len(args):]) != set(self.consts):
                return  # an argument order this launcher does not know: stay on triton's path
            try:
                run = binary.run  # first: a binary not launched yet loads onto the GPU here (function is set)
                self.function, self.meta = binary.function, binary.packed_metadata
            except AttributeError:  # a triton without these (older/newer API): stay on triton's path
                return
            if self.function is None:
                return
            self.tail = tuple(self.consts[n] for n in names[len(args):])
            self.key, self.device = spec_key(args, self.check), device
            self.aligned = bool(self.check) and all(
                isinstance(args[i], torch.Tensor) and k is True for i, k in zip(self.check, self.key))
            direct = _kiln_direct_launch(run, self.pdl)
            # triton's launcher (or its C launch, with the arguments triton's __call__ puts first)
            self.head = (self.meta, None, None, None) if direct is None else (*direct.head, self.meta, None, None, None)
            self.run = run if direct is None else direct.launch

    return launch_context, KilnLaunch, hooks_installed


def _kiln_make_direct_launch():
    """triton's ``CompiledKernel.run`` is a Python ``__call__`` that allocates scratch memory (none for
    kiln's kernels) and then calls the C ``launch`` with a fixed prefix of arguments; calling ``launch``
    with that prefix saves a few us per kernel. Only when triton's own ``__call__`` visibly passes
    exactly that prefix (read once from its source), the kernel needs no scratch and no sanitizer is on."""
    import inspect
    prefix = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
              "self.launch_pdl,")
    known = {}

    def matches(cls):
        if cls not in known:
            try:
                src = " ".join(inspect.getsource(cls.__call__).split())
            except (OSError, TypeError, AttributeError):
                src = ""
            after = src.split(prefix, 1)[1] if prefix in src else ""
            known[cls] = after.lstrip().startswith("global_scratch, profile_scratch, *args)")
        return known[cls]

    class Direct:
        __slots__ = ("launch", "head")

        def __init__(self, launch, head):
            self.launch, self.head = launch, head

        def __call__(self, gx, gy, gz, stream, function, *rest):
            self.launch(gx, gy, gz, stream, function, *self.head, *rest)

    def direct_launch(run, pdl=False):
        try:
            if (run.global_scratch_size or run.profile_scratch_size or getattr(run, "gsan_enabled", False)
                    or not matches(type(run))):
                return None
            return Direct(run.launch, (run.launch_cooperative_grid, bool(run.launch_pdl or pdl), None, None))
        except AttributeError:
            return None
    return direct_launch


_kiln_direct_launch = _kiln_make_direct_launch()


# the wrapper's kernels compiled together when it loads, on threads (kiln.runtime.triton_compile): the
# in-process side of kiln's one Triton compile pool, for kernels its worker processes do not have
from kiln.runtime.triton_compile import precompile as _kiln_precompile
_kiln_launch_context, _KilnLaunch, _kiln_hooks_installed = _kiln_make_launch_support()
'''

class Launch(Protocol):
    """A ``KilnLaunch``: ``launch(grid, launch_context(), *args)`` runs the kernel."""

    def __call__(self, grid: tuple[int, ...], ctx: object, *args: object) -> object: ...


_ns: dict[str, object] = {}
exec(compile(LAUNCHER, "<kiln triton launcher>", "exec"), _ns)  # noqa: S102 - our own constant text
launch_context = cast(Callable[[], object], _ns["_kiln_launch_context"])
# KilnLaunch(fn, consts, num_warps, check=None, num_stages=1, free=(), pdl=False)
KilnLaunch = cast(Callable[..., Launch], _ns["_KilnLaunch"])
hooks_installed = _ns["_kiln_hooks_installed"]
direct_launch = _ns["_kiln_direct_launch"]
precompile = _ns["_kiln_precompile"]
