#!/usr/bin/env python3
"""dray's Gemma 3 against the independent numpy reference (gemma3_ref.py), on the
real model file. Prompts are tokenized by dray (the tokenizer has its own
reference check) and the same ids go to both sides.

Checks (the bounds are the documented contract of the two precisions):
  f32 path  (--precision f32 --kv-dtype f16) against the reference with K/V
            rounded to f16 as the cache stores them: the reference's argmax at
            every position; max |dlogit| < F32_MAX_ABS over all positions and the
            90th percentile of the per-position max < F32_P90;
  int8 path (the default precision, w4a8 since 2026-12-01, with two-pass int8
            activations, + int8 KV): top-1 agreement >= INT8_TOP1 of all
            positions, mean KL(ref || dray) < INT8_KL;
  greedy    64 tokens of dray f32 == 64 tokens of the reference, per prompt.
The measured values are printed as a table, to be quoted in notes.

Why f16 KV on the f32 path: the operator table stores KV as int8 or f16; f16
rounds k and v to 11 significant bits. The reference does the same rounding for
this comparison, so what is left is f32 summation order (BLAS vs dray's kernels)
carried through 18 layers: typically 5e-3 on logits of magnitude ~25, a few
positions of a 722-token prompt reach 3.5e-2. int8 is compared with the exact
reference.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3_ref  # noqa: E402
from refcommon import (dray_greedy, dray_ids, dray_logits, greedy_first_difference,  # noqa: E402
                       int8_verdict, log_softmax)

F32_MAX_ABS = 5e-2
F32_P90 = 1.5e-2
# int8 (the default until then): 97.71% (mean KL 0.0054) over these 787 positions after the AVX-512 kernels and
# the calibration rework; the bound sits just under it so a real regression still fails.
# The w4a8 default (Q4_K tensors exact in 4-bit, the rest grouped int8, per-group int8
# activations), same day: 99.11% (7 of 787 positions differ), mean KL 0.00104.
# With two-pass activations (config activations: int8x2; Gemma's head outweighs its
# layers and keeps one pass): 99.24% (6 of 787 differ), mean KL 0.00053 (two passes
# in the head too: 99.36%, 0.00039). The default (activations: auto) is one pass for
# gemma3 (models/gemma3.c), so this checks the 99.11% / 0.00104 path; the KL bound
# is about 2x that.
INT8_TOP1 = 0.98
INT8_KL = 0.002
N_GREEDY = 64
# The reference has no KV cache (on purpose: less to get wrong). Greedy is checked
# in one reference pass over the prompt plus dray's tokens (refcommon's
# greedy_first_difference: the same verdict as decoding token by token, which cost
# N_GREEDY passes), on the short prompts; the long prompt's every position is
# checked through its logits.
GREEDY_MAX_PROMPT = 100

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Photosynthesis is the process by which green plants",
    "Here is a list of five fruits: apple, banana,",
    "In 1969, the first humans to walk on the Moon were",
]

LONG_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined a screw press, movable metal type and oil-based ink into a "
    "system that could produce books far faster than scribes. Before that, most books "
    "in Europe were copied by hand, a slow and expensive process that kept literacy "
    "the privilege of a few. Within fifty years, printing shops had spread to more than "
    "two hundred cities, and millions of volumes were in circulation. The consequences "
    "reached far beyond the book trade. Scientists could share exact copies of their "
    "tables and diagrams, so that errors were corrected rather than multiplied. "
    "Reformers printed pamphlets in the languages people actually spoke. Merchants "
    "printed price lists, governments printed laws, and universities printed textbooks. "
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dray", required=True)
    ap.add_argument("--quick", action="store_true", help="2 short prompts, 16 greedy tokens")
    a = ap.parse_args()
    global N_GREEDY
    prompts = PROMPTS + [LONG_TEXT * 5]
    if a.quick:
        prompts, N_GREEDY = PROMPTS[:2], 16

    t0 = time.time()
    m = gemma3_ref.Model(a.model)
    print(f"reference loaded in {time.time() - t0:.1f} s", flush=True)
    failures = []
    rows = []
    tot_pos = tot_agree = 0
    kl_sum = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.bin")
        for pi, text in enumerate(prompts):
            ids = dray_ids(a.dray, a.model, text)
            m.kv_f16 = True
            ref16 = gemma3_ref.forward(m, ids, all_logits=True)
            m.kv_f16 = False
            f32 = dray_logits(a.dray, a.model, ids, ["--precision", "f32", "--kv-dtype", "f16"], dump)
            per_pos = np.abs(f32 - ref16).max(axis=1)
            d_abs, d_p90 = float(per_pos.max()), float(np.percentile(per_pos, 90))
            f32_agree = int((f32.argmax(1) == ref16.argmax(1)).sum())
            del f32, ref16
            # the exact reference over the prompt and, for a short prompt, dray's greedy
            # tokens after it: its first rows are the prompt's logits (causal attention)
            g_dray = None
            if len(ids) <= GREEDY_MAX_PROMPT:
                g_dray = dray_greedy(a.dray, a.model, ids, N_GREEDY, ["--precision", "f32", "--kv-dtype", "f16"])
            ref_ext = gemma3_ref.forward(m, ids + (g_dray or []), all_logits=True)
            ref = ref_ext[:len(ids)]
            i8 = dray_logits(a.dray, a.model, ids, [], dump)
            i8_agree = int((i8.argmax(1) == ref.argmax(1)).sum())
            lp_ref, lp_i8 = log_softmax(ref), log_softmax(i8)
            kl = (np.exp(lp_ref) * (lp_ref - lp_i8)).sum(axis=1)
            del i8, lp_i8, lp_ref, ref
            tot_pos += len(ids)
            tot_agree += i8_agree
            kl_sum += float(kl.sum())
            if f32_agree != len(ids):
                failures.append(f"prompt {pi}: f32 argmax differs at {len(ids) - f32_agree} positions")
            if d_abs >= F32_MAX_ABS or d_p90 >= F32_P90:
                failures.append(f"prompt {pi}: f32 |dlogit| max {d_abs:.4f} (bound {F32_MAX_ABS}), "
                                f"p90 {d_p90:.4f} (bound {F32_P90})")
            if g_dray is None:
                rows.append((pi, len(ids), f32_agree, d_abs, i8_agree, float(kl.mean()), float(kl.max()),
                             0, None))
                print(f"prompt {pi}: {len(ids)} tokens checked ({time.time() - t0:.0f} s)", flush=True)
                continue
            # <eos>, <end_of_turn>: dray stops there too
            diff = greedy_first_difference(ref_ext, len(ids), g_dray, N_GREEDY, (m.eos, 106))
            del ref_ext
            if diff:
                k, want, gap = diff
                failures.append(f"prompt {pi}: greedy differs at token {k} (reference top-2 gap "
                                f"there {gap:.4f}); dray {g_dray[k:k + 4]} ref {want}")
            rows.append((pi, len(ids), f32_agree, d_abs, i8_agree, float(kl.mean()), float(kl.max()),
                         len(g_dray), diff is None))
            print(f"prompt {pi}: {len(ids)} tokens checked ({time.time() - t0:.0f} s)", flush=True)

    print("\nprompt  tokens  f32-top1  f32-max|d|  int8-top1  int8-KL-mean  int8-KL-max  greedy")
    for pi, n, fa, da, ia, klm, klx, ng, same in rows:
        print(f"{pi:6d}  {n:6d}  {fa:4d}/{n:<4d} {da:10.5f}  {ia:4d}/{n:<4d} {klm:12.5f} {klx:12.5f}  "
              + ("(logits only)" if same is None else f"{ng} tokens {'identical' if same else 'DIFFER'}"))
    int8_verdict(tot_agree, tot_pos, kl_sum, INT8_TOP1, INT8_KL, failures)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
