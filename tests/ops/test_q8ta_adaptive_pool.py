"""q8ta_adaptive_avg_pool2d on the default Vulkan device, validation on.

Every case of `runtime.tools.examples_q8ta_pool.ADAPTIVE_CASES` (output sizes
that divide the input, that do not, larger than the input, 1 or 2 ints,
channels not a multiple of 4) runs from a host input and
from a device input in each packed layout, bit-exact against the reference
(the raw output words too, so padding bytes must be 0); the reference's
windows are PyTorch's, and it is at most one step from PyTorch's decomposed
path, only where the exact average is a rounding tie.
"""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
from op_testlib import assert_argument_error
from test_q8ta_pool import (
    _agreement,
    _exact_average,
    check_every_layout,
    pytorch_decomposed,
)
from torch.nn import functional as F

import runtime
from runtime.families.pool2d import adaptive_windows
from runtime.tools.examples_q8ta_pool import (
    ADAPTIVE_CASES,
    ADAPTIVE_CASES_BY_NAME,
    adaptive_pool_args,
)

OP = "etvk.q8ta_adaptive_avg_pool2d.default"


@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=[c.name for c in ADAPTIVE_CASES])
def test_every_layout_matches_the_reference_bit_exactly(case, dispatch_trace):
    check_every_layout(runtime.get_op(OP), adaptive_pool_args(case), case.name)
    assert "q8ta_adaptive_avg_pool2d" in dispatch_trace(), "the shader never reached the device"


def test_windows_are_pytorchs():
    """Each output averages its window: the reference on values one-hot per pixel."""
    for size, out in ((7, 3), (5, 7), (13, 6), (6, 3), (1, 7)):
        start, end = adaptive_windows(size, out)
        eye = torch.eye(size, dtype=torch.float64).reshape(size, 1, size, 1)
        cover = torch.nn.functional.adaptive_avg_pool2d(eye, (out, 1)).reshape(size, out) != 0
        for i in range(out):
            assert cover[:, i].nonzero().flatten().tolist() == list(range(start[i], end[i])), (size, out, i)


@pytest.mark.parametrize("output_ratio", [1.0, 0.7316])
def test_agreement_with_pytorch(output_ratio):
    """Shared qparams (PT2E's choice, ratio 1) make exact ties common; a ratio in general
    position has none."""
    op = runtime.get_op(OP)
    got, want, exact = [], [], []
    for case in ADAPTIVE_CASES:
        x, s, zp, _, out_zp, size = adaptive_pool_args(case)
        out_s = s * output_ratio
        got.append(op.reference(x, s, zp, out_s, out_zp, size).flatten())
        want.append(pytorch_decomposed(lambda fp, size=size: F.adaptive_avg_pool2d(fp, (size[0], size[-1])),
                                       x, s, zp, out_s, out_zp).flatten())
        (ya, yb), (xa, xb) = adaptive_windows(case.H, size[0]), adaptive_windows(case.W, size[-1])
        sums = torch.stack([torch.stack([(x[:, :, ya[i]:yb[i], xa[j]:xb[j]].to(torch.int64) - zp).sum((2, 3))
                                         for j in range(len(xa))], -1) for i in range(len(ya))], -2)
        divisors = (yb - ya)[:, None] * (xb - xa)[None, :]
        exact.append(_exact_average(sums, divisors, s, out_s).flatten())
    _agreement(torch.cat(got), torch.cat(want), torch.cat(exact), "adaptive")


@pytest.mark.parametrize(("index", "value", "arg", "text"), [
    (5, [0, 7], "output_size", "ints > 0"),
    (5, [7, 7, 7], "output_size", "ints > 0"),
    (5, [2**28, 1], "output_size", "within 2^31"),
    (1, 0.0, "input_scale", "[1e-20, 1e20]"),
    (4, -129, "output_zero_point", "int8"),
])
def test_bad_arguments_name_the_op_and_argument(index, value, arg, text):
    args = list(adaptive_pool_args(ADAPTIVE_CASES_BY_NAME["alexnet_6x6_of_13x13"]))
    args[index] = value
    assert_argument_error(runtime.get_op(OP), args, arg, text)
