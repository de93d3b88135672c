"""Decoder LLM patterns: what a ``transformers`` causal LM export holds becomes ``etvk`` ops.

Run by lower.py on every program, after the conv patterns; each rewrite
applies only where the graph is provably the op's contract (OPS.md's llm and
attention families, docs/llm_ops.md, docs/attention_ops.md), so a program
without these patterns is left as it was:

- identical calls are computed once (8da4w exports choose qparams of one
  input once per projection), and calls of constants only are evaluated now;
- ``embedding(table, ids)`` -> ``etvk.embedding``;
- ``linear(x, W, b)`` with constant float weights (and bias) -> ``etvk.linear``;
- ``x * rsqrt(mean(x^2, -1) + eps)`` [``* w``] -> ``etvk.rms_norm``;
- ``act(a) * b`` (silu, gelu, gelu tanh) -> ``etvk.act_mul``;
- attention over a static cache: ``index_copy(cache, 2, pos, k)`` ->
  ``etvk.cache_update`` (in place on a cache kept on the device), the rotary
  embedding of q and k (``x*cos + rotate_half(x)*sin`` on the heads-first
  transpose) -> ``etvk.rope`` on the token-major tensor, and
  ``scaled_dot_product_attention`` over the (repeated, for grouped-query
  attention) cache with the causal mask ``key <= position`` ->
  ``etvk.cache_attention``, whose token-major result the output projection
  reads through a view;
- float ``add`` / ``sub`` / ``mul`` of tensors (with broadcasting) or with a
  Python scalar, and a division by a power of two -> ``etvk.binary`` /
  ``etvk.scalar``;
- positions ``arange(S) + x[0]`` are the position input x itself (its values
  then must be consecutive: an input check says so), and a value computed
  from the positions alone by position-wise ops (the rotary cos and sin) is
  gathered from a table of its values at every cache position, computed now
  with the same ops (``etvk.embedding``).

Pure graph work on a `Rewriter`, no Vulkan. Used by lower.py.
"""

from __future__ import annotations

import math

import torch

from runtime.programs.cpu import run_node
from runtime.programs.input_checks import derive_input_checks
from runtime.programs.nodes import Const, InputCheck, Node, Ref, ValueSpec
from runtime.programs.rewrite import Rewriter, bind

_FLOATS = (torch.float32, torch.float16)
_ACTIVATIONS = {"aten.silu.default": "silu", "aten.gelu.default": None}
# Calls of constants only that must not be evaluated at lowering time (their values are not
# a function of their arguments).
_NOT_FOLDED = ("aten.empty", "aten.rand", "aten.randn", "aten.randint", "aten.normal",
               "aten.bernoulli", "aten.dropout", "aten.native_dropout", "aten.uniform")
_FOLD_LIMIT = 1 << 26  # elements of a folded constant


def lower_decoder_ops(rw: Rewriter) -> None:
    """Every rewrite of the module docstring, in order."""
    _deduplicate(rw)
    _fold_constants(rw)
    lengths = {c.input: c.bound for c in derive_input_checks(rw.program) if c.kind == "position"}
    _consecutive_positions(rw, lengths)
    _position_tables(rw, lengths)
    for rewrite in (_embedding, _linear, _rms_norm, _act_mul):
        for node in list(rw.program.nodes):
            if node in rw.program.nodes:
                rewrite(rw, node)
    for node in list(rw.program.nodes):
        if node.target == "aten.scaled_dot_product_attention.default" and node in rw.program.nodes:
            _attention(rw, node)
    for node in list(rw.program.nodes):
        if node in rw.program.nodes:
            _elementwise(rw, node)


# -- graph helpers ------------------------------------------------------------------------------


def _spec(rw: Rewriter, value) -> ValueSpec | None:
    """The shape and dtype of a value or constant argument; None for anything else."""
    if isinstance(value, Ref):
        return rw.program.values[value.name]
    if isinstance(value, Const):
        tensor = rw.program.constants[value.name]
        return ValueSpec(tuple(tensor.shape), tensor.dtype)
    return None


