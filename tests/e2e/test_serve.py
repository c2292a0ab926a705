"""End-to-end test of `dray serve` with real clients: the `openai` Python package
and curl, against a server started here on a free loopback port with the real
Gemma 3 270M model. Replies are short (the model is a small base model; what is
checked is the protocol, the limits and that batching changes no greedy token).

usage: test_serve.py --dray build/tools/dray --model .models/gemma-3-270m-q4_k_m.gguf
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

from serve_choices import test_choices
from serve_logprobs import test_logprobs

KEY = "test-key-7f3a"
NAMES = ["dray-e2e", "org/alias-270m"]  # served_model_name: what clients call the model
PROMPTS = [
    "Once upon a time", "The capital of France is", "def fibonacci(n):", "My favourite colour is",
    "In 1969, the first", "The recipe calls for", "Water boils at", "The quick brown fox",
    "Dear diary, today", "The meaning of life is", "A list of prime numbers: 2, 3,", "To be or not to be",
    "The weather tomorrow will be", "Photosynthesis is the process", "In a galaxy far", "My dog likes to",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, dray, model, extra=(), launch=()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.launched = bool(launch)
        cmd = list(launch) + [dray, "serve", "--model", model, "--port", str(self.port),
               "-t", "2", "-c", "1024", "--set", "max_seqs=16", "--set", "max_prompt_tokens=200",
               "--set", "max_completion_tokens=64", "--set", "shutdown_grace=5",
               "--served-model-name", ",".join(NAMES)] + list(extra)
        self.file_id = os.path.basename(model)[:-len(".gguf")]
        print("starting:", " ".join(cmd))
        # the key comes from the environment (--api-key would show it in ps)
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, DRAY_API_KEY=KEY))
        self.log = []
        self.ready = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self.ready.wait(300) or self.proc.poll() is not None:
            self.proc.kill()
            sys.exit("server did not start:\n" + "".join(self.log))

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on" in line:
                self.ready.set()

    def json(self, path, body):
        """(status, decoded JSON) of a POST with the key."""
        st, _, data = self.raw("POST", path, body)
        return st, json.loads(data)

    def raw(self, method, path, body=None, key=KEY, headers=None):
        """(status, headers, body bytes) of one plain HTTP request."""
        h = {"Authorization": f"Bearer {key}"} if key else {}
        h.update(headers or {})
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def expect_error(srv, status, body, code=None, param=None, key=KEY, path="/v1/chat/completions"):
    st, hdr, data = srv.raw("POST", path, body, key=key)
    err = json.loads(data)["error"]
    check(st == status and set(err) == {"message", "type", "param", "code"} and
          (code is None or err["code"] == code) and (param is None or err["param"] == param),
          f"{status} {code or ''} {param or ''} for {body if isinstance(body, dict) else body[:30]!r}: {err['message']}")
    return hdr


def test_basics(cli, model):
    ids = [m.id for m in cli.models.list().data]
    check(ids == NAMES and model == NAMES[0], f"/v1/models lists the served names {ids}")
    r = cli.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                    max_tokens=8, temperature=0)
    c = r.choices[0]
    check(c.message.role == "assistant" and isinstance(c.message.content, str) and
          c.finish_reason in ("stop", "length"), f"chat reply {c.message.content!r} ({c.finish_reason})")
    check(r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 8 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens and
          r.usage.prompt_tokens_details.cached_tokens is not None, f"usage {r.usage}")
    r = cli.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0)
    check(r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length",
          f"max_tokens=5 gives 5 tokens, finish 'length': {r.choices[0].text!r}")


def test_stop(cli, model):
    full = cli.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                  temperature=0).choices[0].text
    words = full.split()
    stop = words[len(words) // 2]
    r = cli.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0,
                               stop=[stop, "@@never@@"])
    check(r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop",
          f"stop {stop!r} cuts {full!r} to {r.choices[0].text!r}")


def test_stream(cli, model):
    msgs = [{"role": "user", "content": "Name three fruits."}]
    whole = cli.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
    chunks = list(cli.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(chunks[0].choices[0].delta.role == "assistant", "the first chunk names the role")
    check(text == whole.choices[0].message.content, f"stream text equals the whole reply: {text!r}")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finish == [whole.choices[0].finish_reason], f"one finishing chunk: {finish}")
    check(not chunks[-1].choices and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
          f"last chunk carries the usage: {chunks[-1].usage}")


def test_seed(cli, model):
    def sample(seed):
        return cli.completions.create(model=model, prompt="My favourite animal is", max_tokens=10,
                                      temperature=1.0, top_p=1, seed=seed).choices[0].text
    a, b = sample(1234), sample(1234)
    check(a == b, f"seed 1234 twice gives the same text: {a!r}")
    others = {sample(s) for s in (1, 2, 3)}
    check(len(others | {a}) > 1, f"other seeds give other texts ({len(others | {a})} distinct)")


def test_errors(srv, cli, model):
    bad = openai.OpenAI(base_url=srv.base + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        check(False, "a wrong API key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "a wrong API key gets 401")
    expect_error(srv, 401, {"messages": []}, code="invalid_api_key", key=None)
    check(srv.raw("GET", "/health", key=None)[0] == 200, "/health needs no key")
    st, _, data = srv.raw("HEAD", "/health", key=None)
    check(st == 200 and data == b"", "HEAD /health is GET without the body")
    st, _, data = srv.raw("BREW", "/health")
    check(st == 501 and json.loads(data)["error"]["code"] == "not_implemented",
          "an unknown method gets 501 in OpenAI's error JSON")
    check(srv.raw("DELETE", "/health")[0] == 405, "a known method on the wrong path gets 405")
    check(srv.raw("GET", "/health%00.json", key=None)[0] in (401, 404),
          "a %00 in the path is not cut there: /health%00.json is not /health")
    check(srv.raw("GET", "/v1/%6dodels")[0] == 200, "other escapes still decode (/v1/%6dodels)")
    expect_error(srv, 400, b'{"messages": [', param=None)
    expect_error(srv, 400, {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
                 param="temperature")
    expect_error(srv, 400, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65},
                 param="max_tokens")
    expect_error(srv, 400, {"messages": [{"role": "bot", "content": "hi"}]}, param="messages[0].role")
    expect_error(srv, 413, b"{" + b" " * (2 << 20) + b"}", code="request_too_large")
    try:
        cli.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found", "an unknown model gets 404")
    try:
        cli.completions.create(model=model, prompt="word " * 400, max_tokens=4)
        check(False, "a too long prompt is refused")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", f"a too long prompt gets 400: {e.message}")


def test_models(srv, cli, model):
    st, _, data = srv.raw("GET", "/v1/models")
    listed = json.loads(data)["data"]
    check(all(m["max_model_len"] == 1024 and m["root"] == srv.file_id for m in listed),
          "each model object reports max_model_len (the context) and the file as root")
    for name in NAMES + [srv.file_id]:
        check(cli.models.retrieve(name).id == name, f"GET /v1/models/{name} (models.retrieve)")
        r = cli.completions.create(model=name, prompt="Hello", max_tokens=2, temperature=0)
        check(r.model == NAMES[0], f"a request naming {name!r} is served, reported as {r.model!r}")
    try:
        cli.models.retrieve("gpt-4o")
        check(False, "an unknown model id is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found", "GET /v1/models/gpt-4o gets 404")
    try:
        cli.completions.create(model="dray-e2e-typo", prompt="Hello", max_tokens=2)
        check(False, "an unknown model name is refused")
    except openai.NotFoundError as e:
        check(e.param == "model", f"an unknown model name gets 404 naming 'model': {e.message}")


def test_fields(srv, cli, model):
    msgs = [{"role": "user", "content": "hi"}]
    for body, param in [({"messages": msgs, "frequncy_penalty": 1}, "frequncy_penalty"),
                        ({"messages": msgs, "function_call": "auto"}, "function_call"),
                        ({"messages": msgs, "response_format": {"type": "yaml"}}, "response_format.type"),
                        ({"messages": msgs, "tool_choice": "auto"}, "tool_choice"),
                        ({"messages": msgs, "logit_bias": {"99999999": -100}}, "logit_bias"),
                        ({"messages": msgs, "stop_token_ids": [99999999]}, "stop_token_ids"),
                        ({"messages": msgs, "presence_penalty": 2.5}, "presence_penalty")]:
        expect_error(srv, 400, body, param=param)
    st, hdr, data = srv.raw("POST", "/v1/completions", {"prompt": "a", "echoo": True})
    check(json.loads(data)["error"]["message"] == "Unrecognized request argument supplied: echoo",
          "an unknown field gets OpenAI's message")
    try:
        cli.chat.completions.create(model=model, messages=msgs, max_tokens=2, extra_body={"bogus": 1})
        check(False, "the openai client's extra field is refused")
    except openai.BadRequestError as e:
        check(e.param == "bogus", f"openai.BadRequestError names the field: {e.message}")
    # null is "not given": clients send it for fields they leave unset
    st, _ = srv.json("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "stop": None, "n": None,
                                              "logit_bias": None, "tools": None, "seed": None, "nope": None})
    check(st == 200, "fields set to null are taken as absent")
    r = cli.chat.completions.create(model=model, messages=msgs, max_tokens=2, stop=None,
                                    response_format={"type": "text"}, tool_choice="none")
    check(r.choices[0].finish_reason in ("stop", "length"), "response_format text and tool_choice none pass")


def completion(cli, model, prompt, n, **extra):
    r = cli.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0, extra_body=extra)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens


def test_sampling_fields(srv, cli, model):
    plain = completion(cli, model, "Once upon a time", 16)[0]
    for field, value in [("frequency_penalty", 1.5), ("presence_penalty", 1.5), ("repetition_penalty", 1.5)]:
        text = completion(cli, model, "Once upon a time", 16, **{field: value})[0]
        check(text != plain, f"{field} {value} changes the greedy text {plain!r} to {text!r}")
    # logit_bias: the greedy first token pushed down gives another first token
    first = completion(cli, model, "The capital of France is", 1)[0]
    tok = srv.json("/tokenize", {"prompt": first, "add_special_tokens": False})[1]["tokens"][0]
    other = completion(cli, model, "The capital of France is", 1, logit_bias={str(tok): -100})[0]
    check(other != first, f"logit_bias -100 on token {tok} ({first!r}) gives {other!r}")
    # stop_token_ids: the first token of the reply not seen before it ends the reply there
    full = completion(cli, model, "The capital of France is", 8)[0]
    ids = srv.json("/tokenize", {"prompt": full, "add_special_tokens": False})[1]["tokens"]
    i = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    text, finish, n = completion(cli, model, "The capital of France is", 8, stop_token_ids=[ids[i]])
    check(finish == "stop" and n == i and full.startswith(text) and len(text) < len(full),
          f"stop_token_ids [{ids[i]}] ends {full!r} after {i} tokens: {text!r}")
    # ignore_eos and min_tokens, on a reply made to end at once: the end of turn pushed up
    turn = srv.json("/tokenize", {"messages": [{"role": "user", "content": "Hi"}],
                                  "add_generation_prompt": False})[1]["tokens"]
    eot = turn[-2]  # the template's end of turn, then "\n"
    msgs = [{"role": "user", "content": "Hi"}]
    def chat(**extra):
        r = cli.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                        extra_body=dict(logit_bias={str(eot): 100}, **extra))
        return r.choices[0].finish_reason, r.usage.completion_tokens
    check(chat() == ("stop", 0), f"the end of turn ({eot}) at +100 ends the reply at once")
    check(chat(ignore_eos=True) == ("length", 6), "ignore_eos runs on to max_tokens")
    check(chat(min_tokens=3) == ("stop", 3), "min_tokens 3 holds the end back for 3 tokens")


def test_tokenize(srv, cli, model):
    text = "Hello world, how are you?"
    st, t = srv.json("/tokenize", {"model": NAMES[1], "prompt": text})
    check(st == 200 and t["count"] == len(t["tokens"]) and t["max_model_len"] == 1024,
          f"/tokenize: {t}")
    bare = srv.json("/tokenize", {"prompt": text, "add_special_tokens": False})[1]
    check(bare["tokens"] == t["tokens"][1:], "add_special_tokens false leaves out BOS")
    st, d = srv.json("/detokenize", {"tokens": t["tokens"]})
    check(st == 200 and d["prompt"] == text, f"/detokenize gives the text back: {d}")
    r = cli.completions.create(model=model, prompt=text, max_tokens=1)
    check(r.usage.prompt_tokens == t["count"], "a prompt's count is what /v1/completions counts")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    m = srv.json("/tokenize", {"messages": msgs})[1]
    r = cli.chat.completions.create(model=model, messages=msgs, max_tokens=1)
    check(r.usage.prompt_tokens == m["count"], "messages' count is what /v1/chat/completions counts")
    expect_error(srv, 400, {"tokens": [1, 99999999]}, param="tokens", path="/detokenize")
    expect_error(srv, 400, {"prompt": "a", "max_tokens": 4}, param="max_tokens", path="/tokenize")
    expect_error(srv, 404, {"model": "gpt-4o", "prompt": "a"}, param="model", path="/tokenize")
    expect_error(srv, 401, {"prompt": "a"}, code="invalid_api_key", key=None, path="/tokenize")
    ok = 'dray_http_requests_total{code="200"}'
    before = metrics(srv)[ok]
    srv.json("/tokenize", {"prompt": "a"})
    srv.json("/detokenize", {"tokens": [2]})
    check(metrics(srv)[ok] == before + 3, "/tokenize and /detokenize count in /metrics (as does /metrics)")
    check(re.search(r"POST /tokenize 200 ", "".join(srv.log)), "and have their log line")


def test_concurrent(cli, model):
    def alone(p):
        return cli.completions.create(model=model, prompt=p, max_tokens=8, temperature=0).choices[0].text

    def streamed(p):
        s = cli.completions.create(model=model, prompt=p, max_tokens=8, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in s if c.choices)

    ref = [alone(p) for p in PROMPTS]
    t0 = time.time()
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(streamed, PROMPTS))
    print(f"16 concurrent streams took {time.time() - t0:.1f} s")
    for p, a, b in zip(PROMPTS, ref, got):
        check(a == b, f"{p!r}: batched stream equals the request alone ({b!r})")


def metrics(srv):
    page = srv.raw("GET", "/metrics")[2].decode()
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in page.splitlines() if not ln.startswith("#"))}


def test_disconnect(srv):
    key = 'dray_scheduler_requests_total{replica="0",outcome="cancelled"}'
    m0 = metrics(srv)
    before = m0[key]
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": 64, "temperature": 0, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " +
                  KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        s.recv(1)  # the response has started; closing with unread data resets the connection
    loops = 0
    for _ in range(600):
        m = metrics(srv)
        loops += 1
        if m[key] > before and m['dray_running_sequences{replica="0"}'] == 0:
            break
        time.sleep(0.1)
    check(m[key] == before + 1 and m['dray_running_sequences{replica="0"}'] == 0,
          "a client that goes away cancels its request (scheduler counts it, its sequence is gone)")
    check(m.get('dray_http_requests_total{code="499"}', 0) >= 1, "and it is counted as 499")
    # once, as its log line says, not also as the 200 its status line began with:
    # the only 200s since m0 are the /metrics reads themselves (m0 and all but the
    # last of the loop's, each counted once it is served)
    n200 = 'dray_http_requests_total{code="200"}'
    check(m.get(n200, 0) - m0.get(n200, 0) <= loops, "a left stream is not counted as 200 too")


def test_disconnect_plain(srv):
    """A client that leaves a non-streamed request: one 499 log line, no
    libmicrohttpd "internal error" before it."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0,
                       "ignore_eos": True}).encode()
    n0 = len(srv.log)
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " +
                  KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)  # generating; then the client goes
    for _ in range(600):
        if any("POST /v1/completions 499" in ln for ln in srv.log[n0:]):
            break
        time.sleep(0.1)
    new = srv.log[n0:]
    check(any("POST /v1/completions 499" in ln for ln in new), "a non-streamed disconnect logs 499")
    check(not any("internal error" in ln for ln in new),
          "and no libmicrohttpd 'internal error' line: " + "".join(new)[-300:])


