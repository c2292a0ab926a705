#!/usr/bin/env bash
# dray bench model on a tiny model: it runs prefill and decode with logits (batch
# 1 and lockstep batch 3), writes its JSON line, and refuses bad numbers with a
# message (no atoi: '-1' must not become 4294967295 tokens).
# Arguments: DRAY_EXE WRITE_TINY_GEMMA_EXE
set -uo pipefail
dray="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$2" "$tmp/tiny.gguf" || exit 1
fail=0
check() { # EXPECTED_RC WORDS ARGS...
  local want="$1" words="$2"
  shift 2
  out="$("$dray" bench model -m "$tmp/tiny.gguf" "$@" 2>&1)"
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$words" <<<"$out"; then
    echo "FAIL: bench model $* -> exit $rc (want $want), no '$words' in:"; echo "$out"; fail=1
  else
    echo "ok: bench model $* -> exit $rc, '$words'"
  fi
}
check 0 "1 sequence in lockstep, logits + greedy pick" --prefill 8 --decode 4 --json "$tmp/b.jsonl"
check 0 "3 sequences in lockstep" --prefill 8 --decode 4 --batch 3 --json "$tmp/b.jsonl"
[ "$(grep -c '"decode_tps"' "$tmp/b.jsonl")" -eq 2 ] || { echo "FAIL: two JSON lines expected"; fail=1; }
check 2 "--prefill expects a whole number" --prefill -1
check 2 "--decode expects a whole number" --decode abc
check 2 "--batch expects a whole number" --batch 0
check 2 "--batch expects a whole number" --batch 257
check 2 "--prefill expects a whole number" --prefill 99999999999999999999
check 2 "--mem-bw expects a number" --mem-bw nan
check 2 "no value after" --decode
check 2 "unknown option" --bogus 1
exit $fail
