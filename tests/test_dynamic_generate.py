"""Issue 20's decoding and training streams on tiny HF configs (CPU): HF ``generate()`` with a growing
DynamicCache through ``model.forward = kiln.compile(model.forward)`` compiles at most 3 graphs (the
prompt, the first decode step, then one symbolic graph for every later cache length) and gives eager's
tokens; training with a different sequence length every step compiles at most 2 graphs with eager's
losses and gradients. Every call takes fresh inputs; nothing may run eagerly.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")

VOCAB = 97


def _decoder(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=128,
                                         attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                          max_position_embeddings=128, tie_word_embeddings=False,
                                          attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
        model = transformers.LlamaForCausalLM(config)
    return model.eval()


def _greedy(model: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                              min_new_tokens=tokens, do_sample=False, pad_token_id=0, use_cache=True)


def _prompts(n: int, length: int = 7) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (2, length), generator=gen) for _ in range(n)]


@pytest.mark.parametrize(("kind", "mode"), [("gpt2", None), ("llama", None), ("gpt2", "reduce-overhead")])
def test_generate_with_a_growing_cache_compiles_at_most_three_graphs(kind: str, mode: str | None) -> None:
    """Eager's greedy tokens for fresh prompts, at most 3 graphs for every cache length, none eager;
    ``mode="reduce-overhead"`` is accepted on the CPU (CUDA graphs need CUDA tensors: same graphs)."""
    eager = _decoder(kind)
    compiled = _decoder(kind)
    compiled.forward = kiln.compile(compiled.forward, mode=mode)
    kiln.reset()
    before = kiln.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt in _prompts(2):
            want = _greedy(eager, prompt, 6)
            got = _greedy(compiled, prompt, 6)
            assert torch.equal(got, want), (got, want)
    assert not [w for w in caught if "EAGERLY" in str(w.message)]  # the recompile limit's warning
    after = kiln.stats()
    assert after.graphs_compiled - before.graphs_compiled <= 3
    assert after.frames_run_eagerly == before.frames_run_eagerly
    assert after.graphs_run_eagerly == before.graphs_run_eagerly


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_generate_with_a_static_cache_compiles_two_graphs_and_updates_the_cache_in_place(kind: str) -> None:
    """HF's recipe for compiled decoding, ``generate(cache_implementation="static")``: the StaticCache's
    tensors are written in place at the step's ``cache_position`` (a tensor that changes every step), so
    the decode graph has one shape for every step -- the graph CUDA graphs replay for every token. Eager's
    tokens for fresh prompts and prompt lengths, two graphs (prompt, decode), none eager."""
    eager = _decoder(kind)
    compiled = _decoder(kind)
    compiled.forward = kiln.compile(compiled.forward)
    kiln.reset()
    before = kiln.stats()

    def greedy(model: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                  min_new_tokens=6, do_sample=False, pad_token_id=0,
                                  cache_implementation="static")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt in _prompts(3):
            got, want = greedy(compiled, prompt), greedy(eager, prompt)
            assert torch.equal(got, want), (got, want)
    assert not [w for w in caught if "EAGERLY" in str(w.message)]
    after = kiln.stats()
    assert after.graphs_compiled - before.graphs_compiled == 2
    assert after.frames_run_eagerly == before.frames_run_eagerly
    assert after.graphs_run_eagerly == before.graphs_run_eagerly


def _train_gpt2(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                     attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config).train()


def _same_loss_and_grads(seq: int, got: torch.Tensor, want: torch.Tensor, model: torch.nn.Module,
                         eager: torch.nn.Module) -> None:
    """The compiled step's loss and every parameter's gradient equal eager's (then cleared)."""
    torch.testing.assert_close(got, want, msg=lambda m: f"seq {seq}: {m}")
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"seq {seq}, {name}: {m}")
        p.grad, q.grad = None, None


def test_training_with_a_new_sequence_length_every_step_compiles_at_most_two_graphs() -> None:
    """GPT-2 (loss from ``labels`` inside HF's forward) over sequence lengths that change every step:
    each step's loss and every parameter's gradient equal eager's, with at most 2 graphs."""
    eager, model = _train_gpt2(2), _train_gpt2(2)
    compiled = kiln.compile(model)
    kiln.reset()
    before = kiln.stats()
    gen = torch.Generator().manual_seed(2)
    for seq in (13, 29, 21, 8, 37):
        ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
        want = eager(ids, labels=ids).loss
        got = compiled(ids, labels=ids).loss
        want.backward()
        got.backward()
        _same_loss_and_grads(seq, got, want, model, eager)
    after = kiln.stats()
    assert after.graphs_compiled - before.graphs_compiled <= 2
    assert after.frames_run_eagerly == before.frames_run_eagerly
    assert after.graphs_run_eagerly == before.graphs_run_eagerly


def test_training_step_with_backward_inside_the_compiled_function() -> None:
    """The whole step compiled with ``dynamic=True``, ``loss.backward()`` inside it: the graph breaks at
    backward and the resume function receives HF's ModelOutput (each field an item and an attribute;
    the logits a strided view of the LM head's output, with a fake base of its own sizes). That resume
    used to fail capture (a duplicate placeholder name, then a guard naming the base's unbound size)
    and run eagerly. Loss and gradients equal eager's for every length; nothing runs eagerly."""
    eager, model = _train_gpt2(1), _train_gpt2(1)

    def step(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss

    compiled = kiln.compile(step, dynamic=True)
    kiln.reset()
    before = kiln.stats()
    gen = torch.Generator().manual_seed(3)
    for seq in (16, 24, 9, 31):
        ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
        want = step(eager, ids)
        got = compiled(model, ids)
        _same_loss_and_grads(seq, got, want, model, eager)
    after = kiln.stats()
    assert after.frames_run_eagerly == before.frames_run_eagerly
    assert after.graphs_run_eagerly == before.graphs_run_eagerly
