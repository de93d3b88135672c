"""Fusions of lowered ``etvk`` ops into one dispatch, after the decoder, torchao and CNN lowerings.

An 8da4w decoder quantizes the input of each linear per token: the output of an RMSNorm
(before q/k/v, before the MLP, before the lm_head) and of the MLP's activation x up (before
the down projection); and each RMSNorm but the first reads a residual add. `fuse_decoder_ops`
rewrites, in this order,

- ``etvk.rms_norm(x, w, eps, o)`` -> y, ``etvk.quantize_affine_per_token_dynamic(y, e)``
  -> (q, s, z) into ``etvk.rms_norm_quantize(x, w, eps, o, e)`` -> (q, s, z);
- ``etvk.act_mul(g, u, a)`` -> y, ``etvk.quantize_affine_per_token_dynamic(y, e)`` -> (q, s, z)
  into ``etvk.act_mul_quantize(g, u, a, e)`` -> (q, s, z);

where y is fp32 (the fused ops take fp32 only; the quantize takes fp16 too) and the quantize is
y's only reader (not a program output, not a state's new value either),
directly or through reshapes that keep y's shape (the final norm's ``alias``), each read only
by the next: the fused ops do not write y (docs/llm_ops.md). The fused node sits at the
quantize's place. Then

- ``etvk.binary(a, b, "add")`` -> x (a and b of x's shape), ``etvk.rms_norm_quantize(x, ...)``
  -> (q, s, z) into ``etvk.add_rms_norm_quantize(a, b, ...)`` -> (x, q, s, z), at the add's
  place: the fused op writes x too, so x may have other readers (the next residual add).

Last, the rotary embeddings and cache writes of an attention layer, found from the
``etvk.cache_attention(rq, kc', vc', ...)`` that reads them:

- ``etvk.rope(q, cos, sin)`` -> rq, ``etvk.rope(k, cos, sin)`` -> rk,
  ``etvk.cache_update(kc, p, rk)`` -> kc', ``etvk.cache_update(vc, p, v)`` -> vc' into
  ``etvk.rope_cache_update(q, k, v, cos, sin, kc, vc, p)`` -> (rq, kc', vc') (the caches
  written in place, as cache_update writes them), at the first of the four's place;

where both ropes take the same cos and sin, both writes the same positions, rk has no other
reader (not a program output, not a state's new value either: the fused op does not return
it), every argument is made before that place, no other node reads kc or vc at or after it,
and q and k share batch, token count and head dim, v has k's shape and the caches one shape
(what the fused op checks beyond the four ops).

In a CNN, ``fuse_concat_tables`` gives a ``q8ta_channel_lut`` that reads a ``q8ta_concat``'s
output (DenseNet's layers: the raw concat of the block's features, which the next layer's
concat reads too, and the layer's batch norm, relu and quantize as tables, lower_lut.py) the
concat's dispatch:

- ``etvk.q8ta_concat(a, ..., output_zero_point)`` -> c, ``etvk.q8ta_channel_lut(c, table)``
  -> y into ``etvk.q8ta_concat_channel_lut(a, ..., output_zero_point, table)`` -> (c, y), at
  the concat's place (the concat's other readers read c, the table op's readers y);

- ``etvk.q8ta_concat(a, ...)`` -> c, ``etvk.q8ta_channel_lut(c, table, sums, sums_table)`` -> y
  (DenseNet's layers after a transition: the pooled channels first, as window sums) into
  ``etvk.q8ta_concat_channel_lut(a, ..., table, sums, sums_table)`` -> (c, y) likewise;

where the table op has x and a constant table (made before any node), no layout argument (its
output then takes x's layout, as both of the fused op's do), and window sums, if any, made
before the concat, with a constant table and a multiple of 4 channels (the fused op's check:
y's word c4 + Cs / 4 is c's word c4); the concat no keyword arguments, and c and y one layout.
The fused op's table check, ``[C_a + C_b, 256]``, is the table op's ``[C_x, 256]``, its sums
checks the table op's. It runs after the common calls are merged (lower_decoder.py:
the growing cats of a dense block emit their earlier layers' concats again, and those merge
with the earlier ones only while those are still plain concats).

Each fused op is bit-exact against the ops it replaces on the device, and its argument checks
are theirs (the quantize's input with a last dimension that is a multiple of 4 included; fp32
checked here; rope_cache_update's extra ones checked here), so the rewrites change no result.
Everything else is left as it was. Pure graph work on a `Rewriter`, no Vulkan; called by
lower.py once the quantize ops exist.
"""

