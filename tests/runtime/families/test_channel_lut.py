"""runtime.families.channel_lut: the staged q8ta_channel_lut tiling rule (pure Python)."""

from __future__ import annotations

from runtime.families.channel_lut import channel_lut_tiling, global_table_each


def test_densenet_batch_32_writes_several_words_an_invocation():
    """DenseNet-121's table shapes in 4C1W: one channel word a workgroup row, 8 words an
    invocation while 2048 workgroups remain (4 at 1024x14x14)."""
    for shape, pixels, groups in (((32, 256, 56, 56), 8, (98, 64, 1)),
                                  ((32, 512, 28, 28), 8, (25, 128, 1)),
                                  ((32, 1024, 14, 14), 4, (13, 256, 1))):
        tiling = channel_lut_tiling(shape, "4C1W")
        assert tiling.staged and tiling.channel_words == 1 and tiling.row_words == 64
        assert (tiling.pixels, tiling.groups, tiling.table_words) == (pixels, groups, 256), shape


def test_batch_1_keeps_one_word_an_invocation():
    assert channel_lut_tiling((1, 256, 56, 56), "4C1W").groups == (25, 64, 1)
    tiling = channel_lut_tiling((1, 1024, 7, 7), "4C1W")
    assert (tiling.pixels, tiling.groups) == (1, (1, 256, 1))


def test_4c_and_4w4c_stage_several_channel_words():
    """Up to 8 channel words (at most C4, within 16 KiB): a pixel's words lie together."""
    tiling = channel_lut_tiling((1, 20, 3, 3), "4C")      # C4 = 5: 4 a row, the last row 1
    assert (tiling.channel_words, tiling.table_words, tiling.groups) == (4, 1024, (1, 2, 1))
    assert channel_lut_tiling((1, 64, 3, 3), "4W4C").channel_words == 8
    assert channel_lut_tiling((1, 4, 3, 3), "4C").channel_words == 1
    assert channel_lut_tiling((1, 64, 3, 3), "4C1W").channel_words == 1
    sums = channel_lut_tiling((1, 8, 2, 5), "4W4C", 1021)  # 2x2 pool: 4 KiB a channel word
    assert (sums.row_words, sums.channel_words, sums.table_words) == (256, 2, 2048)
    assert sums.groups == (1, 1, 1)  # 32 words (4W4C padding widths included)
    assert channel_lut_tiling((1, 64, 2, 5), "4C", 1021).channel_words == 4


def test_sums_tables_over_16_kib_keep_the_one_word_kernel():
    largest = channel_lut_tiling((1, 8, 2, 5), "4C1W", 255 * 16 + 1)  # 16 taps: 16,336 bytes
    assert largest.staged and (largest.row_words, largest.table_words) == (1021, 4084)
    tiling = channel_lut_tiling((1, 8, 2, 5), "4C1W", 255 * 17 + 1)
    assert not tiling.staged and tiling.groups == (1, 1, 1) and tiling.table_words == 1


def test_the_grid_stays_within_65535_workgroups_a_dimension():
    width = 128 * 65535 * 9 + 1
    tiling = channel_lut_tiling((1, 4, 1, width), "4C1W")
    assert tiling.pixels == 10 and tiling.groups[0] <= 65535 < -(-width // (128 * 9))


def test_global_table_each_turns_staging_off_within_its_block():
    with global_table_each():
        tiling = channel_lut_tiling((32, 256, 56, 56), "4C1W")
        assert not tiling.staged and tiling.groups == (32 * 64 * 56 * 56 // 128, 1, 1)
    assert channel_lut_tiling((32, 256, 56, 56), "4C1W").staged
