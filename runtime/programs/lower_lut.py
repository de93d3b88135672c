"""Int8 pointwise functions as lookup tables: ``dq -> elementwise ops -> q`` -> ``etvk.q8ta_lut``;
per-channel ones -> ``etvk.q8ta_channel_lut``.

For a per-tensor int8 input x, ``q(f(dq(x)))`` takes one of 256 values for any
elementwise f, so the pattern becomes one gather from a 256-entry int8 table.
The table is computed here by running the graph's own nodes (the
dequantizes, the ops and the quantize, with their targets and arguments) on
the CPU over the 256 int8 values, in program order: each entry is what the
graph computes for an element holding that value, so the lowered program
equals the graph's CPU run bit for bit wherever PyTorch computes an element
the same in a 256-element tensor as in the graph's (its vectorised and scalar
loops agree: docs/int8_cnn_ops.md). Hardswish, hardsigmoid, sigmoid, silu,
gelu, tanh, clamps that change the qparams and any chain or mix of them
need no code of their own.

A pattern is a full-range int8 per-tensor quantize whose input is computed
from one int8 value x alone: walking back from it, every node met is an
elementwise op (`elementwise`: an ``aten`` op PyTorch tags pointwise, or one
of `ELEMENTWISE`, deterministic and functional, whose arguments are values
of the pattern and scalars), and every walk ends at an int8 per-tensor
dequantize of x, all with the same qparams. It is rewritten only where it
holds at least one op, x is not empty, every op's output has x's shape and
is no program output, and x is made by a node: a 4-D x and the output are
packed (the placeholder layout), another rank stays a plain int8 tensor. The
dequantizes and the ops stay for their other readers (an op that something
else reads too, such as the fp32 activation torch 2.11's PT2E graph of
EfficientNet pools for its squeeze-and-excite gate, which
`lower_channel_tables` then lowers); what is no longer read is dropped (with
every other unread node).

`lower_channel_tables` extends the idea to one table per channel: the
quantize of a chain of per-channel functions (an eval batch norm, elementwise
ops) of a channel expression of lower_gather.py (DenseNet's ``cat -> norm ->
relu -> q``, whose cat mixes int8 tensors of different qparams) reads the
expression's int8 bytes, each channel with its source's qparams
(`Gathers.raw`), through one ``etvk.q8ta_channel_lut``, whose ``[C, 256]``
tables are the chain and the quantize run over each channel's 256 values
dequantized with its qparams; where the chain's mean over H and W is quantized
(DenseNet's head), one ``etvk.q8ta_channel_lut_mean`` averages the chain's fp32
values the same way, into int8 rows ``[N, C]``, or where the quantize keeps the
pooled ``[N, C, 1, 1]`` (torch 2.11's PT2E graph of a squeeze-and-excite gate,
``dq -> silu | hardswish -> adaptive_avg_pool2d(1) -> q``, which pools the fp32
activation; its table one row, every channel's alike) into that packed map
(``keepdim``), which the gate's conv reads.
Where the expression's first channels are an average pool with full windows
that PT2E left in fp32 (DenseNet's transition), those channels read the
pool's ``etvk.q8ta_window_sum`` instead, through tables over
the window sums (`pooled`: the chain and the quantize run over the pooled
value of one window of each sum; docs/int8_cnn_ops.md), and the op's int8
input holds the expression's later channels alone (`after_prefix`; none for
a dense block's first layer): the pooled channels go into no concat.

Run by lower.py after lower_cnn.py (a clamp that keeps its conv's qparams
folds into the conv there, which costs nothing) and the removal of the nodes
it left unread (a dropout it bypassed still reads its input), and before the remaining
quantize / dequantize ops become their ``etvk`` twins. Pure graph work, no
Vulkan.
"""

from __future__ import annotations

import torch

from runtime.families.conv2d_layouts import PLACEHOLDER
from runtime.programs.cpu import resolve_op, run_node
from runtime.programs.lower_gather import Gathers, after_prefix
from runtime.programs.nodes import Const, Node, Ref, walk_args
from runtime.programs.rewrite import DQ, Q, Rewriter, bind, int8_per_tensor, ints

LUT = "etvk.q8ta_lut.default"
CHANNEL_LUT = "etvk.q8ta_channel_lut.default"
CHANNEL_MEAN = "etvk.q8ta_channel_lut_mean.default"
BATCH_NORM = "aten.batch_norm.default"
# Elementwise aten ops that PyTorch does not tag pointwise.
ELEMENTWISE = frozenset({"aten.hardswish.default", "aten.log_sigmoid.default"})
# The non-tensor arguments an elementwise op may take here (no constant tensors: they may broadcast).
_SCALARS = (bool, int, float, str, type(None), torch.dtype)


