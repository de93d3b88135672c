"""Reference numerics of `q8ta_linear` (int8 x int8 linear, op_specs/q8ta_linear.yaml).

The definition the shaders match bit for bit: the accumulator ``acc = Σ_k
x[m, k] * weights[n, k]`` is exact (int64 here, int32 on the device), then
the epilogue of OPS.md family 2 (`runtime.reference.conv2d.epilogue_values`
and `requantize`, no activation) in fp32, each operation rounded:

    y   = float32(acc - input_zero_point * weight_sums[n]) * float32(float32(input_scale) * weight_scales[n]) + bias[n]
    out = clamp(roundEven(y * float32(1 / output_scale)) + output_zero_point, -128, 127)   (int8)
    out = y                                                                                  (output_scale None: fp32)

Called by the op registry (the ``torch.ops.etvk.q8ta_linear`` CPU kernel) and
the tests. It must not import anything from the Vulkan side, nor validate
arguments (the op stub checks them).
"""

from __future__ import annotations

import torch

from runtime.reference.conv2d import epilogue_values, requantize


def linear_accumulators(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The exact int64 sums ``Σ_k x[m, k] * weights[n, k]``, ``[M, N_out]``.

    ``x`` is ``[M, K]`` or ``[N, K, 1, 1]`` (read as N rows of K values).
    """
    rows = x.reshape(x.shape[0], x.shape[1]).to(torch.int64)
    return rows @ weights.to(torch.int64).T


def q8ta_linear(x, input_scale, input_zero_point, weights, weight_sums, weight_scales, bias,
                output_scale=None, output_zero_point=0):
    """int8 linear with per-tensor activations and per-channel symmetric weights.

    Args:
        x: int8 ``[M, K]`` or ``[N, K, 1, 1]``.
        input_scale, input_zero_point: x's quantization.
        weights: int8 ``[N_out, K]``; weight_sums: int32 ``[N_out]``, the sum of
            each row; weight_scales: fp32 ``[N_out]``; bias: fp32 ``[N_out]`` or None.
        output_scale, output_zero_point: the output's quantization; None for
            an fp32 output.

    Returns:
        int8 ``[M, N_out]`` (``output_scale`` given) or fp32 ``[M, N_out]``.
    """
    acc = linear_accumulators(x, weights)
    if output_scale is None:
        return epilogue_values(acc, input_scale, input_zero_point, weight_sums, weight_scales, bias)
    return requantize(acc, input_scale, input_zero_point, weight_sums, weight_scales,
                      output_scale, output_zero_point, bias, "none")
