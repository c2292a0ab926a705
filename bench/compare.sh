#!/usr/bin/env bash
# dray next to llama.cpp on the same GGUF with the same threads: prefill of 512
# tokens (pp512) and 128 decode steps (tg128, logits and a greedy pick every step
# in dray, as llama-bench's tg does), plus dray's batch-8 decode. Medians of REPS
# runs. llama.cpp is only run when its build folder is given (never built here).
#   bench/compare.sh [-m MODEL] [-t THREADS] [-r REPS] [-s KEY=VALUE]... [LLAMA_BUILD_DIR]
# -s passes a config setting to every dray command (e.g. -s activations=int8).
# LLAMA_BUILD_DIR holds llama-bench (or bin/llama-bench). Env: DRAY (the binary).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dray="${DRAY:-$root/build/tools/dray}"
model="$root/.models/gemma-3-270m-q4_k_m.gguf"
threads=2
reps=3
sets=()
while getopts "m:t:r:s:" o; do
  case $o in m) model="$OPTARG" ;; t) threads="$OPTARG" ;; r) reps="$OPTARG" ;; s) sets+=(--set "$OPTARG") ;;
    *) exit 2 ;; esac
done
shift $((OPTIND - 1))
llama_dir="${1:-}"
llama_bench=""
if [ -n "$llama_dir" ]; then
  for c in "$llama_dir/llama-bench" "$llama_dir/bin/llama-bench"; do
    [ -x "$c" ] && llama_bench="$c" && break
  done
  [ -n "$llama_bench" ] || { echo "compare.sh: no llama-bench in $llama_dir or $llama_dir/bin" >&2; exit 2; }
fi
[ -s "$model" ] || { echo "compare.sh: no model at $model (run ci/setup.sh or pass -m)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# dray run on the prompt bench model uses (its token stream), greedy, 128 tokens:
# the bench must report what a user sees
"$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 8 --decode 1 --json "$tmp/vocab.jsonl" >/dev/null
ids="$(python3 -c "import json, sys
v = json.loads(open(sys.argv[1]).readline())['n_vocab']
span, base = (v - 2000, 1000) if v > 3000 else (v - 1, 1)  # bench_model.c token_at()
print(','.join(str(base + (i * 2654435761 % 2**32) % span) for i in range(512)))" "$tmp/vocab.jsonl")"
for _ in $(seq "$reps"); do
  "$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 512 --decode 128 --json "$tmp/dray.jsonl" >/dev/null
  "$dray" run -m "$model" -t "$threads" "${sets[@]}" -c 656 --prompt-ids "$ids" -n 128 --temp 0 2>>"$tmp/run.txt" >/dev/null
  "$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 64 --decode 128 --batch 8 \
    --json "$tmp/dray8.jsonl" >/dev/null
done
if [ -n "$llama_bench" ]; then
  "$llama_bench" -m "$model" -t "$threads" -p 512 -n 128 -r "$reps" -o json >"$tmp/llama.json"
fi

python3 - "$tmp" "$threads" "$reps" "$model" "${sets[*]:-}" <<'PY'
import json, os, statistics, sys
tmp, threads, reps, model, sets = sys.argv[1:]
def lines(name):
    with open(os.path.join(tmp, name)) as f:
        return [json.loads(l) for l in f if l.strip()]
d1, d8 = lines("dray.jsonl"), lines("dray8.jsonl")
med = lambda rows, key: statistics.median(r[key] for r in rows)
llama = {}
path = os.path.join(tmp, "llama.json")
if os.path.exists(path):
    with open(path) as f:
        for r in json.load(f):
            test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
            llama[test] = r["avg_ts"]
import re
runs = [tuple(map(float, m)) for m in re.findall(
    r"prefill \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\); decode \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\)",
    open(os.path.join(tmp, "run.txt")).read())]
rows = [("pp512", med(d1, "prefill_tps")), ("tg128", med(d1, "decode_tps")),
        ("tg128, batch 8 (tok/s of all 8)", med(d8, "decode_tps"))]
if runs:
    rows += [("dray run: prefill 512", statistics.median(r[0] for r in runs)),
             ("dray run: decode 128 (greedy)", statistics.median(r[1] for r in runs))]
print(f"{os.path.basename(model)}, {threads} threads, medians of {reps} runs "
      f"(dray {d1[0]['precision']} weights, {d1[0].get('activations', '?')} activations, {d1[0].get('head', '?')} head, {d1[0]['kv']} KV, "
      f"plugin {d1[0]['plugin']}"
      f"{', ' + sets if sets else ''})")
print("| test | dray tok/s | llama.cpp tok/s | dray / llama.cpp |")
print("| --- | --- | --- | --- |")
for test, v in rows:
    l = llama.get(test.split(",")[0]) if test in ("pp512", "tg128") else None
    print(f"| {test} | {v:.1f} | {f'{l:.1f}' if l else '-'} | {f'{v / l:.2f}x' if l else '-'} |")
PY
