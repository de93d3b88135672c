"""A program's packed int8 layouts made concrete for a GPU family.

Builds the layout resolver's view of a program (runtime.families.conv2d_layouts:
every node that touches packed int8 tensors, with the conv geometry the
dispatcher needs, and the measured choices where the caller passes their
lookup) and writes the result back: every packed value's layout,
and each node argument still holding the placeholder (a quantize's
``layout``) gets its output's layout. Pure; used by the loader and by
`Program.run_reference` (on the CPU any family gives the same values);
`conv_geometry` also by the tuner.
"""

from __future__ import annotations

import dataclasses

from runtime.families.conv2d import conv2d_params
from runtime.families.conv2d_layouts import (
    CONV_OPS,
    PLACEHOLDER,
    PackedOp,
    resolve_packed_int8_conv2d,
)
from runtime.programs.nodes import map_args

# Argument positions of the conv schema (OPS.md family 2): weights, then kernel_size .. groups.
_CONV_WEIGHTS, _CONV_GEOMETRY = 3, slice(9, 14)


def conv_geometry(program, node):
    """The `Conv2dParams` of a conv node (one of `CONV_OPS`) of `program`."""
    weights = program.constants[node.args[_CONV_WEIGHTS].name]
    return conv2d_params(program.values[node.args[0].name].shape, weights.shape,
                         *node.args[_CONV_GEOMETRY])


def _packed_ops(program) -> list[PackedOp]:
    """The layout resolver's view of the nodes that touch packed int8 tensors."""
    ops = []
    for node in program.nodes:
        names = [n for n in dict.fromkeys([*node.reads(), *node.outputs])
                 if program.values[n].layout is not None]
        if not names:
            continue
        layouts = {n: program.values[n].layout for n in names}
        if node.target in CONV_OPS:
            ops.append(PackedOp(node.target, layouts, conv_geometry(program, node), node.args[0].name))
        else:
            ops.append(PackedOp(node.target, layouts))
    return ops


def resolve_layouts(program, family: str, tuned=None, coop=()):
    """A copy of `program` whose packed tensors have concrete layouts for `family` (and the
    measured choices `tuned` looks up, `runtime.ops.tuning.lookup`; None: the rule alone; and
    `coop`, the GEMM kernels the device runs on cooperative matrices); a node argument holding
    the placeholder (a quantize's ``layout``) gets its output's layout."""
    resolved = program.copy()
    for op in resolve_packed_int8_conv2d(_packed_ops(program), family, tuned, coop):
        for name, layout in op.layouts.items():
            resolved.values[name] = dataclasses.replace(resolved.values[name], layout=layout)
    for node in resolved.nodes:
        packed = [resolved.values[o].layout for o in node.outputs if resolved.values[o].layout]
        if packed:
            node.args = map_args(node.args, lambda a, lay=packed[0]: lay if a == PLACEHOLDER else a)
    return resolved