def status_of(srv, request):
    """The status code of the answer to raw request bytes, or None when the
    connection closes without one."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return None
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_framing(srv):
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    body = b'{"prompt":"a","max_tokens":1}'
    post = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + auth
    check(status_of(srv, post + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(body) + body) == 400,
          "two different Content-Lengths get 400 (RFC 9112 6.3: a smuggling risk behind a proxy)")
    check(status_of(srv, b"GET /health HTTP/1.1\r\n\r\n") == 400, "HTTP/1.1 without Host gets 400")
    check(status_of(srv, b"GET /health HTTP/1.0\r\n\r\n") == 200, "HTTP/1.0 needs no Host")
    check(status_of(srv, post + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body) == 415,
          "a gzip Content-Encoding gets 415, not a body read as plain JSON")
    st = status_of(srv, post + b"Transfer-Encoding: gzip\r\n\r\n")
    check(st in (400, 501), f"Transfer-Encoding gzip gets an answer ({st}), not a silent close")
    check(status_of(srv, post + b"Content-Length: %d\r\n\r\n" % len(body) + body) == 200,
          "a well-framed request still gets 200")


def test_curl(srv):
    out = subprocess.run(["curl", "-sSN", "-i", "-H", f"Authorization: Bearer {KEY}", srv.base +
                          "/v1/chat/completions", "-d", json.dumps({
                              "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                              "temperature": 0, "stream": True})],
                         capture_output=True, text=True, check=True).stdout
    head, _, body = out.replace("\r\n", "\n").partition("\n\n")
    check(re.search(r"(?im)^content-type: text/event-stream", head), "SSE content type")
    events = body.split("\n\n")
    check(events[-1] == "" and events[-2] == "data: [DONE]", "the stream ends with 'data: [DONE]'")
    check(len(events) > 4 and all(ev.startswith("data: ") and "\n" not in ev and
                                  json.loads(ev[6:])["object"] == "chat.completion.chunk"
                                  for ev in events[:-2]),
          f"{len(events) - 2} chunks, each one 'data: {{json}}' line and a blank line")
    page = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {KEY}", srv.base + "/metrics"],
                          capture_output=True, text=True, check=True).stdout
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_]+="[^"]*"(,[a-zA-Z_]+="[^"]*")*\})? '
                        r'[-+]?([0-9.]+([eE][-+]?[0-9]+)?|Inf|NaN)$')
    values = {}
    for line in page.splitlines():
        if line.startswith("#"):
            if not re.match(r"^# (HELP|TYPE) [a-z_]+ \S", line):
                raise AssertionError(f"/metrics comment does not parse: {line!r}")
            continue
        if not sample.match(line):
            raise AssertionError(f"/metrics line does not parse: {line!r}")
        name, v = line.rsplit(" ", 1)
        values[name] = float(v)
    check(values.get('dray_http_requests_total{code="401"}', 0) >= 2 and
          values.get('dray_http_requests_total{code="200"}', 0) >= 20, "/metrics parses; counts by status")
    check(values['dray_completion_tokens_total{replica="0"}'] > 100 and values['dray_kv_blocks_total{replica="0"}'] > 0 and
          values['dray_time_to_first_token_seconds_bucket{replica="0",le="+Inf"}'] ==
          values['dray_time_to_first_token_seconds_count{replica="0"}'], "/metrics tokens, KV blocks, TTFT histogram")


def test_shutdown(srv):
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(60)
    time.sleep(0.2)
    log = "".join(srv.log)
    if srv.launched:  # mpirun exits 1 after any signal: the ranks' own ends are in its log
        rc = 0 if not re.search(r"exited on signal|non-zero (exit|status)", log) else rc or 1
    check(rc == 0 and "SIGTERM" in log and "stopped" in log, f"SIGTERM: exit {rc}")
    check(re.search(r"POST /v1/chat/completions 200 prompt=\d+ cached=\d+ completion=\d+ ms=", log),
          "one log line per request")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--launch", default="", help="command line the server runs under (mpirun -np 2 ...)")
    ap.add_argument("--set", action="append", default=[], help="config KEY=VALUE for the server")
    a = ap.parse_args()
    extra = [x for kv in a.set for x in ("--set", kv)]
    if a.launch.startswith("mpirun"):  # CI runs as root; 2 ranks on 2 cores
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                          OMPI_MCA_rmaps_base_oversubscribe="1")
    srv = Server(a.dray, a.model, extra, a.launch.split())
    try:
        cli = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        model = cli.models.list().data[0].id
        steps = [lambda: test_basics(cli, model), lambda: test_stop(cli, model),
                 lambda: test_stream(cli, model), lambda: test_seed(cli, model),
                 lambda: test_errors(srv, cli, model), lambda: test_models(srv, cli, model),
                 lambda: test_fields(srv, cli, model), lambda: test_sampling_fields(srv, cli, model),
                 lambda: test_tokenize(srv, cli, model), lambda: test_logprobs(srv),
                 lambda: test_choices(srv, cli, model),
                 lambda: test_concurrent(cli, model),
                 lambda: test_disconnect(srv), lambda: test_disconnect_plain(srv), lambda: test_framing(srv), lambda: test_curl(srv),
                 lambda: test_shutdown(srv)]
        for step in steps:
            t0 = time.time()
            step()
            print(f"  ({time.time() - t0:.1f} s)")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    print("all server checks passed")


if __name__ == "__main__":
    main()
