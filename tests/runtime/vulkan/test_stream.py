"""Streams: push constants, spec constants, folding, replay, timings, trace, barriers, errors."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest
import torch

from runtime.errors import DispatchError, UnsupportedVariant
from runtime.vulkan.device import get_device
from runtime.vulkan.dispatch import fold_groups, group_counts, pack_push
from runtime.vulkan.stream import HOST_OUTPUT_BYTES, Stream
from runtime.vulkan.tensor import Tensor

AFFINE_PUSH = {"numel": 10, "scale": 2.0, "neg": -3, "bias": [1, 2, 3, 4], "shift": [10, 20, 30, 40],
               "mask": [100, 200, 300, 400]}


def _affine(stream, library, x, push=None, spec=None):
    variant = library.variant("affine_buffer_float")
    out = stream.empty(x.shape, torch.float32, variant.binding("t_out"))
    stream.dispatch(variant, "test.affine", bindings={"t_out": out, "t_in": stream.upload(x, variant.binding("t_in"))},
                    push=push or dict(AFFINE_PUSH, numel=x.numel()), global_size=[-(-x.numel() // 4)],
                    spec_constants=spec)
    return out


def _affine_expected(x, push, offset):
    lanes = torch.arange(x.numel()) % 4
    per_lane = (torch.tensor(push["bias"], dtype=torch.float32) + torch.tensor(push["shift"])
                + torch.tensor(push["mask"]))
    return x * push["scale"] + per_lane[lanes] + push["neg"] + offset


@pytest.mark.parametrize("numel, spec, offset", [(10, None, 0), (10, {"OFFSET": 1000}, 1000), (1, {"OFFSET": -7}, -7),
                                                 (301, None, 0)])
def test_push_and_spec_constants(stream, tiny_library, numel, spec, offset):
    x = torch.randint(-50, 50, (numel,)).float()  # integer values: every sum is exact
    push = dict(AFFINE_PUSH, numel=numel)
    out = _affine(stream, tiny_library, x, push, spec)
    stream.run()
    assert torch.equal(out.to_torch(), _affine_expected(x, push, offset))


def test_fold_at_the_device_limit():
    limits = get_device().caps.limits.max_compute_work_group_count
    assert fold_groups([limits[0], 1, 1], limits) == [limits[0], 1, 1]
    assert fold_groups([limits[0] + 1000, 1, 1], limits) == [limits[0], 2, 1]
    assert fold_groups([limits[0] * 3, 1, 1], limits) == [limits[0], 3, 1]


def test_fold_of_a_large_1d_dispatch(stream, tiny_library, tmp_path, monkeypatch):
    """Runs limit + 1000 groups; where that buffer would be too big (x limit 2**31 - 1), at x limit 65535."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("ETVK_TRACE_DISPATCH", str(trace))
    variant = tiny_library.variant("group_ids_buffer_int32")
    device = get_device()
    limits = device.caps.limits
    limit = limits.max_compute_work_group_count[0]
    if 4 * (limit + 1000) > 64 << 20:  # 65535 is the least x limit Vulkan allows: folding there is valid
        limit = 65535
        counts = (limit, *limits.max_compute_work_group_count[1:])
        monkeypatch.setattr(device, "caps", replace(device.caps, limits=replace(limits, max_compute_work_group_count=counts)))
    count = limit + 1000
    out = stream.empty([count], torch.int32, variant.binding("t_out"))
    stream.dispatch(variant, "test.group_ids", bindings={"t_out": out}, push={"count": count}, groups=[count])
    stream.run()
    assert torch.equal(out.to_torch(), torch.arange(count, dtype=torch.int32))
    line = json.loads(trace.read_text())
    assert line == {"op": "test.group_ids", "variant": "group_ids_buffer_int32", "global": [count, 1, 1],
                    "local": [1, 1, 1], "groups": [limit, 2, 1], "device": get_device().caps.name}


def test_texture_dispatch_with_dummy_binding(stream, tiny_library):
    variant = tiny_library.variant("add_texture3d_int8")
    x = torch.randint(-100, 100, (2, 3, 9), dtype=torch.int8)
    out = stream.empty(x.shape, torch.int8, variant.binding("t_out"))
    stream.dispatch(variant, "test.add", bindings={"t_out": out, "t_in": stream.upload(x, variant.binding("t_in")),
                                                   "t_extra": None},
                    push={"add": 5}, global_size=[3, 3, 2])
    stream.run()
    assert torch.equal(out.to_torch(), x + 5)


