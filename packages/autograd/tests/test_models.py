"""End-to-end training steps of small models through torch.compile(backend=kiln aot_eager): the loss,
every parameter's gradient and every buffer must match eager (rtol 1e-4, fp32). The suite models at
their real configurations, through kiln.compile, are in test_suite_models.py."""

from __future__ import annotations

import pytest
import torch
from ag_util import check_module_training  # type: ignore[import-not-found]
from torch import nn

from kiln.autograd import partition

pytestmark = pytest.mark.slow


class ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(ResBlock(8), ResBlock(8))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def _ce(out: torch.Tensor) -> torch.Tensor:
    target = torch.arange(out.shape[0]) % out.shape[-1]
    return nn.functional.cross_entropy(out, target)


def test_resnet_like_batchnorm_three_steps() -> None:
    torch.manual_seed(0)
    model = TinyResNet().train()
    graphs = check_module_training(model, lambda: (torch.randn(4, 3, 8, 8),), loss_fn=_ce, steps=3, saved_vs_eager=True)
    parts = graphs[0].aot.partitioned
    assert parts is not None and parts.saved_bytes <= partition(graphs[0].aot.joint, "save_all").saved_bytes
    assert graphs[0].aot.joint.signature.mutated_inputs, "BatchNorm running stats must be mutated inputs"


def _tokens(vocab: int, n: int = 2, s: int = 8) -> torch.Tensor:
    return torch.randint(0, vocab, (n, s))


def test_gpt2_tiny() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()

    def inputs():  # type: ignore[no-untyped-def]
        ids = _tokens(128)
        return (ids,)
    check_module_training(_LMWrap(model), inputs, loss_fn=lambda o: o, steps=2, saved_vs_eager=True)


class _LMWrap(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, labels=ids).loss
