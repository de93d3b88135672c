"""Reference of etvk.linear_qta8a_qga4w (OPS.md family 3) against independent computations.

The fp32 reference must stay within its rounding bound of the float64 one,
the float64 one must equal dequantize-then-``F.linear`` in float64 (with
quantized_decomposed's dequantize ops, exact in float64), and the documented
evaluation order must be what the code does. `CASES` lists the shapes and
value patterns; `BAD_ARGS` the argument errors.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
import torch.nn.functional as F

import runtime
from runtime.errors import ArgumentError, ArgumentTypeError
from runtime.families.int4 import pack_int4, unpack_int4
from runtime.reference.linear import linear_qta8a_qga4w, linear_qta8a_qga4w_fp64

U = 2.0**-24  # fp32 unit roundoff

# id -> (leading shape of x, N, K, group_size, values); values "random" or "extreme"
# ("extreme": x - zp = 255 and w - zero = 15 everywhere, |isum| = 4096 * 3825 just below 2**24).
CASES = {
    "one token": ((1,), 16, 64, 32, "random"),
    "many tokens": ((33,), 24, 128, 64, "random"),
    "3-D input": ((2, 3), 8, 64, 8, "random"),
    "1-D input": ((), 8, 32, 32, "random"),
    "one group per row": ((5,), 8, 256, 256, "random"),
    "many groups": ((3,), 4, 512, 8, "random"),
    "extreme values": ((2,), 4, 4096, 4096, "extreme"),
    "no tokens": ((0,), 8, 64, 32, "random"),
    "no tokens 3-D": ((2, 0), 8, 64, 32, "random"),
}


def make_args(case, seed=0, flat_qparams=False):
    """Arguments in schema order; qparams shaped [..., 1] or, with flat_qparams, [tokens]."""
    lead, n, k, group_size, values = CASES[case]
    gen = torch.Generator().manual_seed(seed)
    tokens, groups = math.prod(lead), k // group_size
    qshape = (tokens,) if flat_qparams else (*lead, 1)
    if values == "extreme":
        x = torch.full((*lead, k), 127, dtype=torch.int8)
        zp = torch.full(qshape, -128, dtype=torch.int32)
        w = torch.full((n, k), 7, dtype=torch.int8)
        zeros = torch.full((n, groups), -8, dtype=torch.int32)
    else:
        x = torch.randint(-128, 128, (*lead, k), generator=gen, dtype=torch.int8)
        zp = torch.randint(-128, 128, qshape, generator=gen, dtype=torch.int32)
        w = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
        zeros = torch.randint(-8, 8, (n, groups), generator=gen, dtype=torch.int32)
    scale = torch.rand(qshape, generator=gen) * 0.1 + 1e-3
    w_scales = torch.rand((n, groups), generator=gen) * 0.02 + 1e-4
    return x, scale, zp, pack_int4(w), group_size, w_scales, zeros


def group_sums(args):
    """isum[m, n, g] in int64, computed independently of the reference."""
    x, _, zp, packed, group_size, _, zeros = args
    tokens, k = math.prod(x.shape[:-1]), x.shape[-1]
    xs = x.reshape(tokens, k).long() - zp.reshape(tokens, 1).long()
    ws = unpack_int4(packed).long() - zeros.long().repeat_interleave(group_size, dim=1)
    prods = xs[:, None, :] * ws[None, :, :]
    return prods.reshape(tokens, ws.shape[0], k // group_size, group_size).sum(-1)


@pytest.mark.parametrize("flat_qparams", [False, True], ids=["qparams[...,1]", "qparams[tokens]"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp32_within_rounding_bound_of_fp64(case, flat_qparams):
    args = make_args(case, flat_qparams=flat_qparams)
    got = linear_qta8a_qga4w(*args)
    exact = linear_qta8a_qga4w_fp64(*args)
    lead, n = args[0].shape[:-1], args[3].shape[0]
    assert got.dtype == torch.float32 and got.shape == (*lead, n)
    assert exact.dtype == torch.float64 and exact.shape == (*lead, n)
    isum = group_sums(args)
    magnitude = (args[5].double()[None] * isum.double()).abs().sum(-1) * args[1].reshape(-1, 1).double()
    bound = (isum.shape[-1] + 2) * U * magnitude.reshape(exact.shape)
    assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("case", list(CASES))
def test_fp64_equals_dequantize_then_linear(case):
    """quantized_decomposed dequantize ops in float64 (every value exact), then F.linear."""
    x, scale, zp, packed, group_size, w_scales, zeros = args = make_args(case, seed=1)
    qd = torch.ops.quantized_decomposed
    x_dq = qd.dequantize_per_token(x, scale.double(), zp.long(), -128, 127, torch.int8, torch.float64)
    w_dq = qd.dequantize_per_channel_group(
        unpack_int4(packed), w_scales.double(), zeros, -8, 7, torch.int8, group_size, torch.float64
    )
    want = F.linear(x_dq, w_dq)
    magnitude = x_dq.abs() @ w_dq.abs().t()
    got = linear_qta8a_qga4w_fp64(*args)
    assert ((got - want).abs() <= 1e-13 * magnitude).all()


@pytest.mark.parametrize("case", ["one token", "many tokens", "3-D input", "one group per row"])
def test_fp32_close_to_torchao_dequantize_then_linear(case):
    """torchao.dequantize_affine (fp32 results, each within 2**-24), then F.linear in float64."""
    pytest.importorskip("torchao")
    x, scale, zp, packed, group_size, w_scales, zeros = args = make_args(case, seed=2)
    k = x.shape[-1]
    dequantize = torch.ops.torchao.dequantize_affine
    x_dq = dequantize(x, [1] * (x.dim() - 1) + [k], scale, zp, torch.int8, -128, 127).double()
    w_dq = dequantize(unpack_int4(packed), [1, group_size], w_scales, zeros, torch.int8, -8, 7).double()
    want = F.linear(x_dq, w_dq)
    bound = (k // group_size + 5) * U * (x_dq.abs() @ w_dq.abs().t())
    assert ((linear_qta8a_qga4w(*args).double() - want).abs() <= bound).all()


def test_evaluation_order_is_the_documented_one():
    """acc += weight_scales[n, g] * float(isum) for g in order, then input_scale * acc: all fp32."""
    args = make_args("many groups", seed=3)
    isum = group_sums(args)
    scale, w_scales = args[1].reshape(-1), args[5]
    want = torch.empty(isum.shape[:2])
    for m in range(isum.shape[0]):
        for n in range(isum.shape[1]):
            acc = torch.tensor(0.0)
            for g in range(isum.shape[2]):
                acc = acc + w_scales[n, g] * isum[m, n, g].float()
            want[m, n] = scale[m] * acc
    got = linear_qta8a_qga4w(*args)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_registered_op_runs_the_reference():
    args = make_args("3-D input", seed=4)
    got = torch.ops.etvk.linear_qta8a_qga4w.default(*args)
    assert torch.equal(got, linear_qta8a_qga4w(*args))
    assert "etvk.linear_qta8a_qga4w.default" in runtime.list_ops()


def _replace(index, value):
    def edit(args):
        return args[:index] + (value(args[index]) if callable(value) else value,) + args[index + 1 :]

    return edit


# id -> (edit of the "3-D input" arguments, error, argument named, text)
BAD_ARGS = {
    "int32 x": (_replace(0, lambda t: t.int()), ArgumentTypeError, "x", "torch.int8"),
    "0-d x": (_replace(0, torch.tensor(1, dtype=torch.int8)), ArgumentError, "x", "0-d"),
    "fp64 scale": (_replace(1, lambda t: t.double()), ArgumentTypeError, "input_scale", "torch.float32"),
    "scale per tensor": (_replace(1, torch.ones(1)), ArgumentError, "input_scale", "one value per token"),
    "zero point [2, 3]": (_replace(2, lambda t: t.reshape(2, 3)), ArgumentError, "input_zero_point", "per token"),
    "int64 zero point": (_replace(2, lambda t: t.long()), ArgumentTypeError, "input_zero_point", "int32"),
    "int8 weight": (_replace(3, lambda t: t.to(torch.int8)), ArgumentTypeError, "weight", "torch.uint8"),
    "weight K mismatch": (_replace(3, lambda t: t[:, :16]), ArgumentError, "weight", "[N, K/2]"),
    "group size 4": (_replace(4, 4), ArgumentError, "group_size", "multiple of 8"),
    "group size 48": (_replace(4, 48), ArgumentError, "group_size", "divides K=64"),
    "float group size": (_replace(4, 8.0), ArgumentTypeError, "group_size", "int"),
    "scales shape": (_replace(5, lambda t: t[:, :4]), ArgumentError, "weight_scales", "[8, 8]"),
    "zeros dtype": (_replace(6, lambda t: t.to(torch.int8)), ArgumentTypeError, "weight_zeros", "int32"),
    "zeros out of range": (_replace(6, lambda t: t + 9), ArgumentError, "weight_zeros", "[-8, 7]"),
}


@pytest.mark.parametrize("reference", [linear_qta8a_qga4w, linear_qta8a_qga4w_fp64])
@pytest.mark.parametrize("bad", list(BAD_ARGS))
def test_bad_arguments(bad, reference):
    edit, error, arg, text = BAD_ARGS[bad]
    with pytest.raises(error) as info:
        reference(*edit(make_args("3-D input")))
    message = str(info.value)
    assert message.startswith(f"etvk.linear_qta8a_qga4w.default: argument '{arg}'")
    assert text in message
