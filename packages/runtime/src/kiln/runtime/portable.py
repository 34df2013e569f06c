"""FX graphs as portable Python source: the PortableProgram of an ``eager``/``aot_eager`` graph.

``graph_module_source(gm, name)`` turns a GraphModule into module-level source defining
``name(*args)``, plus the files it reads (its tensor attributes as safetensors bytes). Several graphs
can share one program (autograd puts a forward and a backward in one module with an
``autograd.Function``); ``program_from_graph_module(gm)`` is the one-graph case with ``call(args)``.

FX's own code generator writes the body; this module supplies what that code assumes: the globals
it names (modules, ``inf``, ``device``, importable functions), and ``self`` — a namespace holding the
graph's attributes (constants, nested GraphModules such as ``torch.cond`` branches).
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from kiln.graph import PortableProgram

from .errors import ArtifactError
from .tensors import tensors_to_bytes

_FLOAT_CONSTANTS = {"inf": "float('inf')", "nan": "float('nan')"}


def _import_line(name: str, value: object) -> str:
    """Source that binds ``name`` to ``value`` in a fresh module, or raise if it cannot."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}" if name != value.__name__ else f"import {name}"
    if isinstance(value, float) and name in _FLOAT_CONSTANTS:
        return f"{name} = {_FLOAT_CONSTANTS[name]}"
    if value is type(None):
        return f"{name} = type(None)"
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if module and qualname and "<" not in qualname:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is value and "." not in qualname:
            return f"from {module} import {qualname}" + (f" as {name}" if name != qualname else "")
        if obj is value:
            return f"{name} = _kiln_import({module!r}).{qualname}"
    if isinstance(value, (torch.dtype, torch.device, int, bool, str)) or value is None:
        return f"{name} = {_literal(value)}"
    raise ArtifactError(f"the graph refers to {name} = {value!r}, which cannot be saved as source: "
                        "only importable modules, functions and classes, and constants are portable")


def _literal(value: object) -> str:
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    return repr(value)


def _attribute_paths(gm: fx.GraphModule) -> list[str]:
    paths = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise ArtifactError(f"graph node {node.name} calls submodule {node.target!r}; portable "
                                "programs need modules inlined (parameters as graph inputs)")
        if node.op == "get_attr" and node.target not in paths:
            paths.append(str(node.target))
    return paths


def graph_module_source(gm: fx.GraphModule, name: str = "forward",
                        file_prefix: str = "") -> tuple[str, dict[str, bytes]]:
    """Source defining ``name(*args)`` that runs ``gm``, and the files that source reads."""
    safe = re.sub(r"\W", "_", name)
    code = gm.graph.python_code(root_module="self")
    prelude = ["import types as _kiln_types", "from importlib import import_module as _kiln_import",
               "import torch", "from kiln.runtime.tensors import tensors_from_bytes as _kiln_tensors"]
    for gname in sorted(code.globals):
        if gname != "torch":
            prelude.append(_import_line(gname, code.globals[gname]))
    body = re.sub(r"^def forward\(self", f"def _{safe}_impl(self", code.src.strip(), count=1, flags=re.M)
    tensors: dict[str, torch.Tensor] = {}
    setup: list[str] = [f"_{safe}_self = _kiln_types.SimpleNamespace()"]
    files: dict[str, bytes] = {}
    sub_sources: list[str] = []
    for path in _attribute_paths(gm):
        value: Any = gm
        for part in path.split("."):
            value = getattr(value, part)
        holder = f"_{safe}_self"
        for part in path.split(".")[:-1]:
            setup.append(f"if not hasattr({holder}, {part!r}): setattr({holder}, {part!r}, "
                         "_kiln_types.SimpleNamespace())")
            holder = f"{holder}.{part}"
        leaf = path.split(".")[-1]
        if isinstance(value, torch.Tensor):
            tensors[path] = value
            rg = bool(value.requires_grad)
            setup.append(f"{holder}.{leaf} = _{safe}_consts[{path!r}]"
                         + (".requires_grad_()" if rg else ""))
        elif isinstance(value, fx.GraphModule):
            sub_name = f"{safe}__{path.replace('.', '__')}"
            sub_src, sub_files = graph_module_source(value, sub_name, file_prefix)
            sub_sources.append(sub_src)
            files.update(sub_files)
            setup.append(f"{holder}.{leaf} = {sub_name}")
        else:
            setup.append(f"{holder}.{leaf} = {_literal_or_fail(path, value)}")
    if tensors:
        fname = f"{file_prefix}{safe}.constants.safetensors"
        files[fname] = tensors_to_bytes(tensors)
        setup.insert(0, f"_{safe}_consts = _kiln_tensors(FILES[{fname!r}])")
    source = "\n".join([*prelude, "", *sub_sources, "", body, "", *setup, "",
                        f"def {safe}(*args):", f"    return _{safe}_impl(_{safe}_self, *args)", ""])
    return source, files


def _literal_or_fail(path: str, value: object) -> str:
    if isinstance(value, (int, float, bool, str, torch.dtype, torch.device)) or value is None:
        return _literal(value)
    raise ArtifactError(f"graph attribute {path!r} is a {type(value).__name__}; portable programs hold "
                        "only tensors, constants and nested GraphModules")


def program_from_graph_module(gm: fx.GraphModule, *,
                              extra_files: Mapping[str, bytes] | None = None) -> PortableProgram:
    """A PortableProgram whose ``call(args)`` runs ``gm`` (the ``eager`` backend's artifact form)."""
    source, files = graph_module_source(gm, "forward")
    source += ("\n\ndef call(args):\n    out = forward(*args)\n"
               "    return tuple(out) if isinstance(out, (list, tuple)) else (out,)\n")
    return PortableProgram(source, {**files, **(extra_files or {})}, ("torch",))
