"""How the few-token linear kernel splits its work.

`few_tiling(n, tokens, group_size)` chooses the spec constants SPLIT and ROUND
of `linear_qta8a_qga4w_coop_few` (templates/linear_qta8a_qga4w_coop_few.glsl.j2)
and its workgroup counts. A tile is `FEW_ROWS` output rows x `FEW_TOKENS`
tokens; a workgroup's `FEW_SUBGROUPS` subgroups take one tile (SPLIT 4) or two
(SPLIT 2), the SPLIT subgroups of a tile splitting K into rounds of SPLIT x
ROUND groups. More subgroups per tile cut a workgroup's time and fewer let a
workgroup hold two tiles; longer rounds mean fewer workgroup barriers but more
products waiting in shared memory.

The rule, measured on the H200 (132 SMs; K = 4096, group 128, weights beyond
the L2; benchmarks/NOTES.md, session 17), by the tiles a call computes:

- up to `FEW_LONG_ROUNDS_MAX_TILES`: one tile per workgroup, rounds of 4 groups
  per subgroup (8 x 4096, 256 tiles: 12.0 against 12.8 us with rounds of 2;
  8 x 6144, 384 tiles: 13.3 against 14.3);
- from `FEW_SHARED_MIN_TILES`: two tiles per workgroup, rounds of 4 (8 x 10240,
  640 tiles: 21.1 against 23.3 us with one tile and rounds of 2; 8 x 14336:
  24.0 against 25.9);
- between: one tile per workgroup, rounds of 2 (8 x 8192, 512 tiles: 15.9 us
  against 18.3 with two tiles and 21.5 with rounds of 4).

The kernel loads `FEW_LOOKAHEAD` K blocks of 64 ahead, across its rounds, so a
round's blocks (ROUND x group_size / 64) must be a multiple of it: groups of an
odd number of blocks take rounds of 4. Pure arithmetic; called by the op stub
(through runtime/ops/stub_support.py) and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.families.linear_weights import FEW_K_BLOCK, FEW_ROWS

FEW_TOKENS = 8  # tokens per tile (the B matrix's 8 columns)
FEW_SUBGROUPS = 4  # subgroups per workgroup (the shader's workgroup of 128)
FEW_LOOKAHEAD = 4  # K blocks the kernel loads ahead (the template's LOOKAHEAD)
FEW_LONG_ROUNDS_MAX_TILES = 384
FEW_SHARED_MIN_TILES = 640


@dataclass(frozen=True)
class FewTiling:
    """SPLIT (subgroups per tile), ROUND (groups per subgroup and round), workgroup counts."""

    split: int
    round: int
    groups: tuple[int, int, int]


def few_round_fits(round_: int, group_size: int) -> bool:
    """Whether rounds of `round_` groups of `group_size` hold whole lookaheads of K blocks."""
    return round_ * (group_size // FEW_K_BLOCK) % FEW_LOOKAHEAD == 0


def few_tiling(n: int, tokens: int, group_size: int, split: int | None = None,
               round_: int | None = None) -> FewTiling:
    """The few-token kernel's tiling of `tokens` x `n` outputs in groups of `group_size`
    (a multiple of 64): the rule above, or the given `split` (2 or 4) and `round_`.

    Raises:
        ValueError: a given split other than 2 or 4, or a round that does not fit the
            lookahead (`few_round_fits`).
    """
    row_tiles = -(-n // FEW_ROWS)
    token_tiles = -(-tokens // FEW_TOKENS)
    tiles = row_tiles * token_tiles
    if split is None:
        split = 2 if tiles >= FEW_SHARED_MIN_TILES else 4
    if round_ is None:
        short = FEW_LONG_ROUNDS_MAX_TILES < tiles < FEW_SHARED_MIN_TILES
        round_ = 2 if short and few_round_fits(2, group_size) else 4
    if split not in (2, 4):
        raise ValueError(f"the few-token kernel splits a tile over 2 or 4 subgroups, not {split}")
    if not few_round_fits(round_, group_size):
        raise ValueError(f"rounds of {round_} groups of {group_size} do not hold whole lookaheads "
                         f"of {FEW_LOOKAHEAD} K blocks of {FEW_K_BLOCK}")
    per_group = FEW_SUBGROUPS // split
    return FewTiling(split, round_, (-(-row_tiles // per_group), token_tiles, 1))
