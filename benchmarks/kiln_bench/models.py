"""The benchmark model suite: random weights only, no downloads.

Every model is built from a config (transformers), with ``weights=None`` (torchvision) or
``pretrained=False`` (timm). ``small=True`` gives a tiny config of the same architecture for quick
CPU runs. Dropout is set to 0 everywhere so that compiled outputs and gradients can be compared with
eager exactly (a compiled RNG never reproduces eager's dropout masks).

Sizes (batch, image side / sequence length) per device are in ``SHAPES``; see benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SUITE: tuple[str, ...] = (
    "resnet50",
    "mobilenet_v3_large",
    "vit_base_patch16_224",
    "convnext_tiny",
    "bert_base",
    "gpt2",
    "llama_350m",
    "t5_small",
)

VISION = {"resnet50", "mobilenet_v3_large", "vit_base_patch16_224", "convnext_tiny"}

# Exact configs of the transformers models (full size). The Llama config is ~355M parameters.
LLAMA_350M = dict(
    hidden_size=1024,
    intermediate_size=2560,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
GPT2_12L = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
BERT_BASE = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    vocab_size=30522,
)
T5_SMALL = dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64,
                vocab_size=32128)

TINY_LM = dict(vocab=1000)


@dataclass(frozen=True, slots=True)
class Shape:
    batch: int
    size: int  # image side for vision models, sequence length for language models


# (device kind, small) -> model -> Shape. GPU sizes are sized so the whole GPU suite fits its budget.
SHAPES: dict[tuple[str, bool], dict[str, Shape]] = {
    ("cuda", False): {
        "resnet50": Shape(32, 224), "mobilenet_v3_large": Shape(32, 224),
        "vit_base_patch16_224": Shape(32, 224), "convnext_tiny": Shape(32, 224),
        "bert_base": Shape(8, 512), "gpt2": Shape(8, 512), "llama_350m": Shape(4, 512),
        "t5_small": Shape(16, 128),
    },
    ("cpu", False): {
        "resnet50": Shape(2, 224), "mobilenet_v3_large": Shape(2, 224),
        "vit_base_patch16_224": Shape(2, 224), "convnext_tiny": Shape(2, 224),
        "bert_base": Shape(1, 128), "gpt2": Shape(1, 128), "llama_350m": Shape(1, 128),
        "t5_small": Shape(1, 128),
    },
}
for _dev in ("cuda", "cpu"):
    SHAPES[(_dev, True)] = {
        name: (Shape(2, 64) if name in VISION else Shape(2, 32)) for name in SUITE
    }


@dataclass(slots=True)
class ModelCase:
    """A built model with example inputs, training targets and a loss."""

    name: str
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    targets: torch.Tensor
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    shape: Shape
    description: str
    extra: dict[str, Any] = field(default_factory=dict)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def logits_of(out: Any) -> torch.Tensor:
    """The main tensor of a model output (HF ModelOutput, tuple or tensor)."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)):
        return logits_of(out[0])
    if isinstance(out, dict):
        return logits_of(next(iter(out.values())))
    raise TypeError(f"cannot find the logits in a {type(out).__name__}")


def classification_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits_of(out).float(), targets)


def lm_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    logits = logits_of(out).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def disable_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0


# --------------------------------------------------------------------------- vision


def _resnet50(small: bool) -> tuple[nn.Module, str]:
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    if small:
        return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16), \
            "torchvision ResNet(Bottleneck,[1,1,1,1],width_per_group=16)"
    return torchvision.models.resnet50(weights=None), "torchvision resnet50(weights=None)"


def _mobilenet(small: bool) -> tuple[nn.Module, str]:
    import torchvision

    if small:
        return torchvision.models.mobilenet_v3_large(weights=None, width_mult=0.25,
                                                     num_classes=10), \
            "torchvision mobilenet_v3_large(width_mult=0.25)"
    return torchvision.models.mobilenet_v3_large(weights=None), \
        "torchvision mobilenet_v3_large(weights=None)"


def _vit(small: bool, img: int) -> tuple[nn.Module, str]:
    import timm

    if small:
        kw = dict(depth=2, embed_dim=64, num_heads=2, img_size=img, num_classes=10)
        return timm.create_model("vit_base_patch16_224", pretrained=False, **kw), \
            f"timm vit_base_patch16_224 {kw}"
    return timm.create_model("vit_base_patch16_224", pretrained=False), \
        "timm vit_base_patch16_224(pretrained=False)"


def _convnext(small: bool) -> tuple[nn.Module, str]:
    import timm

    if small:
        kw = dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), num_classes=10)
        return timm.create_model("convnext_tiny", pretrained=False, **kw), \
            f"timm convnext_tiny {kw}"
    return timm.create_model("convnext_tiny", pretrained=False), \
        "timm convnext_tiny(pretrained=False)"


