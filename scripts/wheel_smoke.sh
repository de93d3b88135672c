#!/usr/bin/env bash
# Builds the wheel and proves it works anywhere: a fresh virtualenv in a
# temporary folder outside the checkout, with no glslc or spirv-val on PATH,
# installs it and runs every op variant against its reference on the default
# Vulkan device (`python -m runtime demo`), then checks that codegen was never
# imported and that no SPIR-V was written anywhere (a pipeline cache may be).
# `make wheel-test` runs it; CI runs that after the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d -t etvk-wheel-XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "wheel-test: building the wheel"
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/dist" .
wheel=$(ls "$work"/dist/etvk-*.whl)
echo "wheel-test: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB; installing into a fresh virtualenv"
python3 -m venv "$work/venv"
# torch first: the local CPU wheel (an unpinned torch would download a CUDA build).
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
mkdir "$work/home" "$work/run"
cd "$work/run"
env -i PATH="$work/venv/bin" HOME="$work/home" ETVK_CACHE_DIR="$work/cache" \
  "$work/venv/bin/python" - "$repo" <<'PY'
import pathlib
import shutil
import sys

repo = pathlib.Path(sys.argv[1]).resolve()
assert shutil.which("glslc") is None and shutil.which("spirv-val") is None, "glslc must not be on PATH"
import runtime
from runtime.tools.demo import run_demo

where = pathlib.Path(runtime.__file__).resolve()
assert repo not in where.parents, f"runtime was imported from the checkout: {where}"
status = run_demo()
assert "codegen" not in sys.modules, "the runtime imported codegen"
written = [p for p in pathlib.Path.cwd().parent.rglob("*.spv") if "site-packages" not in p.parts]
assert not written, f"SPIR-V was written: {written}"
print(f"wheel-test: {len(runtime.list_ops())} ops from {where.parent}; no codegen, no SPIR-V written")
sys.exit(status)
PY
