"""Fused projections, split: a quantized linear read only through slices of its output becomes
one linear per slice.

Phi-3 computes q, k and v with one projection (``qkv_proj``) whose output it slices along the
last dimension, and gate and up with one (``gate_up_proj``) whose output it chunks in two.
After FuseQuantizedOps each is one ``etvk.linear_qta8a_qga4w`` (a bias, where there is one, is
the ``add`` of a constant ``[N]`` after it; in an fp16 model a cast of the fp32 result to fp16
follows), and no device op slices a tensor. Output row n of that op reads row n of the weight,
its scales and its zeros alone (OPS.md family 3; the op takes any N, padding its blocks of 4
rows), so the op over rows [a, b) of those constants computes the slice [a, b) of the fused
output bit for bit. `split_fused_linears` rewrites every such linear into one linear per
distinct range of rows the slices take (slices that overlap compute their common rows each),
over new constants holding those rows (and the add of the bias's rows and the cast after it),
all reading the fused linear's one per-token quantized input. The patterns of
lower_decoder.py and lower_attention.py (q, k and v with rope and the cache, activation x up)
then apply as they do to separate projections.

A slice is an ``aten.slice.Tensor`` of step 1, or an ``aten.chunk`` / ``aten.split.Tensor`` /
``aten.split_with_sizes``, along the last dimension. A linear that slices read is left whole,
and the reason logged (DEBUG), where anything else reads its output too (or the program
returns it), where a slice takes another dimension, steps, or takes no rows, or where its
weight, scales or zeros are not constants. Pure graph work, no Vulkan; called by
lower_decoder.py.
"""

from __future__ import annotations

import logging

import torch

from runtime.programs.nodes import Const, Node, Ref, ValueSpec
from runtime.programs.rewrite import Rewriter, bind, float_cast, slice_range

logger = logging.getLogger(__name__)

LINEAR = "etvk.linear_qta8a_qga4w.default"
_SLICE = "aten.slice.Tensor"
_PIECES = ("aten.chunk.default", "aten.split.Tensor", "aten.split_with_sizes.default")
_ADD = "aten.add.Tensor"


def split_fused_linears(rw: Rewriter) -> None:
    """Every quantized linear read through slices of its last dimension alone becomes one
    linear per slice (see the module docstring)."""
    for linear in [n for n in rw.program.nodes if n.target == LINEAR]:
        tail = _tail(rw, linear)
        output = (tail[-1] if tail else linear).outputs[0]
        readers = rw.users.get(output, [])
        if not any(r.target in (_SLICE, *_PIECES) for r in readers):
            continue
        b = bind(linear)
        pieces = _pieces(rw, output, readers) if all(
            isinstance(b[k], Const) for k in ("weight", "weight_scales", "weight_zeros")) \
            else "its weight, scales or zeros are not constants"
        if isinstance(pieces, str):
            logger.debug("%s stays one linear, its slices on the CPU: %s", linear.name, pieces)
            continue
        _split(rw, linear, tail, readers, pieces)


def _tail(rw: Rewriter, linear: Node) -> list[Node]:
    """The nodes between the linear and the value the slices read, each the only reader of the
    one before: the add of a bias (a constant fp32 ``[N]``), then a cast of the fp32 result to
    fp16 (an fp16 model's linear), either or both or none."""
    tail, last = [], linear
    add = rw.only_user(linear)
    out = rw.program.values[linear.outputs[0]]
    if add is not None and add.target == _ADD and len(add.args) == 2 and bind(add)["alpha"] == 1 \
            and add.args[0] == Ref(linear.outputs[0]) and isinstance(add.args[1], Const) \
            and rw.value_spec(add.args[1]) == ValueSpec(out.shape[-1:], torch.float32):
        tail.append(add)
        last = add
    cast = rw.only_user(last)
    if float_cast(rw, cast) is not None:
        tail.append(cast)
    return tail


def _pieces(rw: Rewriter, value: str, readers: list[Node]) -> dict[tuple[int, int], list[str]] | str:
    """The slices of `value` that `readers` take: their ranges of rows (start, end), each with the
    values that hold it; or why `value` cannot be split."""
    if value in rw.program.outputs:
        return "the program returns its output"
    shape = rw.program.values[value].shape
    pieces: dict[tuple[int, int], list[str]] = {}
    for reader in readers:
        if reader.reads() != [value] or reader.target not in (_SLICE, *_PIECES):
            return f"{reader.name} ({reader.target}) reads its output"
        if reader.target == _SLICE:
            rows = slice_range(reader, shape[-1], len(shape))
            if rows is None:
                return f"{reader.name} slices another dimension than the last, or steps"
            found = [(rows, reader.outputs[0])]
        elif bind(reader)["dim"] not in (len(shape) - 1, -1):
            return f"{reader.name} ({reader.target}) cuts another dimension than the last"
        else:  # consecutive pieces from row 0, as wide as its outputs
            found, start = [], 0
            for out in reader.outputs:
                width = rw.program.values[out].shape[-1]
                found.append(((start, start + width), out))
                start += width
        for rows, out in found:
            if rows[0] == rows[1]:
                return f"{reader.name} takes no rows"
            pieces.setdefault(rows, []).append(out)
    return pieces


def _split(rw: Rewriter, linear: Node, tail: list[Node], readers: list[Node],
           pieces: dict[tuple[int, int], list[str]]) -> None:
    """`linear` (with its `tail`: bias add, cast) and the slicing `readers` replaced by one linear
    (and tail) per range of rows in `pieces`, at the linear's place."""
    program = rw.program
    b = bind(linear)

    def rows(const: Const, start: int, end: int) -> Const:
        return rw.add_constant(f"{const.name}_rows_{start}_{end}", program.constants[const.name][start:end].clone())

    new = []
    for (start, end), outs in sorted(pieces.items()):
        out = outs[0]
        for other in outs[1:]:
            program.replace_uses(other, out)
        values = []  # each node's output for this piece: fresh values of the piece's shape, then `out`
        for node in (linear, *tail[:-1]) if tail else ():
            value = f"{out}_{'linear' if node is linear else 'biased'}"
            while value in program.values:
                value += "_"
            program.values[value] = ValueSpec(program.values[out].shape, program.values[node.outputs[0]].dtype)
            values.append(value)
        values.append(out)
        args = (b["x"], b["input_scale"], b["input_zero_point"], rows(b["weight"], start, end), b["group_size"],
                rows(b["weight_scales"], start, end), rows(b["weight_zeros"], start, end))
        new.append(Node(f"{linear.name}_rows_{start}_{end}", LINEAR, args, {}, (values[0],)))
        for node, source, value in zip(tail, values[:-1], values[1:], strict=True):
            rest = (rows(node.args[1], start, end),) if node.target == _ADD else node.args[1:]
            new.append(Node(f"{node.name}_rows_{start}_{end}", node.target, (Ref(source), *rest), dict(node.kwargs),
                            (value,)))
    for node in [*readers, *tail]:
        program.nodes.remove(node)
    at = program.nodes.index(linear)
    program.nodes[at:at + 1] = new
    rw.refresh()
