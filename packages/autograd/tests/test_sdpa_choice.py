"""scaled_dot_product_attention picks its fused kernel from the inputs' metadata; on fake tensors
torch 2.11 answers MATH for masked CUDA attention, so the tracer decides on real tensors of the same
layout (kiln/autograd/attention.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from kiln.autograd import trace_inference


def _graph() -> fx.GraphModule:
    g = fx.Graph()
    q, k, v, m = (g.placeholder(n) for n in ("q", "k", "v", "m"))
    g.output((g.call_function(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": m}),))
    return fx.GraphModule({}, g)


def _inputs(device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    x = torch.randn(2, 64, 3, 4, 32, device=device, dtype=dtype)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    return [q, k, v, torch.zeros(2, 1, 1, 64, device=device, dtype=dtype).expand(2, 1, 64, 64)]


def test_cpu_attention_is_left_to_the_composite() -> None:
    from kiln.autograd.attention import fused_attention

    assert fused_attention(tuple(_inputs("cpu", torch.float32)[:3]), {}) is None
    text = trace_inference(_graph(), _inputs("cpu", torch.float32)).as_text()
    assert "bmm" not in text  # CPU: the fused flash kernel, as eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_masked_bf16_attention_on_cuda_traces_a_fused_kernel_like_eager() -> None:
    text = trace_inference(_graph(), _inputs("cuda", torch.bfloat16)).as_text()
    assert "bmm" not in text and "_scaled_dot_product_" in text, text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bool_mask_attention_on_cuda_traces_a_fused_kernel_and_matches_eager(dtype: torch.dtype) -> None:
    # HF BERT's padding mask: a bool (B, 1, L, S) view with stride-0 dims, one row partly masked
    q, k, v, _ = _inputs("cuda", dtype)
    keep = torch.ones(2, 1, 1, 64, dtype=torch.bool, device="cuda")
    keep[1, ..., 40:] = False
    args = [q, k, v, keep.expand(2, 1, 64, 64)]
    traced = trace_inference(_graph(), args)
    text = traced.as_text()
    assert "bmm" not in text and "_scaled_dot_product_" in text, text
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=args[3])
    got = traced.gm(*args)[0]  # type: ignore[attr-defined]
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stride0_mask_takes_a_fused_kernel_and_keeps_maths_zero_rows() -> None:
    # a mask whose last dim has stride 0 (HF BERT: (1, 1, L, 1) >= 0, expanded): eager runs MATH;
    # kiln materialises the mask for a fused kernel, and a query row that may attend to nothing
    # stays 0 as MATH's safe softmax makes it
    q, k, v, _ = _inputs("cuda", torch.bfloat16)
    rows = torch.ones(1, 1, 64, 1, dtype=torch.bool, device="cuda")
    rows[..., 5, :] = False  # query 5 attends to nothing
    args = [q, k, v, rows.expand(2, 1, 64, 64)]
    traced = trace_inference(_graph(), args)
    text = traced.as_text()
    assert "bmm" not in text and "_scaled_dot_product_" in text, text
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=args[3])
    got = traced.gm(*args)[0]  # type: ignore[attr-defined]
    assert torch.equal(got[:, :, 5], torch.zeros_like(got[:, :, 5]))
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_the_choice_is_asked_once_per_layout_and_follows_the_backend_switches() -> None:
    """Real tensors are made once per (layouts, switches): a model's identical layers ask once, and an
    ``sdpa_kernel`` context changes the answer instead of hitting a stale entry."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kiln.autograd.attention import KernelChoices

    choices = KernelChoices()
    q = torch.randn(2, 4, 16, 8)
    a = {"query": q, "key": q, "value": q, "attn_mask": None, "dropout_p": 0.0, "is_causal": False,
         "scale": None}
    first = choices.choice(a)
    assert choices.choice(dict(a)) == first and choices.queries == 1
    assert choices.choice(dict(a, query=q.transpose(1, 2).contiguous().transpose(1, 2))) is not None
    assert choices.queries == 2  # another layout: asked again
    with sdpa_kernel(SDPBackend.MATH):
        assert choices.choice(a) == int(SDPBackend.MATH) != first
    assert choices.queries == 3


def test_the_choice_is_asked_for_the_arguments_that_need_a_gradient() -> None:
    """Eager's choice depends on which arguments autograd differentiates (cuDNN attention takes no mask
    that needs a gradient: T5's learned position bias): the real tensors asked carry requires_grad, and
    an answer for a mask without a gradient is not reused for one with (or under no_grad)."""
    from kiln.autograd.attention import KernelChoices

    choices = KernelChoices()
    q = torch.randn(2, 4, 16, 8)
    a = {"query": q, "key": q, "value": q, "attn_mask": torch.zeros(2, 4, 16, 16), "dropout_p": 0.0,
         "is_causal": False, "scale": None}
    choices.choice(a)
    learned = torch.zeros(2, 4, 16, 16, requires_grad=True)
    choices.choice(dict(a, attn_mask=learned))
    assert choices.queries == 2
    with torch.no_grad():
        choices.choice(dict(a, attn_mask=learned))  # no gradient here: the first answer holds
    assert choices.queries == 2
    assert len({key[0][3][-1] for key in choices.known}) == 2  # the mask's requires_grad is in the key


