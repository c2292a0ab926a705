#!/usr/bin/env python3
"""Sticky routing through nginx (deploy/nginx.conf) over three `dray serve` processes.

The three servers are separate test hosts on distinct loopback addresses
(127.0.0.2, .3, .4; no network namespaces needed, nothing leaves loopback). nginx
runs deploy/nginx.conf with only its upstream list, listen address and file paths
rewritten. Multi-turn chats are replayed through it, each chat with its own
X-Session-Id. Checks:
  1. every turn of a conversation lands on one server (nginx's access log names
     the upstream of every request);
  2. the prompt-cache hit rate on turns >= 2 through the proxy is within 5 points
     of the same replay sent straight to one server;
  3. a server killed mid-run: its conversations move to the others and are
     recomputed there (on the first moved turn the new server may reuse what the
     conversation shares with the ones it served, the template and the common
     lead, but never the conversation's own first message), no request fails,
     none hangs (every request has a timeout).
Exit 0 when all pass, 1 on a failure, 77 (skipped) when nginx is not installed.
Usage: tests/e2e/run.sh test_sticky.py --dray BUILD/tools/dray --model MODEL.gguf [--conf deploy/nginx.conf]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from local_cluster import CONF, free_port, nginx_conf, start_nginx, start_servers  # noqa: E402

N_SERVERS = 3
N_CONV = 6
MAX_TOKENS = 12
TIMEOUT = 120  # seconds, for any one request

QUESTIONS = [
    ["Name three rivers in Africa.", "Which of them is the longest?", "Where does it begin?",
     "What is its delta like?"],
    ["Write a haiku about winter.", "Now one about summer.", "Which do you prefer?",
     "Explain your choice."],
    ["What is 17 times 23?", "And 19 times 21?", "Which product is larger?", "By how much?"],
    ["Suggest a name for a cat.", "Something shorter?", "Why that one?", "Thanks, any other?"],
    ["How do bees make honey?", "How long does it take?", "How much per hive?",
     "Is it ever harmful?"],
    ["Translate 'good morning' to Spanish.", "And to French?", "And German?", "And Italian?"],
]


def fail(msg):
    print(f"test_sticky: FAIL: {msg}", flush=True)
    sys.exit(1)


def chat(base, session, messages):
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "X-Session-Id": session})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            out = json.load(r)
            return r.status, out["choices"][0]["message"]["content"], out["usage"]
    except urllib.error.HTTPError as e:
        return e.code, "", {}


def access_log(tmp, want):
    """[(session, upstream(s), status)] of the conv-* requests in order, once the
    log holds `want` of them (nginx writes a line just after the response)."""
    deadline = time.time() + 10
    while True:
        rows = []
        for line in open(os.path.join(tmp, "access.log")):
            m = re.search(r"session=(conv-\S*) upstream=(.*?) status=(\d+)", line)
            if m:
                rows.append((m.group(1), m.group(2), int(m.group(3))))
        if len(rows) >= want or time.time() > deadline:
            return rows
        time.sleep(0.1)


def replay(base, prefix, turns, histories, results, lead=""):
    """One turn of every conversation per round, one request in flight. `lead`
    starts each conversation's first message, so that two replays with different
    leads share no cached prefix."""
    for t in turns:
        for c in range(N_CONV):
            session = f"{prefix}{c}"
            text = (lead if t == 0 else "") + QUESTIONS[c][t]
            histories[session].append({"role": "user", "content": text})
            status, reply, usage = chat(base, session, histories[session])
            if status != 200:
                fail(f"{session} turn {t + 1}: HTTP {status} through {base}")
            histories[session].append({"role": "assistant", "content": reply})
            results.append((session, t, usage))


def hit_rate(results, first_turn=1):
    p = sum(u["prompt_tokens"] for _, t, u in results if t >= first_turn)
    c = sum(u["prompt_tokens_details"]["cached_tokens"] for _, t, u in results if t >= first_turn)
    return c / p if p else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--conf", default=CONF)
    a = ap.parse_args()
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not nginx:
        print("test_sticky: SKIP: nginx is not installed (ci/setup.sh installs nginx-light)")
        return 77
    tmp = tempfile.mkdtemp(prefix="dray-sticky.")
    servers, ng = [], None
    try:
        try:
            servers = start_servers(a.dray, a.model, N_SERVERS, tmp,
                                    ["-c", "2048", "-t", "1", "--set", "max_seqs=4"], timeout=180)
            listen = f"127.0.0.1:{free_port()}"
            ng = start_nginx(nginx, tmp, nginx_conf(a.conf, tmp, servers, listen), listen)
        except RuntimeError as e:
            fail(str(e))
        base = f"http://{listen}"
        hist = {f"conv-{c}": [] for c in range(N_CONV)}
        proxied = []
        replay(base, "conv-", [0, 1, 2], hist, proxied, lead="Hello there. ")

        # 1. stickiness: one upstream per conversation
        owner = {}
        for session, up, status in access_log(tmp, 3 * N_CONV):
            owner.setdefault(session, set()).add(up)
        for session, ups in sorted(owner.items()):
            if len(ups) != 1:
                fail(f"{session} was served by {sorted(ups)}; expected one server")
        used = {next(iter(u)) for u in owner.values()}
        print(f"test_sticky: {N_CONV} conversations x 3 turns over {len(used)} servers: "
              f"every conversation stayed on one server", flush=True)

        # 2. hit rate through the proxy vs straight to one server (fresh conversations)
        direct_hist = {f"direct-{c}": [] for c in range(N_CONV)}
        direct = []
        replay(f"http://{servers[0]['addr']}", "direct-", [0, 1, 2], direct_hist, direct,
               lead="Good day. ")
        hp, hd = hit_rate(proxied), hit_rate(direct)
        print(f"test_sticky: prompt tokens from cache on turns >= 2: through nginx {hp:.1%}, "
              f"one server {hd:.1%}", flush=True)
        if hp < hd - 0.05:
            fail(f"hit rate through the proxy {hp:.1%} is more than 5 points below {hd:.1%}")

        # 3. kill the server of conv-0 mid-run; everything still completes
        victim_addr = next(iter(owner["conv-0"]))
        victim = next(s for s in servers if s["addr"] == victim_addr)
        victim["proc"].send_signal(signal.SIGKILL)
        victim["proc"].wait(timeout=30)
        moved_sessions = [s for s, u in owner.items() if victim_addr in u]
        after = []
        t0 = time.time()
        replay(base, "conv-", [3], hist, after)
        rows = access_log(tmp, 4 * N_CONV)[3 * N_CONV:]
        if len(rows) != N_CONV:
            fail(f"nginx logged {len(rows)} of the {N_CONV} requests after the kill")
        for session, up, status in rows:
            if status != 200:
                fail(f"{session} after the kill: status {status} via {up}")
            final = up.split(",")[-1].strip()
            if session in moved_sessions and final == victim_addr:
                fail(f"{session} was still sent to the killed server {victim_addr}")
        # the conversation's first prompt is the most any other conversation could
        # share with it (the template and the lead, up to where the questions differ)
        first_prompt = {session: u["prompt_tokens"] for session, t, u in proxied if t == 0}
        for session, t, usage in after:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            if session in moved_sessions and cached >= first_prompt[session]:
                fail(f"{session} reported {cached} cached tokens on a server that never saw it "
                     f"(its first prompt alone is {first_prompt[session]})")
        print(f"test_sticky: killed {victim_addr}; its {len(moved_sessions)} conversation(s) "
              f"moved and were recomputed, all {N_CONV} turns completed in "
              f"{time.time() - t0:.1f} s", flush=True)
        print("test_sticky: PASS")
        return 0
    finally:
        if ng:
            ng.terminate()
            try:
                ng.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ng.kill()
        for s in servers:
            if s["proc"].poll() is None:
                s["proc"].terminate()
                try:
                    s["proc"].wait(timeout=30)
                except subprocess.TimeoutExpired:
                    s["proc"].kill()
        if os.environ.get("KEEP_STICKY") != "1":
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
