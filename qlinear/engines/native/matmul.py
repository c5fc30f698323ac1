"""Matrix products on the native engine: packing b, the engine's limits for a call, the plan
of a call (csrc/python/bind_matmul.c's argument lists) and its run.

``qlinear/matmul.py`` validates and caches; this module turns a validated product into the C
module's ``matmul``, ``matmul_raw`` and ``pack_b`` arguments.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import _native, dtypes

#: The native engine's matrix sizes are C ints (its matmul, pack_b; limits()' max_dim): larger M (batch
#: entries folded in), N or K go to the NumPy engine, which has no such bound (a K of 2**31
#: used to raise the argument parser's OverflowError).
MAX_DIM = _native.LIMITS["max_dim"]

#: the output types the native kernels store, with their ranges
RANGES = dtypes.NATIVE_INT_RANGE
_CODES = _native.DTYPE_CODES
_NO_MULT = np.zeros(1, dtype=np.float32)
_ZERO_IDX = np.zeros(1, dtype=np.int64)
_I32 = np.dtype(np.int32)


def takes(K: int, N: int, rows: int | None = None) -> bool:
    """Whether the native engine is selected and its C int sizes hold b's K x N (and a's
    ``rows``, batch entries folded in)."""
    if _native.native() is None:
        return False
    if K > MAX_DIM or N > MAX_DIM:
        return False
    return rows is None or rows <= MAX_DIM


_KERNEL_INFO: dict[tuple[str, int], dict | None] = {}


def kernel_info(isa: str, which: int) -> dict | None:
    """The native kernel_info(isa, which), asked once per level and kernel (it is constant)."""
    key = (isa, which)
    if key not in _KERNEL_INFO:
        _KERNEL_INFO[key] = _native._C.kernel_info(isa, which)
    return _KERNEL_INFO[key]


def has_fast(isa: str) -> bool:
    """Whether level ``isa`` has the byte kernels' fast path (kernel 1)."""
    return kernel_info(isa, 1) is not None