from __future__ import annotations

import torch

from runtime.programs.nodes import Const, Node, Ref
from runtime.programs.rewrite import Rewriter, bind

QUANTIZE = "etvk.quantize_affine_per_token_dynamic.default"
# the float op -> its fused op (with the quantize's eps as the last argument)
FUSED = {"etvk.rms_norm.default": "etvk.rms_norm_quantize.default",
         "etvk.act_mul.default": "etvk.act_mul_quantize.default"}
ADD_NORM = "etvk.add_rms_norm_quantize.default"
ROPE, CACHE_UPDATE = "etvk.rope.default", "etvk.cache_update.default"
ROPE_CACHE_UPDATE = "etvk.rope_cache_update.default"
CHANNEL_LUT, CONCAT = "etvk.q8ta_channel_lut.default", "etvk.q8ta_concat.default"
CONCAT_LUT = "etvk.q8ta_concat_channel_lut.default"
# Reshapes (a view of the same buffer on the device); one to the shape its input has is the
# same values.
_VIEWS = ("aten.alias.default", "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")


def fuse_decoder_ops(rw: Rewriter) -> None:
    """The rewrites of the module docstring, in its order."""
    _fuse_quantized_inputs(rw)
    _fuse_residual_adds(rw)
    _fuse_rope_cache_writes(rw)


def _fuse_quantized_inputs(rw: Rewriter) -> None:
    """Every rms_norm / act_mul whose only reader is a quantize_affine_per_token_dynamic
    becomes one fused node with it."""
    program = rw.program
    for quantize in [n for n in program.nodes if n.target == QUANTIZE]:
        b = bind(quantize)
        found = _source(rw, b["input"], quantize)
        if found is None or rw.value_spec(b["input"]).dtype != torch.float32:
            continue
        producer, between = found
        args = (*bind(producer).values(), b["eps"])  # every argument in schema order
        fused = Node(producer.name, FUSED[producer.target], args, {}, quantize.outputs)
        for node in (producer, *between):
            program.nodes.remove(node)
            del program.values[node.outputs[0]]
        rw.replace(quantize, fused)


def _source(rw: Rewriter, value, quantize: Node) -> tuple[Node, list[Node]] | None:
    """(the rms_norm or act_mul node, the views between) where `value`, the quantize's input,
    is that node's output or a view of it of the same shape (an ``alias`` or a reshape to
    the shape it has: the same values), each value on the way read only by the next node."""
    reader, between = quantize, []
    while isinstance(value, Ref) and _read_only_by(rw, value.name, reader):
        node = rw.producer(value)
        if node is not None and node.target in FUSED:
            return node, between
        if node is None or node.target not in _VIEWS or not isinstance(node.args[0], Ref) \
                or rw.program.values[node.args[0].name] != rw.program.values[value.name]:
            return None
        reader, value = node, node.args[0]
        between.append(node)
    return None


def _read_only_by(rw: Rewriter, name: str, node: Node) -> bool:
    """Whether `node` is the one reader of value `name`: no other node, not a program output,
    not what a state value becomes."""
    program = rw.program
    return (rw.users.get(name, []) == [node] and name not in program.outputs
            and name not in program.state_updates.values())


def _fuse_residual_adds(rw: Rewriter) -> None:
    """Every rms_norm_quantize of a same-shape binary add becomes one add_rms_norm_quantize
    node at the add's place (its other arguments already made there)."""
    program = rw.program
    for norm in [n for n in program.nodes if n.target == FUSED["etvk.rms_norm.default"]]:
        b = bind(norm)
        add = rw.made_by(b["x"], "etvk.binary.default")
        if add is None:
            continue
        a = bind(add)
        spec = program.values[b["x"].name]
        if a["operation"] != "add" or any(rw.value_spec(t) != spec for t in (a["a"], a["b"])) \
                or not _made_before(rw, b["weight"], add):
            continue
        args = (a["a"], a["b"], b["weight"], b["eps"], b["weight_offset"], b["quant_eps"])
        program.nodes.remove(norm)
        rw.replace(add, Node(add.name, ADD_NORM, args, {}, (*add.outputs, *norm.outputs)))


def _made_before(rw: Rewriter, value, node: Node) -> bool:
    """Whether `value` (an argument) exists before `node` runs: anything but a value a node at
    or after `node`'s place makes."""
    producer = rw.producer(value)
    nodes = rw.program.nodes
    return producer is None or nodes.index(producer) < nodes.index(node)


