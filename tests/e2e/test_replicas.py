#!/usr/bin/env python3
"""`replicas: 2` in one `dray serve` process: two engines (each its own scheduler
and KV cache) behind one port, on the CPU plugin, which has one device, so both
replicas share it and split the cores (threads 0 -> cores / 2 each).

Checks:
  1. both replicas open and /health lists them;
  2. every turn of a conversation (one X-Session-Id) is served by one replica
     (the X-Dray-Replica response header), and its second turn reuses the first
     turn's KV (cached_tokens > 0), which only that replica holds;
  3. different conversations spread over both replicas;
  4. without X-Session-Id the OpenAI `user` field keys the route; streams carry
     the header too;
  5. /metrics counts each replica's requests under replica="N", matching the
     headers;
  6. a replica that cannot open (a device the plugin does not have) stops the
     start with an error naming that replica.
Exit 0 when all pass, 1 on a failure.
Usage: tests/e2e/run.sh test_replicas.py --dray BUILD/tools/dray --model MODEL.gguf
"""
import argparse
import concurrent.futures as cf
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

N_CONV = 8
MAX_TOKENS = 8
TIMEOUT = 120  # seconds, for any one request
FIRST = ["Name a river in Africa.", "Write a haiku about snow.", "What is 17 times 23?",
         "Suggest a name for a cat.", "How do bees make honey?", "Say good morning in Spanish.",
         "What colour is the sky?", "Name a prime number."]


def check(cond, what):
    if not cond:
        print(f"test_replicas: FAIL: {what}", flush=True)
        sys.exit(1)
    print("ok:", what, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(dray, model, port, *extra):
    cmd = [dray, "serve", "--model", model, "--port", str(port), "-c", "512",
           "--set", "max_seqs=4", "--set", "max_completion_tokens=16", "--set", "shutdown_grace=2",
           "--set", "temperature=0", *extra]
    print("starting:", " ".join(cmd), flush=True)
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)


def post(base, body, headers=None):
    """(X-Dray-Replica as int, parsed body) of one chat request."""
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         **(headers or {})})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        data = r.read()
        rep = r.headers.get("X-Dray-Replica")
    if body.get("stream"):
        return int(rep), data.decode()
    return int(rep), json.loads(data)


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=TIMEOUT) as r:
        page = r.read().decode()
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in page.splitlines()
                                     if not ln.startswith("#"))}


def turn(base, conv, messages):
    rep, body = post(base, {"messages": messages, "max_tokens": MAX_TOKENS},
                     {"X-Session-Id": f"conv-{conv}"})
    return rep, body["choices"][0]["message"]["content"], body["usage"]


def test_serving(dray, model):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(dray, model, port, "--replicas", "2")
    log, ready = [], threading.Event()

    def read_log():
        for line in proc.stderr:
            log.append(line)
            if "listening on" in line:
                ready.set()
    threading.Thread(target=read_log, daemon=True).start()
    try:
        if not ready.wait(300) or proc.poll() is not None:
            check(False, "the server with replicas: 2 started:\n" + "".join(log))
        text = "".join(log)
        check("replica 0 of 2" in text and "replica 1 of 2" in text and "2 replicas" in text,
              "both replicas opened (the start log names each)")
        with urllib.request.urlopen(base + "/health", timeout=TIMEOUT) as r:
            health = json.loads(r.read())
        check(health["status"] == "ok" and [x["replica"] for x in health["replicas"]] == [0, 1],
              f"/health lists both replicas: {health}")

        # turn 1 of every conversation at once, then turn 2 at once
        convs = [[{"role": "user", "content": q}] for q in FIRST[:N_CONV]]
        with cf.ThreadPoolExecutor(N_CONV) as ex:
            first = list(ex.map(lambda i: turn(base, i, convs[i]), range(N_CONV)))
            for i, (_, reply, _) in enumerate(first):
                convs[i] += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": "Tell me more."}]
            second = list(ex.map(lambda i: turn(base, i, convs[i]), range(N_CONV)))
        for i in range(N_CONV):
            check(first[i][0] == second[i][0] and second[i][2]["prompt_tokens_details"]["cached_tokens"] > 0,
                  f"conv-{i}: both turns on replica {first[i][0]}, turn 2 cached "
                  f"{second[i][2]['prompt_tokens_details']['cached_tokens']} of {second[i][2]['prompt_tokens']}")
        per = [sum(1 for r, _, _ in first + second if r == k) for k in (0, 1)]
        check(per[0] > 0 and per[1] > 0, f"conversations spread over both replicas: {per} requests")

        # no X-Session-Id: the `user` field keys the route; a stream says its replica too
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "user": "alice"}
        a = post(base, body)[0]
        b, sse = post(base, {**body, "stream": True})
        check(a == b and sse.rstrip().endswith("data: [DONE]"),
              f"user 'alice' (plain and streamed) stays on replica {a}")
        per[a] += 2

        m = metrics(base)
        done = [m[f'dray_scheduler_requests_total{{replica="{k}",outcome="done"}}'] for k in (0, 1)]
        check(done == per, f"/metrics: requests done per replica {done} match the headers {per}")
        check(all(m[f'dray_prompt_tokens_cached_total{{replica="{k}"}}'] > 0 for k in (0, 1)),
              "/metrics: each replica served cached tokens")
        # the server logs a request after its response is sent, and the reader thread
        # lags behind that: give the last line a moment to arrive
        def served_lines():
            return [ln for ln in list(log) if re.search(r"POST /v1/chat/completions 200 .* replica=[01]$", ln.strip())]
        end = time.time() + 15
        while len(served_lines()) < 2 * N_CONV + 2 and time.time() < end:
            time.sleep(0.1)
        served = served_lines()
        check(len(served) == 2 * N_CONV + 2, f"the log names the replica of each of {len(served)} requests")
    finally:
        proc.terminate()
        proc.wait(30)


def test_bad_replica(dray, model):
    proc = start(dray, model, free_port(), "--replicas", "2", "--set", "device=0,7")
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        check(False, "a server whose replica 1 cannot open exits")
    check(proc.returncode != 0 and "replica 1 of 2 (device '7') did not open" in err and
          "no device 7" in err, "replica 1 on a device the plugin lacks: a clear error at start: " +
          next((ln for ln in err.splitlines() if "did not open" in ln), err[-300:]))
    proc = start(dray, model, free_port(), "--replicas", "3", "--set", "device=0,0")
    _, err = proc.communicate(timeout=60)
    check(proc.returncode != 0 and "lists 2 devices but replicas is 3" in err,
          "a device list that does not match replicas is refused")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    t0 = time.time()
    test_serving(a.dray, a.model)
    test_bad_replica(a.dray, a.model)
    print(f"test_replicas: all passed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
