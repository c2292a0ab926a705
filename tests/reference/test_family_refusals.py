#!/usr/bin/env python3
"""Files dray must refuse, and say why, rather than run wrongly: through `dray run`
(nonzero exit, the reason on stderr) and `dray info FILE` (a line
"runs with dray : no: <reason>"; "runs with dray : yes" for a file it runs).

Files (write_family.py, small, SmolLM2's tokenizer):
  llama                    runs: exit 0 and "runs with dray : yes" (the control)
  llama --variant extra    a tensor no family has: names blk.0.attn_sinks.weight
  llama --variant moe      expert_count: "Mixture of Experts"
  --drop NAME              a required tensor missing, one per family kind (norms
                           of qwen3, phi3's fused QKV, gemma2's post-FFN norm,
                           olmo2's whole-vector q norm): names NAME
  --shrink NAME            a tensor one row short (a matrix, a fused matrix, a
                           bias): names NAME and its shape
  architecture "mamba"     (with a tokenizer) "is not supported; dray runs: " and
                           the families
  ABI version 3 plugin     (the template built as version 3, tests/plugins) a
                           Llama 3 file (RoPE factors) and a Gemma 2 file (soft
                           caps) are refused naming the version they need, and
                           run on the same template built as version 4

Measured (2026-12-07): every case as above, in about 20 s on 2 cores.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import test_families  # noqa: E402  (its write() reads the tokenizer once)
import write_family  # noqa: E402

YES = "runs with dray : yes"
NO = "runs with dray : no: "

# (name, arch, write_family options, what the reason must contain)
CASES = [
    ("llama runs", "llama", [], None),
    ("extra tensor", "llama", ["--variant", "extra"], "blk.0.attn_sinks.weight"),
    ("mixture of experts", "llama", ["--variant", "moe"], "Mixture of Experts"),
    ("qwen3 missing k norm", "qwen3", ["--drop", "blk.1.attn_k_norm.weight"], "blk.1.attn_k_norm.weight"),
    # phi3's Q/K/V come fused or split: both forms are named
    ("phi3 missing qkv", "phi3", ["--drop", "blk.0.attn_qkv.weight"], "blk.0.attn_qkv.weight"),
    ("gemma2 missing post-ffw norm", "gemma2", ["--drop", "blk.1.post_ffw_norm.weight"],
     "blk.1.post_ffw_norm.weight"),
    ("olmo2 missing q norm", "olmo2", ["--drop", "blk.0.attn_q_norm.weight"], "blk.0.attn_q_norm.weight"),
    # a tensor one row short: named with both shapes, by dray info too (no device)
    ("qwen2 short k", "qwen2", ["--shrink", "blk.1.attn_k.weight"], "blk.1.attn_k.weight has shape [64, 31, 1, 1], expected [64, 32]"),
    ("phi3 short fused up", "phi3", ["--shrink", "blk.0.ffn_up.weight"], "blk.0.ffn_up.weight has shape"),
    ("qwen2 short bias", "qwen2", ["--shrink", "blk.0.attn_v.bias"], "blk.0.attn_v.bias has shape"),
]


def write_unknown(path, tokenizer):
    """A GGUF of architecture "mamba" with a real tokenizer and a llama-like body."""
    g = test_families.write_family.gguf  # the cached-tokenizer gguf module
    w = g.GGUFWriter(path, "mamba")
    vocab = write_family.copy_tokenizer(w, tokenizer)
    w.add_uint32("mamba.block_count", 1)
    w.add_uint32("mamba.embedding_length", 64)
    w.add_uint32("mamba.context_length", 256)
    w.add_tensor("token_embd.weight", np.zeros((vocab, 64), np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check(dray, name, path, want):
    """Failures of one file: want None (it runs) or a reason's substring."""
    fails = []
    r = subprocess.run([dray, "run", "-q", "-m", path, "--prompt-ids", "1,2,3", "-n", "2", "-c", "64"],
                       capture_output=True)
    err = r.stderr.decode(errors="replace").strip()
    info = subprocess.run([dray, "info", path], capture_output=True)
    lines = [ln for ln in info.stdout.decode(errors="replace").splitlines() if ln.startswith("runs with dray")]
    line = lines[0] if len(lines) == 1 else f"{len(lines)} 'runs with dray' lines"
    if want is None:
        if r.returncode:
            fails.append(f"{name}: dray run exited {r.returncode}: {err}")
        if line != YES:
            fails.append(f"{name}: dray info: {line!r}, expected {YES!r}")
    else:
        if r.returncode == 0:
            fails.append(f"{name}: dray run ran it (exit 0)")
        elif want not in err:
            fails.append(f"{name}: dray run's message {err!r} does not name {want!r}")
        if not line.startswith(NO) or want not in line:
            fails.append(f"{name}: dray info: {line!r}, expected {NO!r}... naming {want!r}")
    print(f"{name:30s} run: exit {r.returncode}  info: {line}")
    return fails


def old_plugin(dray, tmp, tokenizer):
    """ABI v4 arguments on a plugin that would drop them: refused, naming both versions."""
    plugins = os.path.join(os.environ.get("DRAY_BUILD_ROOT", os.path.join(os.path.dirname(dray), "..")),
                           "tests", "plugins")
    if not os.path.exists(os.path.join(plugins, "libdray-tplv3.so")):
        print(f"skip: no template plugins in {plugins}")
        return []
    env = dict(os.environ, DRAY_PLUGIN_PATH=plugins)
    fails = []
    for arch, opts, what in (("llama", ["--variant", "llama3"], "RoPE scaling"), ("gemma2", [], "soft-capping")):
        path = os.path.join(tmp, f"v4-{arch}.gguf")
        test_families.write(arch, path, tokenizer, extra=opts)
        for backend, ok in (("tplv3", False), ("tplv4", True)):
            r = subprocess.run([dray, "run", "-q", "-m", path, "--backend", backend, "--prompt-ids", "1,2,3",
                                "-n", "2", "-c", "64"], capture_output=True, env=env)
            err = r.stderr.decode(errors="replace").strip()
            want = f"{what} needs a plugin of ABI version 4; plugin {backend} speaks version 3"
            if ok and r.returncode:
                fails.append(f"{arch} on {backend}: exit {r.returncode}: {err}")
            if not ok and (r.returncode == 0 or want not in err):
                fails.append(f"{arch} on {backend}: exit {r.returncode}, {err!r} lacks {want!r}")
            print(f"{arch + ' on ' + backend:30s} run: exit {r.returncode}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True)
    ap.add_argument("--tokenizer", required=True, help="SmolLM2 GGUF whose tokenizer the files copy")
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, arch, opts, want) in enumerate(CASES):
            path = os.path.join(tmp, f"{i}.gguf")
            test_families.write(arch, path, a.tokenizer, extra=opts)
            failures += check(a.dray, name, path, want)
            os.remove(path)
        path = os.path.join(tmp, "mamba.gguf")
        write_unknown(path, a.tokenizer)
        failures += check(a.dray, "unknown architecture", path, "is not supported; dray runs: ")
        # the list it gives names every family the reference checks
        info = subprocess.run([a.dray, "info", path], capture_output=True).stdout.decode(errors="replace")
        listed = info.split("dray runs: ", 1)[-1].split("\n", 1)[0].replace(",", " ").split()
        missing = [f for f in test_families.family_ref.FAMILIES if f not in listed]
        if missing:
            failures.append(f"unknown architecture: dray info's list {listed} lacks {missing}")
        failures += old_plugin(a.dray, tmp, a.tokenizer)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
