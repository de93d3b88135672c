"""Lower, save, load, run: the small CNN end to end, bit-exact against its CPU reference run.

Covers lowering (the conv pattern, the quantize edges, placeholders), the
file round trip, placement with reasons, fallback when the device lacks a
variant, layouts per GPU family, the memory plan, calls from several
threads, bad inputs, and agreement with PyTorch's own run of the quantized
model (each int8 conv within one step, OPS.md).
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from program_cases import SHAPE, check_agreement, random_batches

import runtime
from runtime.families.conv2d_layouts import PLACEHOLDER
from runtime.ops.library import VariantInfo
from runtime.programs import loader
from runtime.programs.cpu import ProgramInputError
from runtime.programs.program import Program
from runtime.vulkan.device import GPU_FAMILIES, get_device


def targets(program) -> list[str]:
    return [n.target for n in program.nodes]


def test_lowering_fuses_convs_and_lowers_the_quantize_edges(small_cnn):
    _, exported, program = small_cnn
    assert targets(program).count("etvk.q8ta_conv2d.default") == 3
    assert "aten.conv2d.default" not in targets(program)
    assert not any(t.startswith("quantized_decomposed.") and "per_tensor" in t for t in targets(program))
    quantizes = [n for n in program.nodes if n.target == "etvk.q8ta_quantize.default"]
    assert quantizes and all(n.args[3] == PLACEHOLDER for n in quantizes)
    for conv in (n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default"):
        x, out = conv.args[0].name, conv.outputs[0]
        assert program.values[x].layout == program.values[out].layout == PLACEHOLDER
        weights, sums = (program.constants[conv.args[i].name] for i in (3, 4))
        assert torch.equal(sums, weights.to(torch.int32).sum((1, 2, 3), dtype=torch.int32))
    assert set(program.op_schemas) == {t for t in targets(program) if t.startswith("etvk.")}
    # The first conv reads the model input's quantize; relu is fused into it.
    first = next(n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default")
    assert first.args[-1] == "relu"
    assert exported.graph_signature.user_inputs == tuple(program.inputs)


def test_the_file_round_trips(small_cnn, small_cnn_file):
    program = small_cnn[2]
    again = Program.load(small_cnn_file)
    assert [dataclasses.astuple(n) for n in again.nodes] == [dataclasses.astuple(n) for n in program.nodes]
    assert again.values == program.values and again.inputs == program.inputs
    assert again.outputs == program.outputs and again.op_schemas == program.op_schemas
    assert again.constants.keys() == program.constants.keys()
    assert all(torch.equal(again.constants[k], v) for k, v in program.constants.items())


def test_loaded_program_is_bit_exact_against_the_reference(small_cnn_file):
    loaded = runtime.load(small_cnn_file)
    for (x,) in random_batches(3, seed=5):
        assert torch.equal(loaded(x), loaded.program.run_reference(x))


def test_placement_reports_every_node(small_cnn_file):
    loaded = runtime.load(small_cnn_file)
    rows = loaded.placement()
    assert [r["node"] for r in rows] == [n.name for n in loaded.program.nodes]
    for row in rows:
        assert row.keys() == {"node", "target", "runs_on", "op", "variant", "layout", "tuning", "reason"}
        if row["runs_on"] == "vulkan":
            assert row["variant"] and row["reason"] == "" and row["op"].startswith("etvk.")
        else:
            assert row["variant"] is None and row["reason"] == f"no generated op for {row['target']}"
    convs = [r for r in rows if r["target"] == "etvk.q8ta_conv2d.default"]
    assert convs and all(r["layout"] in ("4C", "4C1W", "4W4C") for r in convs)
    assert all(r["op"] != r["target"] for r in convs)  # the dispatcher names the op it routed to
    assert all(r["tuning"] == "rule" for r in convs)  # ETVK_TUNING=off (tests/conftest.py)
    # the small CNN is int8 from its first quantize to its last dequantize: all of it on the device
    assert {r["runs_on"] for r in rows} == {"vulkan"}


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_layouts_follow_the_family_and_results_do_not(family, small_cnn, monkeypatch):
    device = get_device()
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, family=family))
    loaded = runtime.LoadedProgram(small_cnn[2])
    packed = {spec.layout for spec in loaded.program.values.values() if spec.layout}
    assert packed and PLACEHOLDER not in packed
    (x,) = random_batches(1, seed=9)[0]
    assert torch.equal(loaded(x), small_cnn[2].run_reference(x))


def test_layouts_follow_the_devices_coop_gemms(small_cnn, monkeypatch):
    """The loader resolves layouts with the GEMM kernels its device runs on cooperative
    matrices, as the dispatcher chooses with them (`conv2d.choose_algorithm`)."""
    device = get_device()
    # capabilities of this test's own, so that the variants chosen while loading stay cached
    # under them (OpDef.select) rather than under the device's for the tests after this one
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps))
    calls = []
    real = loader.resolve_layouts
    monkeypatch.setattr(loader, "coop_gemm_kernels",
                        lambda caps: calls.append(caps) or frozenset({"pw", "im2col"}))
    monkeypatch.setattr(loader, "resolve_layouts",
                        lambda program, family, tuned, coop: calls.append(coop) or real(program, family, tuned, coop))
    runtime.LoadedProgram(small_cnn[2], device)
    assert calls == [device.caps, frozenset({"pw", "im2col"})]


def test_a_node_without_a_runnable_variant_falls_back_to_the_cpu(small_cnn, monkeypatch):
    real = VariantInfo.runnable

    def no_gemm(self, caps):
        return (False, "this test's device lacks q8ta_gemm") if self.shader == "q8ta_gemm" else real(self, caps)

    monkeypatch.setattr(VariantInfo, "runnable", no_gemm)
    lines = []
    loaded = runtime.LoadedProgram(small_cnn[2], progress=lines.append)
    moved = [r for r in loaded.placement() if r["target"] == "etvk.q8ta_conv2d.default" and r["runs_on"] == "cpu"]
    assert moved and all("this test's device lacks q8ta_gemm" in r["reason"] for r in moved)
    assert any("runs on the CPU" in line for line in lines)
    (x,) = random_batches(1, seed=3)[0]
    assert torch.equal(loaded(x), small_cnn[2].run_reference(x))


def test_memory_plan_shares_intermediates(small_cnn_file):
    plan = runtime.load(small_cnn_file).memory_plan()
    assert plan["tensors"] > plan["buffers"] > 0
    assert plan["peak_bytes"] <= plan["planned_bytes"] < plan["unshared_bytes"]


def test_calls_from_several_threads_give_the_same_results(small_cnn_file):
    loaded = runtime.load(small_cnn_file)
    inputs = [x for (x,) in random_batches(6, seed=11)]
    want = [loaded.program.run_reference(x) for x in inputs]
    got = [[] for _ in range(3)]

    def work(index):
        for x in inputs:
            got[index].append(loaded(x))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(a, b) for results in got for a, b in zip(results, want, strict=True))


def test_bad_inputs_name_the_input(small_cnn_file):
    loaded = runtime.load(small_cnn_file)
    with pytest.raises(ProgramInputError, match=r"input 0 \('x'\) must be torch.float32 of shape "
                                                r"\[1, 3, 16, 16\], got torch.float32 of shape \[2, 3, 16, 16\]"):
        loaded(torch.zeros(2, 3, 16, 16))
    with pytest.raises(ProgramInputError, match="takes 1 input"):
        loaded()


def test_profile_times_every_device_node(small_cnn_file):
    loaded = runtime.load(small_cnn_file)
    rows = loaded.profile(torch.randn(SHAPE))
    assert len(rows) == len(loaded.program.nodes)
    device_rows = [r for r in rows if r["runs_on"] == "vulkan"]
    if get_device().caps.timestamps:
        assert all(r["seconds"] is not None and r["seconds"] >= 0 for r in device_rows)
    assert all(r["seconds"] >= 0 for r in rows if r["runs_on"] == "cpu")


def test_agreement_with_pytorchs_own_run(small_cnn, capsys):
    model, exported, program = small_cnn
    check_agreement("small CNN", exported, program, random_batches(1, seed=21)[0], capsys)


class _DynamicQuant(torch.nn.Module):
    """quantized_decomposed per-token dynamic quantization, as 8da4w graphs spell it."""

    def forward(self, x):
        qd = torch.ops.quantized_decomposed
        scales, zero_points = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
        q = qd.quantize_per_token(x, scales, zero_points, -128, 127, torch.int8)
        return qd.dequantize_per_token(q, scales, zero_points, -128, 127, torch.int8, torch.float32)


@pytest.mark.parametrize(("k", "fused"), [(64, True), (6, False)])
def test_choose_qparams_and_quantize_per_token_fuse_when_tokens_fill_units(k, fused, tmp_path):
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    x = torch.randn(5, k) * 4
    program = runtime.lower(torch.export.export(_DynamicQuant(), (x,)))
    targets = [n.target for n in program.nodes]
    assert ("etvk.quantize_per_token_dynamic.default" in targets) == fused, targets
    assert ("etvk.choose_qparams_per_token_asymmetric.default" in targets) != fused, targets
    program.save(tmp_path / "dq.etvk")
    loaded = runtime.load(tmp_path / "dq.etvk")
    assert all(r["runs_on"] == "vulkan" for r in loaded.placement())
    got = loaded(x)
    assert torch.equal(got, program.run_reference(x))
    assert torch.equal(got, _DynamicQuant()(x))


class _AffineDynamicQuant(torch.nn.Module):
    """torchao's per-token dynamic quantization with the arguments 8da4w exports give
    choose_qparams_affine (`changes` replace some); returns q, the scales and the zero points
    both cast to int32 (the fused linears' cast) and as chosen."""

    def __init__(self, k: int, **changes):
        super().__init__()
        self.choose = dict(mapping_type="ASYMMETRIC", block_size=[1, 1, k], target_dtype=torch.int8,
                           quant_min=-128, quant_max=127, eps=torch.finfo(torch.float32).eps,
                           scale_dtype=torch.float32, zero_point_dtype=torch.float32) | changes

    def forward(self, x):
        c = self.choose
        scales, zero_points = torch.ops.torchao.choose_qparams_affine(x, **c)
        q = torch.ops.torchao.quantize_affine(x, c["block_size"], scales, zero_points, torch.int8,
                                              c["quant_min"], c["quant_max"])
        return q, scales, zero_points.to(torch.int32), zero_points


AFFINE_CASES = {  # name -> (K, changes, whether the pair becomes the etvk op)
    "as exported": (64, {}, True),
    "int32 zero points": (64, {"zero_point_dtype": torch.int32}, True),
    "K not a multiple of 4": (6, {}, False),
    "symmetric": (64, {"mapping_type": "SYMMETRIC"}, False),
    "default eps (fp32's smallest normal)": (64, {"eps": None}, False),
    "groups of 32": (64, {"block_size": [1, 1, 32]}, False),
    "narrower range": (64, {"quant_min": -127}, False),
}


@pytest.mark.parametrize("case", AFFINE_CASES)
def test_torchao_per_token_dynamic_quantization_runs_on_the_device(case, tmp_path):
    """choose_qparams_affine + quantize_affine become quantize_affine_per_token_dynamic where
    they are its contract (the rest stays torchao's on the CPU); either way bit-exact."""
    pytest.importorskip("torchao", reason="torchao's quantize ops need torchao")
    k, changes, fused = AFFINE_CASES[case]
    module = _AffineDynamicQuant(k, **changes)
    x = torch.randn(2, 5, k, generator=torch.Generator().manual_seed(31)) * 4
    x[0, 0] = 0.0  # a token of zeros: the scale is eps
    program = runtime.lower(torch.export.export(module, (x,)))
    found = [n.target for n in program.nodes]
    torchao = [t for t in found if t.startswith("torchao.")]
    assert (torchao == []) == fused and ("etvk.quantize_affine_per_token_dynamic.default" in found) == fused, found
    program.save(tmp_path / "dq.etvk")
    loaded = runtime.load(tmp_path / "dq.etvk")
    if fused:  # the int32 cast reads the op's zero points; one exact cast back gives the fp32 ones
        assert found.count("aten._to_copy.default") == (changes.get("zero_point_dtype") != torch.int32), found
        placed = {r["target"]: r["runs_on"] for r in loaded.placement()}
        assert placed["etvk.quantize_affine_per_token_dynamic.default"] == "vulkan", placed
    got = loaded(x)
    for g, r, w in zip(got, program.run_reference(x), module(x), strict=True):
        assert g.dtype == w.dtype and torch.equal(g, r) and torch.equal(g, w), case
