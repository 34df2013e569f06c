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


# ---- tests do not patch module globals (STYLE.md "Avoid: global mutable config patched in tests") ----
# A setting reaches the code as an option or a knob read on use (monkeypatch.setenv), and state a test
# needs its own of is an object the test constructs and passes (a cache, a compile pool, a choices
# table). What stays patched is listed here with the reason: the patch simulates what a test cannot
# construct (a missing package or tool, a crash mid-write, hardware this host lacks), switches a global
# that torch or triton keep themselves, or counts calls into code kiln does not own. A kiln function
# replaced by a spy is listed as such: each is a place where the code has no seam yet.

_PATCHERS = {"setattr", "delattr", "setitem", "delitem"}

_ALLOWED_PATCHES: dict[tuple[str, str], str] = {
    # simulating what a test cannot construct
    ("tests/test_warm_start.py", "backends.importlib.util.find_spec"):
        "simulates a stage package that is not installed (the meta-package's error for it)",
    ("packages/autograd/tests/test_symbolic_cuda_fakes.py", "torch.cuda.is_available"):
        "simulates a host with and without a CUDA device",
    ("packages/autograd/tests/test_symbolic_cuda_fakes.py", "torch._meta_registrations.div_rtn"):
        "installs torch 2.11's pooling rounding helper (the H200's torch) on a newer torch",
    ("packages/graph/tests/test_symbolic_pooling.py", "torch_meta.div_rtn"):
        "installs torch 2.11's pooling rounding helper (the H200's torch) on a newer torch",
    ("packages/runtime/tests/test_cache.py", "cache_mod.os.replace"):
        "simulates a crash between writing an entry and renaming it into place",
    ("packages/runtime/tests/test_container.py", "container.os.replace"):
        "simulates a failing rename while an artifact is written",
    ("packages/runtime/tests/test_graph_cache.py", "Path.read_bytes"):
        "simulates an unreadable cache entry",
    ("packages/inductor/tests/scheduler/test_memory_peak.py", "torch._C._select_conv_backend"):
        "simulates the convolution algorithm cuDNN picks on a GPU host",
    ("packages/inductor/tests/codegen/triton/test_preload_hook.py", "sys.modules['kiln.runtime.triton_preload']"):
        "simulates a process where kiln.runtime is not loaded",
    ("packages/runtime/tests/test_triton_preload.py", "knobs.build.impl"):
        "triton's hook for its host compiler: a stand-in builds no C launcher on a host without CUDA",
    ("packages/runtime/tests/test_triton_preload.py", "nvidia.library_dirs"):
        "triton's CUDA library lookup, absent on a host without CUDA",
    ("packages/runtime/tests/test_triton_preload.py", "build._load_module_from_path"):
        "loads the stand-in launcher a host without CUDA cannot load",
    ("packages/runtime/tests/test_triton_preload.py", "driver._active"):
        "triton's active driver: the CUDA driver class a GPU host would have",
    # switches torch and triton keep as their own globals
    ("tests/test_deploy_cuda.py", "torch.backends.cudnn.allow_tf32"):
        "torch's own switch; the comparison is in true fp32",
    ("packages/runtime/tests/test_triton_first_launch.py", "knobs.runtime.debug"):
        "triton reads TRITON_DEBUG once at import into this attribute (setenv would not reach it)",
    # counting calls into torch, triton and the standard library (no counter of their own)
    ("packages/capture/tests/test_capture_speed.py", "FakeTensorMode.__torch_dispatch__"):
        "counts fake-tensor dispatches: the cost the fast paths avoid",
    ("packages/capture/tests/shape_rules/test_pointwise.py", "FakeTensorMode.__torch_dispatch__"):
        "counts fake-tensor dispatches: the cost the shape rules avoid",
    ("packages/capture/tests/shape_rules/test_views.py", "FakeTensorMode.__torch_dispatch__"):
        "counts fake-tensor dispatches: the cost the shape rules avoid",
    ("packages/capture/tests/shape_rules/test_functions.py", "torch.batch_norm"):
        "counts torch's slow path for F.batch_norm",
    ("packages/inductor/tests/codegen/test_cpp_loops.py", "subprocess.run"):
        "counts C++ compiler runs (kiln.runtime.compile_cpp runs g++ through it)",
    ("packages/runtime/tests/test_code_cache.py", "threading.Thread.start"):
        "proves the first call starts no threading.Thread (their start waits for the GIL)",
    ("packages/runtime/tests/test_triton_first_launch.py", "CompiledKernel._init_handles"):
        "counts triton's kernel loads",
    ("packages/runtime/tests/test_triton_first_launch.py", "JITFunction.run"):
        "counts launches that went through triton's own specialisation",
    ("packages/runtime/tests/test_triton_preload.py", "type(saved)._init_handles"):
        "counts triton's kernel loads",
    ("packages/runtime/tests/test_load_speed.py", "guards_plan.eval"):
        "proves the guard plan compiles no source (the builtin eval, seen from kiln.graph.guards_plan)",
    ("packages/inductor/tests/autotune/test_matmul_templates.py", "mt.buffers_for"):
        "simulates a failure while a tuning problem is built (the injected timer fails only later)",
    ("packages/inductor/tests/codegen/triton/test_compile_pool.py", "ahead.compile_target"):
        "simulates a GPU target for the CPU tensors of a host without one",
    ("packages/inductor/tests/codegen/triton/test_dynamic_ahead.py", "ahead.compile_target"):
        "simulates a GPU target for the CPU tensors of a host without one",
    ("packages/runtime/tests/test_triton_binaries.py", "checks._triton_binaries_fit"):
        "simulates the GPU (capability, triton release) that built the artifact's binaries",
    ("packages/runtime/tests/test_triton_preload.py", "checks._triton_binaries_fit"):
        "simulates the GPU (capability, triton release) that built the artifact's binaries",
    # spies on kiln functions: cost tests (what was not run, not compiled, not looked up) with no seam yet
    ("tests/test_gpu_warm_pool.py", "kiln.inductor.warm_compile_pool"):
        "spy: the Triton compile workers start only on a CUDA graph-cache miss",
    ("tests/test_warm_start.py", "backends.print_graph"):
        "spy: the captured graph is not printed unless its text is kept",
    ("packages/capture/tests/shape_rules/test_functions.py", "torch_ops.from_memo"):
        "spy: repeated calls reuse capture's memoized fake result (the memo counts no hits)",
    ("packages/inductor/tests/codegen/triton/test_dynamic_ahead.py", "backend.compile_ahead"):
        "spy: the kernels handed to the compile pool (the batch keeps jobs, not kernels)",
    ("packages/inductor/tests/codegen/triton/test_preload_hook.py", "tp.adopt_module"):
        "spy: the kernel loader hands each new module to kiln.runtime's preload once",
    ("packages/inductor/tests/graph_passes/test_conv_layout.py", "L._run"):
        "spy: the layout pass re-propagates only the nodes its conversions changed",
    ("packages/runtime/tests/test_bindings.py", "Resolver.guard_expr"):
        "spy: a load resolves only the guard sources it needs",
    ("packages/runtime/tests/test_schema3_load.py", "GuardSet.compile_gather"):
        "spy: a load builds its guard check from the saved plan, without analysing the guards again",
    ("packages/runtime/tests/test_load_speed.py", "manifest_mod.verify_integrity"):
        "spy: a load does not re-encode the manifest to verify it",
    ("packages/runtime/tests/test_load_speed.py", "guards_plan._SEGMENT"):
        "spy: the guard plan runs its segment regex once per distinct segment",
    ("packages/runtime/tests/test_load_speed.py", "guards_plan._GETTERS"):
        "empties the guard plan's process-wide getter cache so the count above starts from nothing",
    ("packages/runtime/tests/test_graph_cache.py", "gc_mod.collect_triton_binaries"):
        "spy: which kernel modules a graph-cache entry collects binaries from",
}


