#!/usr/bin/env bash
# Quantization quality against full precision (the README's Accuracy protocol): the first
# CHUNKS chunks of 512 tokens of each text, BOS per chunk, second half scored;
# the base is the same weights in f32 with an f16 KV cache. Prints one markdown
# table row per path: mean KL (+/- standard error), same top token, PPL.
#   bench/quality.sh [-m MODEL] [-t THREADS] [TEXT...]
# Defaults: the model ci/setup.sh installs, Debian's GPL-3 text and
# bench/texts/varied.txt. Env: DRAY (the binary, default build/tools/dray), CHUNKS (2).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dray="${DRAY:-$root/build/tools/dray}"
model="$root/.models/gemma-3-270m-q4_k_m.gguf"
threads=2
chunks="${CHUNKS:-2}"
while getopts "m:t:" o; do
  case $o in m) model="$OPTARG" ;; t) threads="$OPTARG" ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
texts=("$@")
[ ${#texts[@]} -gt 0 ] || texts=(/usr/share/common-licenses/GPL-3 "$root/bench/texts/varied.txt")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
common=(-q -m "$model" -t "$threads" -c 512 --chunks "$chunks")
paths=(
  "w4a8 default (4-bit where the file is, grouped int8 elsewhere, activations: auto = the family's, int8 KV)|"
  "w4a8, two-pass activations (activations: int8x2), int8 KV|--set activations=int8x2"
  "w4a8, two-pass activations, f16 KV|--set activations=int8x2 --kv-dtype f16"
  "w4a8, one-pass activations (activations: int8), int8 KV|--set activations=int8"
  "w4a8, one-pass activations, f16 KV|--set activations=int8 --kv-dtype f16"
  "w4a8, 8-bit head (head_precision: int8g; auto is the rescored 4-bit head under one-pass activations), int8 KV|--set head_precision=int8g"
  "w4a8, two-pass activations, rescored 4-bit head (head_precision: w4a8), int8 KV|--set activations=int8x2 --set head_precision=w4a8"
  "w4a8 + 4-bit head, not rescored (opt-in, lossy), int8 KV|--set head_precision=w4a8 --set head_rescore=0"
  "int8g (grouped int8 everywhere), two-pass activations, int8 KV|--precision int8g --set activations=int8x2"
  "int8g, one-pass activations, int8 KV|--precision int8g --set activations=int8"
  "int8 (W8A8 per row + outliers), int8 KV|--precision int8"
  "int8, f16 KV|--precision int8 --kv-dtype f16"
  "f32 weights, int8 KV|--precision f32 --kv-dtype int8"
  "int8, outlier channels off|--precision int8 --set outlier_channels=0"
)
for text in "${texts[@]}"; do
  base="$tmp/base.kld"
  base_ppl="$("$dray" perplexity "${common[@]}" -f "$text" --precision f32 --kv-dtype f16 \
    --kl-divergence-base "$base" | sed -n 's/^PPL = \([0-9.]*\).*/\1/p')"
  echo
  echo "$(basename "$text"), first $chunks chunks of 512 tokens (base PPL $base_ppl):"
  echo "| path | mean KL vs f32 | same top token | PPL |"
  echo "| --- | --- | --- | --- |"
  for p in "${paths[@]}"; do
    name="${p%%|*}"
    # shellcheck disable=SC2206 # the flags are words on purpose
    flags=(${p#*|})
    out="$("$dray" perplexity "${common[@]}" "${flags[@]}" --kl-divergence --kl-divergence-base "$base")"
    kl="$(sed -n 's/^mean KL *: //p' <<<"$out")"
    top="$(sed -n 's/^same top token *: //p' <<<"$out")"
    ppl="$(sed -n 's/^PPL  *: \([0-9.]*\).*/\1/p' <<<"$out")"
    echo "| $name | $kl | $top | $ppl |"
  done
done
