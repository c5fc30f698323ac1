"""Integer accumulation on floating-point BLAS, exact to the bit.

Operands are 8-bit integers with their zero points subtracted, held in float32 (every integer
of magnitude <= 2**24 is a float32). Their products are summed by NumPy's matmul (OpenBLAS
SGEMM), which is exact as long as no partial sum can leave [-2**24, 2**24]: the bound is
proved in ``Reduction`` and checked from the operands' actual values. A reduction too long
for one exact SGEMM is split into chunks whose exact results are added in int32.

The convolution runs channels first, as ``W (M x K) @ columns (K x pixels)``, so that the
result is already in ONNX's (N, M, O1..On) layout. Fast paths:

- 1x1 convolutions without padding need no im2col: the centered input *is* the column
  matrix (strided once for strides > 1);
- stride-1 convolutions with several kernel rows: im2col along the last axis only, then one
  GEMM per remaining tap on a shifted slice of the flattened padded image (``_FlatLayout``);
- depthwise convolutions (one input channel per group), any stride: the padded input split
  into stride phases and flattened, so that every tap reads a contiguous slice; a sum over
  taps of slice times per-channel weight, or, on small images, one batched matmul;
- everything else: im2col through a strided view of the centered, padded input, copied
  tile by tile into one reused buffer, grouped convolutions as one batched matmul.

Batches and large images are processed in tiles so that the scratch memory stays under
``workspace_limit()`` (default 256 MiB).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import dtypes
from ._geometry import ConvGeometry
from .engines import set_workspace_limit, workspace_limit  # noqa: F401 - the old home of both

# Every integer of magnitude <= 2**24 is a float32 (24-bit significand); 2**53 for float64.
F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
# Below this chunk length, one float64 GEMM beats many short float32 ones. (With 8-bit
# operands a chunk is never shorter than 2**24 // (255 * 255) = 258, so float64 is a
# safety net for wider inputs, not a path 8-bit data takes.)
MIN_F32_CHUNK = 64
# Tiles aim at this many output pixels per GEMM, batching small images together.
_MIN_TILE_PIXELS = 1024

# Depthwise convolutions on images of at most this many flat outputs per channel use the
# batched-matmul method of ``_depthwise_flat``; tests and measurements may force a method.
_DW_GEMM_MAX_LENGTH = 1024
_DW_METHOD: str | None = None


def _out_shape(a: np.ndarray, b: np.ndarray) -> tuple[int, ...]:
    return (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """numpy.matmul(a, b, out=out): one BLAS call with the BLAS's own threads (the native
    engine is the fast path; this engine stays plain)."""
    return np.matmul(a, b, out=out)


# ------------------------------------------------------------------------------------------
# Temporaries
# ------------------------------------------------------------------------------------------
#
# Every temporary is allocated per call (and reused across the tiles of that call only); the
# workspace limit bounds them. (An earlier pool kept them across calls, which only saved
# first-touch page faults: speed the native engine now provides.)

def _buffer(shape: tuple[int, ...], zeroed: bool = False) -> np.ndarray:
    """A float32 temporary of ``shape``; zero-filled if ``zeroed`` (padded buffers are only
    ever written in their interior, so their padding stays the centered zero point, 0)."""
    return np.zeros(shape, dtype=np.float32) if zeroed else np.empty(shape, dtype=np.float32)




def float32_chunk(a_bound: int, b_bound: int) -> int:
    """The longest reduction that float32 GEMM sums exactly, for |a| <= a_bound, |b| <= b_bound.

    A special case of ``Reduction``'s bound with every |b| equal to b_bound. (Returns a huge
    length when either bound is 0: every product is 0.)
    """
    product = a_bound * b_bound
    return F32_EXACT // product if product else 1 << 62


def value_bound(arr: np.ndarray, zero_point: np.ndarray) -> int:
    """max |arr - zero_point| without materialising the difference (an upper bound for arrays)."""
    if arr.size == 0:
        return 0
    lo, hi = int(arr.min()), int(arr.max())
    zlo, zhi = int(np.min(zero_point)), int(np.max(zero_point))
    return max(abs(lo - zhi), abs(hi - zlo))


def dtype_bound(dtype: np.dtype, zero_point: np.ndarray) -> int:
    """max |v - zero_point| over every value v of an integer dtype: a bound needing no data pass."""
    if zero_point.size == 1:  # per tensor, on every call: cached
        z = int(zero_point.reshape(-1)[0])
        return _dtype_bound(np.dtype(dtype), z, z)
    return _dtype_bound(np.dtype(dtype), int(np.min(zero_point)), int(np.max(zero_point)))


@functools.lru_cache(maxsize=1024)
def _dtype_bound(dtype: np.dtype, zlo: int, zhi: int) -> int:
    lo, hi = dtypes.INT_RANGE[dtype]
    return max(abs(lo - zhi), abs(hi - zlo))


class Reduction:
    """The constant operand of an integer product, seen along its reduction axis.

    ``weights`` is (outputs, K): for every output, the K integer weights (zero point
    subtracted) its sum multiplies. ``chunks(a_bound)`` splits [0, K) into chunks that a
    float32 GEMM sums exactly when the other operand satisfies |a| <= a_bound.

    Proof of the bound. Take one output o and one chunk C with
    a_bound * sum_{k in C} |w[o, k]| <= 2**24. Every product a_k * w[o, k] is an integer of
    magnitude <= a_bound * |w[o, k]|, and every partial sum of any subset of the chunk's
    products is an integer of magnitude <= a_bound * sum_{k in C} |w[o, k]| <= 2**24. Integers
    of magnitude <= 2**24 are float32 values, so no multiplication, addition or fused
    multiply-add, in whatever order, blocking or threading the BLAS uses, ever rounds: the
    float32 result is the exact integer sum. Each chunk's result then converts to int32
    exactly, and int32 addition of the chunk results wraps modulo 2**32, which is wrap32 of
    the full sum. Using each output's L1 norm rather than K * max|w| makes chunks about twice
    as long for uniformly distributed weights and longer still for real (bell-shaped) ones.
    """

    def __init__(self, weights: np.ndarray, axis: int = 1, bound: int | None = None) -> None:
        # Everything is computed lazily, cheapest bound first: a product whose right operand
        # changes on every call (attention) must not pay for a chunk plan it never needs.
        # ``axis`` is the reduction axis of ``weights``; all other axes index outputs.
        self._weights = weights
        self._axis = axis
        self.k = weights.shape[axis]
        self._bound = bound  # an upper bound of |w| known without a pass (the dtype's)
        self._max_abs: int | None = None
        self._max_l1: int | None = None
        self._cum: np.ndarray | None = None
        self._plans: dict[int, list[tuple[int, int]] | None] = {}

    @property
    def max_abs(self) -> int:
        if self._max_abs is None:
            w = self._weights
            self._max_abs = int(np.abs(w).max()) if w.size else 0
        return self._max_abs

    @property
    def max_l1(self) -> int:
        """max over outputs of sum_k |w[o, k]|."""
        if self._max_l1 is None:
            w = self._weights
            self._max_l1 = (int(np.abs(w).sum(axis=self._axis, dtype=np.float64).max())
                            if w.size else 0)
        return self._max_l1

    def accumulator_bound(self, a_bound: int) -> int:
        """An upper bound of |sum_k a_k * w[o, k]| over every output o (cheapest first)."""
        coarse = a_bound * self.k * (self._bound if self._bound is not None else self.max_abs)
        if coarse <= F32_EXACT:
            return coarse
        return a_bound * self.max_l1

    def chunks(self, a_bound: int) -> list[tuple[int, int]] | None:
        """[(k0, k1), ...] covering [0, K), each summed exactly by float32; None when chunks
        would be shorter than MIN_F32_CHUNK (use float64)."""
        plan = self._plans.get(a_bound)
        if plan is None and a_bound not in self._plans:
            plan = self._plan(a_bound)
            self._plans[a_bound] = plan
        return plan

    def _plan(self, a_bound: int) -> list[tuple[int, int]] | None:
        if self.k == 0 or self.accumulator_bound(a_bound) <= F32_EXACT:
            return [(0, self.k)]
        if self._cum is None:
            absw = np.abs(np.moveaxis(self._weights, self._axis, 0)).astype(np.int64)
            absw = absw.reshape(self.k, -1)  # (K, outputs)
            self._cum = np.zeros((self.k + 1, absw.shape[1]), dtype=np.int64)
            np.cumsum(absw, axis=0, out=self._cum[1:])
        limit = F32_EXACT // a_bound  # a_bound * (weight mass of a chunk) <= 2**24
        cum = self._cum
        plan, k0 = [], 0
        while k0 < self.k:
            # Weight mass of [k0, k1) for every k1 > k0, maximised over outputs: nondecreasing.
            mass = (cum[k0 + 1:] - cum[k0]).max(axis=1)
            k1 = k0 + int(np.searchsorted(mass, limit, side="right"))
            if k1 - k0 < MIN_F32_CHUNK and k1 < self.k:
                return None
            plan.append((k0, k1))
            k0 = k1
        return plan


def exact_int_gemm(a: np.ndarray, b: np.ndarray, a_bound: int, b_bound: int) -> np.ndarray:
    """wrap32(a @ b) for float arrays holding integers with |a| <= a_bound, |b| <= b_bound.

    ``a`` is (..., R, K), ``b`` is (..., K, M), broadcast as numpy.matmul; returns int32.
    """
    k = a.shape[-1]
    chunk = float32_chunk(a_bound, b_bound)
    if chunk >= k:
        return gemm(a, b).astype(np.int32)
    if chunk >= MIN_F32_CHUNK:
        return _chunked_int32(a, b, [(k0, min(k, k0 + chunk)) for k0 in range(0, k, chunk)])
    return _float64_int32(a, b, k * a_bound * b_bound)


def _chunked_int32(a: np.ndarray, b: np.ndarray, plan: list[tuple[int, int]]) -> np.ndarray:
    """Σ over chunks of int32(a[..., chunk] @ b[..., chunk, :]), each chunk exact in float32.

    Each chunk is exact and <= 2**24 in magnitude, so its int32 conversion is exact; int32
    addition wraps modulo 2**32, which is exactly wrap32 of the full sum.
    """
    acc = np.empty(_out_shape(a, b), dtype=np.int32)
    part = None
    for i, (k0, k1) in enumerate(plan):
        part = np.matmul(a[..., k0:k1], b[..., k0:k1, :], out=part)
        if i == 0:
            np.copyto(acc, part, casting="unsafe")
        else:
            # converted in part's own memory (the next chunk's matmul overwrites all of it):
            # astype would allocate another output-sized array per chunk
            acc += _int32_in_place(part)
    return acc


def _float64_int32(a: np.ndarray, b: np.ndarray, bound: int) -> np.ndarray:
    # float64 sums exactly while the sum of |products| stays <= 2**53.
    if bound > F64_EXACT:
        raise ValueError("reduction too long to accumulate exactly")
    wide = gemm(a.astype(np.float64), b.astype(np.float64))
    # int64 holds the exact sum; the cast to int32 keeps the low 32 bits, which is wrap32.
    return wide.astype(np.int64).astype(np.int32)


def finish_accumulator(acc: np.ndarray, bias: np.ndarray | None, bias_axis_shape: tuple[int, ...],
                       out_dtype: type) -> np.ndarray:
    """Add the int32 bias to an int32 accumulator (wrapping) and convert to ``out_dtype``.

    float32 conversion of int32 rounds to nearest, as the contract's float32(acc) does.
    """
    if bias is not None:
        acc += bias.reshape(bias_axis_shape)
    return acc if out_dtype is np.int32 else acc.astype(np.float32)


# ------------------------------------------------------------------------------------------
# Matrix products
# ------------------------------------------------------------------------------------------

def matmul_accumulate(a: np.ndarray, a_zero_point: np.ndarray, b_centered: np.ndarray,
                      reduction: Reduction, out_dtype: type) -> np.ndarray:
    """(a - a_zero_point) @ b_centered, exact: int32 wrap32 values, or their float32 rounding.

    ``a`` is an 8-bit (..., R, K) array, ``a_zero_point`` broadcastable to it (per tensor or
    per row); ``b_centered`` float32 (..., K, N) with ``reduction`` built from it. With
    ``out_dtype`` float32 the result is float32(wrap32(sum)), ready to requantize in place.
    """
    a_bound = dtype_bound(a.dtype, a_zero_point)
    plan = reduction.chunks(a_bound)
    if plan is None or len(plan) > 1:  # the actual data may allow fewer chunks
        a_bound = value_bound(a, a_zero_point)
        plan = reduction.chunks(a_bound)
    centered = np.subtract(a, a_zero_point, out=_buffer(a.shape), dtype=np.float32)
    if b_centered.ndim == 2 and centered.ndim > 2:
        # One large GEMM instead of one per batch entry: rows of all batches share b.
        rows = centered.reshape(-1, centered.shape[-1])
        shape = (*centered.shape[:-1], b_centered.shape[-1])
    else:
        rows, shape = centered, None
    if plan is None:
        acc = _float64_int32(rows, b_centered, reduction.accumulator_bound(a_bound))
    elif len(plan) == 1:
        # Exact: every value is an integer <= 2**24.
        acc = gemm(rows, b_centered)
        if out_dtype is np.int32:
            acc = _int32_in_place(acc)   # not astype: a second output-sized array
    else:
        acc = _chunked_int32(rows, b_centered, plan)
    if acc.dtype != np.dtype(out_dtype):
        acc = acc.astype(out_dtype)
    return acc if shape is None else acc.reshape(shape)


# ------------------------------------------------------------------------------------------
# Convolution
# ------------------------------------------------------------------------------------------

class ConvKernel:
    """The centered weights of one convolution, pre-transformed for the engine.

    ``w_centered`` is float32 (M, C/group, k1..kn). Kept: the GEMM matrices (group, M/group, K)
    with K ordered (C/group, k1..kn) as the channels-first im2col rows are, the per-tap
    weights of a depthwise convolution, and the ``Reduction`` of the K axis.
    """

    def __init__(self, w_centered: np.ndarray, group: int) -> None:
        m, cg = w_centered.shape[:2]
        self.group = group
        self.out_channels = m
        self.group_out = m // group
        self.group_in = cg
        self.kernel = tuple(w_centered.shape[2:])
        self.taps = math.prod(self.kernel)
        self.kdim = cg * self.taps
        self.matrix = np.ascontiguousarray(w_centered.reshape(group, m // group, self.kdim))
        self.reduction = Reduction(self.matrix.reshape(m, self.kdim))
        # Depthwise: one input channel per group; output channel o reads input channel o // (M/group).
        self.depthwise = cg == 1 and group > 1
        if self.depthwise:
            # (taps, C, M/group): the weight of each tap for every output channel.
            self.tap_weights = np.ascontiguousarray(
                w_centered.reshape(group, m // group, self.taps).transpose(2, 0, 1))
        self._w_centered = w_centered
        self._shift_weights: np.ndarray | None = None
        self._channel_tap_weights: np.ndarray | None = None

    def channel_tap_weights(self) -> np.ndarray:
        """Depthwise with one output per channel: (C, 1, taps), one row of weights per channel."""
        if self._channel_tap_weights is None:
            self._channel_tap_weights = np.ascontiguousarray(
                self.tap_weights.reshape(self.taps, -1).T[:, None, :])
        return self._channel_tap_weights

    def shift_weights(self) -> np.ndarray:
        """(leading taps, M, C * k_last): one GEMM matrix per tap of all axes but the last,
        K ordered (C, k_last) as the last-axis columns of ``_shifted_gemm``."""
        if self._shift_weights is None:
            w = self._w_centered
            m, c, kl = w.shape[0], w.shape[1], w.shape[-1]
            lead = self.taps // kl
            self._shift_weights = np.ascontiguousarray(
                w.reshape(m, c, lead, kl).transpose(2, 0, 1, 3)).reshape(lead, m, c * kl)
        return self._shift_weights


def conv_accumulate(x: np.ndarray, x_zero_point: np.ndarray, kernel: ConvKernel,
                    geom: ConvGeometry, bias: np.ndarray | None, out_dtype: type,
                    bias_bound: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The convolution of (x - x_zero_point) with the kernel, plus bias, exact.

    ``x`` is (N, C, D1..Dn) 8-bit, ``x_zero_point`` per tensor, ``bias`` None or int32 [M]
    (``bias_bound``: max |bias|, if the caller knows it). Padded positions contribute 0, i.e.
    x is padded with x_zero_point. Returns ``(values, pending_bias)``, values (N, M, O1..On):

    - ``out_dtype`` int32: int32 wrap32(acc + bias), pending_bias None;
    - ``out_dtype`` float32: float32(wrap32(acc + bias)), what requantization starts from
      (a temporary the caller may requantize in place). When the
      whole sum is exact in float32 the bias is left to the caller as a float32 ``pending_bias``
      to add block by block during requantization: float32(acc) + float32(B) is then the exact
      integer acc + B. Otherwise pending_bias is None.
    """
    n = x.shape[0]
    m = kernel.out_channels
    out_spatial = geom.out_spatial
    pixels = math.prod(out_spatial)
    a_bound = dtype_bound(x.dtype, x_zero_point)
    plan = kernel.reduction.chunks(a_bound)
    if plan is None or len(plan) > 1:  # the actual data may allow fewer chunks
        a_bound = value_bound(x, x_zero_point)
        plan = kernel.reduction.chunks(a_bound)
    acc_bound = kernel.reduction.accumulator_bound(a_bound)
    if bias is None:
        bias_bound = 0
    elif bias_bound is None:
        bias_bound = int(np.abs(bias.astype(np.int64)).max(initial=0))
    # float32 all the way when one chunk covers K and the bias keeps the sum <= 2**24: then
    # float32(acc) + float32(B) is the exact integer acc + B, which needs no wrap.
    exact_f32 = plan is not None and len(plan) == 1 and acc_bound + bias_bound <= F32_EXACT
    work_dtype = np.float32 if exact_f32 else np.int32
    out = np.empty((n, m, pixels), dtype=work_dtype)
    if out.size and kernel.kdim:
        flat = _FlatLayout.make(geom, kernel, x.shape[1]) if kernel.taps > 1 else None
        if kernel.depthwise and exact_f32:
            if flat is not None and kernel.group_out == 1:
                _depthwise_flat(x, x_zero_point, kernel, geom, flat, out)
            else:
                _depthwise(x, x_zero_point, kernel, geom, out)
        elif (exact_f32 and flat is not None and flat.phases == 1 and kernel.group == 1
              and flat.worth_gemm and kernel.taps > kernel.kernel[-1]):
            _shifted_gemm(x, x_zero_point, kernel, geom, flat, out)
        else:
            _im2col_gemm(x, x_zero_point, kernel, geom, plan, a_bound, out)
    elif out.size:
        out.fill(0)
    out = out.reshape(n, m, *out_spatial)
    bias_shape = (m,) + (1,) * len(out_spatial)
    if exact_f32:
        pending = None if bias is None else bias.astype(np.float32)
        if out_dtype is np.float32:
            return out, pending
        if pending is not None:
            out += pending.reshape(bias_shape)
        return _int32_in_place(out), None
    return finish_accumulator(out, bias, bias_shape, out_dtype), None


