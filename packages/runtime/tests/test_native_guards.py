"""The native guard checker answers every guard as kiln.graph's Python checks do, on passing and on
failing frames; it builds from a clean cache, refuses malformed programs clearly, and a machine without
a compiler keeps the Python checks."""

from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys

import pytest
import torch

from kiln.graph import Guard, guards_native, tensor_expectation, type_name
from kiln.graph.guards_codegen import generated_check
from kiln.graph.guards_plan import plan_check
from kiln.runtime import native_guards


@pytest.fixture(scope="module")
def native():
    module = native_guards.load()
    assert guards_native.self_test(module) is None
    return module


@pytest.fixture
def installed(native):
    """The checker installed for the test, the process's choice restored after it."""
    before = guards_native.current()
    guards_native.install(native)
    yield native
    if before is None:
        guards_native.uninstall()
    else:
        guards_native.install(before)


class Box:
    """An object whose attributes the guards read."""


class Hooked(torch.nn.Module):
    """A class with a Python ``__getattr__`` (the checker's own path for nn.Module-like classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.scale = 2


class Sub(torch.Tensor):
    """A tensor subclass (checked by the Python fallback)."""


class Loud:
    @property
    def value(self):
        raise KeyboardInterrupt


def _frame() -> dict:
    box = Box()
    box.t = torch.zeros(2, 3)
    box.p = torch.nn.Parameter(torch.ones(4))
    box.n, box.f, box.b, box.s, box.none = 3, 0.25, False, "relu", None
    box.tup = (1, (2, 3.0), "x")
    box.d = {"a": 1, 2: "b"}
    box.lst = [box.t, 5]
    box.m = Hooked()
    return {"box": box, "key": "a", "x": torch.arange(6.0).reshape(2, 3), "i": 7}


def _guards(frame: dict) -> tuple[Guard, ...]:
    box = frame["box"]
    out = [Guard("L['x']", "TENSOR_MATCH", tensor_expectation(frame["x"])),
           Guard("L['i']", "EQUALS_MATCH", 7),
           Guard("L['box']", "TYPE_MATCH", type_name(Box)),
           Guard("L['box'].t", "TENSOR_MATCH", tensor_expectation(box.t, frozenset({0}), (3, 1))),
           Guard("L['box'].p", "TENSOR_MATCH", tensor_expectation(box.p)),
           Guard("L['box'].n", "EQUALS_MATCH", 3), Guard("L['box'].f", "EQUALS_MATCH", 0.25),
           Guard("L['box'].b", "EQUALS_MATCH", False), Guard("L['box'].s", "EQUALS_MATCH", "relu"),
           Guard("L['box'].none", "IS_NONE", None), Guard("L['box'].t", "NOT_NONE", None),
           Guard("L['box'].tup", "EQUALS_MATCH", (1, (2, 3.0), "x")),
           Guard("L['box'].d", "DICT_KEYS", ("a", 2)), Guard("L['box'].d[2]", "EQUALS_MATCH", "b"),
           Guard("L['box'].d.get(L['key'])", "EQUALS_MATCH", 1),
           Guard("L['box'].lst", "LENGTH_MATCH", 2), Guard("L['box'].lst[0]", "ID_MATCH", id(box.t)),
           Guard("L['box'].lst[-1]", "EQUALS_MATCH", 5),
           Guard("L['box'].m._modules['lin']", "ID_MATCH", id(box.m.lin)),
           Guard("L['box'].m.lin.weight", "TENSOR_MATCH", tensor_expectation(box.m.lin.weight)),
           Guard("L['box'].m.scale", "EQUALS_MATCH", 2), Guard("L['box'].m.training", "EQUALS_MATCH", True),
           Guard("__import__('sys').modules['torch'].float32", "EQUALS_MATCH", torch.float32),
           Guard("L['box'].t.size()[1]", "SYMBOL", "s0"), Guard("", "SHAPE_EXPR", "s0 >= 2")]
    return tuple(out)


def _answer(check, frame) -> bool:
    try:
        return bool(check(frame, {}))
    except Exception:  # the caller's rule: a read that raises fails the entry
        return False


def _moved() -> collections.OrderedDict:
    """An OrderedDict whose key order (``move_to_end``) differs from its dict storage's."""
    d = collections.OrderedDict([("a", 1), (2, "b")])
    d.move_to_end("a")
    d.move_to_end(2)
    return d


