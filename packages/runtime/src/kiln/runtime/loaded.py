"""LoadedFunction: an artifact made callable again — bind arguments, check guards, run the program."""

from __future__ import annotations

import builtins
import linecache
import logging
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree

from kiln.graph import Guard, GuardSet, PortableProgram, TensorSpec, gc_paused

from .artifact import Artifact, PathOrFile, guards_with_specs, load_artifact, save_artifact
from .bindings import Resolver
from .cache import CompileCache, default_cache
from .checks import usable_files
from .code_cache import (
    cached_compile,
    compile_cached,
    compile_guards,
    hold_code_writes,
    release_code_writes,
)
from .errors import ArtifactError, GuardError
from .guard_check import diagnose
from .manifest import PROGRAM_NAME
from .manifest_sources import LazyGuards
from .sources import CallFrame, Param, display_name, has_prefix, make_binder, normalize
from .triton_binaries import PREFIX as TRITON_PREFIX
from .triton_binaries import install_triton_binaries

logger = logging.getLogger("kiln.runtime")


def exec_program(artifact: Artifact, files: Mapping[str, bytes], files_dir: str) -> types.ModuleType:
    """Run the program's module source with ``FILES``/``FILES_DIR`` injected; returns the module."""
    tag = artifact.manifest.integrity.removeprefix("sha256:")[:16]
    name = f"kiln_artifact_{tag}"
    filename = os.path.join(files_dir, PROGRAM_NAME) if files_dir else f"<kiln artifact {tag}>"
    module = types.ModuleType(name, f"kiln artifact {artifact.location or ''}".strip())
    module.__dict__.update({"FILES": dict(files), "FILES_DIR": files_dir, "__file__": filename,
                            "__builtins__": builtins, "compile": cached_compile})
    # inspect (and so triton.jit and tracebacks) reads sources through linecache
    linecache.cache[filename] = (len(artifact.source), None, artifact.source.splitlines(True), filename)
    sys.modules[name] = module  # classes defined by the program (autograd.Function) get a home
    try:
        exec(compile_cached(artifact.source, filename), module.__dict__)  # noqa: S102 - our program
    except Exception as e:
        sys.modules.pop(name, None)
        raise ArtifactError(f"artifact {artifact.location}: running its program failed "
                            f"({type(e).__name__}: {e}); it needs {', '.join(artifact.manifest.requires)}"
                            ) from e
    if not callable(module.__dict__.get("call")):
        raise ArtifactError(f"artifact {artifact.location}: its program defines no call(args)")
    return module


def _materialize(artifact: Artifact, files: Mapping[str, bytes], cache: CompileCache) -> str:
    """A directory holding the program's files (for dlopen/import); '' when it has none, or when
    they are only C++ libraries (and sources) its wrappers load from FILES (``load_library_from``)."""
    if not artifact.files or _loads_from_memory(artifact.source, files):
        return ""
    everything = {PROGRAM_NAME: artifact.source.encode(), **artifact.files}
    return str(cache.materialize_tree("artifact_files", artifact.manifest.integrity, everything))


def _loads_from_memory(source: str, files: Mapping[str, bytes]) -> bool:
    """Whether the program needs no folder of files: its files are C++ libraries and their sources
    only, which its wrappers load with ``load_library_from`` (a memfd), never with the older
    ``load_library(FILES_DIR, ...)``."""
    return (bool(files) and all(n.endswith((".so", ".cpp")) for n in files)
            and "import load_library_from as _load_library_from" in source
            and "import load_library as _load_library" not in source)


