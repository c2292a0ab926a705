#!/usr/bin/env python3
"""dray's Llama family (SmolLM2-135M-Instruct) against the independent numpy
reference (llama_ref.py), on the real model file. Prompts are tokenized by dray
(the tokenizer has its own reference check) and the same ids go to both sides.

Checks:
  f32 path  (--precision f32 --kv-dtype f16) against the reference with K/V
            rounded to f16 as the cache stores them: the reference's argmax at
            every position of every prompt, and max |dlogit| < F32_MAX_ABS;
  greedy    GREEDY tokens of dray f32 == the reference's, on the first prompts;
  int8 path (the default precision, w4a8 since 2026-12-01: the Q4_1 layers held
            exactly in 4-bit, the Q8_0 head in grouped int8, with two-pass int8
            activations (config activations: int8x2), int8 KV) against
            the exact reference: mean KL(ref || dray) < INT8_KL and top-1 agreement
            >= INT8_TOP1 over all positions of varied prompts (prose, code, chat,
            numbers, other languages).

Measured (2026-12-01, CPU): f32 argmax 379/379 positions, max |dlogit| 0.070 (on
the chat prompt; 0.004..0.019 elsewhere), greedy 64 tokens identical; int8 mean KL
0.0097..0.0101, top-1 96.0% (95.0% after main's CPU kernel and calibration changes
of the same day: 4 of 379 positions); with the w4a8 default, measured the same day:
mean KL 0.0053, top-1 96.31% (365/379): with the weights exact, the int8
rounding of the activations was most of the rest (f32 activations with the int8
KV: 98.68%, KL 0.0010). With two-pass activations (the default since the same
day; SmolLM2's head, smaller than its layers, gets them too) measured: top-1
98.68% (374/379), mean KL 0.00104 (one pass in the head only: 0.00169, the
same top-1); one pass (--set activations=int8) is back at 96.31% / 0.0053.
With DRAY_CPU_ISA=avx2 or avxvnni (other f32 summation orders): 98.15%
(372/379), KL 0.00091. So the project's 98% target is met on every kernel set
measured, but the positions that differ are reference near-ties (top-2 gaps
0.01..0.16) that summation order alone moves by a position or two: the top-1
bound sits two positions under the lowest measured value (a bound at exactly 98%
would fail on rounding), and the KL bound, the stable measure, at about twice
the measured value.
The reference has no KV cache (less to get wrong); greedy is checked in one
reference pass over the prompt plus dray's tokens (refcommon's
greedy_first_difference: the verdict of decoding token by token, which cost
GREEDY passes), whose first rows are also the prompt's logits for int8. A table of the measured
values is printed, to be quoted in notes. Runs in about a minute on 2 cores.
"""
import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matmuls: threads only contend
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
from refcommon import (dray_greedy, dray_ids, dray_logits, greedy_first_difference,  # noqa: E402
                       int8_verdict, log_softmax)

# f32 vs the reference with f16 K/V: summation order over 30 layers; logits reach ~25
F32_MAX_ABS = 0.1
INT8_TOP1 = 0.975 # measured 0.9868 (AVX-512 VNNI) and 0.9815 (AVX2); target 0.98, see above
INT8_KL = 0.002   # measured 0.00104
GREEDY = 64
N_GREEDY_PROMPTS = 3

# (text, parse control tokens) -- the first N_GREEDY_PROMPTS also run greedily
PROMPTS = [
    ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
     "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
     "<|im_start|>assistant\n", True),
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("Photosynthesis is the process by which green plants", False),
    ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
     "combined a screw press, movable metal type and oil-based ink into a system that could "
     "produce books far faster than scribes. Before that, most books in Europe were copied by "
     "hand, a slow and expensive process that kept literacy the privilege of a few. Within fifty "
     "years, printing shops had spread to more than two hundred cities.", False),
    ("Q: A train leaves at 14:05 and arrives at 17:50. How long is the trip?\nA: 3 hours and "
     "45 minutes.\nQ: What is 12 * 34 + 56?\nA:", False),
    ("<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n"
     "Crimson leaves drift down,\nwhispering to the cold earth,\nsummer's last goodbye.<|im_end|>\n"
     "<|im_start|>user\nNow explain it in one sentence.<|im_end|>\n<|im_start|>assistant\n", True),
    ("for (int i = 0; i < n; i++) {\n    sum += a[i] * b[i];\n}\nreturn sum;  // dot product\n"
     "SELECT name, COUNT(*) FROM users GROUP BY name ORDER BY 2 DESC;", False),
    ("La Révolution française commence en 1789. Die Berliner Mauer fiel 1989. "
     "東京は日本の首都です。 El café está caliente.", False),
]

