"""Real architectures: torchvision ResNet-18, ResNet-50, ResNeXt-50 (grouped convs), RegNetY-400MF
(grouped convs and sigmoid gates), MobileNetV2, ShuffleNetV2-x0.5, GoogLeNet (32x32), MnasNet-0.5 (48x48, so its mean pools a 2x2 map), SqueezeNet-1.1 (64x64: its global pool
reads a 3x3 map, where rounding ties are rare) and a DenseNet of torchvision's class with two blocks
of two layers (32x32) with random weights and batch-norm statistics measured on random inputs,
quantized with PT2E, and a Llama-style MLP with torchao's 8da4w linears: lowered (every residual add
of the CNNs into a conv's epilogue), saved, loaded, run, bit-exact against their CPU reference runs
and in agreement with PyTorch's (the DenseNet's logits equal to PyTorch's int8 graph's); DenseNet-121
at 32x32 likewise, one input, at least 30 dB from PyTorch's int8 graph; a dense block's concats
sharing their dispatches with the table ops that read them, after a transition with its window
sums too (where they have a multiple of 4 channels)."""

from __future__ import annotations

import pytest
import torch
from program_cases import check_agreement, random_batches, sqnr_db
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.ops.stub_support import affine_channels
from runtime.programs.nodes import Const, Ref
from runtime.tools.float64_products import Float64Products
from runtime.tools.models import (
    quantize_pt2e,
    torchvision_model,
    torchvision_package,
    with_batch_statistics,
)


def _small_densenet() -> nn.Module:
    """torchvision's DenseNet with two dense blocks of two layers (growth 8) and one transition:
    every pattern of DenseNet-121 (its batch norm and relu on the growing cats, the transition's
    average pool PT2E leaves in fp32) at a size a CPU driver runs quickly."""
    torchvision_package()
    from torchvision.models.densenet import DenseNet

    return DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2).eval()


# model -> its input size on the test device
SIZES = {"resnet18": 32, "resnet50": 32, "resnext50_32x4d": 32, "regnet_y_400mf": 32, "mobilenet_v2": 32,
         "mnasnet0_5": 48, "shufflenet_v2_x0_5": 32, "squeezenet1_1": 64, "googlenet": 32, "densenet": 32}
BUILDERS = {"densenet": _small_densenet}


