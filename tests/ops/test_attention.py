"""Attention family (docs/attention_ops.md) on the default Vulkan device, validation on.

cache_attention: every case of `runtime.tools.examples_attention` in every variant
must lie within `attention_tolerance` of PyTorch's scaled_dot_product_attention in
float64 (kv heads repeated, mask[i, j] = j <= positions[i]), and so must the fp32
reference; cache rows past the largest position are NaN, so a shader that read one
would fail. The same holds with the keys split into chunks of a few keys (the
split's grain made small, so that small caches take many chunks, some partly
filled, and chunks that do not start on a tile); a call whose keys fit one chunk
is one dispatch, a split one two. The tiled kernel (the rule made to take it for
every call) holds every case, and seeded random prefills (head dims 16 to 128, GQA
groups 1, 4 and 8, rows that do not fill the last block, positions past 0, with gaps or
unsorted), to the same tolerance in one dispatch, with one lane a row (its variant
without subgroup shuffles) and with the rule's lanes, the prefills with 2 and 8 lanes
too; the rule gives it a call of many tokens and keeps decode on the split kernel. cache_update: every case in every variant equals
the reference (index_copy) bit for bit, special bit patterns included; a device
cache is written in place and returned; a recorded decode step (two cache writes
and the attention) replays with new tokens and positions, split or not.
rope_cache_update: every case in every variant is one dispatch whose three results
equal, bit for bit, the reference and the unfused device ops (rope of q and of k_new,
two cache_update), on host and on device caches (written in place). Bad arguments
name the op and the argument.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from op_testlib import assert_argument_error

import runtime
from runtime.families import attention as split_rule
from runtime.ops import stub_support
from runtime.reference import attention as ref
from runtime.tools.examples_attention import (
    ATTENTION_BY_NAME,
    ATTENTION_CASES,
    DTYPES,
    ROPE_UPDATE_BY_NAME,
    ROPE_UPDATE_CASES,
    UPDATE_BY_NAME,
    UPDATE_CASES,
    AttentionCase,
    attention_inputs,
    rope_update_inputs,
    sdpa_caches,
    update_inputs,
)
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

ATTENTION = "etvk.cache_attention.default"
UPDATE = "etvk.cache_update.default"
ROPE_UPDATE = "etvk.rope_cache_update.default"
BITS = {torch.float32: torch.int32, torch.float16: torch.int16}
# The second step of a split cache_attention, by DTYPE; the kernel of many-token calls, by
# (DTYPE, EXCHANGE).
COMBINE = {info.axes["DTYPE"]: info.name for info in runtime.get_op(ATTENTION).variants
           if info.shader == "cache_attention_combine"}
TILED = {(info.axes["DTYPE"], info.axes["EXCHANGE"]): info.name
         for info in runtime.get_op(ATTENTION).variants if info.shader == "cache_attention_tiled"}
# Grains of the split that make the cases' small caches take several chunks: 4 keys (many
# chunks of one partial tile) and 100 (chunks of a whole and a partial tile, starting off the
# tiles of 64).
SMALL_GRAINS = (4, 100)


def _variants(op_name, cases, shader=None):
    """(variant, DTYPE, case) of every variant of the op (of `shader` only, when given)."""
    return [pytest.param(info.name, info.axes["DTYPE"], case, id=f"{info.name}-{case.name}")
            for info in runtime.get_op(op_name).variants if shader in (None, info.shader)
            for case in cases]


def split_of(case):
    """The op's `AttentionSplit` for `case` by the rule as it stands."""
    return split_rule.attention_split(case.batch * len(case.positions) * case.kv_heads, case.cache_len)


def chunks_with_keys(case) -> int:
    """The most chunks one query of `case` finds keys in (0 without queries)."""
    size = split_of(case).chunk_keys
    return max((p // size - (max(0, p - case.window + 1) // size if case.window else 0) + 1
                for p in case.positions), default=0)


def tiled_of(case) -> int:
    """Keys per tile of the tiled kernel for `case` by the rule as it stands (0: split)."""
    return split_rule.attention_tile_keys(len(case.positions), case.head_dim)


def tiled_variant(dtype: str, case) -> str:
    """The tiled kernel's variant the rule gives `case` on this device (its lanes as they stand)."""
    return TILED[dtype, "shuffle" if stub_support.attention_lanes(case.head_dim) > 1 else "none"]


