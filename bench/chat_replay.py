#!/usr/bin/env python3
"""Multi-turn chat replay against any OpenAI-compatible server (dray serve,
llama-server, vLLM, ...).

Each conversation is a fixed list of user turns; every turn resends the whole
history (system prompt, earlier turns and the server's own earlier replies), as
a chat front end does. Conversations run concurrently, N at a time ("in flight");
the turns of one conversation run one after another. Every request streams, so
the time to first token is measured at the client.

Reported per level of concurrency: completion tokens per second (all completion
tokens / wall time), TTFT p50/p99 overall and by turn, prompt tokens sent and how
many of them the server says it served from cache (usage.prompt_tokens_details.
cached_tokens; "n/a" when the server does not report it), overall, by turn and
over turns >= 2 (the turns a prefix cache can serve).

--interleave sends the conversations' turns round-robin (turn 1 of every
conversation, then turn 2, ...) instead of one conversation after another, so
that a small KV cache has to keep (or spill and restore) every conversation
between its turns. --metrics reads the server's /metrics before and after and
prints how the dray_prefix_cache_* counters moved (spills, restores, time spent
in the cache as a share of the requests' time).

Behind a router (nginx with deploy/nginx.conf, or `replicas` in dray serve),
--session-ids sends each conversation's id as the X-Session-Id header, so every
turn can land where its cache is; --nonce auto makes this run's conversations
differ from every other run's (and each level's from the others'), so a run is
never helped by what an earlier one left in the servers' caches.

Only the Python standard library is used, so it runs anywhere:
    python3 bench/chat_replay.py --url http://127.0.0.1:8080 --inflight 1,4,16
    python3 bench/chat_replay.py --url http://127.0.0.1:8081 --json results.jsonl  # llama-server
"""
import argparse
import http.client
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

SYSTEM = ("You are a helpful, patient assistant for curious readers. Answer in a few clear "
          "sentences, using plain words and one concrete example where it helps. If the "
          "question is unclear, say what you assume. Do not use lists or headings; write short "
          "paragraphs. Stay on the topic the user chose, and keep earlier answers consistent "
          "with later ones.")
TOPICS = ["the ocean", "volcanoes", "bread baking", "chess openings", "the moon", "honey bees",
          "old maps", "rain forests", "jazz", "glaciers", "bicycles", "tea", "lighthouses",
          "origami", "deserts", "comets", "coral reefs", "windmills", "owls", "paper making"]
FOLLOW_UPS = ["Tell me something surprising about {t}.", "Why does that happen?",
              "Can you give an example?", "How did people learn this?", "What is a common mistake?",
              "Summarise what we discussed.", "What should I read next?", "Explain it to a child."]


CONTEXT = ["I am reading about this for a school project and want to get the basics right.",
           "My friend told me something about this last week and I am not sure it was true.",
           "I only have a few minutes, so please keep it short but precise.",
           "I already know a little, so you can skip the very simple parts."]


def user_turn(conv, turn, tag=""):
    """A message of one to three sentences (about 15 to 45 tokens); tag marks
    the run (--nonce) in the first one."""
    topic = TOPICS[conv % len(TOPICS)]
    if turn == 0:
        return f"Conversation {conv}{tag}: I would like to learn about {topic}. " + CONTEXT[conv % len(CONTEXT)]
    q = FOLLOW_UPS[(turn - 1 + conv) % len(FOLLOW_UPS)].format(t=topic)
    return q + (" " + CONTEXT[(conv + turn) % len(CONTEXT)] if (conv + turn) % 2 else "")


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Client:
    def __init__(self, url, api_key, model, max_tokens, temperature, timeout):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.prefix = u.path.rstrip("/")
        if not self.prefix.endswith("/v1"):
            self.prefix += "/v1"
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.model, self.max_tokens, self.temperature, self.timeout = model, max_tokens, temperature, timeout
        self.session_ids = False  # send X-Session-Id per conversation

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def models(self):
        c = self.conn()
        c.request("GET", self.prefix + "/models", headers=self.headers)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            sys.exit(f"GET /v1/models: HTTP {r.status}: {body[:300]!r}")
        return [m["id"] for m in json.loads(body)["data"]]

    def metrics(self):
        """The server's /metrics as {name: value}, {} if none: unlabelled samples,
        and samples labelled only by replica (dray serve's replicas) summed."""
        try:
            c = self.conn()
            c.request("GET", self.prefix[:-3] + "/metrics", headers=self.headers)
            r = c.getresponse()
            body = r.read().decode(errors="replace")
            if r.status != 200:
                return {}
        except OSError:
            return {}
        out = {}
        for line in body.splitlines():
            parts = line.split()
            if len(parts) != 2 or not re.fullmatch(r'[a-z_]+(\{replica="\d+"\})?', parts[0]):
                continue
            name = parts[0].split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(parts[1])
            except ValueError:
                pass
        return out

    def chat(self, messages, headers=None):
        """One streamed request: (reply text, dict of measurements)."""
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        c = self.conn()
        t0 = time.perf_counter()
        c.request("POST", self.prefix + "/chat/completions", json.dumps(body),
                  {**self.headers, **(headers or {})})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        text, ttft, chunks, usage = [], None, 0, None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(f"stream error: {ev['error']}")
            usage = ev.get("usage") or usage
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
                    chunks += 1
        total = time.perf_counter() - t0
        c.close()
        usage = usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return "".join(text), {
            "ttft": ttft if ttft is not None else total, "total": total,
            # without usage (some servers), one content chunk is counted as one token
            "completion": usage.get("completion_tokens", chunks),
            "prompt": usage.get("prompt_tokens"),
            "cached": details.get("cached_tokens"),
        }