def _patch_target(call: ast.Call) -> str | None:
    """What a ``monkeypatch.setattr/delattr/setitem/delitem`` or ``mock.patch(.object)`` call patches, as
    ``obj.name``, ``dotted.path`` (the string form) or ``mapping[key]``; None for other calls."""
    func, args = call.func, call.args
    if not isinstance(func, ast.Attribute) or not args:
        return None
    owner = _dotted(func.value) or ""
    if func.attr in _PATCHERS and owner.split(".")[-1] == "monkeypatch":
        first = args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value  # monkeypatch.setattr("pkg.mod.name", value)
        if len(args) < 2:
            return None
        second = args[1]
        if func.attr in ("setitem", "delitem"):
            key = repr(second.value) if isinstance(second, ast.Constant) else ast.unparse(second)
            return f"{ast.unparse(first)}[{key}]"
        return f"{ast.unparse(first)}.{second.value if isinstance(second, ast.Constant) else ast.unparse(second)}"
    if func.attr == "patch" and owner.endswith("mock") and isinstance(args[0], ast.Constant):
        return str(args[0].value)
    if func.attr == "object" and owner.endswith("mock.patch") and len(args) >= 2 \
            and isinstance(args[1], ast.Constant):
        return f"{ast.unparse(args[0])}.{args[1].value}"
    return None


def patches(source: str) -> list[tuple[int, str]]:
    """(line, target) of every patch in a test module's source."""
    return [(node.lineno, target) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and (target := _patch_target(node)) is not None]


def _test_files() -> list[Path]:
    files = list((ROOT / "tests").rglob("*.py"))
    for pkg in (ROOT / "packages").glob("*/tests"):
        files += pkg.rglob("*.py")
    return sorted(files)


def test_tests_patch_only_what_is_allowed() -> None:
    found = {(str(path.relative_to(ROOT)), target): line
             for path in _test_files() for line, target in patches(path.read_text())}
    new = [f"{path}:{line}: {target}" for (path, target), line in sorted(found.items())
           if (path, target) not in _ALLOWED_PATCHES]
    assert not new, ("tests patch module globals; pass the setting as an option, set a knob's environment "
                     "variable (read on use), or construct the object and pass it in -- or, where none of "
                     "that can work, add the patch to _ALLOWED_PATCHES with the reason:\n" + "\n".join(new))
    stale = sorted(set(_ALLOWED_PATCHES) - set(found))
    assert not stale, f"_ALLOWED_PATCHES lists patches no test makes any more (remove them): {stale}"


def test_the_patch_rule_sees_patches() -> None:
    src = ("def test(monkeypatch):\n"
           "    monkeypatch.setattr(mod, 'FLAG', True)\n"
           "    monkeypatch.setattr('pkg.mod.fn', None)\n"
           "    monkeypatch.setitem(mod.TABLE, 'k', 1)\n"
           "    monkeypatch.setenv('KILN_X', '1')\n"
           "    with mock.patch('pkg.mod.fn'), mock.patch.object(mod.Cls, 'method'):\n"
           "        pass\n")
    assert sorted(patches(src)) == [(2, "mod.FLAG"), (3, "pkg.mod.fn"), (4, "mod.TABLE['k']"),
                                    (6, "mod.Cls.method"), (6, "pkg.mod.fn")]
