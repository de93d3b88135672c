"""Fixtures for codegen tests (helpers live in codegen_testlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

_CACHE: list[Path] = []


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """Every test compiles into a session-wide temp SPIR-V cache, never ~/.cache."""
    monkeypatch.setenv("ETVK_CACHE_DIR", str(_session_cache(tmp_path_factory)))


def _session_cache(factory) -> Path:
    if not _CACHE:
        _CACHE.append(factory.mktemp("spv-cache"))
    return _CACHE[0]


def pytest_configure(config):
    config.addinivalue_line("markers", "glslc: compiles with glslc and validates with spirv-val")