def _made_by(rw: Rewriter, value, *targets: str) -> Node | None:
    """The node that makes `value`, if it calls one of `targets`."""
    node = rw.producer(value)
    return node if node is not None and node.target in targets else None


def _replace(rw: Rewriter, old: Node, target: str, args: tuple, kwargs: dict | None = None) -> Node:
    new = Node(f"{old.name}_etvk", target, args, kwargs or {}, old.outputs)
    rw.replace(old, new)
    return new


# -- common subexpressions and constants ------------------------------------------------------


def _deduplicate(rw: Rewriter) -> None:
    """A call identical to an earlier one (same op and arguments) reads the earlier one's outputs."""
    program = rw.program
    seen: dict[str, Node] = {}
    for node in list(program.nodes):
        if not node.outputs or node.target.startswith(_NOT_FOLDED):
            continue
        key = repr((node.target, node.args, sorted(node.kwargs.items())))
        first = seen.setdefault(key, node)
        if first is not node:
            for old, new in zip(node.outputs, first.outputs, strict=True):
                program.replace_uses(old, new)
            program.nodes.remove(node)
    rw.refresh()


def _fold_constants(rw: Rewriter) -> None:
    """A call of an ``aten`` op on constants and scalars alone becomes the constant it computes."""
    program = rw.program
    for node in list(program.nodes):
        if not node.target.startswith("aten.") or node.target.startswith(_NOT_FOLDED) \
                or len(node.outputs) != 1 or node.reads() or not node.constants():
            continue
        spec = program.values[node.outputs[0]]
        if math.prod(spec.shape) > _FOLD_LIMIT:
            continue
        env: dict = {}
        run_node(node, env, program.constants)
        value = env[node.outputs[0]]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != spec.shape:
            continue
        constant = rw.add_constant(node.outputs[0], value.contiguous())
        for other in program.nodes:  # reads of the value become reads of the constant
            other.args = _swap_ref(other.args, node.outputs[0], constant)
            other.kwargs = _swap_ref(other.kwargs, node.outputs[0], constant)
        program.outputs = [constant.name if o == node.outputs[0] else o for o in program.outputs]
        program.nodes.remove(node)
        rw.refresh()


def _swap_ref(value, name: str, constant: Const):
    if isinstance(value, Ref) and value.name == name:
        return constant
    if isinstance(value, list):
        return [_swap_ref(v, name, constant) for v in value]
    if isinstance(value, tuple):
        return tuple(_swap_ref(v, name, constant) for v in value)
    if isinstance(value, dict):
        return {k: _swap_ref(v, name, constant) for k, v in value.items()}
    return value


# -- positions -----------------------------------------------------------------------------------

# Ops that act on each position alone (a value computed from positions by these alone, with
# constants, is a function of each position: a table of every position can stand for it).
_POSITIONWISE = {"aten.unsqueeze.default", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default",
                 "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.div.Tensor",
                 "aten.cat.default", "aten.neg.default", "aten.cos.default", "aten.sin.default"}


def _consecutive_positions(rw: Rewriter, lengths: dict[str, int]) -> None:
    """``arange(S) + x[0]`` (the first position, perhaps copied into a scalar buffer first) is x
    itself, for a position input x of S values that must be consecutive: its check says so."""
    program = rw.program
    for node in list(program.nodes):
        if node.target != "aten.add.Tensor" or len(node.args) != 2 or node not in program.nodes:
            continue
        for counted, offset in (node.args, node.args[::-1]):
            arange = _made_by(rw, counted, "aten.arange.default")
            copy = _made_by(rw, offset, "aten.copy.default")
            select = _made_by(rw, copy.args[1] if copy else offset, "aten.select.int")
            x = select.args[0] if select else None
            if arange is None or select is None or select.args[1:] != (0, 0) or x.name not in lengths \
                    or (copy and not (isinstance(copy.args[0], Const) and _spec(rw, copy.args[0]).shape == ()
                                      and _spec(rw, copy.args[0]).dtype == program.values[x.name].dtype)) \
                    or program.values[x.name].shape != (arange.args[0],) \
                    or program.values[node.outputs[0]] != program.values[x.name]:
                continue
            program.replace_uses(node.outputs[0], x.name)
            program.nodes.remove(node)
            program.input_checks.append(InputCheck(x.name, "consecutive", arange.args[0]))
            rw.refresh()
            break


