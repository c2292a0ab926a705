#!/usr/bin/env bash
# The README's second command: set up, build warning-clean, run every test, and
# print one closing line "N passed, N failed, N skipped".
#   ci/test.sh            release build (gcc, -Werror) + the whole suite, clang compile check
#   ci/test.sh --asan     the whole suite under AddressSanitizer + UBSan instead
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh

dir=build-ci; opts=(-Dwerror_strict=true)
if [ "${1:-}" = "--asan" ]; then
  # nvcc/hipcc objects are not instrumented, so the GPU plugins stay out of this run;
  # vendor runtimes' own one-time allocations are suppressed (ci/lsan.supp), and
  # plugins stay mapped at exit so leaks keep their library names.
  dir=build-asan; opts+=(-Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false
                         -Dcuda=disabled -Dhip=disabled)
  export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export LSAN_OPTIONS=suppressions=$PWD/ci/lsan.supp DRAY_NO_DLCLOSE=1
fi
if [ -f "$dir/build.ninja" ]; then meson configure "$dir" "${opts[@]}" >/dev/null
else meson setup "$dir" "${opts[@]}" >/dev/null; fi
ninja -C "$dir"

if [ "${1:-}" != "--asan" ] && command -v clang >/dev/null; then
  echo "test: clang build (warnings are errors)"
  [ -f build-clang/build.ninja ] || CC=clang meson setup build-clang -Dwerror_strict=true -Dcuda=disabled -Dhip=disabled >/dev/null
  ninja -C build-clang >build-clang/ninja.log 2>&1 ||
    { grep -B2 -A6 -E 'error|warning' build-clang/ninja.log | head -n 60; echo "test: the clang build failed"; exit 1; }
fi

set +e
meson test -C "$dir" --print-errorlogs --num-processes 2
set -e
.venv/bin/python ci/summarize.py "$dir/meson-logs/testlog.json"