def _fuse_rope_cache_writes(rw: Rewriter) -> None:
    """For every cache_attention that reads rope(q) and caches cache_update wrote, rope(k)
    with rope(q)'s cos and sin the k cache's value and the v cache written at the same
    positions: those four nodes become one rope_cache_update node at the first one's place,
    where the module docstring's conditions hold."""
    program = rw.program
    for attention in [n for n in program.nodes if n.target == "etvk.cache_attention.default"]:
        a = bind(attention)
        q_rope = rw.made_by(a["q"], ROPE)
        k_update, v_update = rw.made_by(a["k_cache"], CACHE_UPDATE), rw.made_by(a["v_cache"], CACHE_UPDATE)
        if q_rope is None or k_update is None or v_update is None:
            continue
        q, k, v = bind(q_rope), bind(k_update), bind(v_update)
        k_rope = rw.made_by(k["value"], ROPE)
        if k_rope is None or not _read_only_by(rw, k["value"].name, k_update):
            continue
        rotated = bind(k_rope)
        args = (q["x"], rotated["x"], v["value"], q["cos"], q["sin"], k["cache"], v["cache"], k["positions"])
        replaced = [q_rope, k_rope, k_update, v_update]
        first = min(replaced, key=program.nodes.index)
        if (rotated["cos"], rotated["sin"]) == (q["cos"], q["sin"]) and k["positions"] == v["positions"] \
                and _fits_rope_cache_update(rw, args) \
                and all(_made_before(rw, arg, first) for arg in args) \
                and not any(_read_after(rw, cache, first, update)
                            for cache, update in ((k["cache"], k_update), (v["cache"], v_update))):
            outputs = (*q_rope.outputs, *k_update.outputs, *v_update.outputs)
            for node in replaced:
                if node is not first:
                    program.nodes.remove(node)
            del program.values[k_rope.outputs[0]]
            rw.replace(first, Node(k_update.name, ROPE_CACHE_UPDATE, args, {}, outputs))


def _fits_rope_cache_update(rw: Rewriter, args: tuple) -> bool:
    """Whether rope_cache_update takes `args` wherever the ops it replaces took theirs: what
    it checks beyond them (q and k_new of one batch, token count and head dim, v_new like
    k_new, the caches alike and distinct values)."""
    q, k_new, v_new, _, _, k_cache, v_cache, _ = (rw.value_spec(a) for a in args)
    caches = args[5:7]
    if None in (q, k_new, v_new, k_cache, v_cache) or not all(isinstance(c, Ref) for c in caches) \
            or caches[0] == caches[1] or len(q.shape) != 4 or len(k_new.shape) != 4:
        return False
    return v_new == k_new and v_cache == k_cache \
        and (q.shape[0], q.shape[1], q.shape[3]) == (k_new.shape[0], k_new.shape[1], k_new.shape[3])


def _read_after(rw: Rewriter, cache, place: Node, update: Node) -> bool:
    """Whether a node other than `update` (its write) reads the old `cache` at or after
    `place`: moved there, the write would no longer come after that read."""
    nodes = rw.program.nodes
    return any(nodes.index(n) >= nodes.index(place) for n in rw.users.get(cache.name, []) if n is not update)


def fuse_concat_tables(rw: Rewriter) -> None:
    """Every ``q8ta_concat -> q8ta_channel_lut`` the module docstring allows -> one
    ``q8ta_concat_channel_lut`` at the concat's place."""
    program = rw.program
    for lut in [n for n in program.nodes if n.target == CHANNEL_LUT]:
        b = bind(lut)
        concat = rw.made_by(b["x"], CONCAT)
        if concat is None or concat.kwargs or not isinstance(b["table"], Const) or b["layout"] is not None \
                or program.values[concat.outputs[0]].layout != program.values[lut.outputs[0]].layout \
                or (b["sums"] is not None and not _sums_fit(rw, b["sums"], b["sums_table"], concat)):
            continue
        sums = () if b["sums"] is None else (b["sums"], b["sums_table"])
        program.nodes.remove(lut)
        rw.replace(concat, Node(f"{concat.name}_channel_lut", CONCAT_LUT, (*concat.args, b["table"], *sums), {},
                                (*concat.outputs, *lut.outputs)))


def _sums_fit(rw: Rewriter, sums, sums_table, concat: Node) -> bool:
    """Whether a table op's window sums can join `concat`'s dispatch: made before it, a constant
    table, and a multiple of 4 channels (the fused op's word c4 + Cs / 4 is the concat's c4)."""
    return isinstance(sums_table, Const) and _made_before(rw, sums, concat) and rw.shape(sums)[1] % 4 == 0
