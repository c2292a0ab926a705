#!/usr/bin/env bash
# Speculative decoding by prompt lookup (lookup_draft) leaves dray run's tokens
# exactly as one token a step gives them, greedy and seeded sampling alike, on a
# tiny model and (when ci/setup.sh installed them) on both real models, and it
# keeps drafted tokens where the reply copies its prompt.
# Arguments: DRAY_EXE WRITE_TINY_GEMMA_EXE
set -uo pipefail
dray="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$2" "$tmp/tiny.gguf" || exit 1
root="${DRAY_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
fail=0
prompt='one two three four five six one two three four five six one two three four'
same() { # MODEL ARGS...: the ids with lookup drafts off and on agree
  local off on
  off="$("$dray" run -q -m "$1" -p "$prompt" -n 48 "${@:2}" --print-token-ids 2>&1 | tail -n 1)"
  on="$("$dray" run -m "$1" -p "$prompt" -n 48 "${@:2}" --set lookup_draft=8 --print-token-ids 2>"$tmp/err" | tail -n 1)"
  if [ -z "$off" ] || [ "$off" != "$on" ]; then
    echo "FAIL: $(basename "$1") $*: lookup drafts changed the tokens" >&2
    echo "  off: $off" >&2; echo "  on:  $on" >&2; fail=1
  fi
}
same "$tmp/tiny.gguf" --temp 0
same "$tmp/tiny.gguf" --temp 1 --seed 7
long="$(head -c 1800 /usr/share/common-licenses/GPL-3 2>/dev/null)" # ~400 tokens (Debian's base-files)
for m in gemma-3-270m-q4_k_m smollm2-135m-instruct-q4_1; do
  model="$root/.models/$m.gguf"
  [ -s "$model" ] || { echo "skip: no $model"; continue; }
  same "$model" --temp 0
  same "$model" --temp 0.8 --seed 3
  if ! grep -qE "lookup drafts: [1-9][0-9]* of" "$tmp/err"; then
    echo "FAIL: $m kept no drafted token of a reply that repeats its prompt:" >&2; cat "$tmp/err" >&2; fail=1
  fi
  # past 256 keys two threads cut a decode row's keys into chunks: the drafts'
  # rows must be cut the same way (cpu_attention_op.c)
  [ -z "$long" ] || prompt="$long" same "$model" --temp 0 -t 2
done
[ $fail -eq 0 ] && echo "ok: lookup drafts keep the tokens, and keep drafts where the text repeats"
exit $fail