def _position_tables(rw: Rewriter, lengths: dict[str, int]) -> None:
    """A ``[1, S, D]`` value computed from a position input x ``[S]`` and constants by
    position-wise ops alone (the rotary embedding's cos and sin) becomes a gather from the table of
    its values at every position 0..L-1, computed now with the same ops: bit for bit the same."""
    program = rw.program
    for node in list(program.nodes):
        if node.target not in ("aten.cos.default", "aten.sin.default") or node not in program.nodes:
            continue
        chain, sources = _positionwise_chain(rw, node)
        spec = program.values[node.outputs[0]]
        if len(sources) != 1 or len(spec.shape) != 3 or spec.shape[0] != 1 or spec.dtype not in _FLOATS:
            continue
        (x,) = sources
        length, positions = lengths[x], program.values[x].shape[0]
        env = {x: torch.arange(length, dtype=program.values[x].dtype)}
        try:
            for step in chain:
                run_node(step, env, program.constants)
        except (RuntimeError, IndexError):  # not shape-agnostic in the positions after all
            continue
        table = env[node.outputs[0]]
        if tuple(table.shape) != (1, length, spec.shape[2]) or spec.shape[1] != positions:
            continue
        constant = rw.add_constant(f"{node.outputs[0]}_table", table[0].contiguous())
        rows = f"{node.outputs[0]}_rows"
        program.values[rows] = ValueSpec((positions, spec.shape[2]), spec.dtype)
        index = program.nodes.index(node)
        program.nodes[index:index + 1] = [
            Node(f"{node.name}_gather", "etvk.embedding.default", (constant, Ref(x)), {}, (rows,)),
            Node(f"{node.name}_view", "aten.view.default", (Ref(rows), list(spec.shape)), {}, node.outputs)]
        rw.refresh()


def _positionwise_chain(rw: Rewriter, node: Node) -> tuple[list[Node], set[str]]:
    """The nodes `node` is computed from by position-wise ops (program order), and the program
    inputs they start from; an empty source set where anything else feeds them."""
    chain, sources, work = {}, set(), [node]
    while work:
        item = work.pop()
        if item.name in chain:
            continue
        if item.target not in _POSITIONWISE:
            return [], set()
        chain[item.name] = item
        for ref in item.reads():
            if ref in rw.program.inputs:
                sources.add(ref)
            elif ref in rw.producers:
                work.append(rw.producers[ref])
            else:
                return [], set()
    order = {n.name: i for i, n in enumerate(rw.program.nodes)}
    return sorted(chain.values(), key=lambda n: order[n.name]), sources


# -- embedding, RMSNorm, activation x up --------------------------------------------------------


def _embedding(rw: Rewriter, node: Node) -> None:
    if node.target != "aten.embedding.default":
        return
    table, ids = node.args[0], node.args[1]
    if isinstance(table, Const) and isinstance(ids, Ref) and _spec(rw, table).dtype in _FLOATS \
            and len(_spec(rw, table).shape) == 2:
        _replace(rw, node, "etvk.embedding.default", (table, ids))