def session(cli, conv, run_id):
    """(first-turn tag, headers) of a conversation; run_id: None, or this run's
    nonce and level."""
    tag = f" ({run_id})" if run_id else ""
    return tag, ({"X-Session-Id": f"replay-{run_id or 'run'}-{conv}"} if cli.session_ids else None)


def run_conversation(cli, conv, turns, results, lock, run_id=None):
    messages = [{"role": "system", "content": SYSTEM}]
    tag, headers = session(cli, conv, run_id)
    for t in range(turns):
        messages.append({"role": "user", "content": user_turn(conv, t, tag)})
        reply, m = cli.chat(messages, headers)
        messages.append({"role": "assistant", "content": reply})
        m["turn"] = t
        with lock:
            results.append(m)


def run_interleaved(cli, inflight, conversations, turns, results, lock, run_id=None):
    """Round-robin: turn t of every conversation before turn t + 1 of any."""
    history = [[{"role": "system", "content": SYSTEM}] for _ in range(conversations)]

    def one(c, t):
        tag, headers = session(cli, c, run_id)
        history[c].append({"role": "user", "content": user_turn(c, t, tag)})
        reply, m = cli.chat(history[c], headers)
        history[c].append({"role": "assistant", "content": reply})
        m["turn"] = t
        with lock:
            results.append(m)

    with ThreadPoolExecutor(inflight) as ex:
        for t in range(turns):
            for f in [ex.submit(one, c, t) for c in range(conversations)]:
                f.result()


def run_level(cli, inflight, conversations, turns, interleave=False, run_id=None):
    results, lock = [], threading.Lock()
    t0 = time.perf_counter()
    if interleave:
        run_interleaved(cli, inflight, conversations, turns, results, lock, run_id)
    else:
        with ThreadPoolExecutor(inflight) as ex:
            futs = [ex.submit(run_conversation, cli, c, turns, results, lock, run_id)
                    for c in range(conversations)]
            for f in futs:
                f.result()
    wall = time.perf_counter() - t0
    ttfts = [r["ttft"] for r in results]
    prompt = [r["prompt"] for r in results if r["prompt"] is not None]
    cached = [r["cached"] for r in results if r["cached"] is not None]
    completion = sum(r["completion"] for r in results)
    by_turn = {}
    for t in range(turns):
        rs = [r for r in results if r["turn"] == t]
        xs = [r["ttft"] for r in rs]
        by_turn[t] = {"p50": percentile(xs, 50), "p99": percentile(xs, 99),
                      "prompt": sum(r["prompt"] or 0 for r in rs),
                      "cached": (sum(r["cached"] for r in rs)
                                 if all(r["cached"] is not None for r in rs) else None)}
    later = [r for r in results if r["turn"] >= 1]
    later_cached = [r["cached"] for r in later if r["cached"] is not None]
    return {
        "inflight": inflight, "conversations": conversations, "turns": turns, "requests": len(results),
        "wall_s": wall, "completion_tokens": completion, "completion_tok_s": completion / wall,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "ttft_by_turn": by_turn,
        "later_ttft_p50_s": percentile([r["ttft"] for r in later], 50),
        "later_prompt_tokens": sum(r["prompt"] or 0 for r in later),
        "later_cached_tokens": sum(later_cached) if later and len(later_cached) == len(later) else None,
        "request_s": sum(r["total"] for r in results),
        "prompt_tokens": sum(prompt) if prompt else None,
        "cached_tokens": sum(cached) if len(cached) == len(results) else None,
    }


