"""`dray chat` on a terminal (a pty, as a user has it), with the real Gemma 3 270M:

1. Ctrl-C during a reply stops the reply and returns to the prompt; the process
   lives on and the conversation is kept: the next turn reuses every token the
   interrupted turn left in the KV (its report says "N already cached" with N the
   context length the interrupted turn reported), and its reply works.
   Ctrl-C at the prompt first tells how to quit; the second in a row exits 0.
   Right after an interrupted reply, one Ctrl-C at the prompt exits.
2. A conversation that fills the context says so and suggests /reset, a turn that
   no longer fits fails with the same suggestion, and /reset makes the next turn
   work again from an empty context.

The terminal sends Ctrl-C as the byte 0x03 through the line discipline, which
signals the foreground process group: the same path as a key press.

usage: test_chat_pty.py --dray build/tools/dray --model .models/gemma-3-270m-q4_k_m.gguf
"""
import argparse
import os
import pty
import re
import select
import sys
import time

CTRL_C, CTRL_D = b"\x03", b"\x04"
TIMEOUT = 120  # seconds for any one expected output (model load under load included)


class Chat:
    def __init__(self, dray, model, *args):
        cmd = [dray, "chat", "-m", model, "-t", "2", "--temp", "0", *args]
        print("starting:", " ".join(cmd), flush=True)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(cmd[0], cmd)
        self.buf = b""

    def expect(self, pattern, timeout=TIMEOUT):
        """Read until the regex matches the unread output; returns the match and
        consumes the output up to its end."""
        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        end = time.time() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                self.buf = self.buf[m.end():]
                return m
            left = end - time.time()
            if left <= 0 or not self._read(left):
                sys.exit(f"FAIL: no {pattern!r} in the output; unread output:\n"
                         + self.buf.decode("utf-8", "replace"))

    def _read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # EIO: the child is gone and the pty closed
            return False
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()
        self.buf += data
        return bool(data)

    def send(self, data):
        os.write(self.fd, data)

    def wait_exit(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            self._read(0.1)
        os.kill(self.pid, 9)
        sys.exit("FAIL: dray chat did not exit")

    def alive(self):
        return os.waitpid(self.pid, os.WNOHANG)[0] == 0


REPORT = r"\[turn: (\d+) new tokens prefilled \((\d+) already cached\).*?stopped: ([a-z ]+); context (\d+)/(\d+)\]"


def check_ctrl_c(a):
    c = Chat(a.dray, a.model, "-n", "48", "-c", "512")
    c.expect(r"> ")
    c.send(b"Count from one to one hundred in words, one number per line.\r")
    c.expect(r"line\.\r?\n")          # the echo of the typed line
    c.expect(rb"\S")                   # the reply has started
    c.send(CTRL_C)
    c.expect(r"reply stopped by Ctrl-C")
    m = c.expect(REPORT)
    held = int(m.group(4))
    if m.group(3) != b"caller":
        sys.exit(f"FAIL: the interrupted turn stopped for {m.group(3)!r}, not the Ctrl-C")
    c.expect(r"> ")
    if not c.alive():
        sys.exit("FAIL: dray chat died on Ctrl-C")
    print(f"\n-- interrupted turn left {held} tokens in the context", flush=True)

    c.send(b"What is two plus two?\r")
    m = c.expect(REPORT)
    cached, gen_reason = int(m.group(2)), m.group(3)
    if cached != held:
        sys.exit(f"FAIL: the next turn reused {cached} tokens, the conversation held {held}")
    if gen_reason == b"caller":
        sys.exit("FAIL: the next turn was stopped as if Ctrl-C were still pending")
    c.expect(r"> ")
    print(f"\n-- next turn reused all {cached} tokens and stopped on {gen_reason.decode()}", flush=True)

    c.send(CTRL_C)
    c.expect(r"Ctrl-C again")
    if not c.alive():
        sys.exit("FAIL: one Ctrl-C at the prompt (no reply interrupted) exited")
    c.expect(r"> ")
    c.send(CTRL_C)
    rc = c.wait_exit()
    if rc != 0:
        sys.exit(f"FAIL: the second Ctrl-C at the prompt exited with {rc}, not 0")

    # after an interrupted reply, one Ctrl-C at the prompt quits
    c = Chat(a.dray, a.model, "-n", "48", "-c", "512", "-q")
    c.expect(r"> ")
    c.send(b"Tell me about the sea.\r")
    c.expect(r"sea\.\r?\n")
    c.expect(rb"\S")
    c.send(CTRL_C)
    c.expect(r"reply stopped by Ctrl-C")
    c.expect(r"> ")
    c.send(CTRL_C)
    rc = c.wait_exit()
    if rc != 0:
        sys.exit(f"FAIL: Ctrl-C after an interrupted reply exited with {rc}, not 0")
    print("\n-- Ctrl-C: ok", flush=True)


def check_context_full(a):
    c = Chat(a.dray, a.model, "-n", "500", "-c", "64")
    c.expect(r"> ")
    c.send(b"Write a long story about a dragon who learns to bake bread.\r")
    m = c.expect(REPORT)
    if m.group(3) != b"context full":
        sys.exit(f"FAIL: a 500-token reply in a 64-token context stopped for {m.group(3)!r}")
    c.expect(r"/reset starts a new one")
    c.expect(r"> ")
    c.send(b"And then?\r")
    c.expect(r"context is 64 tokens")
    c.expect(r"/reset starts a new one")
    c.expect(r"> ")
    c.send(b"/reset\r")
    c.expect(r"> ")
    c.send(b"Hi.\r")
    m = c.expect(REPORT)
    if int(m.group(2)) != 0:
        sys.exit(f"FAIL: after /reset the turn found {m.group(2)} tokens cached, not 0")
    c.expect(r"> ")
    c.send(CTRL_D)
    rc = c.wait_exit()
    if rc != 0:
        sys.exit(f"FAIL: end of input exited with {rc}, not 0")
    print("\n-- context full: ok", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    t0 = time.time()
    check_ctrl_c(a)
    check_context_full(a)
    print(f"PASS ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
