#!/usr/bin/env bash
# Runs a reference check (Python, in the project's .venv, against the real model).
# Arguments: SCRIPT [ARGS...]; an argument @MODEL@ becomes the model's path.
# Exit 77 (skip) with a reason when the venv or the model is not set up.
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/.venv/bin/python"
model="${DRAY_MODEL:-$root/.models/gemma-3-270m-q4_k_m.gguf}"
smollm="$root/.models/smollm2-135m-instruct-q4_1.gguf"   # @SMOLLM@: the Llama-family model
[ -x "$py" ] || { echo "skip: no .venv (run ci/setup.sh)"; exit 77; }
for a in "$@"; do [ "$a" = "@SMOLLM@" ] && model="$smollm"; done
[ -s "$model" ] || { echo "skip: no model at $model (run ci/setup.sh)"; exit 77; }
script="$1"; shift
args=()
for a in "$@"; do
  case "$a" in @MODEL@|@SMOLLM@) args+=("$model") ;; *) args+=("$a") ;; esac
done
export PYTHONUNBUFFERED=1
exec "$py" "$root/tests/reference/$script" "${args[@]}"
