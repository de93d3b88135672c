"""Packed int8 layouts (runtime/layouts.py) against OPS.md's word-index table.

The oracle is a slow per-element loop over OPS.md's formulas, independent of
the vectorised reshape/permute code. Every layout runs shapes whose channels
and widths are and are not multiples of 4, batches, and empty tensors. No Vulkan.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from runtime.vulkan.layouts import LAYOUT_CODES, PACKED_LAYOUTS, pack, packed_words, unpack

SHAPES = [(1, 1, 1, 1), (1, 4, 2, 4), (1, 3, 2, 5), (2, 5, 3, 7), (1, 8, 1, 13), (3, 9, 2, 2),
          (2, 16, 3, 8), (1, 6, 4, 1)]
EMPTY = [(0, 3, 2, 2), (1, 0, 2, 2), (1, 3, 0, 2), (1, 3, 2, 0)]


def word_index(n, c, h, w, shape, layout):
    """OPS.md's table: the word holding (n, c, h, w)."""
    _, channels, height, width = shape
    c4, w4 = -(-channels // 4), -(-width // 4)
    if layout == "4W4C":
        return (((n * height + h) * w4 + w // 4) * c4 + c // 4) * 4 + w % 4
    if layout == "4C":
        return ((n * height + h) * width + w) * c4 + c // 4
    return ((n * height + h) * c4 + c // 4) * width + w  # 4C1W


def slow_pack(x, layout):
    """Bytes of ``x`` in ``layout``, one element at a time; byte c % 4 of the word."""
    out = torch.zeros(packed_words(x.shape, layout) * 4, dtype=torch.int8)
    for n, c, h, w in itertools.product(*(range(s) for s in x.shape)):
        out[word_index(n, c, h, w, x.shape, layout) * 4 + c % 4] = x[n, c, h, w]
    return out


def random_int8(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)


def test_layout_codes_follow_the_layout_list():
    assert PACKED_LAYOUTS == ("4W4C", "4C", "4C1W")
    assert LAYOUT_CODES == {"4W4C": 0, "4C": 1, "4C1W": 2}


@pytest.mark.parametrize(("shape", "layout", "words"), [
    ((1, 3, 2, 5), "4W4C", 1 * 2 * 2 * 1 * 4),
    ((1, 3, 2, 5), "4C", 1 * 2 * 5 * 1),
    ((1, 3, 2, 5), "4C1W", 1 * 2 * 1 * 5),
    ((2, 9, 3, 8), "4W4C", 2 * 3 * 2 * 3 * 4),
    ((2, 9, 3, 8), "4C", 2 * 3 * 8 * 3),
    ((2, 9, 3, 8), "4C1W", 2 * 3 * 3 * 8),
    ((0, 9, 3, 8), "4C", 0),
])
def test_packed_words(shape, layout, words):
    assert packed_words(shape, layout) == words


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_pack_matches_the_index_table_and_round_trips(shape, layout):
    x = random_int8(shape, seed=sum(shape))
    packed = pack(x, layout)
    assert packed.dtype == torch.int8 and packed.is_contiguous()
    assert torch.equal(packed, slow_pack(x, layout))
    assert torch.equal(unpack(packed, shape, layout), x)
    assert torch.equal(unpack(packed.view(torch.int32), shape, layout), x)
    assert torch.equal(unpack(packed.view(torch.uint8), shape, layout), x)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_padding_bytes_are_zero(layout):
    x = torch.full((2, 5, 3, 7), -1, dtype=torch.int8)
    packed = pack(x, layout)
    real = (packed != 0).sum().item()
    assert real == x.numel()


def test_words_are_little_endian():
    x = torch.tensor([1, 2, 3, -1], dtype=torch.int8).reshape(1, 4, 1, 1)
    (word,) = pack(x, "4C").view(torch.int32).tolist()
    assert word == int.from_bytes(bytes([1, 2, 3, 0xFF]), "little", signed=True)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("shape", EMPTY, ids=str)
def test_empty_tensors(shape, layout):
    x = torch.zeros(shape, dtype=torch.int8)
    packed = pack(x, layout)
    assert packed.numel() == packed_words(shape, layout) * 4
    assert unpack(packed, shape, layout).shape == shape


def test_noncontiguous_input_packs_like_its_contiguous_copy():
    x = random_int8((1, 7, 5, 6)).transpose(2, 3)
    for layout in PACKED_LAYOUTS:
        assert torch.equal(pack(x, layout), pack(x.contiguous(), layout))


@pytest.mark.parametrize(("call", "error", "text"), [
    (lambda: pack(torch.zeros(3, 2, 2, dtype=torch.int8), "4C"), ValueError, "4-D [N, C, H, W]"),
    (lambda: pack(torch.zeros(1, 1, 3, 2, 2, dtype=torch.int8), "4C"), ValueError, "4-D"),
    (lambda: pack(torch.zeros(1, 3, 2, 2), "4C"), TypeError, "int8"),
    (lambda: pack(torch.zeros(1, 3, 2, 2, dtype=torch.int8), "4W"), ValueError, "'4W' is not"),
    (lambda: packed_words((1, 3, 2), "4C"), ValueError, "4-D"),
    (lambda: unpack(torch.zeros(7, dtype=torch.int8), (1, 3, 2, 2), "4C"), ValueError,
     "must hold 4 words (16 bytes), got 7 bytes"),
    (lambda: unpack(torch.zeros(16), (1, 3, 2, 2), "4C"), TypeError, "int8, uint8 or int32"),
])
def test_bad_arguments_raise(call, error, text):
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value)
