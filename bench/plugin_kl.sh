#!/usr/bin/env bash
# Every plugin at the default precision against full precision: for each text,
# the CPU plugin's f32 weights with an f16 KV write the base log-probs once,
# then each plugin runs the default config (no precision flags) and reports
# its mean KL, same-top rate and fallback lines (there should be none).
# Usage: bench/plugin_kl.sh [BUILD_DIR] [MODEL] [PLUGINS]
#   defaults: build-ci, .models/gemma-3-270m-q4_k_m.gguf, "cpu opencl vulkan"
# CHUNKS (default 4) chunks of 512 tokens per text; TEXTS (default GPL-3 and
# bench/texts/varied.txt). Prints one markdown row per text and plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-ci}
model=${2:-.models/gemma-3-270m-q4_k_m.gguf}
plugins=${3:-cpu opencl vulkan}
chunks=${CHUNKS:-4}
texts=${TEXTS:-/usr/share/common-licenses/GPL-3 bench/texts/varied.txt}
dray="$build/tools/dray"
[ -x "$dray" ] || { echo "plugin_kl: $dray is missing: build first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dray-plugin-kl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "| text | plugin | mean KL | same top | fallback lines |"
echo "| --- | --- | --- | --- | --- |"
for text in $texts; do
  base="$tmp/base.kld"
  "$dray" perplexity -q -m "$model" -f "$text" --chunks "$chunks" --precision f32 --kv-dtype f16 \
    --backend cpu --kl-divergence-base "$base" >/dev/null
  for p in $plugins; do
    out="$tmp/$p.txt"
    "$dray" perplexity -m "$model" --backend "$p" --kl-divergence --kl-divergence-base "$base" >"$out" 2>&1
    kl=$(sed -n 's/^mean KL *: \([0-9.e+-]*\).*/\1/p' "$out")
    top=$(sed -n 's/^same top token *: \([0-9.]*\).*/\1/p' "$out")
    fb=$(grep -c -E "does not declare|using int8" "$out" || true)
    echo "| $(basename "$text") | $p | $kl | $top% | $fb |"
  done
done
