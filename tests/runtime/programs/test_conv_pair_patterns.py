"""Two pointwise convs on a 1x1 map in one dispatch (runtime/programs/lower_conv_pair.py): a tiny
PT2E-quantized net with torchvision's SqueezeExcitation gate (relu -> sigmoid as MobileNetV3 and
RegNetY have it, silu -> hardsigmoid) lowers its gate's two convs into one q8ta_conv2d_pw_pair,
tables and conv activation included, runs on the device bit-exact against the reference and
gives the values of the program lowered without the pairing; near misses, and a first conv past
the pair's channel limit, stay two convs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import Int8Convs, check_device_runs, dq, lower_and_save, q, random_batches
from torch import nn

import runtime
from runtime.programs import lower_conv_pair
from runtime.programs.rewrite import bind

CONV, PAIR = "etvk.q8ta_conv2d.default", "etvk.q8ta_conv2d_pw_pair.default"
SHAPE = (2, 3, 12, 12)


class GatedNet(nn.Module):
    """conv 3x3 -> silu -> SqueezeExcitation (its two 1x1 convs on the pooled 1x1 map) -> 1x1 conv."""

    def __init__(self, activation, gate):
        super().__init__()
        from runtime.tools.models import torchvision_package

        torchvision_package()
        from torchvision.ops.misc import SqueezeExcitation

        self.stem = nn.Conv2d(3, 24, 3, padding=1)
        self.se = SqueezeExcitation(24, 6, activation=activation, scale_activation=gate)
        self.head = nn.Conv2d(24, 10, 1)

    def forward(self, x):
        return self.head(self.se(nn.functional.silu(self.stem(x))))


def _lower_unpaired(exported):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lower_conv_pair, "pair_pointwise_convs", lambda rw: None)
        return runtime.lower(exported)


@pytest.mark.parametrize(("activation", "gate"), [(nn.ReLU, nn.Sigmoid), (nn.SiLU, nn.Hardsigmoid)],
                         ids=["relu-sigmoid", "silu-hardsigmoid"])
def test_squeeze_and_excite_gate_runs_as_one_pair(activation, gate, tmp_path):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    from runtime.tools.models import quantize_pt2e

    torch.manual_seed(0)
    model = GatedNet(activation, gate).eval()
    exported = quantize_pt2e(model, random_batches(1, SHAPE)[0], random_batches(2, SHAPE, seed=1))
    program, unpaired = runtime.lower(exported), _lower_unpaired(exported)
    targets = Counter(n.target for n in program.nodes)
    assert (targets[PAIR], targets[CONV]) == (1, 2)  # the stem and the head stay convs
    assert Counter(n.target for n in unpaired.nodes)[CONV] == 4
    (pair,) = [bind(n) for n in program.nodes if n.target == PAIR]
    # relu is the first conv's activation, silu its table; the gate is the second's table
    assert (pair["activation"], pair["lut"] is None) == (("relu", True) if activation is nn.ReLU else ("none", False))
    assert (pair["activation2"], pair["lut2"] is None) == ("none", False)
    path = tmp_path / "gated.etvk"
    program.save(path)
    check_device_runs(path, program, lambda seed: random_batches(1, SHAPE, seed=seed)[0])
    for (x,) in random_batches(2, SHAPE, seed=5):
        assert torch.equal(program.run_reference(x), unpaired.run_reference(x))


class NearMisses(Int8Convs):
    """Pointwise convs on 1x1 maps that must stay apart: the first's output also an output; a
    3x3 kernel (padding 1) on the 1x1 map; then a chain of three, of which one pair forms."""

    def __init__(self):
        super().__init__(seed=11)

    def forward(self, x):
        qx = q(x, 0.05, 3)
        a = q(self.conv(dq(qx, 0.05, 3), "w1"), 0.06, -2)  # also an output: no pair
        b = q(self.conv(dq(a, 0.06, -2), "w1"), 0.07, 1)
        c = q(self.conv(dq(b, 0.07, 1), "w3", padding=1), 0.05, 0)  # 3x3: no pair with b
        d = q(self.conv(dq(c, 0.05, 0), "w1"), 0.04, 2)
        e = q(self.conv(dq(d, 0.04, 2), "w1"), 0.03, -1)  # d, e pair
        f = q(self.conv(dq(e, 0.03, -1), "w1"), 0.05, 4)  # e is the pair's output: f stays
        return dq(a, 0.06, -2), dq(f, 0.05, 4)


def test_near_misses_stay_convs(tmp_path):
    def inputs(seed):
        return (torch.randn(3, 6, 1, 1, generator=torch.Generator().manual_seed(seed)) * 2,)

    exported, program, path = lower_and_save(NearMisses(), inputs(0), tmp_path)
    targets = Counter(n.target for n in program.nodes)
    assert (targets[PAIR], targets[CONV]) == (1, 4)
    check_device_runs(path, program, inputs)


def test_a_first_conv_past_the_pair_limit_stays_convs(tmp_path, monkeypatch):
    """A first conv with more output channels than the pair keeps in shared memory pairs with
    nothing (the limit lowered to 5 for NearMisses' 6-channel convs)."""
    monkeypatch.setattr(lower_conv_pair, "PW_PAIR_MAX_MID_CHANNELS", 5)
    exported, program, path = lower_and_save(NearMisses(), (torch.randn(3, 6, 1, 1),), tmp_path)
    targets = Counter(n.target for n in program.nodes)
    assert (targets[PAIR], targets[CONV]) == (0, 6)
