"""Integer accumulation on floating-point BLAS, exact to the bit.

Operands arrive as float32 arrays that hold small integers (8-bit values with their zero
points already subtracted, so |value| <= 255). Their products are summed by NumPy's matmul
(OpenBLAS), which is exact under the bound proved in ``float32_chunk``; longer reductions
are split into chunks whose exact results are added in int32.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._geometry import ConvGeometry

# Every integer of magnitude <= 2**24 is a float32 (24-bit significand); 2**53 for float64.
F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
# Below this chunk length, one float64 GEMM beats many short float32 ones.
MIN_F32_CHUNK = 64

_workspace_bytes = 256 << 20


def set_workspace_limit(nbytes: int) -> None:
    """Bound the scratch memory (im2col tiles, padded copies) one operator call may use."""
    global _workspace_bytes
    if int(nbytes) < 1:
        raise ValueError(f"set_workspace_limit: nbytes must be >= 1; got {nbytes}")
    _workspace_bytes = int(nbytes)


def workspace_limit() -> int:
    """The current scratch-memory bound in bytes (default 256 MiB)."""
    return _workspace_bytes


def float32_chunk(a_bound: int, b_bound: int) -> int:
    """The longest reduction that float32 GEMM sums exactly, for |a| <= a_bound, |b| <= b_bound.

    Proof: a chunk of L terms with L * a_bound * b_bound <= 2**24 has every product, and every
    partial sum of any subset of products, an integer of magnitude <= 2**24. Such integers are
    float32 values, so no multiplication, addition or fused multiply-add in any summation
    order (blocked, vectorized, multithreaded) ever rounds: the float32 result is the exact
    integer sum. (Returns a huge length when either bound is 0: every product is 0.)
    """
    product = a_bound * b_bound
    return F32_EXACT // product if product else 1 << 62


def exact_int_gemm(a: np.ndarray, b: np.ndarray, a_bound: int, b_bound: int) -> np.ndarray:
    """wrap32(a @ b) for float arrays holding integers with |a| <= a_bound, |b| <= b_bound.

    ``a`` is (..., R, K), ``b`` is (..., K, M), broadcast as numpy.matmul; returns int32.
    """
    k = a.shape[-1]
    chunk = float32_chunk(a_bound, b_bound)
    if chunk >= k:
        return np.matmul(a, b).astype(np.int32)
    if chunk >= MIN_F32_CHUNK:
        acc = None
        for k0 in range(0, k, chunk):
            # Each chunk is exact and below 2**24 in magnitude, so its int32 conversion is exact;
            # int32 addition wraps modulo 2**32, which is exactly wrap32 of the full sum.
            part = np.matmul(a[..., k0:k0 + chunk], b[..., k0:k0 + chunk, :]).astype(np.int32)
            if acc is None:
                acc = part
            else:
                acc += part
        return acc
    # float64 sums exactly while K * a_bound * b_bound <= 2**53, i.e. K up to 1.3e11 for 8-bit.
    if k * a_bound * b_bound > F64_EXACT:
        raise ValueError(f"reduction of length {k} is too long to accumulate exactly")
    wide = np.matmul(a.astype(np.float64), b.astype(np.float64))
    # int64 holds the exact sum; the cast to int32 keeps the low 32 bits, which is wrap32.
    return wide.astype(np.int64).astype(np.int32)


def value_bound(arr: np.ndarray, zero_point: np.ndarray) -> int:
    """max |arr - zero_point| without materialising the difference (an upper bound for arrays)."""
    if arr.size == 0:
        return 0
    lo, hi = int(arr.min()), int(arr.max())
    zlo, zhi = int(zero_point.min()), int(zero_point.max())
    return max(abs(lo - zhi), abs(hi - zlo))


def conv_weight_matrix(w_centered: np.ndarray, group: int) -> np.ndarray:
    """(M, C/group, k1..kn) float32 weights → (group, K, M/group) with K ordered (k1..kn, C/group).

    That K order matches the channels-last im2col columns built by ``conv_accumulate``.
    """
    m, cg = w_centered.shape[:2]
    kernel = w_centered.shape[2:]
    taps = math.prod(kernel)
    w = w_centered.reshape(group, m // group, cg, taps)
    w = w.transpose(0, 3, 2, 1)  # (group, taps, cg, M/group)
    return np.ascontiguousarray(w).reshape(group, taps * cg, m // group)


def _tiles(batch: int, out_spatial: tuple[int, ...], row_bytes: int, limit: int):
    """Yield (n0, n1, o0, o1): whole images while they fit, else slabs along the first output axis."""
    rows_per_image = math.prod(out_spatial)
    rows_per_slab = math.prod(out_spatial[1:])
    max_rows = max(1, limit // max(1, row_bytes))
    if rows_per_image <= max_rows:
        step = max(1, max_rows // max(1, rows_per_image))
        for n0 in range(0, batch, step):
            yield n0, min(batch, n0 + step), 0, out_spatial[0]
    else:
        step = max(1, max_rows // max(1, rows_per_slab))
        for n0 in range(batch):
            for o0 in range(0, out_spatial[0], step):
                yield n0, n0 + 1, o0, min(out_spatial[0], o0 + step)


def conv_accumulate(
    x: np.ndarray,
    x_zero_point: np.ndarray,
    w_matrix: np.ndarray,
    w_bound: int,
    geom: ConvGeometry,
) -> np.ndarray:
    """wrap32 of the convolution of (x - x_zero_point) with the centered weights.

    ``x`` is (N, C, D1..Dn) 8-bit; ``w_matrix`` comes from ``conv_weight_matrix``. Returns int32
    of shape (N, O1..On, M): channels last, so per-channel requantization broadcasts on the
    last axis. Padded positions are 0 after centering, i.e. x padded with x_zero_point.
    """
    n, c = x.shape[:2]
    group, kdim, mg = w_matrix.shape
    m = group * mg
    cg = c // group
    out = np.zeros((n, *geom.out_spatial, m), dtype=np.int32)
    if out.size == 0 or kdim == 0:
        return out
    zp = int(x_zero_point)
    x_bound = value_bound(x, x_zero_point)
    padded = geom.padded_spatial
    out_rows = out.reshape(n * math.prod(geom.out_spatial), m)
    rows_per_image = math.prod(geom.out_spatial)
    rows_per_slab = math.prod(geom.out_spatial[1:])
    # Scratch per output row: its im2col row (float32) plus its int32 result.
    row_bytes = 4 * (group * kdim + m)
    image_bytes = 4 * c * math.prod(padded)
    limit = max(1, _workspace_bytes - image_bytes)
    interior = tuple(slice(b, b + size) for b, size in zip(geom.pads_begin, geom.in_spatial))

    for n0, n1, o0, o1 in _tiles(n, geom.out_spatial, row_bytes, limit):
        if o0 == 0:  # a new group of images: centre and pad them once, channels last
            xp = np.zeros((n1 - n0, *padded, c), dtype=np.float32)
            np.subtract(np.moveaxis(x[n0:n1], 1, -1), np.float32(zp), out=xp[(slice(None), *interior, slice(None))])
            sn, *ss, sc = xp.strides
            windows = as_strided(
                xp,
                shape=(n1 - n0, *geom.out_spatial, *geom.kernel, group, cg),
                strides=(sn, *(s * st for s, st in zip(ss, geom.strides)),
                         *(s * d for s, d in zip(ss, geom.dilations)), cg * sc, sc),
                writeable=False,
            )
            # (group, n, O1..On, k1..kn, cg): each group's im2col rows, K in (taps, cg) order.
            windows = np.moveaxis(windows, -2, 0)
        tile = windows[:, :, o0:o1]
        rows = (n1 - n0) * (o1 - o0) * rows_per_slab
        cols = np.ascontiguousarray(tile).reshape(group, rows, kdim)
        acc = exact_int_gemm(cols, w_matrix, x_bound, w_bound)  # (group, rows, M/group)
        start = n0 * rows_per_image + o0 * rows_per_slab
        out_rows[start:start + rows].reshape(rows, group, mg)[...] = acc.transpose(1, 0, 2)
    return out
