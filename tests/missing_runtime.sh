#!/usr/bin/env bash
# The rule for a missing vendor runtime (docs/plugin-abi.md, "A missing runtime"):
# a plugin whose runtime finds no driver or no device still negotiates, and reports
# 0 devices with one logged sentence; `dray devices` lists it under "plugins
# loaded" with "no device: <reason>", never under "plugins skipped".
# Every in-tree plugin built here is checked with its runtime's drivers hidden
# (no OpenCL ICD, no Vulkan ICD, no visible CUDA/ROCm device), and so is the test
# plugin fakenodev, whose device_count reports 0 devices.
# Usage: tests/missing_runtime.sh BUILD_DIR
set -euo pipefail
fail() { echo "missing_runtime: FAIL: $*" >&2; exit 1; }
build=$1
dray="$build/tools/dray"

out=$(env OCL_ICD_VENDORS=/nonexistent OCL_ICD_FILENAMES= \
          VK_ICD_FILENAMES=/nonexistent/none.json VK_DRIVER_FILES=/nonexistent/none.json \
          CUDA_VISIBLE_DEVICES= HIP_VISIBLE_DEVICES= ROCR_VISIBLE_DEVICES= \
          "$dray" devices --plugin-path "$build/tests/plugins" 2>&1) ||
  { echo "$out" >&2; fail "dray devices failed"; }
echo "$out"

# the in-tree plugins built here: every one is loaded, every one but cpu without a device
n=0
for so in "$build"/backends/*/libdray-*.so; do
  [ -e "$so" ] || continue
  name=$(basename "$so" .so); name=${name#libdray-}
  loaded=$(echo "$out" | sed -n '/^plugins loaded/,/^plugins skipped/p')
  echo "$loaded" | grep -q "^  $name  (ABI" || fail "$name is not listed as loaded with its runtime missing"
  if [ "$name" != cpu ]; then
    echo "$loaded" | grep -q "^    $name: no device: ." ||
      fail "$name has no 'no device: <reason>' line with its runtime missing"
  fi
  n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no in-tree plugin found in $build/backends"
# the fake plugin that reports 0 devices: loaded, with its logged reason
echo "$out" | grep -q "^    fakenodev: no device: no FAKE driver$" ||
  fail "fakenodev is not listed with 'no device: no FAKE driver'"
! echo "$out" | sed -n '/^plugins skipped/,$p' | grep -qE "libdray-(fakenodev|cpu|opencl|vulkan|cuda|hip)\.so" ||
  fail "a plugin without a runtime was skipped instead of listed"
echo "missing_runtime: PASS ($n in-tree plugins and fakenodev listed with no device)"
