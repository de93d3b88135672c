"""Whether the int8 copy-like ops move 16-byte quads: `copy_quads`, `table_run`, `one_word_each`.

`q8ta_lut`, `q8ta_concat` and `q8ta_channel_gather` write packed int8 words
without arithmetic on their positions.
With their spec constant QUADS one invocation writes output words 4q .. 4q+3
(a quad, 16 bytes) through one 16-byte store, reading its input quads through
16-byte loads (the bindings' `wide` views), instead of one 4-byte word. An
elementwise op (output word i from input word i) runs on quads in every
layout, its last words one by one where the word count is no multiple of
4. The concat and the gather read input words at other channel positions,
so an input quad lines up with an output quad only where a quad holds one
channel word of 4 widths (4W4C; 4C1W with W % 4 == 0) or, in 4C, where the
channel parts start at whole quads of every tensor (docs/int8_cnn_ops.md).

The per-channel table ops (`q8ta_channel_lut`, `q8ta_concat_channel_lut`),
whose bytes each read their channel's own table, stay on one word, except
where their tables are integer affine maps (no table read depending on a
byte) and no channel comes from window sums: `table_run` gives how many
pixels in a row one invocation writes a quad at, its 16 channels' maps
loaded once (docs/int8_cnn_ops.md).

`one_word_each` turns the quads (and the tables' runs) off within a block,
so a benchmark can time the one-word kernels beside them in the same run.
Pure Python: no Vulkan, no argument checks (the op specs' checks name a bad argument). Called by
runtime/ops/stub_support.py (the spec helpers `copy_quads`, `table_run` and
`table_invocations`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence

_one_word = contextvars.ContextVar("etvk_q8ta_one_word", default=False)


@contextlib.contextmanager
def one_word_each():
    """Within the block (in this thread), `copy_quads` answers False: the copy-like ops write
    one 4-byte word an invocation, as before the 16-byte quads."""
    token = _one_word.set(True)
    try:
        yield
    finally:
        _one_word.reset(token)


def copy_quads(layout: str | None = None, width: int = 0,
               channel_parts: Sequence[int] | None = None) -> bool:
    """Whether a copy-like op runs on 16-byte quads (spec constant QUADS).

    Args:
        layout: None for an elementwise op (output word i from input word i: always);
            else the packed layout ("4W4C", "4C", "4C1W") of an op that reads input words
            at other channel positions.
        width: W of the tensors.
        channel_parts: the channels of the inputs whose concatenation is the output, in order
            (a concat); None where output channels come from any input channel (a gather).

    Returns:
        False within `one_word_each`; else True for an elementwise op and in 4W4C, in 4C1W
        when ``width % 4 == 0``, and in 4C for a concat whose parts but the last have a
        multiple of 16 channels and whose last part's channel words are a multiple of 4.
    """
    if _one_word.get():
        return False
    if layout is None or layout == "4W4C":
        return True
    if layout == "4C1W":
        return width % 4 == 0
    if channel_parts is None:
        return False
    *leading, last = channel_parts
    return all(c % 16 == 0 for c in leading) and -(-last // 4) % 4 == 0


TABLE_RUN = 4  # pixels in a row an invocation of a per-channel table op writes a quad at
# Fewer invocations than this run one word each: runs would not fill the GPU (measured on the
# H200, benchmarks/NOTES.md session 39: DenseNet's concat at 7x7, 32 quads x 392 runs).
TABLE_RUN_MIN_INVOCATIONS = 32768


def table_invocations(shape: Sequence[int], run: int) -> int:
    """Invocations of a per-channel table op with spec constant RUN `run` > 1 writing the
    packed ``[N, C, H, W]`` `shape`: one for each quad (16 channels) and run of `run` pixels."""
    n, channels, h, w = shape
    return -(-channels // 16) * -(-(n * h * w) // run)


def table_run(layout: str, shape: Sequence[int], channel_parts: Sequence[int], maps: bool) -> int:
    """Spec constant RUN of a per-channel table op writing the packed `shape`: `TABLE_RUN`
    where the output is in 4C, its quads line up with those of its channel parts in order
    (`copy_quads`), every table is an integer affine map and no channel comes from window sums
    (`maps`), and the runs make at least `TABLE_RUN_MIN_INVOCATIONS` invocations; else 1, one
    word an invocation (also within `one_word_each`)."""
    if layout != "4C" or not maps or not copy_quads(layout, shape[3], channel_parts):
        return 1
    return TABLE_RUN if table_invocations(shape, TABLE_RUN) >= TABLE_RUN_MIN_INVOCATIONS else 1
