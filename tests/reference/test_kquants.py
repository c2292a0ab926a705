#!/usr/bin/env python3
"""GGUF's K quants at the file's size and value, on every plugin that runs here
(ABI v4 two-level formats, issue 53).

File: bench/write_quantized.py --shape tiny --varied-scales (2 layers, width
256, FFN 768, 4/2 heads, SmolLM2's tokenizer): random Q4_K blocks, every block
its own sub-scales and mins, Q6_K (its own 16 signed scales) for the output head and,
in layer 1 (Q4_K_M's rule), for attn_v and ffn_down, so that layer's fused
Q|K|V mixes Q4_K and Q6_K (split into matrices of their own formats).

Checks:
  (a) value  `dray perplexity` at the default precision (the K quants as
      two-level formats, int8 activations, int8 KV) against the same file at
      f32 with an f16 KV, per plugin (cpu; opencl and vulkan where they report a
      device): mean KL < MAX_KL. A wrong sub-scale or half-group scale moves
      it by orders of magnitude (measured on the CPU's AVX-512 kernel: s and n
      swapped, KL 0.53; Q6_K's second half-group read with the first's scale,
      0.35; same top token 0% in both).
  (b) size   `dray bench model`'s bytes a decode step reads (weights, head
      included) within 2% of the file's bytes of the same tensors (every layer
      matrix and output.weight).

Measured (2026-12-07, Sapphire Rapids-class Xeon, PoCL, lavapipe): KL 2.80e-5
(cpu), 2.81e-5 (opencl), 2.81e-5 (vulkan), same top token 97.6%; a step reads
11.30 MB of weights against the file's 11.27 MB. MAX_KL = 3e-4 is 10x that.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MAX_KL = 3e-4
TEXT = os.path.join(ROOT, "bench", "texts", "varied.txt")


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"FAIL: {' '.join(args)}\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def has_device(dray, plugin):
    """Whether `dray devices` lists a device 0 under the plugin's line."""
    out = subprocess.run([dray, "devices"], capture_output=True, text=True).stdout
    m = re.search(rf"^  {plugin}  \(ABI \d+\).*?(?=^  \S|\Z)", out, re.M | re.S)
    return bool(m) and "device 0:" in m.group(0)


def file_step_bytes(path):
    import gguf
    r = gguf.GGUFReader(path)
    return sum(int(t.n_bytes) for t in r.tensors
               if t.name == "output.weight" or (t.name.startswith("blk.") and len(t.shape) >= 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--tokenizer", required=True)
    a = ap.parse_args()
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DRAY_CACHE_DIR"] = os.path.join(tmp, "cache")
        model = os.path.join(tmp, "tiny-k.gguf")
        run([sys.executable, os.path.join(ROOT, "bench", "write_quantized.py"), model, "--shape", "tiny",
             "--tokenizer", a.tokenizer, "--varied-scales"])
        base = os.path.join(tmp, "base.kld")
        common = ["-q", "-m", model, "-t", "2", "-c", "256", "--chunks", "2"]
        run([a.dray, "perplexity", *common, "-f", TEXT, "--precision", "f32", "--kv-dtype", "f16",
             "--kl-divergence-base", base])
        for plugin in ("cpu", "opencl", "vulkan"):
            if not has_device(a.dray, plugin):
                print(f"{plugin:7s} skipped: no device")
                continue
            out = run([a.dray, "perplexity", *common, "--backend", plugin, "--kl-divergence",
                       "--kl-divergence-base", base], timeout=600)
            kl = float(re.search(r"mean KL\s*:\s*([-\d.e+]+)", out).group(1))
            top = re.search(r"same top token\s*:\s*([\d.]+)", out).group(1)
            print(f"{plugin:7s} mean KL {kl:.3e}, same top token {top}%")
            if not kl < MAX_KL:
                fails.append(f"{plugin}: mean KL {kl:.3e} >= {MAX_KL}")
        out = run([a.dray, "bench", "model", "-m", model, "-t", "2", "--prefill", "1", "--decode", "1"])
        held = float(re.search(r"roofline: a step reads [\d.]+ MB \(weights ([\d.]+)", out).group(1)) * 1e6
        want = file_step_bytes(model)
        print(f"a step reads {held / 1e6:.2f} MB of weights; the file's same tensors {want / 1e6:.2f} MB "
              f"({held / want:.3f}x)")
        if held > 1.02 * want:
            fails.append(f"a step reads {held / want:.3f}x the file's bytes (at most 1.02x)")
    for f in fails:
        print("FAIL:", f)
    print("kquants:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
