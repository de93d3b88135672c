"""The input tables of the pointwise GEMM (``input_table`` of q8ta_conv2d_pw and the dispatcher):
q8ta_channel_lut folded into the 1x1 conv that reads its output.

- the reference is q8ta_channel_lut -> conv;
- q8ta_gemm (both DOT variants) in every input layout, with C_in a multiple of 4, of neither 4
  nor 16, and of 16, bit-exact against the reference and byte for byte against the two device
  ops it replaces (q8ta_channel_lut, then q8ta_conv2d_pw), padding included although every
  table's entry for 0 is not 0; every GEMM tiling the tuner tries (SPLIT_K and BLOCK_K change
  which K word a staging slot holds); with the epilogue's residual add or output table;
- the dispatcher runs a pointwise conv with tables on the pointwise GEMMs only, whatever the
  rule or a measured choice says for the geometry;
- bad tables, tables on a conv that is not pointwise, and tables on the other algorithm ops
  name the op and the argument.
(The cooperative-matrix GEMM's tables: tests/ops/test_conv2d_coop.py.)
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conv_testlib import (
    assert_bit_exact,
    packed_bytes,
    random_input_table,
    random_lut,
    residual_args,
)

import runtime
from runtime.families.conv2d import choose_algorithm
from runtime.families.conv2d_tuning import Conv2dChoice, candidate_settings
from runtime.ops import tuning
from runtime.reference import conv2d as ref
from runtime.reference.q8ta_unary import q8ta_channel_lut
from runtime.tools.examples_conv2d import CASES_BY_NAME, Conv2dCase, make_inputs
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

PW = "etvk.q8ta_conv2d_pw.default"
DISPATCH = "etvk.q8ta_conv2d.default"
C = Conv2dCase
CASES = [
    C("in_table_cin6_cout7", 1, 6, 5, 9, 7, (1, 1), activation="relu"),
    C("in_table_cin37_cout20_b2", 2, 37, 3, 5, 20, (1, 1)),
    C("in_table_cin64_cout9", 1, 64, 4, 7, 9, (1, 1), activation="hardswish"),
]
CASE_IDS = [c.name for c in CASES]
TILING_CASE = C("in_table_cin299_cout12", 1, 299, 3, 6, 12, (1, 1), activation="relu")


def test_reference_reads_the_tables_first():
    for case in CASES:
        inp = make_inputs(case)
        table = random_input_table(case.C_in, 1)
        want = ref.q8ta_conv2d(q8ta_channel_lut(inp.x, table), *inp.args()[1:])
        assert_bit_exact(ref.q8ta_conv2d(*inp.args(), input_table=table), want, case.name)
        assert not torch.equal(want, ref.q8ta_conv2d(*inp.args())), f"{case.name}: the tables change nothing"


def _two_ops(stream, x, inp, table, **epilogue):
    """q8ta_channel_lut, then q8ta_conv2d_pw, on the device."""
    mapped = runtime.get_op("etvk.q8ta_channel_lut.default").record(stream, x, table)
    return runtime.get_op(PW).record(stream, mapped, *inp.args()[1:], **epilogue)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("variant", ["q8ta_gemm_sdot", "q8ta_gemm_fallback"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_variant_and_layout_reads_through_the_tables_bit_exact(case, variant, layout, dispatch_trace):
    inp = make_inputs(case)
    table = random_input_table(case.C_in, 2)
    want = ref.q8ta_conv2d(*inp.args(), input_table=table)
    with Stream() as stream:
        x = Tensor.from_torch(inp.x, layout=layout)
        fused = runtime.get_op(PW).record(stream, x, *inp.args()[1:], input_table=table, variant=variant)
        alone = _two_ops(stream, x, inp, table, variant=variant)
        stream.run()
        assert fused.layout == layout
        assert_bit_exact(fused.to_torch(), want, f"{case.name} {variant} {layout}")
        assert torch.equal(packed_bytes(fused), packed_bytes(alone)), f"{case.name} {variant} {layout}: two ops"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("settings", candidate_settings("pw"), ids=lambda s: "-".join(str(v) for _, v in s))
def test_every_tiling_stages_the_tables_of_its_k_words(settings, layout):
    """75 K words: several chunks for every tiling, the largest staging 64 words at a time."""
    case = TILING_CASE
    inp = make_inputs(case)
    table = random_input_table(case.C_in, 3)
    with Stream() as stream, tuning.forcing(Conv2dChoice("pw", layout, settings)):
        out = runtime.get_op(PW).record(stream, Tensor.from_torch(inp.x, layout=layout), *inp.args()[1:],
                                        input_table=table)
        stream.run()
        got = out.to_torch()
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args(), input_table=table), f"{settings} {layout}")


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("epilogue", ["residual", "lut"])
def test_tables_go_with_the_residual_add_or_the_output_table(epilogue, layout):
    case = CASES[1]
    inp = make_inputs(case)
    table = random_input_table(case.C_in, 4)
    extra = residual_args(inp, case.params.output_shape, 4, "relu") if epilogue == "residual" else ()
    lut = random_lut(4) if epilogue == "lut" else None
    want = ref.q8ta_conv2d(*inp.args(), *extra, lut=lut, input_table=table)
    with Stream() as stream:
        residual = (Tensor.from_torch(extra[0], layout=layout), *extra[1:]) if extra else ()
        out = runtime.get_op(PW).record(stream, Tensor.from_torch(inp.x, layout=layout), *inp.args()[1:],
                                        *residual, lut=lut, input_table=Tensor.from_torch(table))
        stream.run()
        assert_bit_exact(out.to_torch(), want, f"{epilogue} {layout}")


@pytest.mark.parametrize("forced", [None, "general", "im2col", "pw"])
def test_the_dispatcher_runs_tables_on_the_pointwise_gemm(forced, dispatch_trace_path):
    """Neither the rule (direct for few channels on NVIDIA) nor a measured choice of another
    algorithm takes a conv with tables off the pointwise GEMMs."""
    case = CASES[0]
    inp = make_inputs(case)
    table = random_input_table(case.C_in, 5)
    before = len(dispatch_trace_path.read_text().splitlines()) if dispatch_trace_path.exists() else 0
    choice = contextlib.nullcontext() if forced is None else tuning.forcing(Conv2dChoice(forced, "4C", ()))
    with Stream() as stream, choice:
        out = runtime.get_op(DISPATCH).record(stream, inp.x, *inp.args()[1:], input_table=table)
        stream.run()
        assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args(), input_table=table), str(forced))
    lines = dispatch_trace_path.read_text().splitlines()[before:]
    assert lines and all("q8ta_gemm" in line for line in lines), lines


def test_the_rule_keeps_tables_on_the_pointwise_gemms():
    few = CASES[0].params  # 6 input channels: the direct conv on NVIDIA without tables
    assert choose_algorithm(few, "nvidia") == "general"
    assert choose_algorithm(few, "nvidia", input_table=True) == "pw"
    big = C("big", 1, 256, 56, 56, 128, (1, 1)).params
    assert choose_algorithm(big, "nvidia", frozenset({"pw"}), input_table=True) == "pw_coop"
    with pytest.raises(ValueError, match="pointwise"):
        choose_algorithm(CASES_BY_NAME["batch2_3x3_cout10"].params, "nvidia", input_table=True)


def _bad_table_cases():
    pw = CASES[0]
    three = CASES_BY_NAME["batch2_3x3_cout10"]
    grouped = C("in_table_g2", 1, 8, 3, 3, 8, (1, 1), groups=2)
    table = random_input_table(pw.C_in, 6)
    return [
        (PW, pw, {"input_table": table[:5]}, "an int8 [C_in, 256] tensor with C_in=6"),
        (PW, pw, {"input_table": table.to(torch.int32)}, "an int8 [C_in, 256] tensor"),
        (PW, pw, {"input_table": table.view(-1)}, "an int8 [C_in, 256] tensor"),
        (DISPATCH, pw, {"input_table": table[:, :255]}, "an int8 [C_in, 256] tensor"),
        (DISPATCH, three, {"input_table": random_input_table(three.C_in, 6)}, "needs a pointwise conv"),
        (PW, grouped, {"input_table": random_input_table(8, 6)}, "needs a pointwise conv"),
        ("etvk.q8ta_conv2d_pw_coop.default", pw, {"input_table": table[:5]}, "an int8 [C_in, 256] tensor"),
        *[(f"etvk.q8ta_conv2d_{alg}.default", pw, {"input_table": table}, "must be None: only the pointwise")
          for alg in ("im2col", "general", "im2col_coop")],
        ("etvk.q8ta_conv2d_dw.default", CASES_BY_NAME["mobilenetv2_dw_c30_w13"],
         {"input_table": random_input_table(30, 6)}, "must be None: only the pointwise"),
    ]


@pytest.mark.parametrize(("op_name", "case", "changes", "text"), _bad_table_cases(),
                         ids=lambda v: v.split(".")[1] if isinstance(v, str) and v.startswith("etvk") else None)
def test_bad_tables_name_the_op_and_argument(op_name, case, changes, text):
    inp = make_inputs(case)
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(op_name)(*inp.args(), **changes)
    message = str(info.value)
    assert message.startswith(f"{op_name}: argument 'input_table'"), message
    assert text in message, message