@pytest.fixture
def tiled(monkeypatch):
    """Makes the rule give every call (one token or more) the tiled kernel."""
    monkeypatch.setattr(split_rule, "TILED_MIN_TOKENS", 1)


@pytest.fixture
def small_grain(monkeypatch):
    """Sets the split's grain (keys per chunk come in whole grains) for the test."""
    return lambda grain: monkeypatch.setattr(split_rule, "CHUNK_GRAIN", grain)


def dispatched(trace_path, call) -> list[str]:
    """The variants `call()` dispatches, in order, from the dispatch trace."""
    before = trace_path.read_text().count("\n") if trace_path.exists() else 0
    call()
    lines = trace_path.read_text().splitlines()[before:] if trace_path.exists() else []
    return [json.loads(line)["variant"] for line in lines]


def exact(case, args):
    """PyTorch's float64 attention over the caches with finite values past the positions."""
    q, _, _, positions, scale, window = args
    k, v = sdpa_caches(case, q.dtype)
    return ref.exact_attention(q, k, v, positions, scale, window)


def assert_within(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    error = float((got.double() - want).abs().max()) if got.numel() else 0.0
    assert error <= tol, f"{what}: error {error:.3g} over the tolerance {tol:.3g}"


def check_attention(variant, dtype, case, trace_path):
    """The op (its kernel's variant forced to `variant`) and the reference are within the
    tolerance of the exact result; the call is one dispatch where the kernel is tiled or the
    keys are not split, two where they are (the combine dispatched, whether or not a query
    finds keys past its first chunk)."""
    args = attention_inputs(case, DTYPES[dtype])
    tol = ref.attention_tolerance(*args)
    truth = exact(case, args)
    want = ref.cache_attention(*args)
    assert want.dtype == DTYPES[dtype]
    assert_within(want, truth, tol, f"reference {case.name}")
    found = []
    variants = dispatched(trace_path, lambda: found.append(runtime.get_op(ATTENTION)(*args, variant=variant)))
    got = found[0]
    assert got.dtype == DTYPES[dtype]
    assert_within(got, truth, tol, f"{variant} {case.name}")
    assert bool(torch.isfinite(got).all()), f"{variant} {case.name}: a NaN or inf came out"
    if got.numel() and tiled_of(case):
        assert variants == [tiled_variant(dtype, case)], variants
    elif got.numel():
        split = split_of(case)
        assert variants == [variant] + [COMBINE[dtype]] * (split.chunks > 1), (split, variants)


@pytest.mark.parametrize(("variant", "dtype", "case"), _variants(ATTENTION, ATTENTION_CASES, "cache_attention"))
def test_cache_attention_matches_pytorch_sdpa(variant, dtype, case, dispatch_trace_path):
    check_attention(variant, dtype, case, dispatch_trace_path)


@pytest.mark.parametrize("grain", SMALL_GRAINS)
@pytest.mark.parametrize(("variant", "dtype", "case"), _variants(ATTENTION, ATTENTION_CASES, "cache_attention"))
def test_split_keys_match_pytorch_sdpa(variant, dtype, case, grain, small_grain, dispatch_trace_path):
    """Every case with the keys in chunks of `grain` (or a few grains) keys."""
    small_grain(grain)
    check_attention(variant, dtype, case, dispatch_trace_path)


def random_prefills() -> list[AttentionCase]:
    """Seeded prefill shapes for the tiled kernel: (head dim, GQA group, kv heads, batch)
    as listed, 17 to 40 tokens (rows rarely a multiple of 64), positions from past 0 with
    gaps (every other case unsorted) and a cache a little past them."""
    gen = torch.Generator().manual_seed(40)
    cases = []
    for i, (dim, group, kv_heads, batch) in enumerate(
            ((80, 4, 2, 1), (128, 8, 1, 2), (64, 1, 3, 1), (16, 4, 1, 1), (96, 8, 1, 1))):
        tokens = int(torch.randint(17, 41, (), generator=gen))
        start = int(torch.randint(1, 40, (), generator=gen))
        span = start + tokens + int(torch.randint(0, 2 * tokens, (), generator=gen))
        chosen = start + torch.randperm(span - start, generator=gen)[:tokens]
        positions = chosen if i % 2 else chosen.sort().values
        cases.append(AttentionCase(f"prefill_d{dim}_gqa{group}_b{batch}", batch, group * kv_heads,
                                   kv_heads, span + 3, dim, tuple(positions.tolist()),
                                   torch.int32 if i % 2 else torch.int64))
    return cases


PREFILLS = random_prefills()


def tiled_variants(cases):
    """(variant, DTYPE, case) of the tiled kernel: its variant without shuffles on every case,
    its shuffle variant on the cases whose head dim the rule gives more than one lane here."""
    return [p for p in _variants(ATTENTION, cases, "cache_attention_tiled")
            if p.values[0] == TILED[p.values[1], "none"] or stub_support.attention_lanes(p.values[2].head_dim) > 1]


@pytest.mark.parametrize(("variant", "dtype", "case"), tiled_variants(ATTENTION_CASES + PREFILLS))
def test_tiled_kernel_matches_pytorch_sdpa(variant, dtype, case, tiled, monkeypatch, dispatch_trace_path):
    """Every case one lane a row (the variant without shuffles, the rule's lanes made 1), and
    with the rule's lanes (2 where D / 4 is even) where it gives more."""
    if variant == TILED[dtype, "none"]:
        monkeypatch.setattr(split_rule, "TILE_LANES", 1)
    check_attention(variant, dtype, case, dispatch_trace_path)


@pytest.mark.parametrize("lanes", [4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", PREFILLS, ids=lambda case: case.name)
def test_tiled_kernel_with_4_and_8_lanes(lanes, dtype, case, tiled, monkeypatch, dispatch_trace_path):
    """The seeded prefills with 4 and 8 lanes a row where the head dim and the device's
    subgroups allow them (the rule halves them otherwise), within the same tolerance."""
    monkeypatch.setattr(split_rule, "TILE_LANES", lanes)
    used = stub_support.attention_lanes(case.head_dim)
    assert 1 < used <= lanes
    check_attention(TILED[dtype, "shuffle"], dtype, case, dispatch_trace_path)


def test_prefills_cover_what_they_claim():
    """Head dims 80 and 128 among others, GQA groups 1, 4 and 8, rows that leave the last
    block partly filled (64 / lanes rows a block), no prefill from 0, unsorted positions and
    several tiles of keys (16 a tile at these head dims); with the examples, head dims that
    take 1 and 2 lanes a row, and among the prefills head dims that take 4 and 8 when allowed."""
    assert {80, 128} <= {c.head_dim for c in PREFILLS}
    assert {1, 4, 8} <= {c.heads // c.kv_heads for c in PREFILLS}
    assert all(len(c.positions) * c.heads // c.kv_heads % (64 // split_rule.attention_tile_lanes(c.head_dim, 32, True))
               for c in PREFILLS)
    assert {split_rule.attention_tile_lanes(c.head_dim, 32, True) for c in ATTENTION_CASES + PREFILLS} == {1, 2}
    assert {8} <= {math.gcd(c.head_dim // 4, 8) for c in PREFILLS}
    assert all(min(c.positions) > 0 for c in PREFILLS)
    assert any(list(c.positions) != sorted(c.positions) for c in PREFILLS)
    assert all(max(c.positions) >= 2 * split_rule.TILE_KEYS for c in PREFILLS)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_rule_tiles_many_tokens_and_splits_decode(dtype, dispatch_trace_path):
    """At the rule's own threshold: TILED_MIN_TOKENS tokens take the tiled kernel, one token
    (a decode step) the split kernel, as before, each within the tolerance."""
    tokens = split_rule.TILED_MIN_TOKENS
    prefill = AttentionCase("rule_prefill", 1, 2, 1, tokens + 8, 8, tuple(range(3, 3 + tokens)))
    decode = AttentionCase("rule_decode", 1, 2, 1, tokens + 8, 8, (tokens + 2,))
    assert tiled_of(prefill) and not tiled_of(decode)
    check_attention(tiled_variant(dtype, prefill), dtype, prefill, dispatch_trace_path)
    split_variant = next(info.name for info in runtime.get_op(ATTENTION).variants
                         if info.shader == "cache_attention" and info.axes["DTYPE"] == dtype)
    check_attention(split_variant, dtype, decode, dispatch_trace_path)


@pytest.mark.parametrize(("variant", "dtype", "case"), _variants(UPDATE, UPDATE_CASES))
def test_cache_update_is_a_bit_exact_index_copy(variant, dtype, case, dispatch_trace):
    cache, positions, value = update_inputs(case, DTYPES[dtype])
    before = cache.clone()
    want = ref.cache_update(cache, positions, value)
    bits = BITS[want.dtype]
    for s, p in enumerate(case.positions):  # the reference is the op's definition
        assert torch.equal(want[:, :, p].view(bits), value[:, s].view(bits))
    untouched = [p for p in range(case.cache_len) if p not in case.positions]
    assert torch.equal(want[:, :, untouched].view(bits), cache[:, :, untouched].view(bits))
    got = runtime.get_op(UPDATE)(cache, positions, value, variant=variant)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(bits), want.view(bits)), f"{variant} {case.name}: bits differ"
    assert torch.equal(cache.view(bits), before.view(bits)), "a host cache must not change"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


def assert_same_bits(got: tuple, want: tuple, what: str):
    for name, g, w in zip(("q_out", "k_cache", "v_cache"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} {name}: {g.dtype} {tuple(g.shape)}"
        assert torch.equal(g.view(BITS[g.dtype]), w.view(BITS[w.dtype])), f"{what} {name}: bits differ"


def unfused(args) -> tuple:
    """The ops rope_cache_update fuses, each its own dispatch on the device."""
    q, k_new, v_new, cos, sin, k_cache, v_cache, positions = args
    rope, update = runtime.get_op("etvk.rope.default"), runtime.get_op(UPDATE)
    return (rope(q, cos, sin), update(k_cache, positions, rope(k_new, cos, sin)),
            update(v_cache, positions, v_new))


@pytest.mark.parametrize(("variant", "dtype", "case"), _variants(ROPE_UPDATE, ROPE_UPDATE_CASES))
def test_rope_cache_update_is_rope_and_both_cache_writes(variant, dtype, case, dispatch_trace_path):
    """One dispatch (none without tokens), bit-identical to the reference and to the unfused
    ops; the host caches are left as they were."""
    args = rope_update_inputs(case, DTYPES[dtype])
    before = [t.clone() for t in args]
    want = ref.rope_cache_update(*args)
    bits = BITS[want[0].dtype]
    untouched = [p for p in range(case.cache_len) if p not in case.positions]
    for cache, old in ((want[1], args[5]), (want[2], args[6])):  # the rows no token writes
        assert torch.equal(cache[:, :, untouched].view(bits), old[:, :, untouched].view(bits))
    assert_same_bits(unfused(args), want, f"unfused {case.name}")
    found = []
    variants = dispatched(dispatch_trace_path,
                          lambda: found.append(runtime.get_op(ROPE_UPDATE)(*args, variant=variant)))
    assert_same_bits(found[0], want, f"{variant} {case.name}")
    assert variants == ([variant] if case.positions else []), variants
    for arg, old in zip(args, before, strict=True):
        assert torch.equal(arg.view(torch.uint8), old.view(torch.uint8)), "an argument changed"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rope_cache_update_writes_device_caches_in_place(dtype):
    args = rope_update_inputs(ROPE_UPDATE_BY_NAME["batch2_unordered_int32_shared_rows"], DTYPES[dtype])
    op = runtime.get_op(ROPE_UPDATE)
    assert op.opdef.aliases == ((1, "k_cache"), (2, "v_cache"))
    device = [Tensor.from_torch(t) for t in args]
    with Stream() as stream:
        got = op.record(stream, *device)
        stream.run()
    assert got[1] is device[5] and got[2] is device[6]
    assert_same_bits(tuple(t.to_torch() for t in got), ref.rope_cache_update(*args), "device caches")


def test_the_reference_is_within_tolerance_on_random_shapes():
    """60 random shapes (D up to 128, up to 600 keys, q and k amplitudes from 1/4 to 16, so
    scores into the hundreds), on the CPU: the bound holds with room (the fp32 part is
    measured below a tenth of itself)."""
    gen = torch.Generator().manual_seed(23)
    for _ in range(60):
        dim, cache_len, kv_heads, group, tokens = (
            int(torch.randint(low, high, (), generator=gen))
            for low, high in ((1, 33), (1, 600), (1, 4), (1, 5), (1, 5)))
        dim *= 4
        amplitude = float(torch.exp2(torch.rand((), generator=gen) * 6 - 2))
        q = torch.randn(1, tokens, kv_heads * group, dim, generator=gen) * amplitude
        k = torch.randn(1, kv_heads, cache_len, dim, generator=gen) * amplitude
        v = torch.randn(1, kv_heads, cache_len, dim, generator=gen)
        positions = torch.randint(0, cache_len, (tokens,), generator=gen)
        args = (q, k, v, positions, 1 / math.sqrt(dim))
        error = float((ref.cache_attention(*args).double() - ref.exact_attention(*args)).abs().max())
        assert error <= ref.attention_tolerance(*args) / 4, (tuple(q.shape), cache_len, amplitude)


def test_the_large_scores_case_overflows_an_unshifted_softmax():
    """Its scores pass fp32's exp range, so only a max-subtracted softmax gets it right."""
    case = ATTENTION_BY_NAME["large_scores"]
    q, k, _, positions, scale, _ = attention_inputs(case, torch.float32)
    scores = torch.einsum("bshd,bhld->bhsl", q, k[:, :, : max(case.positions) + 1].repeat_interleave(2, 1))
    assert float((scores * scale).max()) > 89.0  # exp(89) is inf in fp32


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_int32_and_int64_positions_and_device_tensors_agree(dtype):
    case = ATTENTION_BY_NAME["chunked_prefill_gaps_mqa_batch2"]
    q, k, v, positions, scale, _ = attention_inputs(case, DTYPES[dtype])
    op = runtime.get_op(ATTENTION)
    host = op(q, k, v, positions, scale)
    assert torch.equal(op(q, k, v, positions.to(torch.int32), scale), host)
    with Stream() as stream:
        device_args = [Tensor.from_torch(t) for t in (q, k, v, positions.to(torch.int32))]
        out = op.record(stream, *device_args, scale)
        stream.run()
        assert torch.equal(out.to_torch(), host)


@pytest.mark.parametrize("grain", [None, 4, "tiled"])
def test_device_positions_outside_the_cache_stay_inside_it(grain, small_grain, monkeypatch):
    """Device positions are not checked: one past the cache reads keys up to L - 1 (the row
    of position L - 1), a negative one no key (a NaN row, 0 / 0), split or not, and in the
    tiled kernel."""
    if grain == "tiled":
        monkeypatch.setattr(split_rule, "TILED_MIN_TOKENS", 1)
    elif grain is not None:
        small_grain(grain)
    case = ATTENTION_BY_NAME["prefill_from_zero_gqa3"]  # caches [1, 2, 40, 16]
    q, k, v, _, scale, _ = attention_inputs(case, torch.float32)
    k, v = sdpa_caches(case, torch.float32)  # every row filled: position L - 1 reads them all
    q = q[:, :3]
    op = runtime.get_op(ATTENTION)
    want = op(q, k, v, torch.tensor([0, 39, 5]), scale)
    with Stream() as stream:
        device_args = [Tensor.from_torch(t) for t in (q, k, v, torch.tensor([-1, 45, 5], dtype=torch.int32))]
        out = op.record(stream, *device_args, scale)
        stream.run()
        got = out.to_torch()
    assert bool(got[:, 0].isnan().all())
    assert torch.equal(got[:, 1:], want[:, 1:])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cache_update_writes_a_device_cache_in_place(dtype):
    cache, positions, value = update_inputs(UPDATE_BY_NAME["batch2_unordered_int32"], DTYPES[dtype])
    device_cache = Tensor.from_torch(cache)
    op = runtime.get_op(UPDATE)
    assert op.opdef.aliases == ((0, "cache"),)
    with Stream() as stream:
        out = op.record(stream, device_cache, positions, value)
        stream.run()
    assert out is device_cache
    bits = BITS[cache.dtype]
    assert torch.equal(device_cache.to_torch().view(bits), ref.cache_update(cache, positions, value).view(bits))


@pytest.mark.parametrize("grain", [None, 4])
def test_a_recorded_decode_step_replays_over_device_caches(grain, small_grain):
    """What a loaded program records once per decode step: both cache writes in place, then
    the attention over the updated caches, positions and new tokens as device inputs that
    each call overwrites. Replaying it token after token fills the caches as a loop of
    eager calls does, with the keys in one chunk (the rule, for this small cache) and split
    into chunks of 4 keys, the recorded split serving positions in the first to the third
    chunk."""
    if grain is not None:
        small_grain(grain)
    batch, heads, kv_heads, cache_len, dim = 1, 4, 2, 24, 8
    gen = torch.Generator().manual_seed(7)
    k_cache = Tensor.zeros((batch, kv_heads, cache_len, dim), torch.float32)
    v_cache = Tensor.zeros((batch, kv_heads, cache_len, dim), torch.float32)
    position = Tensor.empty((1,), torch.int32)
    q = Tensor.empty((batch, 1, heads, dim), torch.float32)
    k_new = Tensor.empty((batch, 1, kv_heads, dim), torch.float32)
    v_new = Tensor.empty((batch, 1, kv_heads, dim), torch.float32)
    update, attention = runtime.get_op(UPDATE), runtime.get_op(ATTENTION)
    host_k = torch.zeros(batch, kv_heads, cache_len, dim)
    host_v = torch.zeros(batch, kv_heads, cache_len, dim)
    with Stream() as stream:
        assert update.record(stream, k_cache, position, k_new) is k_cache
        assert update.record(stream, v_cache, position, v_new) is v_cache
        out = attention.record(stream, q, k_cache, v_cache, position, 0.25)
        for step in range(9):
            tokens = [torch.randn(shape, generator=gen) for shape in (q.shape, k_new.shape, v_new.shape)]
            for tensor, value in zip((q, k_new, v_new), tokens, strict=True):
                tensor.copy_from(value)
            position.copy_from(torch.tensor([step], dtype=torch.int32))
            stream.run() if step == 0 else stream.replay()
            pos = torch.tensor([step])
            host_k = update(host_k, pos, tokens[1])
            host_v = update(host_v, pos, tokens[2])
            assert torch.equal(k_cache.to_torch(), host_k)
            assert torch.equal(v_cache.to_torch(), host_v)
            assert torch.equal(out.to_torch(), attention(tokens[0], host_k, host_v, pos, 0.25))


def test_torch_ops_run_the_references():
    args = attention_inputs(ATTENTION_BY_NAME["prefill_from_zero_gqa3"], torch.float32)
    assert torch.equal(torch.ops.etvk.cache_attention.default(*args), ref.cache_attention(*args))
    cache, positions, value = update_inputs(UPDATE_BY_NAME["prefill_from_zero"], torch.float16)
    got = torch.ops.etvk.cache_update.default(cache, positions, value)
    assert torch.equal(got.view(torch.int16), ref.cache_update(cache, positions, value).view(torch.int16))


def _attention_args(**changes):
    q, k, v, positions, scale, window = attention_inputs(ATTENTION_BY_NAME["prefill_from_zero_gqa3"],
                                                         torch.float32)
    args = {"q": q, "k_cache": k, "v_cache": v, "positions": positions, "scale": scale, "window": window}
    return [changes.get(name, value) for name, value in args.items()]


def _update_args(**changes):
    cache, positions, value = update_inputs(UPDATE_BY_NAME["prefill_from_zero"], torch.float32)
    args = {"cache": cache, "positions": positions, "value": value}
    return [changes.get(name, value) for name, value in args.items()]


def _rope_update_args(**changes):
    names = ("q", "k_new", "v_new", "cos", "sin", "k_cache", "v_cache", "positions")
    args = rope_update_inputs(ROPE_UPDATE_BY_NAME["prefill_gqa3_partial_half"], torch.float32)
    return [changes.get(name, value) for name, value in zip(names, args, strict=True)]


ARGS = {ATTENTION: _attention_args, UPDATE: _update_args, ROPE_UPDATE: _rope_update_args}
# prefill_from_zero_gqa3: q [1, 8, 6, 16], caches [1, 2, 40, 16], positions 0..7.
# prefill_from_zero (update): cache [1, 2, 16, 16], value [1, 6, 2, 16], positions 0..5.
# prefill_gqa3_partial_half (rope_cache_update): q [1, 6, 6, 32], k_new and v_new
# [1, 6, 2, 32], cos and sin [1, 6, 16], caches [1, 2, 16, 32], positions 0..5.
BAD_ARGS = [
    (ATTENTION, "q", torch.zeros(1, 8, 6, 16, dtype=torch.int8), "float32 or float16 [B, S, Hq, D]"),
    (ATTENTION, "q", torch.zeros(8, 6, 16), "[B, S, Hq, D]"),
    (ATTENTION, "q", torch.zeros(1, 8, 6, 14), "multiple of 4"),
    (ATTENTION, "q", torch.zeros(1, 8, 5, 16), "multiple of k_cache's Hkv = 2"),
    (ATTENTION, "q", "q", "expected a tensor, got str"),
    (ATTENTION, "k_cache", torch.zeros(1, 2, 40, 16, dtype=torch.float16), "q's dtype"),
    (ATTENTION, "k_cache", torch.zeros(2, 2, 40, 16), "q's B = 1"),
    (ATTENTION, "k_cache", torch.zeros(1, 2, 40, 8), "D = 16"),
    (ATTENTION, "v_cache", torch.zeros(1, 2, 41, 16), "k_cache's dtype torch.float32 and shape"),
    (ATTENTION, "v_cache", torch.zeros(1, 2, 40, 16, dtype=torch.float16), "k_cache's dtype"),
    (ATTENTION, "positions", torch.arange(8.0), "int32 or int64 [S]"),
    (ATTENTION, "positions", torch.arange(7), "(S = 8)"),
    (ATTENTION, "positions", torch.arange(8).reshape(1, 8), "int32 or int64 [S]"),
    (ATTENTION, "positions", torch.arange(33, 41), "within [0, L = 40), got values from 33 to 40"),
    (ATTENTION, "positions", torch.arange(-1, 7), "got values from -1 to 6"),
    (ATTENTION, "scale", math.nan, "finite"),
    (ATTENTION, "scale", math.inf, "finite"),
    (ATTENTION, "window", -1, "0 (no sliding window) or a number of keys > 0"),
    (UPDATE, "cache", torch.zeros(1, 2, 16, 16, dtype=torch.int32), "float32 or float16"),
    (UPDATE, "cache", torch.zeros(1, 2, 16, 10), "D a positive multiple of 4"),
    (UPDATE, "cache", torch.zeros(2, 16, 16), "[B, Hkv, L, D]"),
    (UPDATE, "value", torch.zeros(1, 6, 2, 16, dtype=torch.float16), "cache's dtype torch.float32"),
    (UPDATE, "value", torch.zeros(1, 6, 3, 16), "Hkv = 2"),
    (UPDATE, "value", torch.zeros(1, 2, 6, 16), "Hkv = 2"),
    (UPDATE, "positions", torch.arange(5), "(S = 6)"),
    (UPDATE, "positions", torch.arange(6, dtype=torch.int16), "int32 or int64 [S]"),
    (UPDATE, "positions", torch.arange(11, 17), "within [0, L = 16), got values from 11 to 16"),
    (UPDATE, "positions", torch.arange(-3, 3), "got values from -3 to 2"),
    (UPDATE, "positions", torch.tensor([0, 1, 2, 2, 3, 4]), "must not repeat a position"),
    (ROPE_UPDATE, "q", torch.zeros(1, 6, 6, 30), "multiple of 4"),
    (ROPE_UPDATE, "k_cache", torch.zeros(1, 2, 16, 32, dtype=torch.float16), "q's dtype"),
    (ROPE_UPDATE, "k_new", torch.zeros(1, 6, 3, 32), "k_cache's Hkv = 2"),
    (ROPE_UPDATE, "k_new", torch.zeros(1, 5, 2, 32), "q's B, S, D = (1, 6, 32)"),
    (ROPE_UPDATE, "v_new", torch.zeros(1, 6, 2, 32, dtype=torch.float16), "k_new's dtype"),
    (ROPE_UPDATE, "cos", torch.zeros(2, 6, 16), "[B, S, R], [1, S, R] or [S, R]"),
    (ROPE_UPDATE, "cos", torch.zeros(1, 6, 16, dtype=torch.float16), "q's dtype"),
    (ROPE_UPDATE, "cos", torch.zeros(1, 6, 34), "0 < R <= D = 32"),
    (ROPE_UPDATE, "sin", torch.zeros(1, 6, 8), "cos's dtype torch.float32 and shape (1, 6, 16)"),
    (ROPE_UPDATE, "positions", torch.arange(11, 17), "within [0, L = 16)"),
    (ROPE_UPDATE, "positions", torch.tensor([0, 1, 2, 2, 3, 4]), "must not repeat a position"),
]


@pytest.mark.parametrize(("op_name", "arg", "value", "text"), BAD_ARGS,
                         ids=[f"{o.split('.')[1]}-{a}-{t}" for o, a, _, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(op_name, arg, value, text):
    op = runtime.get_op(op_name)
    args = ARGS[op_name](**{arg: value})
    assert_argument_error(op, args, arg, text)


def test_cases_cover_what_they_claim():
    """Decode and prefill, MHA / GQA / MQA, several tiles of keys, keys split into chunks by
    the rule (queries in one chunk, in two, in a partly filled third; GQA groups of 1 and
    more; several tokens), head dims past the workgroup, both position dtypes, and the empty
    cases stay in the tables."""
    tokens = {len(c.positions) for c in ATTENTION_CASES}
    assert {0, 1} <= tokens and max(tokens) > 1
    groups = {c.heads // c.kv_heads for c in ATTENTION_CASES}
    assert {1, 2, 3, 4} <= groups and any(c.kv_heads == 1 for c in ATTENTION_CASES)
    assert any(max(c.positions, default=0) >= 64 for c in ATTENTION_CASES)  # a second tile
    split = [c for c in ATTENTION_CASES if split_of(c).chunks > 1]
    assert {chunks_with_keys(c) for c in split} >= {2, 3}
    assert any(min(p // split_of(c).chunk_keys for p in c.positions) == 0 for c in split)
    assert any((p + 1) % split_of(c).chunk_keys for c in split for p in c.positions
               if p >= split_of(c).chunk_keys)  # a partly filled last chunk
    assert {c.heads // c.kv_heads for c in split} > {1} and any(len(c.positions) > 1 for c in split)
    assert any(c.head_dim // 4 > 64 for c in ATTENTION_CASES)  # two units per invocation
    assert any(c.batch > 1 for c in ATTENTION_CASES)
    assert any(c.positions and max(c.positions) == c.cache_len - 1 for c in ATTENTION_CASES)
    # sliding windows: within one chunk past the first, over several, wider than the position,
    # of one key; many tokens a call too (the tiled kernel's test forces it on every case)
    windowed = [c for c in ATTENTION_CASES if c.window]
    assert any(split_of(c).chunks > 1 and chunks_with_keys(c) == 1 and
               min(max(0, p - c.window + 1) for p in c.positions) >= split_of(c).chunk_keys for c in windowed)
    assert any(chunks_with_keys(c) >= 2 for c in windowed if split_of(c).chunks > 1)
    assert any(c.window > max(c.positions) for c in windowed) and any(c.window == 1 for c in windowed)
    assert any(len(c.positions) > 1 for c in windowed)
    for cases in (ATTENTION_CASES, UPDATE_CASES):
        assert {c.positions_dtype for c in cases} == {torch.int32, torch.int64}
    assert any(not c.positions for c in UPDATE_CASES)
    assert any(list(c.positions) != sorted(c.positions) for c in UPDATE_CASES)
    # the fused rope and cache write: GQA, MHA and MQA; partial rotary aligned (R % 8 == 0)
    # and not; every form of cos rows; batches; no tokens; both position dtypes
    assert {c.heads // c.kv_heads for c in ROPE_UPDATE_CASES} >= {1, 2, 3, 4}
    assert any(c.kv_heads == 1 for c in ROPE_UPDATE_CASES)
    assert {c.rotary % 8 == 0 for c in ROPE_UPDATE_CASES if c.rotary < c.head_dim} == {True, False}
    assert {c.cos_rows for c in ROPE_UPDATE_CASES} == {"batch", "one", "shared"}
    assert any(c.batch > 1 for c in ROPE_UPDATE_CASES) and any(not c.positions for c in ROPE_UPDATE_CASES)
    assert {c.positions_dtype for c in ROPE_UPDATE_CASES} == {torch.int32, torch.int64}


def test_the_examples_serve_every_tiled_variant():
    """The demo forces each variant on `runtime.tools.examples.EXAMPLES`' arguments: from every
    starting case the tiled variants without shuffles (one lane a row) and with them each get
    a case they serve, within the tolerance."""
    from runtime.tools.demo import max_error
    from runtime.tools.examples import EXAMPLES, tolerance
    from runtime.vulkan.device import get_device

    op = runtime.get_op(ATTENTION)
    build = EXAMPLES[ATTENTION]
    caps = get_device().caps
    tiled = [info for info in op.variants if "EXCHANGE" in info.axes and info.runnable(caps)[0]]
    assert {info.axes["EXCHANGE"] for info in tiled} >= {"none"}
    gen = torch.Generator().manual_seed(3)
    for start in range(len(ATTENTION_CASES)):
        for info in tiled:
            args, kwargs = build(info.axes, (1, start), gen)
            host = [a.to_torch() if isinstance(a, Tensor) else a for a in args]
            got = op(*args, **kwargs, variant=info.name)
            want = op.reference(*host, **kwargs)
            assert max_error(got, want) <= tolerance(ATTENTION, want, host), (start, info.name)
