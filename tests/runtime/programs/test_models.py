"""Real architectures: torchvision ResNet-18, ResNet-50, MobileNetV2 and MnasNet-0.5 (random weights,
32x32 on the test device) quantized with PT2E, and a Llama-style MLP with torchao's 8da4w linears:
lowered, saved, loaded, run, bit-exact against their CPU reference runs and in agreement with
PyTorch's."""

from __future__ import annotations

import pytest
import torch
from program_cases import check_agreement, random_batches
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.tools.models import quantize_pt2e, torchvision_model

SHAPE = (1, 3, 32, 32)


@pytest.fixture(scope="module", params=["resnet18", "resnet50", "mobilenet_v2", "mnasnet0_5"])
def model_file(request, tmp_path_factory):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torch.manual_seed(0)
    exported = quantize_pt2e(torchvision_model(request.param), random_batches(1, SHAPE)[0],
                             random_batches(2, SHAPE, seed=1))
    program = runtime.lower(exported)
    path = tmp_path_factory.mktemp("models") / f"{request.param}.etvk"
    program.save(path)
    return request.param, exported, program, path


def test_the_whole_model_runs_on_the_device_bit_exact(model_file):
    name, exported, program, path = model_file
    loaded = runtime.load(path)
    rows = loaded.placement()
    convs = [r for r in rows if r["target"] == "etvk.q8ta_conv2d.default"]
    assert len(convs) == {"resnet18": 20, "resnet50": 53, "mobilenet_v2": 52, "mnasnet0_5": 52}[name]
    # int8 from the first quantize to the last dequantize: no CPU node anywhere
    assert rows[0]["target"] == "etvk.q8ta_quantize.default"
    assert rows[-1]["target"] == "etvk.dequantize_per_tensor.default"
    assert [r for r in rows if r["runs_on"] != "vulkan"] == []
    for (x,) in random_batches(2, SHAPE, seed=7):
        assert torch.equal(loaded(x), program.run_reference(x))


def test_agreement_with_pytorch(model_file, capsys):
    name, exported, program, _ = model_file
    check_agreement(name, exported, program, random_batches(1, SHAPE, seed=13)[0], capsys)


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
    got = loaded(x)
    assert torch.equal(got, program.run_reference(x))
    want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
