#!/usr/bin/env python3
"""What grammar-constrained decoding costs in `dray serve`: the mean
time per generated token (the gap between streamed tokens) of free requests
against requests constrained by a JSON Schema, with 1 and with 8 in flight.
Both kinds generate the same number of tokens: the free ones run to max_tokens
(ignore_eos), the constrained ones fill a long string the schema requires. Not a
CI test:

    python3 bench/structured.py --dray build/tools/dray --model .models/smollm2-135m-instruct-q4_1.gguf

Prints, for 1 and 8 in flight, the streamed gap per token of both kinds and, from
/metrics, the scheduler's own time in grammar masks and advances per step, which
is what constraining adds to a step (the end-to-end gaps are noisy on a shared
machine; this share is not). Standard library only.
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import statistics
import sys
import time

from serving import Server

TOKENS = 96
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 600, "maxLength": 800}},
          "required": ["story"]}
PROMPTS = ["Tell a story about a fox.", "Tell a story about the sea.", "Tell a story about a robot.",
           "Tell a story about a city.", "Tell a story about rain.", "Tell a story about a dragon.",
           "Tell a story about a train.", "Tell a story about a garden."]


def gaps(port, body):
    """Seconds between consecutive token chunks of one streamed request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    times = []
    for line in r:
        if line.startswith(b"data: {") and b'"content"' in line and b'"role"' not in line:
            times.append(time.perf_counter())
    c.close()
    return [b - a for a, b in zip(times[2:], times[3:])]  # past the first tokens


def run(port, inflight, constrained, rounds):
    def one(i):
        body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "stream": True,
                "max_tokens": TOKENS, "temperature": 0.8, "seed": i + 1}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
        else:
            body["ignore_eos"] = True
        return gaps(port, body)
    out = []
    with cf.ThreadPoolExecutor(inflight) as ex:
        for r in range(rounds):
            for g in ex.map(one, range(r * inflight, (r + 1) * inflight)):
                out += g
    return statistics.mean(out), len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    args = ["-t", str(a.threads), "--set", "max_seqs=8", "--set", "prefix_cache=false"]
    with Server(a.dray, a.model, args) as srv:
        run(srv.port, 1, True, 1)  # warm up (the vocabulary's trie is built on the first one)
        for inflight in (1, 8):
            m0 = srv.metrics()
            free, nf = run(srv.port, inflight, False, a.rounds)
            m1 = srv.metrics()
            cons, nc = run(srv.port, inflight, True, a.rounds)
            m2 = srv.metrics()
            f = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
            d = {k: m2.get(k, 0) - m1.get(k, 0) for k in m2}
            free_us = f["dray_sample_microseconds_total"] / f["dray_sampled_tokens_total"]
            cons_us = d["dray_grammar_microseconds_total"] / max(d["dray_grammar_tokens_total"], 1)
            step_ms = 1e3 * free  # a free step, end to end
            extra = (cons_us - free_us) * inflight / 1e3  # ms a step gains from the grammar
            print(f"{inflight} in flight: free {free * 1e3:.2f} ms/token ({nf} gaps), constrained "
                  f"{cons * 1e3:.2f} ms/token ({nc} gaps), {100 * (cons / free - 1):+.1f}% end to end; "
                  f"drawing a token: free {free_us:.0f} us, constrained {cons_us:.0f} us: "
                  f"+{extra:.3f} ms a step = {100 * extra / step_ms:.1f}% of a free step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
