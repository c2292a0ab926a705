#!/usr/bin/env bash
# Two "hosts" made of network namespaces joined by a veth pair, with Open MPI's
# TCP transport pinned to the veth subnet (no shared memory, no loopback): rank
# 0 in one, rank 1 in the other give one process's greedy tokens at f32 weights
# with an f16 KV, the hidden states visibly cross the veth, and `dray serve`
# across them answers the OpenAI tests (tests/e2e/test_serve.py, run in rank
# 0's namespace). mpirun starts the other host's daemon through a
# plm_rsh_agent that enters its namespace, as ssh would enter the host.
# Arguments: DRAY_EXE BUILD_DIR. Exit 77 (skip, reported) without root's
# `ip netns`, mpirun, the model or the MPI transport module.
set -uo pipefail
dray="$1"; build="$2"
. "$(dirname "$0")/model_env.sh"
need_mpi "$build"
command -v ip >/dev/null || { echo "skip: no ip (iproute2; run ci/setup.sh)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dray-netns.XXXXXX")
nsA="dray-a$$" nsB="dray-b$$" ipA=10.213.$(($$ % 200)).1 ipB=10.213.$(($$ % 200)).2
net="${ipA%.1}.0/24"
cleanup() { ip netns del "$nsA" 2>/dev/null; ip netns del "$nsB" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$nsA" 2>"$work/err" || { echo "skip: ip netns add failed (needs root): $(cat "$work/err")"; exit 77; }
ip netns add "$nsB" &&
  ip link add vA netns "$nsA" type veth peer name vB netns "$nsB" &&
  ip -n "$nsA" addr add "$ipA/24" dev vA && ip -n "$nsB" addr add "$ipB/24" dev vB &&
  ip -n "$nsA" link set vA up && ip -n "$nsB" link set vB up &&
  ip -n "$nsA" link set lo up && ip -n "$nsB" link set lo up ||
  { echo "FAIL: could not make the veth pair between $nsA and $nsB"; exit 1; }
# the "ssh" of this cluster: agent HOST COMMAND... runs COMMAND in HOST's namespace
cat >"$work/agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in $ipA) ns=$nsA;; $ipB) ns=$nsB;; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/agent"
printf '%s slots=1\n%s slots=1\n' "$ipA" "$ipB" >"$work/hosts"
launch="mpirun --hostfile $work/hosts -np 2 --map-by node --mca plm_rsh_agent $work/agent \
--mca btl tcp,self --mca btl_tcp_if_include $net --mca oob_tcp_if_include $net"
export DRAY_CACHE_DIR="$work"
run=(run -m "$model" -t 1 -n 16 --temp 0 --print-token-ids -p "The capital of France is"
     --set precision=f32 --set kv_dtype=f16)
veth_bytes() { ip -n "$nsA" -s link show vA | awk '/RX:/ {getline; rx=$1} /TX:/ {getline; tx=$1} END {print rx + tx}'; }
status=0

want="$(ids "$("$dray" "${run[@]}" 2>&1)")"
echo "one process: $want"
[ -n "$want" ] || { echo "FAIL: one process printed no token ids"; exit 1; }
before=$(veth_bytes)
# shellcheck disable=SC2086 # launch is words
out="$(timeout 300 ip netns exec "$nsA" $launch "$dray" "${run[@]}" --set distributed=mpi 2>&1)"
crossed=$(($(veth_bytes) - before))
got="$(ids "$out")"
echo "two hosts ($ipA, $ipB): $got; $crossed bytes crossed the veth"
[ -n "$got" ] && [ "$got" = "$want" ] || { echo "FAIL: two hosts give other tokens than one process:"; echo "$out" | tail -n 20; status=1; }
grep -q 'split: device 2 cpu@rank1' <<<"$out" || { echo "FAIL: no placement line for rank 1"; status=1; }
# 22 tokens' hidden states (2.5 KB each) there and back, at the least
[ "$crossed" -gt 100000 ] || { echo "FAIL: only $crossed bytes crossed the veth: the ranks talked some other way"; status=1; }

if [ -x "$root/.venv/bin/python" ]; then
  ip netns exec "$nsA" "$root/tests/e2e/run.sh" test_serve.py --dray "$dray" --model @MODEL@ \
    --launch "$launch" --set distributed=mpi
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { echo "FAIL: dray serve across the two hosts (exit $rc)"; status=1; }
else
  echo "skip the server across hosts: no .venv (run ci/setup.sh)"
fi
exit $status
