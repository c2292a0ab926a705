"""`dray serve` against hostile clients, on a tiny random model:

  slots     half-sent requests ("GET /he" and nothing more) from one address
            take at most max_connections_per_ip slots: the next connection from
            it is closed at once rather than left hanging, another address
            (127.0.0.2: Linux routes all of 127/8 to loopback) still gets
            /health, and after header_timeout the slots are free again. 112
            half-sent connections from 14 addresses (more than the old limit of
            max_queue + max_seqs + 32 = 104) leave /health answering.
  malformed requests libmicrohttpd refuses itself: one status line each (0.9.75
            sent two after a bad Content-Length), OpenAI's error JSON where dray
            can send it, a log line and a count answered_by="libmicrohttpd".

Python's standard library only. usage: test_serve_hostile.py --dray DRAY --writer WRITE_TINY_GEMMA
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PER_IP, TIMEOUT = 8, 2
fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        fails.append(what)


def connect(port, src="127.0.0.1"):
    s = socket.socket()
    s.settimeout(10)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_within(s, secs):
    """Whether the server closes s (EOF or reset, nothing sent) within secs."""
    s.settimeout(secs)
    try:
        return s.recv(4096) == b""
    except socket.timeout:
        return False
    except ConnectionError:
        return True


def raw(port, request, src="127.0.0.1"):
    """Everything the server sends back to request bytes, until it closes."""
    s = connect(port, src)
    data = b""
    try:
        s.sendall(request)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionError, socket.timeout):
        pass
    s.close()
    return data


def health(port, src):
    d = raw(port, b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", src)
    return d.split(b"\r\n", 1)[0] == b"HTTP/1.1 200 OK" and b'"status":"ok"' in d


def check_slots(port):
    held = [connect(port) for _ in range(PER_IP)]
    for s in held:
        s.sendall(b"GET /he")
    time.sleep(0.3)
    extra = [connect(port) for _ in range(20 - PER_IP)]
    refused = sum(closed_within(s, 2) for s in extra)
    check(refused == len(extra), f"with {PER_IP} half-sent connections open, {refused} of the "
          f"{len(extra)} more from the same address are closed at once")
    check(not any(closed_within(s, 0.05) for s in held), f"the {PER_IP} half-sent ones are still open")
    check(health(port, "127.0.0.2"), "/health from another address (127.0.0.2) answers 200")
    t0 = time.time()
    gone = all(closed_within(s, TIMEOUT + 3) for s in held)
    check(gone, f"header_timeout={TIMEOUT}: the half-sent connections are closed ({time.time() - t0:.1f} s)")
    # libmicrohttpd frees a slot when it reaps the connection's thread, a moment
    # after the socket closes: give it up to 2 s, not forever
    t0 = time.time()
    back = health(port, "127.0.0.1")
    while not back and time.time() - t0 < 2:
        time.sleep(0.1)
        back = health(port, "127.0.0.1")
    check(back, f"then /health from the first address answers again ({time.time() - t0:.1f} s)")
    for s in held + extra:
        s.close()
    # the probe: more half-sent connections than the old global limit
    many = []
    for a in range(14):
        for _ in range(PER_IP):
            s = connect(port, f"127.0.1.{a + 1}")
            s.sendall(b"GET /he")
            many.append(s)
    time.sleep(0.3)
    check(health(port, "127.0.0.3"), f"{len(many)} half-sent connections from 14 addresses: /health answers")
    for s in many:
        s.close()


POST = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
# what libmicrohttpd refuses before dray sees the request: (name, bytes, status, JSON?)
MALFORMED = [
    ("Content-Length: -5", POST + b"Content-Length: -5\r\n\r\n", 400, True),
    ("Content-Length: abc", POST + b"Content-Length: abc\r\n\r\n", 400, True),
    ("Content-Length: 2^64", POST + b"Content-Length: 18446744073709551616\r\n\r\n", 413, True),
    ("bad chunk size", POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400, True),
    ("header line without a colon", b"GET /health HTTP/1.1\r\nHost: t\r\nBogus\r\n\r\n", 400, True),
    ("40 kB header", b"GET /health HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 40000 + b"\r\n\r\n", 431, True),
    # before the request line is parsed libmicrohttpd names no connection: its HTML stays
    ("40 kB URI", b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414, False),
    ("HTTP/2.0", b"GET /health HTTP/2.0\r\nHost: t\r\n\r\n", 505, False),
    ("HTTP/0.9", b"GET /health\r\n\r\n", 400, False),
]
# what dray answers itself: one status line too
OURS = [
    ("Content-Length: 2^64-1", POST + b"Content-Length: 18446744073709551615\r\n\r\n", 413),
    ("Content-Length: 99999999999", POST + b"Content-Length: 99999999999\r\n\r\n", 413),
    ("two Content-Lengths", POST + b"Content-Length: 3\r\nContent-Length: 5\r\n\r\nabc", 400),
]


def mhd_counts(port):
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {int(m.group(1)): int(m.group(2)) for m in
            re.finditer(r'^dray_http_requests_total\{code="(\d+)",answered_by="libmicrohttpd"\} (\d+)$', page, re.M)}


def check_malformed(port, log):
    before = mhd_counts(port)
    for name, req, status, js in MALFORMED:
        d = raw(port, req)
        lines = re.findall(rb"(?m)^HTTP/1\.[01] \d{3}", d)
        head, _, body = d.partition(b"\r\n\r\n")
        ok = len(lines) == 1 and head.startswith(b"HTTP/1.1 %d " % status)
        if js:
            try:
                err = json.loads(body)["error"]
                ok = ok and set(err) == {"message", "type", "param", "code"}
            except ValueError:
                ok = False
        check(ok, f"{name}: one status line {status}{', OpenAI error JSON' if js else ' (HTML)'}: {d[:90]!r}")
    for name, req, status in OURS:
        d = raw(port, req)
        check(len(re.findall(rb"(?m)^HTTP/1\.[01] \d{3}", d)) == 1 and d.startswith(b"HTTP/1.1 %d " % status),
              f"{name}: dray's one status line {status}")
    after = mhd_counts(port)
    want = {}
    for _, _, st, _ in MALFORMED:
        want[st] = want.get(st, 0) + 1
    got = {st: after.get(st, 0) - before.get(st, 0) for st in want}
    check(got == want, f"/metrics counts them answered_by=libmicrohttpd: {got}")
    time.sleep(0.2)
    text = log()
    n = len(re.findall(r"^dray serve: \S+ \S+ \d{3} answered by libmicrohttpd", text, re.M))
    check(n == len(MALFORMED), f"one log line each ({n})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--writer", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.writer, model], check=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        logf = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([a.dray, "serve", "-m", model, "--port", str(port), "-t", "1", "-c", "64",
                                 "--set", f"max_connections_per_ip={PER_IP}",
                                 "--set", f"header_timeout={TIMEOUT}"],
                                stderr=logf, env=dict(os.environ, DRAY_CACHE_DIR=os.path.join(tmp, "cache")))

        def log():
            logf.seek(0)
            return logf.read()
        try:
            end = time.time() + 60
            while "listening on" not in log():
                if proc.poll() is not None or time.time() > end:
                    sys.exit("FAIL: the server did not start:\n" + log())
                time.sleep(0.1)
            t0 = time.time()
            check_slots(port)
            check_malformed(port, log)
            proc.terminate()
            rc = proc.wait(30)
            check(rc == 0, f"the server stops cleanly (exit {rc})")
            print(f"{'PASS' if not fails else f'{len(fails)} check(s) failed'} ({time.time() - t0:.1f} s)")
        finally:
            if proc.poll() is None:
                proc.kill()
            if fails:
                print(log()[-3000:])
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
