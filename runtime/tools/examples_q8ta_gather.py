"""Example cases of the q8ta_gather family (int8 channel gather): ShuffleNet's channel splits
(chunk halves, slices at word and non-word offsets) and shuffles (2 and 3 groups, C a multiple
of 4 or not, a shuffle of a slice). Shared by the op tests and ``runtime.tools.examples``.
Pure torch; no Vulkan.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GatherCase:
    name: str
    shape: tuple[int, int, int, int]  # x [N, C, H, W]
    start: int
    count: int
    groups: int


G = GatherCase
GATHER_CASES = [
    G("chunk_first_c8", (2, 8, 3, 5), 0, 4, 1),
    G("chunk_second_c8", (2, 8, 3, 5), 4, 4, 1),
    G("chunk_second_c6", (1, 6, 2, 3), 3, 3, 1),
    G("slice_c11_from_1", (1, 11, 3, 6), 1, 9, 1),
    G("shuffle_g2_c8", (2, 8, 3, 5), 0, 8, 2),
    G("shuffle_g2_c10", (1, 10, 4, 7), 0, 10, 2),
    G("shuffle_g3_c12", (1, 12, 2, 4), 0, 12, 3),
    G("shuffle_of_slice", (1, 13, 2, 3), 3, 6, 2),
    G("slice_c11_from_2_w8", (1, 11, 2, 8), 2, 9, 1),   # 16-byte quads in 4C1W, 2 a row
    G("shuffle_g2_c10_w8", (2, 10, 2, 8), 0, 10, 2),
]
GATHER_BY_NAME = {case.name: case for case in GATHER_CASES}


def gather_inputs(case: GatherCase, seed: int | None = None) -> tuple:
    """(x, start, count, groups) of `case`, x random int8 (seeded by the case's name unless
    `seed` is given)."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) if seed is None else seed)
    x = torch.randint(-128, 128, case.shape, generator=gen, dtype=torch.int8)
    return x, case.start, case.count, case.groups


def build(axes, shape, gen):
    """A builder for ``runtime.tools.examples.EXAMPLES``: the case at index (the shape's last
    size mod the table's length), so a shape picks a case."""
    case = GATHER_CASES[(shape[-1] if shape else 0) % len(GATHER_CASES)]
    return gather_inputs(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}
