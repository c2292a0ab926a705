#!/usr/bin/env python3
"""Every model family dray runs, against the independent numpy reference
(family_ref.py), on small random-weight files written at test time by
write_family.py (SmolLM2's tokenizer, n_embd 64, 4 heads / 2 KV heads, ff 128;
2 layers, gemma3 6 (one global layer), smollm3 4 (one layer without RoPE)).

Cases: each family plus the RoPE scalings: llama:llama3 (rope_freqs),
qwen2:yarn (factor 4), phi3:longrope (short factors at -c CTX, and the long ones
at a context above rope.scaling.original_context_length = 512), gemma3:linear8.
The same PROMPT_LEN ids (dray's tokens of a fixed text) go to both sides.

Checks per case:
  (a) f32 path  (--precision f32 --kv-dtype f16) against the reference with K/V
      rounded to f16 as the cache stores them: argmax equal at every position,
      max |dlogit| < F32_MAX_ABS;
  (b) greedy    GREEDY tokens of dray f32 == the reference's greedy tokens
      (refcommon.greedy_first_difference, one reference pass);
  (c) plugins   the same greedy tokens from the opencl and vulkan plugins at f32
      (a plugin that reports no device here is skipped);
  (d) default   dray's default precision (no flags: quantized weights and
      activations, int8 KV), against the exact reference (K/V in f32): mean
      KL(ref || dray) over the prompt positions < DEFAULT_KL.

Measured (2026-12-07, CPU avx512-vnni, PoCL, lavapipe), printed as a table:
  f32   argmax 40/40 in every case; max |dlogit| 2.4e-7 (granite, logits / 8)
        and 4e-5 .. 5.3e-4 elsewhere (logits reach |5..6|): f32 summation order
        over 64..128-term dots and 2..6 layers, the f16 rounding of K/V being the
        same on both sides. F32_MAX_ABS = 0.003 is ~6x the largest. What it
        catches (the reference changed, against the same dray logits): NORM/NEOX
        pairs swapped 5.4, YaRN as plain linear 4.8, YaRN without its mscale 2.4,
        corr dims off by one 1.3, LongRoPE long/short factors swapped 5.7, its
        attn_factor dropped 2.5, Llama 3 rope_freqs ignored 0.046, gemma3 linear
        scaling dropped 0.51, qwen2 biases 1.1, qwen3 q/k norms 1.0, phi3 gate/up
        halves swapped 5.0, gemma2 no sliding window 1.9, its attention softcap
        dropped 0.0078 (scores here are far below 50), final softcap 0.063,
        olmo2 post-attention norm 1.2, granite residual_scale 0.32 / attention
        scale 0.058 / embedding_scale 0.62, smollm3 RoPE on its 4th layer 0.91;
        K/V not rounded to f16 0.0031 (so the rounding is needed); gelu erf for
        gelu tanh 0.0012 (below the bound: the two are that close).
  greedy 16 tokens identical to the reference in every case, and the opencl and
        vulkan plugins' identical to the CPU's.
  default mean KL(ref || dray) 0.0003 .. 0.0005, gemma2/gemma3 0.0021 .. 0.0025
        (gelu and the post-norms amplify int8 errors); granite 0.00000 (its
        logits / 8 are near-uniform: KL says little there, f32 checks it).
        Bounds at ~2x: DEFAULT_KL. Top-1 of the default path (34..40 of 40) is
        printed, not asserted: random weights give near-ties.
Whole test: 170 s on 2 busy cores (load 5); without the plugins about 35 s.
lavapipe is most of it (~0.7 s a decoded token), run in the background.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matmuls: threads only contend
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import family_ref  # noqa: E402
import gguf  # noqa: E402
import write_family  # noqa: E402
from refcommon import greedy_first_difference, log_softmax  # noqa: E402

F32_MAX_ABS = 0.003   # measured max 5.3e-4 (see above)
# default precision: the gemmas' gelu and post-norms make int8 errors larger
DEFAULT_KL = {"gemma2": 0.005, "gemma3": 0.005}  # measured max 0.0025
DEFAULT_KL_OTHER = 0.001                          # measured max 0.00048
GREEDY = 16
CTX = 128             # dray's -c and the reference's n_ctx (LongRoPE: short factors)
LONG_CTX = 600        # > phi3:longrope's original context 512: the long factors
PROMPT = ("The history of the printing press begins in the fifteenth century, when "
          "Johannes Gutenberg combined a screw press, movable metal type and oil-based ink "
          "into a system that could produce books far faster than scribes.")
PROMPT_LEN = 40       # ids used (the text gives a few more); > gemma's window 32
SIZE = ["--embd", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128"]
LAYERS = {"gemma3": 6, "smollm3": 4}  # gemma3: layer 5 global; smollm3: layer 3 without RoPE
CASES = [("llama", ""), ("llama", "llama3"), ("qwen2", ""), ("qwen2", "yarn"), ("qwen3", ""),
         ("phi3", ""), ("phi3", "longrope"), ("gemma2", ""), ("gemma3", ""), ("gemma3", "linear8"),
         ("olmo2", ""), ("granite", ""), ("smollm3", "")]
F32 = ["--precision", "f32", "--kv-dtype", "f16"]


class _CachedTokenizer:
    """The gguf module for write_family, except that the tokenizer file it copies
    from is read once (reading SmolLM2's vocabulary is most of a file's writing)."""

    def __init__(self):
        self.readers = {}

    def __getattr__(self, name):
        return getattr(gguf, name)

    def GGUFReader(self, path):  # noqa: N802 (gguf's name)
        if path not in self.readers:
            self.readers[path] = family_ref.open_gguf(path)
        return self.readers[path]


write_family.gguf = _CachedTokenizer()


def write(arch, out, tokenizer, variant="", extra=()):
    """write_family.py ARCH OUT (in this process, so the tokenizer is read once)."""
    argv = [arch, out] + SIZE + ["--layers", str(LAYERS.get(arch, 2)), "--tokenizer", tokenizer]
    argv += (["--variant", variant] if variant else []) + list(extra)
    saved = sys.argv
    sys.argv = ["write_family.py"] + argv
    try:
        write_family.main()
    finally:
        sys.argv = saved


def dray_run(dray, args):
    r = subprocess.run([dray, "run", "-q"] + args, capture_output=True)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace").strip()


def logits(dray, model, ids, ctx, extra, path):
    rc, _, err = dray_run(dray, ["-m", model, "--prompt-ids", ",".join(map(str, ids)),
                                 "--dump-logits", path, "-c", str(ctx)] + extra)
    if rc:
        raise RuntimeError(f"dray run {model}: {err}")
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), -1)


def greedy_cmd(dray, model, ids, backend, ctx):
    return [dray, "run", "-q", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(GREEDY),
            "--temp", "0", "--print-token-ids", "-c", str(ctx), "--backend", backend] + F32


def greedy_tokens(cmd, rc, out, err):
    if rc:
        raise RuntimeError(f"{' '.join(cmd[:3])} {cmd[4]} --backend {cmd[cmd.index('--backend') + 1]}: {err}")
    last = out.rstrip("\n").split("\n")[-1]
    return [int(x) for x in last.split()] if last.strip() else []


def greedy(dray, model, ids, backend, ctx):
    cmd = greedy_cmd(dray, model, ids, backend, ctx)
    r = subprocess.run(cmd, capture_output=True)
    return greedy_tokens(cmd, r.returncode, r.stdout.decode(errors="replace"),
                         r.stderr.decode(errors="replace").strip())


class Pending:
    """Plugin greedy runs in the background, at most IN_FLIGHT per plugin at a time,
    so that lavapipe's slow decoding (~0.7 s a token here, one thread) overlaps the
    rest of the test. check(tag, plugin, cmd, want) queues one; finish() waits for
    all. Files stay until then (the caller deletes them after finish)."""

    IN_FLIGHT = 2

    def __init__(self):
        self.running = {}  # plugin -> [(tag, cmd, want, Popen)]
        self.results = []  # (tag, plugin, same, detail)

    def _collect(self, plugin):
        tag, cmd, want, proc = self.running[plugin].pop(0)
        out, err = proc.communicate()
        try:
            got = greedy_tokens(cmd, proc.returncode, out.decode(errors="replace"),
                                err.decode(errors="replace").strip())
            self.results.append((tag, plugin, got == want, f"{got} != cpu {want}"))
        except RuntimeError as e:
            self.results.append((tag, plugin, False, str(e)))

    def check(self, tag, plugin, cmd, want):
        q = self.running.setdefault(plugin, [])
        if len(q) >= self.IN_FLIGHT:
            self._collect(plugin)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        q.append((tag, cmd, want, proc))

    def finish(self):
        for plugin, q in self.running.items():
            while q:
                self._collect(plugin)
        return self.results


def check_case(a, arch, variant, path, ids, plugins, pending, dump):
    """One file: (table row, failures)."""
    name = arch + (":" + variant if variant else "")
    fails = []
    m = family_ref.Model(path, n_ctx=CTX)
    row = {"case": name}
    contexts = [CTX] + ([LONG_CTX] if variant == "longrope" else [])
    for ctx in contexts:
        tag = name + ("" if ctx == CTX else f" -c {ctx}")
        m.n_ctx = ctx
        # (b) dray's greedy tokens; one reference pass over prompt + them (K/V in f16,
        # as dray's f16 cache) gives the prompt's logits for (a) in its first rows
        g = greedy(a.dray, path, ids, "cpu", ctx)
        m.kv_f16 = True
        ref_ext = family_ref.forward(m, ids + g)
        ref16 = ref_ext[:len(ids)]
        f32 = logits(a.dray, path, ids, ctx, F32, dump)
        agree = int((f32.argmax(1) == ref16.argmax(1)).sum())
        d_abs = float(np.abs(f32 - ref16).max())
        if agree != len(ids):
            fails.append(f"{tag}: f32 argmax differs at {len(ids) - agree} of {len(ids)} positions")
        if d_abs >= F32_MAX_ABS:
            fails.append(f"{tag}: f32 max |dlogit| {d_abs:.2e} >= {F32_MAX_ABS}")
        diff = greedy_first_difference(ref_ext, len(ids), g, GREEDY, (m.eos,))
        if diff:
            k, want, gap = diff
            fails.append(f"{tag}: greedy differs at token {k} (reference {want}, top-2 gap {gap:.4f}); "
                         f"dray {g[k:k + 4]}")
        # (c) the plugins' greedy tokens must be these (checked once they are back)
        for p in plugins:
            pending.check(tag, p, greedy_cmd(a.dray, path, ids, p, ctx), g)
        # (d) the default precision against the exact reference
        m.kv_f16 = False
        ref = family_ref.forward(m, ids)
        d8 = logits(a.dray, path, ids, ctx, [], dump)
        lp_ref, lp_d = log_softmax(ref), log_softmax(d8)
        kl = float((np.exp(lp_ref) * (lp_ref - lp_d)).sum(axis=1).mean())
        kl_max = DEFAULT_KL.get(arch, DEFAULT_KL_OTHER)
        if kl >= kl_max:
            fails.append(f"{tag}: default-precision mean KL {kl:.5f} >= {kl_max}")
        row = dict(case=tag, agree=agree, n=len(ids), d_abs=d_abs, range=float(np.abs(ref16).max()),
                   greedy=f"{len(g)} {'same' if diff is None else 'DIFFER'}",
                   plugins="-", kl=kl,
                   top1=int((d8.argmax(1) == ref.argmax(1)).sum()))
        yield row, fails
        fails = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--tokenizer", required=True, help="SmolLM2 GGUF whose tokenizer the files copy")
    ap.add_argument("--plugins", default="opencl,vulkan")
    ap.add_argument("--only", default="", help="comma-separated cases (arch or arch:variant)")
    a = ap.parse_args()
    t0 = time.time()
    failures, rows = [], []
    cases = [c for c in CASES if not a.only or c[0] in a.only.split(",")
             or f"{c[0]}:{c[1]}" in a.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.bin")
        plugins, pending = [], Pending()
        for i, (arch, variant) in enumerate(cases):
            path = os.path.join(tmp, f"{arch}-{variant or 'plain'}.gguf")
            write(arch, path, a.tokenizer, variant)
            if i == 0:
                r = subprocess.run([a.dray, "tokenize", "-m", path, "--ids"], input=PROMPT.encode(),
                                   capture_output=True, check=True)
                ids = [int(x) for x in r.stdout.split()][:PROMPT_LEN]
                assert len(ids) == PROMPT_LEN, ids
                for p in filter(None, a.plugins.split(",")):
                    rc, _, err = dray_run(a.dray, ["-m", path, "--backend", p, "-p", "a", "-n", "1",
                                                   "-c", "64"])
                    if rc:
                        print(f"{p}: not run here: {err.splitlines()[-1] if err else rc}")
                    else:
                        plugins.append(p)
            for row, f in check_case(a, arch, variant, path, ids, plugins, pending, dump):
                rows.append(row)
                failures += f
                print(f"{row['case']}: checked ({time.time() - t0:.0f} s)", flush=True)
        by_tag = {}
        for tag, p, same, detail in pending.finish():
            by_tag.setdefault(tag, []).append(f"{p} {'same' if same else 'DIFFER'}")
            if not same:
                failures.append(f"{tag}: {p} f32 greedy: {detail}")
        for r in rows:
            r["plugins"] = ", ".join(by_tag.get(r["case"], [])) or "-"
    print(f"\n{'case':22s} {'f32-argmax':>10s} {'max|dlogit|':>11s} {'max|logit|':>10s} "
          f"{'greedy':>8s}  {'plugins':22s} {'default-KL':>10s} {'default-top1':>12s}")
    for r in rows:
        print(f"{r['case']:22s} {r['agree']:4d}/{r['n']:<5d} {r['d_abs']:11.2e} {r['range']:10.2f} "
              f"{r['greedy']:>8s}  {r['plugins']:22s} {r['kl']:10.5f} {r['top1']:6d}/{r['n']:<5d}")
    for f in failures:
        print("FAIL:", f)
    print(f"PASS ({time.time() - t0:.0f} s)" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
