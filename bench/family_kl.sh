#!/usr/bin/env bash
# Every model family against llama.cpp on the same random-weight file: for
# each family (and RoPE-scaling variant) tests/reference/write_family.py
# writes an f32 GGUF with SmolLM2's tokenizer, llama.cpp's llama-perplexity
# writes the base log-probs, and dray reads them: f32 weights with an f16 KV
# (the KL that checks the math), then the default precision against dray's
# own f32 run. Prints one markdown row per file.
# Usage: LLAMA_BIN=/path/to/llama.cpp/build/bin bench/family_kl.sh [BUILD_DIR] [FAMILY[:VARIANT] ...]
#   CTX (default 128) tokens per chunk, CHUNKS (default 8), TEXT (bench/texts/varied.txt),
#   PLUGIN (default cpu), SHAPE (extra write_family.py flags).
# llama.cpp is a peer built elsewhere, never part of this tree.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
fams=${*:-llama llama:llama3 qwen2 qwen2:yarn qwen3 phi3 phi3:longrope gemma2 gemma3 gemma3:linear8 olmo2 granite smollm3}
: "${LLAMA_BIN:?set LLAMA_BIN to the build/bin folder of llama.cpp}"
ctx=${CTX:-128}
chunks=${CHUNKS:-8}
text=${TEXT:-bench/texts/varied.txt}
plugin=${PLUGIN:-cpu}
dray="$build/tools/dray"
py=.venv/bin/python
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-family-kl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

field() { sed -n "s/^$1 *: \([0-9.e+-]*\).*/\1/p" "$2" | head -1; }

echo "| family | tensors | mean KL vs llama.cpp (f32) | same top | KL default vs f32 | same top |"
echo "| --- | --- | --- | --- | --- | --- |"
for fv in $fams; do
  fam=${fv%%:*}; var=""; [ "$fam" != "$fv" ] && var=${fv#*:}
  f="$tmp/$fam$var.gguf"
  $py tests/reference/write_family.py "$fam" "$f" ${var:+--variant "$var"} ${SHAPE:-} >/dev/null
  n=$("$dray" info "$f" | sed -n 's/^tensors *\([0-9]*\).*/\1/p')
  "$LLAMA_BIN/llama-perplexity" -m "$f" -f "$text" -c "$ctx" --chunks "$chunks" -t 2 \
    --kl-divergence-base "$tmp/base.kld" >"$tmp/llama.txt" 2>&1 ||
    { echo "| $fv | $n | llama.cpp failed: $(grep -m1 -iE 'error|failed' "$tmp/llama.txt") | | | |"; continue; }
  "$dray" perplexity -m "$f" --backend "$plugin" --precision f32 --kv-dtype f16 -c "$ctx" \
    --kl-divergence --kl-divergence-base "$tmp/base.kld" >"$tmp/f32.txt" 2>&1 ||
    { echo "| $fv | $n | dray failed: $(tail -1 "$tmp/f32.txt") | | | |"; continue; }
  # the default precision against dray's own f32 run
  "$dray" perplexity -q -m "$f" -f "$text" -c "$ctx" --chunks "$chunks" --backend "$plugin" --precision f32 \
    --kv-dtype f16 --kl-divergence-base "$tmp/self.kld" >/dev/null 2>&1
  "$dray" perplexity -m "$f" --backend "$plugin" -c "$ctx" --kl-divergence --kl-divergence-base "$tmp/self.kld" \
    >"$tmp/def.txt" 2>&1 || true
  echo "| $fv | $n | $(field 'mean KL' "$tmp/f32.txt") | $(field 'same top token' "$tmp/f32.txt")% |" \
       "$(field 'mean KL' "$tmp/def.txt") | $(field 'same top token' "$tmp/def.txt")% |"
done
