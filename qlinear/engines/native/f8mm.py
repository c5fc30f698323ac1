"""QLinearMatMul-21 with a float8 operand on the native engine: the steps around the float64
product that qlinear/_fmatmul.py plans (qlinear/csrc/f8mm/: why each step is exact).

Every function returns None (or False) when the native engine is not selected; the caller then
computes the same thing with NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _native, dtypes
from .formats import FORMAT_CODES, QF_NF, _fmt

_U8 = np.dtype(np.uint8)


def decode(codes: np.ndarray, table: np.ndarray, zp: np.ndarray, zp_mode: int, left: bool,
           threads: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(units, kmax, bad) of a 2-D operand ``codes`` (R x C, any 8-bit dtype): units =
    table[code] - zp (float64; NaN/inf written as 0); ``left`` (k along the columns): kmax[C] per
    column, bad[R] per row; else kmax[R] per row, bad[C] per column. ``zp``: float64 units, one
    (mode 0), one per row (1) or per column (2). ``threads``: at most that many of the pool's
    threads (0: all)."""
    C = _native.native()
    if C is None:
        return None
    r, c = codes.shape
    codes = np.ascontiguousarray(codes).view(_U8)
    units = _native.empty((r, c), np.float64)  # pooled: no page faults on every call
    kmax = np.empty(c if left else r, np.float64)
    bad = np.zeros(r if left else c, np.uint8)
    C.f8mm_decode(codes, r, c, table, np.ascontiguousarray(zp, np.float64), zp_mode, int(left), threads, units, kmax, bad)
    return units, kmax, bad.view(bool)


def combine(parts: list[np.ndarray], s: int) -> np.ndarray | None:
    """hh·2^(2s) + (hl + lh)·2^s + ll of four exact integer float64 arrays, rounded to odd at
    53 bits (so that one float32 conversion rounds the exact total correctly), or None."""
    C = _native.native()
    if C is None:
        return None
    parts = [np.ascontiguousarray(p, np.float64) for p in parts]
    out = np.empty(parts[0].shape, np.float64)
    if not C.f8mm_combine(*parts, out.size, s, out):
        return None
    return out


def finish(S: np.ndarray, unit_exp: int, m: np.ndarray, yt: dtypes.QType, z: float,
           threads: int = 0) -> np.ndarray | None:
    """The output (R x N, yt's dtype) of exact sums ``S`` (R x N float64): float32(S) · 2^unit_exp,
    times ``m`` ((R|1) x (N|1) float32), converted with the zero point ``z`` (yt's value, as a
    float: rne + saturation for uint8/int8, + z and the saturating encoding for float8)."""
    C = _native.native()
    if C is None:
        return None
    r, n = S.shape
    out = _native.empty((r, n), yt.dtype)
    if yt.is_int:
        code, lo, hi, fmt, table, add = FORMAT_CODES[yt.name], int(yt.lo), int(yt.hi), None, None, 0
    else:
        code, lo, hi, add = QF_NF, 0, 0, int(z != 0)
        fmt, table = _fmt(yt)
    C.f8mm_finish(C.get_isa(), np.ascontiguousarray(S, np.float64), r, n, float(2.0 ** unit_exp),
                  np.ascontiguousarray(m, np.float32), int(m.shape[0] != 1), int(m.shape[1] != 1), code, lo, hi,
                  fmt, table, add, np.full(1, z, np.float32), threads, out)
    return out


def output_args(yt: dtypes.QType, z: float) -> tuple:
    """The output step's arguments of :func:`product` for output type ``yt`` and zero point
    ``z`` (yt's value, as a float), built once per plan."""
    if yt.is_int:
        return FORMAT_CODES[yt.name], int(yt.lo), int(yt.hi), None, None, 0, np.full(1, z, np.float32), yt.dtype
    fmt, table_y = _fmt(yt)
    return QF_NF, 0, 0, fmt, table_y, int(z != 0), np.full(1, z, np.float32), yt.dtype


def product(gemm: tuple[int, bool], a: np.ndarray, table: np.ndarray, bad_table: np.ndarray, zp: np.ndarray,
            b_units: np.ndarray, unit: float, m: np.ndarray, out: tuple, threads: int = 0) -> np.ndarray | None:
    """The output (M x N) of the whole product in one native call, for an ``a`` (M x K codes)
    whose bound its type and zero points prove: units = table[code] - zp (zp: float64, one or
    one per row), S = units @ ``b_units`` (K x N float64, C order) by ``gemm`` (the address and
    integer width of a cblas_dgemm, called single-threaded on the pool's threads: the caller
    holds the BLAS at one thread), then the output step as :func:`finish` (``unit``: 2^(ea+eb);
    ``m``: (M|1) x (N|1) float32, C order; ``out``: :func:`output_args`). None when the native
    engine is not selected or ``a`` holds a code ``bad_table`` marks (NaN, infinity)."""
    C = _native.native()
    if C is None:
        return None
    r, k = a.shape
    n = b_units.shape[1]
    code, lo, hi, fmt, table_y, add, z, dtype = out
    y = _native.empty((r, n), dtype)
    units = _native.empty((r, k), np.float64)  # scratch: pooled, no page faults per call
    sums = _native.empty((r, n), np.float64)
    ok = C.f8mm_product(C.get_isa(), gemm[0], gemm[1], np.ascontiguousarray(a).view(_U8), r, k,
                        table, bad_table, zp, zp.size != 1, b_units, n, units, sums, unit, m, m.shape[0] != 1,
                        m.shape[1] != 1, code, lo, hi, fmt, table_y, add, z, threads, y)
    return y if ok else None


def available() -> Any:
    """The compiled module when the native engine is selected, else None."""
    return _native.native()
