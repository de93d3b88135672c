"""Decoder LLM patterns: what a ``transformers`` causal LM export holds becomes ``etvk`` ops.

Run by lower.py on every program, after the conv patterns; each rewrite
applies only where the graph is provably the op's contract (OPS.md's llm and
attention families, docs/llm_ops.md, docs/attention_ops.md), so a program
without these patterns is left as it was:

- identical calls are computed once (8da4w exports choose qparams of one
  input once per projection), and calls of constants only are evaluated now;
- a fused 8da4w projection read only through slices of its last dimension
  (Phi-3's qkv and gate/up) -> one ``etvk.linear_qta8a_qga4w`` per slice over
  the rows of its constants, sharing the input's quantize;
- ``embedding(table, ids)`` -> ``etvk.embedding``;
- ``linear(x, W, b)`` with constant float weights (and bias) -> ``etvk.linear``;
- ``x * rsqrt(mean(x^2, -1) + eps)`` [``* w``] -> ``etvk.rms_norm``, in half precision
  with the casts around it (x widened to fp32, the result narrowed back before ``* w``:
  Llama's fp16 form) -> one fp16 ``etvk.rms_norm``;
- ``layer_norm(x, [D], w, b, eps)`` over the last dimension -> ``etvk.layer_norm``;
- ``act(a) * b`` (silu, gelu, gelu tanh) -> ``etvk.act_mul``;
- the other casts between fp32 and fp16 (Gemma's RMSNorm in fp32, a quantized linear's fp32
  result made fp16) -> ``etvk.cast``;
- attention over a static cache: ``index_copy(cache, 2, pos, k)`` ->
  ``etvk.cache_update`` (in place on a cache kept on the device), the rotary
  embedding of q and k (``x*cos + rotate_half(x)*sin`` on the heads-first
  transpose, or on its first R values with the rest concatenated: partial
  rotary) -> ``etvk.rope`` on the token-major tensor, and
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

The attention patterns live in lower_attention.py, the positions' in
lower_positions.py, the split of fused projections in split_linears.py. Pure graph work on a `Rewriter`, no Vulkan. Used by
lower.py.
"""

from __future__ import annotations

import math

import torch

from runtime.programs.cpu import run_node
from runtime.programs.input_checks import derive_input_checks
from runtime.programs.lower_attention import lower_attention
from runtime.programs.lower_positions import consecutive_positions, position_tables
from runtime.programs.nodes import Const, Node, Ref, ValueSpec
from runtime.programs.rewrite import FLOATS, Rewriter, bind, float_cast
from runtime.programs.split_linears import split_fused_linears

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
    split_fused_linears(rw)
    lengths = {c.input: c.bound for c in derive_input_checks(rw.program) if c.kind == "position"}
    consecutive_positions(rw, lengths)
    position_tables(rw, lengths)
    for rewrite in (_embedding, _linear, _rms_norm, _layer_norm, _act_mul, _cast):
        for node in list(rw.program.nodes):
            if node in rw.program.nodes:
                rewrite(rw, node)
    for node in list(rw.program.nodes):
        if node.target == "aten.scaled_dot_product_attention.default" and node in rw.program.nodes:
            lower_attention(rw, node)
    for node in list(rw.program.nodes):
        if node in rw.program.nodes:
            _elementwise(rw, node)


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


# -- embedding, RMSNorm, activation x up --------------------------------------------------------


def _embedding(rw: Rewriter, node: Node) -> None:
    if node.target != "aten.embedding.default":
        return
    table, ids = node.args[0], node.args[1]
    if isinstance(table, Const) and isinstance(ids, Ref) and rw.value_spec(table).dtype in FLOATS \
            and len(rw.value_spec(table).shape) == 2:
        rw.replace_call(node, "etvk.embedding.default", (table, ids))


def _linear(rw: Rewriter, node: Node) -> None:
    """``linear(x, W, b)``: x an fp32 / fp16 value, W a constant [N, K] of x's dtype, b None or a
    constant [N] of it."""
    if node.target != "aten.linear.default":
        return
    b = bind(node)
    x, weight, bias = b.get("input"), b.get("weight"), b.get("bias")
    if not isinstance(x, Ref) or not isinstance(weight, Const):
        return
    spec, w = rw.program.values[x.name], rw.value_spec(weight)
    if spec.dtype in FLOATS and w.dtype == spec.dtype and len(w.shape) == 2 and spec.shape \
            and w.shape[1] == spec.shape[-1] > 0 and w.shape[0] > 0 and (bias is None or (
                isinstance(bias, Const) and rw.value_spec(bias) == ValueSpec((w.shape[0],), spec.dtype))):
        rw.replace_call(node, "etvk.linear.default", (x, weight, bias))


