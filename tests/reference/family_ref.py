#!/usr/bin/env python3
"""Independent numpy reference of every decoder family dray runs (llama, qwen2,
qwen3, phi3, gemma2, gemma3, olmo2, granite, smollm3), for checking dray.

Reads a GGUF with the PyPI `gguf` package and runs one sequence in float32 (norm
sums of squares in float64), without a KV cache, written from the published
architectures and llama.cpp's graphs (src/models/<family>.cpp, ggml's rope), not
from dray's C code. It is the check: it shares no code with the engine.

Common skeleton, per layer (rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w):

    h = rmsnorm(x, attn_norm)                 olmo2: h = x (no input norms)
    q, k, v = Wq h, Wk h, Wv h                qwen2: + biases; phi3: one attn_qkv
                                              matrix, rows Q then K then V
    qwen3, gemma3: q, k = rmsnorm per head (attn_q_norm / attn_k_norm, head_dim)
    olmo2:         q, k = rmsnorm over the whole q (n_head*hd) / k (n_kv*hd) vector
    q, k = rope(q), rope(k)                   smollm3: none where (il+1) % 4 == 0
    s = scale * q.k                           scale 1/sqrt(head_dim); granite:
                                              attention.scale; gemma 27B: n_embd/n_head
    gemma2: s = 50 tanh(s / 50)
    a = softmax(s, causal [, sliding window]) v     GQA: head h reads kv h // group
    o = Wo a                                  gemma2/3, olmo2: o = rmsnorm(o, post_attention_norm)
                                              granite: o *= residual_scale
    x = x + o
    h2 = rmsnorm(x, ffn_norm)                 olmo2: h2 = x
    f = Wdown (act(Wgate h2) * Wup h2)        act silu; gemma: gelu (tanh form);
                                              phi3: one ffn_up, rows gate then up
    gemma2/3, olmo2: f = rmsnorm(f, post_ffw_norm); granite: f *= residual_scale
    x = x + f
  logits = out rmsnorm(x, output_norm)        out = output.weight or token_embd
  x0 = token_embd[ids] (gemma: * sqrt(n_embd), granite: * embedding_scale);
  granite: logits / logit_scale; gemma2: 30 tanh(logits / 30).

Sliding windows: gemma2 layer il is local when il % 2 == 0 (pattern 2), gemma3
when il % 6 < 5; key attention.sliding_window_pattern overrides; a local layer
attends to positions p - j < window. gemma3's local layers use base 10000 and no
RoPE scaling (olmo2 with a window, i.e. OLMo 3: pattern 4, local layers unscaled).

RoPE, as ggml computes it (ggml-cpu ops.cpp rope_yarn, ggml_rope_yarn_corr_dims),
pair i of n_rot/2: theta_extrap = pos * base^(-2i/n_rot) / ff_i (ff: rope_freqs,
or rope_factors_long when the context n_ctx > rope.scaling.original_context_length
else rope_factors_short; llama, granite and phi3 graphs pass them),
theta_interp = freq_scale * theta_extrap (freq_scale = 1 / rope.scaling.factor,
1 for type "none"). YaRN (type "yarn", ext_factor 1): ramp_i = 1 - clamp((i - lo) /
max(0.001, hi - lo), 0, 1) with [lo, hi] the corr dims of beta_fast 32 / beta_slow 1
over rope.scaling.original_context_length, theta = interp (1 - ramp) + extrap ramp,
and cos/sin times mscale = (1 + 0.1 ln(factor)) * attn_factor. Otherwise cos/sin
times attn_factor (rope.scaling.attn_factor, LongRoPE's magnitude). Pairs are
llama.cpp's "NORM" mode (adjacent (2i, 2i+1): how llama, granite and smollm3
files store Q/K rows) or "NEOX" (rotate-half (i, i + n_rot/2): qwen2, qwen3,
phi3, gemma2, gemma3, olmo2).

kv_f16: K (after RoPE) and V rounded to f16, as an f16 KV cache stores them.

  family_ref.py --model M.gguf --ids 1,2,3 [--out logits.npy] [--gen N] [--ctx N] [--kv-f16]
"""
import argparse
import math
import sys

import numpy as np

try:
    import gguf
    import gguf.gguf_reader as _gguf_reader
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("family_ref.py: needs the `gguf` package (pip install gguf numpy)")

from refcommon import field  # noqa: E402

