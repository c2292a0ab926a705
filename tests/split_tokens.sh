#!/usr/bin/env bash
# Gemma 3 270M split over the CPU and an accelerator plugin gives exactly the
# single CPU's greedy tokens at f32 weights with an f16 KV (issue 27's target).
# Arguments: DRAY_EXE. Exit 77 (skip, reported) when the model is not set up.
set -uo pipefail
dray="$1"
. "$(dirname "$0")/model_env.sh"
prompt="The capital of France is"
exact=(--set precision=f32 --set kv_dtype=f16)

# tokens BACKEND [SETTINGS...]: the greedy token ids, or exit 1 naming the run.
tokens() {
  local backend="$1"; shift
  local out rc
  out="$("$dray" run -m "$model" --set "backend=$backend" "${exact[@]}" "$@" \
         -n 16 --temp 0 --print-token-ids -p "$prompt" 2>&1)"
  rc=$?
  if [ "$rc" -ne 0 ]; then echo "FAIL: backend=$backend $* exited $rc:"; echo "$out"; exit 1; fi
  # A split must say where its layers went; one device prints no split line.
  if [[ "$backend" == *,* ]] && ! grep -q '^dray: split: device 2' <<<"$out"; then
    echo "FAIL: backend=$backend printed no placement for device 2:"; echo "$out"; exit 1
  fi
  grep -E '^[0-9]+( [0-9]+)+$' <<<"$out" | tail -n 1
}

want="$(tokens cpu)"
[ -n "$want" ] || { echo "FAIL: the CPU run printed no token ids"; exit 1; }
echo "cpu: $want"
status=0
check() {
  local name="$1" accel="${2##*,}" got
  shift
  if ! "$dray" devices 2>/dev/null | grep -A3 "^  $accel " | grep -q 'device 0:'; then
    echo "skip $name: no $accel device here"; return
  fi
  got="$(tokens "$@")" || { echo "$got"; status=1; return; }
  echo "$name: $got"
  [ "$got" = "$want" ] || { echo "FAIL: $name gives other tokens than one CPU"; status=1; }
}
# The head (60% of a decode step's bytes) goes with the last layers by default,
# so the first check runs it on OpenCL; the second keeps it on the CPU.
check "cpu,opencl head on opencl" cpu,opencl --set layer_split=1,1
check "cpu,vulkan head on cpu" cpu,vulkan --set layer_split=1,1 --set head_device=1
check "cpu,cpu,cpu" cpu,cpu,cpu
exit $status
