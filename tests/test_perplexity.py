"""dray perplexity against numpy on a tiny random model, and the .kld format both ways.

numpy recomputes everything from logits that `dray run --dump-logits` gives for the
same chunks (BOS first, the same precision): the perplexity, the base file dray
writes (header, tokens, every row's scale/offset/words), and the KL statistics
dray prints when it compares an int8 run with that base. A base written here by
numpy (llama.cpp's layout, coded independently from the description in
tools/kld.h) must read back in dray with the same numbers.

usage: test_perplexity.py --dray DRAY --writer WRITE_TINY_GEMMA
"""
import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

N_CTX = 32
N_CHUNK = 3
BOS = 2
FLOOR = 16.0  # log-probs below max - 16 are stored as 0 and left out of KL

TEXT = (
    "hello world, the world is an earth and the sea. 42 is the answer!\n"
    "Then the tide turned: waves at 3.5 m, wind 20 km/h; sailors ran home.\n"
    "def f(x): return x * x  # squares\n"
    "La mer est calme, the hello and the world again and again?\n"
) * 4  # several contexts' worth of bytes: the whole file is tokenized at once


def sh(args, expect=0):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {p.returncode} (want {expect})\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def encode_row(logits):
    """One .kld row (uint16 words) from f32 logits, from the format description."""
    x = logits.astype(np.float32)
    mx = np.float32(x.max())
    lo = np.float32(max(x.min(), mx - np.float32(FLOOR)))
    lse = float(mx) + np.log(np.exp(x.astype(np.float64) - float(mx)).sum())
    scale = np.float32((mx - lo) / np.float32(65535.0))
    q = np.zeros(len(x) + len(x) % 2, dtype=np.uint16)
    if scale > 0:
        v = np.rint(np.float32(1.0) / scale * (x - lo))
        q[: len(x)] = np.where(x > lo, np.clip(v, 0, 65535), 0).astype(np.uint16)
    head = np.frombuffer(struct.pack("<ff", scale, np.float32(lo - lse)), dtype=np.uint16)
    return np.concatenate([head, q])


def decode_rows(rows, n_vocab):
    head = rows[:, :4].copy().view(np.float32)
    return head[:, 0:1].astype(np.float64) * rows[:, 4 : 4 + n_vocab] + head[:, 1:2]


