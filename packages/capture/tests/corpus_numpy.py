"""Corpus programs: NumPy code traced as tensor code (numpy_trace.py). Results are compared with
NumPy itself: values, dtypes (float64 defaults, NumPy promotion) and types (ndarray or NumPy scalar)."""

from __future__ import annotations

import numpy as np
import torch

from .corpus_registry import case, graph_break


def f32():
    return (torch.randn(3, 4).numpy(),)


def f64():
    return (torch.randn(3, 4, dtype=torch.float64).numpy(),)


def i64():
    return (torch.randint(-5, 10, (3, 4)).numpy(),)


def two64():
    return (torch.randn(3, 4, dtype=torch.float64).numpy(), torch.randn(3, 4, dtype=torch.float64).numpy())


def mixed():
    return (torch.randn(3, 4).numpy(), torch.randint(0, 5, (3, 4), dtype=torch.int32).numpy())


def tens():
    return (torch.randn(3, 4),)


# ---- tensors to numpy and back -------------------------------------------------------------------
@case(args=tens)
def np_tensor_numpy_copy(x):
    return x.numpy().copy()


@case(args=tens)
def np_tensor_numpy_transpose(x):
    return x.numpy().transpose()


@case(args=tens)
def np_tensor_numpy_reshape(x):
    return x.numpy().reshape(-1)


@case(args=tens)
def np_tensor_numpy_T_flatten(x):
    return x.numpy().T.flatten()


@case(args=tens)
def np_sum_from_numpy(x):
    return torch.from_numpy(np.sum(x.numpy(), axis=0))


@case(args=tens)
def np_mean_asarray_from_numpy(x):
    return torch.from_numpy(np.asarray(np.mean(x.numpy(), axis=1)))


@case(args=tens)
def np_scalar_method(x):
    return x.numpy().sum()


@case(args=tens)
def np_round_trip_math(x):
    a = x.numpy()
    b = np.exp(a) - 1.0
    return torch.from_numpy(b) * 2 + x


@case(args=tens)
def np_numpy_shares_memory(x):
    a = x.numpy()
    a[0] = 7.0
    return x + 1


@case(args=tens)
def np_tensor_and_array_out(x):
    y = x * 2
    return y, y.numpy() + 1


# ---- numpy arguments ------------------------------------------------------------------------------
@case(args=f32)
def np_arg_elementwise(a):
    return a * 2.0 + 1


@case(args=f64)
def np_arg_float64(a):
    return np.sin(a) ** 2 + np.cos(a) ** 2


@case(args=i64)
def np_int_true_divide(a):
    return a / 2


@case(args=i64)
def np_int_floor_mod(a):
    return a // 3, a % 3


@case(args=i64)
def np_int_sin_is_float64(a):
    return np.sin(a)


@case(args=i64)
def np_int_mean_is_float64(a):
    return a.mean(), np.mean(a, axis=0)


@case(args=i64)
def np_int_sum_int64(a):
    return a.sum(axis=1), np.sum(a)


@case(args=lambda: (torch.randint(0, 5, (3, 4), dtype=torch.int32).numpy(),))
def np_int32_sum_is_int64(a):
    return a.sum(), a.sum(axis=0)


@case(args=mixed)
def np_promote_float32_int32(a, b):
    return a + b, a * b


@case(args=two64)
def np_two_arrays(a, b):
    return np.maximum(a, b) - np.minimum(a, b)


@case(args=f32)
def np_float32_times_python_float_stays_float32(a):
    return a * 2.5


@case(args=f32)
def np_float32_times_float64_scalar(a):
    return a * np.float64(2.5)


@case(args=f32)
def np_compare_where(a):
    return np.where(a > 0, a, 0.0)


@case(args=f32)
def np_compare_ops(a):
    return a > 0.5, a <= 0.0, a == a


@case(args=f64)
def np_scalar_on_left(a):
    return 1.0 - a, 2.0 / (a + 5.0), 0.5 < a


@case(args=f64)
def np_neg_abs(a):
    return -a, abs(a), np.abs(a)


@case(args=f64)
def np_power_sqrt(a):
    return np.sqrt(np.abs(a)) ** 3


