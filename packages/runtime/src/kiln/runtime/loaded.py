"""LoadedFunction: an artifact made callable again — bind arguments, check guards, run the program."""

from __future__ import annotations

import builtins
import linecache
import logging
import os
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch.utils._pytree as pytree
from kiln.graph import Guard, GuardSet

from .artifact import Artifact, PathOrFile, load_artifact
from .bindings import Resolver
from .cache import CompileCache, default_cache
from .checks import usable_files
from .errors import ArtifactError, GuardError
from .guard_check import diagnose
from .manifest import PROGRAM_NAME
from .sources import display_name, make_binder

logger = logging.getLogger("kiln.runtime")


def exec_program(artifact: Artifact, files: Mapping[str, bytes], files_dir: str) -> types.ModuleType:
    """Run the program's module source with ``FILES``/``FILES_DIR`` injected; returns the module."""
    tag = artifact.manifest.integrity.removeprefix("sha256:")[:16]
    name = f"kiln_artifact_{tag}"
    filename = os.path.join(files_dir, PROGRAM_NAME) if files_dir else f"<kiln artifact {tag}>"
    module = types.ModuleType(name, f"kiln artifact {artifact.location or ''}".strip())
    module.__dict__.update({"FILES": dict(files), "FILES_DIR": files_dir, "__file__": filename,
                            "__builtins__": builtins})
    # inspect (and so triton.jit and tracebacks) reads sources through linecache
    linecache.cache[filename] = (len(artifact.source), None, artifact.source.splitlines(True), filename)
    sys.modules[name] = module  # classes defined by the program (autograd.Function) get a home
    try:
        exec(compile(artifact.source, filename, "exec"), module.__dict__)  # noqa: S102 - our program
    except Exception as e:
        sys.modules.pop(name, None)
        raise ArtifactError(f"artifact {artifact.location}: running its program failed "
                            f"({type(e).__name__}: {e}); it needs {', '.join(artifact.manifest.requires)}"
                            ) from e
    if not callable(module.__dict__.get("call")):
        raise ArtifactError(f"artifact {artifact.location}: its program defines no call(args)")
    return module


def _materialize(artifact: Artifact, files: Mapping[str, bytes], cache: CompileCache) -> str:
    """A directory holding the program's files (for dlopen/import); '' when it has none."""
    if not artifact.files:
        return ""
    everything = {PROGRAM_NAME: artifact.source.encode(), **artifact.files}
    return str(cache.materialize_tree("artifacts", artifact.manifest.integrity, everything))


def _compile_gather(exprs: list[str]) -> Callable[[Mapping[str, Any], Mapping[str, Any]], list]:
    src = "def gather(L, G):\n    return [" + ", ".join(exprs) + "]\n"
    ns: dict[str, Any] = {}
    exec(compile(src, "<kiln input gather>", "exec"), ns)  # noqa: S102
    return ns["gather"]


class LoadedFunction:
    """A compiled function loaded from an artifact; call it like the original function.

    Each call binds the arguments to the saved parameters, checks the portable guards (raising
    ``GuardError`` naming the input), gathers the graph inputs from their sources and runs the
    program's ``call``. ``disable_guard_check()`` skips the guards.
    """

    def __init__(self, artifact: Artifact, *, f_globals: dict[str, object] | None = None,
                 external_data: Mapping[str, object] | None = None,
                 cache: CompileCache | None = None) -> None:
        m = artifact.manifest
        self.artifact = artifact
        resolver = Resolver(m.bindings, artifact.constants, f_globals, external_data)
        self._static = resolver.static
        self._globals: Mapping[str, object] = f_globals if f_globals is not None else {}
        self._bind = make_binder(m.params)
        exprs = [resolver.input_expr(i.source) for i in m.inputs]
        self._exprs = exprs
        self._gather = _compile_gather(exprs)
        guards = []
        # guard errors name what the user wrote: input names, or the original source's path
        self._names = {expr: rec.name for expr, rec in zip(exprs, m.inputs)}
        for g in m.guards:
            src = resolver.guard_expr(g.source)
            if src is not None:
                guards.append(Guard(src, g.kind, g.expected, g.note))
                self._names.setdefault(src, display_name(g.source))
        self.guards = GuardSet(tuple(guards))
        self._check = self.guards.compile()
        self._check_guards = True
        self._output = pytree.treespec_loads(m.output_spec) if m.output_spec else None
        cache = cache or default_cache()
        where = artifact.location or "<memory>"
        files = usable_files(m, {**artifact.files, PROGRAM_NAME: b""}, where)
        files.pop(PROGRAM_NAME, None)
        self.module = exec_program(artifact, files, _materialize(artifact, files, cache))
        self._call: Callable[[list], Any] = self.module.call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        L = self._bind(args, kwargs)
        if self._static:
            L = {**self._static, **L}
        G = self._globals
        if self._check_guards and not self._check(L, G):
            raise diagnose(self.guards, L, G, self._names)
        try:
            inputs = self._gather(L, G)
        except Exception as e:
            raise self._gather_error(L, G, e) from None
        out = self._call(inputs)
        if self._output is not None:
            return pytree.tree_unflatten(list(out), self._output)
        return out

    def _gather_error(self, L: Mapping[str, Any], G: Mapping[str, Any], e: Exception) -> GuardError:
        for rec, expr in zip(self.artifact.manifest.inputs, self._exprs):
            try:
                eval(expr, {"L": L, "G": G})  # noqa: S307 - one of our own input expressions
            except Exception as inner:  # noqa: BLE001
                return GuardError(f"input {rec.name!r}: cannot read {rec.source} from this call "
                                  f"({type(inner).__name__}: {inner})", input_name=rec.name)
        return GuardError(f"cannot gather the compiled function's inputs ({type(e).__name__}: {e})")

    def disable_guard_check(self) -> None:
        """Skip guard checks on later calls (you vouch that the inputs match)."""
        self._check_guards = False

    def enable_guard_check(self) -> None:
        self._check_guards = True

    def save_compiled_function(self, path: PathOrFile, *, format: str = "auto") -> None:
        """Write the same artifact again (for example to copy a loaded function elsewhere)."""
        self.artifact.save(path, format=format)

    def as_text(self) -> str:
        return self.artifact.as_text()

    def __repr__(self) -> str:
        m = self.artifact.manifest
        return (f"<LoadedFunction ({', '.join(p.name for p in m.params)}) backend={m.backend} "
                f"from {self.artifact.location or '<memory>'}>")


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
    artifact = file if isinstance(file, Artifact) else load_artifact(
        file, check_compatibility=check_compatibility)
    return LoadedFunction(artifact, f_globals=f_globals, external_data=external_data, cache=cache)
