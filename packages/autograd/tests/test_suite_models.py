"""Issue 4's acceptance check: a training step of every suite model at its REAL configuration through
``kiln.compile(model, backend="aot_eager")`` on CPU gives the loss and every parameter's gradient of
eager (rtol 1e-4, fp32); ResNet-50's BatchNorm running statistics match after three SGD steps.

Random weights, no downloads; small inputs (batch 2, 64x64 images / 32 tokens) keep each test quick.
Dropout is 0 (a compiled graph draws its own masks, so eager's could never be matched exactly).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import kiln
from kiln.autograd import aot_eager, partition

pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(autouse=True)
def _fresh_kiln() -> Any:
    """Compiled entries hold their models; drop them so the big models do not pile up in memory."""
    kiln.reset()
    yield
    kiln.reset()
    gc.collect()


class Counting:
    """kiln's aot_eager backend (what backend="aot_eager" resolves to), remembering what it compiled."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []
        self.__name__ = "aot_eager"

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        compiled = aot_eager(gm, example_inputs)
        self.graphs.append(compiled)
        return compiled


def _no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    return model.train()


def _check_partitions(backend: Counting, eager_saved: int | None = None) -> None:
    trained = [g for g in backend.graphs if g.aot.partitioned is not None]
    assert trained, "kiln compiled no training graph (everything ran eagerly?)"
    for g in trained:  # min-cut never saves more than save-everything
        assert g.aot.partitioned.saved_bytes <= partition(g.aot.joint, "save_all").saved_bytes
    if eager_saved is not None:  # nor more than eager autograd (weights included on both sides)
        total = sum(g.aot.partitioned.saved_bytes for g in trained)
        assert total <= eager_saved, f"min-cut saves {total} bytes, eager {eager_saved}"


class SavedBytes:
    """Saved-tensor hooks: bytes of the distinct tensors eager autograd saves for backward."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        self.seen[key] = t.numel() * t.element_size()
        return t

    def total(self) -> int:
        return sum(self.seen.values())


def _compare_grads(model: nn.Module, eager_grads: dict[str, torch.Tensor | None], step: int) -> None:
    for name, p in model.named_parameters():
        want = eager_grads[name]
        assert (p.grad is None) == (want is None), f"grad of {name} at step {step}: presence differs"
        if want is not None:
            torch.testing.assert_close(p.grad, want, rtol=RTOL, atol=ATOL,
                                       msg=lambda m, name=name: f"grad of {name} at step {step}: {m}")


def check_one_step(model: nn.Module, run: Callable[[nn.Module], torch.Tensor]) -> Counting:
    """One training step, eager then compiled, on the same module (big models: no second copy)."""
    model = _no_dropout(model)
    torch.manual_seed(0)
    saved = SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        loss_e = run(model)
    loss_e.backward()
    eager_grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    backend = Counting()
    compiled = kiln.compile(model, backend=backend)
    torch.manual_seed(0)
    loss_c = run(compiled)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss_e, rtol=RTOL, atol=ATOL)
    _compare_grads(model, eager_grads, 0)
    _check_partitions(backend, saved.total())
    return backend


def check_steps(model: nn.Module, run: Callable[[nn.Module], torch.Tensor], steps: int) -> Counting:
    """``steps`` SGD steps on an eager copy and a compiled copy; loss, grads and buffers each step."""
    eager = _no_dropout(model)
    comp = copy.deepcopy(eager)
    backend = Counting()
    compiled = kiln.compile(comp, backend=backend)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(comp.parameters(), lr=0.01)
    for step in range(steps):
        torch.manual_seed(step)
        loss_e = run(eager)
        loss_e.backward()
        torch.manual_seed(step)
        loss_c = run(compiled)
        loss_c.backward()
        torch.testing.assert_close(loss_c, loss_e, rtol=RTOL, atol=ATOL, msg=f"loss at step {step}")
        _compare_grads(comp, {n: p.grad for n, p in eager.named_parameters()}, step)
        for (name, b_e), b_c in zip(eager.named_buffers(), comp.buffers()):
            torch.testing.assert_close(b_c, b_e, rtol=RTOL, atol=ATOL, msg=f"buffer {name} after step {step}")
        for opt in (opt_e, opt_c):
            opt.step()
            opt.zero_grad(set_to_none=True)
    _check_partitions(backend)
    return backend


# ---- vision -------------------------------------------------------------------------------------

def _image_step(model: nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ()).item()))
    x = torch.randn(2, 3, 64, 64, generator=g)
    target = torch.randint(0, 1000, (2,), generator=g)
    return F.cross_entropy(model(x), target)


def test_resnet50_three_steps_batchnorm_stats() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    backend = check_steps(torchvision.models.resnet50(weights=None), _image_step, steps=3)
    assert any(g.aot.joint.signature.mutated_inputs for g in backend.graphs), \
        "BatchNorm running stats must be written back as mutated inputs"


def test_mobilenet_v3_large() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    check_one_step(torchvision.models.mobilenet_v3_large(weights=None), _image_step)


# ---- transformers -------------------------------------------------------------------------------

def _tokens(vocab: int, seq: int = 32, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def _causal_lm_step(vocab: int) -> Callable[[nn.Module], torch.Tensor]:
    ids = _tokens(vocab)
    return lambda model: model(input_ids=ids, labels=ids).loss


def test_bert_base() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, vocab_size=30522)
    torch.manual_seed(0)
    check_one_step(transformers.BertForMaskedLM(cfg), _causal_lm_step(cfg.vocab_size))


def test_gpt2_124m() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                                  use_cache=False)
    torch.manual_seed(0)
    check_one_step(transformers.GPT2LMHeadModel(cfg), _causal_lm_step(cfg.vocab_size))


def test_llama_350m_config() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2560, num_hidden_layers=12,
                                   num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                   max_position_embeddings=2048, tie_word_embeddings=False,
                                   use_cache=False)
    torch.manual_seed(0)
    check_one_step(transformers.LlamaForCausalLM(cfg), _causal_lm_step(cfg.vocab_size))


def test_t5_small() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                                d_kv=64, vocab_size=32128, use_cache=False, decoder_start_token_id=0,
                                pad_token_id=0)
    ids, labels = _tokens(cfg.vocab_size), _tokens(cfg.vocab_size, seq=16)
    torch.manual_seed(0)
    check_one_step(transformers.T5ForConditionalGeneration(cfg),
                   lambda model: model(input_ids=ids, labels=labels).loss)
