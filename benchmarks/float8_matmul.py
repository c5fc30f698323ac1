"""Float8 QLinearMatMul-21 (issue 29's target) against NumPy's float32 matmul of the dequantized
operands, same process, same threads, on BERT-base's shapes 128x768x768 and 128x768x3072.

Usage: python benchmarks/float8_matmul.py [--threads=N] [--repeat=R]

For each shape (e4m3fn operands, every code but NaN, zero zero points, float8 e4m3fn output):
  plain     qlinear.qlinear_matmul (the same b on every call: its decoding is kept by its contents,
            so a call compares b's bytes instead of decoding it)
  prepared  qlinear.prepare_qlinear_matmul(b, ...).run (b decoded once: the backend's form; an
            e4m3fn a takes the one-call product: decode, dgemm per thread, output step)
  sgemm     np.matmul of the float32 dequantized operands (the reference of the target)
  dgemm     np.matmul of the float64 units (the exact path's GEMM alone, for the breakdown)
and the ratios to sgemm (target: prepared <= 2). Calls alternate between the cases within each
round, so that a load change touches all of them alike; the figure is the median over rounds.
OpenBLAS and qlinear both use --threads threads (default: the CPUs this process may use).
An e5m2 case (moderate range, the same float64 path) and a wide-span e5m2 case (the split
path: four GEMMs) follow for information; then 8-bit operands with float16 scales against
float32 scales (prepared and plain, per-column b_scale). Runs in well under a minute per shape on 2 cores.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np


def _set_blas_threads(n: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from qlinear import _blas
    h = _blas._openblas()
    if h is not None:
        h[0](n)


def _rounds(cases: dict, repeat: int) -> dict:
    times = {k: [] for k in cases}
    for f in cases.values():  # warm-up (first-touch memory, prepared caches, thread start)
        f()
    for _ in range(repeat):
        for k, f in cases.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _codes(rng, shape, fmt, lo=0, hi=256):
    c = rng.integers(lo, hi, shape, dtype=np.uint8)
    x = c.view(fmt)
    bad = ~np.isfinite(x.astype(np.float32))
    c[bad] = c[bad] & 0x3F
    return c.view(fmt)


def main(argv: list[str]) -> None:
    threads = len(os.sched_getaffinity(0))
    repeat = 30
    for w in argv:
        if w.startswith("--threads="):
            threads = int(w.split("=")[1])
        if w.startswith("--repeat="):
            repeat = int(w.split("=")[1])
    _set_blas_threads(threads)
    import qlinear
    from qlinear import _fmatmul
    qlinear.set_num_threads(threads)
    info = qlinear.engine_info()
    print(f"engine {info['engine']} isa {info['isa']}, threads {threads} (qlinear and OpenBLAS), "
          f"median of {repeat} alternating rounds")
    rng = np.random.default_rng(1)
    e4, e5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    head = f"{'case':34s} {'plain':>9s} {'prepared':>9s} {'sgemm':>9s} {'dgemm':>9s} {'plain/s':>8s} {'prep/s':>8s} {'dgemm/s':>8s}"
    print(head)
    for m, k, n in ((128, 768, 768), (128, 768, 3072)):
        for name, fmt, lo, hi in (("e4m3fn", e4, 0, 256), ("e5m2 |x|<=2", e5, 0x00, 0x41),
                                  ("e5m2 full range (split)", e5, 0, 256)):
            a, b = _codes(rng, (m, k), fmt, lo, hi), _codes(rng, (k, n), fmt, lo, hi)
            if lo == 0 and hi == 0x41:  # both signs
                a = (a.view(np.uint8) | (rng.integers(0, 2, a.shape, dtype=np.uint8) << 7)).view(fmt)
                b = (b.view(np.uint8) | (rng.integers(0, 2, b.shape, dtype=np.uint8) << 7)).view(fmt)
            z = np.zeros((), fmt)
            zy = np.zeros((), e4)
            s, ys = np.float32(0.1), np.float32(10.0)
            p = qlinear.prepare_qlinear_matmul(b, s, z)
            af, bf = a.astype(np.float32), b.astype(np.float32)
            t = qlinear.dtypes.lookup(fmt)
            ua = _fmatmul._Decoded(a, t, z, True).units
            ub = _fmatmul._Decoded(b, t, z, False).units
            cases = {
                "plain": lambda: qlinear.qlinear_matmul(a, s, z, b, s, z, ys, zy),
                "prepared": lambda: p.run(a, s, z, ys, zy),
                "sgemm": lambda: np.matmul(af, bf),
                "dgemm": lambda: np.matmul(ua, ub),
            }
            r = _rounds(cases, repeat if "split" not in name else max(3, repeat // 5))
            sg = r["sgemm"]
            print(f"{f'{name} {m}x{k}x{n}':34s} {r['plain'] * 1e3:7.2f}ms {r['prepared'] * 1e3:7.2f}ms "
                  f"{sg * 1e3:7.2f}ms {r['dgemm'] * 1e3:7.2f}ms {r['plain'] / sg:8.2f} {r['prepared'] / sg:8.2f} "
                  f"{r['dgemm'] / sg:8.2f}")
    print("target (issue 29): prepared/sgemm <= 2 on the e4m3fn rows")
    # 8-bit operands with float16 scales (QLinearMatMul-21) against float32 scales (the 8-bit path)
    print(f"{'8-bit, f16 scales / f32 scales':34s} {'prep f32':>9s} {'prep f16':>9s} {'plain f32':>9s} {'plain f16':>9s} "
          f"{'prep':>6s} {'plain':>6s}")
    for m, k, n in ((128, 768, 768), (128, 768, 3072)):
        a8 = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b8 = rng.integers(-128, 128, (k, n), dtype=np.int8)
        s32 = (np.float32(0.015625), np.full(n, 0.0078125, np.float32), np.float32(0.5))
        s16 = tuple(np.asarray(x).astype(np.float16)[()] if np.ndim(x) == 0 else x.astype(np.float16) for x in s32)
        zb = np.zeros(n, np.int8)
        p32, p16 = qlinear.prepare_qlinear_matmul(b8, s32[1], zb), qlinear.prepare_qlinear_matmul(b8, s16[1], zb)
        cases = {
            "p32": lambda: p32.run(a8, s32[0], np.uint8(3), s32[2], np.uint8(128)),
            "p16": lambda: p16.run(a8, s16[0], np.uint8(3), s16[2], np.uint8(128)),
            "f32": lambda: qlinear.qlinear_matmul(a8, s32[0], np.uint8(3), b8, s32[1], zb, s32[2], np.uint8(128)),
            "f16": lambda: qlinear.qlinear_matmul(a8, s16[0], np.uint8(3), b8, s16[1], zb, s16[2], np.uint8(128)),
        }
        r = _rounds(cases, repeat)
        print(f"{f'{m}x{k}x{n}':34s} {r['p32'] * 1e3:7.2f}ms {r['p16'] * 1e3:7.2f}ms {r['f32'] * 1e3:7.2f}ms "
              f"{r['f16'] * 1e3:7.2f}ms {r['p16'] / r['p32']:6.2f} {r['f16'] / r['f32']:6.2f}")
    print("target (issue 29): float16 scales at the 8-bit path's speed (ratios ~1)")


if __name__ == "__main__":
    main(sys.argv[1:])
