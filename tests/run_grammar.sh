#!/usr/bin/env bash
# dray run --grammar FILE: the output follows the GBNF grammar and stops where
# nothing may follow; a grammar that does not compile is refused before the
# model loads, naming the file, the line and the column.
# Arguments: DRAY_EXE WRITE_TINY_GEMMA_EXE
set -uo pipefail
dray="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$2" "$tmp/tiny.gguf" || exit 1
fail=0
printf 'root ::= " id-" [0-9] [0-9]? "."\n' > "$tmp/g.gbnf"
for seed in 1 2 3; do
  out="$("$dray" run -q -m "$tmp/tiny.gguf" -p "x" -n 40 --temp 1 --seed "$seed" --grammar "$tmp/g.gbnf" 2>&1)"
  if ! grep -qxE 'x id-[0-9][0-9]?\.' <<<"$out"; then
    echo "FAIL: seed $seed: the output does not follow the grammar: '$out'" >&2; fail=1
  fi
done
printf 'root ::= "a"\nroot ::= "b"\n' > "$tmp/bad.gbnf"
out="$("$dray" run -m "$tmp/tiny.gguf" -p x --grammar "$tmp/bad.gbnf" 2>&1)"; rc=$?
if [ $rc -ne 2 ] || ! grep -q "grammar file $tmp/bad.gbnf: grammar: line 2, column" <<<"$out"; then
  echo "FAIL: a bad grammar: rc $rc, '$out'" >&2; fail=1
fi
out="$("$dray" run -m "$tmp/tiny.gguf" -p x --grammar "$tmp/none.gbnf" 2>&1)"; rc=$?
[ $rc -ne 0 ] && grep -q "cannot read grammar file" <<<"$out" || { echo "FAIL: a missing grammar file: '$out'" >&2; fail=1; }
[ $fail -eq 0 ] && echo "ok: dray run --grammar follows the grammar and refuses a bad one"
exit $fail
