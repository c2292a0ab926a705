#!/usr/bin/env python3
"""Writes a random-weight GGUF of one architecture family, for checking dray
against llama.cpp and against family_ref.py on the same file.

Weights are N(0, 1/fan_in) so that logits vary (much smaller weights make a
tied head mostly predict its input token again), norms are 1 + N(0, 0.1^2),
biases N(0, 0.1^2). The tokenizer is copied from a real model (--tokenizer,
SmolLM2's by default), so llama.cpp and dray tokenize text the same way.

  write_family.py ARCH OUT.gguf [--embd 256 --layers 4 --heads 4 --kv-heads 2
                  --head-dim 64 --ff 512 --seed 1 --variant NAME]

Variants: llama3 (rope_freqs of Llama 3.1's rule), linear8 (gemma3's 4B+
RoPE scaling), yarn (qwen2, factor 4), longrope (phi3 factor tables), fused
(phi3's fused QKV) and the odd ones the refusal tests need: extra (a tensor no
family has), moe (llama with expert_count). --drop NAME (repeatable) leaves that
tensor out (the other weights stay as they would be).
"""
import argparse
import math
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("write_family.py: needs the `gguf` package")

ARCHS = ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "granite", "smollm3"]


def copy_tokenizer(w, path, pre=""):
    """Every tokenizer.* key of a real GGUF, with its types (pre: another split rule)."""
    r = gguf.GGUFReader(path)
    if pre:
        w.add_string("tokenizer.ggml.pre", pre)
    for name, f in r.fields.items():
        if not name.startswith("tokenizer.") or (pre and name == "tokenizer.ggml.pre"):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            et = f.types[1]
            if et == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(name, vals, t, sub_type=et)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8"), t)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), t)
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    return vocab


