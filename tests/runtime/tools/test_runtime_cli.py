"""`python -m runtime info`: the report, and one clean line without Vulkan."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.errors import NO_DEVICE, NO_LOADER, VulkanUnavailable
from runtime.ops.library import Catalog
from runtime.tools import cli, info
from runtime.vulkan.device import CAPABILITY_NAMES, get_device

REPO = Path(__file__).resolve().parents[3]


def test_info_report(tiny_library, monkeypatch, capsys):
    device = get_device()  # first: without a device the test is skipped, not failed
    caps = dataclasses.replace(device.caps, storage_image_formats=device.caps.storage_image_formats - {"rgba8i"})
    monkeypatch.setattr("runtime.tools.info.get_device",
                        lambda: SimpleNamespace(caps=caps, memory_heaps=device.memory_heaps))
    monkeypatch.setattr("runtime.tools.info.catalog", lambda: Catalog([tiny_library]))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    yes = {name: "yes" if caps.supports(name) else "no" for name in CAPABILITY_NAMES}
    for needle in [f"device: {caps.name} ({caps.device_type})", f"family: {caps.family} (detected)",
                   f"shader_int8 {yes['shader_int8']}", f"cooperative_matrix {yes['cooperative_matrix']}",
                   "pipeline statistics (python -m runtime stats): "
                   + ("yes" if caps.pipeline_statistics else "no"),
                   f"max storage buffer range {caps.limits.max_storage_buffer_range}", "variants (3, from",
                   "  test.affine_buffer_float.default", "    affine_buffer_float: runnable",
                   f"    add_texture3d_int8: not runnable: {caps.name} lacks storage images of rgba8i"]:
        assert needle in out, needle


@pytest.mark.parametrize("message", [NO_LOADER, NO_DEVICE])
def test_no_vulkan_prints_one_line(message, monkeypatch, capsys):
    def unavailable():
        raise VulkanUnavailable(message)

    monkeypatch.setattr("runtime.tools.info.get_device", unavailable)
    assert cli.main([]) == 1
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""


def test_no_driver_in_a_real_process(tmp_path):
    """With no ICD the loader finds no device: exit 1, the NO_DEVICE line, no traceback."""
    env = dict(os.environ, VK_ICD_FILENAMES=str(tmp_path / "none.json"), VK_DRIVER_FILES=str(tmp_path / "none.json"),
               ETVK_VALIDATION="0")
    result = subprocess.run([sys.executable, "-m", "runtime", "info"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == NO_DEVICE + "\n"


def test_info_names_why_a_capability_is_held_back():
    device = get_device()
    reason = "the validation layer, header 239, predates VK_KHR_cooperative_matrix"
    held = dataclasses.replace(device.caps, held_back=(("cooperative_matrix", reason),),
                               features=device.caps.features - {"cooperative_matrix"})
    lines = info.describe_device(SimpleNamespace(caps=held, memory_heaps=device.memory_heaps))
    assert f"cooperative_matrix no ({reason})" in "\n".join(lines)
