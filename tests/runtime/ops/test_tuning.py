"""The tuning cache (runtime/ops/tuning.py): round trip, keys, a corrupt file, the switch, and the
conv dispatcher and layout resolver following a planted measurement."""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from runtime.families.conv2d import conv2d_params
from runtime.families.conv2d_layouts import PLACEHOLDER, PackedOp, resolve_packed_int8_conv2d
from runtime.families.conv2d_tuning import Conv2dChoice, choice_from_json, gemm_settings
from runtime.ops import tuning
from runtime.ops.library import manifest_hash
from runtime.tools.tuner import conv_inputs
from runtime.vulkan.device import get_device

P = conv2d_params((1, 16, 6, 7), (16, 16, 3, 3), [3, 3], [1], [1], [1], 1)  # rule: im2col
OTHER = conv2d_params((2, 16, 6, 7), (16, 16, 3, 3), [3, 3], [1], [1], [1], 1)
GENERAL = Conv2dChoice("general", "4W4C", (("out_w", 2),), 2e-6)
IM2COL = Conv2dChoice("im2col", "4C1W", gemm_settings((4, 1, 16, 2, 8)), 3e-6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache directory with measured choices switched on."""
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ETVK_TUNING", "on")
    return tuning.tuning_cache()


def plant(cache, p, *choices):
    cache.store(tuning.device_key(get_device().caps), tuning.shape_key(p), {c.algorithm: c for c in choices})


def test_choices_round_trip_keyed_by_device_and_shape(cache):
    plant(cache, P, GENERAL, IM2COL)
    assert cache.path == tuning.cache_path() and cache.path.parent.name == "tuning"
    assert json.loads(cache.path.read_text())["version"] == tuning.VERSION
    fresh = tuning.TuningCache(cache.path)  # another process reading the file
    here = tuning.device_key(get_device().caps)
    assert fresh.choices(here, tuning.shape_key(P)) == {"general": GENERAL, "im2col": IM2COL}
    assert fresh.choices(here, tuning.shape_key(OTHER)) == {}
    assert fresh.choices(here.replace("driver", "driver 1"), tuning.shape_key(P)) == {}
    assert here.endswith(f" shaders {manifest_hash()[:12]}")  # another build of the shaders misses
    assert fresh.choices(here.replace(" shaders ", " shaders 0"), tuning.shape_key(P)) == {}
    assert tuning.lookup(P) == GENERAL  # the fastest
    assert tuning.lookup(P, "im2col") == IM2COL and tuning.lookup(P, "pw") is None
    assert tuning.lookup(OTHER) is None
    plant(cache, OTHER, IM2COL)  # a second shape keeps the first
    assert tuning.lookup(P) == GENERAL and tuning.lookup(OTHER) == IM2COL


def test_shape_key_names_the_whole_geometry():
    keys = {tuning.shape_key(conv2d_params((n, 8, 9, 10), (8, 8 // g, 3, 3), [3], [s], [pad], [d], g))
            for n in (1, 2) for s in (1, 2) for pad in (0, 1) for d in (1, 2) for g in (1, 2)}
    assert len(keys) == 32
    assert tuning.shape_key(P) == "n1 c16x6x7 o16 k3x3 s1x1 p1x1 d1x1 g1"


def test_switch_off_ignores_the_cache(cache, monkeypatch):
    plant(cache, P, GENERAL)
    monkeypatch.setenv("ETVK_TUNING", "off")
    assert tuning.lookup(P) is None and tuning.measured(P) == {}
    with tuning.forcing(IM2COL):  # the tuner's forcing works whatever the switch says
        assert tuning.lookup(P) == IM2COL and tuning.lookup(P, "general") is None


def test_rules_only_ignores_the_cache_within_its_block(cache):
    plant(cache, P, GENERAL)
    with tuning.rules_only():
        assert tuning.lookup(P) is None and tuning.measured(P) == {}
        with tuning.forcing(IM2COL):  # forcing still wins
            assert tuning.lookup(P) == IM2COL
    assert tuning.lookup(P) == GENERAL


def test_storing_no_choices_removes_the_entry(cache):
    plant(cache, P, GENERAL)
    plant(cache, OTHER, IM2COL)
    cache.store(tuning.device_key(get_device().caps), tuning.shape_key(P), {})
    assert tuning.lookup(P) is None and tuning.lookup(OTHER) == IM2COL
    assert tuning.shape_key(P) not in json.loads(cache.path.read_text())["devices"][
        tuning.device_key(get_device().caps)]


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 99, "devices": {}}', ""])
def test_an_unreadable_file_is_ignored_with_a_warning(cache, text):
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(text)
    with pytest.warns(UserWarning, match="ignoring the tuning cache"):
        assert tuning.lookup(P) is None
    with pytest.warns(UserWarning, match="ignoring the tuning cache"):
        plant(cache, P, GENERAL)  # writing replaces it
    assert tuning.lookup(P) == GENERAL


def test_a_bad_entry_is_ignored_and_the_others_kept(cache):
    plant(cache, P, GENERAL)
    plant(cache, OTHER, GENERAL)
    data = json.loads(cache.path.read_text())
    entries = data["devices"][tuning.device_key(get_device().caps)]
    entries[tuning.shape_key(OTHER)]["general"]["settings"] = {"out_w": 3}  # never a candidate
    cache.path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="not among the tuner's candidates"):
        assert tuning.lookup(OTHER) is None
    assert tuning.lookup(P) == GENERAL


@pytest.mark.parametrize("data", [
    {"algorithm": "fft", "layout": "4C", "settings": {}, "seconds": 1.0},
    {"algorithm": "pw", "layout": "NHWC", "settings": {}, "seconds": 1.0},
    {"algorithm": "pw", "layout": "4C", "settings": {}, "seconds": -1.0},
    {"algorithm": "pw", "layout": "4C", "settings": {"tile_m": 4}, "seconds": 1.0},
    {"algorithm": "dw", "layout": "4C", "settings": {"out_w": 4.0}, "seconds": 1.0},
    {"algorithm": "dw", "layout": "4C", "settings": {"out_w": 4}},
    {"algorithm": "pw_coop", "layout": "4C", "settings": {"k_splits": 2, "chunk": 96}, "seconds": 1.0},
    {"algorithm": "pw_coop", "layout": "4C", "settings": {"chunk": 64}, "seconds": 1.0},
    {"algorithm": "im2col_coop", "layout": "4C", "settings": {"k_splits": 3}, "seconds": 1.0},
])
def test_choice_from_json_rejects_what_the_tuner_never_measures(data):
    with pytest.raises(ValueError):
        choice_from_json(data)


@pytest.mark.parametrize("settings", [{"k_splits": 2, "chunk": 128}, {"k_splits": 4}])
def test_coop_choices_round_trip_with_or_without_their_chunk(settings):
    """Caches written before chunks were measured hold k_splits alone (the rule's chunk)."""
    data = {"algorithm": "im2col_coop", "layout": "4C", "settings": settings, "seconds": 1.5e-5}
    choice = choice_from_json(data)
    assert dict(choice.settings) == settings and choice.to_json() == data
    assert choice.settings_label == ("ks2 c128" if "chunk" in settings else "ks4")


def test_dispatcher_follows_a_planted_winner(cache, dispatch_trace_path):
    args = conv_inputs(P)
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    want = op.reference(*args)

    def dispatched():
        start = dispatch_trace_path.stat().st_size if dispatch_trace_path.exists() else 0
        assert torch.equal(op(*args), want)
        with dispatch_trace_path.open("rb") as f:
            f.seek(start)
            return [json.loads(line)["variant"] for line in f.read().decode().splitlines()]

    assert all(v.startswith(("q8ta_im2col", "q8ta_gemm")) for v in dispatched())  # the rule
    plant(cache, P, GENERAL, IM2COL)
    assert [v.rsplit("_", 1)[0] for v in dispatched()] == ["q8ta_conv2d_direct"]


def test_layout_resolution_follows_measured_choices():
    ops = [PackedOp("etvk.q8ta_conv2d.default", {"x": PLACEHOLDER, "y": PLACEHOLDER}, P, "x"),
           PackedOp("etvk.q8ta_conv2d_im2col.default", {"y": PLACEHOLDER, "z": PLACEHOLDER}, P, "y")]

    def layouts(tuned):
        return {lay for op in resolve_packed_int8_conv2d(ops, "nvidia", tuned) for lay in op.layouts.values()}

    assert layouts(None) == {"4C"}  # rule 3: im2col reads 4C
    assert layouts(lambda p, algorithm: None) == {"4C"}
    measured = {None: GENERAL, "general": GENERAL, "im2col": Conv2dChoice("im2col", "4W4C", (), 1e-6)}
    assert layouts(lambda p, algorithm: measured.get(algorithm)) == {"4W4C"}