@pytest.fixture(scope="module", params=list(SIZES))
def model_file(request, tmp_path_factory):
    """(name, input shape, exported program, lowered program, its file)."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torch.manual_seed(0)
    shape = (1, 3, SIZES[request.param], SIZES[request.param])
    build = BUILDERS.get(request.param, lambda: torchvision_model(request.param))
    model = with_batch_statistics(build(), random_batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program = runtime.lower(exported)
    path = tmp_path_factory.mktemp("models") / f"{request.param}.etvk"
    program.save(path)
    return request.param, shape, exported, program, path


def test_the_whole_model_runs_on_the_device_bit_exact(model_file):
    name, shape, exported, program, path = model_file
    loaded = runtime.load(path)
    rows = loaded.placement()
    convs = [r for r in rows if r["target"] == "etvk.q8ta_conv2d.default"]
    # two 1x1 convs on a 1x1 map, one q8ta_conv2d_pw_pair: RegNetY's 16 squeeze-and-excite
    # gates, MobileNetV2's last projection and the 1x1 conv after it (a 1x1 map at 32x32)
    pairs = [r for r in rows if r["target"] == "etvk.q8ta_conv2d_pw_pair.default"]
    assert len(pairs) == {"regnet_y_400mf": 16, "mobilenet_v2": 1}.get(name, 0)
    assert len(convs) == {"resnet18": 20, "resnet50": 53, "resnext50_32x4d": 53, "regnet_y_400mf": 85 - 2 * 16,
                          "mobilenet_v2": 52 - 2, "mnasnet0_5": 52,
                          "shufflenet_v2_x0_5": 56, "squeezenet1_1": 26, "googlenet": 57, "densenet": 10}[name]
    # every residual add runs in the epilogue of the conv that writes one of its operands
    assert not [r for r in rows if r["target"] == "etvk.q8ta_add.default"]
    residual_convs = [n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default"
                      and len(n.args) > 17 and n.args[17] is not None]
    assert len(residual_convs) == {"resnet18": 8, "resnet50": 16, "resnext50_32x4d": 16, "regnet_y_400mf": 16,
                                   "mobilenet_v2": 10, "mnasnet0_5": 10,
                                   "shufflenet_v2_x0_5": 0, "squeezenet1_1": 0, "googlenet": 0,
                                   "densenet": 0}[name]
    # int8 from the first quantize to the last dequantize: no CPU node anywhere
    assert rows[0]["target"] == "etvk.q8ta_quantize.default"
    assert rows[-1]["target"] == "etvk.dequantize_per_tensor.default"
    assert [r for r in rows if r["runs_on"] != "vulkan"] == []
    batches = random_batches(2, shape, seed=7)
    outputs = [loaded(x) for (x,) in batches]
    for (x,), got in zip(batches, outputs, strict=True):
        assert torch.equal(got, program.run_reference(x))
    assert not torch.equal(*outputs)  # the activations did not fade to one constant output


def test_agreement_with_pytorch(model_file, capsys):
    name, shape, exported, program, _ = model_file
    check_agreement(name, exported, program, random_batches(1, shape, seed=13)[0], capsys)
    if name == "densenet":  # the transition's pooled values through tables over their window sums
        targets = [n.target for n in program.nodes]
        assert targets.count("etvk.q8ta_window_sum.default") == 1
        assert "etvk.q8ta_avg_pool2d.default" not in targets  # no concat holds the pooled channels
        for (x,) in random_batches(4, shape, seed=21):
            assert torch.equal(program.run_reference(x), exported.module()(x))


def test_densenet121_agrees_with_pytorch(tmp_path):
    """DenseNet-121 at 32x32 (random weights, statistics and PT2E as above): its three transition
    pools through tables over their window sums (no q8ta_avg_pool2d: the block concats hold the
    layers' outputs alone), each table op over a concat (54 of 61, 48 with window sums) in the
    concat's dispatch, every table (58 over x, 54 over window sums) an integer affine map that the
    shaders compute instead of reading it, the device run bit-exact against the reference
    and at least 30 dB SQNR from PyTorch's int8 graph with its convs summed in float64 (its
    logits equal there; 14.4 dB when the pools were rounded to int8). PyTorch's graph as is
    sums them in the CPU kernel's fp32 order, which depends on the CPU: 28.2 dB from its own
    float64 run on an AMD EPYC, equal on the machine of session 27."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torch.manual_seed(0)
    shape = (1, 3, 32, 32)
    model = with_batch_statistics(torchvision_model("densenet121"), random_batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program = runtime.lower(exported)
    targets = [n.target for n in program.nodes]
    assert targets.count("etvk.q8ta_window_sum.default") == 3 and "etvk.q8ta_avg_pool2d.default" not in targets
    # each block after a transition: its first layer's table op reads the window sums alone
    assert len([n for n in program.nodes if n.target == "etvk.q8ta_channel_lut.default" and n.args[0] is None]) == 3
    # every table op that reads a concat shares its dispatch: 6 in block 1 and the first
    # transition, 48 with the window sums (blocks 2-4: 128, 256, 512 pooled channels)
    fused = [n for n in program.nodes if n.target == "etvk.q8ta_concat_channel_lut.default"]
    assert (len(fused), len([n for n in fused if len(n.args) > 9])) == (54, 48)
    assert not any(program.producers()[n.args[0].name].target == "etvk.q8ta_concat.default"
                   for n in program.nodes if n.target == "etvk.q8ta_channel_lut.default" and n.args[0] is not None)
    tables = [program.constants[a.name] for n in program.nodes
              if n.target in ("etvk.q8ta_channel_lut.default", "etvk.q8ta_concat_channel_lut.default")
              for a in n.args if isinstance(a, Const)]
    assert [t.shape[1] for t in tables].count(256) == 58 and [t.shape[1] for t in tables].count(1021) == 54
    assert all(affine_channels(t) is not None for t in tables)  # so the device run computes the maps
    program.save(tmp_path / "densenet121.etvk")
    loaded = runtime.load(tmp_path / "densenet121.etvk")
    assert [r for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    (x,) = random_batches(1, shape, seed=13)[0]
    got = loaded(x)
    assert torch.equal(got, program.run_reference(x))
    with Float64Products():
        theirs = exported.module()(x)
    assert sqnr_db(got, theirs) >= 30


class MLP(nn.Module):
    """Llama feed-forward: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim=64, hidden=128):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def test_llama_mlp_with_8da4w_linears(tmp_path):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    from torchao.quantization import Int8DynActInt4WeightQuantizer

    torch.manual_seed(0)
    model = Int8DynActInt4WeightQuantizer(groupsize=32).quantize(MLP()).eval()
    x = torch.randn(4, 64)
    program = runtime.lower(torch.export.export(model, (x,)))
    program.save(tmp_path / "mlp.etvk")
    loaded = runtime.load(tmp_path / "mlp.etvk")
    linears = [r for r in loaded.placement() if r["target"] == "etvk.linear_qta8a_qga4w.default"]
    assert len(linears) == 3 and all(r["runs_on"] == "vulkan" for r in linears)
    assert not [n for n in program.nodes if n.target in ("aten.to.dtype", "aten.linear.default")]
    # silu(w1 x) * w3 x, fused with the per-token quantization of w2's input
    assert [n.target for n in program.nodes].count("etvk.act_mul_quantize.default") == 1
    got = loaded(x)
    # act_mul's exp is within its stated tolerance of the reference, not bit-exact (docs/llm_ops.md)
    assert sqnr_db(got, program.run_reference(x)) >= 80
    want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_a_dense_blocks_tables_share_their_concats_dispatches(tmp_path):
    """torchvision's DenseNet with one dense block of three layers (no transition, so no window
    sums): each layer after the first reads the cat of the block's features through its batch
    norm and relu, which lower to a raw concat and a table op of it; each such pair becomes one
    q8ta_concat_channel_lut (whose concat the next layer's reads), so no concat feeds a table op,
    and the device run equals the reference bit for bit."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torchvision_package()
    from torchvision.models.densenet import DenseNet

    torch.manual_seed(0)
    shape = (2, 3, 24, 20)
    model = with_batch_statistics(DenseNet(growth_rate=6, block_config=(3,), num_init_features=10, bn_size=2).eval(),
                                  random_batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program = runtime.lower(exported)
    users = program.users()
    fused = [n for n in program.nodes if n.target == "etvk.q8ta_concat_channel_lut.default"]
    assert len(fused) == 2
    assert [n.args[0] for n in fused[1:]] == [Ref(fused[0].outputs[0])]  # the next layer's concat reads it
    for node in program.nodes:
        if node.target == "etvk.q8ta_concat.default":  # the head's: read by the mean alone
            assert [u.target for u in users[node.outputs[0]]] == ["etvk.q8ta_channel_lut_mean.default"]
    program.save(tmp_path / "dense_block.etvk")
    loaded = runtime.load(tmp_path / "dense_block.etvk")
    assert [r for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    for (x,) in random_batches(2, shape, seed=7):
        assert torch.equal(loaded(x), program.run_reference(x))


@pytest.mark.parametrize(("growth", "init", "fused_with_sums"), [(4, 8, 2), (3, 6, 0)],
                         ids=["sums_8_channels", "sums_6_channels"])
def test_tables_over_a_concat_and_window_sums_share_the_concats_dispatch(tmp_path, growth, init, fused_with_sums):
    """torchvision's DenseNet with two dense blocks (2 and 4 layers) and a transition: the second
    block's last two layers read the transition's pooled channels (window sums) and a concat of
    the block's layers, through one table op each; with (8 + 2 * 4) / 2 = 8 pooled channels both
    become q8ta_concat_channel_lut reading the sums (the second's concat reads the first's), and
    with (6 + 2 * 3) / 2 = 6 neither does (the fused op needs a multiple of 4), while block 1's
    second layer and the transition (tables over block 1's concat, no sums) fuse in both. The
    device run equals the reference bit for bit."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torchvision_package()
    from torchvision.models.densenet import DenseNet

    torch.manual_seed(0)
    shape = (2, 3, 24, 20)
    model = with_batch_statistics(DenseNet(growth_rate=growth, block_config=(2, 4), num_init_features=init,
                                           bn_size=2).eval(), random_batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program = runtime.lower(exported)
    fused = [n for n in program.nodes if n.target == "etvk.q8ta_concat_channel_lut.default"]
    with_sums = [n for n in fused if len(n.args) > 9]
    assert (len(fused), len(with_sums)) == (2 + fused_with_sums, fused_with_sums)
    sums = [n for n in program.nodes if n.target == "etvk.q8ta_window_sum.default"]
    assert len(sums) == 1
    for node in with_sums:
        assert node.args[9] == Ref(sums[0].outputs[0])
    if with_sums:
        assert with_sums[1].args[0] == Ref(with_sums[0].outputs[0])  # the next layer's concat reads it
    luts = [n for n in program.nodes if n.target == "etvk.q8ta_channel_lut.default"]
    # block 1's first layer, block 2's over the sums alone and over the sums and its first layer's
    # output (no concat), and the sums forms left unfused
    assert len(luts) == 3 + (2 - fused_with_sums), [n.name for n in luts]
    program.save(tmp_path / "dense_transition.etvk")
    loaded = runtime.load(tmp_path / "dense_transition.etvk")
    assert [r for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    for (x,) in random_batches(2, shape, seed=7):
        assert torch.equal(loaded(x), program.run_reference(x))