# ---- reductions ------------------------------------------------------------------------------------
@case(args=f64)
def np_reductions_axis(a):
    return a.sum(axis=0), a.max(axis=1), a.min(axis=0), a.prod(axis=1)


@case(args=f64)
def np_reductions_full(a):
    return a.sum(), a.max(), a.min(), a.mean()


@case(args=f64)
def np_reductions_keepdims(a):
    return np.sum(a, axis=1, keepdims=True), np.max(a, axis=0, keepdims=True)


@case(args=f64)
def np_std_var(a):
    return a.std(), np.var(a, axis=0), np.std(a, axis=1, ddof=1)


@case(args=f64)
def np_argmax_argmin(a):
    return a.argmax(), np.argmin(a, axis=0), np.argmax(a, axis=1)


@case(args=f64)
def np_all_any(a):
    return (a > 0).all(axis=0), np.any(a > 1.0, axis=1)


@case(args=f64)
def np_cumsum(a):
    return np.cumsum(a, axis=1), a.cumsum()


@case(args=f64)
def np_normalize_rows(a):
    return (a - a.mean(axis=1, keepdims=True)) / (a.std(axis=1, keepdims=True) + 1e-6)


@case(args=f64)
def np_softmax(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@case(args=f64)
def np_sum_of_tuple_axis(a):
    return a.sum(axis=(0, 1))


# ---- shapes ------------------------------------------------------------------------------------------
@case(args=f64)
def np_reshape_forms(a):
    return a.reshape(4, 3), a.reshape((2, 6)), np.reshape(a, (12,)), a.reshape(-1, 2)


@case(args=f64)
def np_transpose_forms(a):
    b = a.reshape(2, 3, 2)
    return b.transpose(2, 0, 1), np.transpose(b, (1, 0, 2)), b.T


@case(args=f64)
def np_concat_stack(a):
    return np.concatenate([a, a * 2], axis=0), np.stack([a, a], axis=1), np.vstack([a, a]), np.hstack([a, a])


@case(args=f64)
def np_expand_squeeze(a):
    b = np.expand_dims(a, 0)
    return b, np.squeeze(b), b.squeeze(0)


@case(args=f64)
def np_flip_roll(a):
    return np.flip(a, 0), np.roll(a, 1, axis=1), np.roll(a, 2)


@case(args=f64)
def np_tile_repeat(a):
    return np.tile(a, (2, 1)), np.repeat(a, 2, axis=0), np.repeat(a, 2)


@case(args=f64)
def np_swapaxes_ravel(a):
    return np.swapaxes(a, 0, 1), np.ravel(a), a.ravel()


@case(args=f64)
def np_shape_attributes(a):
    return a.shape, a.ndim, a.size, a * a.shape[0]


@case(args=f64)
def np_dtype_attribute(a):
    return a.astype(np.float32).dtype == np.float32, a.dtype


@case(args=f64)
def np_iterate_rows(a):
    total = np.zeros(4)
    for row in a:
        total = total + row
    return total


@case(args=f64)
def np_len(a):
    return a * len(a)


# ---- indexing ------------------------------------------------------------------------------------------
@case(args=f64)
def np_basic_indexing(a):
    return a[0], a[:, 1], a[1:, ::2], a[..., -1]


@case(args=f64)
def np_element_is_scalar(a):
    return a[1, 2], a[0][0]


@case(args=f64)
def np_boolean_mask_assign(a):
    b = a.copy()
    b[b < 0] = 0.0
    return b


@case(args=f64)
def np_setitem_slice(a):
    b = np.zeros((3, 4))
    b[1:, :2] = a[1:, :2]
    b[0] = 5.0
    return b


@case(args=f64)
def np_inplace_ops(a):
    b = a.copy()
    b += 1.0
    b *= 2.0
    b -= a
    return b


@case(args=f64)
def np_inplace_on_argument(a):
    a += 1.0
    return a.sum()


# ---- constructors ---------------------------------------------------------------------------------------
@case(args=tens)
def np_constructors_float64(x):
    return np.zeros(3), np.ones((2, 2)), np.full((2,), 3.0), np.eye(3), np.linspace(0, 1, 5)


@case(args=tens)
def np_constructors_ints(x):
    return np.arange(5), np.arange(1, 7, 2), np.full(3, 7), np.zeros(3, dtype=np.int32)


@case(args=tens)
def np_arange_float(x):
    return np.arange(0.0, 1.0, 0.25)


@case(args=tens)
def np_array_from_list(x):
    return np.array([1.0, 2.0, 3.0]) * 2, np.array([[1, 2], [3, 4]]), np.asarray([True, False])


@case(args=f64)
def np_like_constructors(a):
    return np.zeros_like(a), np.ones_like(a), np.full_like(a, 2.0)


@case(args=f32)
def np_astype(a):
    return a.astype(np.float64), a.astype("int32"), a.astype(np.int64) + 1


@case(args=tens)
def np_from_tensor_asarray(x):
    return np.asarray(x) * 2


# ---- linear algebra and others --------------------------------------------------------------------------
@case(args=f64)
def np_matmul_dot(a):
    return a @ a.T, np.dot(a, a.T), np.matmul(a.T, a), a.dot(np.ones(4))


@case(args=f64)
def np_outer_einsum(a):
    return np.outer(a[0], a[1]), np.einsum("ij,kj->ik", a, a)


@case(args=lambda: (torch.randn(3, 3, dtype=torch.float64).numpy() + 3 * np.eye(3),))
def np_linalg(a):
    return np.linalg.norm(a), np.linalg.inv(a), np.linalg.det(a)


@case(args=f64)
def np_clip_round(a):
    return np.clip(a, -0.5, 0.5), np.round(a, 2), a.clip(0.0, 1.0)


@case(args=f64)
def np_sort(a):
    return np.sort(a, axis=1), np.argsort(a, axis=0)


@case(args=f64)
def np_isnan_isfinite(a):
    b = a / (a > 0)
    return np.isnan(b), np.isfinite(b), np.isinf(b)


@case(args=f64)
def np_logical(a):
    return np.logical_and(a > 0, a < 1), np.logical_not(a > 0)


@case(args=f64)
def np_many_ufuncs(a):
    b = np.abs(a) + 0.1
    return np.log(b), np.log2(b), np.log10(b), np.log1p(b), np.expm1(a), np.tanh(a), np.arctan2(a, b)


@case(args=f64)
def np_floor_ceil_sign(a):
    return np.floor(a), np.ceil(a), np.sign(a), np.trunc(a)


@case(args=f64)
def np_triu_tril_trace(a):
    s = a[:, :3]
    return np.triu(s), np.tril(s), np.trace(s)


# ---- whole programs ------------------------------------------------------------------------------------
@case(args=lambda: (torch.randn(20, 2, dtype=torch.float64).numpy(), torch.randn(3, 2, dtype=torch.float64).numpy()))
def np_kmeans_step(points, centers):
    d = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    nearest = d.argmin(axis=1)
    onehot = (nearest[:, None] == np.arange(3)[None, :]).astype(np.float64)
    counts = onehot.sum(axis=0)[:, None]
    return (onehot.T @ points) / np.maximum(counts, 1.0)


@case(args=lambda: (torch.randn(8, 3, dtype=torch.float64).numpy(), torch.randn(3, dtype=torch.float64).numpy()))
def np_linear_regression_grad(x, w):
    pred = x @ w
    err = pred - x.sum(axis=1)
    return 2.0 * x.T @ err / len(x), (err ** 2).mean()


@case(args=lambda: (torch.randn(5, dtype=torch.float64).numpy(),))
def np_polynomial(x):
    coeffs = [1.0, -2.0, 0.5]
    out = np.zeros_like(x)
    for i, c in enumerate(coeffs):
        out = out + c * x ** i
    return out


@case(args=tens)
def np_mixed_torch_numpy(x):
    a = x.numpy()
    b = np.tanh(a) * 2.0
    y = torch.from_numpy(b).relu()
    return y.sum(), y.numpy().max()


# ---- what is not traced breaks cleanly ---------------------------------------------------------------
@case(graphs=3, breaks=1, args=f64)  # the Python number differs per call: specialised, recompiled
def np_item_breaks(a):
    s = a.sum().item()
    return a * 2, s


@case(graphs=2, breaks=1, args=f64)
def np_truth_breaks(a):
    if a.sum() > 0:
        return a + 1
    return a - 1


@case(graphs=2, breaks=1, args=f64)
def np_untraced_function_breaks(a):
    b = a * 2
    c = np.nanmedian(b, axis=0)
    return c + 1


@case(graphs=1, breaks=0, args=f64)
def np_median_traced(a):
    b = a * 2
    c = np.median(b, axis=0)
    return c + np.percentile(b, [25, 75]).sum()


@case(graphs=1, breaks=1, args=f64)
def np_unique_breaks(a):
    return np.unique(np.round(a))


@case(graphs=2, breaks=1, args=f64)
def np_break_then_continue(a):
    b = np.exp(a)
    graph_break()
    return b.sum(axis=0)


@case(graphs=0, breaks=1, args=lambda: (torch.randn(3, 4).numpy()[:, ::-1],))  # not shareable: Python
def np_negative_strides_argument(a):
    return a * 2


# ---- more NumPy ------------------------------------------------------------------------------------------
@case(args=f64)
def np_broadcast_column_row(a):
    return a - a[:, :1], a * a[0]


@case(args=f64)
def np_chain_of_ufuncs(a):
    return np.exp(np.log(np.abs(a) + 1.0)) - 1.0


@case(args=f32)
def np_float32_reductions_keep_dtype(a):
    return a.sum(axis=0), a.max(), np.mean(a, axis=1)


@case(args=i64)
def np_int_comparisons_and_where(a):
    return np.where(a % 2 == 0, a, -a), (a > 3).sum()


@case(args=i64)
def np_int_power_and_abs(a):
    return np.abs(a) ** 2, np.square(a)


@case(args=f64)
def np_minimum_with_scalar(a):
    return np.minimum(a, 0.0), np.maximum(0.0, a)


@case(args=f64)
def np_mean_of_bool(a):
    return (a > 0).mean(), np.sum(a > 0, axis=0)


@case(args=f64)
def np_method_chain(a):
    return a.reshape(2, 6).T.copy().sum(axis=1)


@case(args=f64)
def np_fill_and_inplace_slice(a):
    b = np.empty((3, 4))
    b.fill(1.5)
    b[:, 0] += a[:, 0]
    return b


@case(args=two64)
def np_stack_then_reduce(a, b):
    s = np.stack([a, b])
    return s.mean(axis=0), s.std(axis=0)


@case(args=two64)
def np_pairwise_distances(a, b):
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1))


