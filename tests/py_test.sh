#!/usr/bin/env bash
# Runs a Python test script of tests/ in the project's .venv (numpy, gguf).
# Arguments: SCRIPT [ARGS...]. Exit 77 (skip, reported) when the venv is not set up.
root="$(cd "$(dirname "$0")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "skip: no .venv (run ci/setup.sh)"; exit 77; }
script="$1"; shift
export PYTHONUNBUFFERED=1
exec "$py" "$root/tests/$script" "$@"