def _linear(rw: Rewriter, node: Node) -> None:
    """``linear(x, W, b)``: x an fp32 / fp16 value, W a constant [N, K] of x's dtype, b None or a
    constant [N] of it."""
    if node.target != "aten.linear.default":
        return
    b = bind(node)
    x, weight, bias = b.get("input"), b.get("weight"), b.get("bias")
    if not isinstance(x, Ref) or not isinstance(weight, Const):
        return
    spec, w = rw.program.values[x.name], _spec(rw, weight)
    if spec.dtype in _FLOATS and w.dtype == spec.dtype and len(w.shape) == 2 and spec.shape \
            and w.shape[1] == spec.shape[-1] > 0 and w.shape[0] > 0 and (bias is None or (
                isinstance(bias, Const) and _spec(rw, bias) == ValueSpec((w.shape[0],), spec.dtype))):
        _replace(rw, node, "etvk.linear.default", (x, weight, bias))


def _rms_norm(rw: Rewriter, node: Node) -> None:
    """``mul(x, rsqrt(add(mean(pow(x, 2), [-1], True), eps)))`` [then ``* w``, w a [D] constant]."""
    if node.target != "aten.mul.Tensor" or len(node.args) != 2:
        return
    for x, r in (node.args, node.args[::-1]):
        rsqrt = _made_by(rw, r, "aten.rsqrt.default")
        add = rsqrt and _made_by(rw, rsqrt.args[0], "aten.add.Tensor")
        mean = add and _made_by(rw, add.args[0], "aten.mean.dim")
        square = mean and _made_by(rw, mean.args[0], "aten.pow.Tensor_Scalar")
        if not square or not isinstance(x, Ref) or square.args != (x, 2) or len(add.args) != 2 \
                or not isinstance(add.args[1], float) or bind(add).get("alpha", 1) != 1:
            continue
        spec = rw.program.values[x.name]
        dims = [d % len(spec.shape) for d in mean.args[1]] if len(mean.args) > 1 else []
        if dims != [len(spec.shape) - 1] or not bind(mean).get("keepdim") or spec.dtype not in _FLOATS \
                or bind(mean).get("dtype") is not None or spec.shape[-1] % 4:
            continue
        weight, last = None, node
        user = rw.only_user(node)
        if user is not None and user.target == "aten.mul.Tensor" and len(user.args) == 2:
            other = [a for a in user.args if a != Ref(node.outputs[0])]
            if len(other) == 1 and isinstance(other[0], Const) and \
                    _spec(rw, other[0]).shape == (spec.shape[-1],) and _spec(rw, other[0]).dtype == spec.dtype:
                weight, last = other[0], user
        if weight is not None:
            rw.program.nodes.remove(node)
            rw.refresh()
        _replace(rw, last, "etvk.rms_norm.default", (x, weight, add.args[1], 0.0))
        return


def _act_mul(rw: Rewriter, node: Node) -> None:
    """``mul(act(a), b)`` with act silu, gelu or gelu tanh and a, b of one shape -> act_mul."""
    if node.target != "aten.mul.Tensor" or len(node.args) != 2:
        return
    for gated, up in (node.args, node.args[::-1]):
        act = rw.producer(gated)
        if act is None or act.target not in _ACTIVATIONS or rw.only_user(act) is not node \
                or not isinstance(up, Ref):
            continue
        kind = _ACTIVATIONS[act.target] or {"none": "gelu", "tanh": "gelu_tanh"}.get(
            bind(act).get("approximate", "none"))
        a, spec = act.args[0], rw.program.values[up.name]
        if kind is None or not isinstance(a, Ref) or rw.program.values[a.name] != spec \
                or spec.dtype not in _FLOATS:
            continue
        rw.program.nodes.remove(act)
        rw.refresh()
        _replace(rw, node, "etvk.act_mul.default", (a, up, kind))
        return


# -- attention over the static cache ------------------------------------------------------------


