"""reduce-overhead inference on the GPU with the per-call arena (kiln.inductor scheduler/arena.py):
results equal eager's (convolutions through cuDNN's and the depthwise kernel's ``out=`` forms, with
and without bias, matmuls and a padded-vocabulary head), the wrapper really takes an arena, and a
decoder-like graph's CUDA graph pool stays within 1.2x the allocated peak of the same graph run
without CUDA graphs. Run on the GPU machine: ``pytest -m gpu tests/test_gpu_inference_arena.py``."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from torch import nn

import kiln

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)  # depthwise, with a bias
        self.pw = nn.Conv2d(32, 64, 1)
        self.bn = nn.BatchNorm2d(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(self.dw(h))
        h = torch.relu(self.bn(self.pw(h)))
        return self.head(h.mean((2, 3)))


class Decoder(nn.Module):
    """Embedding, MLP blocks, a vocabulary head whose width is not a multiple of 8 (the padded matmul)."""

    def __init__(self, vocab: int = 50257, d: int = 256) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                    for _ in range(4))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def _pool_bytes() -> int:
    return sum(int(s["total_size"]) for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_net_matches_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = ConvNet().cuda().to(dtype).eval()
    compiled = kiln.compile(model, mode="reduce-overhead")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    out_log = logging.getLogger("kiln.output_code")
    out_log.addHandler(handler)
    out_log.setLevel(logging.INFO)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for _ in range(4):  # warm-up, record, replays
            x = torch.randn(8, 3, 32, 32, device="cuda", dtype=dtype)
            torch.testing.assert_close(compiled(x), model(x), rtol=tol, atol=tol)
    out_log.removeHandler(handler)
    code = "\n".join(r.getMessage() for r in records)
    assert "_conv_out(" in code and "_arena = torch.empty" in code


def test_decoder_pool_within_the_allocated_peak() -> None:
    torch.manual_seed(0)
    model = Decoder().cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 50257, (4, 128), device="cuda")
    with torch.no_grad():
        want = model(ids)
        plain = kiln.compile(model)
        for _ in range(2):
            plain(ids)
        torch.cuda.synchronize()
        gc.collect()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = plain(ids)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out, plain
        kiln.reset()
        gc.collect()
        torch.cuda.empty_cache()
        before = _pool_bytes()
        graphed = kiln.compile(model, mode="reduce-overhead")
        for _ in range(4):
            got = graphed(ids)
        torch.cuda.synchronize()
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        del got
        gc.collect()
        torch.cuda.empty_cache()
        pool = _pool_bytes() - before
    assert pool <= 1.2 * peak, (pool / 2**20, peak / 2**20)
