"""Fixtures for codegen tests (helpers live in codegen_testlib.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spv_dir(tmp_path_factory):
    """A session-wide SPIR-V folder: tests compile there, never into generated/spv."""
    return tmp_path_factory.mktemp("spv")


def pytest_configure(config):
    config.addinivalue_line("markers", "glslc: compiles with glslc and validates with spirv-val")
