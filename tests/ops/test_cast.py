"""llm family's cast (fp32 <-> fp16) on the default Vulkan device, validation on.

Both variants against PyTorch's ``x.to(dtype)`` bit for bit: every fp16 value to fp32, and
to fp16 every fp16 value as fp32, the midpoints between neighbours (rounding ties) and the
fp32 values next to them, the overflow threshold, fp16 subnormals and fp32 subnormals, and
random bit patterns; with host and with device inputs. Bad arguments name the op and the
argument.
"""

from __future__ import annotations

import pytest
import torch
from op_testlib import assert_argument_error

import runtime
from runtime.reference import llm as ref
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

BITS = {torch.float32: torch.int32, torch.float16: torch.int16}


def cast_op():
    return runtime.get_op("etvk.cast.default")


def every_half() -> torch.Tensor:
    """All 65536 fp16 bit patterns (NaNs and infinities included)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)


def hard_floats() -> torch.Tensor:
    """fp32 values where rounding to fp16 is hard: every finite fp16 value, the midpoints
    between neighbours (exact ties) and the fp32 values one step either side of them, fp32
    subnormals, and random bit patterns."""
    halves = every_half()
    finite = halves[torch.isfinite(halves)].float().unique()
    mids = (finite[:-1].double() + finite[1:].double()) / 2
    mids = torch.cat([mids, torch.tensor([65520.0, -65520.0])]).float()  # the overflow tie
    bits = mids.view(torch.int32)
    randoms = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=torch.Generator().manual_seed(3),
                            dtype=torch.int64).to(torch.int32)
    subnormals = torch.tensor([1, 2, 0x7FFFFF, 0x80000001, 0x807FFFFF], dtype=torch.int64).to(torch.int32)
    return torch.cat([finite, mids, (bits + 1).view(torch.float32), (bits - 1).view(torch.float32),
                      randoms.view(torch.float32), subnormals.view(torch.float32)])


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit for bit, except that a NaN only needs to be a NaN (payloads are not specified)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaNs differ"
    bits = BITS[want.dtype]
    differ = (got.view(bits) != want.view(bits)) & ~nan
    assert not bool(differ.any()), (f"{what}: {int(differ.sum())} values differ, e.g. "
                                    f"{got[differ][:3].tolist()} for {want[differ][:3].tolist()}")


@pytest.mark.parametrize(("source", "dtype"), [(every_half, torch.float32), (hard_floats, torch.float16)],
                         ids=["half_to_float", "float_to_half"])
def test_cast_is_pytorchs_conversion_bit_for_bit(source, dtype, dispatch_trace):
    x = source()
    want = x.to(dtype)
    assert_same(ref.cast(x, dtype), want, "reference")
    assert_same(cast_op()(x, dtype), want, "shader")
    assert_same(cast_op()(x[:7], dtype), want[:7], "a partial unit")
    name = {torch.float32: "llm_cast_half_float", torch.float16: "llm_cast_float_half"}[dtype]
    assert name in dispatch_trace()


def test_device_inputs_round_trip():
    """fp16 -> fp32 -> fp16 in one stream gives the fp16 values back, bits included."""
    halves = every_half().reshape(2, 128, 256)
    with Stream() as stream:
        widened = cast_op().record(stream, Tensor.from_torch(halves), torch.float32)
        back = cast_op().record(stream, widened, torch.float16)
        stream.run()
        got = back.to_torch()
    assert_same(got, halves, "round trip")


def test_empty_and_0d():
    assert cast_op()(torch.empty(0, 3), torch.float16).shape == (0, 3)
    assert_same(cast_op()(torch.tensor(1.5, dtype=torch.float16), torch.float32), torch.tensor(1.5), "0-d")


@pytest.mark.parametrize(("x", "dtype", "arg", "text"), [
    (torch.zeros(4, dtype=torch.int32), torch.float16, "x", "must be float32 or float16, got torch.int32"),
    (torch.zeros(4), torch.float32, "dtype", "the other one of torch.float32 and torch.float16 than x's "
                                             "torch.float32, got torch.float32"),
    (torch.zeros(4).half(), torch.bfloat16, "dtype", "got torch.bfloat16"),
])
def test_bad_arguments_name_the_op_and_argument(x, dtype, arg, text):
    assert_argument_error(cast_op(), (x, dtype), arg, text)
