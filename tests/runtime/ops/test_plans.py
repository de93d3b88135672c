"""Call plans (runtime/ops/plans.py): which ops may use them (codegen/plans.py), the key, and
that a replayed call gives the results, errors and dispatch trace of a recorded one."""

from __future__ import annotations

import pytest
import torch

import runtime
from runtime.ops import plans
from runtime.ops.plans import CallPlans, plan_key
from runtime.reference import quantize as ref
from runtime.vulkan.device import ConfigError, get_device
from runtime.vulkan.tensor import Tensor

QUANTIZE = "etvk.quantize_per_tensor.default"
ARGS = (0.05, 3, -128, 127, torch.int8)


@pytest.fixture
def call_plans(monkeypatch):
    """The device's plans for this test only (none from other tests)."""
    fresh = CallPlans()
    monkeypatch.setitem(plans._PLANS, get_device(), fresh)
    yield fresh
    for plan in fresh._plans.values():
        plan.close()


@pytest.mark.parametrize(("op", "plannable"), [
    (QUANTIZE, True),
    ("etvk.choose_qparams_per_token_asymmetric.default", True),
    ("etvk.quantize_per_token.default", False),  # checks read the scales' values
    ("etvk.linear_qta8a_qga4w_tiled.default", False),  # weight zeros' values, prepacked weights
    ("etvk.linear_qta8a_qga4w.default", False),  # a dispatcher
    ("etvk.q8ta_conv2d_pw.default", False),  # weight sums' values, measured choices
])
def test_codegen_marks_ops_whose_calls_follow_from_the_key(op, plannable):
    assert runtime.get_op(op).opdef.plannable is plannable


def test_repeated_calls_replay_one_plan_with_new_values(call_plans):
    op = runtime.get_op(QUANTIZE)
    gen = torch.Generator().manual_seed(1)
    results = []
    for _ in range(5):
        x = torch.randn(3, 40, generator=gen) * 4
        results.append((op(x, *ARGS), ref.quantize_per_tensor(x, *ARGS)))
    assert len(call_plans) == 1 and call_plans.hits == 4
    for got, want in results:  # each output its own tensor, none overwritten by a later call
        assert torch.equal(got, want)


def test_multiple_outputs_and_keyword_arguments(call_plans):
    op = runtime.get_op("etvk.choose_qparams_per_token_asymmetric.default")
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(5, 24, generator=gen)
        got = op(x, dtype=torch.int8)
        for g, w in zip(got, ref.choose_qparams_per_token_asymmetric(x, torch.int8), strict=True):
            assert torch.equal(g, w)
    assert call_plans.hits == 2
    (plan,) = call_plans._plans.values()
    assert [t.memory.placement for t in plan.outputs] == ["host", "host"]  # the host reads them


def test_another_key_records_and_checks_again(call_plans):
    op = runtime.get_op(QUANTIZE)
    x = torch.randn(64)
    op(x, *ARGS)
    with pytest.raises(runtime.ArgumentError, match="argument 'scale'"):
        op(x, -0.05, *ARGS[1:])
    with pytest.raises(runtime.ArgumentError, match="argument 'input'"):
        op(x.to(torch.int32), *ARGS)  # another dtype: its check runs, not the plan
    y = torch.randn(65)
    assert torch.equal(op(y, *ARGS), ref.quantize_per_tensor(y, *ARGS))
    assert len(call_plans) == 2 and call_plans.hits == 0


def test_keys():
    x, y = torch.zeros(4), torch.zeros(4)
    assert plan_key((x, 0.0), {}) == plan_key((y, 0.0), {})
    assert plan_key((x, 0.0), {}) != plan_key((x, -0.0), {})
    assert plan_key((x, 1), {}) != plan_key((x, True), {})
    assert plan_key((x, 1), {}) != plan_key((x, 1.0), {})
    assert plan_key((x, 1), {}) != plan_key((x,), {"scale": 1})  # positional or keyword
    assert plan_key((x, "a", "b"), {}) != plan_key((x, ["a", "b"]), {})
    assert plan_key((x,), {}) != plan_key((x.half(),), {})
    assert plan_key((x,), {}) != plan_key((torch.zeros(2, 2),), {})
    assert plan_key((x, [1, 2]), {"storage": None}) == plan_key((y, (1, 2)), {"storage": None})
    assert plan_key((x,), {"storage": "buffer"}) != plan_key((x,), {"storage": None})
    assert plan_key((x, x), {}) is None  # one tensor in two places
    assert plan_key((Tensor.from_torch(x),), {}) is None  # device tensors
    assert plan_key((x, object()), {}) is None
    assert plan_key((x, [y]), {}) is None  # a plan refreshes the arguments' own tensors only
    assert plan_key((torch.zeros(plans.MAX_PLAN_BYTES // 4 + 1),), {}) is None


def test_device_tensors_are_not_planned(call_plans):
    op = runtime.get_op(QUANTIZE)
    x = Tensor.from_torch(torch.randn(64))
    for _ in range(2):
        assert torch.equal(op(x, *ARGS), ref.quantize_per_tensor(x.to_torch(), *ARGS))
    assert len(call_plans) == 0


def test_a_replayed_call_is_traced(call_plans, dispatch_trace_path):
    op = runtime.get_op(QUANTIZE)
    op(torch.randn(64), *ARGS)
    before = dispatch_trace_path.read_text().count("\n")
    op(torch.randn(64), *ARGS)
    assert call_plans.hits == 1
    lines = dispatch_trace_path.read_text().splitlines()[before:]
    assert len(lines) == 1 and '"op": "etvk.quantize_per_tensor.default"' in lines[0]


def test_plans_are_bounded_and_can_be_switched_off(call_plans, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    op = runtime.get_op(QUANTIZE)
    for n in (10, 20, 30, 10):
        x = torch.randn(n)
        assert torch.equal(op(x, *ARGS), ref.quantize_per_tensor(x, *ARGS))
    assert len(call_plans) == 2 and call_plans.hits == 0  # 10 was evicted by 30
    call_plans.enabled = False
    op(torch.randn(30), *ARGS)
    assert call_plans.hits == 0
    assert plans.enabled(None) and plans.enabled("1") and not plans.enabled("0")
    with pytest.raises(ConfigError, match="ETVK_CALL_PLANS"):
        plans.enabled("yes")