REPLACEMENTS = [None, 0, 1, True, 2.0, float("nan"), "relu", (1, (2, 3.0), "x"), (1, (2, 3), "x"), [1, 2], {},
                {"a": 1, 2: "b"}, {2: "b", "a": 1}, torch.zeros(2, 3), torch.zeros(5, 3), torch.zeros(2, 3).t(),
                torch.zeros(2, 3, dtype=torch.float64), torch.zeros(4, requires_grad=True), torch.nn.Parameter(torch.ones(4)),
                torch.zeros(2, 3).as_subclass(Sub), collections.defaultdict(int, {"a": 1, 2: "b"}), _moved()]
def _set_on_box(name: str):
    return lambda f, v: setattr(f["box"], name, v)


UNCHANGED = object()
CHANGES = [
    ("the argument", lambda f, v: f.__setitem__("x", v)), ("the int argument", lambda f, v: f.__setitem__("i", v)),
    ("the key", lambda f, v: f.__setitem__("key", v)),
    *((f"box.{name}", _set_on_box(name)) for name in ("t", "p", "n", "f", "b", "s", "none", "tup", "d", "lst")),
    ("box.d['a']", lambda f, v: f["box"].d.__setitem__("a", v)),
    ("box.lst[0]", lambda f, v: f["box"].lst.__setitem__(0, v)),
    ("box.m.scale", lambda f, v: setattr(f["box"].m, "scale", v)),
    ("box.m.training", lambda f, v: setattr(f["box"].m, "training", v)),
    ("the box", lambda f, v: f.__setitem__("box", v)),
]


@pytest.mark.parametrize("what, change", CHANGES, ids=[c[0] for c in CHANGES])
def test_native_checks_answer_as_python_for_every_replacement(installed, what, change):
    for value in [*REPLACEMENTS, UNCHANGED]:
        frame = _frame()
        guards = _guards(frame)
        check = guards_native.native_check(guards, generated_check)
        assert check is not None and check.__kiln_native__[1] == 2  # the size symbol and relation stay in Python
        if value is not UNCHANGED:
            change(frame, value)
        want = _answer(generated_check(guards), frame)
        assert _answer(plan_check(guards), frame) == want
        assert _answer(check, frame) == want, (what, value)


def test_an_unchanged_frame_passes_and_each_kind_can_fail(installed):
    frame = _frame()
    assert _answer(guards_native.native_check(_guards(frame), generated_check), frame)
    failed = 0
    for (_, change), value in itertools.product(CHANGES, REPLACEMENTS):
        frame = _frame()
        check = guards_native.native_check(_guards(frame), generated_check)
        change(frame, value)
        failed += not _answer(check, frame)
    assert failed > len(CHANGES) * len(REPLACEMENTS) // 2  # the table is not all passes


def test_an_attribute_read_that_raises_keyboard_interrupt_propagates(native):
    run = native.Program([(0, -1, None), (1, -1, None), (4, 0, "o"), (3, 2, "value")], [(6, 3, None)])
    assert run({"o": Box()}, {}) is False  # AttributeError: the guard fails
    with pytest.raises(KeyboardInterrupt):
        run({"o": Loud()}, {})