def broadcast_batch(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.broadcast_shapes(a, b), without its cost (a few microseconds a call, paid per
    plain call) when the batch shapes are equal, as in attention's per-head products."""
    return a if a == b else np.broadcast_shapes(a, b)


def pack_b(isa: str, which: int, matrix: np.ndarray, zp: np.ndarray) -> tuple:
    """b (..., K, N) and its zero point (0-d or per column) packed for kernel ``which`` at
    level ``isa``: (which, packed panels, column sums, zero points in the form's terms, Bb)."""
    C = _native._C
    K, N = matrix.shape[-2:]
    batch = matrix.shape[:-2]
    Bb = math.prod(batch)  # shape entries: Python ints, the product exact
    b = np.ascontiguousarray(matrix).reshape(Bb, K, N)
    if zp.ndim == 0:
        zpa, zp_bs, zp_cs = np.array([int(zp)], dtype=np.int32), 0, 0
    else:
        zpa = np.ascontiguousarray(np.broadcast_to(zp, (*batch, 1, N)), dtype=np.int32).reshape(Bb, N)
        zp_bs, zp_cs = N, 1
    info = kernel_info(isa, which)
    nr = info["nr"]
    npad = -(-N // nr) * nr
    packed = np.empty(Bb * C.packed_b_bytes(isa, which, K, N), dtype=np.uint8)
    colsums = np.empty(Bb * npad if info["form"] == "u8s8" else 0, dtype=np.int32)
    zcol = np.empty(Bb * N, dtype=np.int32)
    C.pack_b(isa, which, b, _CODES[b.dtype], Bb, K, N, K * N, N, 1,
             zpa, zp_bs, zp_cs, packed, colsums, zcol)
    return which, packed, colsums, zcol, Bb


def raw_b(isa: str, matrix: np.ndarray, zp: np.ndarray) -> tuple:
    """A plain call's b for the native engine at ISA level ``isa``, which packs it inside the
    GEMM (each thread the panels it uses): (which kernel, b as C-contiguous (Bb, K, N), its zero
    point as int32 with batch and column strides, Bb). The fast kernel is chosen from this
    call's b by one native pass over it (``bytes_within``)."""
    C = _native._C
    K, N = matrix.shape[-2:]
    batch = matrix.shape[:-2]
    Bb = math.prod(batch)  # shape entries: Python ints, the product exact
    b = np.ascontiguousarray(matrix)
    # the s8 form of b (int8 as is, uint8 - 128) within [-64, 64]: in the u8 form, [64, 192]
    fast = has_fast(isa) and C.bytes_within(b, _CODES[b.dtype], 64, 192)
    if zp.ndim == 0:
        zpa, zp_bs, zp_cs = np.array([zp], dtype=np.int32), 0, 0
    elif zp.ndim == 2:  # (1, N): one row for every batch entry
        zpa, zp_bs, zp_cs = zp.astype(np.int32).reshape(-1), 0, 1
    else:
        zpa = np.ascontiguousarray(np.broadcast_to(zp, (*batch, 1, N)), dtype=np.int32).reshape(Bb, N)
        zp_bs, zp_cs = N, 1
    return int(fast), b, zpa, zp_bs, zp_cs, Bb


def _batch_index(batch: tuple[int, ...], count: int, out_batch: tuple[int, ...]) -> np.ndarray:
    """For each output batch entry (C order), the index of the operand's matrix it reads."""
    index = np.arange(count, dtype=np.int64)
    if batch == out_batch:  # no broadcasting: entry i reads matrix i
        return index
    return np.ascontiguousarray(np.broadcast_to(index.reshape(batch), out_batch)).ravel()


def drop_axes(a_ndim: int, b_ndim: int) -> Any:
    """The index that drops the axes numpy.matmul drops for 1-D operands from the (..., M, N)
    output, or None."""
    if b_ndim == 1:
        return (Ellipsis, 0, 0) if a_ndim == 1 else (Ellipsis, 0)
    return (Ellipsis, 0, slice(None)) if a_ndim == 1 else None


def matmul(b_matrix: np.ndarray, packed: tuple | None, raw: tuple | None, matrix: np.ndarray, zp: np.ndarray,
           m: np.ndarray | None = None, yzp: np.ndarray | None = None) -> tuple[np.ndarray, tuple]:
    """(a - zp) @ (b - b_zp) on the native engine: int32, or requantized with multiplier m
    (broadcastable to the output) and output zero point yzp. Shapes as numpy.matmul, on the
    matrices (1-D operands already made 2-D). b is ``packed`` (``pack_b``: a prepared form) or
    ``raw`` (``raw_b``: a plain call, packed inside the GEMM, panel by panel). Returns the
    output and the call's plan: for packed b, the plan ``run`` repeats (isa, head, mid, tail,
    output shape, output dtype, None); for raw b, the shape-derived part a plain call's lean
    path reuses (``run_plain``)."""
    C = _native._C
    isa = C.get_isa()
    if packed is not None:
        which, packed_b, colsums, zcol, Bb = packed
    else:
        which, braw, bzp, bzp_bs, bzp_cs, Bb = raw
    M, K = matrix.shape[-2:]
    N = b_matrix.shape[-1]
    a_batch, b_batch = matrix.shape[:-2], b_matrix.shape[:-2]
    a = np.ascontiguousarray(matrix)
    if not a_batch and not b_batch:  # the common case, kept short: one matrix times one
        out_batch, rows, batches, Ba = (), M, 1, 1
        a_idx = b_idx = _ZERO_IDX
    else:
        out_batch = broadcast_batch(a_batch, b_batch)
        Bout = math.prod(out_batch)
        if Bb == 1 and a_batch == out_batch:
            # b is one matrix: every batch entry's rows form one taller GEMM
            rows, batches, Ba = Bout * M, 1, 1
            a_idx = b_idx = _ZERO_IDX
        else:
            rows, batches = M, Bout
            Ba = math.prod(a_batch)
            a_idx = _batch_index(a_batch, Ba, out_batch)
            b_idx = a_idx if b_batch == a_batch else _batch_index(b_batch, Bb, out_batch)
    # a's zero point: per tensor, or one per (batch entry, row)
    if zp.ndim == 0:
        zpa, zpa_bs, zpa_rs = np.array([zp], dtype=np.int32), 0, 0
    else:
        zpa = np.ascontiguousarray(np.broadcast_to(zp, (*out_batch, M, 1)), dtype=np.int32).reshape(-1)
        zpa_bs, zpa_rs = (M, 1) if batches > 1 else (0, 1)
    quantized = m is not None
    if quantized:
        mm = m if isinstance(m, np.ndarray) and m.dtype == np.float32 else np.asarray(m, dtype=np.float32)
        if mm.size == 1:
            mult, m_bs, m_rs, m_cs = mm.reshape(1), 0, 0, 0
        else:
            mm = mm.reshape((1,) * (len(out_batch) + 2 - mm.ndim) + mm.shape)
            Mm, Nm = mm.shape[-2:]
            batch_varies = any(d != 1 for d in mm.shape[:-2])
            if rows != M and (batch_varies or Mm != 1):  # folded batches: a multiplier row per output row
                mult = np.ascontiguousarray(np.broadcast_to(mm, (*out_batch, M, Nm)), dtype=np.float32).reshape(-1)
                m_bs, m_rs = 0, Nm
            elif batch_varies:
                mult = np.ascontiguousarray(np.broadcast_to(mm, (*out_batch, Mm, Nm)), dtype=np.float32).reshape(-1)
                m_bs, m_rs = Mm * Nm, (Nm if Mm > 1 else 0)
            else:
                mult = np.ascontiguousarray(mm, dtype=np.float32).reshape(-1)
                m_bs, m_rs = 0, (Nm if Mm > 1 else 0)
            m_cs = 1 if Nm > 1 else 0
        out_dtype = yzp.dtype
        qmin, qmax = RANGES[out_dtype]
        z = int(yzp)
        lo, hi = float(qmin - z), float(qmax - z)
        out = _native.empty((*out_batch, M, N), out_dtype)
        signed = int(qmin < 0)
    else:
        mult, m_bs, m_rs, m_cs, lo, hi, z, signed = _NO_MULT, 0, 0, 0, 0.0, 0.0, 0, 0
        out = _native.empty((*out_batch, M, N), np.int32)
    if packed is not None:
        head = (isa, which, rows, N, K, batches)
        mid = (_CODES[a.dtype], Ba, a_idx, zpa, zpa_bs, zpa_rs, packed_b, colsums, zcol, Bb, b_idx)
        tail = (int(quantized), signed, mult, m_bs, m_rs, m_cs, lo, hi, z)
        C.matmul(*head, a, *mid, out, *tail)
        return out, (isa, head, mid, tail, out.shape, out.dtype, None)
    C.matmul_raw(isa, which, rows, N, K, batches, a, _CODES[a.dtype], Ba, a_idx,
                 zpa, zpa_bs, zpa_rs, braw, _CODES[braw.dtype], Bb, b_idx, bzp, bzp_bs, bzp_cs,
                 out, int(quantized), signed, mult, m_bs, m_rs, m_cs, lo, hi, z)
    return out, (rows, N, K, batches, Ba, a_idx, Bb, b_idx, out.shape)


def with_drop(call: tuple, drop: Any) -> tuple:
    """A packed-b plan whose run drops the axes numpy.matmul drops (``drop_axes``)."""
    return call if drop is None else call[:6] + (drop,)


def run(call: tuple, a: np.ndarray) -> np.ndarray:
    """The product of a C-contiguous a (the shape the plan was made for) by a plan of
    ``matmul`` (packed b), the 1-D operands' axes dropped."""
    _, head, mid, tail, out_shape, out_dtype, drop = call
    out = _native.empty(out_shape, out_dtype)
    _native._C.matmul(*head, a, *mid, out, *tail)
    return out if drop is None else out[drop]


def run_zero_point(call: tuple, a: np.ndarray, zero_point: Any) -> np.ndarray:
    """``run`` with a's per-tensor zero point replaced by ``zero_point`` (this call's value)."""
    _, head, mid, tail, out_shape, out_dtype, drop = call
    zpa = np.array([zero_point], dtype=np.int32)
    out = _native.empty(out_shape, out_dtype)
    _native._C.matmul(*head, a, mid[0], mid[1], mid[2], zpa, *mid[4:], out, *tail)
    return out if drop is None else out[drop]


def run_plain(plan: tuple, a: np.ndarray, za: int, b: np.ndarray, zb: int, quant: tuple | None,
              drop: Any) -> np.ndarray | None:
    """A plain call's product by the shape-derived part of an earlier call's plan (``matmul``
    on raw b), per-tensor zero points ``za``, ``zb``; ``quant`` None (int32) or (a_scale,
    b_scale, y_scale as Python numbers, output dtype, output zero point). None when the
    multiplier float32(float32(a_scale * b_scale) / y_scale) (the engine's, csrc/epilogue) is
    not finite or y_scale is 0: the caller's full path then raises. a and b C-contiguous."""
    C = _native._C
    rows, N, K, batches, Ba, a_idx, Bb, b_idx, out_shape = plan
    if quant is None:
        quantized, signed, mult, lo, hi, z, out_dtype = 0, 0, _NO_MULT, 0.0, 0.0, 0, _I32
    else:
        a_scale, b_scale, y_scale, out_dtype, z = quant
        m = C.multiplier(a_scale, b_scale, y_scale)
        if m is None:
            return None
        qmin, qmax = RANGES[out_dtype]
        quantized, signed, lo, hi = 1, int(qmin < 0), float(qmin - z), float(qmax - z)
        mult = np.float32(m)   # exact: m is a float32 value; a NumPy scalar is a 4-byte buffer
    isa = C.get_isa()
    bd = b.dtype
    # the s8 form of b (int8 as is, uint8 - 128) within [-64, 64]: in the u8 form, [64, 192]
    which = int(has_fast(isa) and C.bytes_within(b, _CODES[bd], 64, 192))
    out = _native.empty(out_shape, out_dtype)
    C.matmul_raw(isa, which, rows, N, K, batches, a, _CODES[a.dtype], Ba, a_idx, np.int32(za), 0, 0,
                 b, _CODES[bd], Bb, b_idx, np.int32(zb), 0, 0, out, quantized, signed, mult, 0, 0, 0, lo, hi, z)
    return out if drop is None else out[drop]
