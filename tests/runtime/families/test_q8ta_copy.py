"""runtime.families.q8ta_copy: where the copy-like int8 ops run on 16-byte quads (pure Python)."""

from __future__ import annotations

import pytest

from runtime.families.q8ta_copy import copy_quads, one_word_each


@pytest.mark.parametrize(("layout", "width", "parts", "quads"), [
    (None, 0, None, True),                 # elementwise: every shape (a tail of words)
    ("4W4C", 5, [6, 10], True),            # a quad is 4 widths, padding widths included
    ("4W4C", 3, None, True),
    ("4C1W", 8, [6, 10], True),            # two quads a row, b shifted lane by lane
    ("4C1W", 6, [8, 8], False),            # a quad would straddle rows
    ("4C1W", 4, None, True),
    ("4C", 7, [16, 13], True),             # a: 4 words, b: ceil(13 / 4) = 4 words
    ("4C", 7, [224, 32], True),            # DenseNet-121's block concat
    ("4C", 7, [8, 8], False),              # b's quads would start inside a quad of out
    ("4C", 7, [16, 17], False),            # b: 5 channel words
    ("4C", 8, None, False),                # a gather: any channel anywhere
])
def test_copy_quads(layout, width, parts, quads):
    assert copy_quads(layout, width, parts) is quads


def test_one_word_each_turns_quads_off_within_its_block():
    with one_word_each():
        assert not copy_quads()
        assert not copy_quads("4W4C", 4, [16, 16])
    assert copy_quads()
