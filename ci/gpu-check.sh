#!/usr/bin/env bash
# ci/gpu-check.sh OUTDIR — the GPU check, for a machine with an NVIDIA GPU
# (or an AMD one: GPU_PLUGIN=hip). Within about 8 minutes it:
#   1. builds dray with meson (CUDA plugin on, in build-gpucheck/),
#   2. runs the GPU unit tests (host side + every op vs the CPU reference),
#   3. runs `dray conformance --plugin cuda`,
#   4. runs Gemma 3 270M end to end with `dray run` on the GPU backend,
#   5. runs `dray bench ops` and `dray bench model` on it (if they exist).
# Every step writes OUTDIR/<step>.log; OUTDIR/summary.txt has one line per
# step (PASS / FAIL / SKIP and why). Exit status: 0 if nothing failed.
# A subcommand this dray does not have yet is a SKIP, not a failure.
set -u
OUT=${1:?usage: ci/gpu-check.sh OUTDIR}
PLUGIN=${GPU_PLUGIN:-cuda}
BUILD=${GPU_BUILD_DIR:-build-gpucheck}
MODEL=${DRAY_MODEL:-.models/gemma-3-270m-q4_k_m.gguf}
BUDGET=${GPU_CHECK_SECONDS:-480}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
: >"$OUT/summary.txt"
START=$(date +%s)
failed=0

note() { echo "$1 $2: $3" | tee -a "$OUT/summary.txt"; [ "$1" = FAIL ] && failed=1; return 0; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME LIMIT_SECONDS CMD... : run with a time limit, log, record
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if [ "$l" -le 5 ]; then note SKIP "$name" "no time left in the ${BUDGET}s budget"; return 1; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then note PASS "$name" "${dt}s"
  elif [ $rc -eq 124 ]; then note FAIL "$name" "timed out after ${limit}s (see $name.log)"
  elif [ $rc -eq 77 ]; then note SKIP "$name" "$(tail -n 1 "$OUT/$name.log")"
  else note FAIL "$name" "exit $rc after ${dt}s (see $name.log)"; fi
  return $rc
}

# a subcommand is present when its -h exits 0 (unknown ones exit 2)
has_cmd() { "$BUILD/tools/dray" "$@" -h >/dev/null 2>&1; }

{ nvidia-smi || rocm-smi || echo "no nvidia-smi / rocm-smi"; } >"$OUT/device.log" 2>&1
uname -a >>"$OUT/device.log"

# 1. build (nvcc for sm_80/sm_90 + PTX; the CPU plugin is the reference)
feat=-Dcuda=enabled; [ "$PLUGIN" = hip ] && feat=-Dhip=enabled
if [ -d "$BUILD" ]; then setup=(meson setup --reconfigure "$BUILD" "$feat")
else setup=(meson setup "$BUILD" "$feat"); fi
step build-setup 120 "${setup[@]}" || { note FAIL summary "cannot configure"; exit 1; }
step build 300 ninja -C "$BUILD" -j"$(nproc)" || { note FAIL summary "build failed"; exit 1; }
"$BUILD/tools/dray" devices -v >"$OUT/devices.log" 2>&1

# 2. unit tests of the GPU plugins (device test exits 77 = SKIP without a device)
step test-gpu-host 60 meson test -C "$BUILD" --print-errorlogs gpu_host
step test-gpu-device 120 env DRAY_BUILD_ROOT="$PWD/$BUILD" "$BUILD/tests/test_gpu_device"

# no device: say why once and skip the steps that need one (the check fails)
if grep -q "^ *$PLUGIN: no device" "$OUT/devices.log"; then
  note FAIL device "$(grep -m1 "^ *$PLUGIN: no device" "$OUT/devices.log" | sed 's/^ *//')"
  note SKIP conformance,run,bench "they need a $PLUGIN device"
  echo "total $(( $(date +%s) - START ))s" | tee -a "$OUT/summary.txt"
  exit 1
fi

# 3. conformance against the CPU reference
if has_cmd conformance; then
  step conformance 150 "$BUILD/tools/dray" conformance --plugin "$PLUGIN"
else note SKIP conformance "this dray has no 'conformance' subcommand"; fi

# 4. Gemma 3 end to end on the GPU backend
cfg="$OUT/gpu-config.yaml"
printf 'model: %s\nbackend: %s\n' "$MODEL" "$PLUGIN" >"$cfg"
if [ ! -s "$MODEL" ]; then note SKIP run "no model at $MODEL (ci/setup.sh assembles it)"
elif has_cmd run; then
  step run 120 "$BUILD/tools/dray" run --config "$cfg" -p "The capital of France is" -n 64
  grep -i "tok/s\|tokens/s\|prefill\|decode" "$OUT/run.log" | tail -n 3 >>"$OUT/summary.txt"
else note SKIP run "this dray has no 'run' subcommand"; fi

# 5. benchmarks (optional; JSON lines in OUTDIR)
if has_cmd bench ops; then
  step bench-ops 120 "$BUILD/tools/dray" bench ops --plugin "$PLUGIN" --json "$OUT/bench-ops.jsonl"
else note SKIP bench-ops "this dray has no 'bench ops'"; fi
if [ -s "$MODEL" ] && has_cmd bench model; then
  step bench-model 150 "$BUILD/tools/dray" bench model --config "$cfg" --json "$OUT/bench-model.jsonl"
else note SKIP bench-model "no 'bench model' or no model"; fi

echo "total $(( $(date +%s) - START ))s" | tee -a "$OUT/summary.txt"
exit $failed
