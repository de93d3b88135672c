"""Host-side rules of the floating-point LLM family (op_specs/llm.yaml, docs/llm_ops.md).

Pure Python / torch, three jobs:

- `broadcast`: how ``b`` broadcasts to ``a``'s shape, as at most 4 merged
  dimensions of ``a`` with ``b``'s element stride along each (0 where ``b``
  repeats), the push constants of the ``llm_binary`` shader;
- `bad_indices`: the ids of an embedding's indices outside the table, for the
  host-side range check;
- `scalar_operand`: the fp32 value a tensor-with-Python-scalar op combines with,
  rounded as PyTorch rounds it.

It must not touch Vulkan nor check op arguments beyond what these answers need
(the op spec's checks name the bad argument). Called by the llm op stubs
(through runtime/ops/stub_support.py), the references in runtime/reference/llm.py
and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The most merged dimensions the llm_binary shader indexes (an ivec4 of sizes and of strides).
MAX_BROADCAST_DIMS = 4
ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
BINARY_OPERATIONS = ("add", "sub", "mul")
SCALAR_OPERATIONS = ("add", "mul")


@dataclass(frozen=True)
class Broadcast:
    """``a``'s dimensions merged where ``b`` walks them alike, innermost first.

    ``sizes[i]`` is the size of merged dimension ``i`` (0 innermost) and
    ``strides[i]`` ``b``'s element stride along it (0: ``b`` repeats). Padded to
    `MAX_BROADCAST_DIMS` with size 1, stride 0. ``dims`` is how many are real.
    """

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dims: int


def broadcast(a_shape, b_shape) -> Broadcast | None:
    """How ``b`` broadcasts to ``a_shape`` by PyTorch's rules (the result keeps ``a``'s shape).

    Returns None when ``b_shape`` does not broadcast to ``a_shape`` itself (a
    dimension of ``b`` that is neither 1 nor ``a``'s, more dimensions than ``a``).
    The `Broadcast` may have more than `MAX_BROADCAST_DIMS` dims (``b`` alternates
    between repeating and walking more often than the shader can index).
    """
    a_shape, b_shape = tuple(int(d) for d in a_shape), tuple(int(d) for d in b_shape)
    if len(b_shape) > len(a_shape):
        return None
    b_full = (1,) * (len(a_shape) - len(b_shape)) + b_shape
    if any(b not in (1, a) for a, b in zip(a_shape, b_full, strict=True)):
        return None
    # b's contiguous strides, 0 along the dimensions it repeats; dimensions of size 1 dropped.
    dims = []  # (size, b stride), innermost first
    stride = 1
    for a, b in zip(reversed(a_shape), reversed(b_full), strict=True):
        if a != 1:
            dims.append((a, stride if b == a else 0))
        stride *= b
    merged: list[tuple[int, int]] = []
    for size, b_stride in dims:
        if merged:
            inner_size, inner_stride = merged[-1]
            if b_stride == inner_stride * inner_size:  # walks on where the inner one stopped (or both 0)
                merged[-1] = (inner_size * size, inner_stride)
                continue
        merged.append((size, b_stride))
    count = len(merged)
    merged += [(1, 0)] * (MAX_BROADCAST_DIMS - count)
    return Broadcast(tuple(s for s, _ in merged), tuple(t for _, t in merged), count)


def bad_indices(indices: torch.Tensor, size: int) -> tuple[int, ...]:
    """The values of ``indices`` outside ``[0, size)``, in memory order (empty: all inside)."""
    flat = indices.reshape(-1)
    return tuple(int(v) for v in flat[(flat < 0) | (flat >= size)])


def scalar_operand(value: float, dtype: torch.dtype, operation: str) -> float:
    """The fp32 number ``a <operation> value`` combines with, as PyTorch (2.13, CPU) rounds it.

    ``mul`` rounds the Python float to fp32; ``add`` rounds it to ``a``'s dtype
    (through fp32, as ``c10::Half`` does), so an fp16 tensor adds an fp16 value.
    Either way the fp32 operation's result is then rounded to ``dtype``.
    """
    operand = torch.tensor(value, dtype=torch.float64).to(torch.float32)
    if operation == "add":
        operand = operand.to(dtype).to(torch.float32)
    return float(operand)
