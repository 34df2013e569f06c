"""max-autotune on the GPU: the checks of gpu_modes_check.py, one test each (skipped without CUDA)."""

from __future__ import annotations

import gpu_modes_check
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("name", list(gpu_modes_check.AUTOTUNE_CHECKS))
def test_autotune_check(name):
    gpu_modes_check.AUTOTUNE_CHECKS[name]()
