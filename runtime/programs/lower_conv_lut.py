"""Lookup tables folded into the conv that produces their input.

``q8ta_conv2d -> q8ta_lut(conv output, table)`` (what lower_lut.py made of
PT2E's ``conv -> q -> dq -> silu | sigmoid | hardsigmoid | ... -> q`` after
lower_cnn.py made the conv) becomes one ``q8ta_conv2d`` with ``lut=table``: its
epilogue computes the conv's int8 output exactly as before, then gathers each
value from the table (docs/int8_cnn_ops.md "Lookup table"), so the folded op
gives the very bits of the two ops. It folds where:

- the conv's int8 output has the lookup as its only reader and is no program
  output;
- the conv has no residual: the ops take a table or a residual, not both
  (a conv whose add lower_residual.py fused keeps a lookup after that add as
  its own op; a lookup between a conv and an add, ``conv -> silu -> add``,
  folds, and the add stays a q8ta_add);
- the table is a constant of the program (lower_lut.py makes it one).

Run by lower.py after lower_residual.py and lower_lut.py, which leave no
unread node behind. Pure graph work, no Vulkan.
"""

from __future__ import annotations

from runtime.programs.lower_lut import LUT
from runtime.programs.nodes import Const, Node
from runtime.programs.rewrite import CONV, Rewriter, with_arguments


def fold_lookup_tables(rw: Rewriter) -> None:
    """Every ``q8ta_conv2d -> q8ta_lut`` the module docstring allows, folded."""
    program = rw.program
    for lut in [n for n in program.nodes if n.target == LUT]:
        x, table = lut.args
        conv = rw.plain_conv(x, lut)
        if conv is None or not isinstance(table, Const):
            continue
        program.nodes.remove(lut)
        rw.replace(conv, Node(conv.name, CONV, with_arguments(conv, lut=table), {}, lut.outputs))
