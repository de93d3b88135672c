"""Test session set-up shared by every test folder.

The validation layer (with synchronization validation) is on for the whole
session unless ETVK_VALIDATION is set otherwise, every dispatch is traced (to
the file ETVK_TRACE_DISPATCH names when the user sets it, else to a session
file removed at exit), measured conv choices are ignored (ETVK_TUNING=off: the rules decide,
whatever a developer's cache holds; the tuning tests turn it back on with a
cache of their own), and a test fails when the device collected a validation
message of error severity while it ran.

Where no Vulkan device exists at all, a test that needs one is reported as
skipped with the one-line reason (`VulkanUnavailable`); with
ETVK_REQUIRE_DEVICE=1 (set by CI, which has lavapipe) it fails instead.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from runtime.errors import VulkanUnavailable

os.environ.setdefault("ETVK_VALIDATION", "1")
os.environ.setdefault("ETVK_TUNING", "off")  # the rules; tuning tests turn the cache on
if "ETVK_TRACE_DISPATCH" not in os.environ:  # a file of the session's own, removed at exit
    _TRACE_DIR = tempfile.mkdtemp(prefix="etvk-tests-")
    atexit.register(shutil.rmtree, _TRACE_DIR, ignore_errors=True)
    os.environ["ETVK_TRACE_DISPATCH"] = str(Path(_TRACE_DIR) / "dispatch.jsonl")
_TRACE = Path(os.environ["ETVK_TRACE_DISPATCH"])
# Lines a user's trace file held before this session are not this session's dispatches.
_TRACE_START = _TRACE.stat().st_size if _TRACE.exists() else 0


def session_trace_lines() -> list[str]:
    """The trace lines written during this session."""
    if not _TRACE.exists():
        return []
    with _TRACE.open("rb") as f:
        f.seek(_TRACE_START)
        return f.read().decode().splitlines()


@pytest.fixture
def dispatch_trace_path() -> Path:
    """The session's dispatch trace file (one JSON line per dispatch)."""
    return _TRACE


@pytest.fixture
def dispatch_trace():
    """A function returning the set of variant names dispatched so far this session."""

    def variants() -> set[str]:
        return {json.loads(line)["variant"] for line in session_trace_lines()}

    return variants


@pytest.fixture(autouse=True)
def no_validation_errors():
    """Fails the test if the validation layer reported an error while it ran."""
    yield
    from runtime.vulkan.device import current_device

    device = current_device()
    if device is not None:
        errors = device.take_validation_messages("error")
        assert not errors, "Vulkan validation errors:\n" + "\n".join(errors)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Reports a test that found no Vulkan device at all as skipped, with the reason."""
    outcome = yield
    report = outcome.get_result()
    if (
        call.excinfo is not None
        and call.excinfo.errisinstance(VulkanUnavailable)
        and os.environ.get("ETVK_REQUIRE_DEVICE") != "1"
    ):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")
