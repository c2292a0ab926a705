#!/usr/bin/env bash
# The same greedy prompt gives the same int8 tokens whatever the context length
# and the prefill chunk (calibration once depended on both).
# Arguments: DRAY_EXE. Exit 77 (skip, reported) when the model is not set up.
set -uo pipefail
dray="$1"
. "$(dirname "$0")/model_env.sh"
prompt="The capital of France is"
want=""
status=0
for opts in "-c 64" "-c 128" "-c 4096" "--chunk 1" "--chunk 16" "--chunk 512"; do
  # shellcheck disable=SC2086 # opts is two words on purpose
  got="$("$dray" run -q -m "$model" $opts -n 24 --temp 0 --print-token-ids -p "$prompt" | tail -n 1)"
  rc=$?
  if [ "$rc" -ne 0 ] || [ -z "$got" ]; then echo "FAIL: dray run $opts exited $rc"; exit 1; fi
  echo "$opts: $got"
  if [ -z "$want" ]; then want="$got"
  elif [ "$got" != "$want" ]; then echo "FAIL: $opts gives other tokens than the first run"; status=1; fi
done
exit $status
