import os

os.environ.setdefault("KILN_VERIFY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


class Recorder:
    """A backend that records every graph it is given and runs it as is."""

    def __init__(self) -> None:
        self.graphs = []
        self.inputs = []

    def __call__(self, gm, example_inputs):
        from kiln.graph import verify

        verify(gm, "torch")
        self.graphs.append(gm)
        self.inputs.append(list(example_inputs))
        return gm.forward

    @property
    def count(self) -> int:
        return len(self.graphs)


@pytest.fixture
def recorder():
    import kiln.capture as kc

    kc.reset()
    return Recorder()


def assert_same(got, want, atol=1e-5):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)
    elif type(want).__module__ == "numpy" and hasattr(want, "dtype"):  # ndarray or numpy scalar
        import numpy as np

        assert type(got) is type(want), f"expected a {type(want)}, got {type(got)}"
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want), (got, want)
        np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got.keys()) == list(want.keys())
        for k in want:
            assert_same(got[k], want[k], atol)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for a, b in zip(got, want):
            assert_same(a, b, atol)
    elif isinstance(want, torch.nn.Module):
        assert type(got) is type(want)
        assert_same(dict(got.state_dict()), dict(want.state_dict()), atol)
        assert_same({k: v for k, v in vars(got).items() if not k.startswith("_")},
                    {k: v for k, v in vars(want).items() if not k.startswith("_")}, atol)
    elif _is_plain_object(want):
        assert type(got) is type(want), (got, want)
        assert_same(vars(got), vars(want), atol)
    elif type(want) is float:  # a Python number computed from tensor data (summation order may differ)
        assert type(got) is float and abs(got - want) <= atol + 1e-6 * abs(want), (got, want)
    else:
        assert got == want, (got, want)


def _is_plain_object(v) -> bool:
    """A user class instance (compared by its attributes), not a module, function or class."""
    import types

    return hasattr(v, "__dict__") and not isinstance(v, (torch.nn.Module, type, types.FunctionType,
                                                          types.ModuleType, types.MethodType))