FAMILIES = ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "granite", "smollm3"]
NEOX = {"qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2"}  # rotate-half pairs
FREQ_FACTORS = {"llama", "granite", "phi3"}  # graphs that pass rope_freqs / LongRoPE factors
BETA_FAST, BETA_SLOW = 32.0, 1.0


class _NoMemmap:
    """numpy, except that memmap reads the whole file: GGUFReader walks a 49152-token
    vocabulary element by element, and memmap slicing makes that twice as slow."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def memmap(path, mode="r"):
        return np.fromfile(path, dtype=np.uint8)


def open_gguf(path):
    """gguf.GGUFReader of path, read into memory (faster on small files)."""
    saved = _gguf_reader.np
    _gguf_reader.np = _NoMemmap()
    try:
        return gguf.GGUFReader(path)
    finally:
        _gguf_reader.np = saved


def yarn_corr_dims(n_dims, n_ctx_orig, base):
    def corr(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr(BETA_FAST))), min(n_dims - 1.0, math.ceil(corr(BETA_SLOW)))


class Model:
    def __init__(self, path, n_ctx=None):
        """n_ctx: the context the engine runs with (picks LongRoPE's long or short
        factors, as llama.cpp's n_ctx_seq does); default the training context. It
        may be changed between forward passes."""
        r = open_gguf(path)
        self.arch = arch = field(r, "general.architecture")
        if arch not in FAMILIES:
            raise SystemExit(f"{path}: general.architecture {arch!r} is not one of {FAMILIES}")
        p = arch + "."
        self.n_embd = field(r, p + "embedding_length")
        self.n_layer = field(r, p + "block_count")
        self.n_ff = field(r, p + "feed_forward_length")
        self.n_head = field(r, p + "attention.head_count")
        self.n_head_kv = field(r, p + "attention.head_count_kv", self.n_head)
        self.head_dim = field(r, p + "attention.key_length", self.n_embd // self.n_head)
        self.v_dim = field(r, p + "attention.value_length", self.head_dim)
        self.n_rot = field(r, p + "rope.dimension_count", self.head_dim)
        self.eps = np.float32(field(r, p + "attention.layer_norm_rms_epsilon"))
        self.base = field(r, p + "rope.freq_base", 10000.0)
        self.n_ctx_train = field(r, p + "context_length")
        self.n_ctx = n_ctx or self.n_ctx_train
        self.n_ctx_orig = field(r, p + "rope.scaling.original_context_length", self.n_ctx_train)
        scaling = field(r, p + "rope.scaling.type", "linear")
        factor = field(r, p + "rope.scaling.factor", 0.0) or 0.0
        self.freq_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
        self.ext_factor = 1.0 if scaling == "yarn" else 0.0
        # llama.cpp (llama-context.cpp) hands ggml attn_factor; ggml multiplies it by
        # 1 + 0.1 ln(1/freq_scale) under YaRN, which llama.cpp first divides out again
        # unless the factor is <= 1: net (1 + 0.1 ln factor) * rope.scaling.attn_factor
        attn = 1.0
        if self.ext_factor != 0.0:
            f = 1.0 / self.freq_scale
            attn = (1.0 + 0.1 * math.log(f) if f > 1.0 else 1.0) / (1.0 + 0.1 * math.log(f))
        self.attn_factor = attn * field(r, p + "rope.scaling.attn_factor", 1.0)
        self.window = field(r, p + "attention.sliding_window", 0) or 0
        self.swa_pattern = field(r, p + "attention.sliding_window_pattern",
                                 {"gemma2": 2, "gemma3": 6, "olmo2": 4}.get(arch, 0))
        self.attn_softcap = field(r, p + "attn_logit_softcapping", 50.0) if arch == "gemma2" else 0.0
        self.final_softcap = field(r, p + "final_logit_softcapping",
                                   30.0 if arch == "gemma2" else 0.0) if arch.startswith("gemma") else 0.0
        self.embd_scale = np.float32(math.sqrt(self.n_embd)) if arch.startswith("gemma") else None
        if arch == "granite":
            self.embd_scale = np.float32(field(r, p + "embedding_scale", 0.0) or 1.0)
            self.residual_scale = field(r, p + "residual_scale", 0.0) or None
            self.logit_scale = field(r, p + "logit_scale")
        scale = (field(r, p + "attention.scale", 0.0) or 0.0) if arch == "granite" else 0.0
        if not scale:
            big = (arch == "gemma2" and self.n_layer == 46) or (arch == "gemma3" and self.n_layer == 62)
            scale = 1.0 / math.sqrt(self.n_embd // self.n_head if big else self.head_dim)
        self.kq_scale = np.float32(scale)
        self.eos = field(r, "tokenizer.ggml.eos_token_id", 2)
        self.t = {t.name: t for t in r.tensors}
        self.tok_embd = self.weight("token_embd.weight")
        self.out_w = self.weight("output.weight", False)
        if self.out_w is None:
            self.out_w = self.tok_embd
        self.out_norm = self.weight("output_norm.weight")
        self.factors = {}  # the graphs of the other families pass no factors
        if arch in FREQ_FACTORS:
            for n in ("rope_freqs", "rope_factors_long", "rope_factors_short"):
                self.factors[n] = self.weight(n + ".weight", False)
        self.kv_f16 = False
        self.layers = [self.load_layer(il) for il in range(self.n_layer)]
        del self.t

    def freq_factors(self):
        """rope_freqs, else LongRoPE's long factors when the context exceeds the
        original one, else its short ones (llama.cpp's get_rope_factors), or None."""
        f = self.factors
        if f.get("rope_freqs") is not None:
            return f["rope_freqs"]
        return f.get("rope_factors_long" if self.n_ctx > self.n_ctx_orig else "rope_factors_short")

    def weight(self, name, required=True):
        t = self.t.get(name)
        if t is None:
            if required:
                raise SystemExit(f"tensor {name} missing from the GGUF")
            return None
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        return w.reshape([int(n) for n in reversed(t.shape)])  # (out, in)

    def load_layer(self, il):
        a = self.arch
        names = ["attn_output", "ffn_up", "ffn_down"]
        names += ["attn_qkv"] if a == "phi3" else ["attn_q", "attn_k", "attn_v"]
        if a != "phi3":
            names.append("ffn_gate")
        if a != "olmo2":
            names += ["attn_norm", "ffn_norm"]
        if a in ("gemma2", "gemma3", "olmo2"):
            names += ["post_attention_norm", "post_ffw_norm"]
        if a in ("qwen3", "gemma3", "olmo2"):
            names += ["attn_q_norm", "attn_k_norm"]
        L = {n: self.weight(f"blk.{il}.{n}.weight") for n in names}
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            L[n + ".bias"] = self.weight(f"blk.{il}.{n}.bias", False)
        L["local"] = (self.window > 0 and self.swa_pattern > 0
                      and il % self.swa_pattern < self.swa_pattern - 1)
        L["rope"] = not (a == "smollm3" and (il + 1) % 4 == 0)
        return L


# ----------------------------------------------------------------- the math

def rmsnorm(x, w, eps):
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    scale = (1.0 / np.sqrt(ms.astype(np.float32) + eps)).astype(np.float32)
    return (x * scale) * w


def rope(x, pos, n_rot, base, neox, freq_scale=1.0, factors=None, ext_factor=0.0,
         corr_dims=(0.0, 0.0), attn_factor=1.0):
    """x: (T, H, D). Turns n_rot/2 pairs of each head as ggml's rope_yarn does."""
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    extrap = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_rot)[None, :]
    if factors is not None:
        extrap = extrap / factors.astype(np.float64)[None, :half]
    theta = freq_scale * extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        lo, hi = corr_dims
        ramp = (1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)) * ext_factor
        theta = theta * (1.0 - ramp) + extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    cos = (np.cos(theta) * mscale).astype(np.float32)[:, None, :]
    sin = (np.sin(theta) * mscale).astype(np.float32)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def silu(x):
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def gelu_tanh(x):
    c = np.float32(math.sqrt(2.0 / math.pi))
    return (0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))).astype(np.float32)


