"""Residual adds fused into the conv that produces one of their operands.

``q8ta_conv2d -> q8ta_add(conv output, other) -> [relu]`` (what lower_cnn.py
made of PT2E's ``conv -> q -> dq, dq -> add -> [relu] -> q``) becomes one
``q8ta_conv2d`` with ``residual=other``: its epilogue computes the conv's int8
output exactly as before, then q8ta_add's own arithmetic on it and the
residual's word at the same index (docs/int8_cnn_ops.md "Residual add"), so the
fused op gives the very bits of the two ops. fp32 addition is commutative, so
the conv's output may be either operand of the add. It fuses where:

- the conv's int8 output has the add as its only reader and is no program
  output, and the add dequantizes it with the conv's output qparams;
- the other operand has the conv output's shape (no broadcast) and is written
  before the conv in program order, so it exists when the conv runs;
- the conv has no residual yet.

The residual, the conv's input and output are read or written by one op and so
share one packed layout (runtime/families/conv2d_layouts.py): the epilogue
reads the residual's word at the index it writes. Pure graph work; used by
lower_cnn.py.
"""

from __future__ import annotations

from runtime.programs.nodes import Node, Ref
from runtime.programs.rewrite import CONV, Rewriter, with_arguments

_ADD = "etvk.q8ta_add.default"


def _fusable_conv(rw: Rewriter, operand: tuple, other: tuple, add: Node) -> Node | None:
    """The conv writing `operand` (value, scale, zero point) of `add` where it can take
    `other` as its residual (the module docstring's conditions), else None."""
    conv, source = rw.plain_conv(operand[0], add), rw.producer(other[0])
    if conv is None or source is None or tuple(conv.args[6:8]) != tuple(operand[1:]) \
            or rw.program.nodes.index(source) >= rw.program.nodes.index(conv):
        return None
    return conv


def fuse_residual_adds(rw: Rewriter) -> None:
    """Every ``q8ta_conv2d -> q8ta_add`` the module docstring allows, fused."""
    program = rw.program
    for add in [n for n in program.nodes if n.target == _ADD]:
        a, b = tuple(add.args[0:3]), tuple(add.args[3:6])
        if not isinstance(a[0], Ref) or not isinstance(b[0], Ref) or rw.shape(a[0]) != rw.shape(b[0]):
            continue
        for operand, other in ((a, b), (b, a)):
            conv = _fusable_conv(rw, operand, other, add)
            if conv is not None:
                args = with_arguments(conv, residual=other[0], residual_scale=other[1],
                                      residual_zero_point=other[2], add_output_scale=add.args[6],
                                      add_output_zero_point=add.args[7], add_activation=add.args[8])
                program.nodes.remove(add)
                rw.replace(conv, Node(conv.name, CONV, args, {}, add.outputs))
                break
