"""Attention over a static KV cache: the pattern a ``transformers`` decoder export holds, as ops.

``index_copy(cache, 2, pos, k)`` becomes ``etvk.cache_update`` (in place on
a cache kept on the device); the rotary embedding of q and k (``x*cos +
rotate_half(x)*sin`` on the heads-first transpose, or its partial form: that
of the first R values of each head, the rest concatenated after it) becomes
``etvk.rope`` on the token-major tensor; ``scaled_dot_product_attention``
over the (repeated, for grouped-query attention) cache with the causal mask
``key <= position`` (and a sliding window's ``key > position - W``) becomes
``etvk.cache_attention``, whose token-major
result the output projection reads through a view. Only where every piece
matches (docs/llm_ops.md, docs/attention_ops.md). Pure graph work; used by
lower_decoder.py.
"""

from __future__ import annotations

import math

import torch

from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.rewrite import Rewriter, bind, slice_range

# Ops of each head's rows alone, which commute with the heads-first transpose: an RMSNorm of the
# last dimension, and the casts a half-precision Gemma 3 puts around it (its norms in fp32).
_ROW_WISE = ("etvk.rms_norm.default", "etvk.cast.default")


def _token_major(rw: Rewriter, value) -> Ref | None:
    """The ``[B, S, H, D]`` tensor whose ``transpose(1, 2)`` `value` is, with the rotary embedding
    of `value` (on the heads-first tensor) moved onto it as an ``etvk.rope`` node, and an
    ``etvk.rms_norm`` or ``etvk.cast`` of each head's rows (`_ROW_WISE`: Gemma 3's q and k norms
    after the transpose) as one on it; None where `value` is none of those."""
    node = rw.producer(value)
    if node is not None and node.target == "aten.transpose.int" and sorted(node.args[1:]) == [1, 2]:
        return node.args[0] if isinstance(node.args[0], Ref) else None
    if node is not None and node.target in _ROW_WISE:
        source = _token_major(rw, node.args[0])
        return None if source is None else _moved(rw, node, (source, *node.args[1:]), source)
    rope = _rotary(rw, node)
    if rope is None:
        return None
    x, cos, sin = rope
    source = _token_major(rw, x)
    if source is None:
        return None
    return _moved(rw, node, (source, cos, sin), source, "etvk.rope.default", "_rope")


def _moved(rw: Rewriter, node: Node, args: tuple, source: Ref, target: str | None = None,
           suffix: str = "_tokens") -> Ref:
    """A `target` (default: `node`'s) node of `args` on the token-major `source`, named `node`'s
    name and `suffix`, inserted before `node`, which stays for its other readers; its output
    (``<node's output>_tokens``), of `source`'s shape and `node`'s output's dtype (a cast's)."""
    name = f"{node.outputs[0]}_tokens"
    rw.program.values[name] = ValueSpec(rw.program.values[source.name].shape,
                                        rw.program.values[node.outputs[0]].dtype)
    moved = Node(f"{node.name}{suffix}", target or node.target, args, dict(node.kwargs), (name,))
    rw.program.nodes.insert(rw.program.nodes.index(node), moved)
    rw.refresh()
    return Ref(name)


def _rotary(rw: Rewriter, node: Node | None):
    """(x, cos, sin) where `node` computes the rotary embedding of a ``[B, H, S, D]`` x with
    ``[B, S, R]`` cos and sin: ``x*unsqueeze(cos, 1) + rotate_half(x)*unsqueeze(sin, 1)`` (R =
    D), or the partial form ``cat(r*cos + rotate_half(r)*sin, x[..., R:])`` (the same on r,
    the first R values of each head: ``x[..., :R]``, or an alias of x where R = D)."""
    if node is not None and node.target == "aten.cat.default" and len(node.args[0]) == 2 \
            and bind(node)["dim"] in (-1, 3):
        rotated, tail = node.args[0]
        found = _half_rotation(rw, rw.producer(rotated))
        passed = rw.made_by(tail, "aten.slice.Tensor")
        if found is None or passed is None:
            return None
        r, cos, sin = found
        head = _head_start(rw, r)
        if head is None or head[0] != passed.args[0]:
            return None
        x, rotary = head
        size = rw.program.values[x.name].shape[-1]
        return (x, cos, sin) if slice_range(passed, size, 4) == (rotary, size) else None
    return _half_rotation(rw, node)