def _rms_norm(rw: Rewriter, node: Node) -> None:
    """``mul(x, rsqrt(add(mean(pow(x, 2), [-1], True), eps)))`` [then ``* w``, w a [D] constant];
    in half precision the Llama form ``mul(w, cast16(that of cast32(x)))`` (x, w fp16: the fp16
    op computes in fp32 and rounds at those points) becomes one fp16 rms_norm."""
    if node.target != "aten.mul.Tensor" or len(node.args) != 2:
        return
    for x, r in (node.args, node.args[::-1]):
        rsqrt = rw.made_by(r, "aten.rsqrt.default")
        add = rsqrt and rw.made_by(rsqrt.args[0], "aten.add.Tensor")
        mean = add and rw.made_by(add.args[0], "aten.mean.dim")
        square = mean and rw.made_by(mean.args[0], "aten.pow.Tensor_Scalar")
        if not square or not isinstance(x, Ref) or square.args != (x, 2) or len(add.args) != 2 \
                or not isinstance(add.args[1], float) or bind(add).get("alpha", 1) != 1:
            continue
        spec = rw.program.values[x.name]
        dims = [d % len(spec.shape) for d in mean.args[1]] if len(mean.args) > 1 else []
        if dims != [len(spec.shape) - 1] or not bind(mean).get("keepdim") or spec.dtype not in FLOATS \
                or bind(mean).get("dtype") is not None or spec.shape[-1] % 4:
            continue
        passed = [node]  # the nodes the op replaces before `last`
        widened = float_cast(rw, rw.producer(x))
        narrowed = float_cast(rw, rw.only_user(node))
        if widened is not None and narrowed is not None and narrowed[1] == rw.program.values[widened[0].name].dtype:
            x, spec = widened[0], rw.program.values[widened[0].name]
            passed.append(rw.only_user(node))
        weight, last = None, passed.pop()
        user = rw.only_user(last)
        if user is not None and user.target == "aten.mul.Tensor" and len(user.args) == 2:
            other = [a for a in user.args if a != Ref(last.outputs[0])]
            if len(other) == 1 and isinstance(other[0], Const) and \
                    rw.value_spec(other[0]).shape == (spec.shape[-1],) and rw.value_spec(other[0]).dtype == spec.dtype:
                passed.append(last)
                weight, last = other[0], user
        for unread in passed[::-1]:  # what only the op's last node read
            rw.program.nodes.remove(unread)
        rw.refresh()
        rw.replace_call(last, "etvk.rms_norm.default", (x, weight, add.args[1], 0.0))
        return


def _layer_norm(rw: Rewriter, node: Node) -> None:
    """``layer_norm(x, [D], w, b, eps)`` over the last dimension of a float x (D % 4 == 0), w and
    b [D] constants of x's dtype or None -> ``etvk.layer_norm``."""
    if node.target != "aten.layer_norm.default" or len(node.outputs) != 1:
        return
    b = bind(node)
    x = b.get("input")
    spec = rw.program.values.get(x.name) if isinstance(x, Ref) else None
    if spec is None or spec.dtype not in FLOATS or not spec.shape or spec.shape[-1] % 4 \
            or list(b.get("normalized_shape", ())) != [spec.shape[-1]]:
        return
    params = [b.get("weight"), b.get("bias")]
    if not all(p is None or (isinstance(p, Const) and rw.value_spec(p) == ValueSpec((spec.shape[-1],), spec.dtype))
               for p in params):
        return
    rw.replace_call(node, "etvk.layer_norm.default", (x, *params, float(b.get("eps", 1e-5))))


def _cast(rw: Rewriter, node: Node) -> None:
    """A cast of a value between fp32 and fp16 (``_to_copy``, ``to.dtype``, ``type_as``) ->
    ``etvk.cast``."""
    found = float_cast(rw, node)
    if found is not None:
        rw.replace_call(node, "etvk.cast.default", found)


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
                or spec.dtype not in FLOATS:
            continue
        rw.program.nodes.remove(act)
        rw.refresh()
        rw.replace_call(node, "etvk.act_mul.default", (a, up, kind))
        return


# -- elementwise ----------------------------------------------------------------------------------


_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul"}
_SCALAR = {"aten.add.Tensor": "add", "aten.mul.Tensor": "mul"}


def _elementwise(rw: Rewriter, node: Node) -> None:
    """Float add / sub / mul of a tensor with a tensor that broadcasts to its shape (the larger
    one first: add and mul commute), or with a Python scalar (add, mul)."""
    if node.target == "aten.div.Tensor" and len(node.args) == 2 and isinstance(node.args[1], (int, float)) \
            and _exact_reciprocal(node.args[1]) and isinstance(node.args[0], Ref) and \
            rw.program.values[node.args[0].name] == rw.program.values[node.outputs[0]] and \
            rw.program.values[node.outputs[0]].dtype in FLOATS and bind(node).get("rounding_mode") is None:
        # x / 2^k is x * 2^-k exactly (a logits scaling)
        rw.replace_call(node, "etvk.scalar.default", (node.args[0], 1.0 / node.args[1], "mul"))
        return
    if node.target not in _BINARY or len(node.args) != 2 or bind(node).get("alpha", 1) != 1:
        return
    out = rw.program.values[node.outputs[0]]
    a, b = node.args
    if out.dtype not in FLOATS:
        return
    if isinstance(b, (int, float)) and not isinstance(b, bool) and node.target in _SCALAR and \
            isinstance(a, Ref) and rw.program.values[a.name] == out:
        rw.replace_call(node, "etvk.scalar.default", (a, float(b), _SCALAR[node.target]))
        return
    specs = [rw.value_spec(a), rw.value_spec(b)]
    if None in specs or any(s.dtype != out.dtype for s in specs):
        return
    if specs[0].shape != out.shape and node.target != "aten.sub.Tensor":
        a, b, specs = b, a, specs[::-1]
    if specs[0].shape == out.shape and isinstance(a, Ref):
        rw.replace_call(node, "etvk.binary.default", (a, b, _BINARY[node.target]))


def _exact_reciprocal(value) -> bool:
    """Whether dividing by `value` is multiplying by its reciprocal exactly: a power of two whose
    reciprocal is a normal fp16 number (so also fp32)."""
    if isinstance(value, bool) or not value or not math.isfinite(value):
        return False
    mantissa, exponent = math.frexp(abs(value))
    return mantissa == 0.5 and -13 <= exponent - 1 <= 14