def test_chain_replay_and_timings(stream, tiny_library):
    """Two dependent dispatches (the barrier between them matters), replayed on new input."""
    variant = tiny_library.variant("affine_buffer_float")
    push = dict(AFFINE_PUSH, numel=8, neg=0, bias=[0] * 4, shift=[0] * 4, mask=[0] * 4)
    x = stream.upload(torch.arange(8.0), variant.binding("t_in"))
    middle = stream.empty([8], torch.float32, variant.binding("t_out"))
    out = stream.empty([8], torch.float32, variant.binding("t_out"))
    for src, dst in ((x, middle), (middle, out)):
        stream.dispatch(variant, "test.affine", bindings={"t_in": src, "t_out": dst}, push=push, global_size=[2])
    stream.run()
    assert torch.equal(out.to_torch(), torch.arange(8.0) * 4)
    threes = torch.full([8], 3.0)
    x.memory.write(threes.data_ptr(), threes.nbytes)
    stream.replay()
    assert torch.equal(out.to_torch(), torch.full([8], 12.0))
    timings = stream.timings()
    assert [name for name, _ in timings] == ["affine_buffer_float"] * 2
    assert all(0 <= seconds < 10 for _, seconds in timings) and any(s > 0 for _, s in timings)
    span = stream.gpu_seconds()  # first start to last end: covers each dispatch
    assert span < 10 and span >= max(seconds for _, seconds in timings)


@pytest.mark.parametrize("spin", [1.0, 1e-9])  # polled until signalled; polled, then blocked
def test_replays_wait_for_the_fence_however_it_is_waited_for(stream, tiny_library, monkeypatch, spin):
    monkeypatch.setattr(get_device(), "fence_spin", spin)
    variant = tiny_library.variant("affine_buffer_float")
    count = 1 << 16  # enough work that a run not waited for would read stale values
    x = stream.upload(torch.zeros(count), variant.binding("t_in"))
    out = _affine(stream, tiny_library, x, dict(AFFINE_PUSH, numel=count))
    stream.run()
    for value in (1.0, 2.0):
        ones = torch.full([count], value)
        x.memory.write(ones.data_ptr(), ones.nbytes)
        stream.replay()
        assert torch.equal(out.to_torch(), _affine_expected(ones, dict(AFFINE_PUSH, numel=count), 0))


def test_missing_barrier_is_caught_by_synchronization_validation(stream, tiny_library, monkeypatch):
    """Proves the validation fixture can fail: drop the barrier between dependent dispatches."""

    record = Stream._record

    def without_barrier(self, signature):  # into the resources finish() takes
        monkeypatch.setattr(self._resources.between_barrier, "record", lambda cb: None)
        record(self, signature)

    monkeypatch.setattr(Stream, "_record", without_barrier)
    variant = tiny_library.variant("affine_buffer_float")
    push = dict(AFFINE_PUSH, numel=8)
    middle = stream.empty([8], torch.float32, variant.binding("t_out"))
    out = stream.empty([8], torch.float32, variant.binding("t_out"))
    x = stream.upload(torch.ones(8), variant.binding("t_in"))
    for src, dst in ((x, middle), (middle, out)):
        stream.dispatch(variant, "test.affine", bindings={"t_in": src, "t_out": dst}, push=push, global_size=[2])
    stream.run()
    messages = get_device().take_validation_messages("error")
    assert any("SYNC-HAZARD-READ-AFTER-WRITE" in m for m in messages), messages


def test_record_again_after_run(stream, tiny_library):
    first = _affine(stream, tiny_library, torch.ones(4))
    stream.run()
    x = torch.randint(-50, 50, (6,)).float()
    second = _affine(stream, tiny_library, x)
    stream.run()
    assert torch.equal(second.to_torch(), _affine_expected(x, dict(AFFINE_PUSH, numel=6), 0))
    assert [name for name, _ in stream.timings()] == ["affine_buffer_float"]
    assert first.to_torch().shape == (4,)


def test_closed_stream_refuses_work(tiny_library):
    from runtime.vulkan.stream import Stream

    stream = Stream()
    x = torch.ones(4)
    out = _affine(stream, tiny_library, x)
    stream.run()
    stream.close()
    stream.close()  # idempotent
    with pytest.raises(DispatchError, match="stream was closed"):
        _affine(stream, tiny_library, x)
    with pytest.raises(DispatchError, match="stream was closed"):
        stream.run()
    with pytest.raises(DispatchError, match="replay"):
        stream.replay()
    assert stream.timings() == [] and torch.equal(out.to_torch(), _affine_expected(x, AFFINE_PUSH | {"numel": 4}, 0))


