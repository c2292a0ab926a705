"""What the serving benchmarks share: a `dray serve` started on a free loopback
port (its stderr drained), and /metrics read as one number per family (the
replicas' series summed). Standard library only."""
import http.client
import socket
import subprocess
import sys
import threading


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`dray serve --model MODEL ARGS...` on a free port; a context manager."""

    def __init__(self, dray, model, args):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [dray, "serve", "--model", model, "--port", str(self.port)] + list(args)
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        ready = threading.Event()

        def read_log():
            for line in self.proc.stderr:
                if "listening on" in line:
                    ready.set()
        threading.Thread(target=read_log, daemon=True).start()
        if not ready.wait(300):
            self.proc.kill()
            sys.exit("server did not start")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(30)

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", "/metrics")
        page = c.getresponse().read().decode()
        c.close()
        out = {}
        for ln in page.splitlines():
            if ln and not ln.startswith("#"):
                k, v = ln.rsplit(" ", 1)
                name = k.split("{")[0]
                out[name] = out.get(name, 0) + float(v)
        return out
