"""Autotune tests run Triton kernels under the interpreter on CPU tensors when there is no GPU (a
FakeTimer stands in for the device's clock); with a GPU they run there."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton compiles anything
