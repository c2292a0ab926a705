#!/usr/bin/env python3
"""What n > 1 costs in `dray serve`: n choices of one prompt are
prefilled once and share its KV through the prefix cache. This measures, for a
prompt of about 1,000 tokens, the prompt tokens computed and the wall time of
n = 1 and n = 4 (max_tokens 1, so the prompt's work is what is timed), each run
under a fresh cache_salt so nothing is reused across runs. Not a CI test:

    python3 bench/choices.py --dray build/tools/dray --model .models/gemma-3-270m-q4_k_m.gguf

Prints one line per n and the ratios; exits 1 when n = 4 computes 1.5x the
prompt tokens of n = 1 or more. Standard library only.
"""
import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

from serving import Server

HERE = os.path.dirname(os.path.abspath(__file__))


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def computed(m0, m1):
    """Prompt tokens the scheduler computed between two /metrics pages."""
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    return d("dray_scheduler_prompt_tokens_total") - d("dray_scheduler_prompt_tokens_cached_total")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=1000, help="prompt length")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    args = ["-t", str(a.threads), "-c", "2048", "--set", f"max_prompt_tokens={a.tokens + 100}",
            "--set", "max_seqs=8"]
    with Server(a.dray, a.model, args) as srv:
        return measure(srv, a)


def measure(srv, a):
    """The two rows and the ratios; 1 when n = 4 misses the target."""
    base = srv.base
    text = open(os.path.join(HERE, "texts", "varied.txt")).read()
    ids = post(base, "/tokenize", {"prompt": text})["tokens"][:a.tokens]
    results = {}
    for n in (1, 4):
        work, wall = [], []
        for run in range(a.runs + 1):  # the first run warms up
            body = {"prompt": ids, "max_tokens": 1, "temperature": 1.0, "n": n,
                    "cache_salt": f"choices-{n}-{run}-{time.time()}"}
            m0 = srv.metrics()
            t0 = time.perf_counter()
            d = post(base, "/v1/completions", body)
            dt = time.perf_counter() - t0
            assert len(d["choices"]) == n
            if run:
                work.append(computed(m0, srv.metrics()))
                wall.append(dt)
        results[n] = (statistics.median(work), statistics.median(wall))
        print(f"n={n}: prompt {len(ids)} tokens, computed {results[n][0]:.0f} prompt tokens, "
              f"wall {results[n][1] * 1e3:.0f} ms (median of {a.runs})")
    rw = results[4][0] / results[1][0]
    rt = results[4][1] / results[1][1]
    print(f"n=4 / n=1: prompt work {rw:.3f}x, wall time {rt:.3f}x (target < 1.5x)")
    return 0 if rw < 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