def _head_start(rw: Rewriter, value: Ref) -> tuple[Ref, int] | None:
    """(x, R) where `value` is ``x[..., :R]`` of a 4-D x, or an alias of x (R = D)."""
    node = rw.made_by(value, "aten.slice.Tensor", "aten.alias.default")
    if node is None or not isinstance(node.args[0], Ref):
        return None
    size = rw.program.values[node.args[0].name].shape[-1]
    if node.target == "aten.alias.default":
        return node.args[0], size
    rows = slice_range(node, size, 4)
    return (node.args[0], rows[1]) if rows is not None and rows[0] == 0 else None


def _half_rotation(rw: Rewriter, node: Node | None):
    """(x, cos, sin) where `node` computes ``x*unsqueeze(cos, 1) + cat(-x2, x1)*unsqueeze(sin, 1)``
    on a ``[B, H, S, R]`` x with ``[B, S, R]`` cos and sin, R even (x1, x2: the halves of R)."""
    if node is None or node.target != "aten.add.Tensor" or len(node.args) != 2:
        return None
    for first, second in (node.args, node.args[::-1]):
        plain, turned = rw.made_by(first, "aten.mul.Tensor"), rw.made_by(second, "aten.mul.Tensor")
        if plain is None or turned is None:
            continue
        for x, c in (plain.args, plain.args[::-1]):
            for rotated, s in (turned.args, turned.args[::-1]):
                cat = rw.made_by(rotated, "aten.cat.default")
                cos, sin = _unsqueezed(rw, c), _unsqueezed(rw, s)
                if cat is None or cos is None or sin is None or not isinstance(x, Ref) \
                        or bind(cat).get("dim", 0) not in (-1, 3) or len(cat.args[0]) != 2:
                    continue
                neg = rw.made_by(cat.args[0][0], "aten.neg.default")
                high = neg and rw.made_by(neg.args[0], "aten.slice.Tensor")
                low = rw.made_by(cat.args[0][1], "aten.slice.Tensor")
                shape = rw.program.values[x.name].shape
                if len(shape) != 4 or shape[-1] % 2 or not (high and low and high.args[0] == x
                                                            and low.args[0] == x):
                    continue
                half = shape[-1] // 2
                if slice_range(high, shape[-1], 4) == (half, shape[-1]) \
                        and slice_range(low, shape[-1], 4) == (0, half) \
                        and rw.program.values[cos.name].shape == (shape[0], shape[2], shape[3]):
                    return x, cos, sin
    return None


def _unsqueezed(rw: Rewriter, value) -> Ref | None:
    node = rw.made_by(value, "aten.unsqueeze.default")
    return node.args[0] if node is not None and node.args[1] == 1 and isinstance(node.args[0], Ref) else None


def _repeated_cache(rw: Rewriter, value) -> Ref | None:
    """The cache `value` reads: itself, or the cache whose kv heads it repeats for grouped-query
    attention (``reshape(expand(unsqueeze(cache, 2)))``)."""
    reshape = rw.made_by(value, "aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")
    expand = reshape and rw.made_by(reshape.args[0], "aten.expand.default")
    unsqueeze = expand and rw.made_by(expand.args[0], "aten.unsqueeze.default")
    if unsqueeze is not None and unsqueeze.args[1] == 2:
        cache = unsqueeze.args[0]
        shape = rw.program.values[cache.name].shape
        repeated = rw.program.values[value.name].shape
        if len(shape) == 4 and repeated[0] == shape[0] and repeated[2:] == shape[2:] \
                and repeated[1] % shape[1] == 0:
            return cache
    return value if isinstance(value, Ref) else None


def _cache_update(rw: Rewriter, cache: Ref) -> Node | None:
    """The ``index_copy(state, 2, positions, x)`` that makes `cache`, rewritten as
    ``etvk.cache_update(state, positions, token-major x)``; None where it is not one."""
    node = rw.producer(cache)
    if node is not None and node.target == "etvk.cache_update.default":
        return node
    if node is None or node.target != "aten.index_copy.default" or node.args[1] != 2 \
            or not isinstance(node.args[0], Ref) or node.args[0].name not in rw.program.state:
        return None
    value = _token_major(rw, node.args[3])
    if value is None:
        return None
    return rw.replace_call(rw.producer(cache), "etvk.cache_update.default", (node.args[0], node.args[2], value))


_BOOL_CASTS = ("aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default")


