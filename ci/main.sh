#!/usr/bin/env bash
# The README's first command: set up, build, and run the main job (Gemma 3 270M on
# the CPU plugin, default config) once.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build
exec build/tools/dray run --config dray.yaml -n 64 \
  -p "${1:-The three most important ideas in computer science are}"