def show(res, label):
    p, c = res["prompt_tokens"], res["cached_tokens"]
    reuse = f"{c} ({100 * c / p:.0f}%)" if c is not None and p else "n/a"
    print(f"\n[{label}] {res['inflight']} in flight: {res['conversations']} conversations x {res['turns']} "
          f"turns, {res['requests']} requests in {res['wall_s']:.1f} s")
    print(f"  completion: {res['completion_tokens']} tokens, {res['completion_tok_s']:.1f} tok/s")
    print(f"  TTFT: p50 {res['ttft_p50_s'] * 1e3:.0f} ms, p99 {res['ttft_p99_s'] * 1e3:.0f} ms")
    print(f"  prompt tokens: {p if p is not None else 'n/a'}, of them cached: {reuse}")
    print("  TTFT by turn (ms, p50/p99): " + "  ".join(
        f"{t + 1}: {v['p50'] * 1e3:.0f}/{v['p99'] * 1e3:.0f}" for t, v in res["ttft_by_turn"].items()))
    print("  prompt tokens cached by turn: " + "  ".join(
        f"{t + 1}: {v['cached'] if v['cached'] is not None else 'n/a'}/{v['prompt']}"
        for t, v in res["ttft_by_turn"].items()))
    lp, lc = res["later_prompt_tokens"], res["later_cached_tokens"]
    share = f"{lc}/{lp} ({100 * lc / lp:.1f}%)" if lc is not None and lp else "n/a"
    print(f"  turns >= 2: TTFT p50 {res['later_ttft_p50_s'] * 1e3:.0f} ms, prompt tokens cached {share}")
    m = res.get("metrics_delta")
    if m:
        print("  /metrics moved: " + ", ".join(f"{k.replace('dray_prefix_cache_', '')} {v:g}"
                                               for k, v in sorted(m.items())))
        us = m.get("dray_prefix_cache_microseconds_total")
        if us is not None and res["request_s"] > 0:
            print(f"  prefix cache lookup+insert: {us / 1e3:.1f} ms = "
                  f"{100 * us / 1e6 / res['request_s']:.3f}% of the requests' time "
                  f"({res['request_s']:.1f} s); per request {us / res['requests']:.0f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (with or without /v1)")
    ap.add_argument("--api-key", default="", help="sent as Authorization: Bearer")
    ap.add_argument("--model", default="", help="model id (default: the first of GET /v1/models)")
    ap.add_argument("--inflight", default="1,4,16", help="comma-separated concurrency levels")
    ap.add_argument("--conversations", type=int, default=0,
                    help="conversations per level (default: max(8, in flight))")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32, help="most tokens per reply")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="", help="name of the server in the report (default: the URL)")
    ap.add_argument("--json", default="", help="append one JSON line per level to this file")
    ap.add_argument("--interleave", action="store_true",
                    help="send turns round-robin over the conversations (turn-major order)")
    ap.add_argument("--metrics", action="store_true",
                    help="read /metrics before and after each level and print the prefix-cache deltas")
    ap.add_argument("--session-ids", action="store_true",
                    help="send X-Session-Id (one per conversation) for sticky routing")
    ap.add_argument("--nonce", default="",
                    help="tag this run's conversations so that no other run shares their cache; "
                         "'auto' = a random one")
    a = ap.parse_args()
    nonce = os.urandom(4).hex() if a.nonce == "auto" else a.nonce
    cli = Client(a.url, a.api_key, a.model, a.max_tokens, a.temperature, a.timeout)
    cli.session_ids = a.session_ids
    if not cli.model:
        cli.model = cli.models()[0]
    label = a.label or a.url
    print(f"chat replay against {a.url} (model {cli.model}), {a.turns} turns, "
          f"{a.max_tokens} tokens per reply, temperature {a.temperature}")
    for level in (int(x) for x in a.inflight.split(",")):
        before = cli.metrics() if a.metrics else {}
        run_id = f"{nonce}.{level}" if nonce else None
        res = run_level(cli, level, a.conversations or max(8, level), a.turns, a.interleave, run_id)
        if a.metrics:
            after = cli.metrics()
            res["metrics_delta"] = {k: after[k] - before.get(k, 0) for k in after
                                    if k.startswith("dray_prefix_cache_")}
        res.update({"server": label, "model": cli.model, "max_tokens": a.max_tokens, "time": time.time(),
                    "nonce": nonce, "session_ids": a.session_ids})
        show(res, label)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
