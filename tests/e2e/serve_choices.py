"""The n > 1 and echo-with-stream checks of test_serve.py: n choices of one
prompt (whole and streamed, chat and text), their prompt prefilled once and
shared through the prefix cache, seeds that give n = 1's first choice, and
echo on a stream. Run from test_serve.py's main."""
import json

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def _check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def _metric(srv, name):
    page = srv.raw("GET", "/metrics")[2].decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in page.splitlines() if ln.startswith(name))


def _events(srv, path, body):
    st, _, data = srv.raw("POST", path, body)
    assert st == 200, data
    out = [json.loads(ln[6:]) for ln in data.decode().split("\n") if ln.startswith("data: {")]
    _check(data.decode().rstrip().endswith("data: [DONE]"), "the stream ends with [DONE]")
    return out


def test_whole(srv, cli, model):
    prompt = "Once upon a time, in a village by the sea, there lived"
    one = cli.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=77)
    hits0 = _metric(srv, "dray_prefix_cache_hit_tokens_total")
    four = cli.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=77, n=4)
    hits = _metric(srv, "dray_prefix_cache_hit_tokens_total") - hits0
    texts = [c.text for c in four.choices]
    _check([c.index for c in four.choices] == [0, 1, 2, 3], "n=4 gives choices 0..3 in order")
    _check(texts[0] == one.choices[0].text, "a seeded request's first choice is what n=1 gives")
    _check(len(set(texts)) > 1, f"seeded choices differ from each other ({len(set(texts))} distinct)")
    n = four.usage.prompt_tokens
    _check(n == one.usage.prompt_tokens and 12 < four.usage.completion_tokens <= 48,
           f"usage counts the prompt once and sums the choices' tokens ({four.usage.completion_tokens})")
    # the choices attach all but the last prompt token from the cache
    _check(hits >= 4 * (n - 2), f"the 4 choices took {hits:.0f} prompt tokens from the cache (prompt {n})")
    greedy = cli.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                         max_tokens=8, temperature=0, n=3)
    _check(len({c.message.content for c in greedy.choices}) == 1 and
           all(c.message.role == "assistant" for c in greedy.choices),
           f"greedy chat choices are identical: {greedy.choices[0].message.content!r}")


def test_stream(srv, model):
    ev = _events(srv, CHAT, {"model": model, "messages": [{"role": "user", "content": "Name a fruit."}],
                             "max_tokens": 6, "temperature": 0.8, "seed": 5, "n": 3, "stream": True,
                             "stream_options": {"include_usage": True}})
    texts, finish, roles = {}, {}, set()
    for e in ev:
        for c in e["choices"]:
            i = c["index"]
            texts[i] = texts.get(i, "") + (c["delta"].get("content") or "")
            if c["delta"].get("role"):
                roles.add(i)
            if c["finish_reason"]:
                _check(i not in finish, f"choice {i} finishes once")
                finish[i] = c["finish_reason"]
    _check(roles == {0, 1, 2} and set(finish) == {0, 1, 2}, "each streamed choice names its role and finishes")
    whole = srv.json(CHAT, {"model": model, "messages": [{"role": "user", "content": "Name a fruit."}],
                            "max_tokens": 6, "temperature": 0.8, "seed": 5, "n": 3})[1]
    _check([texts[i] for i in range(3)] == [c["message"]["content"] for c in whole["choices"]],
           "the streamed choices are the whole body's")
    usage = ev[-1]["usage"]
    _check(not ev[-1]["choices"] and usage == whole["usage"] | {"prompt_tokens_details": usage["prompt_tokens_details"]},
           f"the usage chunk sums the choices: {usage}")


def test_echo_stream(srv, model):
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
            "echo": True, "logprobs": 2}
    whole = srv.json(TEXT, body)[1]["choices"][0]
    ev = _events(srv, TEXT, body | {"stream": True})
    text = "".join(c["text"] for e in ev for c in e["choices"])
    lp = [c["logprobs"] for e in ev for c in e["choices"] if c["logprobs"]]
    tokens = [t for x in lp for t in x["tokens"]]
    offsets = [t for x in lp for t in x["text_offset"]]
    _check(text == whole["text"] and text.startswith("The capital of France is"),
           f"a stream echoes the prompt first: {text!r}")
    _check(tokens == whole["logprobs"]["tokens"] and offsets == whole["logprobs"]["text_offset"] and
           lp[0]["token_logprobs"][0] is None,
           "its log-probabilities are the whole body's, the first prompt token's null")
    four = srv.json(TEXT, body | {"n": 2})[1]["choices"]
    _check(all(c["text"] == whole["text"] and c["logprobs"]["token_logprobs"] == whole["logprobs"]["token_logprobs"]
               for c in four), "echo with n=2: every choice has the prompt and its scores")


def test_refused(srv):
    for body, param in [({"prompt": "a", "n": 17}, "n"), ({"prompt": "a", "n": 2, "best_of": 3}, "best_of")]:
        st, d = srv.json(TEXT, body)
        _check(st == 400 and d["error"]["param"] == param, f"{body}: 400 naming {param!r}")


def test_choices(srv, cli, model):
    test_whole(srv, cli, model)
    test_stream(srv, model)
    test_echo_stream(srv, model)
    test_refused(srv)
