"""The int8 CNN patterns beyond the conv: what keeps a PT2E CNN on the device end to end.

Run by `runtime.lower` after the convs are fused, before the remaining
quantize / dequantize ops become their ``etvk`` twins. Each pattern is
rewritten only where the ``etvk`` op's contract provably holds (int8
per-tensor qparams, one consumer along the chain, shapes the op takes):

- first of all, identities: ``dropout(train=False)`` goes, and ``quantize(dequantize(x))``
  with the same qparams is ``x`` (exact: |q - zp| <= 255 survives the fp32
  round trip);
- then the quantize of an fp32 channel split, shuffle or cat of dequantized int8
  values, or of a max or average pool of one (``dq, ... -> cat(dim=1) -> q``; ShuffleNet;
  SqueezeNet's, GoogLeNet's and Inception-v3's pools of cats; ``dq -> max_pool2d |
  avg_pool2d -> q`` itself) -> ``q8ta_channel_gather``, a chain of two-input
  ``q8ta_concat``, ``q8ta_max_pool2d`` and ``q8ta_avg_pool2d``, each pool pushed into the
  cats it reads (lower_gather.py);
- ``conv -> q -> dq -> relu | hardtanh -> q`` with one qparams (PT2E quantizes
  ReLU6 on its own) folds into the conv's activation (a clamp of the int8
  output: exact, since quantize is monotonic);
- ``dq, dq -> add | mul -> [relu] -> q`` -> ``q8ta_add`` / ``q8ta_mul`` (the
  second operand may be ``[N, C, 1, 1]``, broadcast);
- ``dq -> adaptive_avg_pool2d(1)``
  or ``mean(dim=[2, 3], keepdim=True) -> q`` -> ``q8ta_global_avg_pool2d``; without
  keepdim (any spelling of H and W) the mean is first rewritten as the keepdim one
  and ``q -> dq -> flatten(1) -> q`` with one qparams (exact, as above), the
  pooled head below; ``dq -> adaptive_avg_pool2d(other sizes) -> q`` ->
  ``q8ta_adaptive_avg_pool2d``;
- ``dq -> linear(dq_per_channel weight) -> [q]`` -> ``q8ta_linear`` (int8 or
  fp32 out); a ``dq -> flatten(1) -> q`` of a pooled ``[N, C, 1, 1]`` before it is
  read in place (no copy); where the linear's input requantizes that flatten
  (``dq -> q`` with other qparams: the dropout PT2E quantizes on its own), the
  pooled tensor is requantized instead (``q8ta_dequantize -> q8ta_quantize``,
  the same values) and read in place; a clamp (relu, hardtanh) between its fp32 output and
  its quantize (VGG, AlexNet) becomes ``q -> dq -> clamp -> q`` with the one qparams (exact:
  quantize is monotonic), the linear int8 out and the clamp a table (lower_lut.py).

lower.py then fuses a ``q8ta_add`` of a conv's output into that conv's epilogue
where it may (lower_residual.py).

Every int8 tensor these ops read or write gets the placeholder layout
``PACKED_INT8_CONV2D``. Pure graph work; used by lower.py.
"""

from __future__ import annotations

import torch

from runtime.programs.lower_gather import lower_channel_gathers
from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.rewrite import (
    CONV,
    DQ,
    Q,
    Rewriter,
    bind,
    conv_activation,
    int8_per_tensor,
    ints,
)


def _same_qparams(a, b) -> bool:
    return a is not None and b is not None and a[1:] == b[1:]


def drop_identities(rw: Rewriter) -> None:
    """``dropout(train=False)`` and same-qparams ``quantize(dequantize(x))`` read their input."""
    program = rw.program
    for node in list(program.nodes):
        if node.target == "aten.dropout.default" and bind(node)["train"] is False:
            source = node.args[0]
        elif node.target == Q and _same_qparams(rw.dequantized(node.args[0]),
                                                int8_per_tensor(node, Q)):
            source = rw.dequantized(node.args[0])[0]
        else:
            continue
        if not isinstance(source, Ref):
            continue
        old, new = program.values[node.outputs[0]], program.values[source.name]
        if (old.shape, old.dtype) == (new.shape, new.dtype):
            program.replace_uses(node.outputs[0], source.name)
            rw.refresh()


