"""The host definition of etvk.stream_read (benchmarks/read_kernel/): its output carries no value."""

from __future__ import annotations

import torch


def stream_read(x: torch.Tensor, invocations: int) -> torch.Tensor:
    """A zero: the kernel's one output word is written only on a pattern no benchmark hits."""
    return torch.zeros(1, dtype=torch.int32)