_CAST_BLOCK = 1 << 16  # elements converted per step of _int32_in_place (256 KiB)


def _int32_in_place(values: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 array of integers below 2**24 as int32, in its own memory.

    ``values.astype(np.int32)`` would allocate a second array as large as the whole output
    (ConvInteger's output is its accumulator), outside the workspace limit. Same item size, so
    element i of the int32 view sits where element i of the float32 array was: a block is
    read (NumPy copies an overlapping source first: one block, 256 KiB) before it is written,
    and no later block is touched. Exact: every value is an integer float32 represents.
    """
    if not values.flags.c_contiguous or values.dtype != np.float32:   # (every caller's is)
        return values.astype(np.int32)
    src = values.reshape(-1)
    dst = src.view(np.int32)
    for i in range(0, src.size, _CAST_BLOCK):
        dst[i:i + _CAST_BLOCK] = src[i:i + _CAST_BLOCK]
    return dst.reshape(values.shape)


def _pointwise(geom: ConvGeometry, kernel: ConvKernel) -> bool:
    """A 1x1 convolution without padding: the (strided) input is the column matrix."""
    return kernel.taps == 1 and not any(geom.pads_begin) and not any(geom.pads_end)


def _centered_input(x: np.ndarray, zp: np.ndarray, n0: int, n1: int, geom: ConvGeometry,
                    pointwise: bool, buf: np.ndarray | None) -> np.ndarray:
    """float32 x[n0:n1] - zp, zero-padded (channels first); strided directly for 1x1."""
    zp32 = np.float32(int(zp))
    if pointwise:
        src = x[(slice(n0, n1), slice(None), *(slice(None, None, s) for s in geom.strides))]
        if buf is None or buf.shape != src.shape:
            buf = _buffer(src.shape)
        np.subtract(src, zp32, out=buf, casting="unsafe")
        return buf
    shape = (n1 - n0, x.shape[1], *geom.padded_spatial)
    if buf is None or buf.shape != shape:
        # The pads stay 0 (= x_zero_point centered): only the interior is ever written.
        buf = _buffer(shape, zeroed=True)
    interior = tuple(slice(b, b + size) for b, size in zip(geom.pads_begin, geom.in_spatial))
    np.subtract(x[n0:n1], zp32, out=buf[(slice(None), slice(None), *interior)], casting="unsafe")
    return buf


def _windows(xp: np.ndarray, geom: ConvGeometry, group: int) -> np.ndarray:
    """Read-only view (n, group, C/group, k1..kn, O1..On) of the padded input's windows."""
    sn, sc, *ss = xp.strides
    n, c = xp.shape[:2]
    return as_strided(
        xp,
        shape=(n, group, c // group, *geom.kernel, *geom.out_spatial),
        strides=(sn, (c // group) * sc, sc, *(s * d for s, d in zip(ss, geom.dilations)),
                 *(s * st for s, st in zip(ss, geom.strides))),
        writeable=False,
    )


def _tile_plan(n: int, out_spatial: tuple[int, ...], col_bytes_per_pixel: int,
               image_bytes: int) -> tuple[int, int]:
    """(images per tile, first-axis output rows per tile) under the workspace limit."""
    pixels = math.prod(out_spatial)
    slab = math.prod(out_spatial[1:])
    budget = max(1, workspace_limit() - image_bytes)
    max_pixels = max(1, budget // max(1, col_bytes_per_pixel))
    if pixels > max_pixels:
        return 1, max(1, max_pixels // max(1, slab))
    # Small images: several per GEMM, while their columns and padded copies fit.
    per = max(1, min(n, -(-_MIN_TILE_PIXELS // max(1, pixels)),
                     workspace_limit() // max(1, pixels * col_bytes_per_pixel + image_bytes)))
    return per, out_spatial[0]


def _im2col_gemm(x: np.ndarray, zp: np.ndarray, kernel: ConvKernel, geom: ConvGeometry,
                 plan: list[tuple[int, int]] | None, a_bound: int, out: np.ndarray) -> None:
    """out (N, M, P) = W @ im2col(x - zp), tile by tile; float32 out when exact in one chunk."""
    n = x.shape[0]
    group, kdim = kernel.group, kernel.kdim
    out_spatial = geom.out_spatial
    pixels = math.prod(out_spatial)
    slab = math.prod(out_spatial[1:])
    pointwise = _pointwise(geom, kernel)
    image_bytes = 4 * x.shape[1] * (pixels if pointwise else math.prod(geom.padded_spatial))
    col_bytes = 0 if pointwise else 4 * group * kdim
    col_bytes += 8 * kernel.out_channels  # the GEMM result and its int32 copy
    per, rows = _tile_plan(n, out_spatial, col_bytes, image_bytes)
    w = kernel.matrix  # (group, Mg, K)
    xbuf = colbuf = None
    for n0 in range(0, n, per):
        n1 = min(n, n0 + per)
        nt = n1 - n0
        xbuf = _centered_input(x, zp, n0, n1, geom, pointwise, xbuf)
        if not pointwise:
            windows = _windows(xbuf, geom, group)
        for o0 in range(0, out_spatial[0], rows):
            o1 = min(out_spatial[0], o0 + rows)
            tp = (o1 - o0) * slab
            if pointwise:
                # (nt, C, P) → per image (group, Cg, P): the columns themselves.
                cols = xbuf.reshape(nt, group, kdim, pixels)[:, :, :, o0 * slab:o1 * slab]
                if nt == 1:
                    cols = cols[0]
                else:
                    cols = np.moveaxis(cols, 0, 2).reshape(group, kdim, nt * tp)
            else:
                shape = (group, kdim, nt, tp)
                if colbuf is None or colbuf.size < math.prod(shape):
                    colbuf = _buffer((math.prod(shape),))
                cols4 = colbuf[:math.prod(shape)].reshape(shape)
                # (nt, group, Cg, k..., O1 tile, O2...) → (group, Cg, k..., nt, O1 tile, O2...)
                win = windows[(slice(None),) * (2 + 1 + len(geom.kernel)) + (slice(o0, o1),)]
                src = np.moveaxis(win, 0, 2 + len(geom.kernel))
                np.copyto(cols4.reshape(group, kernel.group_in, *geom.kernel, nt, o1 - o0,
                                        *out_spatial[1:]), src)
                cols = cols4.reshape(group, kdim, nt * tp)
            _gemm_into(w, cols, plan, a_bound, kernel, out, n0, nt, o0 * slab, tp)


def _gemm_into(w: np.ndarray, cols: np.ndarray, plan: list[tuple[int, int]] | None,
               a_bound: int, kernel: ConvKernel, out: np.ndarray, n0: int, nt: int,
               p0: int, tp: int) -> None:
    """out[n0:n0+nt, :, p0:p0+tp] = W (group, Mg, K) @ cols (group, K, nt*tp)."""
    group, mg = kernel.group, kernel.group_out
    direct = nt == 1 and out.dtype == np.float32 and plan is not None and len(plan) == 1
    if direct:
        dst = out[n0].reshape(group, mg, -1)[:, :, p0:p0 + tp]
        gemm(w, cols, out=dst)
        return
    if plan is None:
        res = _float64_int32(w, cols, kernel.reduction.accumulator_bound(a_bound))
    elif len(plan) == 1:
        res = gemm(w, cols)
    else:
        res = _chunked_int32(w, cols, plan)
    # res (group, Mg, nt*tp) → out[n0:n0+nt] (nt, M, P) slice
    dst = out[n0:n0 + nt].reshape(nt, group, mg, -1)[:, :, :, p0:p0 + tp]
    np.copyto(dst, np.moveaxis(res.reshape(group, mg, nt, tp), 2, 0), casting="unsafe")


def _depthwise(x: np.ndarray, zp: np.ndarray, kernel: ConvKernel, geom: ConvGeometry,
               out: np.ndarray) -> None:
    """Depthwise convolution as a sum over taps of shifted views times per-channel weights.

    Exact in float32: the caller checked that a_bound * sum over taps of |w| <= 2**24 for
    every output channel (the Reduction's one-chunk condition), which bounds every partial
    sum of the products, in the order they are added here.
    """
    n = x.shape[0]
    group, mg = kernel.group, kernel.group_out
    out_spatial = geom.out_spatial
    image_bytes = 4 * x.shape[1] * math.prod(geom.padded_spatial)
    per, rows = _tile_plan(n, out_spatial, 8 * kernel.out_channels, image_bytes)
    xbuf = None
    tmp = None
    nsp = len(out_spatial)
    for n0 in range(0, n, per):
        n1 = min(n, n0 + per)
        nt = n1 - n0
        xbuf = _centered_input(x, zp, n0, n1, geom, False, xbuf)
        windows = _windows(xbuf, geom, group)  # (nt, group, 1, k..., O...)
        for o0 in range(0, out_spatial[0], rows):
            o1 = min(out_spatial[0], o0 + rows)
            # destination (nt, group, Mg, O1 tile, O2...)
            dst = out[n0:n1].reshape(nt, group, mg, *out_spatial)[
                (slice(None),) * 3 + (slice(o0, o1),)]
            if tmp is None or tmp.shape != dst.shape:
                tmp = _buffer(dst.shape)
            for t, idx in enumerate(np.ndindex(*geom.kernel)):
                # (nt, group, 1, O1 tile, O2...) view: broadcast over the Mg outputs of a group
                src = windows[(slice(None), slice(None), slice(None), *idx, slice(o0, o1))]
                wt = kernel.tap_weights[t].reshape(1, group, mg, *(1,) * nsp)
                if t == 0:
                    np.multiply(src, wt, out=dst)
                else:
                    np.multiply(src, wt, out=tmp)
                    dst += tmp


# ------------------------------------------------------------------------------------------
# Convolutions on the flattened padded input, split into stride phases
# ------------------------------------------------------------------------------------------

class _FlatLayout:
    """A convolution over the flattened padded input, split into stride phases.

    Along an axis with stride s the padded input splits into s phases (positions p, p + s,
    p + 2s, ... for p < s). Output o and kernel tap t (dilation d) read padded position
    o*s + t*d, which is position o + (t*d)//s of phase (t*d) % s. Every phase is laid out
    row-major on one grid of ceil(padded_i / s_i) positions per axis, with element strides
    S, so tap t reads element  o . S + ((t*d)//s) . S  of its phase: one *shift* per tap, a
    contiguous slice, for any stride. Outputs are computed on the grid o . S for o_1 < O_1
    and o_i < grid_i elsewhere; the extra columns are dropped at the end. With stride 1 there
    is one phase, the padded input itself.
    """

    def __init__(self, geom: ConvGeometry, kernel: ConvKernel, channels: int) -> None:
        strides, dilations = geom.strides, geom.dilations
        self.phase_shape = tuple(-(-p // s) for p, s in zip(geom.padded_spatial, strides))
        pitch = [math.prod(self.phase_shape[i + 1:]) for i in range(len(strides))]
        self.phases = math.prod(strides)
        self.total = math.prod(self.phase_shape)
        self.length = geom.out_spatial[0] * pitch[0]  # L: flat outputs per channel
        # (phase, offset) of every tap, in np.ndindex order (the order of the tap weights).
        self.taps = []
        for tap in np.ndindex(*geom.kernel):
            pos = [t * d for t, d in zip(tap, dilations)]
            phase = int(np.ravel_multi_index([q % s for q, s in zip(pos, strides)], strides))
            self.taps.append((phase, sum((q // s) * st for q, s, st in zip(pos, strides, pitch))))
        self.offsets = [off for _, off in self.taps]
        self.buffer = max(self.total, max(self.offsets) + self.length)
        self.grid = (geom.out_spatial[0], *self.phase_shape[1:])
        self.trim = (slice(None), slice(None)) + tuple(slice(0, o) for o in geom.out_spatial[1:])
        waste = self.length / math.prod(geom.out_spatial)
        # Last-axis columns + shifted GEMMs beat full im2col when few extra columns are
        # computed (measured: 3x3 at 56x56, 28x28, 14x14 yes; 7x7 no).
        self.worth_gemm = waste <= 1.2
        kl = geom.kernel[-1]
        self.lead_offsets = self.offsets[::kl]
        self.cols_length = self.length + max(self.lead_offsets)
        self.bytes = 4 * (channels * self.buffer * self.phases + 2 * kernel.out_channels * self.length
                          + channels * kl * self.cols_length)
        # Where x lands in each phase: per axis, x[first::s] fills phase positions from start.
        self._fills = []
        for phase in np.ndindex(*strides):
            src, dst = [], []
            for p, s, b, size in zip(phase, strides, geom.pads_begin, geom.in_spatial):
                first = (p - b) % s  # first x index at a padded position ≡ p (mod s)
                count = len(range(first, size, s))
                start = (first + b - p) // s
                src.append(slice(first, size, s))
                dst.append(slice(start, start + count))
            if all(d.stop > d.start for d in dst):
                self._fills.append((int(np.ravel_multi_index(phase, strides)), tuple(src), tuple(dst)))

    @classmethod
    def make(cls, geom: ConvGeometry, kernel: ConvKernel, channels: int) -> "_FlatLayout | None":
        layout = cls(geom, kernel, channels)
        return layout if layout.bytes <= workspace_limit() else None

    def centered(self, x: np.ndarray, zp: np.ndarray, n: int, geom: ConvGeometry,
                 buf: np.ndarray | None) -> np.ndarray:
        """(phases, C, buffer) float32: image n centered, zero-padded, split into phases and
        flattened, with a zero tail. Positions never written stay 0, the centered value of
        padding."""
        c = x.shape[1]
        if buf is None:
            buf = _buffer((self.phases, c, self.buffer), zeroed=True)
        zp32 = np.float32(int(zp))
        for phase, src, dst in self._fills:
            grid = buf[phase, :, :self.total].reshape(c, *self.phase_shape)
            np.subtract(x[n][(slice(None), *src)], zp32, out=grid[(slice(None), *dst)],
                        casting="unsafe")
        return buf

    def store(self, acc: np.ndarray, out_image: np.ndarray) -> None:
        """Drop the extra columns: acc (M, L) → out_image (M, O1..On)."""
        grid = acc.reshape(acc.shape[0], *self.grid)
        np.copyto(out_image, grid[self.trim])


def _depthwise_flat(x: np.ndarray, zp: np.ndarray, kernel: ConvKernel, geom: ConvGeometry,
                    flat: _FlatLayout, out: np.ndarray) -> None:
    """Depthwise (one output per input channel), any stride, on the flat phase layout: every
    tap reads one contiguous slice per channel. Two methods, exact in float32 for the reason
    given in ``_depthwise``:

    - "taps": Σ over taps of w[c, t] times the shifted slice, two NumPy passes per tap;
    - "gemm": the taps' slices copied into per-channel columns (C, taps, L), then one batched
      matmul (C, 1, taps) @ (C, taps, L): one copy per tap and one BLAS pass instead of a
      multiply and an add per tap.

    Measured on MobileNetV2's 3x3 layers: "gemm" wins on small images (192x28x28: 0.43 ms
    against 0.77 for "taps" and 0.71 for the tap sum in channels-last order; 384x14x14: 0.20
    against 0.40 and 0.35), "taps" on large ones (32x112x112: 0.89 against 1.63), where the
    columns outgrow the caches.
    """
    n, c = x.shape[:2]
    length = flat.length
    method = _DW_METHOD or ("gemm" if length <= _DW_GEMM_MAX_LENGTH else "taps")
    if method == "gemm":
        w = kernel.channel_tap_weights()  # (C, 1, taps)
        cols = _buffer((c, kernel.taps, length))
        acc = _buffer((c, 1, length))
    else:
        w = kernel.tap_weights.reshape(kernel.taps, c, 1)  # (taps, C, 1)
        acc = _buffer((c, length))
        tmp = _buffer((c, length))
    buf = None
    for i in range(n):
        buf = flat.centered(x, zp, i, geom, buf)
        for j, (phase, off) in enumerate(flat.taps):
            src = buf[phase, :, off:off + length]
            if method == "gemm":
                np.copyto(cols[:, j], src)
            elif j == 0:
                np.multiply(src, w[j], out=acc)
            else:
                np.multiply(src, w[j], out=tmp)
                acc += tmp
        if method == "gemm":
            np.matmul(w, cols, out=acc)
        flat.store(acc.reshape(c, length), out[i].reshape(c, *geom.out_spatial))


def _shifted_gemm(x: np.ndarray, zp: np.ndarray, kernel: ConvKernel, geom: ConvGeometry,
                  flat: _FlatLayout, out: np.ndarray) -> None:
    """Stride-1 convolution, group 1: im2col along the last axis only (k_last copies of the
    image instead of k_1 * ... * k_n), then one GEMM per tap of the other axes on a shifted
    slice of those columns, summed in float32.

    Exact: the caller checked that a_bound * (L1 norm of every output's weights over all of
    K) <= 2**24, which bounds every partial sum, across GEMMs as well as within them.
    """
    n, c = x.shape[:2]
    m = kernel.out_channels
    kl = geom.kernel[-1]
    weights = kernel.shift_weights()  # (lead taps, M, C * kl)
    length, cl = flat.length, flat.cols_length
    cols = _buffer((c, kl, cl))
    acc = _buffer((m, length))
    tmp = _buffer((m, length))
    buf = None
    for i in range(n):
        buf = flat.centered(x, zp, i, geom, buf)
        image = buf[0]  # stride 1: one phase
        sc, se = image.strides
        view = as_strided(image, shape=(c, kl, cl), strides=(sc, geom.dilations[-1] * se, se),
                          writeable=False)
        np.copyto(cols, view)
        matrix = cols.reshape(c * kl, cl)
        for j, off in enumerate(flat.lead_offsets):
            if j == 0:
                gemm(weights[j], matrix[:, off:off + length], out=acc)
            else:
                gemm(weights[j], matrix[:, off:off + length], out=tmp)
                acc += tmp
        flat.store(acc, out[i].reshape(m, *geom.out_spatial))

