"""How `q8ta_channel_lut` spreads its output over workgroups: `channel_lut_tiling`.

The staged kernel (spec constant STAGED) runs a 2-D grid: workgroup row y holds
`channel_words` consecutive channel words of the output, whose tables (each
channel's 256-byte row, or with window sums its sums table row of T = 255 K + 1
bytes) the workgroup first copies into shared memory; then each of its LANES
invocations writes `pixels` output words of those channel words, LANES words
apart, so that consecutive invocations touch consecutive words (in 4C1W a row's
widths, in 4C and 4W4C the workgroup's channel words of a pixel, then the next
pixel), each byte read from shared memory instead of a dependent global load.

Rule: a channel's slot in shared memory is `row_words` = max(64, ceil(T / 4))
words (64 without sums); a channel word (4 slots) must fit `SHARED_BYTES`,
else (T > 4096, pools of more than 16 taps) the op keeps the one-word kernel
(STAGED off: one invocation per output word, the tables read from the buffer).
4C1W stages one channel word a workgroup (its words lie W apart); 4C and 4W4C
stage up to 8 within `SHARED_BYTES` (and at most C4), so a pixel's run of
channel words is contiguous. `pixels` doubles from 1 up to 8 while the grid
keeps at least `MIN_GROUPS` workgroups (batch 1 stays at 1 a lane; DenseNet-121
at batch 32: 8, and 4 at 1024x14x14), and grows past 8 only where the x count
would exceed the 65535 workgroups a dimension may hold.

`global_table_each` turns the staged kernel off within a block, so a benchmark
can time the one-word kernel beside it in the same run. Pure Python: no Vulkan,
no argument checks. Called by runtime/ops/stub_support.py.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from runtime.vulkan import layouts

LANES = 128           # invocations a workgroup (the op spec's workgroup x)
SHARED_BYTES = 16384  # most shared memory a workgroup's tables may take
MAX_CHANNEL_WORDS = 8  # channel words a workgroup of 4C or 4W4C stages at most
MAX_PIXELS = 8        # words an invocation writes at most (unless the grid would overflow)
MIN_GROUPS = 2048     # workgroups `pixels` keeps (a wave of 128-lane groups on a large GPU)
MAX_GROUP_COUNT = 65535

_global_table = contextvars.ContextVar("etvk_channel_lut_global_table", default=False)


@dataclass(frozen=True)
class ChannelLutTiling:
    staged: bool          # spec constant STAGED: tables in shared memory, a 2-D grid
    row_words: int        # spec constant ROW_WORDS: shared words of one channel's table
    channel_words: int    # spec constant CHANNEL_WORDS: channel words a workgroup
    pixels: int           # spec constant PIXELS: output words an invocation
    table_words: int      # spec constant TABLE_WORDS: the shared array (1 when not staged)
    groups: tuple[int, int, int]


@contextlib.contextmanager
def global_table_each():
    """Within the block (in this thread), `channel_lut_tiling` answers the one-word kernel
    (tables read from the buffer), as before the staged kernel."""
    token = _global_table.set(True)
    try:
        yield
    finally:
        _global_table.reset(token)


def channel_lut_tiling(out_shape, layout: str, sums_columns: int = 0) -> ChannelLutTiling:
    """The tiling of a q8ta_channel_lut output `out_shape` ([N, C, H, W]) in packed `layout`,
    with window sums tables of `sums_columns` (T) entries a channel (0: no sums)."""
    n, c, h, w = (int(d) for d in out_shape)
    c4 = -(-c // 4)
    row_words = max(64, -(-sums_columns // 4))
    channel_word_bytes = 16 * row_words
    words = layouts.packed_words(out_shape, layout)
    if _global_table.get() or channel_word_bytes > SHARED_BYTES:
        return _one_word(words)
    group = 1
    if layout != "4C1W":
        while (group < MAX_CHANNEL_WORDS and 2 * group <= c4
               and 2 * group * channel_word_bytes <= SHARED_BYTES):
            group *= 2
    rows = -(-c4 // group)
    items = words // c4 * group  # the words of `group` channel words (4W4C: padding widths too)
    pixels = 1
    while pixels < MAX_PIXELS and -(-items // (LANES * 2 * pixels)) * rows >= MIN_GROUPS:
        pixels *= 2
    pixels = max(pixels, -(-items // (LANES * MAX_GROUP_COUNT)))
    if rows > MAX_GROUP_COUNT:
        return _one_word(words)
    return ChannelLutTiling(True, row_words, group, pixels, group * 4 * row_words,
                            (-(-items // (LANES * pixels)), rows, 1))


def _one_word(words: int) -> ChannelLutTiling:
    """The one-word kernel: one invocation an output word (a 1-D grid the runtime may fold)."""
    return ChannelLutTiling(False, 64, 1, 1, 1, (-(-words // LANES), 1, 1))
