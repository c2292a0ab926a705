#!/usr/bin/env python3
"""Compare dray's logits dump with the numpy reference's.

  compare_logits.py --dray dray.f32 --ref ref.npy [--min-argmax 1.0]
                    [--max-abs 0.5] [--max-kl 0.01] [--tie-margin 0.0] [-v]

--dray: raw little-endian float32 [n_pos][n_vocab] (what `dray run --dump-logits`
writes); n_vocab is taken from the reference. --ref: float32 .npy [n_pos][n_vocab]
from gemma3_ref.py --out (a raw file of the same layout is accepted too, with
--n-vocab).

Per position: argmax agreement, max |logit difference|, KL(ref || dray) of the
softmax distributions (float64). A disagreement counts as agreement when the
reference's logits for the two argmaxes differ by at most --tie-margin (near
ties flip under any rounding). Exit 0 when every threshold holds, 1 when one is
violated, 2 when the files cannot be compared.
"""
import argparse
import sys

import numpy as np


def load(path, n_vocab=None):
    if path.endswith(".npy"):
        a = np.load(path)
        if a.ndim == 1 and n_vocab:
            a = a.reshape(-1, n_vocab)
        return a.astype(np.float32, copy=False)
    raw = np.fromfile(path, dtype="<f4")
    if not n_vocab:
        raise ValueError(f"{path}: raw file needs n_vocab (from the .npy reference or --n-vocab)")
    if raw.size % n_vocab:
        raise ValueError(f"{path}: {raw.size} floats is not a multiple of n_vocab {n_vocab}")
    return raw.reshape(-1, n_vocab)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(dray, ref, tie_margin):
    """Per-position rows: (argmax_ok, ref_top, dray_top, max_abs, kl)."""
    rows = []
    for p in range(ref.shape[0]):
        r, d = ref[p], dray[p]
        rt, dt = int(np.argmax(r)), int(np.argmax(d))
        ok = rt == dt or (r[rt] - r[dt]) <= tie_margin
        lr, ld = log_softmax(r), log_softmax(d)
        kl = float(np.sum(np.exp(lr) * (lr - ld)))
        rows.append((ok, rt, dt, float(np.max(np.abs(r - d))), kl))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dray", required=True, help="raw float32 [n_pos][n_vocab] dump")
    ap.add_argument("--ref", required=True, help="reference logits (.npy or raw)")
    ap.add_argument("--n-vocab", type=int, help="vocab size when --ref is raw")
    ap.add_argument("--min-argmax", type=float, default=1.0,
                    help="least fraction of positions whose argmax must agree (default 1.0)")
    ap.add_argument("--max-abs", type=float, default=float("inf"),
                    help="largest allowed |logit difference| anywhere")
    ap.add_argument("--max-kl", type=float, default=float("inf"),
                    help="largest allowed mean KL(ref || dray) in nats")
    ap.add_argument("--tie-margin", type=float, default=0.0,
                    help="argmax flips within this reference-logit gap count as agreement")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every position")
    a = ap.parse_args(argv)

    try:
        ref = load(a.ref, a.n_vocab)
        dray = load(a.dray, ref.shape[1] if ref.ndim == 2 else a.n_vocab)
    except (OSError, ValueError) as e:
        print(f"compare_logits: {e}", file=sys.stderr)
        return 2
    if ref.ndim != 2 or dray.shape != ref.shape:
        print(f"compare_logits: shapes differ: dray {dray.shape}, ref {ref.shape}",
              file=sys.stderr)
        return 2
    if not np.all(np.isfinite(dray)):
        bad = np.argwhere(~np.isfinite(dray))[0]
        print(f"compare_logits: dray logits not finite at position {bad[0]}, token {bad[1]}",
              file=sys.stderr)
        return 1

    rows = compare(dray, ref, a.tie_margin)
    for p, (ok, rt, dt, mx, kl) in enumerate(rows):
        if a.verbose or not ok:
            print(f"pos {p:5d}  argmax ref {rt:6d} dray {dt:6d} {'ok ' if ok else 'BAD'}"
                  f"  max|d| {mx:.4g}  KL {kl:.3g}")
    agree = sum(r[0] for r in rows) / len(rows)
    max_abs = max(r[3] for r in rows)
    mean_kl = float(np.mean([r[4] for r in rows]))
    worst_kl = max(range(len(rows)), key=lambda p: rows[p][4])
    print(f"positions {len(rows)}  argmax agreement {agree:.4f}  max|dlogit| {max_abs:.4g}  "
          f"mean KL {mean_kl:.4g}  (worst KL {rows[worst_kl][4]:.4g} at pos {worst_kl})")
    fails = []
    if agree < a.min_argmax:
        fails.append(f"argmax agreement {agree:.4f} < {a.min_argmax}")
    if max_abs > a.max_abs:
        fails.append(f"max|dlogit| {max_abs:.4g} > {a.max_abs}")
    if mean_kl > a.max_kl:
        fails.append(f"mean KL {mean_kl:.4g} > {a.max_kl}")
    for f in fails:
        print("FAIL: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
