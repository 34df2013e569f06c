"""Corpus programs: tuples, lists, dicts, sets — build, index, slice, unpack, methods, comprehensions."""

from __future__ import annotations

import collections
import itertools

import torch

from .corpus_registry import case


@case()
def tuple_concat_repeat(x, y):
    t = (x,) + (y,)
    t2 = t * 2
    return sum(t2) + len(t2)


@case()
def tuple_index_count(x, y):
    t = (1, 2, 2, 3)
    return x * t.index(3) + y * t.count(2)


@case()
def tuple_negative_slices(x, y):
    t = (x, y, x + y, x - y, x * y)
    return sum(t[-3:-1]) + t[::-2][0] + len(t[1:100])


@case()
def nested_unpack(x, y):
    (a, (b, c)), d = (x, (y, 2)), 3
    return a * c + b * d


@case()
def star_unpack_middle(x, y):
    first, *mid, last = [1, x, y, 2]
    return sum(mid) * first + last


@case()
def star_unpack_empty(x, y):
    a, *rest = (x,)
    return a + len(rest)


@case()
def swap_values(x, y):
    x, y = y, x
    return x - y


@case()
def rotate_three(x, y):
    a, b, c = x, y, x * 2
    a, b, c = b, c, a
    return a + 2 * b + 3 * c


@case()
def list_index_count_remove(x, y):
    vals = [3, 1, 4, 1, 5]
    vals.remove(1)
    return x * vals.index(4) + y * vals.count(1) + len(vals)


@case()
def list_sort_inplace(x, y):
    vals = [3, 1, 2]
    vals.sort(reverse=True)
    return x * vals[0] + y * vals[-1]


@case()
def list_sort_key(x, y):
    items = [("b", 2), ("a", 1), ("c", 3)]
    items.sort(key=lambda p: p[1])
    return x * items[0][1] + y * items[-1][1]


@case()
def list_clear_copy(x, y):
    a = [x, y]
    b = a.copy()
    a.clear()
    return sum(b) + len(a)


@case()
def list_multiply(x, y):
    xs = [x] * 3
    zeros = [0] * 4
    return sum(xs) + len(zeros)


@case()
def list_del_item_slice(x, y):
    xs = [x, y, x + 1, y + 1, x * 2]
    del xs[0]
    del xs[1:3]
    return sum(xs)


@case()
def list_slice_step_assign(x, y):
    xs = [0, 0, 0, 0]
    xs[::2] = [1, 2]
    return x * sum(xs)


@case()
def list_in_and_not_in(x, y):
    dims = [1, 2, 3]
    return x * (2 in dims) + y * (5 not in dims)


@case()
def list_equality(x, y):
    if [1, 2] + [3] == [1, 2, 3] and list(range(3)) != [0, 1]:
        return x + y
    return x


@case()
def list_of_tensors_index_tensor_result(x, y):
    xs = [x, y]
    i = len(xs) - 1
    return xs[i] * xs[i - 1]


@case()
def list_extend_generator(x, y):
    xs = []
    xs.extend(t * 2 for t in (x, y))
    return xs[0] + xs[1]


@case()
def list_iadd(x, y):
    xs = [x]
    xs += [y]
    xs += (x,)
    return sum(xs)


@case()
def nested_list_comprehension(x, y):
    grid = [[i * j for j in range(3)] for i in range(3)]
    return x * sum(sum(r) for r in grid)


@case()
def flatten_comprehension(x, y):
    rows = [[x, y], [x * 2]]
    flat = [t for row in rows for t in row]
    return sum(flat)


@case()
def comprehension_with_conditional_expr(x, y):
    ts = [t if i % 2 else -t for i, t in enumerate([x, y, x])]
    return ts[0] + ts[1] + ts[2]


@case()
def comprehension_closure_capture(x, y):
    k = 3
    ts = [x * k + i for i in range(2)]
    return ts[1] - ts[0]


@case()
def set_comprehension(x, y):
    s = {i % 3 for i in range(10)}
    return x * len(s) + y * sum(s)


@case()
def set_algebra(x, y):
    a, b = {1, 2, 3}, {2, 3, 4}
    n = len(a & b) + len(a - b) + len(a ^ b) + a.issubset({1, 2, 3, 4}) + a.isdisjoint({9})
    return x * n


@case()
def set_methods(x, y):
    s = set()
    s.add(1)
    s.update([2, 3])
    s.discard(9)
    s.remove(1)
    s2 = s.union({7}).intersection({2, 7})
    return x * len(s2) + y * (2 in s2)


@case()
def frozenset_keys(x, y):
    fs = frozenset(["a", "b"])
    d = {fs: 3}
    return x * d[frozenset(["b", "a"])]


@case()
def set_of_strings_iteration_sorted(x, y):
    out = x
    for name in sorted({"b", "a", "c"}):
        out = out * 2 if name == "a" else out + 1
    return out


@case()
def dict_construct_forms(x, y):
    a = dict(p=x, q=y)
    b = dict([("r", x * 2)])
    c = dict(zip(["s", "t"], [y, y * 2]))
    d = {**a, **b, "u": 1}
    return a["p"] + b["r"] + c["t"] + d["q"] + len(d)


@case()
def dict_merge_operators(x, y):
    a = {"a": x}
    b = {"b": y}
    c = a | b
    c |= {"c": x + y}
    return c["a"] + c["b"] + c["c"]


@case()
def dict_iteration_order(x, y):
    d = {}
    d["z"] = x
    d["a"] = y
    out = []
    for k, v in d.items():  # noqa: B007
        out.append(v * len(out))
    return out[0] + out[1] + (list(d)[0] == "z")


@case()
def dict_values_sum(x, y):
    d = {"a": x, "b": y, "c": x * y}
    return sum(d.values())


