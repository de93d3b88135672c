"""runtime/ops/matrix_layouts.py: reading the layout probe's output (on the CPU), the probe on
devices that run it (every element of the matrix held by exactly one lane), and the few-token
linear kernel's choice between reading its sums from registers and through shared memory."""

from __future__ import annotations

import pytest
import torch

import runtime
from runtime.ops import matrix_layouts
from runtime.ops.library import catalog
from runtime.ops.stub_support import linear_few_sums
from runtime.reference import linear as ref
from runtime.tools.examples import linear_args
from runtime.vulkan.device import get_device

SUBGROUP, SLOTS = matrix_layouts.SUBGROUP, matrix_layouts.SLOTS


def _output(lanes, length=4, padding=-1) -> torch.Tensor:
    """The probe's int32 output for `lanes` (each lane's elements, 8 row + column)."""
    values = torch.full((SUBGROUP * SLOTS + 1,), padding, dtype=torch.int32)
    for lane, elements in enumerate(lanes):
        values[lane * SLOTS:lane * SLOTS + len(elements)] = torch.tensor(elements, dtype=torch.int32)
    values[-1] = length
    return values


def test_mma_16x8_names_each_element_once_in_ptx_order():
    assert sorted(e for lane in matrix_layouts.MMA_16X8 for e in lane) == list(range(128))
    assert matrix_layouts.MMA_16X8[0] == (0, 1, 64, 65)  # lane 0: rows 0 and 8, columns 0 and 1
    assert matrix_layouts.MMA_16X8[5] == (10, 11, 74, 75)  # lane 4 g + t = 5: row 1, columns 2, 3


def test_a_probe_output_gives_each_lane_its_elements():
    assert matrix_layouts.layout_from_probe(_output(matrix_layouts.MMA_16X8)) == matrix_layouts.MMA_16X8
    # Another layout (components in another order) is read as such, and is not MMA_16X8.
    swapped = tuple((b, a, d, c) for a, b, c, d in matrix_layouts.MMA_16X8)
    got = matrix_layouts.layout_from_probe(_output(swapped))
    assert got == swapped and got != matrix_layouts.MMA_16X8


@pytest.mark.parametrize(
    "fault",
    ["an element held twice", "a length over the slots", "a zero length", "a slot past the length written"],
)
def test_an_output_that_is_no_16x8_matrix_gives_none(fault):
    lanes = [list(lane) for lane in matrix_layouts.MMA_16X8]
    values = _output(lanes)
    if fault == "an element held twice":
        values[1] = values[0]
    elif fault == "a length over the slots":
        values[-1] = SLOTS + 1
    elif fault == "a zero length":
        values[-1] = 0
    else:
        values[4] = 7
    assert matrix_layouts.layout_from_probe(values) is None


def _probe_runs() -> bool:
    return catalog().variant(matrix_layouts.PROBE).runnable(get_device().caps)[0]


def test_the_probe_finds_every_element_once_where_it_runs():
    if not _probe_runs():
        pytest.skip(f"{matrix_layouts.PROBE}: {catalog().variant(matrix_layouts.PROBE).runnable(get_device().caps)[1]}")
    layout = matrix_layouts.accumulator_layout()
    assert layout is not None, "the probe's output is not a 16x8 matrix spread over the subgroup"
    assert matrix_layouts.has_mma_16x8_accumulator() == (layout == matrix_layouts.MMA_16X8)


def test_devices_without_the_probe_read_sums_through_shared_memory():
    if _probe_runs():
        pytest.skip("the device runs the probe")
    assert not matrix_layouts.has_mma_16x8_accumulator()
    assert linear_few_sums() == "shared"


def test_the_few_kernel_reads_through_shared_memory_where_the_layout_differs(monkeypatch, dispatch_trace_path):
    """With the probe's answer False the op takes the shared-memory variant (bit-exact), and a
    forced registers variant is refused with the reason."""
    from runtime.ops.stub_support import LINEAR_FEW_VARIANT

    ok, reason = catalog().variant(LINEAR_FEW_VARIANT).runnable(get_device().caps)
    if not ok:
        pytest.skip(reason)
    monkeypatch.setattr(matrix_layouts, "has_mma_16x8_accumulator", lambda: False)
    op = runtime.get_op("etvk.linear_qta8a_qga4w_coop_few.default")
    args, _ = linear_args((8,), 256, 40, 128, torch.Generator().manual_seed(3))
    before = dispatch_trace_path.read_text().count("\n") if dispatch_trace_path.exists() else 0
    got = op(*args)
    assert torch.equal(got.view(torch.int32), ref.linear_qta8a_qga4w(*args).view(torch.int32))
    line = dispatch_trace_path.read_text().splitlines()[before]
    assert "linear_qta8a_qga4w_coop_few_s4_shared" in line, line
    with pytest.raises(runtime.UnsupportedVariant, match="the device asks for SUMS=shared"):
        op(*args, variant="linear_qta8a_qga4w_coop_few_s4_registers")
