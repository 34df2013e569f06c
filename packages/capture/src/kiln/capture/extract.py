"""The function that reads a compiled entry's graph inputs out of a frame (``L``, ``G``) on every call.

Input sources are Python expressions that repeat their prefixes: an optimizer step's inputs are
``L['args'][0].state.get(L['args'][0].param_groups[0]['params'][i])['exp_avg']`` and two siblings per
parameter. Evaluated one by one, each re-reads its whole path, and each ``state.get(p)`` hashes the
parameter again in Python (``Tensor.__hash__``). The extractor is generated with every attribute,
subscript and ``.get(key)`` read that occurs more than once bound to a local first (reads the guards already
treat as pure: the entry's guards pinned each of them), so a step over 32 parameters reads each
path, and hashes each parameter, once.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


def extractor(sources: list[str], values: list[Any] | None = None,
              identity: set[str] | None = None) -> Callable[[dict, dict], list]:
    """``fn(L, G) -> [inputs...]``; sources pinned by an ID_MATCH guard are the very objects seen at
    capture (the entry keeps them alive), so they are not looked up again."""
    ns: dict[str, Any] = {}
    trees: list[ast.expr] = []
    for i, src in enumerate(sources):
        if identity and values is not None and src in identity:
            ns[f"_v{i}"] = values[i]
            trees.append(ast.Name(f"_v{i}", ast.Load()))
        else:
            trees.append(ast.parse(src, mode="eval").body)
    counts: dict[str, int] = {}
    for t in trees:
        for node in ast.walk(t):
            if _read(node):
                key = ast.dump(node)
                counts[key] = counts.get(key, 0) + 1
    lines: list[str] = []
    bound: dict[str, str] = {}

    class Bind(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            key = ast.dump(node) if _read(node) else None
            node = super().generic_visit(node)  # children first: a bound prefix is read before its use
            if key is None or counts.get(key, 0) < 2:
                return node
            name = bound.get(key)
            if name is None:
                name = bound[key] = f"_e{len(bound)}"
                lines.append(f"    {name} = {ast.unparse(node)}")
            return ast.Name(name, ast.Load())

    outs = [ast.unparse(Bind().visit(t)) for t in trees]
    src = "def extract(L, G):\n" + "".join(f"{line}\n" for line in lines) + f"    return [{', '.join(outs)}]\n"
    exec(compile(src, "<kiln extract>", "exec"), ns)  # noqa: S102 (sources we generated)
    fn = ns["extract"]
    fn.__kiln_source__ = src
    return fn


def _read(node: ast.AST) -> bool:
    """An attribute, a subscript, or a ``.get(key)`` (how capture reads an optimizer's state entries)."""
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and len(node.args) == 1 and not node.keywords)
