#!/usr/bin/env python3
"""Writes a GGUF of a real model's shape with random Q4_K_M-style blocks, for
benchmarks at the sizes people run (bench/scale.sh). No quantization runs: the
blocks are written directly, random codes under fixed scales.

  write_quantized.py OUT.gguf [--shape 8b|1b|tiny] [--seed 1] [--verify]
                     [--tokenizer .models/smollm2-135m-instruct-q4_1.gguf]

Shapes (llama architecture, untied output head, RoPE base 500000):
  8b    Llama-3.1-8B: 32 layers, width 4096, FFN 14336, 32/8 heads of 128
  1b    Llama-3.2-1B: 16 layers, width 2048, FFN 8192, 32/8 heads of 64
  tiny  2 layers, width 256, FFN 768, 4/2 heads of 64 (for tests of the script)
The vocabulary is the tokenizer's (SmolLM2's: 49152), copied with its types.

Types as llama.cpp's Q4_K_M picks them: Q4_K everywhere, Q6_K for the output
head and for attn_v and ffn_down in the layers use_more_bits() names (the first
and last eighth and every third in between: half of them); f32 norms of ones.

Values: every weight is d*s*q - dmin*m with uniform random codes q; the
sub-scales s and mins m are one constant per tensor and d, dmin are chosen so
that the weights have mean ~0 and standard deviation 1/sqrt(fan_in), as a
trained matrix has in magnitude. The sub-scale is picked so d stays a normal
f16 (>= ~2e-4) at every fan-in.

Streams: tensor infos first, then each tensor's data drawn and written in turn,
so at most one tensor (the head: ~165 MB at 8b) is in memory.
"""
import argparse
import os
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("write_quantized.py: needs the `gguf` package (.venv: ci/setup.sh)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from write_family import copy_tokenizer  # noqa: E402  (the tokenizer keys, with their types)

SHAPES = {  # layers, width, ffn, heads, kv heads, head dim, training context
    "8b": dict(layers=32, embd=4096, ff=14336, heads=32, kv=8, hd=128, ctx=131072),
    "1b": dict(layers=16, embd=2048, ff=8192, heads=32, kv=8, hd=64, ctx=131072),
    "tiny": dict(layers=2, embd=256, ff=768, heads=4, kv=2, hd=64, ctx=4096),
}
Q = gguf.GGMLQuantizationType
QK = 256  # weights per super-block (Q4_K, Q6_K)
BLOCK_BYTES = {Q.Q4_K: 144, Q.Q6_K: 210}
D_FLOOR = 2e-4  # smallest super-scale aimed for: well inside f16's normal range


def use_more_bits(i, n):
    """llama.cpp's rule (llama-quant.cpp) for the layers Q4_K_M gives Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4k_header(fan_in):
    """The first 16 bytes of every Q4_K block: d, dmin (f16) and 12 bytes of
    packed 6-bit sub-scales and mins. Codes 0..15 have mean 7.5, sd 4.61."""
    sigma, sd, mean = fan_in ** -0.5, ((16 ** 2 - 1) / 12) ** 0.5, 7.5
    s = int(min(63, max(1, round(sigma / (sd * D_FLOOR)))))
    d = sigma / (s * sd)
    dmin = d * mean  # with m = s: d*s*q - dmin*s = d*s*(q - 7.5)
    # get_scale_min_k4's packing, all 8 sub-blocks alike (scale s, min s)
    lo, hi = s & 63, s >> 4
    scales = [lo | (hi << 6)] * 4 + [lo | (hi << 6)] * 4 + [(s & 15) | ((s & 15) << 4)] * 4
    head = np.frombuffer(np.array([d, dmin], dtype=np.float16).tobytes() + bytes(scales), dtype=np.uint8)
    return head, (0, 16), (16, 144)


def q6k_header(fan_in):
    """Q6_K's non-code bytes: 16 int8 sub-scales at 192 and d (f16) at 208.
    Codes 0..63 count from 32: mean -0.5, sd 18.47."""
    sigma, sd = fan_in ** -0.5, ((64 ** 2 - 1) / 12) ** 0.5
    s = int(min(127, max(1, round(sigma / (sd * D_FLOOR)))))
    d = sigma / (s * sd)
    head = np.frombuffer(bytes([s] * 16) + np.array([d], dtype=np.float16).tobytes(), dtype=np.uint8)
    return head, (192, 210), (0, 192)


def vary_scales(rng, qtype, b, head):
    """Every block its own sub-scales (and mins) around the fixed ones, so that
    a reader mixing them up (scale for min, one half-group's for another's)
    gives other weights: for tests. Q4_K: s and n in [s0/2, s0], packed as
    get_scale_min_k4 reads them; Q6_K: |sc| in [s0/2, s0] with random signs."""
    nb = b.shape[0]
    if qtype == Q.Q4_K:
        s0 = int(head[4]) & 63
        s = rng.integers(max(1, s0 // 2), s0 + 1, size=(nb, 8))
        n = rng.integers(max(1, s0 // 2), s0 + 1, size=(nb, 8))
        b[:, 4:8] = (s[:, :4] & 63) | ((s[:, 4:] >> 4) << 6)
        b[:, 8:12] = (n[:, :4] & 63) | ((n[:, 4:] >> 4) << 6)
        b[:, 12:16] = (s[:, 4:] & 15) | ((n[:, 4:] & 15) << 4)
    else:
        s0 = int(head[0])
        sc = rng.integers(max(1, s0 // 2), s0 + 1, size=(nb, 16)) * rng.choice([-1, 1], size=(nb, 16))
        b[:, 192:208] = sc.astype(np.int8).view(np.uint8)


def random_blocks(rng, qtype, rows, k, varied=False):
    """rows x k weights of qtype as raw bytes, shape (rows, bytes per row)."""
    nb = rows * k // QK
    head, (h0, h1), _ = (q4k_header if qtype == Q.Q4_K else q6k_header)(k)
    b = rng.integers(0, 256, size=(nb, BLOCK_BYTES[qtype]), dtype=np.uint8)  # codes (and filler)
    b[:, h0:h1] = head
    if varied:
        vary_scales(rng, qtype, b, head)
    return b.reshape(rows, k // QK * BLOCK_BYTES[qtype])


def plan(shape, vocab):
    """(name, qtype or None for f32 ones, rows, k) of every tensor, file order."""
    c = shape
    d, q_out, kv_out = c["embd"], c["heads"] * c["hd"], c["kv"] * c["hd"]
    t = [("token_embd.weight", Q.Q4_K, vocab, d), ("output_norm.weight", None, 1, d),
         ("output.weight", Q.Q6_K, vocab, d)]
    for i in range(c["layers"]):
        b, more = f"blk.{i}.", Q.Q6_K if use_more_bits(i, c["layers"]) else Q.Q4_K
        t += [(b + "attn_norm.weight", None, 1, d), (b + "attn_q.weight", Q.Q4_K, q_out, d),
              (b + "attn_k.weight", Q.Q4_K, kv_out, d), (b + "attn_v.weight", more, kv_out, d),
              (b + "attn_output.weight", Q.Q4_K, d, q_out), (b + "ffn_norm.weight", None, 1, d),
              (b + "ffn_gate.weight", Q.Q4_K, c["ff"], d), (b + "ffn_up.weight", Q.Q4_K, c["ff"], d),
              (b + "ffn_down.weight", more, d, c["ff"])]
    return t


def add_metadata(w, shape, name, tokenizer):
    """The llama keys of the shape and the tokenizer's; returns the vocabulary size."""
    c, p = shape, "llama."
    w.add_name(name)
    w.add_uint32(p + "block_count", c["layers"])
    w.add_uint32(p + "embedding_length", c["embd"])
    w.add_uint32(p + "feed_forward_length", c["ff"])
    w.add_uint32(p + "attention.head_count", c["heads"])
    w.add_uint32(p + "attention.head_count_kv", c["kv"])
    w.add_uint32(p + "attention.key_length", c["hd"])
    w.add_uint32(p + "attention.value_length", c["hd"])
    w.add_uint32(p + "rope.dimension_count", c["hd"])
    w.add_uint32(p + "context_length", c["ctx"])
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(p + "rope.freq_base", 500000.0)
    w.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_quantization_version(2)
    vocab = copy_tokenizer(w, tokenizer)
    w.add_uint32(p + "vocab_size", vocab)
    return vocab


def write(out, shape_name, seed, tokenizer, varied=False):
    """Writes the file; returns (tensors, bytes of tensor data)."""
    shape, rng = SHAPES[shape_name], np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, "llama")
    vocab = add_metadata(w, shape, f"random Q4_K_M, Llama {shape_name} shape", tokenizer)
    tensors = plan(shape, vocab)
    for name, qt, rows, k in tensors:  # infos first: the data follows in this order
        if qt is None:
            w.add_tensor_info(name, (k,), np.dtype(np.float32), 4 * k)
        else:
            nbytes = rows * k // QK * BLOCK_BYTES[qt]
            w.add_tensor_info(name, (rows, k // QK * BLOCK_BYTES[qt]), np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, qt, rows, k in tensors:
        data = np.ones(k, dtype=np.float32) if qt is None else random_blocks(rng, qt, rows, k, varied)
        w.write_tensor_data(data)
        total += data.nbytes
    w.close()
    return len(tensors), total


def verify(path):
    """Dequantizes the first rows of one tensor of each type (gguf's numpy
    reference) and prints mean and sd * sqrt(fan_in), which should be ~0 and ~1."""
    r, seen = gguf.GGUFReader(path), set()
    for t in r.tensors:
        if t.tensor_type in seen or t.tensor_type not in (Q.Q4_K, Q.Q6_K):
            continue
        seen.add(t.tensor_type)
        k = int(t.shape[0])
        x = gguf.quants.dequantize(np.asarray(t.data[:64]), t.tensor_type)
        print(f"{t.name} {t.tensor_type.name}: mean {x.mean():+.5f}, sd*sqrt(fan_in) {x.std() * k ** 0.5:.3f}")
        if abs(x.std() * k ** 0.5 - 1) > 0.05:
            sys.exit(f"write_quantized.py: {t.name} has the wrong magnitude")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", default=".models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--verify", action="store_true", help="read back and check the weights' magnitude")
    ap.add_argument("--varied-scales", action="store_true",
                    help="every block its own sub-scales and mins (for tests of a reader)")
    a = ap.parse_args()
    t0 = time.time()
    n, total = write(a.out, a.shape, a.seed, a.tokenizer, a.varied_scales)
    print(f"{a.out}: {a.shape} shape, {n} tensors, {total / 2**20:.0f} MiB of tensor data "
          f"in {time.time() - t0:.1f} s", file=sys.stderr)
    if a.verify:
        verify(a.out)


if __name__ == "__main__":
    main()
