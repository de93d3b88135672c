"""Recorded command buffers kept for reuse: the cache itself, and op calls and streams through it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from runtime.vulkan.device import ConfigError, get_device, reuse_recordings
from runtime.vulkan.recordings import Recordings
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

QUANTIZE = "etvk.quantize_per_tensor.default"


class _Item:
    def __init__(self, destroyed: list, name):
        self.destroyed, self.name = destroyed, name

    def destroy(self):
        self.destroyed.append(self.name)


class _Alive:
    """Something a weak reference can point at."""


def test_recordings_match_by_signature_least_recently_used_out_first():
    destroyed = []
    cache = Recordings(3)
    alive = _Alive()
    for name in "abc":
        cache.give(name, _Item(destroyed, name), (weakref.ref(alive),))
    assert cache.take("b").name == "b" and cache.entries == 2
    cache.give("b", _Item(destroyed, "b"), ())
    cache.give("d", _Item(destroyed, "d"), ())  # over the bound: "a", used least recently, goes
    assert destroyed == ["a"] and cache.entries == 3
    assert cache.take("x").name == "c"  # full, no match: the least recently used is recorded again
    assert cache.take("x") is None  # below the bound: make a new one
    cache.give("d", _Item(destroyed, "d2"), ())  # a second recording of "d" replaces the first
    assert destroyed == ["a", "d"] and cache.take("d").name == "d2"
    cache.close()
    cache.give("e", _Item(destroyed, "late"), ())
    assert destroyed == ["a", "d", "b", "late"] and cache.entries == 0


def test_recordings_that_bind_destroyed_objects_are_recorded_again_first():
    destroyed = []
    cache = Recordings(8)
    kept, gone = _Alive(), _Alive()
    cache.give("old", _Item(destroyed, "old"), (weakref.ref(kept),))
    cache.give("stale", _Item(destroyed, "stale"), (weakref.ref(kept), weakref.ref(gone)))
    cache.give(None, _Item(destroyed, "blank"), ())  # nothing usable recorded
    cache.give("new", _Item(destroyed, "new"), (weakref.ref(kept),))
    assert cache.take("x").name == "blank"
    assert cache.take("x") is None  # nothing stale, room for more
    del gone
    gc.collect()
    assert cache.take("x").name == "stale"
    assert cache.take("old").name == "old" and not destroyed


def test_recordings_that_bind_a_retired_object_are_destroyed_first():
    """The spare memory calls forget() before destroying an allocation: kept recordings that
    bind it go first (no kept descriptor set names a destroyed buffer)."""
    destroyed = []
    cache = Recordings(8)
    a, b = _Alive(), _Alive()
    cache.give("ab", _Item(destroyed, "ab"), (weakref.ref(a), weakref.ref(b)))
    cache.give("b", _Item(destroyed, "b"), (weakref.ref(b),))
    cache.give(None, _Item(destroyed, "blank"), ())
    cache.forget(a)
    assert destroyed == ["ab"] and cache.entries == 2
    cache.forget(b)
    assert destroyed == ["ab", "b"] and cache.take("x").name == "blank"


def test_recordings_without_reuse_hand_back_the_most_recent_to_record_again():
    destroyed = []
    cache = Recordings(8, reuse=False)
    cache.give("a", _Item(destroyed, "a"), ())
    cache.give("b", _Item(destroyed, "b"), ())
    assert cache.take("a").name == "b" and cache.take("a").name == "a" and cache.take("a") is None


@pytest.mark.parametrize("setting, reuse", [(None, True), ("", True), ("1", True), ("0", False)])
def test_reuse_recordings_setting(setting, reuse):
    assert reuse_recordings(setting) is reuse


@pytest.mark.parametrize("setting", ["yes", "2", "off"])
def test_bad_reuse_recordings_setting_is_refused(setting):
    with pytest.raises(ConfigError, match="ETVK_REUSE_RECORDINGS"):
        reuse_recordings(setting)


def _quantize_calls(shapes, seed: int, vary: bool = True):
    """Op calls of quantize_per_tensor on changing shapes and values (and push constants if
    `vary`), against the reference; returns the results."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    op = runtime.get_op(QUANTIZE)
    gen = torch.Generator().manual_seed(seed)
    results = []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=gen) * (1 + i % 3)
        args = (0.05 * (1 + i % 2), i % 5 - 2, -128, 127, torch.int8) if vary else (
            0.05, 0, -128, 127, torch.int8)
        out = op(x, *args)
        assert torch.equal(out, quantize_per_tensor(x, *args)), (i, shape)
        results.append(out)
    return results


SHAPES = [(64,), (3, 41), (64,), (2, 5, 7), (3, 41), (64,), (300,), (64,), (2, 5, 7), (300,)] * 3


