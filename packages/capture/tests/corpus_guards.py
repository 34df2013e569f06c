"""Corpus programs: guards and recompiles — each runs a sequence of calls whose inputs differ in
what the trace assumed, and asserts how many graphs were compiled."""

from __future__ import annotations

import torch
from torch import nn

from .corpus_registry import case


def t(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def calls(*factories):
    return factories


@case(graphs=1, calls=calls(lambda: (t(4, 4),), lambda: (t(4, 4),), lambda: (t(4, 4),)))
def same_inputs_hit(x):
    return x.relu() * 2


@case(graphs=2, calls=calls(lambda: (t(4, 4),), lambda: (t(4, 4, dtype=torch.float64),)))
def dtype_change_recompiles(x):
    return x.sin() + 1


@case(graphs=2, calls=calls(lambda: (t(4, 4),), lambda: (t(4, 4, grad=True),)))
def requires_grad_change_recompiles(x):
    return (x * 3).sum(0)


@case(graphs=2, calls=calls(lambda: (t(4, 4),), lambda: (t(4, 4).t(),)))
def stride_change_recompiles(x):
    return x + 1


@case(graphs=2, calls=calls(lambda: (t(4, 4),), lambda: (t(6, 4),), lambda: (t(8, 4),)))
def size_change_goes_dynamic(x):
    return x.sum(1) * x.shape[0]


@case(graphs=2, calls=calls(lambda: (t(4, 4),), lambda: (t(4, 4, 2),)))
def rank_change_recompiles(x):
    return x.mean()


@case(graphs=2, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3), lambda: (t(4), 5)))
def int_arg_becomes_symbolic(x, n):
    return x * n + n


@case(graphs=2, dynamic=False, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3), lambda: (t(4), 3)))
def int_arg_static_when_dynamic_false(x, n):
    return x * n


@case(graphs=1, dynamic=True, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3), lambda: (t(4), 7)))
def int_arg_symbolic_from_start(x, n):
    return x + n * 2


@case(graphs=2, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3), lambda: (t(4), 4)))
def int_arg_in_reshape(x, n):
    return x.repeat(n).reshape(n, 4).sum(0)


@case(graphs=3, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3), lambda: (t(4), 6)))
def int_arg_in_branch_guarded(x, n):
    if n > 4:  # a guard on the symbol: n = 6 leaves the entry compiled for 2 < n <= 4
        return x * n
    return x - n


@case(graphs=2, calls=calls(lambda: (t(4), 1.5), lambda: (t(4), 2.5)))
def float_arg_specialised(x, s):
    return x * s


@case(graphs=2, calls=calls(lambda: (t(4), True), lambda: (t(4), False), lambda: (t(4), True)))
def bool_flag_two_entries(x, flag):
    return x.relu() if flag else x.sigmoid()


@case(graphs=2, calls=calls(lambda: (t(4), "relu"), lambda: (t(4), "tanh"), lambda: (t(4), "relu")))
def string_arg_constant(x, act):
    return getattr(torch, act)(x)


@case(graphs=2, calls=calls(lambda: (t(4), None), lambda: (t(4), t(4)), lambda: (t(4), None)))
def optional_tensor_arg(x, bias):
    return x + bias if bias is not None else x * 2


@case(graphs=2, calls=calls(lambda: ([t(4), t(4)],), lambda: ([t(4), t(4), t(4)],)))
def list_length_change(xs):
    return sum(xs)


@case(graphs=2, calls=calls(lambda: ({"a": t(4)},), lambda: ({"a": t(4), "b": t(4)},)))
def dict_keys_change(d):
    return sum(d.values())


@case(graphs=2, calls=calls(lambda: ((t(4), 1),), lambda: ((t(4), 2),)))
def tuple_constant_item_change(p):
    return p[0] * p[1]


@case(graphs=2, calls=calls(lambda: (t(4), torch.float32), lambda: (t(4), torch.float64)))
def dtype_arg_identity(x, dt):
    return x.to(dt) * 2


@case(graphs=2, calls=calls(lambda: (t(4), torch.sin), lambda: (t(4), torch.cos), lambda: (t(4), torch.sin)))
def function_arg_identity(x, fn):
    return fn(x) + 1