@dataclass(frozen=True)
class CallPlan:
    """How a call becomes the program's flat inputs: bind, check guards, gather (all compiled)."""

    params: tuple[Param, ...]
    input_names: Sequence[str]
    input_sources: tuple[str, ...]  # as captured, for messages
    input_exprs: tuple[str, ...]  # expressions over L and G, one per graph input
    guards: GuardSet  # sources over L and G
    names: Mapping[str, str]  # guard source -> what to call it in a GuardError
    static: dict[str, object]  # entries of L that do not come from the call's arguments
    globals: Mapping[str, object]
    output_spec: str | None = None
    tree: tuple[tuple[str, int, str], ...] = ()  # the artifact's read tree of sources (schema 3)
    layout: Mapping[str, Any] | None = None  # the saved guard plan, when it fits these guards as they are
    records: Sequence[Any] | None = None  # the saved guards the layout indexes (schema-3 records)

    @staticmethod
    def for_artifact(artifact: Artifact, f_globals: dict[str, object] | None,
                     external_data: Mapping[str, object] | None) -> CallPlan:
        m = artifact.manifest
        resolver = Resolver(m.bindings, artifact.constants, f_globals, external_data)
        fast = CallPlan._as_saved(artifact, resolver, f_globals)
        if fast is not None:
            return fast
        exprs = tuple(resolver.input_expr(i.source) for i in m.inputs)
        names = {expr: rec.name for expr, rec in zip(exprs, m.inputs)}
        guards = []
        # most guards read through identity bindings (arguments): no rewrite to look up (hundreds
        # of guards per model, ~0.5 ms of a new machine's load for a mobilenet)
        rewritten = resolver.rewritten_prefixes()
        for g in m.guards:
            if not rewritten or not any(has_prefix(g.source, p) for p in rewritten):
                guards.append(g)
                continue
            src = resolver.guard_expr(g.source)
            if src is None:
                logger.info("artifact %s: guard %s is not checked after this load (it reads a "
                            "constant saved in the artifact or a global no f_globals supplies)",
                            artifact.location, g.as_text())
                continue
            if src == g.source:  # the common case: errors name it by display_name(src) already
                guards.append(g)
                continue
            guards.append(Guard(src, g.kind, g.expected, g.note))
            names.setdefault(src, display_name(g.source))  # errors name what the user wrote
        return CallPlan(m.params, tuple(i.name for i in m.inputs), tuple(i.source for i in m.inputs),
                        exprs, GuardSet(tuple(guards)),
                        names, resolver.static, f_globals if f_globals is not None else {},
                        m.output_spec, m.source_tree,
                        # the saved plan is of the manifest's guards and inputs as they are
                        m.guard_layout if not rewritten else None)

    @staticmethod
    def _as_saved(artifact: Artifact, resolver: Resolver, f_globals: dict[str, object] | None) -> CallPlan | None:
        """The plan of a schema-3 load whose inputs all read as saved, with the saved guard plan:
        inputs and guards as the manifest has them (records; InputRecords and names are made when
        an error needs them). A rebinding that only drops guards on a bare global
        (``G['_is_torch_available']`` without f_globals) drops them from the saved plan's first
        checks; any other rebinding (None here) takes the general path."""
        m = artifact.manifest
        sources = getattr(m.inputs, "sources", None)
        records = getattr(m.guards.guards, "records", None)
        layout = m.guard_layout
        if sources is None or records is None or layout is None:
            return None
        rewritten = resolver.rewritten_prefixes()
        guards = m.guards
        if rewritten:
            if any(s.startswith(rewritten) and any(has_prefix(s, p) for p in rewritten) for s in sources):
                return None
            under = [i for i, r in enumerate(records)
                     if r.source.startswith(rewritten) and any(has_prefix(r.source, p) for p in rewritten)]
            first = set(layout.get("first") or ())
            if any(resolver.guard_expr(records[i].source) is not None or i not in first for i in under):
                return None  # a guard rewritten to another source, or read through the plan's reads
            for i in under:
                logger.info("artifact %s: guard %s is not checked after this load (it reads a "
                            "constant saved in the artifact or a global no f_globals supplies)",
                            artifact.location, records[i].source)
            dropped = set(under)
            layout = {**layout, "first": [i for i in layout["first"] if i not in dropped]}
            guards = GuardSet(LazyGuards([r for i, r in enumerate(records) if i not in dropped]))  # type: ignore[arg-type]
        return CallPlan(m.params, _Later(lambda: tuple(i.name for i in m.inputs)), sources, sources,
                        guards, _LaterMap(lambda: {i.source: i.name for i in m.inputs}),
                        resolver.static, f_globals if f_globals is not None else {},
                        m.output_spec, m.source_tree, layout, records)