def elementwise(node: Node) -> bool:
    """Whether `node` computes each output element from the same element of its tensor
    arguments alone, the same way every time: a deterministic, functional ``aten`` op tagged
    pointwise (or one of `ELEMENTWISE`) with one output, whose other arguments are scalars."""
    if not node.target.startswith("aten.") or len(node.outputs) != 1:
        return False
    op = resolve_op(node.target)
    if not (torch.Tag.pointwise in op.tags or node.target in ELEMENTWISE) \
            or torch.Tag.nondeterministic_seeded in op.tags or op._schema.is_mutable:
        return False
    return all(isinstance(a, (Ref, *_SCALARS)) for a in walk_args((node.args, node.kwargs)))


def _pattern(rw: Rewriter, quantize: Node):
    """(x, the pattern's nodes in program order, the quantize last) where `quantize` ends a
    pattern of the module docstring; None where it does not."""
    out = int8_per_tensor(quantize, Q)
    if out is None:
        return None
    x, ops, dequantizes, seen, pending = None, [], [], set(), [out[0].name]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = rw.producers.get(name)
        found = int8_per_tensor(node, DQ)
        if found is not None:
            if x is not None and found != x:
                return None
            x = found
            dequantizes.append(node)
        elif node is not None and elementwise(node):
            ops.append(node)
            pending.extend(node.reads())
        else:
            return None
    program = rw.program
    shape = program.values[quantize.outputs[0]].shape
    if not ops or rw.producer(x[0]) is None or rw.shape(x[0]) != shape or 0 in shape \
            or program.values[x[0].name].dtype != torch.int8:
        return None
    for op in ops:
        value = op.outputs[0]
        if program.values[value].shape != shape or value in program.outputs:
            return None
    position = {id(n): i for i, n in enumerate(program.nodes)}
    return x[0], sorted([*dequantizes, *ops], key=lambda n: position[id(n)]) + [quantize]


def lookup_table(nodes: list[Node], x: Ref, constants: dict) -> torch.Tensor:
    """The int8 ``[256]`` table of a pattern: `nodes` (dequantizes, ops, the quantize last, in
    program order) run on the CPU with `x` holding the int8 values -128 .. 127."""
    env = {x.name: torch.arange(-128, 128, dtype=torch.int8)}
    for node in nodes:
        run_node(node, env, constants)
    return env[nodes[-1].outputs[0]]


def lower_lookup_tables(rw: Rewriter) -> None:
    """Every pattern of the module docstring -> one ``etvk.q8ta_lut``, in program order; then
    drops what nothing reads (the patterns' ops)."""
    program = rw.program
    for quantize in [n for n in program.nodes if n.target == Q]:
        found = _pattern(rw, quantize)
        if found is None:
            continue
        x, nodes = found
        table = lookup_table(nodes, x, program.constants)
        name = quantize.outputs[0]
        if len(rw.shape(x)) == 4:
            for packed in (x.name, name):
                rw.mark_packed(packed)
        rw.replace(quantize, Node(f"{quantize.name}_lut", LUT, (x, rw.add_constant(f"{name}_table", table)),
                                  {}, quantize.outputs))
    program.remove_dead()
    rw.refresh()


def _per_channel(node: Node | None) -> Ref | None:
    """The tensor `node` reads where it computes each element from the same element of that one
    tensor by a function of its channel alone: a batch norm in eval mode with constant
    statistics, or an elementwise op (`elementwise`) of that one tensor; None otherwise."""
    if node is None:
        return None
    if node.target == BATCH_NORM:
        b = bind(node)
        statistics = [b[k] for k in ("running_mean", "running_var")]
        parameters = [b[k] for k in ("weight", "bias")]
        ok = b["training"] is False and isinstance(b["input"], Ref) and all(isinstance(a, Const) for a in statistics) \
            and all(a is None or isinstance(a, Const) for a in parameters)
        return b["input"] if ok else None
    reads = node.reads()
    return Ref(reads[0]) if elementwise(node) and len(reads) == 1 else None


