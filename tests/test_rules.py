"""Project rules that a test enforces: no torch compiler inside kiln, and DESIGN.md's layering."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_MODULES = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp",
                     "torch._refs", "torch._prims", "torch.export")
FORBIDDEN_NAMES = ("make_fx", "torch.compile")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _forbidden(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES + FORBIDDEN_NAMES) \
        or name.split(".")[-1] == "make_fx"


def forbidden_uses(source: str) -> list[tuple[int, str]]:
    """Uses of torch's compiler in code (imports, attribute chains, names) — not in strings."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [d] if (d := _dotted(node)) else []
        elif isinstance(node, ast.Name):
            names = [node.id]
        hits += [(node.lineno, n) for n in names if _forbidden(n)]
    return hits


def _sources() -> list[Path]:
    files = list((ROOT / "src").rglob("*.py"))
    for pkg in (ROOT / "packages").glob("*/src"):
        files += pkg.rglob("*.py")
    return files


def test_packages_do_not_use_torchs_compiler() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in _sources() for line, name in forbidden_uses(path.read_text())]
    assert not offenders, "torch's compiler used inside kiln:\n" + "\n".join(offenders)


def test_the_rule_catches_a_violation() -> None:
    assert forbidden_uses("from torch._dynamo import optimize")
    assert forbidden_uses("import torch._inductor.config")
    assert forbidden_uses("from torch import _dynamo")
    assert forbidden_uses("gm = make_fx(f)(x)")
    assert forbidden_uses("from torch.fx.experimental.proxy_tensor import make_fx")
    assert forbidden_uses("y = torch.compile(f)")
    assert forbidden_uses("torch._functorch.config.x = 1")
    assert not forbidden_uses("import torch.fx\ns = 'torch.compile(model) in a docstring'")


def test_import_layering() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "layering.py")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


# ---- what crosses a stage boundary through gm.meta / node.meta (DESIGN.md: the typed graph interface)

def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[1] if rel[0] == "packages" else "kiln"


def meta_keys(source: str) -> list[tuple[int, str]]:
    """String keys read or written through ``<x>.meta`` (``[k]``, ``.get(k)``, ``.setdefault(k)``,
    ``.pop(k)``, ``k in <x>.meta``), literal or through a module-level string constant."""
    tree = ast.parse(source)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def key(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id) if isinstance(node, ast.Name) else None

    def is_meta(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "meta"

    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        k = None
        if isinstance(node, ast.Subscript) and is_meta(node.value):
            k = key(node.slice)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_meta(node.func.value)
              and node.func.attr in ("get", "setdefault", "pop") and node.args):
            k = key(node.args[0])
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and is_meta(node.comparators[0])):
            k = key(node.left)
        if k is not None:
            hits.append((node.lineno, k))
    return hits


def test_only_declared_meta_keys_cross_packages() -> None:
    """A ``meta`` key one package writes and another reads must be declared in kiln.graph
    (NODE_META_KEYS, or GraphAnnotations through annotate/annotations_of); keys private to one
    package are its own business."""
    from kiln.graph import GRAPH_META_KEYS, NODE_META_KEYS

    users: dict[str, dict[str, list[str]]] = {}
    for path in _sources():
        for line, k in meta_keys(path.read_text()):
            users.setdefault(k, {}).setdefault(_package_of(path), []).append(f"{path.relative_to(ROOT)}:{line}")
    declared = NODE_META_KEYS | GRAPH_META_KEYS
    crossing = {k: where for k, where in users.items() if len(where) > 1 and k not in declared}
    assert not crossing, ("meta keys shared between packages but not declared in kiln.graph "
                          "(use GraphAnnotations):\n" + "\n".join(
                              f"{k!r}: {sites}" for k, sites in sorted(crossing.items())))
    outside = [s for k in GRAPH_META_KEYS for pkg, sites in users.get(k, {}).items() if pkg != "graph"
               for s in sites]
    assert not outside, f"only kiln.graph's annotate/annotations_of touch the annotations entry: {outside}"


def test_the_meta_rule_sees_keys() -> None:
    src = ('K = "kiln_x"\ngm.meta[K] = 1\nn.meta.get("a")\nif "b" in n.meta: pass\n'
           'n.meta.setdefault("c", 0)\nx = n.meta["val"]\n')
    assert sorted(k for _, k in meta_keys(src)) == ["a", "b", "c", "kiln_x", "val"]


# ---- settings: the environment is read in knobs.py files only, and every variable is declared ----

def environment_reads(source: str) -> list[int]:
    """Lines of code (not text in strings) that read the environment: ``os.environ``, ``os.getenv``,
    or ``environ``/``getenv`` imported from os."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _dotted(node) in ("os.environ", "os.getenv", "os.environb"):
            hits.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "environb") for a in node.names):
            hits.append(node.lineno)
    return hits


def test_only_knobs_files_read_the_environment() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in _sources() if path.name != "knobs.py"
                 for line in environment_reads(path.read_text())]
    assert not offenders, ("environment read outside a package's knobs.py (STYLE.md rule 4):\n"
                           + "\n".join(offenders))


def test_the_environment_rule_sees_reads() -> None:
    assert environment_reads("import os\nx = os.environ.get('A')\n")
    assert environment_reads("import os\nx = os.getenv('A')\n")
    assert environment_reads("from os import environ\n")
    assert not environment_reads("s = 'os.environ.get(\"A\")'\n")


_ENV_NAME = re.compile(r"""(?:\b(?:e|env|environ)\.get\(|\b(?:e|env|environ)\[|getenv\()\s*["']([A-Z][A-Z0-9_]*)["']""")


def test_every_environment_variable_is_declared() -> None:
    """Each variable a knobs.py (or generated code kept as text) reads is declared in
    kiln.graph.knobs.ENVIRONMENT, for the package that reads it: the graph cache keys on the
    declared ones that change code, so an undeclared one could hide a stale cache entry."""
    from kiln.graph import ENVIRONMENT

    problems = []
    for path in _sources():
        package = _package_of(path)
        for name in _ENV_NAME.findall(path.read_text()):
            declared = ENVIRONMENT.get(name)
            if declared is None:
                problems.append(f"{path.relative_to(ROOT)}: {name} is not declared")
            elif path.name == "knobs.py" and package not in declared.readers:
                problems.append(f"{path.relative_to(ROOT)}: {name} is declared as read by {sorted(declared.readers)}")
    assert not problems, "\n".join(problems)
