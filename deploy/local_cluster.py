"""dray serve processes behind nginx on one machine, for the sticky-routing test
(tests/e2e/test_sticky.py) and the scale-out benchmark (bench/scale_out.py).

Each server is a separate process on its own loopback address (127.0.0.2, .3, ...),
so nginx sees distinct hosts without network namespaces. nginx runs this folder's
nginx.conf with only the lines marked "dray-test:" rewritten (upstream list,
listen address, file paths), so what is tested is the config users deploy.
"""
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nginx.conf")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url, deadline):
    """True once url answers 200, False when time.time() passes deadline."""
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.3)
    return False


def start_servers(dray, model, n, tmp, serve_args, timeout=300):
    """n `dray serve -m model` processes on HOSTS[:n], logs in tmp/server<i>.log.
    Returns [{"proc", "host", "port", "addr"}] once all are healthy; otherwise stops
    them all and raises RuntimeError naming the address of one that was not healthy
    within timeout seconds."""
    servers = []
    for i, host in enumerate(HOSTS[:n]):
        port = free_port(host)
        log = open(os.path.join(tmp, f"server{i}.log"), "w")
        p = subprocess.Popen([dray, "serve", "-m", model, "--host", host, "--port", str(port), *serve_args],
                             stdout=log, stderr=subprocess.STDOUT)
        servers.append({"proc": p, "host": host, "port": port, "addr": f"{host}:{port}"})
    deadline = time.time() + timeout
    for s in servers:
        if not wait_http(f"http://{s['addr']}/health", deadline):
            for t in servers:
                t["proc"].kill()
                t["proc"].wait()
            raise RuntimeError(f"dray serve on {s['addr']} did not become healthy (see {tmp}/server*.log)")
    return servers


def nginx_conf(src, tmp, servers, listen, routing="sticky"):
    """src (deploy/nginx.conf) rewritten to tmp/nginx-<routing>.conf for these servers;
    routing "random" swaps the consistent hash for nginx's random balancer."""
    out = []
    for line in open(src):
        if "dray-test: upstream" in line:
            continue  # replaced below, after the balancer line
        if "dray-test: pid" in line:
            line = f"pid {tmp}/nginx.pid;\n"
        elif "dray-test: error_log" in line:
            line = f"error_log {tmp}/error.log warn;\n"
        elif "dray-test: access_log" in line:
            line = f"    access_log {tmp}/access.log dray;\n"
        elif "dray-test: listen" in line:
            line = f"        listen {listen};\n"
        elif line.strip().startswith("hash $dray_route_key"):
            if routing == "random":
                line = "        random;\n"
            line += "".join(f"        server {s['addr']} max_fails=1 fail_timeout=30s;\n" for s in servers)
        out.append(line)
    path = os.path.join(tmp, f"nginx-{routing}.conf")
    with open(path, "w") as f:
        f.write("".join(out))
    return path


def start_nginx(nginx, tmp, conf, listen, timeout=20):
    """nginx in the foreground on conf (from nginx_conf); returns its process once
    http://listen/health answers, raises RuntimeError when it does not."""
    p = subprocess.Popen([nginx, "-p", tmp, "-c", conf, "-g", "daemon off;"],
                         stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/nginx.out", "w"))
    if not wait_http(f"http://{listen}/health", time.time() + timeout):
        p.kill()
        raise RuntimeError(f"nginx did not come up on {listen} (see {tmp}/nginx.out, error.log)")
    return p