def read_kld(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"_logits_", "magic"
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", data[8:20])
    off = 20 + 4 * n_ctx * n_chunk
    tokens = np.frombuffer(data[20:off], dtype=np.int32)
    words = 2 * ((n_vocab + 1) // 2) + 4
    rows = np.frombuffer(data[off:], dtype=np.uint16).reshape(-1, words)
    assert rows.shape[0] == n_chunk * (n_ctx - 1 - n_ctx // 2), "row count"
    return n_ctx, n_vocab, n_chunk, tokens, rows


def write_kld(path, tokens, rows, n_vocab):
    with open(path, "wb") as f:
        f.write(b"_logits_" + struct.pack("<iii", N_CTX, n_vocab, N_CHUNK))
        f.write(np.asarray(tokens, dtype=np.int32).tobytes())
        f.write(np.asarray(rows, dtype=np.uint16).tobytes())


def chunk_logits(dray, model, tokens, precision, kv, tmp, n_vocab):
    """Logits [N_CHUNK][N_CTX][n_vocab] of each chunk evaluated as dray perplexity does."""
    out = []
    for c in range(N_CHUNK):
        ids = list(tokens[c * N_CTX : (c + 1) * N_CTX])
        ids[0] = BOS
        path = os.path.join(tmp, f"logits_{precision}_{c}.bin")
        sh([dray, "run", "-q", "-m", model, "--precision", precision, "--kv-dtype", kv,
            "--prompt-ids", ",".join(map(str, ids)), "--dump-logits", path])
        out.append(np.fromfile(path, dtype=np.float32).reshape(N_CTX, n_vocab))
    return np.stack(out)


def scored(logits, tokens):
    """(log-probs of the scored rows [n][V], their next tokens [n]) over all chunks."""
    first = N_CTX // 2
    lp, nxt = [], []
    for c in range(N_CHUNK):
        lp.append(log_softmax(logits[c, first : N_CTX - 1]))
        nxt.append(tokens[c * N_CTX + first + 1 : (c + 1) * N_CTX])
    return np.concatenate(lp), np.concatenate(nxt)


def printed(out, label):
    m = re.search(re.escape(label) + r"\s*:?\s*([-0-9.e+]+)", out)
    if not m:
        sys.exit(f"FAIL: no '{label}' in the output:\n{out}")
    return float(m.group(1))


def close(name, got, want, rel, abs_=0.0):
    ok = abs(got - want) <= abs_ + rel * abs(want)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: dray {got:.6g}, numpy {want:.6g}")
    return ok


def check_plain_and_base(a, tmp, text, n_vocab):
    """f32 run writes a base: its PPL and every stored row against numpy."""
    base = os.path.join(tmp, "base.kld")
    out = sh([a.dray, "perplexity", "-q", "-m", a.model, "-f", text, "-c", str(N_CTX),
              "--chunks", str(N_CHUNK), "--precision", "f32", "--kv-dtype", "f16",
              "--kl-divergence-base", base])
    n_ctx, nv, n_chunk, tokens, rows = read_kld(base)
    ok = (n_ctx, nv, n_chunk) == (N_CTX, n_vocab, N_CHUNK)
    with open(text, "rb") as f:
        p = subprocess.run([a.dray, "tokenize", "-m", a.model, "--ids"], input=f.read(), capture_output=True)
    ids = [int(t) for t in p.stdout.split()]
    ok &= ids[: N_CTX * N_CHUNK] == list(tokens)
    print(f"{'ok  ' if ok else 'FAIL'} header: n_ctx {n_ctx}, n_vocab {nv}, n_chunk {n_chunk}, tokens as tokenized")
    logits = chunk_logits(a.dray, a.model, tokens, "f32", "f16", tmp, n_vocab)
    lp, nxt = scored(logits, tokens)
    nll = -lp[np.arange(len(nxt)), nxt]
    ok &= close("PPL (f32, writing the base)", printed(out, "PPL ="), float(np.exp(nll.mean())), 1e-4)
    want = np.stack([encode_row(logits[c, r]) for c in range(N_CHUNK) for r in range(N_CTX // 2, N_CTX - 1)])
    head_ok = np.allclose(rows[:, :4].copy().view(np.float32), want[:, :4].copy().view(np.float32), rtol=1e-5)
    dq = np.abs(rows[:, 4:].astype(np.int64) - want[:, 4:].astype(np.int64)).max()
    dec = decode_rows(rows, n_vocab)
    keep = lp > lp.max(axis=1, keepdims=True) - FLOOR + 1e-3
    derr = np.abs(dec - lp)[keep].max()
    ok &= head_ok and dq <= 1 and derr < 1e-3
    print(f"{'ok  ' if head_ok and dq <= 1 and derr < 1e-3 else 'FAIL'} rows: scale/offset match {head_ok}, "
          f"max word difference {dq}, max |decoded - log p| {derr:.2e}")
    return ok, base, tokens, lp, nxt


def kl_stats(base_lp, lp):
    p = np.exp(base_lp)
    inside = base_lp > -FLOOR
    return (np.where(inside, p * (base_lp - lp), 0.0)).sum(axis=1)


def check_compare(a, tmp, base, tokens, n_vocab, rows_lp=None):
    """int8 run compared with base: every printed statistic against numpy."""
    out = sh([a.dray, "perplexity", "-q", "-m", a.model, "--precision", "int8", "--kl-divergence",
              "--kl-divergence-base", base])
    _, _, _, _, rows = read_kld(base)
    base_lp = decode_rows(rows, n_vocab)
    logits = chunk_logits(a.dray, a.model, tokens, "int8", "int8", tmp, n_vocab)
    lp, nxt = scored(logits, tokens)
    kl = kl_stats(base_lp, lp)
    idx = np.arange(len(nxt))
    nll, nll_b = -lp[idx, nxt], -base_lp[idx, nxt]
    top = float(np.mean(lp.argmax(axis=1) == rows[:, 4 : 4 + n_vocab].argmax(axis=1)))
    ok = close("positions", printed(out, "positions scored"), len(nxt), 0)
    ok &= close("mean KL", printed(out, "mean KL"), float(kl.mean()), 1e-3, 1e-6)
    for name, fr in (("max", 1.0), ("99%", 0.99), ("median", 0.5), ("10%", 0.1), ("min", 0.0)):
        ok &= close(f"KL {name}", printed(out, f"KL {name}"), float(np.percentile(kl, 100 * fr)), 1e-3, 2e-6)
    ok &= close("same top token %", printed(out, "same top token"), 100 * top, 0, 0.006)
    ok &= close("PPL", printed(out, "PPL "), float(np.exp(nll.mean())), 1e-4)
    ok &= close("PPL(base)", printed(out, "PPL(base)"), float(np.exp(nll_b.mean())), 1e-4)
    ok &= close("ln(PPL/PPL(base))", printed(out, "ln(PPL/PPL(base))"), float((nll - nll_b).mean()), 1e-3, 2e-6)
    return ok, kl.mean(), out


def check_numpy_base(a, tmp, tokens, lp_f32, n_vocab, kl_dray_base):
    """A base written by numpy reads back in dray: f32 against it is ~0 KL, and
    int8 against it gives the KL it gave against dray's own base."""
    path = os.path.join(tmp, "numpy.kld")
    logits = chunk_logits(a.dray, a.model, tokens, "f32", "f16", tmp, n_vocab)
    rows = [encode_row(logits[c, r]) for c in range(N_CHUNK) for r in range(N_CTX // 2, N_CTX - 1)]
    write_kld(path, tokens, rows, n_vocab)
    out = sh([a.dray, "perplexity", "-q", "-m", a.model, "--precision", "f32", "--kv-dtype", "f16",
              "--kl-divergence", "--kl-divergence-base", path])
    kl0, top0 = printed(out, "mean KL"), printed(out, "same top token")
    # only the format's rounding of log-probs (steps of 16/65535) separates them
    ok = abs(kl0) < 1e-5 and top0 == 100.0
    print(f"{'ok  ' if ok else 'FAIL'} f32 against the numpy-written base: mean KL {kl0}, same top {top0}%")
    out = sh([a.dray, "perplexity", "-q", "-m", a.model, "--precision", "int8", "--kl-divergence",
              "--kl-divergence-base", path])
    ok &= close("int8 KL against the numpy base", printed(out, "mean KL"), float(kl_dray_base), 1e-3, 1e-6)
    return ok


def check_errors(a, tmp, base, text):
    """Bad input: a clear message and a non-zero exit, never a crash."""
    ok = True
    short = os.path.join(tmp, "short.kld")
    with open(base, "rb") as f, open(short, "wb") as g:
        g.write(f.read()[:5000])
    cases = [
        (["--kl-divergence", "--kl-divergence-base", short], 1, "ends before"),
        (["--kl-divergence", "--kl-divergence-base", text], 1, "not a log-probability file"),
        (["--kl-divergence", "--kl-divergence-base", base, "-c", "64"], 1, "chunks of 32"),
        (["-f", text, "--chunks", "-1"], 2, "whole number"),
        (["-f", text, "--chunks", "3x"], 2, "whole number"),
        (["--kl-divergence"], 2, "needs --kl-divergence-base"),
        (["-f", text, "-c", "4096"], 1, "less than one chunk"),
        (["-f", tmp], 1, "not a regular file"),
    ]
    for args, code, words in cases:
        out = sh([a.dray, "perplexity", "-q", "-m", a.model] + args, expect=code)
        good = words in out
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {' '.join(args)} -> exit {code}, says '{words}'")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--writer", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a.model = os.path.join(tmp, "tiny.gguf")
        sh([a.writer, a.model, "30"])
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write(TEXT)
        n_vocab = 300
        ok, base, tokens, lp, _ = check_plain_and_base(a, tmp, text, n_vocab)
        good, kl, _ = check_compare(a, tmp, base, tokens, n_vocab)
        ok &= good and kl > 1e-5  # int8 must differ from f32 here, or the test proves nothing
        ok &= check_numpy_base(a, tmp, tokens, lp, n_vocab, kl)
        ok &= check_errors(a, tmp, base, text)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