def _token_major(rw: Rewriter, value) -> Ref | None:
    """The ``[B, S, H, D]`` tensor whose ``transpose(1, 2)`` `value` is, with the rotary embedding
    of `value` (on the heads-first tensor) moved onto it as an ``etvk.rope`` node; None where
    `value` is neither."""
    node = rw.producer(value)
    if node is not None and node.target == "aten.transpose.int" and sorted(node.args[1:]) == [1, 2]:
        return node.args[0] if isinstance(node.args[0], Ref) else None
    rope = _rotary(rw, node)
    if rope is None:
        return None
    x, cos, sin = rope
    source = _token_major(rw, x)
    if source is None:
        return None
    name = f"{node.outputs[0]}_tokens"
    spec = rw.program.values[source.name]
    rw.program.values[name] = spec
    rope_node = Node(f"{node.name}_rope", "etvk.rope.default", (source, cos, sin), {}, (name,))
    rw.program.nodes.insert(rw.program.nodes.index(node), rope_node)
    rw.refresh()
    return Ref(name)


def _rotary(rw: Rewriter, node: Node | None):
    """(x, cos, sin) where `node` computes ``x*unsqueeze(cos, 1) + cat(-x2, x1)*unsqueeze(sin, 1)``
    on a ``[B, H, S, D]`` x with ``[B, S, D]`` cos and sin (x1, x2: the halves of D)."""
    if node is None or node.target != "aten.add.Tensor" or len(node.args) != 2:
        return None
    for first, second in (node.args, node.args[::-1]):
        plain, turned = _made_by(rw, first, "aten.mul.Tensor"), _made_by(rw, second, "aten.mul.Tensor")
        if plain is None or turned is None:
            continue
        for x, c in (plain.args, plain.args[::-1]):
            for rotated, s in (turned.args, turned.args[::-1]):
                cat = _made_by(rw, rotated, "aten.cat.default")
                cos, sin = _unsqueezed(rw, c), _unsqueezed(rw, s)
                if cat is None or cos is None or sin is None or not isinstance(x, Ref) \
                        or bind(cat).get("dim", 0) not in (-1, 3) or len(cat.args[0]) != 2:
                    continue
                neg = _made_by(rw, cat.args[0][0], "aten.neg.default")
                high = neg and _made_by(rw, neg.args[0], "aten.slice.Tensor")
                low = _made_by(rw, cat.args[0][1], "aten.slice.Tensor")
                shape = rw.program.values[x.name].shape
                half = shape[-1] // 2 if len(shape) == 4 else -1
                if high and low and high.args[0] == x and low.args[0] == x \
                        and _slice(high, shape[-1]) == (half, shape[-1]) and _slice(low, shape[-1]) == (0, half) \
                        and rw.program.values[cos.name].shape == (shape[0], shape[2], shape[3]):
                    return x, cos, sin
    return None


def _slice(node: Node, size: int) -> tuple[int, int] | None:
    """(start, end) of a slice along the last of 4 dimensions of `size`, the end clamped to it."""
    b = bind(node)
    if b.get("dim") not in (3, -1) or b.get("step", 1) != 1:
        return None
    return b.get("start") or 0, min(b.get("end"), size)


def _unsqueezed(rw: Rewriter, value) -> Ref | None:
    node = _made_by(rw, value, "aten.unsqueeze.default")
    return node.args[0] if node is not None and node.args[1] == 1 and isinstance(node.args[0], Ref) else None


def _repeated_cache(rw: Rewriter, value) -> Ref | None:
    """The cache `value` reads: itself, or the cache whose kv heads it repeats for grouped-query
    attention (``reshape(expand(unsqueeze(cache, 2)))``)."""
    reshape = _made_by(rw, value, "aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")
    expand = reshape and _made_by(rw, reshape.args[0], "aten.expand.default")
    unsqueeze = expand and _made_by(rw, expand.args[0], "aten.unsqueeze.default")
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
    return _replace(rw, rw.producer(cache), "etvk.cache_update.default", (node.args[0], node.args[2], value))


def _causal_positions(rw: Rewriter, mask, length: int) -> Ref | None:
    """P where `mask` is ``expand(le(keys, unsqueezed P))``: key j visible to query i iff j <= P[i],
    keys ``arange(length)`` (plus 0)."""
    expand = _made_by(rw, mask, "aten.expand.default")
    le = _made_by(rw, expand.args[0] if expand else mask, "aten.le.Tensor")
    if le is None:
        return None
    keys, queries = (_squeezed(rw, a) for a in le.args)
    add = _made_by(rw, keys, "aten.add.Tensor")
    arange = _made_by(rw, add.args[0] if add and add.args[1] == 0 else keys, "aten.arange.default")
    if arange is None or arange.args[:1] != (length,) or not isinstance(queries, Ref):
        return None
    return queries


