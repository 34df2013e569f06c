"""Runs PyTorch's OpInfo sample inputs (``op_db``) under CrossRefMode: the op tests and the CLI's
``kiln-decomp list --check`` use it. ``op_db`` lives in torch's testing package (it needs
``expecttest``), so it is imported only when a check runs."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .crossref import CrossRefMode, CrossRefReport
from .tables import table

SAMPLES_PER_DTYPE = 3

# The OpInfos whose samples reach kiln's decompositions (forward and, through autograd, backward).
OPINFO_NAMES = """
nn.functional.relu nn.functional.gelu nn.functional.silu nn.functional.mish nn.functional.hardswish
nn.functional.hardsigmoid nn.functional.hardtanh nn.functional.softplus nn.functional.elu
nn.functional.celu nn.functional.selu nn.functional.leaky_relu nn.functional.relu6
nn.functional.threshold nn.functional.prelu nn.functional.glu nn.functional.logsigmoid sigmoid tanh
rsub addcmul addcdiv lerp clamp_min clamp_max masked_fill where floor_divide frac exp2 square xlogy
logaddexp nan_to_num sgn erfc logit isposinf isneginf signbit bitwise_and bitwise_or bitwise_xor
deg2rad rad2deg hypot copysign fmax fmin heaviside sinc
zeros_like ones_like empty_like new_zeros new_ones new_full new_empty full_like arange linspace zeros
ones
t transpose reshape squeeze split split_with_sizes unbind stack narrow repeat roll tril triu unfold
diagonal chunk flatten unflatten T mT view_copy expand_copy permute_copy select_scatter
mean var std var_mean std_mean logsumexp norm linalg.vector_norm all any max min count_nonzero
nansum aminmax
softmax log_softmax _softmax_backward_data nn.functional.softmin
nn.functional.layer_norm nn.functional.rms_norm nn.functional.batch_norm nn.functional.group_norm
nn.functional.instance_norm native_layer_norm native_batch_norm _native_batch_norm_legit
nn.functional.nll_loss nn.functional.cross_entropy nn.functional.mse_loss nn.functional.l1_loss
nn.functional.smooth_l1_loss nn.functional.huber_loss nn.functional.binary_cross_entropy
nn.functional.binary_cross_entropy_with_logits nn.functional.soft_margin_loss
nn.functional.linear addmm baddbmm addbmm addmv mv dot vdot outer addr
nn.functional.embedding index_add index_copy index_fill take_along_dim scatter_reduce scatter
diagonal_scatter
nn.functional.adaptive_avg_pool2d nn.functional.max_pool2d nn.functional.adaptive_max_pool2d
nn.functional.interpolate nn.functional.upsample_nearest nn.functional.upsample_bilinear
nn.functional.hardshrink nn.functional.softshrink nn.functional.tanhshrink nn.functional.pad round
nn.functional.pixel_shuffle nn.functional.pixel_unshuffle
""".split()

INTERPOLATE_MODES = {"nearest", "bilinear"}


def selected_opinfos() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: PLC0415 - heavy, optional

    chosen = []
    for o in op_db:
        if o.name not in OPINFO_NAMES:
            continue
        if o.name == "nn.functional.interpolate" and o.variant_test_name not in INTERPOLATE_MODES:
            continue
        chosen.append(o)
    return chosen


def opinfo_id(o) -> str:
    return o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")


def _grad_inputs(sample):
    flat, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]


def run_opinfo(opinfo, report: CrossRefReport, table_name: str = "core_aten", device: str = "cpu") -> None:
    """Forward (fp32, fp64, bf16) and backward (fp32, fp64) of a few samples under CrossRefMode."""
    tab = table(table_name)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        if dtype not in opinfo.supported_dtypes(device):
            continue
        grad = dtype != torch.bfloat16 and opinfo.supports_autograd and \
            dtype in opinfo.supported_backward_dtypes(device)
        samples = opinfo.sample_inputs(device, dtype, requires_grad=grad)
        for i, sample in enumerate(samples):
            if i >= SAMPLES_PER_DTYPE:
                break
            with CrossRefMode(tab, report):
                out = opinfo(sample.input, *sample.args, **sample.kwargs)
                if grad:
                    _backward(out, _grad_inputs(sample))


def _backward(out, inputs) -> None:
    outs = [o for o in tree_flatten(out)[0]
            if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]
    if not outs or not inputs:
        return
    grads = [torch.randn(o.shape, dtype=o.dtype, device=o.device) for o in outs]
    torch.autograd.grad(outs, inputs, grads, allow_unused=True)


def check_all(table_name: str = "core_aten", hand_samples: dict[str, list] | None = None,
              device: str = "cpu") -> CrossRefReport:
    """Cross-check every selected OpInfo (and optional hand samples) against ``table_name``."""
    report = CrossRefReport()
    for o in selected_opinfos():
        try:
            run_opinfo(o, report, table_name, device)
        except Exception as e:  # an OpInfo whose eager run itself fails is reported, not fatal
            report.failures.append(f"{opinfo_id(o)}: sample run raised {type(e).__name__}: {e}")
    mode = CrossRefMode(table(table_name), report)
    for samples in (hand_samples or {}).values():
        for op, args, kwargs in samples:
            mode.check(op, tuple(args), dict(kwargs))
    return report
