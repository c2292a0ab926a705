#!/usr/bin/env python3
"""Scale-out benchmark: the multi-turn chat replay (bench/chat_replay.py) through
nginx (deploy/nginx.conf) to 1, 2 and 3 `dray serve` processes, with sticky
routing (hash of X-Session-Id, consistent) and with random routing (nginx's
`random` balancer), so the value of stickiness is a measured number.

The servers are separate processes on distinct loopback addresses (127.0.0.2,
.3, .4), as in tests/e2e/test_sticky.py. Every (servers, routing) run starts
fresh servers, and the replay's conversations carry a per-run nonce, so no run
is helped by another's cache. Reported per run: completion tokens per second
(all completion tokens / wall time), TTFT p50 on turns >= 2, and the prompt-cache
hit rate on turns >= 2 (cached_tokens / prompt_tokens as the servers report them),
with the load average at the end of the run.

On a machine with fewer cores than servers, the servers compete for the same
cores: give each one thread (--threads 1) and read the tok/s as a ratio within
one run of this script, not as what N machines would do.

usage: bench/scale_out.py --dray build/tools/dray --model .models/gemma-3-270m-q4_k_m.gguf \
           [--servers 1,2,3] [--routing sticky,random] [--conversations 12] [--turns 4] \
           [--inflight 6] [--max-tokens 16] [--threads 1] [--replicas 1] [--json out.jsonl]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "deploy"))
from local_cluster import CONF, HOSTS, free_port, nginx_conf, start_nginx, start_servers  # noqa: E402


def spread(tmp, servers):
    """Requests each server got, from nginx's access log ("upstream=ADDR"): sticky
    routing of few conversations can load the servers unevenly."""
    got = {s["addr"]: 0 for s in servers}
    with open(os.path.join(tmp, "access.log")) as f:
        for line in f:
            if "/chat/completions" in line:
                up = line.split("upstream=", 1)[1].split(" ", 1)[0].split(",")[-1].strip()
                got[up] = got.get(up, 0) + 1
    return [got[s["addr"]] for s in servers]


def stop(p, grace=30):
    if p and p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()


def one_run(a, nginx, n, routing, tmp):
    if n > len(HOSTS):
        sys.exit(f"scale_out: at most {len(HOSTS)} servers (one per loopback address in deploy/local_cluster.py)")
    servers, ng = [], None
    try:
        try:
            servers = start_servers(a.dray, a.model, n, tmp,
                                    ["-c", str(a.context), "-t", str(a.threads), "--set", f"max_seqs={a.max_seqs}",
                                     "--replicas", str(a.replicas)])
            listen = f"127.0.0.1:{free_port()}"
            ng = start_nginx(nginx, tmp, nginx_conf(a.conf, tmp, servers, listen, routing), listen)
        except RuntimeError as e:
            sys.exit(f"scale_out: {e}")
        out = os.path.join(tmp, "replay.jsonl")
        if os.path.exists(out):
            os.remove(out)
        cmd = [sys.executable, os.path.join(HERE, "chat_replay.py"), "--url", f"http://{listen}",
               "--inflight", str(a.inflight), "--conversations", str(a.conversations),
               "--turns", str(a.turns), "--max-tokens", str(a.max_tokens), "--session-ids",
               "--nonce", "auto", "--label", f"{n} servers, {routing}", "--json", out]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        with open(out) as f:
            res = json.loads(f.readline())
        res.update({"spread": spread(tmp, servers), "servers": n, "replicas": a.replicas, "routing": routing, "threads": a.threads,
                    "loadavg": os.getloadavg()[0]})
        return res
    finally:
        stop(ng, 10)
        for s in servers:
            stop(s["proc"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--conf", default=CONF)
    ap.add_argument("--servers", default="1,2,3")
    ap.add_argument("--routing", default="sticky,random")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--inflight", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="threads per server (per replica)")
    ap.add_argument("--replicas", type=int, default=1,
                    help="engines inside each server (config key replicas); each gets --threads")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--max-seqs", type=int, default=4)
    ap.add_argument("--json", default="", help="append one JSON line per run to this file")
    a = ap.parse_args()
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not nginx:
        sys.exit("scale_out: nginx is not installed (ci/setup.sh installs nginx-light)")
    rows = []
    for n in (int(x) for x in a.servers.split(",")):
        # one server: every routing sends everything to it, so it runs once (its
        # replicas, if any, route by X-Session-Id themselves)
        for routing in (["sticky"] if n == 1 else a.routing.split(",")):
            tmp = tempfile.mkdtemp(prefix="dray-scale.")
            try:
                res = one_run(a, nginx, n, routing, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append(res)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(res) + "\n")
    print(f"\n{a.conversations} conversations x {a.turns} turns, {a.inflight} in flight, "
          f"{a.max_tokens} tokens per reply, {a.threads} thread(s) per server, {os.cpu_count()} cores\n")
    print("| servers × replicas | routing | completion tok/s | TTFT p50, turns ≥ 2 | cache hit rate, turns ≥ 2 | requests per server | load avg (1 min) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        hit = r["later_cached_tokens"] / r["later_prompt_tokens"] if r.get("later_prompt_tokens") else float("nan")
        alone = r["servers"] == 1 and r["replicas"] == 1
        print(f"| {r['servers']} × {r['replicas']} | {'—' if alone else r['routing']} | {r['completion_tok_s']:.1f} | "
              f"{r['later_ttft_p50_s'] * 1e3:.0f} ms | {100 * hit:.1f}% | {'/'.join(map(str, r['spread']))} | "
              f"{r['loadavg']:.1f} |")


if __name__ == "__main__":
    main()
