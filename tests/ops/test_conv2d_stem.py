"""Stem convs (few input channels, one group) on the im2col GEMMs: channel padding.

A conv of one group whose C_in is not a multiple of 4 runs on im2col (the im2col
scratch and q8ta_gemm) and on the implicit im2col of the cooperative-matrix GEMM: each
tap's K words are its ceil(C_in / 4) channel words of the packed input, the padding
channels multiplied by zero weights (docs/int8_cnn_ops.md "Channel padding"). Checked
here, bit-exact against the reference: C_in 1, 2, 3, 5, 6, 7 at ResNet's 7x7 stride 2
pad 3 and MobileNetV2's 3x3 stride 2 pad 1, every im2col variant and every activation;
inputs whose padding channels hold junk, in every layout; the dispatcher's route for a
stem. The cooperative-matrix cases run where the device has int8 cooperative matrices
and are skipped with the reason elsewhere (lavapipe); test_conv2d_coop.py adds a stem to
its K-split, layout, residual and table tests.
"""

from __future__ import annotations

import json

import pytest
import torch
from conv_testlib import MIN_EXACT, assert_bit_exact, pytorch_conv2d, steps_apart, variant_args

import runtime
from runtime.families.conv2d import choose_algorithm
from runtime.ops.library import catalog
from runtime.ops.stub_support import coop_gemm_kernels
from runtime.reference import conv2d as ref
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs
from runtime.vulkan.device import get_device
from runtime.vulkan.layouts import PACKED_LAYOUTS, pack, packed_words
from runtime.vulkan.tensor import Tensor

IM2COL = "etvk.q8ta_conv2d_im2col.default"
COOP = "etvk.q8ta_conv2d_im2col_coop.default"
GENERAL = "etvk.q8ta_conv2d_general.default"
COOP_VARIANT = "q8ta_gemm_coop_im2col_k64_w4"
ACTIVATIONS = ("relu", "none", "hardtanh", "hardswish")
KERNELS = {"7x7s2p3": ((7, 7), (2, 2), (3, 3)), "3x3s2p1": ((3, 3), (2, 2), (1, 1))}

C = Conv2dCase
STEM_CASES = [
    C(f"stem_{kernel}_c{c_in}", 1 + c_in % 2, c_in, 11 + c_in, 9 + 2 * c_in, 6 + 4 * (c_in % 3),
      *KERNELS[kernel], activation=ACTIVATIONS[c_in % 4], bias=c_in != 5)
    for c_in in (1, 2, 3, 5, 6, 7) for kernel in KERNELS
]


def _ids(value):
    return value.name if isinstance(value, Conv2dCase) else None


def _require_coop():
    ok, reason = catalog().variant(COOP_VARIANT).runnable(get_device().caps)
    if not ok:
        pytest.skip(f"{COOP_VARIANT} does not run here: {reason}")


def _check(got, case, what):
    inp = make_inputs(case)
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"{what} {case.name} vs reference")
    exact = steps_apart(got, pytorch_conv2d(inp), f"{what} {case.name} vs PyTorch")
    assert exact >= MIN_EXACT, f"{what} {case.name}: only {exact:.4%} equal PyTorch's"


@pytest.mark.parametrize("case", STEM_CASES, ids=_ids)
def test_im2col_every_variant(case, dispatch_trace):
    op = runtime.get_op(IM2COL)
    inp = make_inputs(case)
    for info in op.variants:
        _check(op(*variant_args(inp, info.name), variant=info.name), case, info.name)
        assert info.name in dispatch_trace(), f"{info.name} never reached the device"


@pytest.mark.parametrize("case", STEM_CASES, ids=_ids)
def test_im2col_coop(case):
    _require_coop()
    _check(runtime.get_op(COOP)(*make_inputs(case).args()), case, "im2col_coop")


def _with_junk_padding(x: torch.Tensor, layout: str, seed: int) -> Tensor:
    """`x` on the device in `layout`, its padding channels holding random bytes (what any
    writer might have left there; the widths past W of 4W4C stay 0)."""
    n, c, h, w = x.shape
    gen = torch.Generator().manual_seed(seed)
    junk = torch.randint(-128, 128, (n, -c % 4, h, w), dtype=torch.int8, generator=gen)
    tensor = Tensor.from_torch(x, layout=layout)
    data = pack(torch.cat([x, junk], 1), layout)
    assert data.numel() == 4 * packed_words(x.shape, layout)
    tensor.memory.write(data.data_ptr(), data.numel())
    assert torch.equal(tensor.to_torch(), x)
    return tensor


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("op_name", [IM2COL, COOP, GENERAL], ids=lambda name: name.split(".")[1])
def test_padding_channels_add_nothing(op_name, layout):
    """The padding bytes of the input's last channel word meet zero weights: junk there
    changes no output, on every algorithm that reads the word and in every layout."""
    if op_name == COOP:
        _require_coop()
    op = runtime.get_op(op_name)
    for case in STEM_CASES[2:8]:  # C_in 2, 3, 5 at both kernels
        inp = make_inputs(case)
        x = _with_junk_padding(inp.x, layout, seed=case.C_in)
        got = op(x, *inp.args()[1:])
        assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"{op_name} {layout} {case.name}")


# ResNet's stem at 136x136: 68x68 = 4624 output pixels (over rule 2's 4096: direct) x 64
# channels, K = 49 taps x 4 = 196 bytes.
ROUTED = C("stem_7x7s2p3_c3_136", 1, 3, 136, 136, 64, (7, 7), (2, 2), (3, 3), activation="relu")


def _trace(path) -> list[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["variant"] for line in lines]


def test_dispatcher_routes_a_stem_to_the_coop_im2col_where_the_device_has_it(dispatch_trace_path):
    """The rule's choice for this device (direct without cooperative matrices, the implicit
    im2col with them), and that is what the dispatcher runs."""
    caps = get_device().caps
    expected = choose_algorithm(ROUTED.params, caps.family, coop_gemm_kernels(caps))
    assert expected == ("im2col_coop" if "im2col" in coop_gemm_kernels(caps) else "general")
    inp = make_inputs(ROUTED)
    before = len(_trace(dispatch_trace_path))
    got = runtime.get_op("etvk.q8ta_conv2d.default")(*inp.args())
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), "dispatcher stem")
    ran = _trace(dispatch_trace_path)[before:]
    shader = "q8ta_gemm_coop_im2col" if expected == "im2col_coop" else "q8ta_conv2d_direct"
    assert ran and all(v.startswith(shader) for v in ran), ran