def _mean_of(rw: Rewriter, quantize: Node) -> Ref | None:
    """The value whose mean over H and W `quantize` quantizes, as ``[N, C]`` or ``[N, C, 1, 1]``:
    what ``adaptive_avg_pool2d(1)`` or ``mean(dim=[2, 3], keepdim=True)`` pools, with or
    without a ``flatten(1)`` after it, or ``mean(dim=[2, 3])`` reduces, each node read by the
    next alone (not a program output); None for anything else."""
    node = rw.producer(quantize.args[0])
    pool, flat = node, None
    if node is not None and node.target == "aten.flatten.using_ints":
        b = bind(node)
        if b["start_dim"] != 1 or b["end_dim"] not in (-1, 3) or rw.only_user(node) is not quantize:
            return None
        pool, flat = rw.producer(b["self"]), node
    if pool is None or pool.target not in ("aten.adaptive_avg_pool2d.default", "aten.mean.dim") \
            or rw.only_user(pool) is not (flat or quantize):
        return None
    b = bind(pool)
    x = b["self"]
    if not isinstance(x, Ref) or len(rw.shape(x)) != 4:
        return None
    if pool.target == "aten.adaptive_avg_pool2d.default":
        return x if ints(b["output_size"]) in ([1], [1, 1]) else None
    if isinstance(b["dim"], (list, tuple)) and b.get("dtype") is None:  # mean
        return x if sorted(d % 4 for d in b["dim"]) == [2, 3] and (flat is None or b["keepdim"]) else None
    return None


def _channel_pattern(rw: Rewriter, gathers: Gathers, quantize: Node, mean: bool):
    """(channel expression tree, its value, the chain's nodes in program order) where `quantize`
    ends a per-channel pattern (`lower_channel_tables`): the chain then the quantize (`mean`
    False; the quantize last in the nodes), or the chain, its mean over H and W and the quantize
    (`mean` True; the chain may be empty); None where it does not."""
    if int8_per_tensor(quantize, Q) is None:
        return None
    ref = _mean_of(rw, quantize) if mean else quantize.args[0]
    if ref is None:
        return None
    chain = []
    while (source := _per_channel(rw.producer(ref))) is not None:
        chain.append(rw.producer(ref))
        ref = source
    program = rw.program
    shape = rw.shape(ref)
    if (not chain and not mean) or len(shape) != 4 or 0 in shape or any(
            program.values[n.outputs[0]].shape != shape or n.outputs[0] in program.outputs
            or len(rw.users.get(n.outputs[0], [])) != 1 for n in chain):
        return None
    tree = gathers.parse(ref)
    return None if tree is None else (tree, ref, chain[::-1] if mean else [*chain[::-1], quantize])


def dequantized(qparams: list) -> torch.Tensor:
    """``[1, C, 256, 1]``: in each channel c the values -128 .. 127 dequantized with c's (scale,
    zero point) from `qparams` by the graph's dequantize, along H."""
    values = torch.arange(-128, 128, dtype=torch.int8).view(1, 1, 256, 1)
    dequantize, parts, start = resolve_op(DQ), [], 0
    while start < len(qparams):  # channels of one qparams together
        end = start + 1
        while end < len(qparams) and qparams[end] == qparams[start]:
            end += 1
        ints8 = values.expand(1, end - start, 256, 1).contiguous()
        parts.append(dequantize(ints8, *qparams[start], -128, 127, torch.int8))
        start = end
    return torch.cat(parts, dim=1)


def pooled(pool, qparams: tuple, channels: int, count: int) -> torch.Tensor:
    """``[1, channels, T, 1]``: in each of the first `count` channels, for each window sum S =
    -128 K .. 127 K (T = 255 K + 1, K taps) the fp32 value the graph's average pool (the
    ``("avg_pool", E, args, size)`` tree `pool` of lower_gather.py) computes, by the graph's
    dequantize (`qparams`) and ``aten.avg_pool2d``, for one window of S: its int8 values
    ``floor((S + j) / K)``, j = 0 .. K - 1, in row-major order; the other channels 0."""
    kernel, _, _, _, count_include_pad, divisor_override = pool[2]
    kh, kw = (ints(kernel) * 2)[:2]
    taps = kh * kw
    sums = torch.arange(-128 * taps, 127 * taps + 1)
    windows = torch.stack([torch.div(sums + j, taps, rounding_mode="floor") for j in range(taps)], 1)
    ints8 = windows.to(torch.int8).view(1, 1, -1, kw)  # window t in rows t * kh .. t * kh + kh - 1
    values = resolve_op("aten.avg_pool2d.default")(
        resolve_op(DQ)(ints8, *qparams, -128, 127, torch.int8), [kh, kw], [kh, kw], [0, 0], False,
        count_include_pad, divisor_override)
    out = torch.zeros(1, channels, sums.numel(), 1)
    out[:, :count] = values
    return out


