"""The pools of torchvision's classifier heads and stems in PT2E-quantized models: VGG's and
AlexNet's ``adaptive_avg_pool2d`` to a map larger than 1x1 (before a flatten and a linear) and
GoogLeNet's ``max_pool2d(ceil_mode=True)`` between convs. Each lowers to its int8 op (no CPU
node for the pool), runs bit-exact against the program's CPU reference and agrees with PyTorch."""

from __future__ import annotations

import pytest
import torch
from program_cases import check_agreement, fx_values, int8_agreement, random_batches
from torch import nn

import runtime
from runtime.families.pool2d import adaptive_windows
from runtime.tools.models import quantize_pt2e


class AdaptiveHead(nn.Module):
    """conv -> relu -> adaptive_avg_pool2d(size) -> flatten -> linear."""

    def __init__(self, size):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(size)
        out_h, out_w = (size, size) if isinstance(size, int) else size
        self.fc = nn.Linear(8 * out_h * out_w, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


class CeilMaxPool(nn.Module):
    """conv -> relu -> max_pool2d(kernel, stride, padding, ceil_mode=True) -> conv."""

    def __init__(self, kernel, stride, padding):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(kernel, stride, padding, ceil_mode=True)
        self.conv2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv2(self.pool(torch.relu(self.conv1(x))))


# (name, model, input H and W, pool target, its output H and W)
CASES = [
    ("adaptive7_of_12", lambda: AdaptiveHead(7), 12, "q8ta_adaptive_avg_pool2d", (7, 7)),
    ("adaptive7_of_5", lambda: AdaptiveHead(7), 5, "q8ta_adaptive_avg_pool2d", (7, 7)),  # windows overlap
    ("adaptive6x3_of_13", lambda: AdaptiveHead((6, 3)), 13, "q8ta_adaptive_avg_pool2d", (6, 3)),
    # GoogLeNet's stem pool: the last window sticks out past the edge, clipped
    ("ceil_3s2_of_10", lambda: CeilMaxPool(3, 2, 0), 10, "q8ta_max_pool2d", (5, 5)),
    # ceil_mode's last window would start in the right padding: dropped
    ("ceil_2s2p1_of_5", lambda: CeilMaxPool(2, 2, 1), 5, "q8ta_max_pool2d", (3, 3)),
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, tmp_path_factory):
    """(name, input shape, exported program, lowered program, its file, pool target, pool size)."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    name, build, hw, target, size = request.param
    torch.manual_seed(0)
    shape = (1, 3, hw, hw)
    exported = quantize_pt2e(build(), random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program = runtime.lower(exported)
    path = tmp_path_factory.mktemp("pools") / f"{name}.etvk"
    program.save(path)
    return name, shape, exported, program, path, target, size


def test_the_pool_lowers_and_runs_bit_exact(case):
    name, shape, _, program, path, target, size = case
    pools = [n for n in program.nodes if n.target == f"etvk.{target}.default"]
    assert len(pools) == 1 and program.values[pools[0].outputs[0]].shape[2:] == size
    loaded = runtime.load(path)
    rows = loaded.placement()
    assert not [r for r in rows if "pool" in r["target"] and r["runs_on"] != "vulkan"], rows
    for (x,) in random_batches(2, shape, seed=7):
        assert torch.equal(loaded(x), program.run_reference(x))


def _adaptive_ties(exported, program, inputs) -> None:
    """Teacher forcing on the adaptive pool: fed PyTorch's int8 input, it is at most one step from
    PyTorch's int8 output, and apart only where the exact average is within 1e-5 of a rounding tie
    (PyTorch's fp32 sum is not exact; PT2E's shared qparams make ties common, as in
    tests/ops/test_q8ta_pool.py)."""
    env = fx_values(exported, inputs)
    pool = next(n for n in program.nodes if n.target == "etvk.q8ta_adaptive_avg_pool2d.default")
    x, scale, zero_point, out_scale, out_zero_point, size = env[pool.args[0].name], *pool.args[1:]
    got = runtime.get_op(pool.target).reference(x, scale, zero_point, out_scale, out_zero_point, size)
    steps = (got.int() - env[pool.outputs[0]].int()).abs()
    assert steps.max() <= 1
    (ya, yb), (xa, xb) = adaptive_windows(x.shape[2], size[0]), adaptive_windows(x.shape[3], size[-1])
    exact = torch.stack([torch.stack([(x[:, :, ya[i]:yb[i], xa[j]:xb[j]].double() - zero_point).mean((2, 3))
                                      for j in range(len(xa))], -1) for i in range(len(ya))], -2)
    exact = exact * scale / out_scale
    tie_distance = ((exact - exact.floor()) - 0.5).abs()
    assert bool((tie_distance[steps == 1] < 1e-5).all()), "a difference away from a tie"


def test_agreement_with_pytorch(case, capsys):
    """The model's other ops are held to check_agreement's 99 % exact; the adaptive pool to
    `_adaptive_ties` (its 2x2 and 2x3 windows on PT2E's shared qparams tie more often)."""
    name, shape, exported, program, _, target, _ = case
    inputs = random_batches(1, shape, seed=13)[0]
    if target == "q8ta_adaptive_avg_pool2d":
        _adaptive_ties(exported, program, inputs)
        found = int8_agreement(exported, program, inputs)
        for op, (total, exact, worst) in found.items():
            assert worst <= 1 and (exact / total >= 0.99 or op == f"etvk.{target}.default"), op
    else:
        check_agreement(name, exported, program, inputs, capsys)
