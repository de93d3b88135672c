"""Resolution of the ``PACKED_INT8_CONV2D`` placeholder (OPS.md "Packed int8 activations", rules 3-4).

A lowered program marks the packed int8 tensors of its int8 regions with the
placeholder; loading it on a device replaces every placeholder by a concrete
layout (4W4C, 4C, 4C1W). Every op of the region writes its packed outputs in
the layout of its packed inputs (a conv's output takes its input's layout),
so the packed tensors an op touches form one *class* that shares a layout:
classes are the connected components of "read or written by the same op".
Per class:

1. a layout some op states explicitly (not the placeholder) is the class's;
   two different ones are an error;
2. else rule 3: each conv op reading a class tensor as its input wants a
   layout: the one its measured choice reads where the tuner measured its
   geometry on this device (the winner's for the dispatcher, the algorithm's
   own best for an algorithm op: the `tuned` lookup), else the layout its
   algorithm reads (`choose_algorithm` for the dispatcher, with the GEMM
   kernels the device runs on cooperative matrices: im2col and pw read 4C,
   on cooperative matrices too, direct and depthwise 4C1W); the layout most of the class's convs want
   wins, the earliest conv in program order breaking a tie;
3. else (no conv reads the class) 4C1W.

Pure Python; no Vulkan: the measured choices come through the `tuned`
callable (runtime/ops/tuning.py's `lookup`). Called by the program loader
(runtime.programs) and the tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from runtime.families.conv2d import Conv2dParams, check_family, choose_algorithm
from runtime.families.conv2d_tuning import Conv2dChoice
from runtime.vulkan.layouts import PACKED_LAYOUTS

PLACEHOLDER = "PACKED_INT8_CONV2D"
DISPATCH_OP = "etvk.q8ta_conv2d.default"
# The input layout each conv algorithm reads (rule 3).
ALGORITHM_INPUT_LAYOUT = {"pw": "4C", "im2col": "4C", "pw_coop": "4C", "im2col_coop": "4C",
                          "general": "4C1W", "dw": "4C1W"}
CONV_OP_ALGORITHMS = {
    "etvk.q8ta_conv2d_pw.default": "pw",
    "etvk.q8ta_conv2d_im2col.default": "im2col",
    "etvk.q8ta_conv2d_pw_coop.default": "pw",
    "etvk.q8ta_conv2d_im2col_coop.default": "im2col",
    "etvk.q8ta_conv2d_general.default": "general",
    "etvk.q8ta_conv2d_dw.default": "dw",
}
CONV_OPS = (DISPATCH_OP, *CONV_OP_ALGORITHMS)
FALLBACK_LAYOUT = "4C1W"
# (geometry, algorithm or None for the winner) -> the measured choice, or None
TunedLookup = Callable[[Conv2dParams, "str | None"], "Conv2dChoice | None"]


@dataclass(frozen=True)
class PackedOp:
    """One op of a program, as the layout resolver sees it.

    Attributes:
        target: the op name, e.g. "etvk.q8ta_conv2d.default".
        layouts: for each packed int8 tensor the op reads or writes (arguments
            and outputs), its value name in the program -> a layout of
            `PACKED_LAYOUTS` or `PLACEHOLDER`. A value name shared by two ops
            is one tensor, so it ends up with one layout.
        conv: the geometry, needed for the dispatcher op ``etvk.q8ta_conv2d``.
        input_arg: the value name (a key of ``layouts``) a conv op reads as x.
    """

    target: str
    layouts: Mapping[str, str] = field(hash=False)
    conv: Conv2dParams | None = None
    input_arg: str = "x"

    def __post_init__(self):
        object.__setattr__(self, "layouts", MappingProxyType(dict(self.layouts)))


def wanted_input_layout(op: PackedOp, family: str, tuned: TunedLookup | None = None,
                        coop: Collection[str] = ()) -> str | None:
    """Rule 3: the input layout a conv op wants on `family` (a measured choice's where `tuned`
    knows one; `coop`: the GEMM kernels the device runs on cooperative matrices, as
    `choose_algorithm` takes them), or None for any other op.

    Raises:
        ValueError: a conv op without its input among its packed tensors, or
            the dispatcher without its geometry.
    """
    if op.target not in CONV_OPS:
        return None
    if op.input_arg not in op.layouts:
        raise ValueError(f"{op.target}: input {op.input_arg!r} is not among its packed tensors")
    algorithm = CONV_OP_ALGORITHMS.get(op.target)
    if op.conv is None and algorithm is None:
        raise ValueError(f"{op.target}: the conv geometry is needed to choose its algorithm")
    choice = tuned(op.conv, algorithm) if tuned is not None and op.conv is not None else None
    if choice is not None:
        return choice.layout
    return ALGORITHM_INPUT_LAYOUT[algorithm or choose_algorithm(op.conv, family, coop)]


class _Classes:
    """Union-find over value names; each root remembers the class's stated layout."""

    def __init__(self):
        self.parent: dict[str, str] = {}
        self.stated: dict[str, tuple[str, str]] = {}  # root -> (layout, the value that states it)

    def find(self, name: str) -> str:
        self.parent.setdefault(name, name)
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def state(self, name: str, layout: str, target: str) -> None:
        root = self.find(name)
        known = self.stated.get(root)
        if known is None:
            self.stated[root] = (layout, name)
        elif known[0] != layout:
            what = f"{name!r} is" if known[1] == name else f"{known[1]!r} and {name!r} share a layout but are"
            raise ValueError(f"{what} {known[0]} in one op and {layout} in {target}")

    def union(self, a: str, b: str, target: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        if rb in self.stated:
            layout, name = self.stated.pop(rb)
            self.state(name, layout, target)


def resolve_packed_int8_conv2d(ops: Sequence[PackedOp], family: str,
                               tuned: TunedLookup | None = None,
                               coop: Collection[str] = ()) -> list[PackedOp]:
    """Replaces every `PLACEHOLDER` layout of a program's ops (module docstring: classes, rules 3-4).

    Args:
        ops: the program's ops that touch packed int8 tensors, in program order.
        family: the device's GPU family (`runtime.vulkan.device.GPU_FAMILIES`).
        tuned: the measured choices' lookup (None: the rule alone).
        coop: the GEMM kernels ("pw", "im2col") the device runs on cooperative
            matrices (`choose_algorithm`'s argument).

    Returns:
        New `PackedOp`s, in the same order, with concrete layouts only.

    Raises:
        ValueError: an unknown family or layout, two different concrete layouts
            in one class, or a conv op without its input or geometry.
    """
    check_family(family)
    classes = _Classes()
    for op in ops:
        names = list(op.layouts)
        for name, layout in op.layouts.items():
            if layout != PLACEHOLDER and layout not in PACKED_LAYOUTS:
                raise ValueError(f"{op.target}: {name!r} has layout {layout!r}; use one of "
                                 f"{', '.join(PACKED_LAYOUTS)} or {PLACEHOLDER}")
            classes.find(name)
            if layout != PLACEHOLDER:
                classes.state(name, layout, op.target)
        for other in names[1:]:
            classes.union(names[0], other, op.target)
    votes: dict[str, Counter] = {}
    first: dict[str, dict[str, int]] = {}
    for index, op in enumerate(ops):
        wanted = wanted_input_layout(op, family, tuned, coop)
        if wanted is not None:
            root = classes.find(op.input_arg)
            votes.setdefault(root, Counter())[wanted] += 1
            first.setdefault(root, {}).setdefault(wanted, index)

    def layout_of(name: str) -> str:
        root = classes.find(name)
        if root in classes.stated:
            return classes.stated[root][0]
        if root in votes:
            return min(votes[root], key=lambda lay: (-votes[root][lay], first[root][lay]))
        return FALLBACK_LAYOUT

    return [replace(op, layouts={name: layout_of(name) for name in op.layouts}) for op in ops]
