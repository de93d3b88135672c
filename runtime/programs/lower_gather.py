"""Channel splits, shuffles, cats and pools of dequantized int8 activations as int8 ops.

PT2E quantizes neither ``chunk`` nor ``cat`` nor the channel shuffle
``view(N, g, C/g, H, W) -> transpose(1, 2) -> contiguous -> view(N, C, H, W)``
in ShuffleNetV2, nor the cat of an Inception block (SqueezeNet's fire,
GoogLeNet, Inception-v3) nor the max or average pool that reads it: between
the dequantize of one conv and the quantize before the next, the channels
travel in fp32, each channel computed from one int8 channel alone (the concats
mix channels of several qparams). This pass takes every ``quantize_per_tensor``
whose input is such an fp32 *channel expression*

    E := dequantize(x) | cat([E, ...], dim=1) | chunk / split / slice of E along dim 1
       | channel shuffle of E | max_pool2d(E) | avg_pool2d(E)

(x a 4-D int8 value, per-tensor qparams) and computes it from the int8
values. A cat becomes a chain of two-input ``q8ta_concat`` that requantizes
its inputs to the quantize's qparams, a split or shuffle a
``q8ta_channel_gather`` (a copy), a max pool ``q8ta_max_pool2d`` in the int8
domain of its input (quantize and dequantize are monotonic, so they commute
with max: exact, after a cat's requantization too). An average pool works per
channel, so it is first pushed into the cats and gathers it reads
(``pool(cat(a, b)) = cat(pool(a), pool(b))``, and a max pool of a cat under it
likewise) until it reads one source's channels, then becomes
``q8ta_avg_pool2d`` to the quantize's qparams (its own numerics,
docs/int8_cnn_ops.md; an average of an average stays on the CPU). Each element is thereby quantized once from its
own fp32 value to the quantize's qparams (later concats requantize to the same
qparams: an exact copy), as the graph computes it; an expression with no cat
and no average keeps its source's qparams and is requantized by a
``dequantize -> quantize`` pair (nothing where the qparams are the same).
Each quantize gets its own ops (quantizes of one expression with different
qparams need different values); what the fp32 nodes no longer feed is dropped
as dead. `Gathers.window_sums` gives the int32 window sums of a full-window
average pool for lower_lut.py's tables over them. Pure graph work; run by
lower_cnn.py.
"""

from __future__ import annotations

import torch

from runtime.families.pool2d import pool2d_params
from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.rewrite import DQ, Q, Rewriter, bind, int8_per_tensor, ints

_SPLITS = ("aten.chunk.default", "aten.split.Tensor", "aten.split_with_sizes.default")
_VIEWS = ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
_COPIES = ("aten.contiguous.default", "aten.clone.default")
_MAX_POOL, _AVG_POOL = "aten.max_pool2d.default", "aten.avg_pool2d.default"


def _channel_dim(dim) -> bool:
    """Whether `dim` names the channels of a 4-D tensor."""
    return dim in (1, -3)


def _exact(tree) -> bool:
    """Whether `emit` gives `tree`'s values exactly, as int8 values of its source's qparams (no
    cat requantizes them and no average pool rounds them)."""
    return tree[0] == "leaf" or (tree[0] in ("gather", "max_pool") and _exact(tree[1]))


def _source(tree):
    """The leaf an exact tree (`_exact`) reads."""
    return tree if tree[0] == "leaf" else _source(tree[1])


def _key(tree):
    """`tree` as a hashable value (its lists as tuples)."""
    return tuple(_key(t) if isinstance(t, (tuple, list)) else t for t in tree)


def _push(kind: str, tree, args, size):
    """The pool `kind` ("max_pool" or "avg_pool"; int8 op arguments `args`, output H and W
    `size`) of `tree`, pushed into its cats and gathers (a pool works per channel:
    ``pool(cat(a, b)) = cat(pool(a), pool(b))``)."""
    if tree[0] == "cat":
        return "cat", [_push(kind, part, args, size) for part in tree[1]]
    if tree[0] == "gather":
        return "gather", _push(kind, tree[1], args, size), *tree[2:]
    return kind, tree, args, size


def _average(tree):
    """`tree` (an average pool pushed into cats and gathers, `_push`) with every average pool
    reading an exact tree (`_exact`): a max pool of a cat under one is pushed into the cat too;
    None where an average would read another average."""
    if tree[0] == "cat":
        parts = [_average(part) for part in tree[1]]
        return None if None in parts else ("cat", parts)
    if tree[0] == "gather":
        inner = _average(tree[1])
        return None if inner is None else ("gather", inner, *tree[2:])
    source = tree[1]
    if source[0] == "max_pool" and source[1][0] in ("cat", "gather"):
        return _average(_push("avg_pool", _push("max_pool", *source[1:]), *tree[2:]))
    return tree if _exact(source) else None