def attention(q, k, v, scale, window=0, softcap=0.0):
    """q (T, H, D), k (T, Hkv, D), v (T, Hkv, Dv): softmax(scale q.k [capped]) v,
    causal, optionally only the last `window` positions."""
    T, H, _ = q.shape
    group = H // k.shape[1]
    p, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= p
    if window > 0:
        allowed &= (p - j) < window
    out = np.empty((T, H, v.shape[2]), dtype=np.float32)
    for h in range(H):
        g = h // group
        s = (q[:, h, :] * scale) @ k[:, g, :].T
        if softcap:
            s = np.tanh(s / np.float32(softcap)) * np.float32(softcap)
        s = np.where(allowed, s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h, :] = (e / e.sum(axis=1, keepdims=True)) @ v[:, g, :]
    return out


def linear(x, w, b=None):
    y = x @ w.T
    return y + b if b is not None else y


def forward(m, ids, all_logits=True):
    """Logits (T, n_vocab) of every position, or (1, n_vocab) of the last."""
    a = m.arch
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    pos = np.arange(T)
    nq, nkv = m.n_head * m.head_dim, m.n_head_kv * m.head_dim
    corr = yarn_corr_dims(m.n_rot, m.n_ctx_orig, m.base)
    x = m.tok_embd[ids].copy()
    if m.embd_scale is not None:
        x = x * m.embd_scale
    for L in m.layers:
        h = x if a == "olmo2" else rmsnorm(x, L["attn_norm"], m.eps)
        if a == "phi3":
            qkv = h @ L["attn_qkv"].T
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        else:
            q = linear(h, L["attn_q"], L["attn_q.bias"])
            k = linear(h, L["attn_k"], L["attn_k.bias"])
            v = linear(h, L["attn_v"], L["attn_v.bias"])
        if a == "olmo2":
            q, k = rmsnorm(q, L["attn_q_norm"], m.eps), rmsnorm(k, L["attn_k_norm"], m.eps)
        q = q.reshape(T, m.n_head, m.head_dim)
        k = k.reshape(T, m.n_head_kv, m.head_dim)
        v = v.reshape(T, m.n_head_kv, m.v_dim)
        if a in ("qwen3", "gemma3"):
            q, k = rmsnorm(q, L["attn_q_norm"], m.eps), rmsnorm(k, L["attn_k_norm"], m.eps)
        if L["rope"]:
            if a == "gemma3" and L["local"]:
                kw = dict(base=10000.0)  # llama.cpp: rope_freq_base_train_swa, no scaling
            elif a == "olmo2" and L["local"]:  # OLMo 3's local layers: no scaling
                kw = dict(base=m.base)
            else:
                kw = dict(base=m.base, freq_scale=m.freq_scale, factors=m.freq_factors(),
                          ext_factor=m.ext_factor, corr_dims=corr, attn_factor=m.attn_factor)
            q = rope(q, pos, m.n_rot, neox=a in NEOX, **kw)
            k = rope(k, pos, m.n_rot, neox=a in NEOX, **kw)
        if m.kv_f16:
            k = k.astype(np.float16).astype(np.float32)
            v = v.astype(np.float16).astype(np.float32)
        att = attention(q, k, v, m.kq_scale, m.window if L["local"] else 0, m.attn_softcap)
        o = linear(att.reshape(T, m.n_head * m.v_dim), L["attn_output"], L["attn_output.bias"])
        if "post_attention_norm" in L:
            o = rmsnorm(o, L["post_attention_norm"], m.eps)
        if a == "granite" and m.residual_scale:
            o = o * np.float32(m.residual_scale)
        x = x + o
        h2 = x if a == "olmo2" else rmsnorm(x, L["ffn_norm"], m.eps)
        if a == "phi3":
            up = h2 @ L["ffn_up"].T
            g, u = up[:, :m.n_ff], up[:, m.n_ff:]
        else:
            g, u = h2 @ L["ffn_gate"].T, h2 @ L["ffn_up"].T
        act = gelu_tanh(g) if a.startswith("gemma") else silu(g)
        f = (act * u) @ L["ffn_down"].T
        if "post_ffw_norm" in L:
            f = rmsnorm(f, L["post_ffw_norm"], m.eps)
        if a == "granite" and m.residual_scale:
            f = f * np.float32(m.residual_scale)
        x = x + f
    y = rmsnorm(x if all_logits else x[-1:], m.out_norm, m.eps)
    logits = y @ m.out_w.T
    if a == "granite":
        logits = logits / np.float32(m.logit_scale)
    if m.final_softcap:
        logits = np.tanh(logits / np.float32(m.final_softcap)) * np.float32(m.final_softcap)
    return logits.astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 logits [n_pos][n_vocab] as .npy")
    ap.add_argument("--gen", type=int, default=0, help="greedy tokens to print")
    ap.add_argument("--ctx", type=int, default=0, help="the engine's context (LongRoPE factors)")
    ap.add_argument("--kv-f16", action="store_true", help="round K/V to f16 as an f16 cache does")
    a = ap.parse_args(argv)
    m = Model(a.model, a.ctx or None)
    m.kv_f16 = a.kv_f16
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
