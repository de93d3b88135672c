"""The test session's own set-up (tests/conftest.py): a trace file the user names is honoured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_user_trace_file_gets_the_sessions_dispatches(tmp_path):
    trace = tmp_path / "mine.jsonl"
    trace.write_text('{"variant": "from an earlier run"}\n')
    env = dict(os.environ, ETVK_TRACE_DISPATCH=str(trace))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/ops/test_quantize.py::test_dispatch_trace_records_op_variant_and_sizes"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0] == {"variant": "from an earlier run"}  # appended to, not overwritten
    assert len(lines) > 1 and all("op" in line for line in lines[1:])
