#!/usr/bin/env bash
# dray next to llama.cpp and ik_llama.cpp at the size people run, with the
# physical limit printed beside each figure. Steps:
#  1. writes (once) a GGUF of a real model's shape with random Q4_K_M-style
#     blocks (bench/write_quantized.py: Llama-3.1-8B by default, SmolLM2's
#     tokenizer) and checks that dray info and, when given, llama.cpp load it;
#  2. times `dray run -n 1` from a cold start (the file evicted from the page
#     cache, an empty dray cache folder) and a warm one, with their peak RSS;
#  3. runs ROUNDS alternating rounds: dray bench model, then llama.cpp's
#     llama-bench (-fa 0,1), then ik_llama.cpp's (-fa 1 -rtr 0,1); each peer at
#     its best setting (best of the settings' medians);
#  4. prints a markdown table and one JSON line per engine (bench "scale").
# Usage:
#   bench/scale.sh [-s 8b|1b|tiny] [-m FILE] [-r ROUNDS] [-p PREFILL] [-n DECODE] [-t THREADS] [-j OUT.jsonl]
# Env (the same as the flags): SHAPE (8b), MODEL (.models/scale-SHAPE-q4_k_m.gguf),
#   ROUNDS (3), PREFILL (128), DECODE (16), THREADS (2); LLAMA_BIN / IK_BIN: the
#   llama-bench binary or a folder holding it (or bin/llama-bench) of each peer,
#   built elsewhere, never here; DRAY (the binary), PYTHON (with numpy and gguf).
# -j appends the JSON lines to a file as well.
# Columns:
#   prefill / decode tok/s  medians of the rounds (peers: their best setting's)
#   MB/step     bytes one decode step reads. dray: the weights its bench model
#               reports (prepared layout, output head included; KV and logits
#               are left out, as for the peers). Peers: the file's bytes of every
#               matrix of the layers plus the output head (not token_embd, of
#               which a step reads one row); their KV is < 1% at these lengths.
#   file MB/step  the same count for the file: the least any engine must read.
#   roofline    read GB/s / file MB/step: the decode tok/s no engine can pass.
#               The GB/s is the best of the rounds' read-bandwidth probes of dray
#               bench model (bench/read_bw.c, a buffer of dray's step bytes, the
#               bench's threads), so it is measured in the same run.
#   % roofline  decode tok/s / roofline. Above 100% is impossible: the row is
#               flagged "BENCH BUG" (a figure that did not read its bytes).
#   % own       decode tok/s / (GB/s / the engine's own MB/step): how close the
#               engine comes to the limit of the bytes it chose to read.
#   start cold / warm, peak RSS   `dray run -n 1` (wall s, max RSS); peers: the
#               peak RSS of their llama-bench process (no start time).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dray="${DRAY:-$root/build/tools/dray}"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
shape="${SHAPE:-8b}" model="${MODEL:-}" rounds="${ROUNDS:-3}" prefill="${PREFILL:-128}"
decode="${DECODE:-16}" threads="${THREADS:-2}" json_out=""
while getopts "s:m:r:p:n:t:j:" o; do
  case $o in s) shape="$OPTARG" ;; m) model="$OPTARG" ;; r) rounds="$OPTARG" ;; p) prefill="$OPTARG" ;;
    n) decode="$OPTARG" ;; t) threads="$OPTARG" ;; j) json_out="$OPTARG" ;; *) exit 2 ;; esac
done
model="${model:-$root/.models/scale-$shape-q4_k_m.gguf}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/dray-scale.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# dray's caches in a folder of this run: the cold start finds it empty, and the
# user's own cache is neither used nor filled
export DRAY_CACHE_DIR="$tmp/cache"
mkdir -p "$DRAY_CACHE_DIR"

