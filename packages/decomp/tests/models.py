"""Small configurations of the benchmark-suite models, and their forward+backward ATen graphs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.decomp import trace


def _vision(name: str) -> Callable[[], tuple[torch.nn.Module, tuple]]:
    def build():
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=10).eval()  # eval: BN without mutation
        return model, (torch.randn(2, 3, 32, 32),)
    return build


def _hf(config_name: str, model_name: str, kwargs: dict, inputs: Callable[[], dict]):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**kwargs)
        model = getattr(transformers, model_name)(cfg).train()
        return model, inputs()
    return build


def _ids():
    return {"input_ids": torch.randint(0, 100, (2, 8))}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, object]]] = {
    "resnet50": _vision("resnet50"),
    "mobilenet_v3_large": _vision("mobilenet_v3_large"),
    "convnext": _vision("convnext_tiny"),
    "vit": _hf("ViTConfig", "ViTModel", dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64),
               lambda: {"pixel_values": torch.randn(2, 3, 32, 32)}),
    "bert": _hf("BertConfig", "BertModel", dict(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64), _ids),
    "gpt2": _hf("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                                                      n_positions=32), _ids),
    "llama": _hf("LlamaConfig", "LlamaForCausalLM", dict(vocab_size=100, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=2, num_attention_heads=2,
                                                         num_key_value_heads=1), _ids),
    "t5": _hf("T5Config", "T5ForConditionalGeneration", dict(vocab_size=100, d_model=32, d_ff=64, d_kv=16,
                                                            num_layers=2, num_heads=2, decoder_start_token_id=0,
                                                            pad_token_id=0),
              lambda: {"input_ids": torch.randint(0, 100, (2, 8)), "labels": torch.randint(0, 100, (2, 8))}),
}


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "loss") and out.loss is not None:
        return out.loss
    if hasattr(out, "logits"):
        return out.logits
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def training_step(model: torch.nn.Module):
    """``step(params, inputs) -> (loss, *grads)``: forward and backward of ``model``."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def step(params: list, inputs):
        state = dict(zip(names, params))
        args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
        out = torch.func.functional_call(model, state, args, kwargs)
        loss = _first_tensor(out).float().pow(2).mean()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return (loss, *[g for g in grads if g is not None])

    return names, step


def joint_graph(name: str):
    """(graph, real params, inputs, step) for one model, traced to ATen with kiln's tracer."""
    model, inputs = MODELS[name]()
    names, step = training_step(model)
    params = [dict(model.named_parameters())[n].detach().requires_grad_() for n in names]
    # user code such as ConvNeXt's ``x += shortcut`` mutates, and the aten dialect is functional
    gm = trace(step, (params, inputs), functionalize=True)
    return gm, params, inputs, step


def aot_graphs(name: str):
    """Forward and backward ATen graphs of one training step, as torch's AOT autograd makes them.

    Test-only reference: kiln.autograd produces the same kind of functional graphs in the pipeline;
    torch's own is used here so this package's tests do not depend on another stage.
    """
    from torch._functorch.aot_autograd import aot_function

    model, inputs = MODELS[name]()
    names, _ = training_step(model)
    params = [dict(model.named_parameters())[n] for n in names]
    graphs: list[tuple[torch.fx.GraphModule, list]] = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm

    def forward(params, inputs):
        state = dict(zip(names, params))
        args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
        return _first_tensor(torch.func.functional_call(model, state, args, kwargs)).float().pow(2).mean()

    compiled = aot_function(forward, fw_compiler=capture, bw_compiler=capture)
    loss = compiled(params, inputs)
    loss.backward()
    return graphs
