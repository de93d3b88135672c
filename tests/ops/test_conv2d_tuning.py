"""Tuning never changes results: every candidate the conv tuner may choose gives the reference's output.

For each shape, every algorithm the tuner times (runtime/families/conv2d_tuning.py)
runs with its rule settings in every packed input layout, and with each of its
candidate settings (layouts in turn, so every setting and every layout runs);
each output must equal the PyTorch reference bit for bit, hence each other. The
dispatch trace shows each candidate's settings reached its last dispatch.
"""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from runtime.families.conv2d import conv2d_params
from runtime.families.conv2d_tiling import gemm_tiling
from runtime.families.conv2d_tuning import (
    COOP_ALGORITHMS,
    Conv2dChoice,
    candidate_algorithms,
    candidate_settings,
)
from runtime.ops import stub_support
from runtime.ops.library import catalog
from runtime.tools import tuner
from runtime.tools.tuner import conv_inputs, run_choice
from runtime.vulkan.device import get_device
from runtime.vulkan.layouts import PACKED_LAYOUTS

# name: (x shape, weight shape, stride, padding, dilation, groups)
SHAPES = {
    "3x3_c8_w7": ((1, 8, 6, 7), (12, 8, 3, 3), 1, 1, 1, 1),
    "1x1_c16_w5_batch2": ((2, 16, 3, 5), (8, 16, 1, 1), 1, 0, 1, 1),
    "dw_3x3s2_c12": ((1, 12, 7, 9), (12, 1, 3, 3), 2, 1, 1, 12),
    "grouped_g2_cg8": ((1, 16, 5, 6), (8, 8, 3, 3), 1, 1, 1, 2),
    # a stem: 3 channels, one group, so im2col (and im2col_coop) are candidates too
    "stem_7x7s2_c3": ((1, 3, 13, 11), (8, 3, 7, 7), 2, 3, 1, 1),
}


def runnable_algorithms(p) -> list[str]:
    """The candidate algorithms this device runs (the coop ones need cooperative matrices)."""
    coop = catalog().variant("q8ta_gemm_coop_k64_w4").runnable(get_device().caps)[0]
    return [a for a in candidate_algorithms(p) if coop or a not in COOP_ALGORITHMS]


def candidates(p) -> list[Conv2dChoice]:
    found = []
    for algorithm in runnable_algorithms(p):
        found += [Conv2dChoice(algorithm, layout) for layout in PACKED_LAYOUTS]
        found += [Conv2dChoice(algorithm, PACKED_LAYOUTS[i % len(PACKED_LAYOUTS)], settings)
                  for i, settings in enumerate(candidate_settings(algorithm))]
    return found


def dispatches_since(trace, start: int) -> list[dict]:
    with trace.open("rb") as f:
        f.seek(start)
        return [json.loads(line) for line in f.read().decode().splitlines()]


def settings_reached(choice: Conv2dChoice, p, dispatches: list[dict]) -> bool:
    """Whether the dispatches of `choice` ran with its settings (the rule's when it has none):
    the coop GEMM's chunk (its variant) and K ranges (workgroups along z), or the last
    dispatch's workgroups (or invocations, whose count follows OUT_W)."""
    s = dict(choice.settings)
    dispatch = dispatches[-1]
    if choice.algorithm in COOP_ALGORITHMS:
        gemm = next(d for d in dispatches if d["variant"].startswith("q8ta_gemm_coop_"))
        return not s or (f"_k{s['chunk']}_" in gemm["variant"] and gemm["groups"][2] == s["k_splits"])
    if choice.algorithm in ("pw", "im2col"):
        padded = choice.algorithm == "im2col" or choice.layout == "4W4C"
        w = -(-(p.W_out if choice.algorithm == "im2col" else p.W) // 4) * 4 if padded else p.W
        h = p.H_out if choice.algorithm == "im2col" else p.H
        return not s or dispatch["groups"] == gemm_tiling(p.N * h * w, 1, p.C_out, s).groups
    # general and dw: one invocation per width group, row, channel word and batch entry
    return dispatch["global"][0] == -(-p.W_out // s.get("out_w", 4)) * p.H_out * p.N * -(-p.C_out // 4)


@pytest.mark.parametrize("name", SHAPES)
def test_every_tuning_candidate_gives_the_reference(name, dispatch_trace_path):
    x_shape, w_shape, stride, padding, dilation, groups = SHAPES[name]
    p = conv2d_params(x_shape, w_shape, [w_shape[2], w_shape[3]], [stride], [padding], [dilation], groups)
    args = conv_inputs(p, seed=len(name))
    want = runtime.get_op("etvk.q8ta_conv2d.default").reference(*args)
    choices = candidates(p)
    assert {c.algorithm for c in choices} == set(runnable_algorithms(p)) and len(choices) > 9
    wrong, unset = [], []
    for choice in choices:
        start = dispatch_trace_path.stat().st_size if dispatch_trace_path.exists() else 0
        if not torch.equal(run_choice(choice, args), want):
            wrong.append(choice.label)
        if not settings_reached(choice, p, dispatches_since(dispatch_trace_path, start)):
            unset.append(choice.label)
    assert not wrong, f"{len(wrong)} of {len(choices)} candidates differ from the reference: {wrong}"
    assert not unset, f"these candidates ran without their settings: {unset}"


@pytest.mark.parametrize("route", [None, "general"])
def test_the_tuners_rule_is_what_the_dispatcher_runs_unmeasured(route, monkeypatch):
    """The report's rule is the dispatcher's route with nothing measured (the coop GEMM where it
    moves there, not the family rule alone): here that route as it is, and made to be general
    for a 1x1 conv whose family rule is pw."""
    x_shape, w_shape, stride, padding, dilation, groups = SHAPES["1x1_c16_w5_batch2"]
    p = conv2d_params(x_shape, w_shape, [1, 1], [stride], [padding], [dilation], groups)
    if route:
        monkeypatch.setattr(tuner, "rule_algorithm", lambda params: route)
    expected = route or stub_support.rule_algorithm(p)
    result = tuner.tune_shape(p, tuner.Timing(repeats=1, warmup=0.001, shape_warmup=0.01))
    layout = "4C1W" if expected == "general" else "4C"
    assert (result.rule.algorithm, result.rule.layout, result.rule.settings) == (expected, layout, ())
