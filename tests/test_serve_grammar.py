"""`dray serve` against hostile grammars (issue 51), on a tiny random model:

  crash     a `grammar` of 45,000 nested parentheses (it killed the server with
            SIGSEGV): 400 naming grammar_max_depth and where, within 2 s
  hang      a 290-byte grammar of loops stacked on '.' and a class (no answer in
            40 s): 400 naming the stacked repetition, within 2 s
  cost      12,000 alternatives (0.5 s of mask per token): 400 naming
            grammar_max_alternatives, within 2 s
  budget    a grammar within every size limit whose steps cost seconds: that
            request ends with a 400 naming grammar_step_ms within 2 s, while a
            plain request sent beside it is answered 200
  fields    a grammar over the element limit (lowered to 300) from `tools` or
            `response_format`:
            `param` names the field, the message has one "grammar:" at most
  gone      a client that disconnects while its request is inside a long
            grammar step (grammar_step_ms 3000): the request ends "cancelled"
            (not "failed" by the budget) within that step
  sigterm   SIGTERM while a request is inside a long grammar step: the process
            ends within shutdown_grace + grammar_step_ms (+ 2 s of slack)
and /health answers after each.

Python's standard library only. usage: test_serve_grammar.py --dray DRAY --writer WRITE_TINY_GEMMA
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        fails.append(what)


def post(port, path, body, timeout=60):
    """(status, parsed JSON body, seconds)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), time.time() - t0


def health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def completion(grammar, n=16):
    return {"prompt": "Hello", "max_tokens": n, "temperature": 0, "grammar": grammar}


def hostile_stacked():
    """About 290 bytes: runs of '+' and '?' on '.' and on a class, as filed."""
    g = "root ::= item+\nitem ::= ." + "+" * 60 + "?" * 60 + " [a-z]" + "+" * 60 + "?" * 60 + "\n"
    return g


def alternatives(n):
    return "root ::= " + " | ".join('"%s"' % (chr(97 + i % 26) + chr(97 + i // 26 % 26) + chr(97 + i // 676 % 26))
                                     for i in range(n))


def costly():
    """Within every size limit, but after its first character one transition
    builds 1024 x 1024 stacks: two rules of 1024 alternatives, one inside the
    other."""
    return "\n".join([
        'root ::= "q" body',
        "body ::= r0 body | r0",
        "r0 ::= " + " | ".join(f'r1 "{chr(97 + i % 26)}"' for i in range(1024)),
        "r1 ::= " + " | ".join(f'"{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}"' for i in range(1024)),
    ]) + "\n"


def refused(port, name, body, want_param, wants, path="/v1/completions"):
    st, js, secs = post(port, path, body)
    err = js.get("error", {})
    msg = err.get("message", "")
    ok = st == 400 and err.get("param") == want_param and all(w in msg for w in wants)
    check(ok and secs < 2, f"{name}: {st} in {secs:.2f} s, param {err.get('param')!r}: {msg[:160]!r}")
    check("grammar: grammar:" not in msg and msg.count("grammar: ") <= 1,
          f"{name}: the message has one prefix")
    check(health(port), f"{name}: /health answers after it")


def check_budget(port):
    got = {}

    def plain():
        got["plain"] = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0})

    t = threading.Thread(target=plain)
    t.start()
    st, js, secs = post(port, "/v1/completions", completion(costly()))
    t.join(60)
    msg = js.get("error", {}).get("message", "")
    check(st == 400 and "grammar_step" in msg and secs < 2,
          f"costly steps: {st} in {secs:.2f} s: {msg[:160]!r}")
    pst = got.get("plain", (0, {}, 0))
    check(pst[0] == 200, f"a plain request beside it: {pst[0]} in {pst[2]:.2f} s")


def check_fields(port):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 40} for i in range(8)},
              "required": [f"p{i}" for i in range(8)]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    refused(port, "tools over the element limit", dict(chat, tools=tools, tool_choice="required"), "tools",
            ["grammar_max_elements", "line "], "/v1/chat/completions")
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    refused(port, "response_format over the element limit", dict(chat, response_format=rf), "response_format",
            ["grammar_max_elements", "line "], "/v1/chat/completions")