def test_op_calls_with_and_without_reuse_agree(recorded):
    """Many calls on changing inputs and shapes: equal to the reference and to the same calls
    recorded afresh every time; with reuse, each shape and set of push constants is recorded
    only a few times (the same allocations come back in one or two orders)."""
    device = get_device()
    reused = _quantize_calls(SHAPES, 0)
    assert len(recorded) <= 2 * len({(shape, i % 2, i % 5) for i, shape in enumerate(SHAPES)})
    assert len(recorded) < len(SHAPES)
    calls_with_reuse = len(recorded)
    device.recordings.reuse = False
    afresh = _quantize_calls(SHAPES, 0)
    assert len(recorded) - calls_with_reuse == len(SHAPES)
    assert all(torch.equal(a, b) for a, b in zip(reused, afresh, strict=True))


def test_the_cache_keeps_at_most_its_bound(recorded, monkeypatch):
    device = get_device()
    monkeypatch.setattr(device.recordings, "max_entries", 3)
    shapes = [(n,) for n in (100, 200, 300, 400, 500)]  # five signatures, one size class each
    _quantize_calls(shapes, 1, vary=False)
    assert device.recordings.entries == 3 and len(recorded) == 5
    _quantize_calls(shapes[-3:], 2, vary=False)  # the three most recent are kept...
    assert len(recorded) == 5
    _quantize_calls(shapes[:1], 3, vary=False)  # ...the first is not any more
    assert len(recorded) == 6 and device.recordings.entries == 3


def test_a_new_tensor_in_recycled_memory_runs_with_its_own_values(recorded):
    """A freed input's memory goes to the next tensor of its size: the kept recording binds it
    and is reused, and reads the new tensor's values."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    op = runtime.get_op(QUANTIZE)
    args = (0.1, 0, -128, 127, torch.int8)
    for i in range(4):
        x = torch.randn(8, 16) + i
        device_x = Tensor.from_torch(x)
        assert torch.equal(op(device_x, *args), quantize_per_tensor(x, *args))
        del device_x  # its memory goes back to the spare memory, the next from_torch takes it
    assert len(recorded) == 1


def test_a_recording_of_evicted_memory_is_recorded_over(recorded):
    """When the spare memory destroys a freed input's allocation, the recording that binds it
    can never match again: the next miss writes over it instead of growing the cache."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    device = get_device()
    op = runtime.get_op(QUANTIZE)
    args = (0.1, 0, -128, 127, torch.int8)
    for i in range(3):
        x = torch.randn(8, 16) + i
        device_x = Tensor.from_torch(x)
        assert torch.equal(op(device_x, *args), quantize_per_tensor(x, *args))
        del device_x
        spare = device.spare_memory
        while (item := spare.take(next(iter(spare._idle), None))) is not None:  # destroy the spares
            item.destroy()
        gc.collect()
    assert len(recorded) == 3 and device.recordings.entries == 1


def test_user_streams_keep_their_recording_while_op_calls_use_the_cache(recorded):
    """A stream the user records owns its command buffer until it closes: op calls of the same
    dispatches meanwhile record their own, and its replays read what its input holds."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    op = runtime.get_op(QUANTIZE)
    args = (0.05, 1, -128, 127, torch.int8)
    x = torch.randn(64)
    with Stream() as stream:
        device_x = Tensor.from_torch(x)
        out = op.record(stream, device_x, *args)
        stream.run()
        held = stream._resources
        for i in range(3):
            y = torch.randn(64) * (i + 2)
            assert torch.equal(op(y, *args), quantize_per_tensor(y, *args))
            assert stream._resources is held
            device_x.copy_from(y)
            stream.replay()
            assert torch.equal(out.to_torch(), quantize_per_tensor(y, *args))
        assert held not in [item for item, _ in get_device().recordings._idle.values()]
    assert held in [item for item, _ in get_device().recordings._idle.values()]


def test_a_stream_recorded_again_gives_back_its_earlier_recording(recorded):
    """After run(), recording other dispatches into the same stream keeps the first recording for
    later streams; a stream of the first dispatches then submits it without recording."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    op = runtime.get_op(QUANTIZE)
    args = (0.05, 0, -128, 127, torch.int8)
    x, y = Tensor.from_torch(torch.randn(64)), Tensor.from_torch(torch.randn(3, 300))
    with Stream() as stream:
        first = op.record(stream, x, *args)
        stream.run()
        second = op.record(stream, y, *args)  # outputs of another size class than first's
        stream.run()
        assert torch.equal(second.to_torch(), quantize_per_tensor(y.to_torch(), *args))
    del first  # its memory goes to the next output of its size
    with Stream() as stream:
        again = op.record(stream, x, *args)
        stream.run()
        assert torch.equal(again.to_torch(), quantize_per_tensor(x.to_torch(), *args))
    assert len(recorded) == 2


def test_a_pending_command_buffer_is_not_kept(recorded, tiny_library):
    """Resources whose submission was not waited for are destroyed on close, never reused."""
    device = get_device()
    variant = tiny_library.variant("group_ids_buffer_int32")
    with Stream() as stream:
        stream.dispatch(variant, "test", bindings={"t_out": None}, push={"count": 8}, groups=[8])
        stream.run()
        stream._resources.pending = True  # as if the wait had raised
    assert device.recordings.entries == 0
