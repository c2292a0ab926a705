#!/usr/bin/env bash
# Runs an end-to-end script (Python, in the project's .venv, against the real
# model). Arguments: SCRIPT [ARGS...]; an argument @MODEL@ becomes the model's path,
# @SMOLLM@ SmolLM2's.
# Exit 77 (skip) with a reason when the venv, the model or a package is missing.
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/.venv/bin/python"
model="${DRAY_MODEL:-$root/.models/gemma-3-270m-q4_k_m.gguf}"
[ -x "$py" ] || { echo "skip: no .venv (run ci/setup.sh)"; exit 77; }
[ -s "$model" ] || { echo "skip: no model at $model (run ci/setup.sh)"; exit 77; }
"$py" -c "import openai" 2>/dev/null || { echo "skip: no openai package in .venv (run ci/setup.sh)"; exit 77; }
command -v curl >/dev/null || { echo "skip: no curl (run ci/setup.sh)"; exit 77; }
smollm="$root/.models/smollm2-135m-instruct-q4_1.gguf"
"$py" -c "import jsonschema, pydantic" 2>/dev/null || { echo "skip: no jsonschema or pydantic in .venv (run ci/setup.sh)"; exit 77; }
script="$1"; shift
case " $* " in *" @SMOLLM@ "*) [ -s "$smollm" ] || { echo "skip: no model at $smollm (run ci/setup.sh)"; exit 77; };; esac
args=()
for a in "$@"; do
  case "$a" in @MODEL@) args+=("$model");; @SMOLLM@) args+=("$smollm");; *) args+=("$a");; esac
done
export PYTHONUNBUFFERED=1
exec "$py" "$root/tests/e2e/$script" "${args[@]}"
