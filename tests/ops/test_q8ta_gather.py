"""q8ta_gather family (int8 channel gather) on the default Vulkan device, validation on.

Every case of `runtime.tools.examples_q8ta_gather` (slices at word and non-word
offsets, chunk halves, channel shuffles, a shuffle of a slice) runs in every packed layout with a device
input and must equal the reference bit for bit, padding bytes included (the
raw output words are compared with the packed reference); the reference must
equal PyTorch's own indexing (slice, chunk, view -> transpose -> view). The
op writes 16-byte quads in 4W4C and in 4C1W with W % 4 == 0, else (and within
`one_word_each`) one word an invocation: the dispatch's size says which ran,
and both are checked. Bad arguments name the op and argument.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import runtime
from runtime.families.q8ta_copy import one_word_each
from runtime.reference.q8ta_gather import q8ta_channel_gather
from runtime.tools.examples_q8ta_gather import GATHER_BY_NAME, GATHER_CASES, gather_inputs
from runtime.vulkan import layouts
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_channel_gather.default"


def shuffle(x, groups):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


# case name -> PyTorch's indexing of x
INDEXING = {
    "chunk_first_c8": lambda x: x.chunk(2, dim=1)[0],
    "chunk_second_c8": lambda x: x.chunk(2, dim=1)[1],
    "chunk_second_c6": lambda x: x.chunk(2, dim=1)[1],
    "slice_c11_from_1": lambda x: x[:, 1:10],
    "shuffle_g2_c8": lambda x: shuffle(x, 2),
    "shuffle_g2_c10": lambda x: shuffle(x, 2),
    "shuffle_g3_c12": lambda x: shuffle(x, 3),
    "shuffle_of_slice": lambda x: shuffle(x[:, 3:9], 2),
    "slice_c11_from_2_w8": lambda x: x[:, 2:11],
    "shuffle_g2_c10_w8": lambda x: shuffle(x, 2),
}
NAMES = [case.name for case in GATHER_CASES]


def test_every_case_has_its_indexing():
    assert sorted(INDEXING) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_reference_equals_pytorch_indexing(name):
    x, start, count, groups = gather_inputs(GATHER_BY_NAME[name])
    assert torch.equal(q8ta_channel_gather(x, start, count, groups), INDEXING[name](x))


@pytest.mark.parametrize("one_word", [False, True], ids=["quads", "words"])
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_device_matches_reference(name, layout, one_word, dispatch_trace, dispatch_trace_path):
    x, start, count, groups = gather_inputs(GATHER_BY_NAME[name])
    want = q8ta_channel_gather(x, start, count, groups)
    op = runtime.get_op(OP)
    with Stream() as stream, one_word_each() if one_word else contextlib.nullcontext():
        out = op.record(stream, Tensor.from_torch(x, layout=layout), start, count, groups)
        stream.run()
        assert out.layout == layout
        raw = torch.empty(4 * layouts.packed_words(out.shape, layout), dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        got = out.to_torch()
    quads = not one_word and (layout == "4W4C" or (layout == "4C1W" and x.shape[3] % 4 == 0))
    dispatched = json.loads(dispatch_trace_path.read_text().splitlines()[-1])["global"][0]
    assert dispatched == (raw.numel() // 16 if quads else raw.numel() // 4), f"quads {quads}"
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    # Padding channels (and 4W4C padding widths) must be written as 0 bytes.
    assert torch.equal(raw, layouts.pack(want, layout)), f"{name} {layout}: padding bytes not 0"
    assert "q8ta_channel_gather" in dispatch_trace()


def test_host_input_runs_in_4c1w():
    x = gather_inputs(GATHER_BY_NAME["shuffle_g2_c10"])[0]
    got = runtime.get_op(OP)(x, 0, 10, 2)
    assert torch.equal(got, shuffle(x, 2))


@pytest.mark.parametrize(("args", "argument"), [
    ((8, 1, 1), "start"), ((2, 7, 1), "count"), ((0, 0, 1), "count"), ((0, 8, 3), "groups"),
    ((0, 8, 0), "groups"),
])
def test_bad_arguments_name_the_argument(args, argument):
    x = gather_inputs(GATHER_BY_NAME["chunk_first_c8"])[0]
    with pytest.raises(ValueError, match=rf"q8ta_channel_gather.*{argument}"):
        runtime.get_op(OP)(x, *args)
