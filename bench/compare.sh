#!/usr/bin/env bash
# dray next to llama.cpp and ik_llama.cpp on the same GGUF with the same threads:
# prefill of 512 tokens (pp512) and 128 decode steps from an empty cache (tg128,
# logits and a greedy pick every step in dray, as llama-bench's tg does), plus
# dray's decode after the 512-token prompt and its batch-8 decode.
# Medians of REPS rounds, each round running dray, then llama.cpp, then
# ik_llama.cpp. A peer runs only when its build folder is given (never built
# here), at its best settings: llama.cpp over -fa 0,1, ik_llama.cpp over -fa 0,1
# and -rtr 0,1; each test reports the peer's best setting (by its median).
#   bench/compare.sh [-m MODEL] [-t THREADS] [-r REPS] [-s KEY=VALUE]... [LLAMA_BUILD_DIR [IK_LLAMA_BUILD_DIR]]
# -s passes a config setting to every dray command (e.g. -s activations=int8).
# A build folder holds llama-bench (or bin/llama-bench); "-" skips llama.cpp.
# Env: DRAY (the binary).
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
find_bench() { # DIR: its llama-bench
  for c in "$1/llama-bench" "$1/bin/llama-bench"; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  echo "compare.sh: no llama-bench in $1 or $1/bin" >&2
  return 1
}
llama_bench=""
ik_bench=""
if [ -n "${1:-}" ] && [ "$1" != "-" ]; then llama_bench="$(find_bench "$1")" || exit 2; fi
if [ -n "${2:-}" ]; then ik_bench="$(find_bench "$2")" || exit 2; fi
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
# one round of every program after another, REPS rounds: a VM whose speed drifts
# over minutes then moves all three alike instead of whichever ran last
for i in $(seq "$reps"); do
  "$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 512 --decode 128 --json "$tmp/dray.jsonl" >/dev/null
  # llama-bench's tg128 decodes from an empty cache: the same work is one token of prompt
  "$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 1 --decode 128 --json "$tmp/dray0.jsonl" >/dev/null
  "$dray" run -m "$model" -t "$threads" "${sets[@]}" -c 656 --prompt-ids "$ids" -n 128 --temp 0 2>>"$tmp/run.txt" >/dev/null
  "$dray" bench model -m "$model" -t "$threads" "${sets[@]}" --prefill 64 --decode 128 --batch 8 \
    --json "$tmp/dray8.jsonl" >/dev/null
  if [ -n "$llama_bench" ]; then
    "$llama_bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -fa 0,1 -o json >"$tmp/llama.$i.json"
  fi
  if [ -n "$ik_bench" ]; then
    "$ik_bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -fa 0,1 -rtr 0,1 -o json >"$tmp/ik.$i.json"
  fi
done

python3 - "$tmp" "$threads" "$reps" "$model" "${sets[*]:-}" <<'PY'
import json, os, statistics, sys
tmp, threads, reps, model, sets = sys.argv[1:]
def lines(name):
    with open(os.path.join(tmp, name)) as f:
        return [json.loads(l) for l in f if l.strip()]
d1, d0, d8 = lines("dray.jsonl"), lines("dray0.jsonl"), lines("dray8.jsonl")
med = lambda rows, key: statistics.median(r[key] for r in rows)
def peer(name):
    """A peer's best tok/s per test over the settings it ran with: the median of
    each setting's rounds (entry i of every round's file), then the best."""
    runs = {}
    for i in range(1, int(reps) + 1):
        path = os.path.join(tmp, f"{name}.{i}.json")
        if os.path.exists(path):
            with open(path) as f:
                for n, r in enumerate(json.load(f)):
                    test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
                    runs.setdefault((test, n), []).append(r["avg_ts"])
    best = {}
    for (test, _), v in runs.items():
        best[test] = max(best.get(test, 0), statistics.median(v))
    return best
llama, ik = peer("llama"), peer("ik")
import re
runs = [tuple(map(float, m)) for m in re.findall(
    r"prefill \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\); decode \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\)",
    open(os.path.join(tmp, "run.txt")).read())]
rows = [("pp512", med(d1, "prefill_tps")), ("tg128", med(d0, "decode_tps")),
        ("tg128 after pp512 (context 512-640)", med(d1, "decode_tps")),
        ("tg128, batch 8 (tok/s of all 8)", med(d8, "decode_tps"))]
if runs:
    rows += [("dray run: prefill 512", statistics.median(r[0] for r in runs)),
             ("dray run: decode 128 (greedy)", statistics.median(r[1] for r in runs))]
print(f"{os.path.basename(model)}, {threads} threads, medians of {reps} runs "
      f"(dray {d1[0]['precision']} weights, {d1[0].get('activations', '?')} activations, {d1[0].get('head', '?')} head, {d1[0]['kv']} KV, "
      f"plugin {d1[0]['plugin']}"
      f"{', ' + sets if sets else ''})")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}")
print("| test | dray tok/s | llama.cpp tok/s | dray / llama.cpp | ik_llama.cpp tok/s | dray / ik_llama.cpp |")
print("| --- | --- | --- | --- | --- | --- |")
fmt = lambda x: f"{x:.1f}" if x else "-"
ratio = lambda v, x: f"{v / x:.2f}x" if x else "-"
for test, v in rows:
    key = test if test in ("pp512", "tg128") else None
    l, k = llama.get(key), ik.get(key)
    print(f"| {test} | {v:.1f} | {fmt(l)} | {ratio(v, l)} | {fmt(k)} | {ratio(v, k)} |")
PY