@pytest.mark.parametrize("nodes, checks, error, text", [
    ([(0, -1, None)], [], ValueError, "nodes 0 and 1"),
    ([(0, -1, None), (1, -1, None), (3, 5, "a")], [], ValueError, "node 2"),
    ([(1, -1, None), (0, -1, None)], [], ValueError, "node 0"),
    ([(0, -1, None), (1, -1, None), (3, 0, 7)], [], TypeError, "not a str"),
    ([(0, -1, None), (1, -1, None)], [(9, 0, None)], ValueError, "check 0"),
    ([(0, -1, None), (1, -1, None)], [(7, 0, (1, 2))], TypeError, "6-tuple"),
    ([(0, -1, None), (1, -1, None)], [(1, 0, 3)], TypeError, "not a class"),
])
def test_a_malformed_program_is_refused_with_what_and_where(native, nodes, checks, error, text):
    with pytest.raises(error, match=text):
        native.Program(nodes, checks)


def test_a_machine_without_the_compiler_keeps_python_checks(tmp_path):
    code = ("import kiln.runtime.native_guards as n, kiln.graph.guards_native as g\n"
            "print(n.install(), g.installed())\nprint(n.reason())")
    env = {**os.environ, "KILN_CXX": str(tmp_path / "no-such-g++"), "KILN_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, reason = out.stdout.splitlines()
    assert first == "False False"
    assert "no-such-g++" in reason and "not found" in reason


def test_knob_off_keeps_python_checks(tmp_path):
    code = "import kiln.runtime.native_guards as n\nprint(n.install(), n.reason())"
    env = {**os.environ, "KILN_NATIVE_GUARDS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False KILN_NATIVE_GUARDS=0", out.stderr


def test_a_tensor_subclass_is_left_to_the_python_check(installed):
    """The native loop runs no Python of its own: a tensor value of another type (or with symbolic sizes)
    makes it answer None, and the call is checked by the Python check of the whole set."""
    frame = _frame()
    guards = (Guard("L['x']", "TENSOR_MATCH", tensor_expectation(frame["x"])),)
    check = guards_native.native_check(guards, generated_check)
    run = installed.Program([(0, -1, None), (1, -1, None), (4, 0, "x")],
                            [(7, 2, (installed.scalar_type(frame["x"]), installed.device_type("cpu"), -1, (2, 3),
                                     (3, 1), False))])
    assert run(frame, {}) is True
    frame["x"] = torch.zeros(2, 3).as_subclass(Sub)
    assert run(frame, {}) is None
    assert check(frame, {}) is True and generated_check(guards)(frame, {}) is True
    frame["x"] = torch.zeros(2, 4).as_subclass(Sub)
    assert check(frame, {}) is False


def test_calibration_finds_the_tensor_pointer_or_refuses_clearly(native):
    from kiln.graph.guards_native import _probe_tensors
    offset = native.calibrate(_probe_tensors())
    assert offset in (16, 24)  # at::Tensor after the object head (torch >= 2.12), or inside MaybeOwned (older)
    with pytest.raises(TypeError, match="plain tensors"):
        native.calibrate([torch.zeros(1), torch.zeros(1), torch.zeros(1).as_subclass(Sub)])
    assert native.calibrate(_probe_tensors()) == offset  # a refused probe list leaves the reads as they were


class _Marked(torch.Tensor):
    """A tensor subclass: its pointer is left to Python."""


def test_data_ptrs_answer_as_tensor_data_ptr(installed):
    """The pointers the C++ wrapper call hands its library: each tensor's ``data_ptr()`` (views at an
    offset, transposes, empty tensors, parameters), 0 for skipped positions; None for a subclass."""
    import array

    base = torch.arange(24.0).view(4, 6)
    values = [base, base[1:, 2:], base.t(), torch.empty(0), torch.nn.Parameter(torch.ones(3)), 7,
              torch.zeros(2, dtype=torch.int8)[1:]]
    out = array.array("Q", bytes(8 * len(values)))
    skip = bytes(not isinstance(v, torch.Tensor) for v in values)
    assert installed.data_ptrs(values, out, skip) is True
    assert list(out) == [0 if not isinstance(v, torch.Tensor) else v.data_ptr() for v in values]
    assert installed.data_ptrs([base, base.as_subclass(_Marked)], array.array("Q", bytes(16)), None) is None
    with pytest.raises(ValueError, match="one uint64 per value"):
        installed.data_ptrs([base], array.array("Q", bytes(16)), None)