def fold_clamps(rw: Rewriter) -> None:
    """``conv -> q -> dq -> relu | hardtanh -> q`` (one qparams) -> the conv's activation."""
    program = rw.program
    for node in list(program.nodes):
        activation = conv_activation(node)
        if activation is None or activation[0] == "hardswish":  # only clamps fold exactly
            continue
        b = bind(node)
        x = rw.dequantized(b["self"])
        conv = rw.producer(x[0]) if x is not None else None
        out = rw.requantized(node)
        if conv is None or conv.target != CONV or out is None or x[1:] != out[1:] \
                or len(conv.args) != 15 or conv.args[14] != "none" or conv.kwargs \
                or len(rw.users.get(x[0].name, [])) != 1 or x[0].name in program.outputs \
                or rw.only_user(rw.producer(b["self"])) is not node:
            continue
        fused = Node(conv.name, CONV, (*conv.args[:14], *activation), {}, out[0].outputs)
        program.nodes.remove(conv)
        rw.mark_packed(out[0].outputs[0])
        rw.replace(out[0], fused)


class _Patterns:
    """The op patterns of the module docstring, each -> a new node or None (no match)."""

    def __init__(self, rw: Rewriter):
        self.rw = rw

    def packed_int8(self, found):
        """`found` (value, scale, zero point) where its value is a 4-D int8 node output."""
        if found is None or len(self.rw.shape(found[0])) != 4 or self.rw.producer(found[0]) is None:
            return None
        return found

    def finish(self, last: Node, target: str, args: tuple, packed: list) -> Node:
        for ref in packed:
            self.rw.mark_packed(ref.name)
        return Node(f"{last.name}_q8ta", target, args, {}, last.outputs)

    def binary(self, node: Node, kind: str):
        b = bind(node)
        if b.get("alpha", 1) != 1:
            return None
        a, other = (self.packed_int8(self.rw.dequantized(b[k])) for k in ("self", "other"))
        if a is None or other is None:
            return None
        if self.rw.shape(a[0]) != self.rw.shape(other[0]):
            a, other = sorted((a, other), key=lambda t: self.rw.shape(t[0])[2:] == (1, 1))
            n, c = self.rw.shape(a[0])[:2]
            if self.rw.shape(other[0]) != (n, c, 1, 1):
                return None
        activation, last = "none", node
        user = self.rw.only_user(node)
        if user is not None and user.target == "aten.relu.default":
            activation, last = "relu", user
        out = self.rw.requantized(last)
        if out is None:
            return None
        return self.finish(out[0], f"etvk.q8ta_{kind}.default",
                           (*a, *other, out[1], out[2], activation), [a[0], other[0], Ref(out[0].outputs[0])])

    def add(self, node):
        return self.binary(node, "add")

    def mul(self, node):
        return self.binary(node, "mul")

    def _pool_ends(self, node: Node):
        x = self.packed_int8(self.rw.dequantized(node.args[0]))
        out = self.rw.requantized(node)
        return None if x is None or out is None else (x, out)

    def global_avg_pool2d(self, node):
        ends = self._pool_ends(node)
        if ends is None:
            return None
        x, out = ends
        return self.finish(out[0], "etvk.q8ta_global_avg_pool2d.default", (*x, out[1], out[2]),
                           [x[0], Ref(out[0].outputs[0])])

    def adaptive_avg_pool2d(self, node):
        size = ints(bind(node)["output_size"])
        if size in ([1], [1, 1]):
            return self.global_avg_pool2d(node)
        ends = self._pool_ends(node)
        if ends is None:
            return None
        x, out = ends
        return self.finish(out[0], "etvk.q8ta_adaptive_avg_pool2d.default", (*x, out[1], out[2], size),
                           [x[0], Ref(out[0].outputs[0])])

    def mean(self, node):
        b = bind(node)
        dims = b["dim"]
        # H and W of a 4-D tensor (the pool's ends check the rank), spelled either way
        if not isinstance(dims, (list, tuple)) or sorted(d % 4 for d in dims) != [2, 3] \
                or b.get("dtype") is not None:
            return None
        if not b["keepdim"] and self._pool_ends(node) is not None:
            node = self._keep_dims(node)
        return self.global_avg_pool2d(node)

    def _keep_dims(self, mean: Node) -> Node:
        """``mean(keepdim=False) -> q`` as ``mean(keepdim=True) -> q -> dq -> flatten(1) -> q`` with
        the one qparams (the same int8 values); -> the new mean. `_rows` reads the pooled
        ``[N, C, 1, 1]`` in place of the flatten."""
        program, b = self.rw.program, bind(mean)
        quantize, scale, zero_point = self.rw.requantized(mean)
        spec, name = program.values[mean.outputs[0]], quantize.outputs[0]
        kept, pooled, dequantized, flat = (f"{name}_{k}" for k in ("mean", "pooled", "pooled_dq", "flat"))
        for value, dtype in ((kept, spec.dtype), (pooled, torch.int8), (dequantized, torch.float32)):
            program.values[value] = ValueSpec((*spec.shape, 1, 1), dtype)
        program.values[flat] = ValueSpec(spec.shape, torch.float32)
        qparams = (scale, zero_point, -128, 127, torch.int8)
        new = Node(mean.name, "aten.mean.dim", (b["self"], list(b["dim"]), True), {}, (kept,))
        position = program.nodes.index(mean)
        program.nodes[position:position + 1] = [
            new, Node(f"{quantize.name}_pooled", Q, (Ref(kept), *qparams), {}, (pooled,)),
            Node(f"{quantize.name}_pooled_dq", DQ, (Ref(pooled), *qparams), {}, (dequantized,)),
            Node(f"{quantize.name}_flat", "aten.flatten.using_ints", (Ref(dequantized), 1), {}, (flat,))]
        self.rw.replace(quantize, Node(quantize.name, Q, (Ref(flat), *qparams), {}, quantize.outputs))
        return new

    def _pooled(self, x):
        """The packed ``[N, C, 1, 1]`` (value, scale, zero point) that the int8 rows `x` flatten
        with a same-qparams ``dq -> flatten(1) -> q``; or None."""
        quantize = int8_per_tensor(self.rw.producer(x[0]), Q)
        flat = self.rw.producer(quantize[0]) if quantize is not None and quantize[1:] == x[1:] else None
        if flat is None or flat.target != "aten.flatten.using_ints":
            return None
        b = bind(flat)
        pooled = self.packed_int8(self.rw.dequantized(b["self"]))
        if pooled is not None and pooled[1:] == x[1:] and b["start_dim"] == 1 \
                and b["end_dim"] in (-1, 3) and self.rw.shape(pooled[0])[2:] == (1, 1):
            return pooled
        return None

    def _rows(self, linear: Node):
        """The int8 rows `linear` reads: (value, scale, zero point) of its input's dequantize, or
        the packed ``[N, C, 1, 1]`` they flatten (`_pooled`), read in place; rows that requantize
        such a flatten (``q(dq(rows))``, a dropout PT2E quantizes on its own) read the packed
        tensor requantized. None where the input is no int8 rows."""
        x = self.rw.dequantized(bind(linear)["input"])
        if x is None or len(self.rw.shape(x[0])) != 2:
            return None
        pooled = self._pooled(x)
        if pooled is not None:
            return pooled
        quantize = int8_per_tensor(self.rw.producer(x[0]), Q)
        source = self.rw.dequantized(quantize[0]) if quantize is not None and quantize[1:] == x[1:] else None
        pooled = None if source is None else self._pooled(source)
        return x if pooled is None else self._requantize(pooled, x, linear)

    def _requantize(self, pooled, x, before: Node):
        """``dq -> q`` of `pooled` to the qparams of `x`, inserted before `before` (the same values
        as requantizing its flatten): (value, scale, zero point)."""
        program, name = self.rw.program, f"{x[0].name}_pooled"
        program.values[f"{name}_dq"] = ValueSpec(self.rw.shape(pooled[0]), torch.float32)
        program.values[name] = ValueSpec(self.rw.shape(pooled[0]), torch.int8)
        position = program.nodes.index(before)
        program.nodes[position:position] = [
            Node(f"{name}_dq", DQ, (*pooled, -128, 127, torch.int8), {}, (f"{name}_dq",)),
            Node(name, Q, (Ref(f"{name}_dq"), *x[1:], -128, 127, torch.int8), {}, (name,))]
        self.rw.refresh()
        return Ref(name), x[1], x[2]

    def linear(self, node):
        b = bind(node)
        weight = self.rw.symmetric_weight(self.rw.producer(b["weight"]), 2)
        bias = self.rw.fp32_bias(b["bias"])
        x = None if weight is None or bias is False else self._rows(node)  # _rows may add nodes
        if x is None:
            return None
        out = self.rw.requantized(node) or self._clamp_quantized(node)
        packed = [x[0]] if len(self.rw.shape(x[0])) == 4 else []
        if out is None:
            return self.finish(node, "etvk.q8ta_linear.default", (*x, *weight, bias, None, 0), packed)
        return self.finish(out[0], "etvk.q8ta_linear.default", (*x, *weight, bias, out[1], out[2]), packed)

    def _clamp_quantized(self, node: Node):
        """Where `node`'s only user is a clamp (relu, hardtanh) whose only user quantizes it:
        ``node -> clamp -> q`` rewritten as ``node -> q -> dq -> clamp -> q`` with the one
        qparams (exact: quantize is monotonic, so ``q(clamp(y)) = clamp(q(y), q(lo), q(hi))``,
        which the new clamp computes from ``q(y)``; lower_lut.py makes it a table) and
        `requantized` of `node` then; None (nothing changed) elsewhere."""
        clamp = self.rw.only_user(node)
        activation = conv_activation(clamp)
        out = None if activation is None or activation[0] == "hardswish" else self.rw.requantized(clamp)
        if out is None:
            return None
        program, value = self.rw.program, node.outputs[0]
        spec, name = program.values[value], f"{value}_q"
        program.values[name] = ValueSpec(spec.shape, torch.int8)
        program.values[f"{name}_dq"] = ValueSpec(spec.shape, spec.dtype)
        qparams = (out[1], out[2], -128, 127, torch.int8)
        position = program.nodes.index(clamp)
        program.nodes[position:position] = [Node(name, Q, (Ref(value), *qparams), {}, (name,)),
                                            Node(f"{name}_dq", DQ, (Ref(name), *qparams), {}, (f"{name}_dq",))]
        clamp.args = (Ref(f"{name}_dq"), *clamp.args[1:])  # its only reader
        self.rw.refresh()
        return self.rw.requantized(node)


_TARGETS = {
    "aten.add.Tensor": "add", "aten.mul.Tensor": "mul", "aten.adaptive_avg_pool2d.default": "adaptive_avg_pool2d",
    "aten.mean.dim": "mean", "aten.linear.default": "linear",
}


def lower_cnn_ops(rw: Rewriter) -> None:
    """Every pattern of the module docstring, in program order."""
    drop_identities(rw)
    lower_channel_gathers(rw)
    fold_clamps(rw)
    patterns = _Patterns(rw)
    for node in list(rw.program.nodes):
        if node.target in _TARGETS and node in rw.program.nodes:
            new = getattr(patterns, _TARGETS[node.target])(node)
            if new is not None:
                rw.replace(next(n for n in rw.program.nodes if n.outputs == new.outputs), new)
