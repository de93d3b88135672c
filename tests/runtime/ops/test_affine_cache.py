"""runtime.ops.affine_cache: the affine maps of per-channel tables kept on disk, used only where
exact for every entry."""

from __future__ import annotations

import pytest
import torch

from runtime.families import channel_affine
from runtime.ops import affine_cache
from runtime.tools.examples_q8ta_unary import affine_channel_table


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    return tmp_path / "affine"


def _no_fitting(monkeypatch):
    def refuse(table):
        raise AssertionError("fitted, where the cache held the maps")
    monkeypatch.setattr(affine_cache, "fit_affine_channels", refuse)


def test_a_fit_is_written_once_and_read_back(cache, monkeypatch):
    table = affine_channel_table(24, 5, taps=4)
    fit = affine_cache.cached_affine_channels(table)
    assert fit is not None and torch.equal(fit, channel_affine.fit_affine_channels(table))
    assert [p.suffix for p in cache.iterdir()] == [".i64"]
    _no_fitting(monkeypatch)
    assert torch.equal(affine_cache.cached_affine_channels(table.clone()), fit)
    assert torch.equal(affine_cache.packed_affine_channels(table), channel_affine.pack_fit(fit))


@pytest.mark.parametrize("damage", ["shifted", "truncated", "foreign"])
def test_a_file_that_is_not_exact_is_refitted(cache, damage):
    table = affine_channel_table(16, 7)
    fit = affine_cache.cached_affine_channels(table)
    (path,) = cache.iterdir()
    if damage == "shifted":  # one channel's shift off by one: a valid-looking map, wrong entries
        bad = fit.clone()
        bad[3, 2] += 1
        path.write_bytes(bad.numpy().tobytes())
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-8])
    else:  # another table's maps, same size
        path.write_bytes(channel_affine.fit_affine_channels(affine_channel_table(16, 8)).numpy().tobytes())
    assert torch.equal(affine_cache.cached_affine_channels(table), fit)
    assert torch.equal(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.int64).view(-1, 5), fit)


def test_tables_no_map_fits_are_not_kept(cache):
    table = torch.randint(-128, 128, (4, 256), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    assert affine_cache.cached_affine_channels(table) is None
    assert affine_cache.packed_affine_channels(table).numel() == 0
    assert not cache.exists() or not any(cache.iterdir())


def test_a_cache_that_cannot_be_written_warns_and_still_fits(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ETVK_CACHE_DIR", str(blocker))
    table = affine_channel_table(8, 2)
    with pytest.warns(UserWarning, match="cannot be written"):
        fit = affine_cache.cached_affine_channels(table)
    assert torch.equal(fit, channel_affine.fit_affine_channels(table))


def test_check_refuses_maps_outside_the_shaders_arithmetic():
    table = affine_channel_table(4, 3)
    fit = channel_affine.fit_affine_channels(table)
    assert channel_affine.check_affine_channels(fit, table)
    for column, value in ((2, -1), (2, 25), (3, -129), (4, 128)):
        bad = fit.clone()
        bad[0, column] = value
        assert not channel_affine.check_affine_channels(bad, table)
    huge = fit.clone()
    huge[0, 1] = 2**31
    assert not channel_affine.check_affine_channels(huge, table)
    assert not channel_affine.check_affine_channels(fit[:3], table)
    assert not channel_affine.check_affine_channels(fit.to(torch.int32), table)
