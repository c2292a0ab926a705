#!/usr/bin/env bash
# Gemma 3 270M over ranks of mpirun (config distributed: mpi) gives one
# process's greedy tokens: 2 ranks and 3 ranks (one on OpenCL) at f32 weights
# with an f16 KV, 2 ranks at the default precision calibrated across them (also
# with calls longer than distributed_timeout, which heartbeats cover); a rank
# that cannot open its plugin fails the start naming the rank; a batch of 4
# pipelines over the ranks. Arguments: DRAY_EXE BUILD_DIR. Exit 77 (skip,
# reported) without the model, mpirun or the MPI transport module.
set -uo pipefail
dray="$1"; build="$2"
. "$(dirname "$0")/model_env.sh"
need_mpi "$build"
cache=$(mktemp -d "${TMPDIR:-/tmp}/dray-mpi.XXXXXX")
trap 'rm -rf "$cache"' EXIT
export DRAY_CACHE_DIR="$cache"
prompt="The capital of France is"
exact=(--set precision=f32 --set kv_dtype=f16)
run=(run -m "$model" -t 1 -n 16 --temp 0 --print-token-ids -p "$prompt")
status=0

same() { # NAME WANT OUTPUT
  local got; got="$(ids "$3")"
  echo "$1: $got"
  [ -n "$got" ] && [ "$got" = "$2" ] || { echo "FAIL: $1 gives other tokens than one process:"; echo "$3" | tail -n 20; status=1; }
}

want="$(ids "$("$dray" "${run[@]}" "${exact[@]}" 2>&1)")"
echo "one process: $want"
[ -n "$want" ] || { echo "FAIL: one process printed no token ids"; exit 1; }
out="$(timeout 300 mpirun -np 2 "$dray" "${run[@]}" "${exact[@]}" --set distributed=mpi 2>&1)"
same "2 ranks" "$want" "$out"
grep -q 'split: device 2 cpu@rank1' <<<"$out" || { echo "FAIL: no placement line for rank 1"; status=1; }

if "$dray" devices 2>/dev/null | grep -A3 '^  opencl ' | grep -q 'device 0:'; then
  out="$(timeout 300 mpirun -np 2 "$dray" "${run[@]}" "${exact[@]}" --set distributed=mpi : \
         -np 1 "$dray" "${run[@]}" "${exact[@]}" --set distributed=mpi --set backend=opencl 2>&1)"
  same "3 ranks, rank 2 on opencl" "$want" "$out"
  grep -q 'split: device 3 opencl@rank2' <<<"$out" || { echo "FAIL: rank 2 is not on opencl"; status=1; }
else
  echo "skip 3 ranks with opencl: no OpenCL device here"
fi

want_q="$(ids "$("$dray" "${run[@]}" 2>&1)")"
rm -rf "${cache:?}"/*
out="$(timeout 300 mpirun -np 2 "$dray" "${run[@]}" --set distributed=mpi 2>&1)"
same "2 ranks, default precision, calibrated across them" "$want_q" "$out"

# rank 1's calls (loading and calibrating 16 layers) last longer than the 1 s
# timeout: its heartbeats tell rank 0 it is alive
rm -rf "${cache:?}"/*
out="$(timeout 300 mpirun -np 2 "$dray" "${run[@]}" --set distributed=mpi --set distributed_timeout=1 \
       --set layer_split=1,8 2>&1)"
same "2 ranks, calls longer than distributed_timeout=1" "$want_q" "$out"

out="$(timeout 120 mpirun -np 1 "$dray" "${run[@]}" --set distributed=mpi : \
       -np 1 "$dray" "${run[@]}" --set distributed=mpi --set backend=nosuchplugin 2>&1)"
rc=$?
if [ $rc -eq 0 ] || ! grep -q 'rank 1.*nosuchplugin' <<<"$out"; then
  echo "FAIL: a rank without its plugin: exit $rc, and the error should name rank 1 and the plugin:"
  echo "$out" | tail -n 20; status=1
else
  echo "a rank without its plugin: exit $rc, $(grep -m1 'rank 1.*nosuchplugin' <<<"$out")"
fi

out="$(timeout 300 mpirun -np 2 "$dray" bench model -m "$model" -t 1 --batch 4 --prefill 16 --decode 8 \
       --set distributed=mpi 2>&1)"
rc=$?
if [ $rc -ne 0 ] || ! grep -qE '[1-9][0-9]* in micro-batches' <<<"$out"; then
  echo "FAIL: bench model --batch 4 over 2 ranks: exit $rc"; echo "$out" | tail -n 20; status=1
else
  grep -E '^split|^ *busy|^decode' <<<"$out" | head -n 6
fi
exit $status