def channel_table(nodes: list[Node], x: Ref, values: torch.Tensor, constants: dict) -> torch.Tensor:
    """The ``[C, R]`` tables of a per-channel pattern: `nodes` (the chain, then the quantize for
    int8 tables; none or the chain for fp32 ones) run on the CPU with `x` holding the fp32
    ``[1, C, R, 1]`` `values` (`dequantized`, `pooled`)."""
    env = {x.name: values}
    for node in nodes:
        run_node(node, env, constants)
    return env[nodes[-1].outputs[0] if nodes else x.name][0, :, :, 0].contiguous()


def lower_channel_tables(rw: Rewriter) -> None:
    """Every quantize of a chain of per-channel functions (`_per_channel`: DenseNet's batch norm
    and relu) of a channel expression (lower_gather.py: dequantized int8 tensors, cats of them
    with different qparams, their gathers and pools) -> the expression's int8 bytes, each
    channel with its source's qparams (`Gathers.raw`), through one ``etvk.q8ta_channel_lut``
    whose tables are the chain and the quantize run on the CPU over the 256 values of each
    channel (`channel_table`); the quantize of the mean over H and W of such a chain (DenseNet's
    head: ``norm -> relu -> adaptive_avg_pool2d(1) -> flatten``) -> one
    ``etvk.q8ta_channel_lut_mean`` whose fp32 tables are the chain's values (one row where
    every channel's is alike: a function of a per-tensor int8 value; where the quantize
    keeps the pooled ``[N, C, 1, 1]``, into that packed map); a full-window
    average pool giving the expression's first channels (`Gathers.window_sums`) goes in
    through tables over its window sums (`pooled`), the int8 input then holding the channels
    after it (None where there are none: the output's layout is then its readers'). Then
    drops what nothing reads."""
    program, gathers = rw.program, Gathers(rw)
    for quantize in [n for n in program.nodes if n.target == Q]:
        mean = False
        found = _channel_pattern(rw, gathers, quantize, mean)
        if found is None:
            mean = True
            found = _channel_pattern(rw, gathers, quantize, mean)
        if found is None:
            continue
        tree, x, nodes = found
        new: list[Node] = []
        window_sums = gathers.window_sums(tree, quantize, new)
        rest, prefix = tree, []  # x's channels; the pooled channels' qparams (their pool input's)
        if window_sums is not None:  # the pooled first channels: tables over their window sums
            rest, prefix = after_prefix(tree), [window_sums[2]] * rw.shape(window_sums[0])[1]
        raw, qparams = (None, []) if rest is None else gathers.raw(rest, quantize, new)
        qparams = prefix + qparams
        name, table, wide = quantize.outputs[0], None, ()
        if raw is not None:
            tables = channel_table(nodes, x, dequantized(qparams), program.constants)[len(prefix):]
            if mean and bool((tables.view(torch.int32) == tables[:1].view(torch.int32)).all()):  # all alike
                tables = tables[:1]
            table = rw.add_constant(f"{name}_tables", tables.contiguous())
        if window_sums is not None:
            values = pooled(window_sums[1], prefix[0], len(qparams), len(prefix))
            wide = window_sums[0], rw.add_constant(f"{name}_sum_tables", channel_table(
                nodes, x, values, program.constants)[:len(prefix)].contiguous())
        for packed in (*[n.outputs[0] for n in new if program.values[n.outputs[0]].dtype == torch.int8],
                       *([] if raw is None else [raw.name])):
            rw.mark_packed(packed)
        if mean:
            keep = ()
            if len(rw.shape(Ref(name))) == 4:  # the pooled [N, C, 1, 1]: packed, as a conv reads it
                rw.mark_packed(name)
                keep = (*(wide or (None, None)), True, PLACEHOLDER if raw is None else None)
            last = Node(f"{quantize.name}_channel_mean", CHANNEL_MEAN,
                        (raw, table, *int8_per_tensor(quantize, Q)[1:], *(keep or wide)), {}, quantize.outputs)
        else:  # without x, the output's layout is its readers' (the placeholder)
            rw.mark_packed(name)
            last = Node(f"{quantize.name}_channel_lut", CHANNEL_LUT,
                        (raw, table, *wide, *([] if raw is not None else [PLACEHOLDER])), {}, quantize.outputs)
        position = program.nodes.index(quantize)
        program.nodes[position:position + 1] = [*new, last]
        rw.refresh()
    program.remove_dead()
    rw.refresh()
