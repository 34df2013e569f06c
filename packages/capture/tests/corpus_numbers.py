"""Corpus programs: Python numbers, operators, builtins, strings, math/operator modules."""

from __future__ import annotations

import math
import operator

import torch

from .corpus_registry import case


@case()
def int_true_div(x, y):
    return x * (7 / 2) + y * (7 // 2)


@case()
def negative_floor_div_mod(x, y):
    return x * (-7 // 2) + y * (-7 % 3)


@case()
def float_floor_mod(x, y):
    return x * (5.5 // 2) + y * (5.5 % 2)


@case()
def power_ops(x, y):
    return x * (2 ** 10) + y * (2 ** -1) + 9 ** 0.5


@case()
def bitwise_ints(x, y):
    a, b = 12, 10
    return x * (a & b) + y * (a | b) + (a ^ b) + (a << 2) + (a >> 1) + ~a


@case()
def augmented_assign_ints(x, y):
    n = 1
    n += 2
    n *= 3
    n -= 1
    n //= 2
    n **= 2
    n %= 7
    return x * n


@case()
def augmented_assign_tensors(x, y):
    z = x * 1
    z += y
    z *= 2
    z -= 1
    z /= 4
    return z


@case()
def int_float_conversions(x, y):
    return x * int(3.9) + y * float(2) + int("12") + float("1.5")


@case()
def round_builtin(x, y):
    return x * round(2.567, 2) + y * round(3.5) + round(-2.5)


@case()
def bool_conversion(x, y):
    n = bool(0) + bool(3) + bool([]) + bool([1]) + bool("") + bool("a")
    return x * n


@case()
def complex_comparisons(x, y):
    a, b = 3, 4.0
    out = x
    if a < b and b >= 4 and a != b and not a == b:
        out = out + 1
    if (a, 1) < (a, 2):
        out = out + 2
    if [1, 2] == [1, 2] and ("abc" > "abd") is False:
        out = out + 100
    return out


@case()
def is_and_is_not(x, y):
    a = None
    b = [1]
    c = b
    out = x
    if a is None and b is c and b is not [1]:  # noqa: F632
        out = out + 3
    return out


@case()
def chained_ternaries(x, y):
    n = 5
    k = 1 if n < 3 else 2 if n < 6 else 3
    return x * k


@case()
def walrus_operator(x, y):
    if (n := len([1, 2, 3])) > 2:
        return x * n
    return y


@case()
def walrus_in_comprehension(x, y):
    total = 0
    vals = [(total := total + i) for i in range(4)]
    return x * total + y * vals[-1]


@case()
def math_trig(x, y):
    return x * math.sin(math.pi / 6) + y * math.atan2(1.0, 1.0) + math.tan(0.5) + math.hypot(3, 4)


@case()
def math_log_family(x, y):
    return x * math.log2(8) + y * math.log10(1000) + math.log(math.e) + math.log1p(0.5)


@case()
def math_misc(x, y):
    vals = math.fabs(-2.5) + math.trunc(3.7) + math.factorial(4) + math.copysign(2.0, -1.0)
    return x * vals + math.isclose(0.1 + 0.2, 0.3) + math.isfinite(1.0) + math.isinf(math.inf)


@case()
def math_comb_perm(x, y):
    return x * math.comb(5, 2) + y * math.perm(4, 2) + math.prod([1, 2, 3]) + math.isqrt(17)


@case()
def math_constants(x, y):
    return x * math.tau + y * math.inf * 0 if False else x * math.tau + y * (math.nan != math.nan)


@case()
def operator_functions(x, y):
    return operator.sub(x, y) + operator.truediv(x, 2) + operator.neg(y) + operator.pow(x, 2)


@case()
def operator_getitem_itemgetter(x, y):
    pair = (x, y)
    get1 = operator.itemgetter(1)
    return operator.getitem(pair, 0) + get1(pair)


@case()
def operator_attrgetter(x, y):
    get_t = operator.attrgetter("T")
    return get_t(x) + y


@case()
def operator_comparisons(x, y):
    n = operator.lt(1, 2) + operator.eq(3, 3) + operator.not_(False) + operator.truth(5)
    return x * n + operator.gt(x, y).float()


@case()
def operator_inplace(x, y):
    z = x.clone()
    z = operator.iadd(z, y)
    z = operator.imul(z, 2)
    return z


@case()
def operator_index_contains(x, y):
    n = operator.index(3) + operator.contains([1, 2], 2) + operator.length_hint([1, 2, 3])
    return x * n


@case()
def string_ops_many(x, y):
    s = "  Hello World  "
    t = s.strip().lower().replace("world", "kiln")
    n = len(t) + t.count("l") + t.find("kiln") + int(t.isascii()) + len(s.lstrip()) + len(s.rstrip())
    return x * n


@case()
def string_predicates(x, y):
    n = "abc".isalpha() + "123".isdigit() + "a1".isalnum() + " ".isspace() + "Abc".istitle()
    return x * n + y


@case()
def string_partition_zfill(x, y):
    head, sep, tail = "key=value".partition("=")
    return x * len(head) + y * len(tail) + len(sep) + len("7".zfill(3))


@case()
def string_index_slice(x, y):
    s = "transformer"
    return x * len(s[2:5]) + y * (s[-1] == "r") + s.index("f")


@case()
def string_concat_repeat(x, y):
    s = "ab" + "cd"
    s2 = s * 3
    return x * len(s2)


@case()
def fstring_formats(x, y):
    a = f"{3.14159:.2f}|{42:05d}|{'x':>3}|{7!r}"
    return x * len(a)


@case()
def fstring_of_shape(x, y):
    tag = f"shape={tuple(x.shape)} dtype={x.dtype}"
    return x * len(tag)


@case()
def str_of_numbers(x, y):
    return x * len(str(12345)) + y * len(repr(1.5))


@case()
def string_in_dict_keys(x, y):
    names = {"w" + str(i): i for i in range(3)}
    return x * names["w2"]


@case()
def ord_chr(x, y):
    return x * (ord("b") - ord("a")) + y * len(chr(65))


@case()
def hex_bin_oct(x, y):
    return x * len(hex(255)) + y * len(bin(5)) + len(oct(8))


@case()
def builtin_hash_id_free(x, y):
    return x * (hash(3) == hash(3))


@case()
def builtin_callable_type(x, y):
    n = callable(x.add) + (type(3) is int) + (type(x) is torch.Tensor) + isinstance(True, int)  # noqa: UP003
    return x * n


@case()
def builtin_issubclass(x, y):
    n = issubclass(bool, int) + issubclass(torch.nn.Linear, torch.nn.Module)
    return x * n


@case()
def builtin_len_variants(x, y):
    return x * (len((1, 2)) + len({1: 2}) + len({3}) + len("ab") + len(range(5)) + len(x))


@case()
def builtin_range_ops(x, y):
    r = range(2, 20, 3)
    return x * (len(r) + r[1] + r[-1] + (8 in r) + sum(r[1:3]))


@case()
def builtin_min_max_many(x, y):
    return x * min(3, 1, 2) + y * max([4.5, 2]) + max(1, 2, key=lambda v: -v)


@case()
def builtin_sum_start(x, y):
    return sum([1, 2, 3], 10) * x + sum([x, y], torch.zeros(4, 4))


@case()
def builtin_abs_neg_float(x, y):
    return x * abs(-3.5) + y * abs(-2)


@case()
def builtin_divmod_floats(x, y):
    q, r = divmod(7.5, 2)
    return x * q + y * r


@case()
def builtin_pow_mod(x, y):
    return x * pow(3, 4, 5) + y * pow(2.0, 0.5)


@case()
def numeric_tower_mix(x, y):
    a = 1 + 2.5 + True
    b = 3 * False + 2 ** 0.0
    return x * a + y * b


@case()
def float_special_values(x, y):
    big = float("inf")
    return torch.clamp(x, max=big) + (y if -big < 0 else x)


@case()
def int_bit_length(x, y):
    return x * (255).bit_length() + y * int.from_bytes(b"\x01\x00", "little")


@case()
def float_methods(x, y):
    return x * (2.5).is_integer() + y * (4.0).is_integer() + float.fromhex("0x1p-1")


@case()
def tensor_scalar_right_ops(x, y):
    return 2 - x + 3 / (y.abs() + 1) + 2 ** x.clamp(-1, 1) + 5 // (y.abs() + 1)


@case()
def tensor_comparison_scalars(x, y):
    return (x > 0.5).float() + (0.5 < y).float() + (x != 0).float() + (y == y).float()


@case()
def tensor_bitwise(x, y):
    a = x > 0
    b = y > 0
    return (a & b).float() + (a | b).float() + (a ^ b).float() + (~a).float()


@case()
def tensor_int_ops(x, y):
    a = (x * 10).long()
    b = (y * 10).long().abs() + 1
    return (a // b) + (a % b) + (a << 1) + (a >> 1) + (a & 3)


@case()
def tensor_matmul_inplace(x, y):
    z = x.clone()
    z @= y
    return z


@case()
def tensor_pow_reverse(x, y):
    return 2.0 ** x + x ** 2.0 + torch.pow(y.abs(), 0.5)


@case()
def python_scalar_from_shape_math(x, y):
    n = x.shape[0] * x.shape[1]
    half = n // 2
    return x.reshape(-1)[:half].sum() + y.reshape(n)[half:].sum() + n % 3


@case()
def numbers_in_tuples_compare(x, y):
    v = (1, 2, 3)
    return x * (v < (1, 2, 4)) + y * (max(v) in v) + (v == (1, 2, 3))


@case()
def boolean_short_circuit_values(x, y):
    a = 0 or 5
    b = 3 and 7
    c = None or "s"
    d = [] and [1]
    return x * a + y * b + len(c) + len(d)


@case()
def tensor_in_bool_context_meta(x, y):
    out = x
    if x.is_floating_point() and not x.is_complex() and x.is_contiguous():
        out = out + 1
    return out + y


@case()
def dtype_properties(x, y):
    out = x
    if x.dtype.is_floating_point and not torch.int64.is_floating_point and x.dtype.itemsize == 4:
        out = out * 2
    return out + torch.iinfo(torch.int8).max


@case()
def torch_dtype_promotion_queries(x, y):
    dt = torch.promote_types(torch.float16, torch.float32)
    return x.to(dt) + y * torch.result_type(x, 2).is_floating_point


@case()
def torch_get_default_dtype(x, y):
    return x.to(torch.get_default_dtype()) + torch.zeros(4, 4, dtype=torch.get_default_dtype())


@case()
def numpy_scalar_constants(x, y):
    import numpy as np

    k = np.sqrt(16.0) + np.float32(0.5)
    return x * float(k) + y * math.floor(np.pi)
