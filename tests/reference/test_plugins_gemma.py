#!/usr/bin/env python3
"""A real model (Gemma 3: plugins_gemma; SmolLM2: plugins_llama) on every plugin that has a device here, against the CPU plugin.

f32 path (--precision f32 --kv-dtype f16): greedy tokens must be identical to the
CPU plugin's for N_TOKENS tokens on each prompt. The ops compute the same f32
math in a different summation order, so logits differ by ~1e-3 and greedy choices
agree unless two candidates are closer than that.

int8 path (the default): not bit-identical by design, and this checks a bound
instead. Each plugin quantizes activations per token inside its matmul; when an
f32 value lies within an ulp of a rounding boundary, the plugins can round it to
neighbouring int8 codes, and 18 layers of re-quantization carry that on. Also,
calibration (outlier channels) runs on each device and may pick a different
channel where two are nearly tied. So the check is distributional: over the prompt
positions, mean KL(cpu || plugin) < INT8_KL and top-1 agreement >= INT8_TOP1.
Greedy int8 output is reported (where it first differs), not asserted.
"""
import argparse
import subprocess
import sys

import numpy as np

from refcommon import log_softmax

N_TOKENS = 32
INT8_KL = 0.02
INT8_TOP1 = 0.8
PROMPTS = ["The capital of France is", "Photosynthesis is the process by which green plants"]
# int8 logits are compared over the positions of a longer text (a few positions
# would make top-1 agreement a coin toss)
INT8_TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
             "Gutenberg combined a screw press, movable metal type and oil-based ink into a system "
             "that could produce books far faster than scribes. Within fifty years, printing shops "
             "had spread to more than two hundred cities.")
# lavapipe runs compute shaders on the CPU, ~100x slower than the CPU plugin: one prompt
PROMPTS_PER_PLUGIN = {"opencl": 2, "vulkan": 1}
F32 = ["--precision", "f32", "--kv-dtype", "f16"]


def run(dray, args, **kw):
    return subprocess.run([dray, "run", "-q"] + args, capture_output=True, **kw)


def greedy(dray, model, backend, prompt, extra):
    r = run(dray, ["-m", model, "--backend", backend, "-p", prompt, "-n", str(N_TOKENS), "--temp", "0",
                   "--print-token-ids", "-c", "256"] + extra)
    if r.returncode:
        raise RuntimeError(r.stderr.decode(errors="replace").strip())
    return [int(x) for x in r.stdout.decode(errors="replace").rstrip("\n").split("\n")[-1].split()]


def logits(dray, model, backend, ids, path):
    r = run(dray, ["-m", model, "--backend", backend, "--prompt-ids", ",".join(map(str, ids)),
                   "--dump-logits", path, "-c", "256"])
    if r.returncode:
        raise RuntimeError(r.stderr.decode(errors="replace").strip())
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), -1)


def has_device(dray, model, backend):
    r = run(dray, ["-m", model, "--backend", backend, "-p", "a", "-n", "1", "-c", "64"])
    return r.returncode == 0, r.stderr.decode(errors="replace").strip().split("\n")[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--plugins", default="opencl,vulkan")
    a = ap.parse_args()
    failures, ran = [], 0
    ids_of = {}
    for p in PROMPTS:
        out = subprocess.run([a.dray, "tokenize", "-m", a.model, "--ids"], input=p.encode(),
                             capture_output=True, check=True)
        ids_of[p] = [int(x) for x in out.stdout.split()]
    cpu_f32 = {p: greedy(a.dray, a.model, "cpu", p, F32) for p in PROMPTS}
    cpu_i8 = {p: greedy(a.dray, a.model, "cpu", p, []) for p in PROMPTS}
    out = subprocess.run([a.dray, "tokenize", "-m", a.model, "--ids"], input=INT8_TEXT.encode(),
                         capture_output=True, check=True)
    text_ids = [int(x) for x in out.stdout.split()]
    cpu_lg = logits(a.dray, a.model, "cpu", text_ids, "/tmp/dray-plugins-cpu.bin")
    for plugin in a.plugins.split(","):
        ok, why = has_device(a.dray, a.model, plugin)
        if not ok:
            print(f"{plugin}: not run here: {why}")
            continue
        ran += 1
        for p in PROMPTS[:PROMPTS_PER_PLUGIN.get(plugin, len(PROMPTS))]:
            g = greedy(a.dray, a.model, plugin, p, F32)
            same = g == cpu_f32[p]
            print(f"{plugin}: f32 greedy {N_TOKENS} tokens for {p!r}: {'identical' if same else 'DIFFER'}")
            if not same:
                failures.append(f"{plugin}: f32 greedy differs for {p!r}: {g} vs {cpu_f32[p]}")
            gi = greedy(a.dray, a.model, plugin, p, [])
            k = next((i for i, (x, y) in enumerate(zip(gi, cpu_i8[p])) if x != y), None)
            print(f"{plugin}: int8 greedy {N_TOKENS} tokens for {p!r}: "
                  + ("identical" if k is None else f"first differs at token {k}"))
        lg = logits(a.dray, a.model, plugin, text_ids, f"/tmp/dray-plugins-{plugin}.bin")
        a_, b_ = log_softmax(cpu_lg), log_softmax(lg)
        kl = float((np.exp(a_) * (a_ - b_)).sum(axis=1).mean())
        top1 = float((lg.argmax(1) == cpu_lg.argmax(1)).mean())
        print(f"{plugin}: int8 logits over {len(text_ids)} positions vs cpu: max |d| "
              f"{np.abs(lg - cpu_lg).max():.3f}, mean KL {kl:.5f}, top-1 {100 * top1:.1f}%")
        if kl >= INT8_KL or top1 < INT8_TOP1:
            failures.append(f"{plugin}: int8 KL {kl:.5f} (< {INT8_KL}) top-1 {top1:.3f} (>= {INT8_TOP1})")
    for f in failures:
        print("FAIL:", f)
    if not ran:
        print("skip: no plugin other than cpu has a device here")
        return 77
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
