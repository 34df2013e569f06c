"""The ``kiln`` module exposes its API (torch.compiler's controls included) and nothing else."""

import kiln


def test_kiln_module_exposes_only_its_api():
    names = set(dir(kiln))
    assert {"compile", "explain", "disable", "allow_in_graph", "is_compiling", "set_stance", "mark_static",
            "mark_dynamic", "reset"} <= names
    assert not names & {"importlib", "pkgutil", "Any", "types"}
    assert all(callable(getattr(kiln, n)) for n in ("disable", "allow_in_graph", "is_compiling", "set_stance",
                                                     "mark_static"))
    assert kiln.is_compiling() is False
