"""runtime.families.channel_affine: per-channel int8 tables as integer affine maps, exact for
every entry or not used at all."""

from __future__ import annotations

import pytest
import torch

from runtime.families.channel_affine import (
    affine_values,
    entry_values,
    fit_affine_channels,
    pack_fit,
)
from runtime.tools.examples_q8ta_unary import affine_channel_table

Q = torch.arange(-128, 128)


@pytest.mark.parametrize("relu", [True, False], ids=["bn_relu", "bn"])
@pytest.mark.parametrize("seed", range(4))
def test_batch_norm_tables_fit_every_entry(seed, relu):
    table = affine_channel_table(96, seed, relu)
    fit = fit_affine_channels(table)
    assert fit is not None
    assert torch.equal(affine_values(fit, Q), table.to(torch.int64))
    # the shader's int32 arithmetic does not overflow for any q
    m, n = fit[:, 0:1], fit[:, 1:2]
    assert int((Q[None, :] * m + n).abs().max()) < 2**31


def test_steps_constants_and_decreasing_tables_fit():
    step = torch.where(Q < 17, -128, 127)
    table = torch.stack([
        step,                                                   # one step over the whole range
        torch.full((256,), -5),                                 # constant
        torch.clamp(torch.div(-Q * 3, 7, rounding_mode="floor") + 4, -128, 127),  # decreasing
        torch.clamp(Q * 5 - 300, -128, 127),                    # steep, clamped on both sides
        torch.clamp(torch.div(Q, 100, rounding_mode="floor"), -128, 127),  # three values
    ]).to(torch.int8)
    fit = fit_affine_channels(table)
    assert fit is not None and torch.equal(affine_values(fit, Q), table.to(torch.int64))


@pytest.mark.parametrize("row", [
    torch.randint(-128, 128, (256,), generator=torch.Generator().manual_seed(3)),  # random
    (torch.clamp(Q, -3, 3) ** 2 - 5),                                               # not monotonic
    torch.where(Q % 2 == 0, 1, 0),                                                  # alternating
], ids=["random", "not_monotonic", "alternating"])
def test_tables_no_affine_map_gives_are_refused(row):
    table = torch.stack([torch.zeros(256, dtype=torch.int64), row]).to(torch.int8)
    assert fit_affine_channels(table) is None
    assert pack_fit(None).numel() == 0


def test_packing_is_three_ivec4_per_channel_word_padding_zero():
    table = affine_channel_table(6, 11)
    fit = fit_affine_channels(table)
    words = pack_fit(fit).view(torch.int32).view(2, 3, 4)  # [c4, value, lane]
    for c in range(8):
        m, n, bounds = (int(v) for v in words[c // 4, :, c % 4])
        # S in byte 0, lo and hi (signed) in bytes 1 and 2
        unpacked = [m, n, bounds & 0xFF, (bounds >> 8 & 0xFF) - 256 * (bounds >> 15 & 1),
                    (bounds >> 16 & 0xFF) - 256 * (bounds >> 23 & 1)]
        assert unpacked == (fit[c].tolist() if c < 6 else [0] * 5)


@pytest.mark.parametrize("taps", [4, 9])
def test_window_sum_tables_fit_every_entry(taps):
    """Tables over window sums S = -128 K .. 127 K (1021 entries for 2x2): a pool's mean, a batch
    norm, relu and requantization, as DenseNet's transitions give."""
    s = entry_values(255 * taps + 1)
    assert (int(s[0]), int(s[-1])) == (-128 * taps, 127 * taps)
    table = affine_channel_table(48, taps, taps=taps)
    fit = fit_affine_channels(table)
    assert fit is not None and torch.equal(affine_values(fit, s), table.to(torch.int64))
    assert int((s[None, :] * fit[:, 0:1] + fit[:, 1:2]).abs().max()) < 2**31


def test_bad_tables_are_refused_with_their_shape():
    with pytest.raises(ValueError, match=r"255 K \+ 1 entries \(K >= 1\), got 255"):
        fit_affine_channels(torch.zeros(3, 255, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"\[C, T\] int8, got \[3, 256\] torch.float32"):
        fit_affine_channels(torch.zeros(3, 256))
