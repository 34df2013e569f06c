"""CUDA training through kiln.autograd (run on the GPU machine; skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from ag_util import check_module_training  # type: ignore[import-not-found]
from torch import nn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class ConvBNDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


@pytest.fixture(autouse=True)
def _no_tf32():  # type: ignore[no-untyped-def]
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_cnn_batchnorm_cuda_three_steps() -> None:
    torch.manual_seed(0)
    model = ConvBNDrop().cuda().train()
    check_module_training(model, lambda: (torch.randn(4, 3, 8, 8, device="cuda"),), steps=3, rtol=1e-3, atol=1e-4)


def test_transformer_layer_cuda() -> None:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).cuda().train()
    check_module_training(model, lambda: (torch.randn(2, 8, 64, device="cuda"),), steps=2, rtol=1e-3, atol=1e-4)


def test_dropout_mask_cuda() -> None:
    from ag_util import compile_fn  # type: ignore[import-not-found]
    x = torch.randn(256, 64, device="cuda", requires_grad=True)
    c = compile_fn(lambda x: (nn.functional.dropout(x, 0.3, True) * 2,), [x])
    (y,) = c(x)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, (y != 0).float() * 2 / 0.7)


def test_autocast_bf16_cuda() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda()
    import copy

    from ag_util import compile_module  # type: ignore[import-not-found]
    comp = copy.deepcopy(model)
    compiled, _ = compile_module(comp)
    x = torch.randn(4, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        oe, oc = model(x), compiled(x)
    assert oc.dtype == oe.dtype == torch.bfloat16
    oe.float().sum().backward()
    oc.float().sum().backward()
    for pe, pc in zip(model.parameters(), comp.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=2e-2, atol=2e-2)


def test_cudnn_batch_norm_graph_cuda() -> None:
    # an explicit cudnn_batch_norm (what batch_norm dispatches to on CUDA) runs as the native ops
    import torch.nn.functional as F
    from ag_util import compile_fn  # type: ignore[import-not-found]
    from test_batchnorm_vendor import vendor_graph  # type: ignore[import-not-found]
    torch.manual_seed(0)
    inputs = [torch.randn(4, 3, 5, 5, device="cuda", requires_grad=True),
              torch.rand(3, device="cuda", requires_grad=True),
              torch.randn(3, device="cuda", requires_grad=True),
              torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")]
    c_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    e_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    compiled = compile_fn(vendor_graph(torch.ops.aten.cudnn_batch_norm.default, True), c_in)
    (out,) = compiled(*c_in)
    ref = F.batch_norm(e_in[0], e_in[3], e_in[4], e_in[1], e_in[2], True, 0.1, 1e-5).relu()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for i in range(3):
        torch.testing.assert_close(c_in[i].grad, e_in[i].grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_in[3], e_in[3])
    torch.testing.assert_close(c_in[4], e_in[4])
