#!/usr/bin/env python3
"""Independent numpy reference of the Gemma 3 forward pass, for checking dray.

Reads a GGUF with the PyPI `gguf` package (weights dequantized with its
`gguf.quants.dequantize`), runs one sequence through the model in float32
(norm sums of squares in float64) following docs/reference/gemma3-gguf.md
section 5, and writes the logits of every position.

It shares no code with the C engine on purpose: it is the check.

  gemma3_ref.py --model M.gguf --ids 2,651,... --out logits.npy [--gen N]
  gemma3_ref.py --model M.gguf --prompt "The capital of France is" --gen 20

--out writes float32 [n_pos][n_vocab] as .npy (np.load-able). --gen N continues
greedily for N tokens and prints the ids (and the text, decoded with the file's
vocabulary). --prompt tokenizes with a small SentencePiece-style merger over the
file's vocabulary (section 6.3), BOS first, for sanity checks only.
"""
import argparse
import heapq
import sys
import time

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("gemma3_ref.py: needs the `gguf` package (pip install gguf numpy)")

from refcommon import field  # noqa: E402


# ----------------------------------------------------------------- loading

def string_array(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]


def scalar_array(reader, key):
    f = reader.fields[key]
    return np.array([f.parts[i][0] for i in f.data])


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        arch = field(r, "general.architecture")
        if arch != "gemma3":
            raise SystemExit(f"{path}: general.architecture is {arch!r}, expected 'gemma3'")
        p = arch + "."
        self.n_embd = field(r, p + "embedding_length")
        self.n_layer = field(r, p + "block_count")
        self.n_head = field(r, p + "attention.head_count")
        self.n_head_kv = field(r, p + "attention.head_count_kv", self.n_head)
        self.head_dim = field(r, p + "attention.key_length", self.n_embd // self.n_head)
        self.v_dim = field(r, p + "attention.value_length", self.head_dim)
        self.eps = np.float32(field(r, p + "attention.layer_norm_rms_epsilon"))
        self.base_global = field(r, p + "rope.freq_base", 10000.0)
        # llama.cpp hard-codes 10000 for the sliding layers; honour a key if one appears
        self.base_local = field(r, p + "rope.freq_base_swa", 10000.0)
        factor = field(r, p + "rope.scaling.factor", 0.0) or 0.0
        self.freq_scale_global = 1.0 / factor if factor > 0 else 1.0
        self.n_rot = field(r, p + "rope.dimension_count", self.head_dim)
        self.window = field(r, p + "attention.sliding_window", 0) or 0
        self.swa_pattern = field(r, p + "attention.sliding_window_pattern", 6)
        # 27B (62 layers) scales by n_embd/n_head, every other size by head_dim
        qscale_dim = self.n_embd // self.n_head if self.n_layer == 62 else self.head_dim
        self.q_scale = np.float32(1.0 / np.sqrt(qscale_dim))
        self.bos = field(r, "tokenizer.ggml.bos_token_id", 2)
        self.eos = field(r, "tokenizer.ggml.eos_token_id", 1)
        self.reader = r
        self.t = {t.name: t for t in r.tensors}
        self.tok_embd = self.weight("token_embd.weight")  # (n_vocab, n_embd)
        self.out_w = (self.weight("output.weight") if "output.weight" in self.t
                      else self.tok_embd)
        self.out_norm = self.weight("output_norm.weight")
        self.layers = [self.load_layer(il) for il in range(self.n_layer)]
        self.vocab = None

    def weight(self, name):
        t = self.t.get(name)
        if t is None:
            raise SystemExit(f"tensor {name} missing from the GGUF")
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        # numpy shape is the reverse of ggml's ne: (ne1, ne0) = (out, in)
        return w.reshape([int(n) for n in reversed(t.shape)])

    def load_layer(self, il):
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                 "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down", "post_ffw_norm"]
        L = {n: self.weight(f"blk.{il}.{n}.weight") for n in names}
        L["local"] = self.window > 0 and il % self.swa_pattern < self.swa_pattern - 1
        return L


# ----------------------------------------------------------------- the math

def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis; sum of squares in float64."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    scale = (1.0 / np.sqrt(ms.astype(np.float32) + eps)).astype(np.float32)
    return (x * scale) * w


def rope_neox(x, pos, n_rot, base, freq_scale):
    """x: (T, H, D) float32. Rotates pairs (i, i + n_rot/2) by pos * base^(-2i/n_rot)."""
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    theta = pos[:, None].astype(np.float64) * freq_scale * inv[None, :]  # (T, half)
    cos = np.cos(theta).astype(np.float32)[:, None, :]
    sin = np.sin(theta).astype(np.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:n_rot] = a * sin + b * cos
    return out


def gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))).astype(np.float32)