# --------------------------------------------------------------------------- transformers


def _bert(small: bool) -> tuple[nn.Module, str, int]:
    from transformers import BertConfig, BertForMaskedLM

    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
               vocab_size=TINY_LM["vocab"]) if small else BERT_BASE
    config = BertConfig(**cfg, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        attn_implementation="sdpa")
    return BertForMaskedLM(config), f"transformers BertForMaskedLM {cfg}", config.vocab_size


def _gpt2(small: bool) -> tuple[nn.Module, str, int]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=TINY_LM["vocab"], n_positions=256,
               bos_token_id=0, eos_token_id=0) if small else GPT2_12L
    config = GPT2Config(**cfg, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        attn_implementation="sdpa")
    return GPT2LMHeadModel(config), f"transformers GPT2LMHeadModel {cfg}", config.vocab_size


def _llama(small: bool) -> tuple[nn.Module, str, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=TINY_LM["vocab"], max_position_embeddings=256,
               tie_word_embeddings=False) if small else LLAMA_350M
    config = LlamaConfig(**cfg, attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config), f"transformers LlamaForCausalLM {cfg}", config.vocab_size


def _t5(small: bool) -> tuple[nn.Module, str, int]:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=2, d_kv=32,
               vocab_size=TINY_LM["vocab"]) if small else T5_SMALL
    config = T5Config(**cfg, dropout_rate=0.0, use_cache=False, attn_implementation="sdpa")
    return T5ForConditionalGeneration(config), \
        f"transformers T5ForConditionalGeneration {cfg}", config.vocab_size


@contextlib.contextmanager
def _default_device(device: torch.device):
    # Building directly on the GPU avoids minutes of CPU weight initialisation for the big models.
    if device.type == "cpu":
        yield
        return
    with torch.device(device):
        yield


def build(name: str, *, small: bool, device: str | torch.device, seed: int = 0) -> ModelCase:
    """Build suite model ``name`` with deterministic random weights and inputs on ``device``.

    The model is in train mode with dropout disabled; callers switch to ``eval()`` for inference.
    """
    if name not in SUITE:
        raise KeyError(f"unknown suite model {name!r}; known: {', '.join(SUITE)}")
    device = torch.device(device)
    shape = SHAPES[("cuda" if device.type == "cuda" else "cpu", small)][name]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with _default_device(device):
        if name in VISION:
            model, desc = {
                "resnet50": lambda: _resnet50(small),
                "mobilenet_v3_large": lambda: _mobilenet(small),
                "vit_base_patch16_224": lambda: _vit(small, shape.size),
                "convnext_tiny": lambda: _convnext(small),
            }[name]()
            num_classes = 10 if small else 1000
        else:
            model, desc, vocab = {"bert_base": _bert, "gpt2": _gpt2, "llama_350m": _llama,
                                  "t5_small": _t5}[name](small)
    model = model.to(device)
    disable_dropout(model)
    model.train()
    b, s = shape.batch, shape.size
    if name in VISION:
        images = torch.randn(b, 3, s, s, generator=gen).to(device)
        targets = torch.randint(0, num_classes, (b,), generator=gen).to(device)
        return ModelCase(name, model, (images,), {}, targets, classification_loss, shape, desc)
    ids = torch.randint(0, vocab, (b, s), generator=gen).to(device)
    targets = torch.randint(0, vocab, (b, s), generator=gen).to(device)
    kwargs: dict[str, Any] = {}
    if name == "t5_small":
        kwargs["decoder_input_ids"] = torch.randint(0, vocab, (b, s), generator=gen).to(device)
    return ModelCase(name, model, (ids,), kwargs, targets, lm_loss, shape, desc)


def build_for_mode(name: str, *, small: bool, device: torch.device, training: bool) -> ModelCase:
    """``build`` set up as the suite measures it: inference is ``eval()`` with bf16 weights and
    inputs on GPU (fp32 on CPU); training keeps fp32 weights (AMP is applied around the step)."""
    case = build(name, small=small, device=device)
    if not training:
        case.model.eval()
        if device.type == "cuda":
            case.model.to(torch.bfloat16)
            cast_inputs(case, torch.bfloat16)
    return case


def cast_inputs(case: ModelCase, dtype: torch.dtype) -> None:
    """Cast floating-point example inputs (images) to ``dtype``; token ids stay integers."""
    def cast(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    case.args = tuple(cast(a) for a in case.args)
    case.kwargs = {k: cast(v) for k, v in case.kwargs.items()}


def describe_suite(small: bool, device: str) -> list[dict[str, Any]]:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return [{"model": n, "batch": SHAPES[(kind, small)][n].batch,
             "size": SHAPES[(kind, small)][n].size} for n in SUITE]