def _causal_positions(rw: Rewriter, mask, length: int) -> tuple[Ref, int] | None:
    """(P, W) where `mask` is ``expand(le(keys, unsqueezed P))``: key j visible to query i iff
    j <= P[i], keys ``arange(length)`` (plus 0), W = 0; or that ANDed with a sliding window
    ``gt(keys, P - W)`` (j > P[i] - W), W < `length` (a window of at least `length` keys
    changes nothing for positions inside the cache, which the input checks keep them in: W =
    0). All-true ``new_ones`` ANDed to it change nothing."""
    expand = rw.made_by(mask, "aten.expand.default")
    leaves = _conjuncts(rw, expand.args[0] if expand else mask)
    causal = [n for n in leaves if n.target == "aten.le.Tensor"]
    if len(causal) != 1:
        return None
    le = causal[0]
    windows = []
    for other in leaves:
        if other is le or (other.target == "aten.new_ones.default" and other.kwargs.get("dtype") == torch.bool):
            continue
        window = _window(rw, other, le)
        if window is None:
            return None
        windows.append(window)
    if len(windows) > 1:
        return None
    keys, queries = (_squeezed(rw, a) for a in le.args)
    add = rw.made_by(keys, "aten.add.Tensor")
    arange = rw.made_by(add.args[0] if add and add.args[1] == 0 else keys, "aten.arange.default")
    if arange is None or arange.args[:1] != (length,) or not isinstance(queries, Ref):
        return None
    return queries, (windows[0] if windows and windows[0] < length else 0)


def _conjuncts(rw: Rewriter, value) -> list[Node]:
    """The nodes a boolean mask ANDs together (through casts to bool); [] where one is missing."""
    node = rw.producer(value)
    while node is not None and node.target in _BOOL_CASTS:
        node = rw.producer(node.args[0])
    if node is None:
        return []
    if node.target == "aten.__and__.Tensor":
        parts = [_conjuncts(rw, a) for a in node.args]
        return [] if [] in parts else parts[0] + parts[1]
    return [node]


def _window(rw: Rewriter, node: Node, causal: Node) -> int | None:
    """W where `node` is ``gt(keys, queries - W)`` on `causal`'s (``le(keys, queries)``) keys
    and queries, W >= 1 a Python int; None where it is not."""
    if node.target != "aten.gt.Tensor" or node.args[0] != causal.args[0]:
        return None
    shifted = rw.made_by(node.args[1], "aten.sub.Tensor")
    if shifted is None or shifted.args[0] != causal.args[1] or not isinstance(shifted.args[1], int) \
            or shifted.args[1] < 1 or bind(shifted).get("alpha", 1) != 1:
        return None
    return shifted.args[1]


def _squeezed(rw: Rewriter, value):
    """What `value` is ``unsqueeze`` s of (itself when it is none)."""
    while (node := rw.made_by(value, "aten.unsqueeze.default")) is not None:
        value = node.args[0]
    return value


def lower_attention(rw: Rewriter, sdpa: Node) -> None:
    """`sdpa` (a ``scaled_dot_product_attention`` node) and the cache writes and rotary
    embeddings it reads, as etvk ops, where they match (module docstring)."""
    b = bind(sdpa)
    if b.get("dropout_p", 0.0) != 0.0 or b.get("is_causal") or b.get("enable_gqa") \
            or not all(isinstance(b[k], Ref) for k in ("query", "key", "value", "attn_mask")):
        return
    caches = [_repeated_cache(rw, b[k]) for k in ("key", "value")]
    if None in caches:
        return
    q_shape = rw.program.values[b["query"].name].shape
    length = rw.program.values[caches[0].name].shape[2]
    found = _causal_positions(rw, b["attn_mask"], length)
    positions, window = found if found is not None else (None, 0)
    if positions is not None and rw.program.values[positions.name].shape != (q_shape[2],):
        return
    out = rw.only_user(sdpa)
    if out is not None and out.target in ("aten.reshape.default", "aten.view.default") and \
            rw.program.values[out.outputs[0]].shape == q_shape:
        out = rw.only_user(out)  # a reshape to its own shape
    if positions is None or out is None or out.target != "aten.transpose.int" \
            or sorted(out.args[1:]) != [1, 2] or len(q_shape) != 4:
        return
    query = _token_major(rw, b["query"])
    updates = [_cache_update(rw, c) for c in caches]
    if query is None or None in updates:
        return
    scale = b.get("scale")
    scale = 1.0 / math.sqrt(q_shape[-1]) if scale is None else float(scale)
    args = (query, Ref(updates[0].outputs[0]), Ref(updates[1].outputs[0]), positions, scale)
    attention = Node(f"{sdpa.name}_etvk", "etvk.cache_attention.default", args + ((window,) if window else ()),
                     {}, out.outputs)
    rw.program.nodes[rw.program.nodes.index(out)] = attention
    rw.refresh()
