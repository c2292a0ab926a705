#!/usr/bin/env python3
"""What speculative decoding by prompt lookup (lookup_draft) gives `dray run`:
decode tok/s with drafts off and on, on tasks whose replies copy
their context (a code edit, a summary that quotes, an answer that quotes a
passage) and on one that copies nothing (a story), with SmolLM2-Instruct in
its ChatML template. Greedy, 128 tokens, best of --reps runs each, runs
alternating off/on. The tokens must be the same either way (checked). Not a CI
test:

    python3 bench/lookup.py --dray build/tools/dray --model .models/smollm2-135m-instruct-q4_1.gguf
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = open(os.path.join(HERE, "texts", "varied.txt")).read()
CODE = TEXT[TEXT.index("def merge_intervals"):TEXT.index("static size_t utf8_len")].strip()
LOG = TEXT[:TEXT.index("\n\n")]
PHOTO = TEXT.split("\n\n")[1]

TASKS = [
    ("code edit", f"Rename the function merge_intervals to merge_ranges and keep everything else "
                  f"exactly as it is:\n\n{CODE}"),
    ("quoting summary", f"Repeat the key sentences of this log entry word for word:\n\n{LOG}"),
    ("quoted answer", f"{PHOTO}\n\nQuote the sentence of the text above that says how much solar "
                      f"power is captured, then explain it."),
    ("story (copies nothing)", "Write a short story about a robot who learns to paint."),
]


def chatml(user):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def run(a, prompt, draft):
    cmd = [a.dray, "run", "-m", a.model, "-t", str(a.threads), "-p", prompt, "-n", str(a.tokens),
           "--temp", "0", "--set", f"lookup_draft={draft}", "--print-token-ids"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    tps = float(re.search(r"decode \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\)", p.stderr).group(1))
    kept = re.search(r"lookup drafts: (\d+) of (\d+)", p.stderr)
    return tps, p.stdout.strip().splitlines()[-1], kept.groups() if kept else ("0", "0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--tokens", type=int, default=128)
    ap.add_argument("--draft", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print("| task | off tok/s | on tok/s | speed-up | drafted tokens kept |")
    print("| --- | --- | --- | --- | --- |")
    for name, user in TASKS:
        prompt = chatml(user)
        off, on = [], []
        for _ in range(a.reps):
            t0, ids0, _ = run(a, prompt, 0)
            t1, ids1, kept = run(a, prompt, a.draft)
            if ids0 != ids1:
                sys.exit(f"FAIL: {name}: lookup drafts changed the tokens")
            off.append(t0)
            on.append(t1)
        print(f"| {name} | {max(off):.1f} | {max(on):.1f} | {max(on) / max(off):.2f}x | "
              f"{kept[0]} of {kept[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