def _scale2(v):
    return v * 2


def _scale3(v):
    return v * 3


@case(graphs=2, calls=calls(lambda: (t(4), _scale2), lambda: (t(4), _scale3)))
def python_function_arg_code_guard(x, fn):
    return fn(x) - 1


class Cfg:
    def __init__(self, k):
        self.k = k


@case(graphs=2, calls=calls(lambda: (t(4), Cfg(2)), lambda: (t(4), Cfg(2)), lambda: (t(4), Cfg(5))))
def object_attribute_value_guard(x, cfg):
    return x * cfg.k


class Twice:
    def run(self, v):
        return v * 2


class Thrice:
    def run(self, v):
        return v * 3


@case(graphs=2, calls=calls(lambda: (t(4), Twice()), lambda: (t(4), Thrice()), lambda: (t(4), Twice())))
def object_type_guard(x, obj):
    return obj.run(x)


_LIN_A = nn.Linear(4, 4)
_LIN_B = nn.Linear(4, 4)


@case(graphs=2, calls=calls(lambda: (t(2, 4), _LIN_A), lambda: (t(2, 4), _LIN_B), lambda: (t(2, 4), _LIN_A)))
def module_identity_guard(x, mod):
    return mod(x)


_TRAIN_TOGGLE = nn.Dropout(0.5)


def _train_mode():
    _TRAIN_TOGGLE.train(False)
    return (t(4),)


def _eval_then_train():
    _TRAIN_TOGGLE.train(False)
    return (t(4),)


@case(graphs=1, calls=calls(_train_mode, _eval_then_train))
def module_training_flag_guard(x):
    return _TRAIN_TOGGLE(x) + 1


_GLOBAL_K = [2]


def _set_global_k(v):
    def factory():
        _GLOBAL_K[0] = v
        return (t(4),)
    return factory


@case(graphs=2, calls=calls(_set_global_k(2), _set_global_k(2), _set_global_k(3)))
def global_list_item_guard(x):
    return x * _GLOBAL_K[0]


def _with_grad_mode(enabled):
    def factory():
        torch.set_grad_enabled(enabled)
        return (t(4, grad=True),)
    return factory


@case(graphs=2, calls=calls(_with_grad_mode(True), _with_grad_mode(False), _with_grad_mode(True)))
def grad_mode_global_state_guard(x):
    return x * 2


def _with_default_dtype(dt):
    def factory():
        torch.set_default_dtype(dt)
        return (t(4),)
    return factory


@case(graphs=2, calls=calls(_with_default_dtype(torch.float32), _with_default_dtype(torch.float64),
                            _with_default_dtype(torch.float32)))
def default_dtype_global_state_guard(x):
    return x + torch.ones(4)


def _make_closure(k):
    def inner(v):
        return v * k
    return inner


@case(graphs=2, calls=calls(lambda: (t(4), _make_closure(2)), lambda: (t(4), _make_closure(2)),
                            lambda: (t(4), _make_closure(4))))
def closure_contents_guard(x, fn):
    return fn(x)


@case(graphs=2, calls=calls(lambda: (t(4), 2), lambda: (t(4), 3)))
def int_arg_used_as_range(x, n):
    out = x
    for i in range(n):
        out = out + i
    return out


@case(graphs=2, calls=calls(lambda: (t(3, 4),), lambda: (t(5, 4),), lambda: (t(7, 4),)))
def dynamic_size_used_in_python(x):
    n = x.shape[0]
    return x.new_ones(n, 2).sum() + x.reshape(n * 4).sum() + n


@case(graphs=2, calls=calls(lambda: (t(4, 2), t(4, 2)), lambda: (t(6, 2), t(6, 2))))
def dynamic_sizes_related(x, y):
    return torch.cat([x, y], 0).sum(0) + (x * y).sum(0)


@case(graphs=3, calls=calls(lambda: (t(4, 4), 1), lambda: (t(4, 4), 2), lambda: (t(4, 4), 3)))
def int_arg_as_dim(x, d):  # symbolic from the 2nd call, guarded on d % 2 == 0: the 3rd recompiles
    return x.sum(d % 2)
