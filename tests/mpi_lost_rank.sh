#!/usr/bin/env bash
# A rank killed in mid-request under `mpirun --enable-recovery` (which keeps
# rank 0 up): dray serve ends the running stream with an error naming the rank
# within distributed_timeout, fails the next request at once naming it, turns
# /health to 503 "failed", and still stops cleanly on SIGTERM. Under tensor
# parallel, where the ranks meet in every layer's all-reduce, `dray run` fails
# naming the lost rank instead of waiting in the all-reduce.
# Arguments: DRAY_EXE BUILD_DIR. Exit 77 (skip, reported) without the model,
# mpirun, curl or the MPI transport module.
set -uo pipefail
dray="$1"; build="$2"
. "$(dirname "$0")/model_env.sh"
need_mpi "$build"
command -v curl >/dev/null || { echo "skip: no curl (run ci/setup.sh)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dray-lost.XXXXXX")
export DRAY_CACHE_DIR="$work"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
serve=(serve --model "$model" --port "$port" -t 1 --set distributed=mpi --set distributed_timeout=3)
# rank 0 through sh, to see its exit status (mpirun --enable-recovery exits 0)
timeout 300 mpirun --enable-recovery -np 1 sh -c '"$@"; echo "rank 0 exit $?"' sh "$dray" "${serve[@]}" : \
  -np 1 "$dray" "${serve[@]}" >"$work/serve.log" 2>&1 &
launcher=$!
rank_pid() { # the pid of rank $1's dray
  for p in $(pgrep -x dray); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
cleanup() { kill "$launcher" 2>/dev/null; pkill -9 -f -- "$dray serve --model $model --port $port" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -n 30 "$work/serve.log"; exit 1; }
for _ in $(seq 240); do curl -sf "$url/health" >/dev/null && break; sleep 0.5; done
curl -sf "$url/health" >/dev/null || fail "the server did not come up"
# both ranks' processes (a first look right after /health has missed one)
for _ in $(seq 20); do
  r0=$(rank_pid 0); r1=$(rank_pid 1)
  [ -n "$r0" ] && [ -n "$r1" ] && break
  sleep 0.5
done
[ -n "$r0" ] && [ -n "$r1" ] || fail "no dray process for rank 0 or rank 1"

curl -s -N "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 4000, "stream": true}' >"$work/stream" &
stream=$!
for _ in $(seq 100); do [ "$(grep -c '^data: {' "$work/stream")" -ge 8 ] && break; sleep 0.1; done
[ "$(grep -c '^data: {' "$work/stream")" -ge 8 ] || fail "the stream did not start"
kill -9 "$r1"
t0=$(date +%s.%N)
timeout 60 tail --pid="$stream" -f /dev/null || fail "the stream did not end within 60 s of rank 1's death"
t1=$(date +%s.%N)
grep -q '"error".*rank 1' "$work/stream" || { tail -n 3 "$work/stream"; fail "the stream's end does not name rank 1"; }
echo "running stream ended $(python3 -c "print(f'{$t1 - $t0:.1f}')") s after rank 1 died: $(grep -o '"message":"[^"]*' "$work/stream" | tail -n 1 | cut -c12-)"

next=$(timeout 20 curl -s -w ' HTTP %{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hi", "max_tokens": 4}')
grep -q 'rank 1.*is lost.* HTTP 5' <<<"$next" || fail "the next request should fail at once naming the lost rank: $next"
echo "next request: ${next:0:200}"
health=$(curl -s -w ' HTTP %{http_code}' "$url/health")
grep -q '"status":"failed".*rank 1.* HTTP 503' <<<"$health" || fail "/health should be 503 failed naming rank 1: $health"
echo "health: ${health:0:160}..."

kill -TERM "$r0"
for _ in $(seq 60); do grep -q '^rank 0 exit' "$work/serve.log" && break; sleep 0.5; done
grep -q '^rank 0 exit 0' "$work/serve.log" || fail "rank 0 did not stop cleanly on SIGTERM: $(grep '^rank 0 exit' "$work/serve.log")"
echo "rank 0 stopped on SIGTERM: $(grep -m1 'dray serve: stopped' "$work/serve.log")"

# tensor parallel: rank 0 waits in an all-reduce when rank 1 dies
run=(run -m "$model" -t 1 -n 4000 --temp 0 -p "Once upon a time" --set distributed=mpi --set tensor_parallel=2
     --set distributed_timeout=3)
timeout 300 mpirun --enable-recovery -np 1 sh -c '"$@"; echo "rank 0 exit $?"' sh "$dray" "${run[@]}" : \
  -np 1 "$dray" "${run[@]}" >"$work/tp.log" 2>&1 &
launcher=$!
for _ in $(seq 240); do grep -q 'split: device 2' "$work/tp.log" && break; sleep 0.5; done
sleep 2
r1=$(rank_pid 1)
[ -n "$r1" ] || { cp "$work/tp.log" "$work/serve.log"; fail "tensor parallel: no dray process for rank 1"; }
kill -9 "$r1"
for _ in $(seq 120); do grep -q '^rank 0 exit' "$work/tp.log" && break; sleep 0.5; done
cp "$work/tp.log" "$work/serve.log" # what fail shows
grep -q '^rank 0 exit [1-9]' "$work/tp.log" || fail "tensor parallel: rank 0 should fail after rank 1's death: $(grep '^rank 0 exit' "$work/tp.log")"
# the all-reduce reports the loss ("dray: rank 1 ... is lost"), or the step that
# found it first does ("dray: error: rank 1 ... is lost"): either names rank 1
lost='^dray: \(error: \)\?rank 1 .* is lost'
grep -q "$lost" "$work/tp.log" || fail "tensor parallel: rank 0's error should name the lost rank 1"
echo "tensor parallel: $(grep -m1 "$lost" "$work/tp.log"); $(grep '^rank 0 exit' "$work/tp.log")"
