"""runtime.ops.prepack: a packing function runs once per tensor version; its device copy is reused."""

from __future__ import annotations

import gc

import pytest
import torch

from runtime.ops import prepack
from runtime.ops.library import BindingInfo
from runtime.vulkan.stream import Stream

CALLS: list[tuple] = []


def double(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """The packing function under test: counts its calls."""
    CALLS.append((t.data_ptr(), offset))
    return t * 2 + offset


FUNCTION = f"{__name__}:double"


@pytest.fixture(autouse=True)
def no_calls():
    CALLS.clear()


def test_cached_per_identity_version_and_value():
    w = torch.arange(8, dtype=torch.int32)
    first = prepack.prepacked(FUNCTION, w)
    assert prepack.prepacked(FUNCTION, w) is first and len(CALLS) == 1
    assert torch.equal(first.value, w * 2)
    assert prepack.prepacked(FUNCTION, w.clone()) is not first  # another tensor
    assert prepack.prepacked(FUNCTION, w, 1).value[0] == 1  # another argument value
    assert len(CALLS) == 3


def test_in_place_change_repacks_and_replaces_the_stale_result():
    w = torch.ones(4, dtype=torch.int32)
    old = prepack.prepacked(FUNCTION, w)
    w.add_(1)
    new = prepack.prepacked(FUNCTION, w)
    assert new is not old and torch.equal(new.value, torch.full((4,), 4, dtype=torch.int32))
    assert len(prepack._CACHE[id(w)]) == 1


def test_entry_dies_with_its_tensor():
    w = torch.ones(4, dtype=torch.int32)
    key = id(w)
    prepack.prepacked(FUNCTION, w)
    assert key in prepack._CACHE
    del w
    gc.collect()
    assert key not in prepack._CACHE


def test_needs_a_host_tensor():
    with pytest.raises(TypeError, match="needs at least one host torch tensor"):
        prepack.prepacked(FUNCTION, 3)


def test_device_copy_is_uploaded_once_per_dtype_and_storage():
    packed = prepack.prepacked(FUNCTION, torch.arange(8, dtype=torch.int32))
    binding = BindingInfo("t_w", 0, "buffer", "int32", 4, "read")
    with Stream() as stream:
        first = stream.upload(packed, binding)
        assert stream.upload(packed, binding) is first
        assert torch.equal(first.to_torch(), torch.arange(8, dtype=torch.int32) * 2)
        as_float = stream.upload(packed, BindingInfo("t_w", 0, "buffer", "float32", 4, "read"))
        assert as_float is not first and as_float.dtype == torch.float32
