#!/usr/bin/env bash
# Packs another revision of this repository as an A/B tree for a lent GPU machine:
#   scripts/ab_tree.sh REV NAME
# writes .devkit/NAME/ (git-ignored, carried with .devkit) holding REV's runtime, codegen,
# benchmarks, tests, examples, op specs, templates and generated/ with its SPIR-V compiled here
# (the device has no glslc). On the device, run REV's code as a script with its tree first on
# the path:
#   PYTHONPATH=$PWD/.devkit/NAME:/tmp/site python3 .devkit/NAME/benchmarks/program_bench.py ...
# (not `python3 -m ...` from the checkout: -m puts the working directory first on the path),
# and its tests from inside the tree: (cd .devkit/NAME && python3 -m pytest -q tests/...).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: scripts/ab_tree.sh REV NAME (packs REV into .devkit/NAME)" >&2
  exit 2
fi
rev=$1
name=$2
root=$(git rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") || {
  echo "scripts/ab_tree.sh: '$rev' is not a revision of $root" >&2
  exit 2
}
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/tree" "$commit" >/dev/null
echo "compiling the SPIR-V of ${commit:0:12}..."
(cd "$work/tree" && "$root/.venv/bin/python" -m codegen compile)
out="$root/.devkit/$name"
rm -rf "$out"
mkdir -p "$out"
tar -C "$work/tree" --exclude=__pycache__ -cf - runtime generated codegen benchmarks tests examples op_specs \
  templates pyproject.toml | tar -C "$out" -xf -
echo "$commit" > "$out/REVISION"
echo "packed ${commit:0:12} into .devkit/$name ($(du -sh "$out" | cut -f1)); .devkit carries at most 64 MiB"