find_bench() { # NAME PATH: PATH's llama-bench (PATH: the binary or a folder holding it)
  for c in "$2" "$2/llama-bench" "$2/bin/llama-bench"; do
    [ -f "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  echo "scale.sh: no llama-bench at $2 ($1)" >&2
  return 1
}
llama_bench="" ik_bench=""
[ -n "${LLAMA_BIN:-}" ] && { llama_bench="$(find_bench LLAMA_BIN "$LLAMA_BIN")" || exit 2; }
[ -n "${IK_BIN:-}" ] && { ik_bench="$(find_bench IK_BIN "$IK_BIN")" || exit 2; }

# 1. the file, written once; a fresh one is checked with every engine at hand
write_model() {
  mkdir -p "$(dirname "$model")"
  (cd "$root" && "$py" bench/write_quantized.py "$model.part" --shape "$shape")
  mv "$model.part" "$model"
  "$dray" info "$model" >"$tmp/info.txt"
  grep -q 'runs with dray *: *yes' "$tmp/info.txt" || { cat "$tmp/info.txt" >&2; echo "scale.sh: dray cannot run $model" >&2; exit 1; }
  if [ -n "$llama_bench" ]; then # one token: does llama.cpp load it?
    "$llama_bench" -m "$model" -t "$threads" -p 0 -n 1 -r 1 -o json >/dev/null 2>"$tmp/check.err" ||
      { cat "$tmp/check.err" >&2; echo "scale.sh: llama.cpp cannot load $model" >&2; exit 1; }
  fi
}
if [ ! -s "$model" ]; then write_model; fi

# 2. start-up: `dray run -n 1`, cold (the file out of the page cache) then warm
evict() { # FILE: drops its pages from the page cache (its own pages only)
  "$py" -c "import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$1"
}
start_run() { # NAME: one timed `dray run -n 1`, its /usr/bin/time -v report in $tmp/NAME.time
  /usr/bin/time -v -o "$tmp/$1.time" "$dray" run -m "$model" -t "$threads" -p "The capital of France is" \
    -n 1 --temp 0 >/dev/null 2>"$tmp/$1.err" || { cat "$tmp/$1.err" >&2; exit 1; }
}
evict "$model"
# what is left of the file in the page cache at the cold start (fincore, if any)
{ fincore --bytes --noheadings -o RES "$model" 2>/dev/null || echo -1; } >"$tmp/resident.txt"
start_run cold
start_run warm

# 3. alternating rounds: a VM whose speed drifts over minutes moves all engines alike
for i in $(seq "$rounds"); do
  "$dray" bench model -m "$model" -t "$threads" --prefill "$prefill" --decode "$decode" \
    --json "$tmp/dray.jsonl" >>"$tmp/dray.txt"
  if [ -n "$llama_bench" ]; then
    /usr/bin/time -v -o "$tmp/llama.$i.time" "$llama_bench" -m "$model" -t "$threads" -p "$prefill" \
      -n "$decode" -r 1 -fa 0,1 -o json >"$tmp/llama.$i.json" 2>"$tmp/llama.err" || { cat "$tmp/llama.err" >&2; exit 1; }
  fi
  if [ -n "$ik_bench" ]; then
    /usr/bin/time -v -o "$tmp/ik.$i.time" "$ik_bench" -m "$model" -t "$threads" -p "$prefill" \
      -n "$decode" -r 1 -fa 1 -rtr 0,1 -o json >"$tmp/ik.$i.json" 2>"$tmp/ik.err" || { cat "$tmp/ik.err" >&2; exit 1; }
  fi
done

# 4. the report
"$py" - "$tmp" "$model" "$shape" "$rounds" "$prefill" "$decode" "$threads" "$json_out" <<'PY'
import glob, json, os, re, statistics, subprocess, sys
import gguf
tmp, model, shape, rounds, P, D, threads, json_out = sys.argv[1:]
med = statistics.median

def time_v(path):
    """(wall s, peak RSS bytes) from a /usr/bin/time -v report."""
    t = open(path).read()
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", t)
    h, m, s = wall.groups()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
    return int(h or 0) * 3600 + int(m) * 60 + float(s), rss * 1024

def file_step_bytes(path):
    """Bytes of the tensors one decode step reads: every matrix of the layers and
    the output head (token_embd when the head is tied); norms are left out."""
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    return sum(int(t.n_bytes) for t in r.tensors
               if t.name == head or (t.name.startswith("blk.") and len(t.shape) >= 2))

def dray_rows():
    """dray's rounds: JSON lines plus the step's weight bytes from the text."""
    rows = [json.loads(l) for l in open(os.path.join(tmp, "dray.jsonl")) if l.strip()]
    txt = open(os.path.join(tmp, "dray.txt")).read()
    weights = [float(x) * 1e6 for x in re.findall(r"roofline: a step reads [\d.]+ MB \(weights ([\d.]+)", txt)]
    held = [float(x) * 1e6 for x in re.findall(r"^model .* weights \S+ ([\d.]+) MB", txt, re.M)]
    for r, w, h in zip(rows, weights, held):
        r["weight_step_bytes"], r["weights_held_bytes"] = w, h
        r["read_gbps"] = r["roofline_steps_per_s"] * r["step_bytes"] / 1e9
    return rows

def peer(name):
    """A peer's best setting: per (test, setting) the median of the rounds, then
    the best per test. Returns ({test: (tok/s, setting)}, peak RSS bytes)."""
    runs, rss = {}, []
    for path in sorted(glob.glob(os.path.join(tmp, f"{name}.*.json"))):
        for r in json.load(open(path)):
            test = "pp" if r["n_gen"] == 0 else "tg"
            rtr = next((int(r[k]) for k in ("repack", "rtr", "run_time_repack") if k in r), None)  # ik_llama.cpp
            setting = f"fa {int(r.get('flash_attn', 0))}" + ("" if rtr is None else f" rtr {rtr}")
            runs.setdefault((test, setting), []).append(r["avg_ts"])
        rss.append(time_v(path[:-5] + ".time")[1])
    best = {}
    for (test, setting), v in runs.items():
        if med(v) > best.get(test, (0, ""))[0]:
            best[test] = (med(v), setting)
    return best, max(rss) if rss else 0

d = dray_rows()
bw = max(r["read_gbps"] for r in d)
fbytes = file_step_bytes(model)
roof = bw * 1e9 / fbytes
resident = int(open(os.path.join(tmp, "resident.txt")).read().split()[0])
cold, warm = time_v(os.path.join(tmp, "cold.time")), time_v(os.path.join(tmp, "warm.time"))
engines = [dict(engine="dray", setting=f"{d[0]['precision']}, {d[0]['activations']} act, {d[0]['head']} head",
                prefill_tps=med(r["prefill_tps"] for r in d), decode_tps=med(r["decode_tps"] for r in d),
                step_bytes=med(r["weight_step_bytes"] for r in d), weights_held_bytes=d[0]["weights_held_bytes"],
                cold_start_s=cold[0], warm_start_s=warm[0], peak_rss_bytes=max(cold[1], warm[1]))]
for name, label in (("llama", "llama.cpp"), ("ik", "ik_llama.cpp")):
    best, rss = peer(name)
    if best:
        engines.append(dict(engine=label, setting=f"pp {best['pp'][1]}, tg {best['tg'][1]}",
                            prefill_tps=best["pp"][0], decode_tps=best["tg"][0], step_bytes=fbytes, peak_rss_bytes=rss))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"{os.path.basename(model)} ({shape} shape, {os.path.getsize(model) / 2**20:,.0f} MiB), {threads} threads, "
      f"prefill {P}, decode {D}, medians of {rounds} round(s); CPU: {cpu}")
