"""The generated wrapper's kernel loader hands each newly imported kernel module to kiln.runtime's
preload (triton_preload.adopt_module: binaries of an artifact or cache entry filed into triton's
kernel cache) when kiln.runtime is loaded, and imports it all the same when it is not."""

from __future__ import annotations

import sys
import uuid

import pytest

from kiln.inductor.codegen.triton.wrapper import load_triton_module


def _source() -> str:
    return f"import triton\n\nMARK = {uuid.uuid4().hex!r}\n\n@triton.jit\ndef k0(x):\n    pass\n"


def test_loader_hands_a_new_module_to_the_runtime_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln.runtime.triton_preload as tp

    seen = []
    monkeypatch.setattr(tp, "adopt_module", seen.append)
    source = _source()
    module = load_triton_module(source)
    assert seen == [module] and hasattr(module, "k0")
    assert load_triton_module(source) is module  # type: ignore[operator]
    assert seen == [module]  # already imported: not handed over twice


def test_loader_works_without_kiln_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "kiln.runtime.triton_preload", raising=False)
    module = load_triton_module(_source())
    assert hasattr(module, "k0")


def test_empty_kernels_are_not_precompiled() -> None:
    """A kernel over zero elements is never launched (``pass`` in the wrapper): warming it up at load
    would compile a binary no call uses (and, on a loaded artifact, look triton's cache up)."""
    import torch

    from kiln.inductor.codegen.triton.wrapper import wrapper_prologue

    class K:
        def __init__(self, name: str, xnumel: str) -> None:
            self.name, self.xnumel, self.size_args, self.function = name, xnumel, [], None
            self.pointer_args, self.launcher_var = ["buf0"], f"_k_{name}"
            self.source = f"@triton.jit\ndef {name}(in_ptr0, XBLOCK: tl.constexpr):\n    pass\n"

        def launcher_definition(self, module, inputs):
            return f"{self.launcher_var} = None"
    text = wrapper_prologue([K("a", "128"), K("b", "0")], dtypes={"buf0": torch.float32})  # type: ignore[list-item]
    line = next(x for x in text.splitlines() if x.startswith("_kiln_precompile("))
    assert "_k_a" in line and "_k_b" not in line
