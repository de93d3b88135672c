"""A `Stream` that records the quantize family's elementwise ops with a given number of units
per invocation (their shaders' UNITS spec constant) instead of the op's own choice.

The tests check every candidate with it, and ``benchmarks/runtime_bench.py --sweep`` times
them, through the ops' ordinary recording path (checks, uploads, outputs).
"""

from __future__ import annotations

from runtime.ops.stub_support import elementwise
from runtime.vulkan.stream import Stream

CANDIDATES = (1, 2, 4, 8)  # the UNITS values the benchmark sweep times


class UnitsStream(Stream):
    """Records dispatches that set UNITS with `units` instead, and the global size to match
    (`elementwise` of the dispatch's ``t_out``); other dispatches are recorded unchanged."""

    def __init__(self, units: int, device=None):
        super().__init__(device)
        self.units = units

    def dispatch(self, kernel, op: str, *, bindings: dict, push: dict, global_size=None,
                 groups=None, spec_constants: dict | None = None) -> None:
        if spec_constants and "UNITS" in spec_constants:
            spec_constants = {**spec_constants, "UNITS": self.units}
            global_size = elementwise(bindings["t_out"], self.units)
        super().dispatch(kernel, op, bindings=bindings, push=push, global_size=global_size,
                         groups=groups, spec_constants=spec_constants)