def attention(q, k, v, window):
    """q (T, H, D) already scaled, k/v (T, Hkv, D); causal, optional sliding window."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    group = H // Hkv
    p = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    allowed = j <= p
    if window > 0:
        allowed &= (p - j) < window
    out = np.empty((T, H, v.shape[2]), dtype=np.float32)
    for h in range(H):
        g = h // group
        s = q[:, h, :] @ k[:, g, :].T  # (T, T)
        s = np.where(allowed, s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        prob = e / e.sum(axis=1, keepdims=True)
        out[:, h, :] = prob @ v[:, g, :]
    return out


def forward(m, ids, all_logits=True):
    """Logits (T, n_vocab) for every position, or (1, n_vocab) for the last one."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    pos = np.arange(T)
    x = m.tok_embd[ids] * np.float32(np.sqrt(m.n_embd))
    for L in m.layers:
        h = rmsnorm(x, L["attn_norm"], m.eps)
        q = (h @ L["attn_q"].T).reshape(T, m.n_head, m.head_dim)
        k = (h @ L["attn_k"].T).reshape(T, m.n_head_kv, m.head_dim)
        v = (h @ L["attn_v"].T).reshape(T, m.n_head_kv, m.v_dim)
        q = rmsnorm(q, L["attn_q_norm"], m.eps)
        k = rmsnorm(k, L["attn_k_norm"], m.eps)
        if L["local"]:
            base, fs, window = m.base_local, 1.0, m.window
        else:
            base, fs, window = m.base_global, m.freq_scale_global, 0
        q = rope_neox(q, pos, m.n_rot, base, fs) * m.q_scale
        k = rope_neox(k, pos, m.n_rot, base, fs)
        if getattr(m, "kv_f16", False):  # K/V as an f16 cache stores them (llama.cpp's default)
            k = k.astype(np.float16).astype(np.float32)
            v = v.astype(np.float16).astype(np.float32)
        a = attention(q, k, v, window).reshape(T, m.n_head * m.v_dim)
        o = rmsnorm(a @ L["attn_output"].T, L["post_attention_norm"], m.eps)
        x = x + o
        h2 = rmsnorm(x, L["ffn_norm"], m.eps)
        f = (gelu_tanh(h2 @ L["ffn_gate"].T) * (h2 @ L["ffn_up"].T)) @ L["ffn_down"].T
        x = x + rmsnorm(f, L["post_ffw_norm"], m.eps)
    y = rmsnorm(x if all_logits else x[-1:], m.out_norm, m.eps)
    return (y @ m.out_w.T).astype(np.float32)


# --------------------------------------------------- tokenizer (sanity only)

class Vocab:
    """SentencePiece-style merge over the GGUF vocabulary (fact sheet 6.3), without
    special-token parsing: enough to feed plain English prompts."""

    def __init__(self, reader):
        self.tokens = string_array(reader, "tokenizer.ggml.tokens")
        self.scores = scalar_array(reader, "tokenizer.ggml.scores")
        self.types = scalar_array(reader, "tokenizer.ggml.token_type")
        self.index = {}
        for i, t in enumerate(self.tokens):
            self.index.setdefault(t, i)

    def encode(self, text):
        text = text.replace(" ", "\u2581")
        sym = list(text)
        heap = []

        def push(i):
            if i + 1 < len(sym) and sym[i] is not None:
                j = nxt[i]
                if j < len(sym):
                    t = self.index.get(sym[i] + sym[j])
                    if t is not None:
                        heapq.heappush(heap, (-self.scores[t], i, sym[i] + sym[j]))

        nxt = list(range(1, len(sym) + 1))
        prv = list(range(-1, len(sym) - 1))
        for i in range(len(sym) - 1):
            push(i)
        while heap:
            _, i, merged = heapq.heappop(heap)
            j = nxt[i] if i < len(sym) else len(sym)
            if sym[i] is None or j >= len(sym) or sym[j] is None or sym[i] + sym[j] != merged:
                continue
            sym[i] = merged
            sym[j] = None
            nxt[i] = nxt[j]
            if nxt[j] < len(sym):
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        ids = []
        for s in sym:
            if s is None:
                continue
            if s in self.index:
                ids.append(self.index[s])
            else:
                ids.extend(self.index[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t, ty = self.tokens[i], self.types[i]
            if ty == 6 and t.startswith("<0x"):
                out.append(int(t[3:5], 16))
            elif ty in (1, 4):
                out += t.replace("\u2581", " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------- CLI

def parse_ids(text):
    return [int(s) for s in text.replace("\n", ",").replace(" ", ",").split(",") if s.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Gemma 3 GGUF file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids (include BOS = 2 yourself)")
    src.add_argument("--ids-file", help="file of token ids, comma/space/newline separated")
    src.add_argument("--prompt", help="plain text; BOS is prepended")
    ap.add_argument("--out", help="write logits of every position, float32 .npy [n_pos][n_vocab]")
    ap.add_argument("--gen", type=int, default=0, help="greedy-generate N tokens and print them")
    a = ap.parse_args(argv)

    t0 = time.time()
    m = Model(a.model)
    vocab = None
    if a.prompt is not None:
        vocab = Vocab(m.reader)
        ids = [m.bos] + vocab.encode(a.prompt)
    elif a.ids_file:
        with open(a.ids_file) as f:
            ids = parse_ids(f.read())
    else:
        ids = parse_ids(a.ids)
    n_vocab = m.out_w.shape[0]
    bad = [i for i in ids if not 0 <= i < n_vocab]
    if not ids or bad:
        raise SystemExit(f"ids must be 1+ integers in [0, {n_vocab}); bad: {bad[:5]}")
    print(f"loaded {a.model} in {time.time() - t0:.1f}s; {len(ids)} prompt ids", file=sys.stderr)

    if a.out:
        t1 = time.time()
        logits = forward(m, ids, all_logits=True)
        np.save(a.out, logits)
        print(f"forward of {len(ids)} positions: {time.time() - t1:.1f}s -> {a.out} "
              f"{logits.shape}", file=sys.stderr)
    if a.gen > 0:
        seq = list(ids)
        for _ in range(a.gen):
            nxt = int(np.argmax(forward(m, seq, all_logits=False)[0]))
            seq.append(nxt)
            if nxt == m.eos:
                break
        new = seq[len(ids):]
        print(",".join(str(i) for i in new))
        if vocab is None:
            vocab = Vocab(m.reader)
        print(repr(vocab.decode(ids)) + " -> " + repr(vocab.decode(new)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