def _full_windows(tree, shape) -> bool:
    """Whether every window of the ``("avg_pool", E, args, size)`` `tree` of an input of `shape`
    lies inside the image (no padding; ceil_mode adds no window)."""
    kernel, stride, padding, ceil_mode = tree[2][:4]
    if any(ints(padding)):
        return False
    floor = pool2d_params(shape, kernel, stride, [0], [1], False)
    return not ceil_mode or (floor.H_out, floor.W_out) == tuple(tree[3])


def pooled_prefix(tree):
    """The average pool of an exact tree (`_exact`) that gives `tree`'s first channels, the pool
    itself or a cat's first part; None where another node gives them."""
    while tree[0] == "cat":
        tree = tree[1][0]
    return tree if tree[0] == "avg_pool" else None


def after_prefix(tree):
    """`tree` without its first channels' part (`pooled_prefix`'s: a cat's first part, that of
    the first part of a cat, ...); None where that part is the whole tree."""
    if tree[0] != "cat":
        return None
    first = after_prefix(tree[1][0])
    parts = [*([] if first is None else [first]), *tree[1][1:]]
    return parts[0] if len(parts) == 1 else ("cat", parts)


class Gathers:
    """Parses channel expressions (trees of tuples) and emits their int8 ops for one program."""

    def __init__(self, rw: Rewriter):
        self.rw = rw
        self.count = 0
        self.raws: dict = {}  # `raw`'s results by subtree (`_key`)

    def shape(self, ref) -> tuple[int, ...]:
        return self.rw.shape(ref)

    def parse(self, ref):
        """The channel expression `ref` holds: ``("leaf", x, scale, zero point)``,
        ``("cat", [E, ...])``, ``("gather", E, start, count, groups)``, ``("max_pool", E, args,
        (H, W))`` or ``("avg_pool", E, args, (H, W))`` (the int8 pool's geometry arguments and
        output size; average pools are pushed into cats and gathers, `_average`); None for
        anything else."""
        node = self.rw.producer(ref)
        if node is None or len(self.rw.program.values[ref.name].shape) != 4:
            return None
        leaf = int8_per_tensor(node, DQ)
        if leaf is not None:
            source = self.rw.producer(leaf[0])
            return ("leaf", *leaf) if source is not None and len(self.shape(leaf[0])) == 4 else None
        if node.target == "aten.cat.default":
            b = bind(node)
            parts = [self.parse(t) if isinstance(t, Ref) else None for t in b["tensors"]]
            if not _channel_dim(b["dim"]) or not parts or None in parts:
                return None
            return ("cat", parts) if len(parts) > 1 else parts[0]  # a cat of one is its input
        if node.target in (_MAX_POOL, _AVG_POOL):
            return self.pool(node)
        gather = self.split(node, ref) or self.shuffle(node)
        if gather is None:
            return None
        source = self.parse(gather[0])
        return None if source is None else ("gather", source, *gather[1:])

    def pool(self, node: Node):
        """The tree of a max or average pool of a channel expression (`parse`); None otherwise."""
        b = bind(node)
        source = self.parse(b["self"]) if isinstance(b["self"], Ref) else None
        if source is None:
            return None
        geometry = [ints(b[k]) for k in ("kernel_size", "stride", "padding")]
        size = self.shape(Ref(node.outputs[0]))[2:]
        if node.target == _MAX_POOL:  # on a cat, after it: quantize is monotonic
            return "max_pool", source, (*geometry, ints(b["dilation"]), bool(b["ceil_mode"])), size
        args = (*geometry, bool(b["ceil_mode"]), bool(b["count_include_pad"]), b["divisor_override"])
        return _average(_push("avg_pool", source, args, size))

    def split(self, node: Node, ref):
        """(source, start, count, 1) where `ref` is one part of a split, chunk or slice of the
        channels (step 1); None otherwise."""
        b = bind(node)
        source = b.get("self")
        if not isinstance(source, Ref) or len(self.shape(source)) != 4 or not _channel_dim(b.get("dim")):
            return None
        channels = self.shape(source)[1]
        if node.target in _SPLITS:
            index = node.outputs.index(ref.name)
            start = sum(self.rw.program.values[o].shape[1] for o in node.outputs[:index])
        elif node.target == "aten.slice.Tensor" and b["step"] == 1:
            start = b["start"] or 0
            start = min(max(start + channels if start < 0 else start, 0), channels)
        else:
            return None
        count = self.shape(ref)[1]
        return (source, start, count, 1) if count >= 1 else None

    def shuffle(self, node: Node):
        """(source, 0, C, g) where `node` ends ``view(N, g, C/g, H, W) -> transpose(1, 2) ->
        [contiguous] -> view(N, C, H, W)`` of a 4-D source; None otherwise."""
        if node.target not in _VIEWS:
            return None
        inner = self.rw.producer(node.args[0])
        if inner is not None and inner.target in _COPIES and len(inner.args) == 1 and not inner.kwargs:
            inner = self.rw.producer(inner.args[0])
        if inner is None or not (
                (inner.target == "aten.transpose.int" and sorted(inner.args[1:]) == [1, 2])
                or (inner.target == "aten.permute.default" and list(inner.args[1]) == [0, 2, 1, 3, 4])):
            return None
        grouped = self.rw.producer(inner.args[0])
        if grouped is None or grouped.target not in _VIEWS or not isinstance(grouped.args[0], Ref):
            return None
        source = grouped.args[0]
        shape, five = self.shape(source), self.rw.program.values[grouped.outputs[0]].shape
        if len(shape) != 4 or self.shape(Ref(node.outputs[0])) != shape or len(five) != 5 \
                or five != (shape[0], five[1], shape[1] // five[1], *shape[2:]) \
                or five[1] * five[2] != shape[1]:
            return None
        return source, 0, shape[1], five[1]

    def value(self, shape, before: Node, dtype: torch.dtype = torch.int8) -> str:
        self.count += 1
        name = f"{before.outputs[0]}_gather{self.count}"
        self.rw.program.values[name] = ValueSpec(tuple(shape), dtype)
        return name

    def op(self, target: str, args: tuple, shape, before: Node, nodes: list) -> Ref:
        """A call of `target` with `args` whose int8 output of `shape` is a new value, appended to
        `nodes`."""
        name = self.value(shape, before)
        nodes.append(Node(name, target, args, {}, (name,)))
        return Ref(name)

    def gathered(self, x: Ref, tree, before: Node, nodes: list) -> Ref:
        """The channel gather of the ``("gather", E, start, count, groups)`` `tree` of `x`."""
        start, count, groups = tree[2:]
        n, _, h, w = self.shape(x)
        return self.op("etvk.q8ta_channel_gather.default", (x, start, count, groups), (n, count, h, w),
                       before, nodes)

    def pooled(self, target: str, args: tuple, tree, before: Node, nodes: list) -> Ref:
        """The pool `target` (`args`, the input first) of a ``("max_pool" | "avg_pool", E, ...)``
        `tree`."""
        return self.op(target, args, (*self.shape(args[0])[:2], *tree[3]), before, nodes)

    def concat(self, a: tuple, b: tuple, qparams: tuple, before: Node, nodes: list) -> Ref:
        """``q8ta_concat`` of (value, scale, zero point) `a` and `b` to `qparams`."""
        n, c, h, w = self.shape(a[0])
        return self.op("etvk.q8ta_concat.default", (*a, *b, *qparams), (n, c + self.shape(b[0])[1], h, w),
                       before, nodes)

    def emit(self, tree, scale: float, zero_point: int, before: Node, nodes: list):
        """The int8 (value, scale, zero point) of `tree`, its ops appended to `nodes`; a cat's
        concats requantize to (`scale`, `zero_point`)."""
        if tree[0] == "leaf":
            return tree[1:]
        if tree[0] == "cat":
            acc = self.emit(tree[1][0], scale, zero_point, before, nodes)
            for part in tree[1][1:]:
                part = self.emit(part, scale, zero_point, before, nodes)
                acc = (self.concat(acc, part, (scale, zero_point), before, nodes), scale, zero_point)
            return acc
        x, x_scale, x_zero_point = self.emit(tree[1], scale, zero_point, before, nodes)
        if tree[0] == "gather":
            return self.gathered(x, tree, before, nodes), x_scale, x_zero_point
        if tree[0] == "max_pool":  # quantize is monotonic: it commutes with max
            return self.pooled("etvk.q8ta_max_pool2d.default", (x, *tree[2]), tree, before, nodes), \
                x_scale, x_zero_point
        args = (x, x_scale, x_zero_point, scale, zero_point, *tree[2])
        return self.pooled("etvk.q8ta_avg_pool2d.default", args, tree, before, nodes), scale, zero_point

    def raw(self, tree, before: Node, nodes: list):
        """(int8 value, [(scale, zero point) of each channel]) holding `tree`'s channels, each
        channel with its source's qparams: cats copy their inputs' bytes (``q8ta_concat`` with
        every scale 1 and zero point 0: ``q = roundEven(float(q) * 1) + 0``, exact); an average
        pool is quantized with its input's qparams (a rounding of its own, which the graph does
        not have where PT2E left the pool in fp32; `window_sums` gives the exact route where
        the pool's channels come first and its windows are full). New ops are appended to
        `nodes`; a subtree met before (the growing cats of a dense block) reuses its value."""
        key = _key(tree)
        if key in self.raws:
            return self.raws[key]
        if tree[0] == "cat":
            acc, qparams = self.raw(tree[1][0], before, nodes)
            for part in tree[1][1:]:
                x, more = self.raw(part, before, nodes)
                acc, qparams = self.concat((acc, 1.0, 0), (x, 1.0, 0), (1.0, 0), before, nodes), qparams + more
        elif tree[0] == "gather" and not _exact(tree):
            x, inner = self.raw(tree[1], before, nodes)
            acc = self.gathered(x, tree, before, nodes)
            start, count, groups = tree[2:]
            qparams = [inner[start + (c % groups) * (count // groups) + c // groups] for c in range(count)]
        elif tree[0] == "max_pool" and not _exact(tree):
            x, qparams = self.raw(tree[1], before, nodes)
            acc = self.pooled("etvk.q8ta_max_pool2d.default", (x, *tree[2]), tree, before, nodes)
        else:  # exact, or an average pool of an exact tree: one source's qparams
            scale, zero_point = _source(tree[1] if tree[0] == "avg_pool" else tree)[2:]
            acc, scale, zero_point = self.emit(tree, scale, zero_point, before, nodes)
            qparams = [(scale, zero_point)] * self.shape(acc)[1]
        self.raws[key] = acc, qparams
        return acc, qparams

    def window_sums(self, tree, before: Node, nodes: list):
        """(int32 window sums, the pool's tree, its input's (scale, zero point)) where `tree`'s
        first channels are an average pool (`pooled_prefix`) whose every window is full
        (`_full_windows`): ``q8ta_window_sum`` of its exact input, which a table over the sums
        turns into any function of the pooled fp32 values; None otherwise. New ops are appended to `nodes`; a pool met before reuses its
        value."""
        pool = pooled_prefix(tree)
        if pool is None:
            return None
        key = ("window_sums", _key(pool))
        if key not in self.raws:
            x, _ = self.raw(pool[1], before, nodes)
            if not _full_windows(pool, self.shape(x)):
                return None
            name = self.value((*self.shape(x)[:2], *pool[3]), before, torch.int32)
            kernel, stride = pool[2][:2]
            nodes.append(Node(name, "etvk.q8ta_window_sum.default", (x, kernel, stride), {}, (name,)))
            self.raws[key] = Ref(name), pool, tuple(_source(pool[1])[2:])
        return self.raws[key]

    def lower(self, quantize: Node) -> None:
        """`quantize` of a channel expression other than a plain dequantize, computed in int8."""
        found = int8_per_tensor(quantize, Q)
        tree = None if found is None else self.parse(found[0])
        if tree is None or tree[0] == "leaf":
            return
        program, (_, scale, zero_point) = self.rw.program, found
        nodes: list[Node] = []
        result = self.emit(tree, scale, zero_point, quantize, nodes)
        for node in nodes:
            self.rw.mark_packed(node.outputs[0])
        self.rw.mark_packed(result[0].name)
        position = program.nodes.index(quantize)
        if result[1:] == (scale, zero_point):
            program.nodes[position:position] = nodes
            program.replace_uses(quantize.outputs[0], result[0].name)
        else:  # no cat: the source's qparams, requantized
            name = f"{quantize.outputs[0]}_gathered"
            program.values[name] = ValueSpec(self.shape(result[0]), torch.float32)
            requantize = Node(quantize.name, Q, (Ref(name), *quantize.args[1:]), dict(quantize.kwargs),
                              quantize.outputs)
            program.nodes[position:position + 1] = [
                *nodes, Node(name, DQ, (*result, -128, 127, torch.int8), {}, (name,)), requantize]
        self.rw.refresh()


def lower_channel_gathers(rw: Rewriter) -> None:
    """Every quantize of a channel expression (module docstring), in program order."""
    gathers = Gathers(rw)
    for node in list(rw.program.nodes):
        if node.target == Q and node in rw.program.nodes:
            gathers.lower(node)