@case(args=f64)
def np_cumulative_and_diffs(a):
    c = np.cumsum(a, axis=0)
    return c[1:] - c[:-1]


@case(args=f64)
def np_clip_in_loop(a):
    out = a
    for lo in (-1.0, -0.5):
        out = np.clip(out, lo, -lo)
    return out


@case(args=f64)
def np_dtype_conversions(a):
    return a.astype(np.float32).astype(np.float64), (a * 10).astype(np.int64) // 3


@case(args=tens)
def np_numpy_of_tensor_ops_to_tensor(x):
    a = (x * 2).numpy()
    return torch.from_numpy(np.tanh(a)).sum(dim=0)


@case(args=f64)
def np_list_of_arrays_sum(a):
    rows = [a[i] * (i + 1) for i in range(3)]
    return sum(rows), np.concatenate(rows)


@case(args=f64)
def np_scalar_python_math(a):
    s = a.max() - a.min()
    return a / (s + 1.0), s * 2


@case(args=f64)
def np_hypot_arctan2_degrees(a):
    return np.hypot(a, 1.0), np.degrees(np.arctan2(a, 1.0))


@case(args=f64)
def np_logaddexp_and_sign(a):
    return np.logaddexp(a, a * 2), np.sign(a) * np.abs(a)


@case(args=f64)
def np_eye_matmul(a):
    return a @ np.eye(4) + np.identity(3) @ a
