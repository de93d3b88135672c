"""Recording the quantize family's shaders with other tunable choices than the ops' own.

The elementwise quantize / dequantize shaders take UNITS units (or texels) per invocation;
the per-token shaders (choose_qparams, the fused dynamic quantize) take a workgroup size,
LANES invocations per token and REDUCERS or REGS. The tests check every candidate with
these, and ``benchmarks/runtime_bench.py --sweep`` times them.
"""

from __future__ import annotations

import dataclasses

import torch

from runtime.ops.stub_support import elementwise
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

CANDIDATES = (1, 2, 4, 8)  # the UNITS values the benchmark sweep times
# (workgroup size, LANES) of the per-token shaders the benchmark sweep times: one token per
# workgroup of 32 to 128, or teams of 8 to 32 invocations sharing one of 64 to 256
TEAMS = ((32, 32), (64, 64), (128, 128), (64, 32), (128, 32), (64, 16), (128, 16), (256, 16),
         (64, 8), (128, 8), (256, 8))
# (workgroup size, LANES, REDUCERS) of choose_qparams the benchmark sweep times
CHOOSE_CANDIDATES = tuple((size, lanes, reducers) for size, lanes in TEAMS for reducers in (4, 8))
# (workgroup size, LANES, REGS) of the fused dynamic quantize: REGS keeps a 1024-value token
# (the benchmark's) in registers
DYNAMIC_CANDIDATES = tuple((size, lanes, 256 // lanes) for size, lanes in TEAMS)


class UnitsStream(Stream):
    """A `Stream` whose dispatches that set UNITS get `units` instead, and the global size to
    match (`elementwise` of the dispatch's ``t_out``; per-token quantize's teams per token,
    ROW_LANES, keep theirs); other dispatches are recorded unchanged.
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
            if not spec_constants.get("ROW_LANES"):  # teams per token: a size without UNITS
                global_size = elementwise(bindings["t_out"], self.units)
        super().dispatch(kernel, op, bindings=bindings, push=push, global_size=global_size,
                         groups=groups, spec_constants=spec_constants)


def record_token_shader(stream: Stream, variant, op: str, x: Tensor, workgroup: int, lanes: int,
                        spec_constants: dict) -> dict[str, Tensor]:
    """Record a per-token shader `variant` (choose_qparams_per_token_asymmetric's, or
    dynamic_quantize_per_token's) for `op` on device tensor `x` (of the variant's storage and
    dtype), with `workgroup` invocations per workgroup, `lanes` of them per token (LANES) and
    the other `spec_constants` (REDUCERS, REGS); returns its outputs by binding name: t_scales
    and t_zero_points (one value per token), and t_out (x's shape, int8) where it has one."""
    kernel = dataclasses.replace(variant, interface=dataclasses.replace(
        variant.interface, workgroup=(workgroup, 1, 1)))
    last_dim = x.shape[-1]
    tokens = x.numel() // last_dim
    outputs = {"t_scales": Tensor.empty((tokens,), torch.float32),
               "t_zero_points": Tensor.empty((tokens,), torch.int32)}
    if any(b.name == "t_out" for b in variant.interface.bindings):
        outputs["t_out"] = Tensor.empty(x.shape, torch.int8, x.storage)
    teams = workgroup // max(1, min(lanes, workgroup))  # tokens per workgroup
    stream.dispatch(kernel, op, bindings={**outputs, "t_in": x},
                    push={"tokens": tokens, "last_dim": last_dim}, groups=[-(-tokens // teams)],
                    spec_constants={"LANES": lanes, **spec_constants})
    return outputs