print(f"read bandwidth {bw:.1f} GB/s (best of the rounds' probes); a step reads {fbytes / 1e6:,.1f} MB of the file "
      f"-> roofline {roof:.2f} tok/s")
if resident >= 0:
    print(f"cold start: {resident / os.path.getsize(model):.0%} of the file in the page cache, dray's cache empty")
print("| engine | setting | prefill tok/s | decode tok/s | MB/step | x file | % roofline | % own | "
      "start cold / warm s | peak RSS MB |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
out = []
for e in engines:
    e["roofline_frac"] = e["decode_tps"] / roof
    e["own_frac"] = e["decode_tps"] / (bw * 1e9 / e["step_bytes"])
    bug = " BENCH BUG" if e["roofline_frac"] > 1 or e["own_frac"] > 1 else ""
    start = f"{e['cold_start_s']:.1f} / {e['warm_start_s']:.1f}" if "cold_start_s" in e else "-"
    print(f"| {e['engine']} | {e['setting']} | {e['prefill_tps']:.1f} | {e['decode_tps']:.2f} | "
          f"{e['step_bytes'] / 1e6:,.1f} | {e['step_bytes'] / fbytes:.2f}x | {100 * e['roofline_frac']:.0f}%{bug} | "
          f"{100 * e['own_frac']:.0f}% | {start} | {e['peak_rss_bytes'] / 1e6:,.0f} |")
    out.append(dict(bench="scale", model=os.path.basename(model), shape=shape, cpu=cpu, threads=int(threads),
                    rounds=int(rounds), prefill_tokens=int(P), decode_steps=int(D), read_gbps=round(bw, 2),
                    file_step_bytes=fbytes, cold_resident_bytes=resident, roofline_tps=round(roof, 3), bench_bug=bool(bug),
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in e.items()}))
lines = [json.dumps(o) for o in out]
print("\n".join(lines))
if json_out:
    with open(json_out, "a") as f:
        f.write("\n".join(lines) + "\n")
PY
