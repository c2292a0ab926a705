#!/usr/bin/env python3
"""Soak test of `dray serve`: a bounded loopback load for a set time
at a fixed number of requests in flight, mixing normal, streamed, cancelled,
structured and hostile requests. Not a CI test: run it by hand.

    python3 bench/soak.py --dray build-ci/tools/dray --model .models/smollm2-135m-instruct-q4_1.gguf \
        --minutes 10 --inflight 16

It starts the server itself (its stderr goes to a log file), and at the end
checks the three things a long-running server must keep:
  1. resident memory is flat after warm-up: the largest VmRSS of the second half
     is within --rss-slack (default 5%) of the largest of the first half after
     the first minute, not counting the KV the prefix cache keeps in host memory
     (dray_prefix_cache_host_bytes, which grows up to its budget by design);
  2. no 5xx answers a client's error: every answer is 2xx, 4xx or 499 (a client
     that left); 5xx only where the server itself failed, which counts as a failure;
  3. /metrics agrees with the log line for line: dray_http_requests_total per
     code equals the number of request lines the server logged with that code
     (the libmicrohttpd-answered ones under their own label).
Prints the figures and exits 0 when all three hold, 1 otherwise. Standard
library only.
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = ["Name three rivers in Europe.", "What is 17 times 23?", "Write a haiku about rain.",
           "Explain what a hash table is in two sentences.", "Translate 'good morning' to French."]


def chat_body(prompt, **extra):
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
            "temperature": 0.7, "seed": random.randrange(1 << 30)}
    body.update(extra)
    return json.dumps(body).encode()


class Soak:
    def __init__(self, port):
        self.port = port
        self.lock = threading.Lock()
        self.codes = collections.Counter()  # status seen by clients, per kind
        self.kinds = collections.Counter()
        self.errors = []

    def record(self, kind, code):
        with self.lock:
            self.kinds[kind] += 1
            self.codes[(kind, code)] += 1

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def post(self, kind, path, body, headers=None):
        c = self.conn()
        try:
            c.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            r.read()
            self.record(kind, r.status)
        finally:
            c.close()

    def normal(self):
        self.post("normal", "/v1/chat/completions", chat_body(random.choice(PROMPTS)))

    def streamed(self):
        c = self.conn()
        try:
            c.request("POST", "/v1/chat/completions", chat_body(random.choice(PROMPTS), stream=True),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            while r.readline():
                pass
            self.record("streamed", r.status)
        finally:
            c.close()

    def cancelled(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        body = chat_body(random.choice(PROMPTS), stream=True, max_tokens=64)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.recv(256)  # the first bytes of the stream, then leave
        s.close()
        self.record("cancelled", 499)

    def structured(self):
        self.post("structured", "/v1/chat/completions",
                  chat_body("Give a JSON object with a key 'city'.", response_format={"type": "json_object"}))

    def hostile(self):
        pick = random.randrange(6)
        if pick == 0:
            self.post("hostile", "/v1/chat/completions", b'{"messages": [', None)
        elif pick == 1:
            self.post("hostile", "/v1/chat/completions", chat_body("hi", frobnicate=1))
        elif pick == 2:
            self.post("hostile", "/v1/chat/completions", chat_body("hi", max_tokens=-3))
        elif pick == 3:
            self.post("hostile", "/v1/completions", json.dumps({"model": "default", "prompt": "x" * 200000}).encode())
        elif pick == 4:  # half a request line, then gone
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(b"GET /he")
            s.close()
            self.record("hostile-raw", 0)
        else:  # a bad Content-Length, read the raw answer
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
            data = b""
            try:
                while True:
                    d = s.recv(4096)
                    if not d:
                        break
                    data += d
            except socket.timeout:
                pass
            s.close()
            m = re.match(rb"HTTP/1\.1 (\d+)", data)
            self.record("hostile", int(m.group(1)) if m else 0)

    def one(self):
        r = random.random()
        fn = (self.normal if r < 0.35 else self.streamed if r < 0.65 else self.cancelled if r < 0.75
              else self.structured if r < 0.85 else self.hostile)
        try:
            fn()
        except Exception as e:  # a client-side failure is a finding too
            with self.lock:
                self.errors.append(f"{fn.__name__}: {e!r}")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metrics_text(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return text


def host_cache_kb(port):
    m = re.search(r"^dray_prefix_cache_host_bytes(?:\{[^}]*\})? (\S+)$", metrics_text(port), re.M)
    return int(float(m.group(1))) // 1024 if m else 0


def metrics(port):
    text = metrics_text(port)
    out = collections.Counter()
    for m in re.finditer(r'^dray_http_requests_total\{code="(\d+)"(,answered_by="libmicrohttpd")?\} (\d+)$', text, re.M):
        out[(int(m.group(1)), bool(m.group(2)))] += int(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dray", default="build-ci/tools/dray")
    ap.add_argument("--model", default=".models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--rss-slack", type=float, default=0.05)
    a = ap.parse_args()
    log = tempfile.NamedTemporaryFile(prefix="dray-soak-", suffix=".log", delete=False)
    # every client here shares 127.0.0.1, as behind a proxy: the per-address cap
    # is set above what the load holds at once (in flight plus closing sockets)
    srv = subprocess.Popen([a.dray, "serve", "-m", a.model, "--set", f"port={a.port}", "--set", "max_queue=64",
                            "--set", "served_model_name=default", "--set",
                            f"max_connections_per_ip={4 * a.inflight}"],
                           stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        print("soak: the server did not start; log:", log.name)
        srv.kill()
        return 1
    soak = Soak(a.port)
    stop = time.time() + a.minutes * 60
    t0 = time.time()
    samples = []  # (seconds, rss kB, host-tier KV kB)

    def worker():
        while time.time() < stop:
            soak.one()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.inflight)]
    for t in threads:
        t.start()
    while time.time() < stop:
        samples.append((time.time() - t0, rss_kb(srv.pid), host_cache_kb(a.port)))
        time.sleep(5)
    for t in threads:
        t.join(timeout=120)
    time.sleep(1)
    got = metrics(a.port)
    srv.terminate()
    srv.wait(timeout=60)
    log.close()
    logged = collections.Counter()
    with open(log.name, errors="replace") as f:
        for line in f:
            m = re.match(r"dray serve: \S+ \S+ (\d{3}) (answered by libmicrohttpd)?", line)
            if m:
                logged[(int(m.group(1)), bool(m.group(2)))] += 1
    # the final GET /metrics is logged once served, after its body was made
    got_wo = collections.Counter(got)
    got_wo[(200, False)] += 1
    warm = [r - h for s, r, h in samples if s >= 60]
    half = len(warm) // 2
    first, second = (max(warm[:half]), max(warm[half:])) if half else (0, 0)
    rss_ok = half > 0 and second <= first * (1 + a.rss_slack)
    fivexx = sum(v for (k, c), v in soak.codes.items() if 500 <= c < 600)
    print(f"soak: {a.minutes:g} min at {a.inflight} in flight, {sum(soak.kinds.values())} requests "
          f"({', '.join(f'{k} {v}' for k, v in sorted(soak.kinds.items()))})")
    print("soak: answers seen by clients: " +
          ", ".join(f"{k}:{c} {v}" for (k, c), v in sorted(soak.codes.items())))
    print(f"soak: VmRSS less the host-tier KV after warm-up: first half max {first} kB, second half "
          f"max {second} kB ({'flat' if rss_ok else 'GROWS'}); samples every 5 s: {len(samples)}")
    print("soak: VmRSS / host-tier KV (kB) each minute: " +
          ", ".join(f"{r}/{h}" for s, r, h in samples[::12]))
    print(f"soak: 5xx answers: {fivexx}; client-side errors: {len(soak.errors)}"
          + (f" (first: {soak.errors[0]})" if soak.errors else ""))
    mism = {}
    for key in set(logged) | set(got_wo):
        lg, mt = logged.get(key, 0), got_wo.get(key, 0)
        if lg != mt:
            mism[key] = (lg, mt)
    print("soak: /metrics against the log, per code: " +
          ("agree" if not mism else "; ".join(f"{c}{'(mhd)' if m else ''}: log {lg}, metrics {mt}"
                                             for (c, m), (lg, mt) in sorted(mism.items()))))
    print("soak: log:", log.name)
    return 0 if rss_ok and not fivexx and not mism and not soak.errors else 1


if __name__ == "__main__":
    sys.exit(main())