def start(dray, model, tmp, sets):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logf = tempfile.TemporaryFile(mode="w+")
    args = [dray, "serve", "-m", model, "--port", str(port), "-t", "1", "-c", "64"]
    for kv in sets:
        args += ["--set", kv]
    proc = subprocess.Popen(args, stderr=logf, env=dict(os.environ, DRAY_CACHE_DIR=os.path.join(tmp, "cache")))

    def log():
        logf.seek(0)
        return logf.read()
    end = time.time() + 60
    while "listening on" not in log():
        if proc.poll() is not None or time.time() > end:
            sys.exit("FAIL: the server did not start:\n" + log())
        time.sleep(0.1)
    return proc, port, log


def outcomes(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        page = r.read().decode()
    got = {}
    for line in page.splitlines():
        if line.startswith("dray_scheduler_requests_total{"):
            got[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return got


def check_gone(port, step_ms):
    before = outcomes(port)
    body = json.dumps(completion(costly())).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.5)  # inside its first step
    t0 = time.time()
    s.close()
    now = before
    while time.time() - t0 < step_ms / 1000 + 2 and now.get("cancelled", 0) == before.get("cancelled", 0) \
            and now.get("failed", 0) == before.get("failed", 0):
        time.sleep(0.05)
        now = outcomes(port)
    secs = time.time() - t0
    check(now.get("cancelled", 0) == before.get("cancelled", 0) + 1 and secs < step_ms / 1000,
          f"a client gone inside a {step_ms} ms step: its request ended cancelled after {secs:.2f} s "
          f"(outcomes {now})")


def check_sigterm(dray, model, tmp):
    grace, step_ms = 1, 3000
    # no stack budget to speak of: only the clock ends the step
    proc, port, log = start(dray, model, tmp, [f"shutdown_grace={grace}", f"grammar_step_ms={step_ms}",
                                               "grammar_step_stacks=268435456"])
    try:
        check_gone(port, step_ms)
        got = {}

        def send():
            try:
                got["r"] = post(port, "/v1/completions", completion(costly()))
            except OSError as e:  # the server went away while answering
                got["r"] = (0, {"error": str(e)}, 0)
        t = threading.Thread(target=send, daemon=True)
        t.start()
        time.sleep(0.5)  # admitted, inside its first step
        check(not got, "the request is still inside its step when SIGTERM comes")
        t0 = time.time()
        proc.terminate()
        try:
            rc = proc.wait(grace + step_ms / 1000 + 2)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.time() - t0
        t.join(5)
        r = got.get("r", (0, {}, 0))
        print(f"     the request was answered {r[0]}: {json.dumps(r[1])[:160]}")
        check(rc == 0, f"SIGTERM inside a {step_ms} ms grammar step, grace {grace} s: exit {rc} after {secs:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            print(log()[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--writer", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.writer, model], check=True)
        proc, port, log = start(a.dray, model, tmp, [])
        t0 = time.time()
        try:
            refused(port, "45,000 nested parentheses", completion("root ::= " + "(" * 45000 + '"x"' + ")" * 45000),
                    "grammar", ["grammar_max_depth", "line 1, column 1034"])
            g = hostile_stacked()
            refused(port, f"{len(g)} bytes of stacked loops", completion(g), "grammar",
                    ["unbounded repetition of an item that is already one", "line 2, column 12"])
            refused(port, "12,000 alternatives", completion(alternatives(12000)), "grammar",
                    ["grammar_max_alternatives", "12000 alternatives"])
            check_budget(port)
            proc.terminate()
            rc = proc.wait(30)
            check(rc == 0, f"the server stops cleanly (exit {rc})")
            proc, port, log = start(a.dray, model, tmp, ["grammar_max_elements=300"])
            check_fields(port)
            proc.terminate()
            proc.wait(30)
            check_sigterm(a.dray, model, tmp)
            print(f"{'PASS' if not fails else f'{len(fails)} check(s) failed'} ({time.time() - t0:.1f} s)")
        finally:
            if proc.poll() is None:
                proc.kill()
            if fails:
                print(log()[-3000:])
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
