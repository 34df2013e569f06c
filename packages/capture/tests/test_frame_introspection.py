"""Builtins that read the calling frame (``locals()``, ``vars()``, ``dir()``, ``globals()``,
``sys._getframe``, ``inspect.currentframe``): called for real from the interpreter they read kiln's own
frame, so ``"w" in locals()`` was False and ``len(globals())`` counted kiln's module (silently wrong).
Each program runs three times with fresh inputs (and changed state) against eager."""

import inspect
import sys

import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same

SCALE = 2.0


class _Box:
    def __init__(self) -> None:
        self.s = 2.0


BOX = _Box()


def _run(fn, calls=3, before=None):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec)
    for i in range(calls):
        if before is not None:
            before(i)
        x = torch.randn(3)
        assert_same(opt(x.clone()), fn(x.clone()))
    return rec


def test_locals_holds_the_frames_own_names():
    def f(x):
        w = x + 1
        if "w" in locals():
            return w * 2
        return x
    assert _run(f).count == 1


def test_locals_values_are_the_traced_values():
    def f(x):
        y = x * 3
        d = locals()
        return d["y"] + d["x"], len(d)
    assert _run(f).count == 1


def test_locals_of_an_inlined_function_with_cells():
    t = torch.ones(3)

    def f(x):
        k = 2

        def inner(y):
            return y * k + t + len(locals())  # y, k, t: locals() holds the free variables too
        return inner(x)
    assert _run(f).count == 1


def test_vars_and_dir_without_arguments():
    def f(x):
        a = 1
        return x + len(vars()) + len(dir()) + a
    assert _run(f).count == 1


def test_vars_of_an_object_is_guarded_like_its_dict():
    def f(x):
        return x * vars(BOX)["s"]

    def change(i):
        BOX.s = 2.0 + i
    _run(f, before=change)
    BOX.s = 2.0


def test_globals_reads_the_users_module():
    def f(x):
        return x * globals()["SCALE"] + len(globals())

    def change(i):
        global SCALE
        SCALE = 2.0 + i
    _run(f, before=change)


def test_frame_objects_run_the_frame_in_python_and_say_so():
    def f(x):
        return x + (1 if sys._getframe().f_code.co_name == "f" else 0)

    def g(x):
        return x * 2 + (1 if inspect.currentframe().f_code.co_name == "g" else 0)
    for fn in (f, g):
        assert _run(fn).count == 0
        out = kc.explain(fn)(torch.ones(3))
        assert out.graph_count == 0 and out.eager_frames, out


def test_frame_object_in_an_inlined_function_breaks_there():
    def name_of():
        return sys._getframe().f_code.co_name

    def f(x):
        y = x * 2
        return y + (1 if name_of() == "name_of" else 0)
    rec = _run(f)
    assert rec.count >= 1
    out = kc.explain(f)(torch.ones(3))
    assert out.break_count == 1 and "sys._getframe" in out.break_reasons[0].reason, out
