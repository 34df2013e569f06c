"""Real models capture with zero graph breaks and match eager (tiny configs, random weights)."""

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder

pytestmark = pytest.mark.slow


def _flat(o):
    if isinstance(o, torch.Tensor):
        return [o]
    if hasattr(o, "to_tuple"):
        return _flat(o.to_tuple())
    if isinstance(o, dict):
        return [x for v in o.values() for x in _flat(v)]
    if isinstance(o, (list, tuple)):
        return [x for v in o for x in _flat(v)]
    return []


def _check(model, args, kwargs=None, grad=False, calls=2):
    kwargs = kwargs or {}
    kc.reset()
    rec = Recorder()
    g = kc.optimize(model.forward, rec)
    breaks = []
    g._kiln_context.on_capture.append(
        lambda cap, cache: breaks.append(cap.break_plan.reason) if cap.break_plan else None)
    with torch.set_grad_enabled(grad):
        for _ in range(calls):
            got = g(*args, **kwargs)
        want = model(*args, **kwargs)
    a, b = _flat(got), _flat(want)
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    assert breaks == [], breaks
    assert rec.count == 1, f"{rec.count} graphs"
    return rec, got


def _tf():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_resnet50(grad):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = tv.models.resnet50().eval()
    rec, out = _check(m, (torch.randn(1, 3, 32, 32),), grad=grad, calls=1)
    if grad:
        out.sum().backward()
        assert m.conv1.weight.grad is not None


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_bert(grad):
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=50, max_position_embeddings=32)
    m = tf.BertModel(cfg).eval()
    _check(m, (torch.randint(0, 50, (2, 7)),), {"attention_mask": torch.ones(2, 7, dtype=torch.long)}, grad=grad)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_gpt2(grad):
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=50, n_positions=32)
    m = tf.GPT2LMHeadModel(cfg).eval()
    _check(m, (torch.randint(0, 50, (2, 7)),), grad=grad)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_llama(grad):
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=50, max_position_embeddings=32)
    m = tf.LlamaForCausalLM(cfg).eval()
    _check(m, (torch.randint(0, 50, (2, 7)),), grad=grad)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_t5(grad):
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.T5Config(d_model=32, num_layers=2, num_heads=2, d_ff=64, d_kv=16, vocab_size=50)
    m = tf.T5Model(cfg).eval()
    _check(m, (torch.randint(0, 50, (2, 7)),), {"decoder_input_ids": torch.randint(0, 50, (2, 5))}, grad=grad)


def test_bert_mlm_loss_built_in_forward():
    """BertForMaskedLM with labels builds nn.CrossEntropyLoss() inside forward: still one graph."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    m = tf.BertForMaskedLM(cfg).eval()
    ids, labels = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
    _, out = _check(m, (), {"input_ids": ids, "labels": labels}, grad=True)
    out.loss.backward()


def test_t5_seq2seq_loss_built_in_forward():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.T5Config(d_model=32, num_layers=2, num_heads=2, d_ff=64, d_kv=16, vocab_size=50,
                      decoder_start_token_id=0, pad_token_id=0)
    m = tf.T5ForConditionalGeneration(cfg).eval()
    ids, labels = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
    _, out = _check(m, (), {"input_ids": ids, "labels": labels}, grad=True)
    out.loss.backward()