class _OnFirstUse:
    """A container made on first use by ``make``: a load builds names only errors and ``as_text`` read."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] | None = make
        self._items: Any = None

    def _all(self) -> Any:
        if self._make is not None:
            self._items, self._make = self._make(), None
        return self._items

    def __getitem__(self, key: Any) -> Any:
        return self._all()[key]

    def __len__(self) -> int:
        return len(self._all())


class _Later(_OnFirstUse, Sequence):
    """A tuple made on first use (a load's input names)."""


class _LaterMap(_OnFirstUse, Mapping):
    """A dict made on first use (guard source -> the name a GuardError gives it)."""

    def __iter__(self) -> Any:
        return iter(self._all())


class LoadedFunction:
    """A compiled function with the original function's calling convention.

    Each call binds the arguments to the saved parameters, checks the guards (raising
    ``GuardError`` naming the input), gathers the graph inputs from their sources and runs the
    program's ``call``. ``disable_guard_check()`` skips the guards. Made by
    ``load_compiled_function`` (from an artifact) or ``LoadedFunction.from_compiled`` (in process,
    before saving: the AOT object ``aot_compile`` returns).
    """

    def __init__(self, plan: CallPlan, call: Callable[[list], Any], *,
                 artifact: Artifact | None = None, module: types.ModuleType | None = None,
                 save: Callable[[PathOrFile, Mapping[str, object] | None, str], Artifact] | None = None,
                 after_first_call: Callable[[], None] | None = None) -> None:
        self.plan = plan
        self.artifact = artifact
        self.module = module
        self._save = save
        self._bind = make_binder(plan.params)
        self._static = plan.static
        self._globals = plan.globals
        self.guards = plan.guards
        # one generated function checks every guard and gathers the graph inputs (None: a guard failed)
        self._check_gather = compile_guards(plan.guards, list(plan.input_exprs), plan.tree, plan.layout,
                                            plan.records)
        self._gather_only: Callable[[Mapping[str, Any], Mapping[str, Any]], list | None] | None = None
        self._check_guards = True
        self._output = pytree.treespec_loads(plan.output_spec) if plan.output_spec else None
        self._call = call
        # runs once: after the first call, at a guard failure before it, or when this is dropped uncalled
        self._after_first_call = weakref.finalize(self, after_first_call) if after_first_call else None
        if self._after_first_call is not None:  # the first call runs through a wrapper; later ones do not
            self._call = self._first_call(call, self._after_first_call)

    def _first_call(self, call: Callable[[list], Any], done: Callable[[], Any]) -> Callable[[list], Any]:
        me = weakref.ref(self)  # no cycle: an uncalled function that is dropped is freed (and done runs)

        def first(inputs: list) -> Any:
            owner = me()
            if owner is not None:
                owner._call = call
            try:
                return call(inputs)
            finally:
                done()
        return first

    def _first_call_done(self) -> None:
        if self._after_first_call is not None:
            self._after_first_call()  # a weakref.finalize: runs at most once

    @staticmethod
    def from_artifact(artifact: Artifact, *, f_globals: dict[str, object] | None = None,
                      external_data: Mapping[str, object] | None = None,
                      cache: CompileCache | None = None,
                      after_first_call: Callable[[], None] | None = None) -> LoadedFunction:
        plan = CallPlan.for_artifact(artifact, f_globals, external_data)
        where = artifact.location or "<memory>"
        files = usable_files(artifact.manifest, {**artifact.files, PROGRAM_NAME: b""}, where)
        files.pop(PROGRAM_NAME, None)
        if any(name.startswith(TRITON_PREFIX) for name in files):
            install_triton_binaries(files, where)  # before the program imports its kernels
        module = exec_program(artifact, files, _materialize(artifact, files, cache or default_cache()))
        return LoadedFunction(plan, module.call, artifact=artifact, module=module,
                              after_first_call=after_first_call)

    @staticmethod
    def from_compiled(call: Callable[[list], Any], *, frame: CallFrame,
                      input_sources: Sequence[str], input_specs: Sequence[TensorSpec | int | None] = (),
                      input_names: Sequence[str] | None = None,
                      guards: GuardSet | Iterable[Guard] = (),
                      output_spec: pytree.TreeSpec | None = None,
                      program: PortableProgram | None = None, backend: str = "unknown",
                      metadata: Mapping[str, Any] | None = None) -> LoadedFunction:
        """The in-process compiled function (what ``aot_compile`` returns), savable later.

        ``call(flat_inputs: list)`` runs the compiled graph (``lambda a: compiled_graph(*a)``).
        Sources resolve against the live frame (closure variables and globals as they are now), all
        guards are checked (ID_MATCH too), and ``save_compiled_function(path, external_data)``
        writes ``program`` as an artifact (an error if the backend gave no portable program).
        """
        guards = tuple(guards)
        sources = tuple(normalize(s) for s in input_sources)
        names = tuple(input_names or [display_name(s) for s in sources])
        specs = tuple(input_specs) or (None,) * len(sources)
        guard_set = guards_with_specs(GuardSet(tuple(guards)), sources, specs)
        params = {p.name for p in frame.params}
        plan = CallPlan(frame.params, names, sources, sources, guard_set,
                        {**dict(zip(sources, names)), **{g.source: display_name(g.source) for g in guard_set
                                                         if g.source not in sources}},
                        {k: v for k, v in frame.locals.items() if k not in params}, frame.globals,
                        pytree.treespec_dumps(output_spec) if output_spec is not None else None)

        def save(path: PathOrFile, external_data: Mapping[str, object] | None, fmt: str) -> Artifact:
            if program is None:
                raise ArtifactError(f"backend {backend!r} produced no portable program, so this "
                                    "compiled function cannot be saved; use a backend that does "
                                    "(eager, aot_eager, inductor)")
            return save_artifact(path, program, format=fmt, input_sources=sources, input_specs=specs,
                                 input_names=names, guards=guards, frame=frame,
                                 external_data=external_data, output_spec=output_spec,
                                 backend=backend, metadata=metadata)

        return LoadedFunction(plan, call, save=save)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        L = self._bind(args, kwargs)
        if self._static:
            L = {**self._static, **L}
        G = self._globals
        inputs = self._check_gather(L, G) if self._check_guards else self._unchecked(L, G)
        if inputs is None:
            raise self._failure(L, G)
        out = self._call(inputs)
        if self._output is not None:
            return pytree.tree_unflatten(list(out), self._output)
        return out

    def _unchecked(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> list | None:
        if self._gather_only is None:
            self._gather_only = compile_guards(GuardSet(()), list(self.plan.input_exprs))
        return self._gather_only(L, G)

    def _failure(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> GuardError:
        """Why the check returned None: the first failing guard, else the input that cannot be read."""
        self._first_call_done()  # no first call yet: let held cache writes go now
        if self._check_guards:
            err = diagnose(self.guards, L, G, self.plan.names)
            if err.guard is not None or not self._gather_fails(L, G):
                return err
        return self._gather_error(L, G)

    def _gather_fails(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> bool:
        return self._unchecked(L, G) is None

    def _gather_error(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> GuardError:
        plan = self.plan
        for name, source, expr in zip(plan.input_names, plan.input_sources, plan.input_exprs):
            try:
                eval(expr, {"L": L, "G": G})  # noqa: S307 - one of our own input expressions
            except Exception as inner:  # noqa: BLE001
                return GuardError(f"input {name!r}: cannot read {source} from this call "
                                  f"({type(inner).__name__}: {inner})", input_name=name)
        return GuardError("cannot gather the compiled function's inputs")

    def disable_guard_check(self) -> None:
        """Skip guard checks on later calls (you vouch that the inputs match)."""
        self._check_guards = False

    def enable_guard_check(self) -> None:
        self._check_guards = True

    def save_compiled_function(self, path: PathOrFile, external_data: Mapping[str, object] | None = None,
                               *, format: str = "auto") -> None:
        """Save as an artifact. A loaded function writes its artifact again (``external_data`` is
        then not needed: its bindings are already recorded)."""
        if self._save is not None:
            self.artifact = self._save(path, external_data, format)
        elif self.artifact is not None:
            self.artifact.save(path, format=format)
        else:
            raise ArtifactError("this compiled function has nothing to save")

    def as_text(self) -> str:
        if self.artifact is not None:
            return self.artifact.as_text()
        inputs = "\n".join(f"  {n:<20} {e}" for n, e in zip(self.plan.input_names, self.plan.input_exprs))
        return f"# compiled function (in process)\ninputs:\n{inputs}\nguards:\n{self.guards.as_text()}"

    def __repr__(self) -> str:
        where = (self.artifact.location or "<memory>") if self.artifact is not None else "this process"
        return f"<LoadedFunction ({', '.join(p.name for p in self.plan.params)}) from {where}>"


def load_compiled_function(file: PathOrFile | bytes | Artifact, *,
                           f_globals: dict[str, object] | None = None,
                           external_data: Mapping[str, object] | None = None,
                           check_compatibility: bool = True,
                           cache: CompileCache | None = None) -> LoadedFunction:
    """Load a compiled function saved with ``save_artifact`` (or kiln's ``save_compiled_function``).

    ``file``: a path (directory or zip), an open binary file, bytes, or an Artifact.
    ``f_globals``: the live globals of the module that defined the function; sources rooted at
    ``G['name']`` read it (falling back to values saved in the artifact).
    ``external_data``: the objects kept out of the artifact at save time, under the same keys.
    """
    # the program's code objects go to the local cache after the first call (a writer thread
    # would compete for the GIL with the load and the first call: both are what a new machine waits on)
    hold_code_writes()
    try:
        with gc_paused():
            artifact = file if isinstance(file, Artifact) else load_artifact(
                file, check_compatibility=check_compatibility)
            return LoadedFunction.from_artifact(artifact, f_globals=f_globals, external_data=external_data,
                                                cache=cache, after_first_call=release_code_writes)
    except BaseException:
        release_code_writes()
        raise
