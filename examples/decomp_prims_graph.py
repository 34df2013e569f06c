"""Print the kiln_prims-level graph of a small transformers model and count its ops.

Uses kiln.capture (bytecode capture -> torch-dialect graph) and kiln.decomp only, no code generator:

    torch-dialect graph --decompose(core_aten)--> core ATen --decompose(prims)--> kiln_prims

``decompose`` re-traces its input through the PyTorch dispatcher, so it accepts the torch-dialect
graph capture produces (in the full pipeline kiln.autograd's tracer does that step, adding the
backward). Without kiln.capture installed, the model is traced with kiln.decomp.trace instead.

    uv run python examples/decomp_prims_graph.py [--model gpt2|bert|llama] [--quiet]
"""

from __future__ import annotations

import argparse
import inspect
from collections import Counter

import torch
import transformers

from kiln.decomp import decompose, table, trace
from kiln.graph import print_graph, target_name

CONFIGS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    "bert": ("BertConfig", "BertModel", dict(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=128)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2)),
}


def build(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    cfg_name, model_name, kwargs = CONFIGS[name]
    cfg = getattr(transformers, cfg_name)(**kwargs)
    model = getattr(transformers, model_name)(cfg).eval()
    return model, {"input_ids": torch.randint(0, 128, (1, 16))}


def logits_fn(model: torch.nn.Module):
    def run(input_ids: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
    return run


def torch_graph(model: torch.nn.Module, inputs: dict[str, torch.Tensor]):
    """(graph, example inputs) from kiln.capture, or None when capture is unavailable or fails."""
    try:
        from kiln.capture import capture_graph
    except ImportError:
        print("# kiln.capture is not installed: tracing with kiln.decomp.trace instead")
        return None
    fn = logits_fn(model)
    try:
        captured = capture_graph(fn, (), inputs)
    except Exception as e:  # noqa: BLE001 - the example falls back, and says why
        print(f"# kiln.capture could not capture the model ({type(e).__name__}: {e}); using kiln.decomp.trace")
        return None
    # Placeholders are named by source: evaluate them against the call's locals to get example inputs.
    # (capture names closure cells L['__closure__'][i].cell_contents)
    frame_locals = dict(inspect.signature(fn).bind(**inputs).arguments, __closure__=fn.__closure__)
    examples = [eval(src, {"L": frame_locals, "G": fn.__globals__}) for src in captured.input_sources]  # noqa: S307
    print(f"# captured a torch-dialect graph: {sum(1 for n in captured.gm.graph.nodes if n.op != 'placeholder')} nodes")
    return captured.gm, examples


def count_ops(gm: torch.fx.GraphModule) -> Counter[str]:
    return Counter(target_name(n.target) for n in gm.graph.nodes if n.op == "call_function")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    parser.add_argument("--quiet", action="store_true", help="print the op counts only")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, inputs = build(args.model)

    captured = torch_graph(model, inputs)
    if captured is not None:
        gm, examples = captured
        core = decompose(gm, table("core_aten"), examples, check=True)
    else:
        core = trace(logits_fn(model), (), table("core_aten"), kwargs=inputs)
    prims = decompose(core, table("prims"), check=True)

    if not args.quiet:
        print(print_graph(prims))
    for stage, g in (("core_aten", core), ("prims", prims)):
        counts = count_ops(g)
        print(f"\n# {stage}: {sum(counts.values())} op calls, {len(counts)} distinct ops")
        for name, n in counts.most_common():
            print(f"#   {n:5d}  {name}")

    with torch.no_grad():
        expected = logits_fn(model)(**inputs)
        flat = [p for p in prims.graph.nodes if p.op == "placeholder"]
        got = prims(*(examples if captured is not None else [inputs["input_ids"]]))
        got = got[0] if isinstance(got, (tuple, list)) else got
    print(f"\n# prims graph ({len(flat)} inputs) vs eager: max |diff| = {(got - expected).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
