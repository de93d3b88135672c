"""Prepacking of the int8 weights of `q8ta_linear` (int8 x int8 linear).

`pack_q8ta_linear_weights(weights)` turns the int8 ``[N_out, K]`` weight of
op_specs/q8ta_linear.yaml into the int32 words templates/q8ta_linear.glsl.j2
reads as ``ivec4``: ivec4 ``n4 * K4 + k4`` (``K4 = ceil(K / 4)``) holds in
component ``j`` the word of output channel ``4 * n4 + j`` for K values
``4 * k4 .. 4 * k4 + 3`` (byte ``k % 4``), zero past K and past N_out. The
invocations of a workgroup take consecutive ``k4``, so they read consecutive
16-byte units. This is the pointwise GEMM packing of the conv family (a
linear is a 1x1 conv), so it reuses `runtime.families.conv2d.pack_gemm_weights`.

Pure torch on the CPU; it must not touch Vulkan or cache anything (the op
stub's ``prepacked(...)`` packs a weight once). Called through the op spec,
by the examples and by the tests.
"""

from __future__ import annotations

import torch

from runtime.families.conv2d import pack_gemm_weights, weight_sums


def _as_1x1_conv(weights: torch.Tensor) -> torch.Tensor:
    if weights.dtype != torch.int8 or weights.dim() != 2:
        raise ValueError(f"weights must be an int8 [N_out, K] tensor, got {weights.dtype} "
                         f"{list(weights.shape)}")
    return weights.reshape(*weights.shape, 1, 1)


def pack_q8ta_linear_weights(weights: torch.Tensor) -> torch.Tensor:
    """The packed weights (layout in the module docstring).

    Args:
        weights: int8 ``[N_out, K]``.

    Returns:
        int32 ``[ceil(N_out / 4) * ceil(K / 4) * 4]``.

    Raises:
        ValueError: ``weights`` is not a 2-D int8 tensor.
    """
    return pack_gemm_weights(_as_1x1_conv(weights), 1)


def linear_weight_sums(weights: torch.Tensor) -> torch.Tensor:
    """int32 ``[N_out]``: the sum of each output channel's weights."""
    return weight_sums(_as_1x1_conv(weights))
