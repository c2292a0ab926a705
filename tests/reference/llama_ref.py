#!/usr/bin/env python3
"""Independent numpy reference of the Llama-architecture forward pass (SmolLM2,
Llama 2/3, ...), for checking dray.

Reads a GGUF with the PyPI `gguf` package (weights dequantized with its
`gguf.quants.dequantize`) and runs one sequence in float32 (norm sums of squares
in float64), written from the architecture's description, not from dray's code:

    x = token_embd[ids]                                   (no scaling)
    per layer:
      h = rmsnorm(x, attn_norm)
      q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)         per head of head_dim
      q, k = rope(q), rope(k)   -- ADJACENT pairs (x0,x1),(x2,x3),... turned by
                                   pos * base^(-2i/head_dim): llama.cpp's "normal"
                                   mode, which is how the GGUF stores Q/K rows
      a = softmax(q k^T / sqrt(head_dim), causal) v       GQA: query head h reads
                                                          kv head h // (n_head/n_kv)
      x = x + Wo a (+bo)
      x = x + Wdown (silu(Wgate h2) * Wup h2),  h2 = rmsnorm(x, ffn_norm)
    logits = (output.weight or token_embd) rmsnorm(x, output_norm)

It shares no code with the C engine on purpose: it is the check. (dray reorders
the Q/K rows at load and uses NEOX rotation instead; this file does not, so the
two agree only if that reordering is right.)

  llama_ref.py --model M.gguf --ids 1,2,3 --out logits.npy [--gen N]
"""
import argparse
import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("llama_ref.py: needs the `gguf` package (pip install gguf numpy)")

from refcommon import field  # noqa: E402


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        arch = field(r, "general.architecture")
        if arch != "llama":
            raise SystemExit(f"{path}: general.architecture is {arch!r}, expected 'llama'")
        p = "llama."
        self.n_embd = field(r, p + "embedding_length")
        self.n_layer = field(r, p + "block_count")
        self.n_head = field(r, p + "attention.head_count")
        self.n_head_kv = field(r, p + "attention.head_count_kv", self.n_head)
        self.head_dim = field(r, p + "attention.key_length", self.n_embd // self.n_head)
        self.eps = np.float32(field(r, p + "attention.layer_norm_rms_epsilon"))
        self.base = field(r, p + "rope.freq_base", 10000.0)
        self.eos = field(r, "tokenizer.ggml.eos_token_id", 2)
        self.t = {t.name: t for t in r.tensors}
        self.tok_embd = self.weight("token_embd.weight")
        self.out_w = self.weight("output.weight") if "output.weight" in self.t else self.tok_embd
        self.out_norm = self.weight("output_norm.weight")
        self.layers = [self.load_layer(il) for il in range(self.n_layer)]
        self.kv_f16 = False

    def weight(self, name, required=True):
        t = self.t.get(name)
        if t is None:
            if required:
                raise SystemExit(f"tensor {name} missing from the GGUF")
            return None
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        return w.reshape([int(n) for n in reversed(t.shape)])  # (out, in)

    def load_layer(self, il):
        L = {n: self.weight(f"blk.{il}.{n}.weight") for n in
             ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
              "ffn_gate", "ffn_up", "ffn_down"]}
        for n in ["attn_q", "attn_k", "attn_v", "attn_output"]:
            L[n + ".bias"] = self.weight(f"blk.{il}.{n}.bias", required=False)
        return L


def rmsnorm(x, w, eps):
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    scale = (1.0 / np.sqrt(ms.astype(np.float32) + eps)).astype(np.float32)
    return (x * scale) * w


def rope_adjacent(x, pos, base):
    """x: (T, H, D). Pairs (2i, 2i+1) turned by pos * base^(-2i/D)."""
    D = x.shape[-1]
    inv = base ** (-np.arange(D // 2, dtype=np.float64) * 2.0 / D)
    theta = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.cos(theta).astype(np.float32)[:, None, :]
    sin = np.sin(theta).astype(np.float32)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def silu(x):
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def attention(q, k, v):
    T, H, D = q.shape
    group = H // k.shape[1]
    allowed = np.arange(T)[None, :] <= np.arange(T)[:, None]
    out = np.empty((T, H, D), dtype=np.float32)
    for h in range(H):
        g = h // group
        s = (q[:, h, :] @ k[:, g, :].T) / np.float32(np.sqrt(D))
        s = np.where(allowed, s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h, :] = (e / e.sum(axis=1, keepdims=True)) @ v[:, g, :]
    return out


def linear(x, w, b):
    y = x @ w.T
    return y + b if b is not None else y


def forward(m, ids, all_logits=True):
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    pos = np.arange(T)
    x = m.tok_embd[ids].copy()
    for L in m.layers:
        h = rmsnorm(x, L["attn_norm"], m.eps)
        q = linear(h, L["attn_q"], L["attn_q.bias"]).reshape(T, m.n_head, m.head_dim)
        k = linear(h, L["attn_k"], L["attn_k.bias"]).reshape(T, m.n_head_kv, m.head_dim)
        v = linear(h, L["attn_v"], L["attn_v.bias"]).reshape(T, m.n_head_kv, m.head_dim)
        q, k = rope_adjacent(q, pos, m.base), rope_adjacent(k, pos, m.base)
        if m.kv_f16:  # K/V as an f16 cache stores them
            k = k.astype(np.float16).astype(np.float32)
            v = v.astype(np.float16).astype(np.float32)
        a = attention(q, k, v).reshape(T, m.n_head * m.head_dim)
        x = x + linear(a, L["attn_output"], L["attn_output.bias"])
        h2 = rmsnorm(x, L["ffn_norm"], m.eps)
        x = x + (silu(h2 @ L["ffn_gate"].T) * (h2 @ L["ffn_up"].T)) @ L["ffn_down"].T
    y = rmsnorm(x if all_logits else x[-1:], m.out_norm, m.eps)
    return (y @ m.out_w.T).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 logits [n_pos][n_vocab] as .npy")
    ap.add_argument("--gen", type=int, default=0, help="greedy tokens to print")
    a = ap.parse_args(argv)
    m = Model(a.model)
    ids = [int(x) for x in a.ids.split(",") if x.strip()]
    if a.out:
        np.save(a.out, forward(m, ids))
    seq = list(ids)
    for _ in range(a.gen):
        nxt = int(np.argmax(forward(m, seq, all_logits=False)[0]))
        if nxt == m.eos:
            break
        seq.append(nxt)
    if a.gen:
        print(" ".join(map(str, seq[len(ids):])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
