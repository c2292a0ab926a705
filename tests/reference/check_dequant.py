#!/usr/bin/env python3
"""Cross-check dray's dequantizer against the independent decoder of the PyPI `gguf`
package (ggml's own Python reference).

For one tensor of each type present in a GGUF file (or every tensor with --all) this
runs `dray info FILE --dump-tensor NAME --rows A:B`, which prints f32 values one per
line with 9 significant digits (round-trips f32 exactly), and compares them with
gguf.quants.dequantize over the same rows. A tensor passes when the values are
identical or max|diff| / max|ref| < 1e-6, with NaNs in the same places.

The tensor table is read by a small parser in this file (written from the GGUF
spec, independent of dray's reader), because gguf.GGUFReader spends ~40 s turning
a 262144-token vocabulary into Python objects; --gguf-reader uses it anyway.

Run it with the interpreter that has `gguf` and `numpy` installed:
    PYTHON tests/reference/check_dequant.py BUILD/tools/dray MODEL.gguf [--all]
Exit status: 0 all match, 1 a mismatch, 2 usage or tool failure.
"""
import argparse
import mmap
import struct
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

try:
    from gguf import GGMLQuantizationType, GGML_QUANT_SIZES, GGUFReader
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover - environment problem
    sys.exit(f"check_dequant: the 'gguf' package is needed ({e}); "
             "run with the project's venv python")

FULL_LIMIT = 2_000_000  # tensors up to this many values are checked completely
EDGE_ROWS = 32          # otherwise the first and last EDGE_ROWS rows
REL_TOL = 1e-6


@dataclass
class Tensor:
    """The fields of gguf.ReaderTensor that this script uses."""
    name: str
    tensor_type: GGMLQuantizationType
    shape: list      # ne[0], ne[1], ... (ggml order)
    n_elements: int
    data: np.ndarray  # raw bytes, one row of ne[0] values per line


# Byte size of each fixed-size metadata value type (GGUF spec); 8 = STRING, 9 = ARRAY.
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_tensors(path):
    """Tensor table of a little-endian GGUF v2/v3 file, straight from the spec."""
    f = open(path, "rb")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    off, alignment = 24, 32

    def string(off):
        (n,) = struct.unpack_from("<Q", buf, off)
        return buf[off + 8:off + 8 + n], off + 8 + n

    def skip_value(vtype, off):
        if vtype == 8:
            return string(off)[1]
        if vtype == 9:
            etype, count = struct.unpack_from("<IQ", buf, off)
            off += 12
            if etype in SCALAR_SIZE:
                return off + count * SCALAR_SIZE[etype]
            for _ in range(count):
                off = skip_value(etype, off)
            return off
        return off + SCALAR_SIZE[vtype]

    for _ in range(n_kv):
        key, off = string(off)
        (vtype,) = struct.unpack_from("<I", buf, off)
        off += 4
        if key == b"general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, off)
        off = skip_value(vtype, off)
    infos = []
    for _ in range(n_tensors):
        name, off = string(off)
        (n_dims,) = struct.unpack_from("<I", buf, off)
        ne = list(struct.unpack_from(f"<{n_dims}Q", buf, off + 4))
        ttype, t_off = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        infos.append((name.decode(), ne, GGMLQuantizationType(ttype), t_off))
    data_start = off + (alignment - off % alignment) % alignment
    tensors = []
    for name, ne, ttype, t_off in infos:
        block, size = GGML_QUANT_SIZES[ttype]
        n = int(np.prod(ne)) if ne else 1
        row_bytes = ne[0] // block * size
        raw = np.frombuffer(buf, dtype=np.uint8, count=n // ne[0] * row_bytes,
                            offset=data_start + t_off)
        tensors.append(Tensor(name, ttype, ne, n, raw.reshape(-1, row_bytes)))
    return tensors


def row_ranges(n_rows, ne0):
    if n_rows * ne0 <= FULL_LIMIT or n_rows <= 2 * EDGE_ROWS:
        return [(0, n_rows)]
    return [(0, EDGE_ROWS), (n_rows - EDGE_ROWS, n_rows)]


def dray_rows(dray, path, name, a, b):
    cmd = [dray, "info", path, "--dump-tensor", name, "--rows", f"{a}:{b}"]
    res = subprocess.run(cmd, capture_output=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr.decode(errors="replace"))
        raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}")
    return np.array(res.stdout.split(), dtype=np.float64).astype(np.float32)


def reference_rows(t, a, b):
    ne0 = int(t.shape[0])
    raw = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(-1, ne0)
    return dequantize(raw[a:b], t.tensor_type).astype(np.float32).reshape(-1)


def check_tensor(dray, path, t):
    ne0 = int(t.shape[0])
    n_rows = int(t.n_elements) // ne0 if ne0 else 0
    got, want, rows = [], [], 0
    for a, b in row_ranges(n_rows, ne0):
        got.append(dray_rows(dray, path, t.name, a, b))
        want.append(reference_rows(t, a, b))
        rows += b - a
    got, want = np.concatenate(got), np.concatenate(want)
    if got.shape != want.shape:
        return rows, got.size, float("inf"), float("inf"), False
    nan_ok = np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    diff = np.abs(got[fin].astype(np.float64) - want[fin].astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(want[fin]).max()) if diff.size else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    ok = nan_ok and (max_abs == 0.0 or rel < REL_TOL)
    return rows, got.size, max_abs, rel, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dray", help="path to the dray binary")
    ap.add_argument("gguf", help="path to a GGUF file")
    ap.add_argument("--all", action="store_true", help="check every tensor, not one per type")
    ap.add_argument("--gguf-reader", action="store_true",
                    help="take the tensor table from gguf.GGUFReader (slow on big vocabularies)")
    args = ap.parse_args()

    tensors = GGUFReader(args.gguf).tensors if args.gguf_reader else read_tensors(args.gguf)
    chosen, seen = [], set()
    for t in tensors:
        if args.all or t.tensor_type not in seen:
            seen.add(t.tensor_type)
            chosen.append(t)

    hdr = f"{'type':<6} {'tensor':<34} {'shape':<16} {'rows':>7} {'values':>10} " \
          f"{'max|diff|':>10} {'rel':>9}  result"
    print(hdr)
    print("-" * len(hdr))
    failed = 0
    for t in chosen:
        shape = "x".join(str(int(d)) for d in t.shape)
        try:
            rows, n, max_abs, rel, ok = check_tensor(args.dray, args.gguf, t)
        except RuntimeError as e:
            print(f"check_dequant: {e}", file=sys.stderr)
            return 2
        failed += not ok
        print(f"{t.tensor_type.name:<6} {t.name:<34} {shape:<16} {rows:>7} {n:>10} "
              f"{max_abs:>10.3g} {rel:>9.2g}  {'ok' if ok else 'MISMATCH'}")
    print(f"{len(chosen) - failed} of {len(chosen)} tensors match "
          f"(types: {', '.join(sorted({t.tensor_type.name for t in chosen}))})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