F32 = ["--precision", "f32", "--kv-dtype", "f16"]


def check_prompt(a, m, pi, text, special, dump, t0):
    """One prompt: (table row, failures, int8 agreements, KL sum, positions)."""
    ids = dray_ids(a.dray, a.model, text, special)
    fails = []
    m.kv_f16 = True
    ref16 = llama_ref.forward(m, ids)
    m.kv_f16 = False
    f32 = dray_logits(a.dray, a.model, ids, F32, dump)
    d_abs = float(np.abs(f32 - ref16).max())
    f32_agree = int((f32.argmax(1) == ref16.argmax(1)).sum())
    if f32_agree != len(ids):
        fails.append(f"prompt {pi}: f32 argmax differs at {len(ids) - f32_agree} positions")
    if d_abs >= F32_MAX_ABS:
        fails.append(f"prompt {pi}: f32 max |dlogit| {d_abs:.4f} >= {F32_MAX_ABS}")
    # the exact reference over the prompt and, on the greedy prompts, dray's greedy
    # tokens after it: its first rows are the prompt's logits (causal attention)
    g_dray = dray_greedy(a.dray, a.model, ids, GREEDY, F32) if pi < a.greedy_prompts else None
    ref_ext = llama_ref.forward(m, ids + (g_dray or []))
    ref = ref_ext[:len(ids)]
    i8 = dray_logits(a.dray, a.model, ids, [], dump)
    i8_agree = int((i8.argmax(1) == ref.argmax(1)).sum())
    lp_ref, lp_i8 = log_softmax(ref), log_softmax(i8)
    kl = (np.exp(lp_ref) * (lp_ref - lp_i8)).sum(axis=1)
    greedy = None
    if g_dray is not None:
        diff = greedy_first_difference(ref_ext, len(ids), g_dray, GREEDY, (m.eos,))  # <|im_end|>
        greedy = (len(g_dray), diff is None)
        if diff:
            k, want, gap = diff
            fails.append(f"prompt {pi}: greedy differs at token {k} (reference top-2 gap {gap:.4f}); "
                         f"dray {g_dray[k:k + 4]} ref {want}")
    print(f"prompt {pi}: {len(ids)} tokens checked ({time.time() - t0:.0f} s)", flush=True)
    row = (pi, len(ids), f32_agree, d_abs, i8_agree, float(kl.mean()), float(kl.max()), greedy)
    return row, fails, i8_agree, float(kl.sum()), len(ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dray", required=True)
    ap.add_argument("--greedy-prompts", type=int, default=N_GREEDY_PROMPTS)
    a = ap.parse_args()
    t0 = time.time()
    m = llama_ref.Model(a.model)
    print(f"reference loaded in {time.time() - t0:.1f} s", flush=True)
    failures, rows = [], []
    tot_pos = tot_agree = 0
    kl_sum = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for pi, (text, special) in enumerate(PROMPTS):
            row, f, agree, kls, n = check_prompt(a, m, pi, text, special, os.path.join(tmp, "l.bin"), t0)
            rows.append(row)
            failures += f
            tot_agree += agree
            kl_sum += kls
            tot_pos += n
    print("\nprompt  tokens  f32-top1  f32-max|d|  int8-top1  int8-KL-mean  int8-KL-max  greedy")
    for pi, n, fa, da, ia, klm, klx, g in rows:
        gs = "-" if g is None else f"{g[0]} tokens {'identical' if g[1] else 'DIFFER'}"
        print(f"{pi:6d}  {n:6d}  {fa:4d}/{n:<4d} {da:10.5f}  {ia:4d}/{n:<4d} {klm:12.5f} {klx:12.5f}  {gs}")
    int8_verdict(tot_agree, tot_pos, kl_sum, INT8_TOP1, INT8_KL, failures)
    for f in failures:
        print("FAIL:", f)
    print(f"PASS ({time.time() - t0:.0f} s)" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
