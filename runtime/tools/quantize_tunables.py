"""Recording the quantize family's shaders with other tunable choices than the ops' own.

The elementwise quantize / dequantize shaders take UNITS units (or texels) per invocation;
choose_qparams takes a workgroup size and REDUCERS. The tests check every candidate with
these, and ``benchmarks/runtime_bench.py --sweep`` times them.
"""

from __future__ import annotations

import dataclasses

import torch

from runtime.ops.stub_support import elementwise
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

CANDIDATES = (1, 2, 4, 8)  # the UNITS values the benchmark sweep times
# (workgroup size, REDUCERS) pairs of choose_qparams the benchmark sweep times
CHOOSE_CANDIDATES = tuple((size, reducers) for size in (32, 64, 128, 256) for reducers in (4, 8, 16))


class UnitsStream(Stream):
    """A `Stream` whose dispatches that set UNITS get `units` instead, and the global size to
    match (`elementwise` of the dispatch's ``t_out``); other dispatches are recorded unchanged.
    Ops record into it through their ordinary path (checks, uploads, outputs). `chosen` is
    the UNITS the op asked for in the last such dispatch (None before one)."""

    def __init__(self, units: int, device=None):
        super().__init__(device)
        self.units = units
        self.chosen = None

    def dispatch(self, kernel, op: str, *, bindings: dict, push: dict, global_size=None,
                 groups=None, spec_constants: dict | None = None) -> None:
        if spec_constants and "UNITS" in spec_constants:
            self.chosen = spec_constants["UNITS"]
            spec_constants = {**spec_constants, "UNITS": self.units}
            global_size = elementwise(bindings["t_out"], self.units)
        super().dispatch(kernel, op, bindings=bindings, push=push, global_size=global_size,
                         groups=groups, spec_constants=spec_constants)


def record_choose_qparams(stream: Stream, variant, x: Tensor, workgroup: int,
                          reducers: int) -> tuple[Tensor, Tensor]:
    """Record a choose_qparams_per_token_asymmetric `variant` on device tensor `x` (of the
    variant's storage and dtype) with `workgroup` invocations per token and `reducers`;
    returns the (scales, zero_points) device tensors, one value per token."""
    kernel = dataclasses.replace(variant, interface=dataclasses.replace(
        variant.interface, workgroup=(workgroup, 1, 1)))
    last_dim = x.shape[-1]
    tokens = x.numel() // last_dim
    scales = Tensor.empty((tokens,), torch.float32)
    zero_points = Tensor.empty((tokens,), torch.int32)
    stream.dispatch(kernel, "etvk.choose_qparams_per_token_asymmetric.default",
                    bindings={"t_scales": scales, "t_zero_points": zero_points, "t_in": x},
                    push={"tokens": tokens, "last_dim": last_dim}, groups=[tokens],
                    spec_constants={"REDUCERS": reducers})
    return scales, zero_points
