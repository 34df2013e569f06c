"""Split reductions on the Triton path: few outputs over many elements run as partial + final passes,
and still match eager (Triton interpreter on CPU, CUDA on a GPU machine)."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from dynamic_helpers import TRITON, symbolic_graph
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.knobs import triton_interpret
from kiln.inductor.split_reductions import chunks_for, column_plan

OPTIONS = InductorOptions(cpu_backend="triton")


def _x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(dtype)


def _bn_stats(x):  # BatchNorm training statistics of an NCHW tensor
    var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    return var, mean, (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + 1e-5)


def _bn_backward_sums(dy, x):  # the two column sums of BatchNorm's backward, and a bias gradient
    return dy.sum((0, 2, 3)), (dy * x).sum((0, 2, 3)), dy.flatten(1).sum(0)


CASES = {
    "bn_stats": (_bn_stats, (_x(16, 3, 32, 32),)),
    "bn_backward": (_bn_backward_sums, (_x(16, 3, 32, 32), _x(16, 3, 32, 32))),
    "column_max_min": (lambda x: (x.amax(0), x.amin(0), (x > 3.5).any(0), (x > -5).all(0)), (_x(16384, 2),)),
    "bf16_column_sum": (lambda x: x.sum(0), (_x(20000, 3, dtype=torch.bfloat16),)),
    "whole_tensor": (lambda x: (x.sum(), x.amax(), x.mean()), (_x(20000),)),
    "channels_last_mean": (lambda x: x.mean((0, 2, 3)), (_x(8, 5, 64, 64).to(memory_format=torch.channels_last),)),
    # LayerNorm's weight and bias gradients and a bf16 bias gradient over a transformer's tokens: column
    # reductions of 256 outputs, chunked over the rows with the chunk index outermost
    "token_columns": (lambda dy, xhat, g: ((dy * xhat).sum((0, 1)), dy.sum((0, 1)), g.sum((0, 1))),
                      (_x(16, 256, 256), _x(16, 256, 256), _x(16, 256, 256, dtype=torch.bfloat16))),
    # ... with the per-token mean and rstd read in the loop (vectors along the rows: they do not make it a row
    # reduction)
    "norm_weight_grad": (lambda dy, x, mean, rstd: ((dy * (x - mean[..., None]) * rstd[..., None]).sum((0, 1)),
                                                    dy.sum((0, 1))),
                         (_x(16, 256, 256), _x(16, 256, 256), _x(16, 256), _x(16, 256).abs())),
    # sequence-first tokens (nn.Transformer's default layout) over a prime sequence length: chunks of the batch
    "seq_first_columns": (lambda dy: (dy.sum((0, 1)), dy.amax((0, 1))), (_x(197, 8, 768),)),
}


def _compile(fn, inputs, options=OPTIONS):
    dev = device()
    ins = [t.to(dev) for t in inputs]
    gm = trace(fn, *ins)
    return compile_graph(gm, ins, options=options), ins


@pytest.mark.parametrize("case", list(CASES))
def test_split_reductions_match_eager(case, caplog):
    fn, inputs = CASES[case]
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        cg, ins = _compile(fn, inputs)
    assert "long reduction(s) split" in caplog.text  # the split path ran, not the one-pass kernel
    got = flat_outputs(cg.fn(*ins))
    want = flat_outputs(fn(*ins))
    for g, w in zip(got, want, strict=True):
        tol = dict(rtol=2e-2, atol=2e-2) if w.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g.cpu(), w.cpu(), **tol)


def test_split_adds_a_partial_kernel_and_the_option_turns_it_off():
    fn, inputs = CASES["bn_backward"]
    split, _ = _compile(fn, inputs)
    whole, _ = _compile(fn, inputs, OPTIONS.replace(split_reductions=False))
    assert "_part" in split.texts["ir_pre_fusion"] or "_part" in split.texts["ir_post_fusion"]
    assert "_part" not in whole.texts["ir_post_fusion"]


def _greedy(logits, scores):  # decode's greedy pick over a vocabulary, and arg-reductions over a whole tensor
    return logits.argmax(-1), logits.argmin(-1), scores.view(-1).argmax(), scores.argmin()


def test_argmax_over_a_vocabulary_is_split_and_keeps_the_first_extremum():
    """Each chunk's extremum and index, then the winning chunk: the first index of the extremum overall,
    NaN counted as the largest (argmax) and smallest (argmin) as in torch. Fresh values every call."""
    cg, _ = _compile(_greedy, (_x(2, 32000), _x(4, 9000)))
    assert "_pidx" in cg.texts["ir_post_fusion"]
    dev = device()
    for call in range(4):
        g = torch.Generator().manual_seed(call + 1)
        logits, scores = torch.randn(2, 32000, generator=g), torch.randn(4, 9000, generator=g)
        if call == 1:  # ties across chunks: the first one wins
            logits[0, [5, 3201, 31999]] = 9.0
            logits[1, [25000, 6400]] = -9.0
            scores[3, 10] = scores[0, 8999] = 9.0
        if call == 2:  # NaN in a late chunk, a tie before it
            logits[0, 20000] = float("nan")
            logits[0, 7] = 9.0
            scores[2, 4] = float("nan")
        if call == 3:  # every value equal
            logits.fill_(1.0)
            scores.fill_(-2.0)
        got = flat_outputs(cg.fn(logits.to(dev), scores.to(dev)))
        for a, b in zip(got, flat_outputs(_greedy(logits, scores)), strict=True):
            assert torch.equal(a.cpu(), b), (call, a, b)


@pytest.mark.parametrize(("case", "width"), [("token_columns", 32), ("norm_weight_grad", 32), ("seq_first_columns", 8)])
def test_column_reductions_keep_their_outputs_contiguous_in_the_partial(case, width):
    """The partial of a column reduction is [chunks, outputs]: its kernel is again a column kernel whose
    programs read ``width`` adjacent outputs a row (32: more than a 32-byte sector of bf16; 8 where the
    rows allow only 8 chunks, sequence-first over a prime length) over hundreds of programs (the one-pass
    kernel had outputs / 8). Fresh values every call."""
    fn, inputs = CASES[case]
    cg, _ = _compile(fn, inputs)
    src = cg.texts["output_code"]
    launches = re.findall(r"_KilnLaunch\(triton_kernels\.(\w+), \{'XBLOCK': (\d+), 'RBLOCK': (\d+)\}", src)
    assert len(launches) == 2, launches  # one partial kernel for all the sums, one final
    assert int(launches[0][1]) >= width, launches
    grids = re.findall(r"_launch_\w+\(\((\d+), ", src)
    assert int(grids[0]) >= 512, grids
    for seed in range(2):
        g = torch.Generator().manual_seed(seed + 1)
        ins = [torch.randn(t.shape, generator=g).to(t.dtype).to(device()) for t in inputs]
        got, want = flat_outputs(cg.fn(*ins)), flat_outputs(fn(*ins))
        for a, b in zip(got, want, strict=True):
            tol = dict(rtol=2e-2, atol=2e-1) if b.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-3)
            torch.testing.assert_close(a.cpu(), b.cpu(), **tol)


def test_column_plans():
    assert column_plan(768, (32, 197)) == (32, 1)  # ViT-B/16 bias gradient: one chunk per image
    assert column_plan(768, (6304,)) == (32,)  # the same over flattened tokens
    assert column_plan(768, (197, 8)) == (1, 8)  # sequence-first tokens: a prime outer dim, chunks of the inner
    assert column_plan(96, (32, 56, 56)) == (32, 8, 1)  # ConvNeXt-T's channels-last LayerNorm weight gradient
    assert column_plan(768, (8, 64)) is None  # 393K elements: one pass
    assert column_plan(16384, (4096,)) is None  # enough programs of wide columns already
    assert column_plan(8, (100000,)) is None  # too narrow for column programs (split as rows)


def test_row_reductions_and_short_columns_stay_one_pass():
    assert chunks_for(100352, (768,)) is None  # LayerNorm rows: many outputs
    assert chunks_for(64, (32, 7, 7)) is None  # 1,568 elements per output: one pass is fine
    assert chunks_for(512, (32, 28, 28)) is None  # enough outputs (programs) already
    assert chunks_for(768, (8, 512)) is None  # a bias gradient over 4,096 tokens: short enough
    assert chunks_for(64, (32, 112, 112)) == (0, 32)  # ResNet stem BatchNorm: split over the batch
    assert chunks_for(256, (32, 56, 56)) == (0, 8)  # ResNet stage 1, 256 channels
    assert chunks_for(10, (16411,)) is None  # a prime length: no whole-dimension chunking


SYMBOLIC_CASES = {
    # BatchNorm's statistics and backward sums over symbolic batch and image sizes (dynamic=True training)
    "bn_stats": (_bn_stats, lambda n: (_x(n, 3, n + 5, 37),)),
    "bn_backward": (_bn_backward_sums, lambda n: (_x(n, 3, 33, n + 2), _x(n, 3, 33, n + 2))),
    # small images: chunks of the flattened (batch, image) range, divided back into the two
    "bn_small_images": (_bn_stats, lambda n: (_x(n * 30, 3, 5, n % 5 + 3),)),
    "column_max_min": (lambda x, y: (x.amax(0), x.amin(0), (x > 1.5).any(0), (x > -1.5).all(0), y.amax(0), y.sum(0)),
                       lambda n: (_x(n * 700, 2), (_x(n * 700, 1) * 100).to(torch.int32))),
    # a bias gradient over a symbolic number of tokens: chunk-outermost partials of the flattened rows
    "token_columns": (lambda x, y: (x.sum(0), y.sum((0, 1))), lambda n: (_x(n * 700, 64), _x(n, 700, 64))),
}


@pytest.mark.skipif(device() == "cpu" and not triton_interpret(),
                    reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("case", list(SYMBOLIC_CASES))
def test_symbolic_split_reductions_match_eager_at_every_size(case, caplog):
    """Chunks counted at the size hints, masked tails: one compiled graph, right at sizes whose
    reduced range does not divide into the chunks, and at sizes much smaller than the hints."""
    fn, make = SYMBOLIC_CASES[case]
    dev = device()
    gm, examples = symbolic_graph(fn, *[t.to(dev) for t in make(24)])
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        cg = compile_graph(gm, examples, options=TRITON)
    assert cg.backend == "inductor"
    assert "long reduction(s) split" in caplog.text
    assert "_part" in cg.texts["ir_post_fusion"]
    for n in (24, 17, 1):
        ins = [t.to(dev) for t in make(n)]
        got = flat_outputs(cg.fn(*ins))
        want = flat_outputs(fn(*ins))
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape)
            torch.testing.assert_close(g.cpu(), w.cpu(), rtol=1e-4, atol=1e-4, msg=lambda m, n=n: f"size {n}: {m}")
