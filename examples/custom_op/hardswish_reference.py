"""Reference of the example op ``etvk.q8ta_hardswish.default``: the definition its shader matches.

Per tensor, in fp32 and in this order (the shader's): dequantize
``x = float32(q - input_zero_point) * float32(input_scale)``, then
``y = (x * clamp(x + 3, 0, 6)) * float32(1/6)``, then requantize
``clamp(roundEven(y * float32(1 / output_scale)) + output_zero_point, -128, 127)``.
PyTorch's ``hardswish`` divides by 6 instead of multiplying by float32(1/6):
its fp32 result may differ by one ulp, so after requantizing at most one step.
The packed layout only says where the device keeps the values.

This module must be importable where the op runs on the CPU (``torch.ops.etvk``):
put this folder on ``sys.path`` (or install it).
"""

from __future__ import annotations

import torch

from runtime.reference.quantize import fp32, fp32_recip

SIXTH = torch.tensor(1 / 6, dtype=torch.float32)


def q8ta_hardswish(x, input_scale, input_zero_point, output_scale, output_zero_point):
    """int8 ``[N, C, H, W]`` -> int8 of the same shape (see the module docstring)."""
    q = x.to(torch.int32) - input_zero_point
    xf = q.to(torch.float32) * fp32(input_scale)
    y = (xf * torch.clamp(xf + 3.0, 0.0, 6.0)) * SIXTH
    out = torch.round(y * fp32_recip(output_scale)) + output_zero_point
    return out.clamp(-128, 127).to(torch.int8)
