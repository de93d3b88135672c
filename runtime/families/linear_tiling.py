"""How the few-token linear kernel splits its work.

`few_tiling(n, tokens, group_size)` chooses the axis SPLIT and the spec
constant ROUND of `linear_qta8a_qga4w_coop_few`
(templates/linear_qta8a_qga4w_coop_few.glsl.j2) and its workgroup counts. A
tile is `FEW_ROWS` output rows x `FEW_TOKENS` tokens and a workgroup takes one:
its SPLIT subgroups (4 or 2: workgroups of 128 or 64 invocations) split K into
rounds of SPLIT x ROUND groups. More subgroups per tile cut a tile's time;
fewer leave more workgroups per SM; longer rounds mean fewer workgroup
barriers but more products waiting in shared memory.

The rule, measured on the H200 (132 SMs; K = 4096, group 128, weights beyond
the L2; benchmarks/NOTES.md, session 18), by the tiles a call computes:

- up to `FEW_LONG_ROUNDS_MAX_TILES`: SPLIT 4, rounds of 4 groups per subgroup;
- from `FEW_SPLIT2_MIN_TILES`: SPLIT 2, rounds of 4;
- between: SPLIT 4, rounds of 2.

The kernel loads `FEW_LOOKAHEAD` K blocks of 64 ahead, across its rounds, so a
round's blocks (ROUND x group_size / 64) must be a multiple of it: groups of an
odd number of blocks take rounds of 4. Pure arithmetic; called by the op stub
(through runtime/ops/stub_support.py) and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.families.linear_weights import FEW_K_BLOCK, FEW_ROWS

FEW_TOKENS = 8  # tokens per tile (the B matrix's 8 columns)
FEW_LOOKAHEAD = 4  # K blocks the kernel loads ahead (the template's LOOKAHEAD)
FEW_LONG_ROUNDS_MAX_TILES = 384
FEW_SPLIT2_MIN_TILES = 640


@dataclass(frozen=True)
class FewTiling:
    """SPLIT (subgroups per tile and workgroup), ROUND (groups per subgroup and round),
    workgroup counts."""

    split: int
    round: int
    groups: tuple[int, int, int]

    @property
    def axis(self) -> str:
        """The variant axis SPLIT: "s4" or "s2"."""
        return f"s{self.split}"


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
        split = 2 if tiles >= FEW_SPLIT2_MIN_TILES else 4
    if round_ is None:
        short = FEW_LONG_ROUNDS_MAX_TILES < tiles < FEW_SPLIT2_MIN_TILES
        round_ = 2 if short and few_round_fits(2, group_size) else 4
    if split not in (2, 4):
        raise ValueError(f"the few-token kernel splits a tile over 2 or 4 subgroups, not {split}")
    if not few_round_fits(round_, group_size):
        raise ValueError(f"rounds of {round_} groups of {group_size} do not hold whole lookaheads "
                         f"of {FEW_LOOKAHEAD} K blocks of {FEW_K_BLOCK}")
    return FewTiling(split, round_, (row_tiles, token_tiles, 1))