def llama3_factors(head_dim, base, factor=8.0, low=1.0, high=4.0, orig=8192):
    """Llama 3.1's rope_freqs rule (as its converter writes it)."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=ARCHS)
    ap.add_argument("out")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=0, help="default 4; gemma3 6 (one global layer)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="default embd / heads (qwen3, gemma: 64)")
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variant", default="")
    ap.add_argument("--tokenizer", default=".models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--drop", action="append", default=[], metavar="NAME",
                    help="leave tensor NAME out of the file (repeatable)")
    ap.add_argument("--pre", default="", help="override tokenizer.ggml.pre (checks a pre-split rule)")
    ap.add_argument("--shrink", action="append", default=[], metavar="NAME",
                    help="write tensor NAME with one row (or element) too few (repeatable)")
    a = ap.parse_args()

    arch, d = a.arch, a.embd
    L = a.layers or (6 if arch == "gemma3" else 4)
    H, KV = a.heads, a.kv_heads
    hd = a.head_dim or (64 if arch in ("qwen3", "gemma2", "gemma3") else d // H)
    q, kv, ff = H * hd, KV * hd, a.ff
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    dropped = set()
    add_tensor = w.add_tensor

    def add_or_drop(name, arr):  # the weights are drawn either way: the rest stay the same
        if name in a.drop:
            dropped.add(name)
        elif name in a.shrink:  # a misshapen tensor: the check must name it
            dropped.add(name)
            add_tensor(name, arr[:-1])
        else:
            add_tensor(name, arr)
    w.add_tensor = add_or_drop
    w.add_name("random weights")  # llama.cpp keys vocab quirks off names such as "phi3"
    vocab = copy_tokenizer(w, a.tokenizer, a.pre)
    p = arch + "."
    w.add_uint32(p + "block_count", L)
    w.add_uint32(p + "embedding_length", d)
    w.add_uint32(p + "feed_forward_length", ff)
    w.add_uint32(p + "attention.head_count", H)
    w.add_uint32(p + "attention.head_count_kv", KV)
    w.add_uint32(p + "context_length", a.ctx)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-6 if arch.startswith("gemma") else 1e-5)
    base = 10000.0 if arch != "qwen2" else 1000000.0
    w.add_float32(p + "rope.freq_base", base)
    if hd != d // H or arch in ("qwen3", "gemma2", "gemma3"):
        w.add_uint32(p + "attention.key_length", hd)
        w.add_uint32(p + "attention.value_length", hd)
    if arch in ("gemma2", "gemma3"):
        w.add_uint32(p + "attention.sliding_window", a.window)
    if arch == "gemma2":
        w.add_float32(p + "attn_logit_softcapping", 50.0)
        w.add_float32(p + "final_logit_softcapping", 30.0)
    if arch == "granite":
        w.add_float32(p + "logit_scale", 8.0)
        w.add_float32(p + "residual_scale", 0.22)
        w.add_float32(p + "embedding_scale", 12.0)
        w.add_float32(p + "attention.scale", 0.0078125 * 8)
    if a.variant == "linear8":
        w.add_string(p + "rope.scaling.type", "linear")
        w.add_float32(p + "rope.scaling.factor", 8.0)
    if a.variant == "yarn":
        w.add_string(p + "rope.scaling.type", "yarn")
        w.add_float32(p + "rope.scaling.factor", 4.0)
        w.add_uint32(p + "rope.scaling.original_context_length", a.ctx // 4)
    if a.variant == "longrope":
        w.add_uint32(p + "rope.scaling.original_context_length", a.ctx // 8)
        w.add_float32(p + "rope.scaling.attn_factor", 1.19)
    if a.variant == "moe":
        w.add_uint32(p + "expert_count", 8)
        w.add_uint32(p + "expert_used_count", 2)

    def mat(rows, cols):  # (out, in) = ggml [in, out]
        return rng.normal(0.0, 1.0 / math.sqrt(cols), (rows, cols)).astype(np.float32)

    def vec(n, mean=1.0, sd=0.1):
        return (mean + sd * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(vocab, d))
    w.add_tensor("output_norm.weight", vec(d))
    if arch in ("olmo2", "qwen2", "phi3", "granite") or a.variant == "output":
        w.add_tensor("output.weight", mat(vocab, d))
    if a.variant == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(hd, base))
    if a.variant == "longrope":
        w.add_tensor("rope_factors_short.weight", (1.0 + rng.random(hd // 2)).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", (1.0 + 8 * rng.random(hd // 2)).astype(np.float32))
    if a.variant == "extra":
        w.add_tensor("blk.0.attn_sinks.weight", vec(H))
    for il in range(L):
        b = f"blk.{il}."
        if arch != "olmo2":
            w.add_tensor(b + "attn_norm.weight", vec(d))
            w.add_tensor(b + "ffn_norm.weight", vec(d))
        if arch in ("gemma2", "gemma3", "olmo2"):
            w.add_tensor(b + "post_attention_norm.weight", vec(d))
            w.add_tensor(b + "post_ffw_norm.weight", vec(d))
        if arch in ("qwen3", "gemma3"):
            w.add_tensor(b + "attn_q_norm.weight", vec(hd))
            w.add_tensor(b + "attn_k_norm.weight", vec(hd))
        if arch == "olmo2":
            w.add_tensor(b + "attn_q_norm.weight", vec(q))
            w.add_tensor(b + "attn_k_norm.weight", vec(kv))
        if arch == "phi3":
            w.add_tensor(b + "attn_qkv.weight", mat(q + 2 * kv, d))
        else:
            w.add_tensor(b + "attn_q.weight", mat(q, d))
            w.add_tensor(b + "attn_k.weight", mat(kv, d))
            w.add_tensor(b + "attn_v.weight", mat(kv, d))
        if arch == "qwen2":
            for n, m in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                w.add_tensor(b + n + ".bias", vec(m, 0.0, 0.1))
        w.add_tensor(b + "attn_output.weight", mat(d, q))
        if arch == "phi3":
            w.add_tensor(b + "ffn_up.weight", mat(2 * ff, d))
        else:
            w.add_tensor(b + "ffn_gate.weight", mat(ff, d))
            w.add_tensor(b + "ffn_up.weight", mat(ff, d))
        w.add_tensor(b + "ffn_down.weight", mat(d, ff))
    if set(a.drop + a.shrink) - dropped:
        sys.exit(f"write_family.py: --drop/--shrink {sorted(set(a.drop + a.shrink) - dropped)}: "
                 f"no such tensor in a {arch} file")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
