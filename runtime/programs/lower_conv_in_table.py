"""Per-channel tables folded into the pointwise conv that reads their output.

``q8ta_channel_lut(x, table) -> q8ta_conv2d`` (DenseNet's batch norm and relu
on the concatenation, lower_lut.py `lower_channel_tables`, feeding the dense
layer's 1x1 conv) becomes one ``q8ta_conv2d`` of x with ``input_table=table``:
the pointwise GEMM looks each input byte up in its channel's table as it
stages its input, then multiplies exactly as before (docs/int8_cnn_ops.md
"Input tables"), so the folded op gives the very bits of the two ops and the
table op's read and write of the whole tensor are gone. The conv's input
qparams stay the tables' output qparams. It folds where:

- the table op's output has the conv as its only reader, as the conv's input
  (not its residual), and is no program output;
- the table op reads no window sums (``sums`` None: the tables map x alone)
  and its table is a constant of the program (lower_lut.py makes it one);
- the conv is pointwise: 1x1 kernel, stride 1, padding 0, dilation 1, one
  group (only the pointwise GEMMs read tables), and has no input table yet.

Run by lower.py after lower_lut.py; its order against lower_conv_lut.py does
not matter (a conv takes an input table with an output table or a residual).
Pure graph work, no Vulkan.
"""

from __future__ import annotations

from runtime.programs.lower_lut import CHANNEL_LUT
from runtime.programs.nodes import Const, Node, Ref
from runtime.programs.rewrite import CONV, Rewriter, bind, ints, with_arguments


def _pointwise(conv: dict) -> bool:
    """Whether bound conv arguments describe a pointwise conv of one group."""
    return (ints(conv["kernel_size"]) in ([1], [1, 1]) and set(ints(conv["stride"])) == {1}
            and set(ints(conv["padding"])) == {0} and set(ints(conv["dilation"])) == {1}
            and conv["groups"] == 1)


def fold_input_tables(rw: Rewriter) -> None:
    """Every ``q8ta_channel_lut -> q8ta_conv2d`` the module docstring allows, folded."""
    program = rw.program
    for lut in [n for n in program.nodes if n.target == CHANNEL_LUT]:
        tables = bind(lut)
        conv = rw.only_user(lut)
        if conv is None or conv.target != CONV or conv.kwargs or tables["sums"] is not None \
                or not isinstance(tables["x"], Ref) or not isinstance(tables["table"], Const):
            continue
        b = bind(conv)
        out = Ref(lut.outputs[0])
        if b["x"] != out or b["residual"] == out or b["input_table"] is not None or not _pointwise(b):
            continue
        program.nodes.remove(lut)
        rw.replace(conv, Node(conv.name, CONV, with_arguments(conv, x=tables["x"], input_table=tables["table"]),
                              {}, conv.outputs))