def _masked_cases(device: str, mask_dtype: torch.dtype, dims: str):
    """(q, k, v, mask) over several sequence lengths, the lengths marked dynamic (``dims="seq"``) or
    every dim symbolic (``dims="all"``, compiled with dynamic=True)."""
    import kiln

    for s in (9, 17, 33, 64, 100):
        q, k, v = (torch.randn(2, 4, s, 32, device=device, dtype=torch.bfloat16) for _ in range(3))
        keep = torch.rand(2, 1, s, s, device=device) > 0.3
        keep[..., 0] = True  # every query attends to something (a fully masked row is kernel-defined)
        m = keep if mask_dtype == torch.bool else \
            torch.zeros(keep.shape, device=device, dtype=mask_dtype).masked_fill(~keep, float("-inf"))
        if dims == "seq":
            for t in (q, k, v):
                kiln.mark_dynamic(t, 2)
            kiln.mark_dynamic(m, 2)
            kiln.mark_dynamic(m, 3)
        yield q, k, v, m


def _attn(q, k, v, m):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16])
@pytest.mark.parametrize("dims", ["seq", "all"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_masked_attention_with_symbolic_sizes_matches_eager(mask_dtype: torch.dtype, dims: str, training: bool,
                                                            caplog) -> None:
    """A padding mask over symbolic lengths: ``kiln_graph::attention``, eager's kernel per call, and its
    backward op in training. Equal to eager for every length, gradients too, fresh inputs each call."""
    import logging

    import kiln

    compiled = kiln.compile(_attn, dynamic=True if dims == "all" else None)
    kiln.stats_reset()
    kiln.set_logs("perf_hints")
    logger = logging.getLogger("kiln.perf_hints")
    logger.propagate = True  # kiln's logs do not reach the root logger (caplog's) otherwise
    try:
        with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
            for q, k, v, m in _masked_cases("cuda", mask_dtype, dims):
                for t in (q, k, v):
                    t.requires_grad_(training)
                got, want = compiled(q, k, v, m), _attn(q, k, v, m)
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
                if training:
                    g = torch.randn_like(want)
                    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
                        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)
    finally:
        kiln.set_logs()
        logger.propagate = False
    assert kiln.stats().graphs_compiled <= 2
    # eager runs a fused kernel for these bf16 masks on the H200: kiln_graph::attention, also in training
    assert "eager picks the kernel per call" in caplog.text and "MATH form" not in caplog.text


def test_math_form_with_a_bool_mask_matches_the_composite_on_cpu() -> None:
    """The CPU half of the check above: the symbolic MATH form is what the CUDA path runs with every
    dim symbolic; its bool-mask conversion is checked here through the same helper."""
    from torch.ops import aten

    from kiln.autograd.attention import _additive

    for q, k, v, m in _masked_cases("cpu", torch.bool, "none"):
        q, k, v = (t.float() for t in (q, k, v))
        got = aten._scaled_dot_product_attention_math(q, k, v, _additive(m, q), 0.0, False, None)[0]
        torch.testing.assert_close(got, _attn(q, k, v, m), atol=1e-5, rtol=1e-5)


def _symbolic_cuda_trace(fn, shapes, dynamic, requires_grad: bool, bool_mask: bool = False):  # type: ignore[no-untyped-def]
    """``fn`` traced on fake CUDA bf16 tensors (no GPU needed; a CUDA build of torch) whose ``dynamic``
    dims are symbolic (the fourth a bool tensor with ``bool_mask``); the graph's text."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = []
    for k, shape in enumerate(shapes):
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dynamic.get(k, ()) else
                                                      DimDynamic.STATIC for d in range(len(shape))])
        meta = mode.from_tensor(torch.empty(shape, device="meta"), symbolic_context=ctx)
        with mode:
            dtype = torch.bool if bool_mask and k == 3 else torch.bfloat16
            fakes.append(torch.empty(meta.shape, device="cuda", dtype=dtype).requires_grad_(
                requires_grad and k < 3))
    with mode, torch.set_grad_enabled(requires_grad):
        return make_fx(fn, tracing_mode="real")(*fakes).code


@pytest.mark.parametrize("eager_fused", [True, False], ids=["eager_fused", "eager_math"])
def test_masked_attention_over_symbolic_sizes_defers_the_kernel_choice_to_eager(eager_fused: bool) -> None:
    """GPT-2's masked attention over a symbolic batch and length, where eager runs a fused kernel at the
    example sizes (cuDNN on an H200): kiln_graph::attention, eager's kernel per call (2.7x faster than
    the size-independent choice). Where eager would run MATH (asked on real CUDA tensors, answered
    here): memory-efficient attention over the padded bias. (Training traces need a GPU: autograd's
    engine runs fake CUDA tensors on a device queue; the op's backward: test_training_through_the_
    attention_op_matches_eager.)"""
    from torch.nn.attention import SDPBackend

    from kiln.autograd import attention as A

    class Answer(A.KernelChoices):  # eager's answer at the example sizes, without a GPU to ask
        def choice(self, a, dense_mask=False):  # type: ignore[no-untyped-def]
            return int(SDPBackend.CUDNN_ATTENTION if eager_fused else SDPBackend.MATH)

    def attn(q, k, v, m):  # type: ignore[no-untyped-def]
        return A._symbolic_attention(q, k, v, m, A._bind((q, k, v), {"attn_mask": m}), Answer())

    shape = (8, 12, 512, 64)
    try:
        code = _symbolic_cuda_trace(attn, [shape, shape, shape, (8, 1, 512, 512)],
                                    {0: (0, 2), 1: (0, 2), 2: (0, 2), 3: (0, 2, 3)}, False)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    assert ("kiln_graph.attention.default" in code) == eager_fused, code
    assert ("_scaled_dot_product_efficient_attention" in code) == (not eager_fused), code


def test_bool_mask_of_deferred_attention_is_converted_once_in_the_graph() -> None:
    """A bool mask reaches kiln_graph::attention as the additive mask in the query's dtype, made by a
    traced kernel (one per graph once CSE merges the layers' copies), not converted by eager inside
    every call and every backward."""
    from torch.nn.attention import SDPBackend

    from kiln.autograd import attention as A

    class Answer(A.KernelChoices):
        def choice(self, a, dense_mask=False):  # type: ignore[no-untyped-def]
            return int(SDPBackend.CUDNN_ATTENTION)

    def attn(q, k, v, m):  # type: ignore[no-untyped-def]
        return A._symbolic_attention(q, k, v, m, A._bind((q, k, v), {"attn_mask": m}), Answer())

    shape = (8, 12, 512, 64)
    try:
        code = _symbolic_cuda_trace(attn, [shape, shape, shape, (8, 1, 512, 512)],
                                    {0: (0, 2), 1: (0, 2), 2: (0, 2), 3: (0, 2, 3)}, False, bool_mask=True)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    assert "kiln_graph.attention.default" in code and "masked_fill" in code, code
    assert code.index("masked_fill") < code.index("kiln_graph.attention.default"), code


def test_training_through_the_attention_op_matches_eager() -> None:
    """A compiled training step through kiln_graph::attention over symbolic lengths (CPU): the joint
    graph holds its backward op; outputs and gradients equal eager's for fresh inputs of every length,
    one compile."""
    import kiln
    from kiln.graph import ATTENTION

    def step(q, k, v, m):  # type: ignore[no-untyped-def]
        return (ATTENTION(q, k, v, m, False, None, False) * 2).sum()

    def ref(q, k, v, m):  # type: ignore[no-untyped-def]
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2).sum()

    compiled = kiln.compile(step, dynamic=True)
    kiln.stats_reset()
    for q, k, v, m in _masked_cases("cpu", torch.bool, "none"):
        q, k, v = (t.float().requires_grad_(True) for t in (q, k, v))
        got = compiled(q, k, v, m)
        grads = torch.autograd.grad(got, (q, k, v))
        want = ref(q, k, v, m)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for a, b in zip(grads, torch.autograd.grad(want, (q, k, v))):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert kiln.stats().graphs_compiled == 1


def test_autocast_casts_the_attention_arguments_as_eager_composite_gets_them() -> None:
    """Under CUDA autocast the tracer calls the fused kernels itself, past autocast's dispatch: it casts
    the arguments as autocast's lower-precision policy would (every floating CUDA tensor but float64,
    the mask included; bool masks and CPU tensors kept). HF Llama's rotary embedding leaves q and k in
    fp32 beside a bf16 v; kiln's Llama-350M training graph with dynamic=True passed them so to
    memory-efficient attention (on the H200: an illegal memory access; a NaN loss on a repeated call)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.autograd.attention import _bind, autocast_arguments

    try:
        with FakeTensorMode():
            q, k = (torch.empty(2, 4, 16, 8, device="cuda") for _ in range(2))
            v = torch.empty(2, 4, 16, 8, device="cuda", dtype=torch.bfloat16)
            for mask, want in ((torch.empty(2, 1, 16, 16, device="cuda"), torch.bfloat16),
                               (torch.empty(2, 1, 16, 16, device="cuda", dtype=torch.bool), torch.bool),
                               (torch.empty(2, 1, 16, 16, device="cuda", dtype=torch.float64), torch.float64),
                               (None, None)):
                a = autocast_arguments(_bind((q, k, v), {"attn_mask": mask, "is_causal": False}), torch.bfloat16)
                assert [a[n].dtype for n in ("query", "key", "value")] == [torch.bfloat16] * 3, a
                assert (a["attn_mask"].dtype if mask is not None else None) == want, a
                assert a["value"] is v  # already the autocast dtype: no copy
            cpu = torch.empty(2, 4, 16, 8)
            a = autocast_arguments(_bind((cpu, cpu, cpu), {}), torch.bfloat16)
            assert a["query"] is cpu  # CUDA autocast leaves CPU tensors alone
    except (RuntimeError, AssertionError) as e:
        if "CUDA" in str(e) and not torch.backends.cuda.is_built():
            pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
        raise
