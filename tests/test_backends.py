"""The backends registry and the errors of missing stages."""

from __future__ import annotations

import pytest

import kiln
from kiln.backends import resolve_backend
from kiln.settings import CompileOptions


def test_builtin_backends_are_listed() -> None:
    names = kiln.list_backends()
    assert {"eager", "aot_eager", "inductor"} <= set(names)


def test_register_backend_by_decorator() -> None:
    @kiln.register_backend(name="kiln_test_identity")
    def identity(gm, example_inputs):
        return gm.forward

    assert "kiln_test_identity" in kiln.list_backends()
    assert callable(resolve_backend("kiln_test_identity", CompileOptions()))


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        resolve_backend("nope", CompileOptions())


def test_unknown_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        CompileOptions(mode="fastest")


def test_builtin_names_cannot_be_replaced() -> None:
    with pytest.raises(ValueError, match="built-in"):
        kiln.register_backend(lambda gm, ex: gm.forward, name="eager")
