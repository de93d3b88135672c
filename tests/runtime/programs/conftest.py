"""Programs the tests share: a small residual CNN quantized with PT2E, lowered and saved once."""

from __future__ import annotations

import pytest
import torch
from program_cases import random_batches

import runtime
from runtime.tools.models import SmallCNN, quantize_pt2e


@pytest.fixture(scope="session")
def small_cnn():
    """(float model, exported quantized program, lowered Program)."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    torch.manual_seed(0)
    model = SmallCNN().eval()
    exported = quantize_pt2e(model, random_batches(1)[0], random_batches(4, seed=1))
    return model, exported, runtime.lower(exported)


@pytest.fixture(scope="session")
def small_cnn_file(small_cnn, tmp_path_factory):
    """The lowered small CNN saved to a file."""
    path = tmp_path_factory.mktemp("programs") / "small_cnn.etvk"
    small_cnn[2].save(path)
    return path
