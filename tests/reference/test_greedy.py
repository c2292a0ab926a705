#!/usr/bin/env python3
"""refcommon.greedy_first_difference (one teacher-forced pass) gives the same verdict as
decoding the reference token by token, which is what the reference checks did
before. A toy causal model stands in for the reference: the logits at position p
are a fixed random function of tokens 0..p only (a prefix hash seeds them), so
the two ways must agree on every candidate: the reference's own greedy run
(agrees), runs changed at one token, cut short, run past a stop token.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refcommon import greedy_first_difference  # noqa: E402

V, STOP = 12, 0


def logits(seq):
    """(len(seq), V): row p depends on seq[:p + 1] only (causal)."""
    out, h = np.empty((len(seq), V), dtype=np.float32), 17
    for p, t in enumerate(seq):
        h = (h * 1000003 + t + 1) % (1 << 61)
        out[p] = np.random.default_rng(h).standard_normal(V)
    return out


def step_by_step(prompt, n):
    """The old way: recompute, take the last row's argmax, stop at STOP."""
    seq = list(prompt)
    for _ in range(n):
        nxt = int(np.argmax(logits(seq)[-1]))
        if nxt == STOP:
            break
        seq.append(nxt)
    return seq[len(prompt):]


def verdict(prompt, cand, n):
    return greedy_first_difference(logits(prompt + cand), len(prompt), cand, n, (STOP,)) is None


def main():
    rng = np.random.default_rng(1)
    checked = agreed = 0
    for trial in range(200):
        prompt = [int(x) for x in rng.integers(1, V, size=int(rng.integers(1, 6)))]
        n = int(rng.integers(1, 12))
        ref = step_by_step(prompt, n)
        cands = [ref, ref[:-1], ref + [int(rng.integers(1, V))], ref + [STOP]]
        if ref:
            k = int(rng.integers(0, len(ref)))
            cands.append(ref[:k] + [(ref[k] % (V - 1)) + 1] + ref[k + 1:])
        for c in cands:
            c = c[:n] if len(c) > n else c
            want = c == ref
            got = verdict(prompt, c, n)
            if got != want:
                sys.exit(f"FAIL: prompt {prompt} n {n}: candidate {c} vs reference {ref}: "
                         f"teacher-forced says {got}, token by token says {want}")
            checked += 1
            agreed += want
    print(f"PASS: {checked} candidates ({agreed} equal to the reference's run), same verdict both ways")


if __name__ == "__main__":
    main()