def test_recycled_streams_and_outputs_stay_correct(tiny_library):
    """Outputs are not zeroed and streams reuse pools: results must not depend on what was there before."""
    from runtime.vulkan.stream import Stream

    for numel in (301, 7, 301, 64, 7):
        x = torch.randint(-50, 50, (numel,)).float()
        with Stream() as stream:
            first = _affine(stream, tiny_library, x)
            second = _affine(stream, tiny_library, x + 1)
            stream.run()
            push = dict(AFFINE_PUSH, numel=numel)
            assert torch.equal(first.to_torch(), _affine_expected(x, push, 0))
            assert torch.equal(second.to_torch(), _affine_expected(x + 1, push, 0))
        del first, second


def test_zero_groups_skip_the_dispatch(stream, tiny_library, tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("ETVK_TRACE_DISPATCH", str(trace))
    _affine(stream, tiny_library, torch.empty(0), dict(AFFINE_PUSH, numel=0))
    stream.run()
    assert stream.timings() == [] and stream.gpu_seconds() is None and not trace.exists()
    with pytest.raises(DispatchError, match="replay"):
        stream.replay()


@pytest.mark.parametrize("change, message", [
    ({"push": {"numel": 1}}, r"push constants missing \['bias', 'mask', 'neg', 'scale', 'shift'\]"),
    ({"push": dict(AFFINE_PUSH, extra=1)}, r"push constants missing \[\], unexpected \['extra'\]"),
    ({"push": dict(AFFINE_PUSH, numel=-1)}, r"push constant 'numel' \(uint\) cannot hold -1"),
    ({"push": dict(AFFINE_PUSH, bias=[1, 2])}, r"push constant 'bias' \(vec4\) cannot hold \[1, 2\]"),
    ({"push": dict(AFFINE_PUSH, bias=[1, 2, 3], shift=[1, 2, 3, 4, 5])},
     r"push constant 'bias' \(vec4\) cannot hold \[1, 2, 3\]"),
    ({"push": dict(AFFINE_PUSH, scale="2")}, r"push constant 'scale' \(float\) cannot hold '2'"),
    ({"bindings": {"t_out": None}}, r"variant affine_buffer_float: bindings missing \['t_in'\]"),
    ({"groups": [1]}, "exactly one of global_size= and groups="),
    ({"global_size": None}, "exactly one of global_size= and groups="),
    ({"global_size": [1, 1, 1, 1]}, "1 to 3 dimensions"),
    ({"global_size": [64, 65536]}, r"group counts \[1, 65536, 1\] exceed the device limit"),
])
def test_dispatch_errors(stream, tiny_library, change, message):
    variant = tiny_library.variant("affine_buffer_float")
    call = {"bindings": {"t_out": None, "t_in": None}, "push": AFFINE_PUSH, "global_size": [1], **change}
    with pytest.raises(DispatchError, match=message):
        stream.dispatch(variant, "test.affine", **call)


def test_pipelines_by_given_spec_constants(tiny_library):
    """Looked up by the values as given; equal values (and the defaults given explicitly) share
    a pipeline, unknown names are refused however often they are given."""
    pipelines = get_device().pipelines
    variant = tiny_library.variant("affine_buffer_float")
    built = pipelines.get(variant, {"OFFSET": 5})
    assert pipelines.get(variant, {"OFFSET": 5}) is built
    assert pipelines.get(variant, {"OFFSET": 6}) is not built
    assert pipelines.get(variant, {"OFFSET": 0}) is pipelines.get(variant)  # the default value
    for _ in range(2):
        with pytest.raises(UnsupportedVariant, match="no spec constant"):
            pipelines.get(variant, {"TILE": 5})


def test_pipelines_by_workgroup(tiny_library):
    """A variant run with another workgroup (its interface replaced, as the quantize tunables
    do) gets its own pipeline, with the given spec constants and without: the workgroup is a
    specialization, so a pipeline built for one must not serve another."""
    pipelines = get_device().pipelines
    variant = tiny_library.variant("affine_buffer_float")
    wider = replace(variant, interface=replace(
        variant.interface, workgroup=(2 * variant.interface.workgroup[0], 1, 1)))
    for specs in (None, {"OFFSET": 5}):
        built = pipelines.get(variant, specs)
        assert pipelines.get(wider, specs) is not built
        assert pipelines.get(wider, specs) is pipelines.get(wider, specs)
        assert pipelines.get(variant, specs) is built


def test_unknown_spec_constant(stream, tiny_library):
    with pytest.raises(UnsupportedVariant, match=r"no spec constant\(s\) \['TILE'\]; it has: \['OFFSET'\]"):
        _affine(stream, tiny_library, torch.ones(4), spec={"TILE": 2})


def test_upload_and_empty_check_the_binding(stream, tiny_library):
    binding = tiny_library.variant("affine_buffer_float").binding("t_in")
    converted = stream.upload(torch.arange(5), binding)
    assert converted.dtype == torch.float32 and stream.upload(converted, binding) is converted
    int8_buffer = Tensor.from_torch(torch.ones(3, dtype=torch.int8))
    with pytest.raises(DispatchError, match="op: argument 'x': device tensor is torch.int8 buffer, binding 't_in'"):
        stream.upload(int8_buffer, binding, "op: argument 'x'")
    with pytest.raises(DispatchError, match="dtype torch.int32 differs from binding 't_in' dtype float32"):
        stream.empty([3], torch.int32, binding)


def test_read_back_streams_put_small_outputs_in_host_memory(tiny_library):
    binding = tiny_library.variant("affine_buffer_float").binding("t_out")
    large = [HOST_OUTPUT_BYTES // 4 + 1]
    with Stream(read_back=True) as stream:
        placements = [stream.empty([8], torch.float32, binding).memory.placement,
                      stream.empty([8], torch.float32, binding, scratch=True).memory.placement,
                      stream.empty(large, torch.float32, binding).memory.placement]
    with Stream() as stream:
        placements.append(stream.empty([8], torch.float32, binding).memory.placement)
    assert placements == ["host", "auto", "auto", "auto"]


def test_pack_push_bytes(tiny_library):
    data = pack_push(tiny_library.variant("affine_buffer_float"), "test", AFFINE_PUSH)
    assert data == struct.pack("<IfI4x4f4i4I", 10, 2.0, 2**32 - 3, 1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400)


@pytest.mark.parametrize("workgroup, global_size, groups, counts, size", [
    ((64, 1, 1), [100], None, [2, 1, 1], [100, 1, 1]),
    ((8, 8, 1), [9, 17], None, [2, 3, 1], [9, 17, 1]),
    ((4, 4, 1), None, [2, 3, 4], [2, 3, 4], [8, 12, 4]),
    ((64, 1, 1), [0], None, [0, 1, 1], [0, 1, 1]),
])
def test_group_counts(workgroup, global_size, groups, counts, size):
    assert group_counts(workgroup, global_size, groups) == (counts, size)


@pytest.mark.parametrize("counts, limits, folded", [
    ([10, 1, 1], (4, 4, 4), [4, 3, 1]),
    ([4, 1, 1], (4, 4, 4), [4, 1, 1]),
    ([16, 1, 1], (4, 4, 4), [4, 4, 1]),
    ([3, 2, 1], (4, 4, 4), [3, 2, 1]),
])
def test_fold_groups(counts, limits, folded):
    assert fold_groups(counts, limits) == folded


@pytest.mark.parametrize("counts", [[17, 1, 1], [5, 2, 1], [1, 1, 5]])
def test_fold_groups_over_the_limit(counts):
    with pytest.raises(DispatchError, match="exceed the device limit"):
        fold_groups(counts, (4, 4, 4))


def test_repeated_op_calls_reuse_the_recorded_command_buffer(recorded):
    """Fresh calls on the same sizes get the same allocations back (input and output of one size
    class here) and submit the recording already made; every call still sees its own values."""
    import runtime
    from runtime.reference.quantize import quantize_per_tensor

    op = runtime.get_op("etvk.quantize_per_tensor.default")
    for i in range(5):
        x = torch.randn(40) * (i + 1)
        assert torch.equal(op(x, 0.05, 3, -1000, 1000, torch.int32),
                           quantize_per_tensor(x, 0.05, 3, -1000, 1000, torch.int32))
    assert len(recorded) == 1
    x = torch.randn(3, 41)
    assert torch.equal(op(x, 0.05, 3, -1000, 1000, torch.int32),  # other sizes and push constants
                       quantize_per_tensor(x, 0.05, 3, -1000, 1000, torch.int32))
    assert torch.equal(op(x, 0.5, 3, -1000, 1000, torch.int32),
                       quantize_per_tensor(x, 0.5, 3, -1000, 1000, torch.int32))
    assert len(recorded) == 3


def test_a_recording_of_destroyed_memory_is_never_reused(tiny_library, recorded):
    """Allocations are keyed by serial, not by handle: a new buffer may get a destroyed one's
    handle value (lavapipe's handles are heap addresses), never its serial."""
    from runtime.vulkan.stream import Stream

    device = get_device()
    for i in range(3):
        x = torch.randint(-50, 50, (300,)).float() + i
        with Stream() as stream:
            out = _affine(stream, tiny_library, x)
            stream.run()
            assert torch.equal(out.to_torch(), _affine_expected(x, dict(AFFINE_PUSH, numel=300), 0))
        del out
        spare = device.spare_memory
        while (item := spare.take(next(iter(spare._idle), None))) is not None:  # destroy the spares
            item.destroy()
    assert len(recorded) == 3
    assert not device.take_validation_messages("error")
