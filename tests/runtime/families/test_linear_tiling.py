"""The few-token linear kernel's tiling rule (runtime/families/linear_tiling.py), as tables:
the split, round and workgroup counts it picks by the tiles a call computes, the rounds
that fit the kernel's lookahead, and the errors for a split or round the kernel cannot
run. No Vulkan (the kernel's bits under every tiling: tests/ops/test_linear.py)."""

from __future__ import annotations

import pytest

from runtime.families.linear_tiling import (
    FEW_LONG_ROUNDS_MAX_TILES,
    FEW_SPLIT2_MIN_TILES,
    FewTiling,
    few_round_fits,
    few_tiling,
)


@pytest.mark.parametrize(("n", "tokens", "group_size", "want"), [
    (4096, 8, 128, FewTiling(4, 4, (256, 1, 1))),  # 256 tiles: long rounds
    (6144, 2, 128, FewTiling(4, 4, (384, 1, 1))),
    (4096, 16, 128, FewTiling(4, 2, (256, 2, 1))),  # 512 tiles
    (4096, 16, 64, FewTiling(4, 4, (256, 2, 1))),  # one block per group: rounds of 4
    (10240, 8, 128, FewTiling(2, 4, (640, 1, 1))),  # 640 tiles: two subgroups each
    (14336, 8, 128, FewTiling(2, 4, (896, 1, 1))),
    (14336, 32, 256, FewTiling(2, 4, (896, 4, 1))),
    (40, 11, 64, FewTiling(4, 4, (3, 2, 1))),  # row tiles round up, tokens too
])
def test_rule(n, tokens, group_size, want):
    assert few_tiling(n, tokens, group_size) == want


def test_thresholds_are_tiles():
    rows = 16 * FEW_LONG_ROUNDS_MAX_TILES
    assert few_tiling(rows, 8, 128).round == 4
    assert few_tiling(rows + 16, 8, 128) == FewTiling(4, 2, (FEW_LONG_ROUNDS_MAX_TILES + 1, 1, 1))
    assert few_tiling(16 * FEW_SPLIT2_MIN_TILES - 16, 8, 128).split == 4
    assert few_tiling(16 * FEW_SPLIT2_MIN_TILES, 8, 128).split == 2


def test_a_workgroup_per_tile_and_the_split_names_the_variant():
    tiling = few_tiling(16 * 769, 8, 128, split=2)
    assert (tiling.groups, tiling.axis) == ((769, 1, 1), "s2")
    assert few_tiling(16 * 769, 8, 128, split=4).axis == "s4"


@pytest.mark.parametrize(("round_", "group_size", "fits"), [
    (2, 128, True), (2, 64, False), (2, 192, False), (4, 64, True), (4, 192, True), (8, 64, True),
])
def test_rounds_hold_whole_lookaheads(round_, group_size, fits):
    assert few_round_fits(round_, group_size) is fits


def test_rejects_what_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="over 2 or 4 subgroups, not 1"):
        few_tiling(64, 8, 128, split=1)
    with pytest.raises(ValueError, match="rounds of 2 groups of 64 do not hold whole lookaheads"):
        few_tiling(64, 8, 64, round_=2)