@case()
def dict_popitem_del(x, y):
    d = {"a": x, "b": y, "c": x * 3}
    k, v = d.popitem()
    del d["a"]
    return v + d["b"] + len(k)


@case()
def dict_in_and_get_default(x, y):
    d = {"a": x}
    return (d["a"] if "a" in d else y) + d.get("b", y) + (d.get("c") is None)


@case()
def dict_fromkeys_copy(x, y):
    d = dict.fromkeys(["a", "b"], 2)
    e = d.copy()
    e["a"] = 5
    return x * d["a"] + y * e["a"]


@case()
def dict_int_keys(x, y):
    d = {0: x, 1: y}
    return d[0] + d[1] * 2 + sum(d.keys())


@case()
def dict_tuple_keys(x, y):
    d = {(0, "a"): x, (1, "b"): y}
    return d[(1, "b")] - d[0, "a"]


@case()
def dict_sorted_items(x, y):
    d = {"b": y, "a": x}
    out = []
    for k, v in sorted(d.items()):  # noqa: B007
        out.append(v)
    return out[0] * 2 + out[1]


@case()
def dict_nested_comprehension(x, y):
    d = {i: {j: i * j for j in range(2)} for i in range(3)}
    return x * d[2][1] + y * len(d)


@case()
def dict_keys_set_ops(x, y):
    a = {"x": 1, "y": 2}
    b = {"y": 3, "z": 4}
    common = a.keys() & b.keys()
    return x * len(common) + y * len(a.keys() | b.keys())


@case()
def ordered_dict_usage(x, y):
    d = collections.OrderedDict()
    d["a"] = x
    d["b"] = y
    d.move_to_end("a")
    return list(d.values())[0] * 2 + list(d.values())[1]


@case()
def default_dict_usage(x, y):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(y)
    d["b"].append(x * 2)
    return sum(d["a"]) + d["b"][0] + len(d["c"])


@case()
def counter_usage(x, y):
    c = collections.Counter("abracadabra")
    return x * c["a"] + y * c.most_common(1)[0][1]


@case()
def deque_usage(x, y):
    q = collections.deque([1, 2, 3])
    q.appendleft(0)
    q.append(4)
    q.popleft()
    return x * sum(q) + y * len(q)


@case()
def itertools_chain_product(x, y):
    total = 0
    for a, b in itertools.product(range(2), range(3)):
        total += a * b
    parts = list(itertools.chain([x], [y]))
    return parts[0] * total + parts[1]


@case()
def itertools_accumulate_islice(x, y):
    acc = list(itertools.accumulate([1, 2, 3, 4]))
    first = list(itertools.islice(range(10), 2, 5))
    return x * acc[-1] + y * sum(first)


@case()
def zip_strict_lengths(x, y):
    pairs = list(zip([x, y], [1, 2], strict=True))
    return pairs[0][0] * pairs[0][1] + pairs[1][0] * pairs[1][1]


@case()
def zip_unzip(x, y):
    pairs = [(x, 1), (y, 2)]
    ts, ks = zip(*pairs)
    return ts[0] * ks[1] + ts[1] * ks[0]


@case()
def enumerate_reversed_list(x, y):
    out = x
    for i, t in reversed(list(enumerate([x, y]))):
        out = out + t * i
    return out


@case()
def map_filter_builtins(x, y):
    doubled = list(map(lambda t: t * 2, [x, y]))
    pos = list(filter(lambda v: v > 1, [0, 1, 2, 3]))
    return doubled[0] + doubled[1] + len(pos)


@case()
def map_two_iterables(x, y):
    return sum(map(lambda a, b: a * b, [x, y], [2, 3]))


@case()
def any_all_generators(x, y):
    dims = [4, 4]
    if all(d == 4 for d in dims) and not any(d > 4 for d in dims):
        return x + y
    return x


@case()
def tuple_of_shapes_compare(x, y):
    if x.shape == y.shape and tuple(x.shape) == (4, 4) and list(x.size()) == [4, 4]:
        return x * y
    return x


@case()
def torch_size_ops(x, y):
    s = x.shape
    s2 = s[:1] + (2, 2)
    return x.reshape(*s2).sum(-1) + y[:, :2] + len(s) + s.numel()


@case()
def list_to_tensor_indices(x, y):
    idx = [0, 2]
    return x[idx] + y[[1, 3]]


@case()
def tensor_index_with_tuple_var(x, y):
    sl = (slice(0, 2), slice(None, None, 2))
    return x[sl] + y[1:3, 0::2]


@case()
def slice_objects(x, y):
    s = slice(1, 3)
    return x[s] + y[s] + (s.stop - s.start)


@case()
def none_index_and_ellipsis(x, y):
    return x[None, :, None].sum() + y[..., None].squeeze(-1) + x[:, None, :].mean(1)


@case()
def tuple_return_from_comprehension(x, y):
    return tuple(t + 1 for t in (x, y))


@case()
def list_return_of_mixed(x, y):
    return [x + 1, 3, "s", None, (y, 2.5)]


@case()
def dict_return_nested(x, y):
    return {"a": {"b": [x + 1, {"c": y}]}, "n": 2}


@case()
def iter_next_manual(x, y):
    it = iter([x, y, x + y])
    a = next(it)
    b = next(it)
    c = next(it, None)
    d = next(it, "done")
    return a + b + c + len(d)


@case()
def chained_list_methods_on_tensors(x, y):
    rows = list(x.unbind(0))
    rows.reverse()
    return torch.stack(rows) + y


@case()
def split_into_list_and_cat(x, y):
    parts = list(torch.split(x, [1, 3], dim=0))
    parts.append(y[:1])
    return torch.cat(parts)
