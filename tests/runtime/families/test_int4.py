"""pack_int4 / unpack_int4 (OPS.md family 3 weight format): layout, round trips, errors.

Cases are tables: `SHAPES` are round-tripped with random values, `BAD_CALLS`
names each bad argument with the exception and the text it must carry.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import runtime
from runtime.errors import ArgumentError, ArgumentTypeError
from runtime.families.int4 import pack_int4, unpack_int4

SHAPES = [(1, 2), (3, 8), (16, 64), (5, 130), (0, 4), (3, 0), (0, 0)]

BAD_CALLS = [
    ("odd K", pack_int4, torch.zeros(2, 3, dtype=torch.int8), ArgumentError, "even number of columns"),
    ("value 8", pack_int4, torch.tensor([[0, 8]], dtype=torch.int8), ArgumentError, "[-8, 7], found [0, 8]"),
    ("value -9", pack_int4, torch.tensor([[-9, 0]], dtype=torch.int8), ArgumentError, "[-8, 7], found [-9, 0]"),
    ("float weights", pack_int4, torch.zeros(2, 4), ArgumentTypeError, "torch.int8, got torch.float32"),
    ("int32 weights", pack_int4, torch.zeros(2, 4, dtype=torch.int32), ArgumentTypeError, "torch.int8"),
    ("1-D weights", pack_int4, torch.zeros(4, dtype=torch.int8), ArgumentError, "2-D tensor, got shape (4,)"),
    ("3-D weights", pack_int4, torch.zeros(1, 2, 4, dtype=torch.int8), ArgumentError, "2-D tensor"),
    ("not a tensor", pack_int4, [[0, 1]], ArgumentTypeError, "torch.Tensor, got list"),
    ("int8 packed", unpack_int4, torch.zeros(2, 4, dtype=torch.int8), ArgumentTypeError, "torch.uint8"),
    ("1-D packed", unpack_int4, torch.zeros(4, dtype=torch.uint8), ArgumentError, "2-D tensor"),
]


def test_every_pair_of_values_packs_to_its_byte():
    """All 256 (low, high) pairs: byte = (low + 8) | (high + 8) << 4, and back."""
    pairs = torch.tensor(list(itertools.product(range(-8, 8), repeat=2)), dtype=torch.int8)
    w = pairs[:, [1, 0]]  # column 0 (k = 2j) is the low nibble
    packed = pack_int4(w)
    want = ((w[:, 0].int() + 8) | ((w[:, 1].int() + 8) << 4)).to(torch.uint8).reshape(-1, 1)
    assert packed.dtype == torch.uint8 and packed.shape == (256, 1)
    assert torch.equal(packed, want)
    assert sorted(packed.flatten().tolist()) == list(range(256))
    assert torch.equal(unpack_int4(packed), w)


def test_layout_example():
    # k=0 -> low nibble of byte 0, k=1 -> high nibble; a nibble stores w + 8
    w = torch.tensor([[1, -2, -8, 7]], dtype=torch.int8)
    assert pack_int4(w).tolist() == [[0x69, 0xF0]]


def test_every_byte_unpacks_and_packs_back():
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    w = unpack_int4(packed)
    assert w.dtype == torch.int8 and w.shape == (16, 32)
    assert int(w.min()) == -8 and int(w.max()) == 7
    assert torch.equal(pack_int4(w), packed)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(shape):
    gen = torch.Generator().manual_seed(sum(shape) + 1)
    w = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int8)
    packed = pack_int4(w)
    assert packed.shape == (shape[0], shape[1] // 2)
    assert torch.equal(unpack_int4(packed), w)


def test_non_contiguous_input():
    w = torch.randint(-8, 8, (8, 6), dtype=torch.int8).t()
    assert not w.is_contiguous()
    assert torch.equal(unpack_int4(pack_int4(w)), w)


@pytest.mark.parametrize(
    ("function", "arg", "error", "text"),
    [pytest.param(f, a, e, t, id=i) for i, f, a, e, t in BAD_CALLS],
)
def test_bad_arguments(function, arg, error, text):
    with pytest.raises(error) as info:
        function(arg)
    assert text in str(info.value)
    assert str(info.value).startswith(function.__name__)
    assert isinstance(info.value, ValueError if error is ArgumentError else TypeError)


def test_exported_from_runtime():
    assert runtime.pack_int4 is pack_int4
    assert runtime.unpack_int4 is unpack_int4
