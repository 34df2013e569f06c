"""Breadth check: models outside the benchmark suite, compiled by kiln, against eager.

For each model (random weights, built from configs; nothing is downloaded) and each mode, one fresh
``kiln.reset()``: the compiled model's output is compared with eager's on the same inputs, and for
training mode the parameter gradients of one step as well. A row says ``ok`` with the worst error
relative to the output's scale, or the first error kiln raised (one line), or ``mismatch``; the
graph breaks kiln reported are counted (``kiln.explain``-style, from the graph_breaks log).

    python -m benchmarks.zoo --device cpu --small               # tiny configs, the C++ backend
    python -m benchmarks.zoo --device cuda --modes default,reduce-overhead,training,aot

This is a search for sharp edges, not a speed benchmark: it prints compile seconds only.
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from benchmarks.kiln_bench.backends import short_error
from benchmarks.kiln_bench.models import disable_dropout, logits_of


def _timm(name: str, small_kw: dict[str, Any]) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        import timm
        return timm.create_model(name, pretrained=False, **(small_kw if small else {}))
    return build


def _tv(name: str, small_kw: dict[str, Any]) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **(small_kw if small else {}))
    return build


def _hf(config_cls: str, model_cls: str, small_kw: dict[str, Any], full_kw: dict[str, Any]) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        import transformers
        cfg = getattr(transformers, config_cls)(**(small_kw if small else full_kw))
        for key, value in vars(cfg).items():  # attention dropout is read from the config, not a module
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
                setattr(cfg, key, 0.0)
        cls = getattr(transformers, model_cls)
        cfg._attn_implementation = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
        return cls(cfg)
    return build


VISION: dict[str, Callable[[bool], nn.Module]] = {
    "efficientnet_b0": _timm("efficientnet_b0", dict(num_classes=10)),
    "regnety_002": _timm("regnety_002", dict(num_classes=10)),
    "swin_tiny": _timm("swin_tiny_patch4_window7_224", dict(depths=(1, 1, 1, 1), embed_dim=32, num_heads=(1, 2, 2, 4),
                                                            num_classes=10)),
    "deit_tiny": _timm("deit_tiny_patch16_224", dict(depth=2, num_classes=10, img_size=64)),
    "densenet121": _tv("densenet121", dict(num_classes=10)),
    "shufflenet_v2": _tv("shufflenet_v2_x0_5", dict(num_classes=10)),
    "squeezenet": _tv("squeezenet1_1", dict(num_classes=10)),
    "vgg11_bn": _tv("vgg11_bn", dict(num_classes=10)),
    "inception_v3": _tv("inception_v3", dict(num_classes=10, aux_logits=False, init_weights=False)),
    "mobilevit_s": _timm("mobilevit_s", dict(num_classes=10)),
    "levit_128s": _timm("levit_128s", dict(num_classes=10, img_size=64)),
    "poolformer_s12": _timm("poolformer_s12", dict(num_classes=10)),
    "beit": _timm("beit_base_patch16_224", dict(num_classes=10, depth=2, embed_dim=64, num_heads=2, img_size=64)),
    "efficientvit": _timm("efficientvit_b0", dict(num_classes=10)),
    "regnet_x_400mf": _tv("regnet_x_400mf", dict(num_classes=10)),
    "mnasnet": _tv("mnasnet0_5", dict(num_classes=10)),
    "wide_resnet": _tv("wide_resnet50_2", dict(num_classes=10)),
}

_LM_SMALL = dict(vocab_size=1000)
TEXT: dict[str, Callable[[bool], nn.Module]] = {
    "distilbert": _hf("DistilBertConfig", "DistilBertForMaskedLM",
                      dict(dim=64, n_layers=2, n_heads=2, hidden_dim=128, **_LM_SMALL), {}),
    "roberta": _hf("RobertaConfig", "RobertaForMaskedLM",
                   dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        **_LM_SMALL), {}),
    "albert": _hf("AlbertConfig", "AlbertForMaskedLM",
                  dict(hidden_size=64, embedding_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=128, **_LM_SMALL), {}),
    "opt": _hf("OPTConfig", "OPTForCausalLM",
               dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=2,
                    word_embed_proj_dim=64, **_LM_SMALL), {}),
    "gpt_neox": _hf("GPTNeoXConfig", "GPTNeoXForCausalLM",
                    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         **_LM_SMALL), dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                            num_attention_heads=12)),
    "mistral": _hf("MistralConfig", "MistralForCausalLM",
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, **_LM_SMALL),
                   dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=4, vocab_size=32000)),
    "qwen2": _hf("Qwen2Config", "Qwen2ForCausalLM",
                 dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, **_LM_SMALL),
                 dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=8, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=32000)),
    "bart": _hf("BartConfig", "BartForConditionalGeneration",
                dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, **_LM_SMALL), {}),
    "electra": _hf("ElectraConfig", "ElectraForMaskedLM",
                   dict(hidden_size=64, embedding_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, **_LM_SMALL), {}),
    "gemma": _hf("GemmaConfig", "GemmaForCausalLM",
                 dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=16, **_LM_SMALL),
                 dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=1, head_dim=128, vocab_size=32000)),
    "phi": _hf("PhiConfig", "PhiForCausalLM",
               dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, **_LM_SMALL),
               dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
                    vocab_size=32000)),
    "mixtral": _hf("MixtralConfig", "MixtralForCausalLM",
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **_LM_SMALL),
                   dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    "deberta_v2": _hf("DebertaV2Config", "DebertaV2ForMaskedLM",
                      dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           **_LM_SMALL), {}),
    "mpnet": _hf("MPNetConfig", "MPNetForMaskedLM",
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      **_LM_SMALL), {}),
}

MODELS = {**VISION, **TEXT}


class _Breaks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _inputs(name: str, model: nn.Module, small: bool, device: torch.device) -> tuple[tuple, dict]:
    g = torch.Generator().manual_seed(1)
    if name in VISION:
        side = 299 if name == "inception_v3" else (64 if small else 224)
        if small and name == "inception_v3":
            side = 96
        if small and name == "swin_tiny":
            side = 224  # its window size fixes the image side
        return (torch.randn(2, 3, side, side, generator=g).to(device),), {}
    vocab = model.config.vocab_size
    seq = 32 if small else 256
    ids = torch.randint(0, vocab, (2, seq), generator=g).to(device)
    kwargs: dict[str, Any] = {}
    if name == "bart":
        kwargs["decoder_input_ids"] = torch.randint(0, vocab, (2, seq), generator=g).to(device)
    return (ids,), kwargs


def _rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """Worst difference over the reference's scale; ``floor`` keeps a gradient that is zero in exact
    arithmetic (a convolution's bias before a training-mode BatchNorm) from dividing noise by noise."""
    a, b = a.detach().float(), b.detach().float()
    scale = max(b.abs().max().item(), floor) or 1.0
    return (a - b).abs().max().item() / scale


def _row(name: str, mode: str, small: bool, device: torch.device) -> str:
    import kiln

    kiln.reset()
    gc.collect()
    torch.manual_seed(0)
    training = mode == "training"
    breaks = _Breaks()
    blog = logging.getLogger("kiln.graph_breaks")
    blog.addHandler(breaks)
    blog.setLevel(logging.INFO)
    try:
        model = MODELS[name](small).to(device)
        disable_dropout(model)
        model.train(training)
        args, kwargs = _inputs(name, model, small, device)
        tol = 2e-3 if device.type == "cpu" else 2e-2  # TF32 / reordered reductions on the GPU
        if mode == "aot":
            return _aot_row(name, model, args, kwargs, tol, breaks)
        if not training:
            with torch.no_grad():
                ref = logits_of(model(*args, **kwargs))
                opt = kiln.compile(model, mode=None if mode == "default" else mode)
                t0 = time.perf_counter()
                out = logits_of(opt(*args, **kwargs))
                compile_s = time.perf_counter() - t0
                for _ in range(3):  # reduce-overhead: warm-up, record, replay
                    out = logits_of(opt(*args, **kwargs))
            err = _rel_err(out, ref)
            verdict = "ok" if err <= tol else "mismatch"
            return f"| {name} | {mode} | {verdict} | {err:.1e} | {compile_s:.1f} | {breaks.count} |"
        with torch.no_grad():  # some models are random in training mode whatever their dropout says
            first, second = logits_of(model(*args, **kwargs)), logits_of(model(*args, **kwargs))
        if not torch.equal(first, second):
            return f"| {name} | {mode} | skipped: eager differs between two runs in training mode | - | - | 0 |"
        ref, ref_grads = _loss_and_grads(model, args, kwargs)
        model64 = copy.deepcopy(model).double()  # the judge: fp32 eager and kiln are both compared with fp64
        cast = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        try:
            ref64, grads64 = _loss_and_grads(model64, tuple(map(cast, args)), {k: cast(v) for k, v in kwargs.items()})
        except RuntimeError:  # an op without fp64 kernels (grouped_mm): judge against fp32 eager
            ref64, grads64 = ref, ref_grads
        del model64
        opt = kiln.compile(model)
        t0 = time.perf_counter()
        loss, grads = _loss_and_grads(opt, args, kwargs, model)
        compile_s = time.perf_counter() - t0
        extra = sorted(set(grads) - set(ref_grads))  # reach only outputs the loss does not use
        zeros = all(float(grads[n].abs().max()) == 0.0 for n in extra)
        if set(ref_grads) - set(grads) or not zeros:
            return (f"| {name} | {mode} | mismatch (params with gradients: {len(grads)} vs eager's {len(ref_grads)}) "
                    f"| - | {compile_s:.1f} | {breaks.count} |")
        floor = 1e-3 * max(float(r.abs().max()) for r in grads64.values())
        eager_err = max([_rel_err(ref, ref64)] + [_rel_err(ref_grads[n], grads64[n], floor) for n in ref_grads])
        err = max([_rel_err(loss, ref64)] + [_rel_err(grads[n], grads64[n], floor) for n in ref_grads])
        verdict = "ok" if err <= max(tol * 5, 3 * eager_err) else "mismatch"
        note = f" ({len(extra)} zero gradients where eager has None)" if extra else ""
        return (f"| {name} | {mode} | {verdict}{note} | {err:.1e} (eager fp32 {eager_err:.1e}) | {compile_s:.1f} | "
                f"{breaks.count} |")
    except Exception as exc:  # noqa: BLE001 - one failed row must not hide the others
        return f"| {name} | {mode} | error: {short_error(exc, 160)} | - | - | {breaks.count} |"
    finally:
        blog.removeHandler(breaks)


def _loss_and_grads(fn: Any, args: tuple, kwargs: dict,
                    model: nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = model if model is not None else fn
    model.zero_grad(set_to_none=True)
    loss = logits_of(fn(*args, **kwargs)).double().square().mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _aot_row(name: str, model: nn.Module, args: tuple, kwargs: dict, tol: float, breaks: _Breaks) -> str:
    """aot_compile (fullgraph), save, load back with the runtime, call as ``loaded(model, ...)``."""
    import tempfile

    import kiln

    if hasattr(model, "config"):  # a cache object is not a tensor output: deployments turn it off
        model.config.use_cache = False
    with torch.no_grad():
        ref = logits_of(model(*args, **kwargs))
        t0 = time.perf_counter()
        compiled = kiln.compile(model, fullgraph=True).forward.aot_compile((args, kwargs))
        compile_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.kiln"
            compiled.save_compiled_function(path)
            loaded = kiln.load_compiled_function(path)
            out = logits_of(loaded(model, *args, **kwargs))
    err = _rel_err(out, ref)
    verdict = "ok" if err <= tol else "mismatch"
    return f"| {name} | aot (save, load) | {verdict} | {err:.1e} | {compile_s:.1f} | {breaks.count} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="default,training")
    p.add_argument("--device", default="cpu")
    p.add_argument("--small", action="store_true")
    p.add_argument("--no-tf32", action="store_true", help="fp32 convolutions and matmuls in full fp32 (both sides)")
    args = p.parse_args(argv)
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    print(f"zoo on {device} ({'small' if args.small else 'full'} configs), torch {torch.__version__}")
    print("| model | mode | result | max error / output scale (training: vs fp64, gradients included) | first call s | graph-break log lines |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            print(_row(name, mode, args.small, device), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
