#!/usr/bin/env bash
# dray run's stats (stderr) stand on a line of their own after the generated text
# (stdout), also when both go to one pipe, where stdout is buffered: what
# ci/main.sh shows a newcomer first. Arguments: DRAY_EXE WRITE_TINY_GEMMA_EXE
set -uo pipefail
dray="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$2" "$tmp/tiny.gguf" || exit 1
out="$("$dray" run -m "$tmp/tiny.gguf" -n 6 --temp 0 -p "hello" 2>&1 | cat)"
rc=$?
stats="$(grep -- 'dray: prefill' <<<"$out")"
if [ "$rc" -ne 0 ] || [ -z "$stats" ] || grep -qv '^dray: prefill' <<<"$stats"; then
  echo "FAIL: exit $rc; the stats do not start a line of their own in:"; echo "$out"; exit 1
fi
echo "ok: $stats"