def _squeezed(rw: Rewriter, value):
    """What `value` is ``unsqueeze`` s of (itself when it is none)."""
    while (node := _made_by(rw, value, "aten.unsqueeze.default")) is not None:
        value = node.args[0]
    return value


def _attention(rw: Rewriter, sdpa: Node) -> None:
    b = bind(sdpa)
    if b.get("dropout_p", 0.0) != 0.0 or b.get("is_causal") or b.get("enable_gqa") \
            or not all(isinstance(b[k], Ref) for k in ("query", "key", "value", "attn_mask")):
        return
    caches = [_repeated_cache(rw, b[k]) for k in ("key", "value")]
    if None in caches:
        return
    q_shape = rw.program.values[b["query"].name].shape
    length = rw.program.values[caches[0].name].shape[2]
    positions = _causal_positions(rw, b["attn_mask"], length)
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
    attention = Node(f"{sdpa.name}_etvk", "etvk.cache_attention.default",
                     (query, Ref(updates[0].outputs[0]), Ref(updates[1].outputs[0]), positions, scale),
                     {}, out.outputs)
    rw.program.nodes[rw.program.nodes.index(out)] = attention
    rw.refresh()


# -- elementwise ----------------------------------------------------------------------------------


_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul"}
_SCALAR = {"aten.add.Tensor": "add", "aten.mul.Tensor": "mul"}


def _elementwise(rw: Rewriter, node: Node) -> None:
    """Float add / sub / mul of a tensor with a tensor that broadcasts to its shape (the larger
    one first: add and mul commute), or with a Python scalar (add, mul)."""
    if node.target == "aten.div.Tensor" and len(node.args) == 2 and isinstance(node.args[1], (int, float)) \
            and _exact_reciprocal(node.args[1]) and isinstance(node.args[0], Ref) and \
            rw.program.values[node.args[0].name] == rw.program.values[node.outputs[0]] and \
            rw.program.values[node.outputs[0]].dtype in _FLOATS and bind(node).get("rounding_mode") is None:
        # x / 2^k is x * 2^-k exactly (a logits scaling)
        _replace(rw, node, "etvk.scalar.default", (node.args[0], 1.0 / node.args[1], "mul"))
        return
    if node.target not in _BINARY or len(node.args) != 2 or bind(node).get("alpha", 1) != 1:
        return
    out = rw.program.values[node.outputs[0]]
    a, b = node.args
    if out.dtype not in _FLOATS:
        return
    if isinstance(b, (int, float)) and not isinstance(b, bool) and node.target in _SCALAR and \
            isinstance(a, Ref) and rw.program.values[a.name] == out:
        _replace(rw, node, "etvk.scalar.default", (a, float(b), _SCALAR[node.target]))
        return
    specs = [_spec(rw, a), _spec(rw, b)]
    if None in specs or any(s.dtype != out.dtype for s in specs):
        return
    if specs[0].shape != out.shape and node.target != "aten.sub.Tensor":
        a, b, specs = b, a, specs[::-1]
    if specs[0].shape == out.shape and isinstance(a, Ref):
        _replace(rw, node, "etvk.binary.default", (a, b, _BINARY[node.target]))


def _exact_reciprocal(value) -> bool:
    """Whether dividing by `value` is multiplying by its reciprocal exactly: a power of two whose
    reciprocal is a normal fp16 number (so also fp32)."""
    if isinstance(value, bool) or not value or not math.isfinite(value):
        return False
    mantissa, exponent = math.frexp(abs(value))
    return mantissa == 0.5 and -13 <= exponent - 1 <= 14
