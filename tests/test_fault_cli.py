"""Device failures through the dray command, injected by the test plugin
libdray-faulty.so (tests/plugins/faulty.c) on a tiny random Gemma:

  dray run    a failed op or allocation ends the run with exit 1 and an error
              that names the plugin and the call (no crash, no sanitizer report);
  dray serve  the request whose step fails gets HTTP 500 with that error, the
              server keeps serving: the next request gives the same text as a
              server without faults, and /metrics shows its KV blocks back;
              the same with the model split over cpu and faulty (backend
              cpu,faulty), the error naming the failed device of the split.

The calibration cache is warmed first, so the load makes no download, embed or
matmul call: DRAY_FAULT=download:1 (or matmul:1) then hits the first request.
(test_fault.c sweeps every call in-process; this checks what a user sees.)

usage: test_fault_cli.py --dray DRAY --writer WRITE_TINY_GEMMA --plugins DIR
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PROMPT_IDS = "2,17,40,93,120,7,250"
fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        fails.append(what)


def run(a, env, *extra):
    cmd = [a.dray, "run", "-m", a.model, "--prompt-ids", PROMPT_IDS, "-n", "6", "--temp", "0", "-q",
           "--print-token-ids", "--set", "plugin_path=" + a.plugin_dir, "--set", "backend=faulty",
           "--set", "fallback=", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def clean_report(p):
    """No crash: an exit status, not a signal, and no sanitizer report."""
    return p.returncode > 0 and p.returncode < 128 and "Sanitizer" not in p.stderr \
        and "runtime error" not in p.stderr


def check_run(a, env):
    good = run(a, env)
    check(good.returncode == 0, f"clean run exits 0 ({good.stderr.strip()[-200:]})")
    for fault, what in [("matmul:1", "matmul"), ("download:1", "download"), ("alloc:1", "alloc"),
                        ("upload:3", "upload"), ("attention:5", "attention")]:
        p = run(a, dict(env, DRAY_FAULT=fault))
        check(p.returncode == 1 and clean_report(p), f"DRAY_FAULT={fault}: exit 1 (got {p.returncode})")
        check("faulty" in p.stderr and f"{what}: injected fault" in p.stderr,
              f"DRAY_FAULT={fault}: the error names the plugin and {what}: {p.stderr.strip()[-300:]!r}")
    p = run(a, dict(env, DRAY_FAULT="matmul:zero"))
    check(p.returncode != 0 and "DRAY_FAULT='matmul:zero'" in p.stderr,
          f"a bad DRAY_FAULT is refused with the setting quoted: {p.stderr.strip()[-200:]!r}")


class Server:
    def __init__(self, a, env, backend="faulty", *extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [a.dray, "serve", "-m", a.model, "--port", str(self.port), "-t", "1", "-c", "64",
               "--set", "plugin_path=" + a.plugin_dir, "--set", "backend=" + backend, "--set", "fallback=",
               "--set", "prefix_cache=false", *extra]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stderr=self.log, env=env)
        end = time.time() + 60
        while time.time() < end:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        sys.exit("FAIL: the server did not start:\n" + self.stderr())

    def complete(self, prompt):
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\d+)", text, re.M)  # labels or not
        return int(m.group(1)) if m else None

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def check_serve(a, env):
    prompt = "hello world, the sea"
    s = Server(a, env)
    status, clean = s.complete(prompt)
    s.stop()
    check(status == 200, f"clean server answers 200 (got {status}: {clean})")
    want = clean.get("choices", [{}])[0].get("text")

    s = Server(a, dict(env, DRAY_FAULT="download:1"))
    status, body = s.complete(prompt)
    msg = json.dumps(body)
    check(status == 500, f"the request whose step fails gets 500 (got {status}: {msg[:300]})")
    check("faulty" in msg and "download: injected fault" in msg,
          f"its error names the plugin and the call: {msg[:300]}")
    check(s.metric("dray_kv_blocks_used") == 0, "its KV blocks are back in the pool")
    status, body = s.complete(prompt)
    check(status == 200 and body["choices"][0]["text"] == want,
          f"the next request gives the clean server's text {want!r} (got {status}: {json.dumps(body)[:200]})")
    check(s.metric("dray_kv_blocks_used") == 0, "after it, every KV block is free again")
    rc = s.stop()
    check(rc == 0 and "Sanitizer" not in s.stderr(), f"the server stops cleanly (exit {rc})")
    return want


def check_serve_split(a, env, want):
    """Layers 0..3 on the CPU plugin, 4..6 and the head on faulty: a fault on
    the second device fails the request with that device named."""
    prompt = "hello world, the sea"
    s = Server(a, dict(env, DRAY_FAULT="matmul:1"), "cpu,faulty", "--set", "layer_split=4,3")
    status, body = s.complete(prompt)
    msg = json.dumps(body)
    check(status == 500 and "device 2 (faulty" in msg and "matmul: injected fault" in msg,
          f"split: the failed step's request gets 500 naming device 2 and the call: {msg[:300]}")
    check(s.metric("dray_kv_blocks_used") == 0, "split: its KV blocks are back in the pool")
    status, body = s.complete(prompt)
    check(status == 200 and body["choices"][0]["text"] == want,
          f"split: the next request gives one device's text {want!r} (got {status}: {json.dumps(body)[:200]})")
    rc = s.stop()
    check(rc == 0 and "Sanitizer" not in s.stderr(), f"split: the server stops cleanly (exit {rc})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--writer", required=True)
    ap.add_argument("--plugins", required=True, help="the folder libdray-faulty.so was built in")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a.model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.writer, a.model], check=True)
        # a folder with only the faulty plugin (the fake plugins' folder has broken ones)
        a.plugin_dir = os.path.join(tmp, "plugins")
        os.mkdir(a.plugin_dir)
        shutil.copy(os.path.join(a.plugins, "libdray-faulty.so"), a.plugin_dir)
        env = dict(os.environ, DRAY_CACHE_DIR=os.path.join(tmp, "cache"))
        env.pop("DRAY_FAULT", None)
        t0 = time.time()
        check_run(a, env)  # its clean run warms the calibration cache
        want = check_serve(a, env)
        check_serve_split(a, env, want)
        print(f"{'PASS' if not fails else f'{len(fails)} check(s) failed'} ({time.time() - t0:.1f} s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
