"""The logprobs checks of test_serve.py: chat logprobs and top_logprobs (whole
and streamed), /v1/completions' logprobs N, echo with token-id prompts (what
lm-evaluation-harness sends) and the 400s. Run from test_serve.py's main."""
import json
import math

CHAT = "/v1/chat/completions"


def _check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def _refused(srv, path, body, param, what):
    st, d = srv.json(path, body)
    _check(st == 400 and d["error"]["param"] == param, f"{what}: 400 naming {param!r} ({d['error']['message']})")


def _chat_lp(srv, stream=False):
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 5, "stream": stream}
    if not stream:
        st, d = srv.json(CHAT, body)
        assert st == 200, d
        return d["choices"][0]["message"]["content"], d["choices"][0]["logprobs"]["content"]
    _, _, data = srv.raw("POST", CHAT, body)
    text, content = "", []
    for line in data.decode().split("\n"):
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"][0]
            text += ch["delta"].get("content") or ""
            content += (ch.get("logprobs") or {}).get("content") or []
    return text, content


def test_chat(srv):
    text, content = _chat_lp(srv)
    _check(len(content) > 0 and all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} for e in content),
           f"chat logprobs.content has an entry per token ({len(content)})")
    _check(all(len(e["top_logprobs"]) == 5 and sum(math.exp(t["logprob"]) for t in e["top_logprobs"]) <= 1 + 1e-5
               for e in content), "5 top_logprobs each, their probabilities sum to <= 1")
    _check(all(e["top_logprobs"][0]["token"] == e["token"] and
               abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6 for e in content),
           "at temperature 0 the chosen token is the top one, with its logprob")
    _check(bytes(b for e in content for b in e["bytes"]).decode() == text,
           f"the tokens' bytes make the reply {text!r}")
    s_text, s_content = _chat_lp(srv, stream=True)
    _check(s_text == text and [e["token"] for e in s_content] == [e["token"] for e in content] and
           all(abs(a["logprob"] - b["logprob"]) < 1e-3 for a, b in zip(s_content, content)),
           "streamed chunks carry the same tokens' logprobs")


def test_completions(srv):
    st, d = srv.json("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 5,
                                          "temperature": 0, "logprobs": 3})
    lp = d["choices"][0]["logprobs"]
    n = d["usage"]["completion_tokens"]
    _check(st == 200 and set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"} and
           all(len(lp[k]) == n for k in lp), f"completions logprobs: 4 lists of {n}")
    _check(all(len(t) <= 4 and max(t, key=t.get) == tok for t, tok in zip(lp["top_logprobs"], lp["tokens"])),
           "top_logprobs dicts: 3 and the chosen token, the greedy one the most likely")
    _check("".join(lp["tokens"]) == d["choices"][0]["text"] and lp["text_offset"][0] == 0,
           "tokens join to the text; text_offset starts at 0")
    return lp


def test_echo(srv, greedy):
    prompt = "The capital of France is"
    st, tk = srv.json("/tokenize", {"prompt": prompt})
    ids = tk["tokens"]
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    st, d = srv.json("/v1/completions", body)
    c = d["choices"][0]
    lp = c["logprobs"]
    _check(st == 200 and c["text"] == prompt and d["usage"]["completion_tokens"] == 0,
           "echo with max_tokens 0 on token ids gives the prompt alone")
    _check(len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and
           all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:]),
           f"echo scores the {len(ids)} prompt tokens, the first null")
    st, d2 = srv.json("/v1/completions", body)  # the prefix cache holds it now: still scored
    _check(d2["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"],
           "a repeated echo is scored again, not skipped by the prefix cache")
    st, tk = srv.json("/tokenize", {"prompt": " ".join(f"word{i}" for i in range(40))})
    st, d4 = srv.json("/v1/completions", dict(body, prompt=tk["tokens"]))
    _check(len(d4["choices"][0]["logprobs"]["token_logprobs"]) == len(tk["tokens"]) > 100,
           f"a prompt of {len(tk['tokens'])} tokens is scored whole (32 prompt rows a step)")
    # the greedy continuation's first token scored as part of a prompt: the same
    # number the sampling row gave it (prompt rows and the sampling row agree)
    st, tk2 = srv.json("/tokenize", {"prompt": prompt + greedy["tokens"][0]})
    if tk2["tokens"][:len(ids)] == ids and len(tk2["tokens"]) == len(ids) + 1:
        st, d3 = srv.json("/v1/completions", dict(body, prompt=tk2["tokens"], max_tokens=1))
        l3 = d3["choices"][0]["logprobs"]
        _check(abs(l3["token_logprobs"][len(ids)] - greedy["token_logprobs"][0]) < 2e-3 and
               len(l3["tokens"]) == len(ids) + 2,
               "a generated token's logprob equals its score as a prompt token (echo, max_tokens 1)")


def test_refused(srv):
    msgs = [{"role": "user", "content": "hi"}]
    _refused(srv, CHAT, {"messages": msgs, "top_logprobs": 2}, "top_logprobs", "top_logprobs without logprobs")
    _refused(srv, CHAT, {"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs 21")
    _refused(srv, "/v1/completions", {"prompt": "a", "logprobs": 6}, "logprobs", "completions logprobs 6")
    _refused(srv, "/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens", "max_tokens 0 without echo")
    st, d = srv.json("/v1/completions", {"prompt": [2, 10 ** 7], "echo": True, "max_tokens": 0})
    _check(st == 400 and d["error"]["param"] == "prompt" and "prompt[1]" in d["error"]["message"],
           f"an id outside the vocabulary is a 400 naming its index ({d['error']['message']})")


def test_logprobs(srv):
    test_chat(srv)
    greedy = test_completions(srv)
    test_echo(srv, greedy)
    test_refused(srv)
