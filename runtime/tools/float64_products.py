"""PyTorch's own graphs with their float products accumulated in float64: `Float64Products`.

An exported PT2E int8 graph computes its convs and linears on dequantized fp32 values in the
CPU kernel's (oneDNN's) accumulation order, which depends on the CPU's instruction set: on a
chaotic random-weight network a rounding step that order moves grows into the logits, so the
graph's own output differs from machine to machine (benchmarks/NOTES.md session 35: 13-29 dB
from itself run in float64). Under this dispatch mode the same graph runs with those products
summed in float64 and rounded to fp32 once, a reference that no longer depends on the CPU.
Used by the model tests and benchmarks/model_agreement.py.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten


class Float64Products(TorchDispatchMode):
    """Runs convolutions and matmuls with float32 tensor arguments in float64, the result cast
    back to float32; every other op runs unchanged. `counts` counts the ops so run."""

    # what reaches a dispatch mode: the graph's conv2d and linear decompose to convolution and
    # addmm above it
    OPS = frozenset({_aten.convolution, _aten.addmm, _aten.mm, _aten.bmm, _aten.baddbmm})

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in self.OPS:
            return func(*args, **kwargs)
        self.counts[str(func)] += 1

        def up(value):
            is_fp32 = isinstance(value, torch.Tensor) and value.dtype == torch.float32
            return value.double() if is_fp32 else value

        return func(*map(up, args), **{key: up(value) for key, value in kwargs.items()}).float()
