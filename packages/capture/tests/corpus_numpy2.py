"""Corpus programs: ``np.fft`` as ``torch.fft`` with NumPy's dtypes (numpy_fft.py), NumPy random
draws with the seed set inside the program (numpy_random.py: drawn before the graph, per call), and
modules with random weights built inside compiled code (a logged break, new weights per call)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .corpus_registry import case


def f64():
    return (torch.randn(4, 8, dtype=torch.float64).numpy(),)


def f32():
    return (torch.randn(4, 8).numpy(),)


def i64():
    return (torch.randint(-5, 10, (4, 8)).numpy(),)


def tens():
    return (torch.randn(4, 8),)


# ---- np.fft ---------------------------------------------------------------------------------------
@case(args=f64)
def npfft_fft_default(a):
    return np.fft.fft(a)


@case(args=f32)
def npfft_fft_float32_is_complex64(a):
    return np.fft.fft(a, axis=0)


@case(args=i64)
def npfft_fft_of_ints_is_complex128(a):
    return np.fft.fft(a)


@case(args=f64)
def npfft_ifft_padded(a):
    return np.fft.ifft(a, 16)


@case(args=f64)
def npfft_rfft_ortho(a):
    return np.fft.rfft(a, norm="ortho")


@case(args=f64)
def npfft_rfft_irfft_round_trip(a):
    return np.fft.irfft(np.fft.rfft(a), n=8)


@case(args=f32)
def npfft_irfft_float32(a):
    return np.fft.irfft(np.fft.rfft(a, axis=1), n=8, axis=1)


@case(args=f64)
def npfft_fft2_forward_norm(a):
    return np.fft.fft2(a, norm="forward")


@case(args=f64)
def npfft_ifft2_of_fft2(a):
    return np.fft.ifft2(np.fft.fft2(a)).real


@case(args=f64)
def npfft_fftn_axes_list(a):
    return np.fft.fftn(a, axes=[0, 1])


@case(args=f64)
def npfft_rfftn_irfftn(a):
    return np.fft.irfftn(np.fft.rfftn(a), s=(4, 8))


@case(args=f64)
def npfft_rfft2_shape(a):
    return np.fft.rfft2(a).shape, np.fft.rfft2(a)


@case(args=f64)
def npfft_fftshift_all_axes(a):
    return np.fft.fftshift(a)


@case(args=f64)
def npfft_ifftshift_axis(a):
    return np.fft.ifftshift(np.fft.fftshift(a, axes=1), axes=1)


@case(args=f64)
def npfft_power_spectrum(a):
    f = np.fft.rfft(a - a.mean(axis=1, keepdims=True))
    return np.abs(f) ** 2 / a.shape[1]


@case(args=f64)
def npfft_fftfreq_spacing(a):
    return np.fft.fftfreq(8, d=0.25) * a[0]


@case(args=f64)
def npfft_rfftfreq(a):
    return np.fft.rfftfreq(8) + a[:, :5]


@case(args=f64)
def npfft_hfft_ihfft(a):
    return np.fft.hfft(np.fft.ihfft(a), n=8)


@case(args=f64)
def npfft_lowpass_filter(a):
    f = np.fft.rfft(a)
    f[:, 3:] = 0
    return np.fft.irfft(f, n=8)


@case(args=f64)
def npfft_convolution_theorem(a):
    k = np.zeros(8)
    k[:3] = 1.0 / 3
    return np.fft.irfft(np.fft.rfft(a) * np.fft.rfft(k), n=8)


@case(args=tens)
def npfft_from_tensor_and_back(x):
    return torch.from_numpy(np.fft.rfft(x.numpy()).real.copy()) * 2


@case(args=f64)
def npfft_real_imag_angle_parts(a):
    f = np.fft.fft(a)
    return f.real.sum(), f.imag.max(axis=1)


# ---- np.random, seeded inside the program ----------------------------------------------------
@case(args=f64)
def nprand_seed_then_rand(a):
    np.random.seed(0)
    return a + np.random.rand(4, 8)


@case(args=f64)
def nprand_seed_randn_scaled(a):
    np.random.seed(1)
    return a * np.random.randn(4, 8) * 0.1


@case(args=f64)
def nprand_uniform_normal(a):
    np.random.seed(2)
    u = np.random.uniform(-1.0, 1.0, size=(4, 8))
    n = np.random.normal(0.0, 2.0, (4, 8))
    return a + u - n


@case(args=f64)
def nprand_two_seeds(a):
    np.random.seed(3)
    x = np.random.random_sample((4, 8))
    np.random.seed(3)
    y = np.random.random_sample((4, 8))
    return a + x - y


@case(args=f64)
def nprand_randint_mask(a):
    np.random.seed(4)
    m = np.random.randint(0, 2, size=(4, 8))
    return np.where(m == 1, a, 0.0)


@case(args=f64)
def nprand_dropout_like(a):
    np.random.seed(5)
    keep = np.random.rand(4, 8) > 0.3
    return a * keep / 0.7


@case(args=f64)
def nprand_float32_cast(a):
    np.random.seed(6)
    return a.astype(np.float32) + np.random.rand(4, 8).astype(np.float32)


@case(args=f64)
def nprand_permutation_gather(a):
    np.random.seed(7)
    idx = np.random.permutation(4)
    return a[idx]


@case(args=f64)
def nprand_choice_of_int(a):
    np.random.seed(8)
    idx = np.random.choice(8, size=3, replace=False)
    return a[:, idx]


@case(args=f64)
def nprand_standard_normal_noise(a):
    np.random.seed(9)
    return a + np.random.standard_normal((4, 8)) * a.std()


@case(args=f64)
def nprand_trailing_seed(a):
    np.random.seed(10)
    b = a + np.random.rand(4, 8)
    np.random.seed(11)  # no draw after it in the graph: replayed after the graph
    return b


@case(args=f64)
def nprand_exponential_poisson(a):
    np.random.seed(12)
    return a + np.random.exponential(1.0, (4, 8)) + np.random.poisson(3.0, (4, 8))


@case(args=f64)
def nprand_with_torch_ops(a):
    np.random.seed(13)
    noise = torch.from_numpy(np.random.rand(4, 8))
    return torch.from_numpy(a).sigmoid() + noise


@case(graphs=1, breaks=0, args=f64)
def nprand_scalar_draw(a):  # a Python float drawn before the graph, a graph input
    np.random.seed(14)
    return a * np.random.rand()


@case(graphs=1, breaks=0, args=f64)
def nprand_scalar_draws_arith(a):
    np.random.seed(17)
    r, k = np.random.rand(), np.random.randint(1, 5)
    return (a.astype(np.float32) * (r - 0.5) + k, k * 2 - 1, r > 0.5)


@case(graphs=2, breaks=1, args=f64)
def nprand_scalar_draw_in_control_flow(a):
    np.random.seed(16)
    if np.random.rand() < 0.5:  # a data-dependent branch on the drawn value: runs in Python
        return a + 1
    return a - 1


@case(graphs=2, breaks=1, args=f64)
def nprand_shuffle_breaks(a):
    np.random.seed(15)
    b = a.copy()
    np.random.shuffle(b)
    return b + 1


# ---- modules with random weights built inside compiled code ---------------------------------------
# a seed set in the same graph as the draws of a module's initialisation: the construction runs in
# Python after the seed (deferred.py); unseeded constructions are graph work (test_modules_built_inside.py)
@case(graphs=2, breaks=1, args=lambda: (torch.randn(3, 4),))
def module_linear_built_seeded(x):
    torch.manual_seed(0)
    lin = nn.Linear(4, 2)
    return lin(x).relu()


@case(graphs=2, breaks=1, args=lambda: (torch.randn(3, 4),))
def module_sequential_built_seeded(x):
    torch.manual_seed(1)
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    return seq(x)


@case(graphs=2, breaks=1, args=lambda: (torch.randn(3, 4),))
def module_conv_built_seeded(x):
    torch.manual_seed(2)
    conv = nn.Conv1d(3, 2, kernel_size=2)
    return conv(x.unsqueeze(0)).sum()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def module_layernorm_built(x):
    ln = nn.LayerNorm(4)  # ones/zeros, no RNG: its initialisation is graph work
    return ln(x) * 2


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def module_batchnorm_built(x):
    bn = nn.BatchNorm1d(4)  # buffers too (num_batches_tracked is a torch.tensor constant)
    return bn(x) + bn.running_mean + bn.num_batches_tracked


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def module_linear_built_reinitialised(x):
    lin = nn.Linear(4, 2)  # draws its weights (both sides consume the generator alike), then set
    nn.init.constant_(lin.weight, 0.5)
    nn.init.zeros_(lin.bias)
    return lin(x), lin.weight.requires_grad


_SOURCED_LIN = nn.Linear(4, 4)


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def module_container_of_sourced_module_built(x):
    return nn.Sequential(_SOURCED_LIN, nn.ReLU(), nn.LayerNorm(4))(x)


def _fixed_linear():
    lin = nn.Linear(4, 2)
    nn.init.ones_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin


@case(graphs=2, breaks=1, args=lambda: (torch.randn(3, 4),))
def module_built_returned_breaks(x):
    lin = nn.Linear(4, 2)  # outlives the graph: built in Python, with real Parameters
    nn.init.ones_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin(x), lin


_BUILT: list = []


@case(graphs=4, breaks=2, args=lambda: (torch.randn(3, 4),))
def module_built_stored_breaks(x):  # the helper breaks at the construction, then runs as its own frame
    _BUILT[:] = [_fixed_linear()]
    return _BUILT[0](x) * 2
