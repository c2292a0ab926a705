#!/usr/bin/env bash
# dray run and dray perplexity size the KV cache for the one sequence they run;
# the config file or --set max_seqs still decides when given, and the tokens do
# not depend on it.
# Arguments: DRAY_EXE WRITE_TINY_GEMMA_EXE
set -uo pipefail
dray="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$2" "$tmp/tiny.gguf" || exit 1
fail=0
run() { # WORDS ARGS...: the report names WORDS; prints the ids (nothing on failure)
  local words="$1"
  shift
  out="$("$dray" run -m "$tmp/tiny.gguf" --prompt-ids 2,17,40 -n 6 --temp 0 --print-token-ids "$@" 2>&1)"
  if [ $? -ne 0 ] || ! grep -q -- "$words" <<<"$out"; then
    echo "FAIL: run $* -> no '$words' in:" >&2; echo "$out" >&2; return
  fi
  grep -v '^dray: ' <<<"$out" | tail -n 1 # the ids: the last line of stdout
}
one="$(run "for 1 seq x")"
three="$(run "for 3 seq x" --set max_seqs=3)"
printf 'max_seqs: 3\n' > "$tmp/c.yaml"
file="$(run "for 3 seq x" --config "$tmp/c.yaml")"
echo "tokens: $one / $three / $file"
[ -n "$one" ] && [ "$one" = "$three" ] && [ "$one" = "$file" ] || { echo "FAIL: the tokens depend on max_seqs"; fail=1; }
[ $fail -eq 0 ] && echo "ok: run sizes the KV for 1 sequence unless max_seqs is given"
exit $fail
