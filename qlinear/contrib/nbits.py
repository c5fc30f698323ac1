"""com.microsoft MatMulNBits and GatherBlockQuantized: weight-only 2/4/8-bit layers.

MatMulNBits computes Y = A·Wᵀ + bias with W[n, k] = (q[n, k] − zp[n, g(k)])·scale[n, g(k)],
g(k) = k // block_size (or g_idx[k]). Its arithmetic is qlinear's own contract (docs/contract.md,
"MatMulNBits"), the same bits on every CPU, ISA level and thread count:

- float levels (accuracy_level 0-3, and level 4 where onnxruntime's x86-64 build has no int8
  kernel): W in float32 ((q − zp)·s, float32 operations), then per output one float32
  accumulator, starting at −0, advanced by a fused multiply-add for k = 0, 1, ..., K−1 in
  increasing order, then + bias;
- accuracy_level 4 (where that kernel exists): the activations quantized to int8 per row and
  K-block exactly as onnxruntime quantizes them, exact integer block products, the blocks
  combined by fused multiply-adds in increasing block order, then + bias;
- ``mode="exact"``: the defining sum, exact (Python integers), rounded once.

Every float operation here is an element-wise NumPy ufunc (one IEEE operation per element,
correctly rounded on every ISA NumPy's SIMD loops run) or the exact fma of ``_arith``; the
integer block products go through float64 matmul, exact because every partial sum is an
integer below 2**53 whatever order BLAS adds in. So the result does not depend on the CPU,
the BLAS build or the thread count. No float32 copy of the whole weight matrix is made: the
codes are unpacked and dequantized per chunk of output columns.

The sub-byte unpacking below is local to this module (MatMulNBits' block layout is its own);
the types' facts come from the registry, ``qlinear.dtypes``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .. import _native
from .. import _validate as v
from .. import dtypes
from ..dtypes import packing
from ..engines.native.nbits import NativeMatMulNBits

F32 = np.float32
F64 = np.float64
KSTEP = 16
"""k the float levels dequantize at a time (a block size is a multiple of it: one block)."""

MODES = ("contract", "exact")
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_TWO_BIT_INT8_BLOCKS = (32, 64, 128)
# onnxruntime 1.32's int8-activation kernels quantize A in blocks of at most 256 values: with
# weight blocks of 512 or 1024 its output matches the weights re-blocked to 256 (to float
# order, ~2e-7 of the output, 4 and 8 bits) and not the weight-sized activation blocks
# (4e-3 to 1e-2). The contract takes the same activation blocks (docs/nbits.md).
INT8_BLOCK_MAX = 256


def int8_activations(bits: int, block_size: int, zero_point_kind: str, has_g_idx: bool,
                     accuracy_level: int) -> bool:
    """Whether MatMulNBits computes with int8 activations (accuracy_level 4 on a (bits,
    block_size) that onnxruntime 1.32's x86-64 build has a CompInt8 kernel for): 4 and 8 bits at
    every block size, 2 bits at block sizes 32, 64 and 128; never with a float zero point or
    g_idx (onnxruntime computes those in float32). One fixed rule, measured against onnxruntime
    on AVX-512 VNNI and read in MLAS's dispatch tables; it does not look at the CPU in hand."""
    if accuracy_level != 4 or has_g_idx or zero_point_kind == "float":
        return False
    return bits in (4, 8) or (bits == 2 and block_size in _TWO_BIT_INT8_BLOCKS)


# ------------------------------------------------------------------------------------------
# Unpacking
# ------------------------------------------------------------------------------------------

unpack_codes = packing.unpack_last_axis   # one home: qlinear/dtypes/packing.py


# ------------------------------------------------------------------------------------------
# Exact float32 fma on arrays (the float levels' and level 4's accumulation step)
# ------------------------------------------------------------------------------------------

def _fma_into(p: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """float32(p + acc) rounded once, for p an exact float64 product of two float32 values
    (or an integer times a float32, exact in float64) and acc float32: fma(x, y, acc).

    p + acc in float64 may round; rounding that again to float32 is wrong only where the
    float64 sum is a float32 midpoint the exact sum is not on. TwoSum gives the float64
    rounding error e exactly; where e != 0 the sum is moved to its odd neighbour toward the
    exact value (round to odd at 53 bits), and rounding to odd at >= p+2 bits then to nearest
    at p bits is one correct rounding (Boldo-Melquiond 2008; qlinear.contrib._arith.fma).
    Infinite or NaN operands skip the correction (the float64 sum is already the answer)."""
    a = acc.astype(F64)
    s = p + a
    bb = s - p
    e = (p - (s - bb)) + (a - bb)
    fix = (e != 0) & np.isfinite(e) & ((s.view(np.int64) & 1) == 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


# ------------------------------------------------------------------------------------------
# Exact rounding of dyadic rationals (mode="exact")
# ------------------------------------------------------------------------------------------

def _f32_as_int(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite float32/16 values as (int64 significand, int exponent) with x = m·2**e exactly."""
    mant, exp = np.frexp(x.astype(F64))
    m = np.ldexp(mant, 24).astype(np.int64)  # 24 bits hold every float32 and float16 significand
    return m, exp.astype(np.int64) - 24


def _round_dyadic(m: int, e: int, dtype: np.dtype) -> float:
    """m·2**e (Python ints) rounded once to nearest even in ``dtype`` (float32/16), as a float."""
    if m == 0:
        return 0.0
    fi = np.finfo(dtype)
    p = fi.nmant + 1
    sign = -1 if m < 0 else 1
    m = abs(m)
    top = m.bit_length() + e - 1  # floor(log2 |value|)
    q_exp = max(top - (p - 1), fi.minexp - (p - 1))  # exponent of the last significand bit
    shift = q_exp - e
    if shift > 0:
        q, r = divmod(m, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
    else:
        q = m << (-shift)
    if q.bit_length() + q_exp - 1 > fi.maxexp - 1:
        return sign * math.inf
    return sign * math.ldexp(q, q_exp)


# ------------------------------------------------------------------------------------------
# MatMulNBits
# ------------------------------------------------------------------------------------------

def _int_attr(op: str, name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: attribute {name} must be an integer; got {type(value).__name__} {value!r}")
    return int(value)


def _float_param(op: str, name: str, value: Any, dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                 finite: bool = True) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{op}: {name} must be a NumPy array; got {type(value).__name__}")
    arr = v.as_array(op, name, value)
    if arr.dtype != dtype:
        raise TypeError(f"{op}: {name} must have the dtype of A and scales ({dtype}); got dtype {arr.dtype}")
    if arr.shape not in shapes:
        raise ValueError(f"{op}: {name} must have shape {' or '.join(str(s) for s in shapes)}; got shape {arr.shape}")
    if finite and not np.isfinite(arr).all():
        raise ValueError(f"{op}: {name} must be finite; got a NaN or infinite value at flat index "
                         f"{int(np.flatnonzero(~np.isfinite(arr))[0])}")
    return arr.reshape(shapes[0])


class PreparedMatMulNBits:
    """MatMulNBits with its constant inputs (B, scales, zero_points, g_idx, bias) validated and
    unpacked once; ``run(A)`` computes Y. The packed weights are kept as given (uint8), the zero
    points as int16 (or float32) per block; W is dequantized per chunk of columns in ``run``."""

    op = "matmul_nbits"

    def __init__(self, B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None,
                 g_idx: np.ndarray | None = None, bias: np.ndarray | None = None, *, K: int, N: int,
                 bits: int = 4, block_size: int, accuracy_level: int = 0, mode: str = "contract") -> None:
        op = self.op
        self.K, self.N = _int_attr(op, "K", K), _int_attr(op, "N", N)
        if self.K < 1 or self.N < 1:
            raise ValueError(f"{op}: attributes K and N must be >= 1; got K={self.K}, N={self.N}")
        self.bits = _int_attr(op, "bits", bits)
        if self.bits not in (2, 4, 8):
            raise ValueError(f"{op}: attribute bits must be 2, 4 or 8; got {self.bits}")
        bs = self.block_size = _int_attr(op, "block_size", block_size)
        if bs < 16 or bs & (bs - 1):
            raise ValueError(f"{op}: attribute block_size must be a power of two >= 16; got {bs}")
        lvl = self.accuracy_level = _int_attr(op, "accuracy_level", accuracy_level)
        if not 0 <= lvl <= 4:
            raise ValueError(f"{op}: attribute accuracy_level must be 0, 1, 2, 3 or 4; got {lvl}")
        if mode not in MODES:
            raise ValueError(f"{op}: mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
        self.mode = mode
        K, N, nb = self.K, self.N, -(-self.K // bs)
        self.kblocks = nb
        blob = bs * self.bits // 8
        if not isinstance(B, np.ndarray):
            raise TypeError(f"{op}: B must be a NumPy uint8 array; got {type(B).__name__}")
        b = v.as_array(op, "B", B)
        if b.dtype != np.uint8:
            raise TypeError(f"{op}: B must have dtype uint8 (packed codes); got dtype {b.dtype}")
        if b.shape != (N, nb, blob):
            raise ValueError(f"{op}: B must have shape [N, ceil(K / block_size), block_size * bits / 8] = "
                             f"{(N, nb, blob)} for K={K}, N={N}, bits={self.bits}, block_size={bs}; "
                             f"got shape {b.shape}")
        self._b = b
        if not isinstance(scales, np.ndarray):
            raise TypeError(f"{op}: scales must be a NumPy float32 or float16 array; got {type(scales).__name__}")
        sdt = v.as_array(op, "scales", scales).dtype
        if sdt not in _FLOATS:
            raise TypeError(f"{op}: scales must have dtype float32 or float16 (A's dtype); got dtype {sdt}")
        self.dtype = sdt
        s = _float_param(op, "scales", scales, sdt, ((N, nb), (N * nb,)))
        self._scales = s.astype(F32)  # exact for float16
        self.zero_point_kind = "none"
        self._zp = np.full((N, nb), 1 << (self.bits - 1), np.int16)
        if zero_points is not None:
            if not isinstance(zero_points, np.ndarray):
                raise TypeError(f"{op}: zero_points must be a NumPy array; got {type(zero_points).__name__}")
            zdt = v.as_array(op, "zero_points", zero_points).dtype
            if zdt == np.uint8:
                zbytes = -(-nb * self.bits // 8)
                z = v.as_array(op, "zero_points", zero_points)
                if z.shape not in ((N, zbytes), (N * zbytes,)):
                    raise ValueError(f"{op}: packed uint8 zero_points must have shape [N, ceil(kblocks * bits / 8)] = "
                                     f"{(N, zbytes)} (or {(N * zbytes,)}); got shape {z.shape}")
                self._zp = unpack_codes(z.reshape(N, zbytes), self.bits, nb).astype(np.int16)
                self.zero_point_kind = "uint8"
            elif zdt in _FLOATS:
                if self.bits == 8:
                    raise TypeError(f"{op}: zero_points of a float dtype are not allowed with bits=8 "
                                    f"(onnxruntime refuses them); got dtype {zdt}")
                if zdt != sdt:
                    raise TypeError(f"{op}: float zero_points must have the dtype of scales ({sdt}); got dtype {zdt}")
                self._zp = _float_param(op, "zero_points", zero_points, sdt, ((N, nb), (N * nb,))).astype(F32)
                self.zero_point_kind = "float"
            else:
                raise TypeError(f"{op}: zero_points must be packed uint8 or A's float dtype; got dtype {zdt}")
        self._g = None
        if g_idx is not None:
            if not isinstance(g_idx, np.ndarray):
                raise TypeError(f"{op}: g_idx must be a NumPy int32 array; got {type(g_idx).__name__}")
            g = v.as_array(op, "g_idx", g_idx)
            if g.dtype != np.int32:
                raise TypeError(f"{op}: g_idx must have dtype int32; got dtype {g.dtype}")
            if g.shape != (K,):
                raise ValueError(f"{op}: g_idx must have shape [K] = ({K},); got shape {g.shape}")
            bad = (g < 0) | (g >= nb)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"{op}: g_idx values must be block indices in [0, {nb}); got {int(g[i])} at index {i}")
            self._g = g.astype(np.intp)
        self._bias = None
        if bias is not None:
            self._bias = _float_param(op, "bias", bias, sdt, ((N,),), finite=False).astype(F32)
        self.int8 = int8_activations(self.bits, bs, self.zero_point_kind, self._g is not None, lvl)
        if self.int8 and bs > INT8_BLOCK_MAX:
            self._reblock(INT8_BLOCK_MAX)
            bs = self.block_size
        # the native kernels' layouts, made once (the same bits as the NumPy code below)
        self._native = None
        if _native.available() and mode == "contract" and bs <= 1 << 16:  # the kernels' int32 block sums
            self._native = NativeMatMulNBits(self._b, self._scales, self._zp, self.zero_point_kind != "none", self._g,
                                             self._bias, K=K, N=N, bits=self.bits, block_size=bs, int8=self.int8)

    # -- helpers ----------------------------------------------------------------------------

    def _reblock(self, ab: int) -> None:
        """Split every weight block into blocks of ``ab`` codes, the scale and zero point
        repeated: the same dequantized weights, so only the activation blocks change. Packed
        codes are contiguous within a block (code j in byte j·bits/8), so each sub-block is a
        contiguous byte run; sub-blocks wholly past K are dropped (they hold padding only)."""
        N, K, r = self.N, self.K, self.block_size // ab
        nb2 = -(-K // ab)
        self._b = np.ascontiguousarray(self._b.reshape(N, self.kblocks * r, ab * self.bits // 8)[:, :nb2])
        self._scales = np.ascontiguousarray(np.repeat(self._scales, r, axis=1)[:, :nb2])
        self._zp = np.ascontiguousarray(np.repeat(self._zp, r, axis=1)[:, :nb2])
        self.block_size, self.kblocks = ab, nb2

    def _codes(self, n0: int, n1: int) -> np.ndarray:
        """q[n0:n1, :K] as uint8 (unpacked from the packed blocks of those columns)."""
        rows = self._b[n0:n1].reshape(n1 - n0, -1)
        return unpack_codes(rows, self.bits, self.kblocks * self.block_size)[:, :self.K]

    def _block_of_k(self) -> np.ndarray:
        return self._g if self._g is not None else np.arange(self.K) // self.block_size

    def _chunk(self, per_column: int) -> int:
        """Columns a chunk takes: its working arrays (about ``per_column`` elements a column,
        up to 8 bytes each, a few at a time) stay within ~1/256 of the float32 weight size
        (32k elements at least), so the peak above the inputs, the packed weights and the
        output is a few percent of a float32 copy of W."""
        budget = max(1 << 15, self.N * self.K // 256)
        return max(1, min(self.N, budget // max(1, per_column)))

    # -- the modes --------------------------------------------------------------------------

    def _weights_slice(self, n0: int, n1: int, k: int, count: int) -> np.ndarray:
        """W[n0:n1, k:k+count] in float32 (count <= 16, k a multiple of 16: inside one block,
        since block sizes are multiples of 16), unpacked from those columns' bytes only."""
        bits, bs = self.bits, self.block_size
        off = (k % bs) * bits // 8
        raw = self._b[n0:n1, k // bs, off:off + KSTEP * bits // 8]
        q = unpack_codes(raw, bits, count)
        if self._g is None:
            zp = self._zp[n0:n1, k // bs][:, None]
            s = self._scales[n0:n1, k // bs][:, None]
        else:
            gk = self._g[k:k + count]
            zp = self._zp[n0:n1][:, gk]
            s = self._scales[n0:n1][:, gk]
        if self.zero_point_kind == "float":
            d = q.astype(F32) - zp
        else:
            d = (q.astype(np.int16) - zp).astype(F32)
        return d * s

    def _float_levels(self, a: np.ndarray) -> np.ndarray:
        m, K = a.shape
        y = np.empty((m, self.N), F32)
        step = self._chunk(m * 8)
        for n0 in range(0, self.N, step):
            n1 = min(self.N, n0 + step)
            acc = np.full((m, n1 - n0), -0.0, F32)  # -0.0: the exact identity of addition
            for k in range(0, K, KSTEP):
                count = min(KSTEP, K - k)
                w = self._weights_slice(n0, n1, k, count).astype(F64)
                a64 = a[:, k:k + count].astype(F64)
                for i in range(count):  # one accumulator per output, k in increasing order
                    acc = _fma_into(a64[:, i, None] * w[None, :, i], acc)  # exact: 24 x 24 bits
            y[:, n0:n1] = acc
        return y

    def _quantize_a(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """onnxruntime's CompInt8 activation quantization: per row and K-block, amax = max |a|,
        s_a = f(amax / 127), inverse = f(127 / amax) (0 when amax is 0), code = rne(f(a · inverse))
        in int8, zeros padding the last block. Returns (codes [kblocks, M, B] int8, s_a
        [kblocks, M] float32, bad [M]: rows holding NaN or ±inf)."""
        m, K = a.shape
        bs, nb = self.block_size, self.kblocks
        bad = ~np.isfinite(a).all(axis=1)
        codes = np.zeros((nb, m, bs), np.int8)
        sa = np.empty((nb, m), F32)
        for b in range(nb):
            ab = a[:, b * bs:(b + 1) * bs]
            ab = np.where(bad[:, None], F32(0), ab)  # such rows give NaN (below); codes unused
            amax = np.abs(ab).max(axis=1)  # a max is exact in any order
            sa[b] = amax / F32(127)
            with np.errstate(divide="ignore", over="ignore"):
                inv = np.where(amax != 0, F32(127) / np.where(amax != 0, amax, F32(1)), F32(0)).astype(F32)
            c = np.rint(ab * inv[:, None])
            # 127 / amax overflows for amax < 127 / FLT_MAX: a · inf is ±inf (NaN for 0), which
            # cvtps2dq turns into INT_MIN and AVX-512's vpmovdb truncates to 0 (AVX2's
            # saturating packs give -128 there: onnxruntime differs from itself; qlinear takes 0).
            # Otherwise |a · inv| <= 127·(1 + 2**-23): the code fits int8.
            c[~np.isfinite(c)] = 0
            codes[b, :, :c.shape[1]] = c
        return codes, sa, bad

    def _int8_level(self, a: np.ndarray) -> np.ndarray:
        m, K = a.shape
        bs, nb, bits = self.block_size, self.kblocks, self.bits
        codes, sa, bad = self._quantize_a(a)
        # The block products are integer sums computed by a float matmul: exact in any order
        # (FMA or not, any BLAS blocking or thread count) while every partial sum is an integer
        # the float type holds: |Σ| <= B · 128 · max|q - zp| must stay below 2**24 for float32
        # (B <= 512 at 8 bits, B <= 8192 at 4 bits), else float64 (2**53).
        maxw = 255 if self.zero_point_kind == "uint8" else (1 << (bits - 1))
        ft = F32 if bs * 128 * maxw < (1 << 24) else F64
        y = np.empty((m, self.N), F32)
        step = self._chunk(bs * 12 + m * 24)
        for n0 in range(0, self.N, step):
            n1 = min(self.N, n0 + step)
            acc = np.full((m, n1 - n0), -0.0, F32)
            for b in range(nb):
                q = unpack_codes(self._b[n0:n1, b], bits, bs)
                # codes past K (padding) meet A's zero codes: they add 0
                d = (q.astype(np.int16) - self._zp[n0:n1, b][:, None]).astype(ft)
                dots = np.matmul(codes[b].astype(ft), d.T)  # [M, ncols], exact integers
                s = sa[b][:, None] * self._scales[n0:n1, b][None, :]  # f(s_a · s_b)
                # f32(d) (rne), then fma(f32(d), f(s_a · s_b), acc); the float64 product of two
                # float32 values is exact
                acc = _fma_into(dots.astype(F32).astype(F64) * s.astype(F64), acc)
            y[:, n0:n1] = acc
        y[bad] = np.nan
        return y

    def _exact(self, a: np.ndarray) -> np.ndarray:
        """Σ_k a·(q − zp)·s + bias, exact (Python integers), rounded once to A's dtype."""
        m, K = a.shape
        N = self.N
        out = np.empty((m, N), F64)
        g = self._block_of_k()
        fin = np.isfinite(a)
        am, ae = _f32_as_int(np.where(fin, a, 0))
        sm, se = _f32_as_int(self._scales)
        float_zp = self.zero_point_kind == "float"
        if float_zp:
            # zp = zm·2**ze; an integral zp (ze >= 0) is taken as the integer zm·2**ze, exponent 0
            zm, ze = _f32_as_int(self._zp)
        if self._bias is not None:
            bm, be = _f32_as_int(np.where(np.isfinite(self._bias), self._bias, 0))
        for n in range(N):
            q = self._codes(n, n + 1)[0].astype(np.int64)
            terms_by_block = {}
            for blk in np.unique(g):
                ks = np.flatnonzero(g == blk)
                if float_zp:
                    zb, zexp = int(zm[n, blk]), int(ze[n, blk])
                    if zexp >= 0:
                        zb, zexp = zb << zexp, 0
                    wint = [(int(q[k]) << -zexp) - zb for k in ks]
                else:
                    zexp = 0
                    wint = [int(q[k]) - int(self._zp[n, blk]) for k in ks]
                terms_by_block[blk] = (ks, wint, zexp + int(se[n, blk]), int(sm[n, blk]))
            for i in range(m):
                parts = []  # (integer, exponent)
                for blk, (ks, wint, wexp, smant) in terms_by_block.items():
                    es = [int(ae[i, k]) for k in ks]
                    e0 = min(es)
                    tot = sum(int(am[i, k]) * wk << (ek - e0) for k, wk, ek in zip(ks, wint, es))
                    parts.append((tot * smant, e0 + wexp))
                if self._bias is not None:
                    parts.append((int(bm[n]), int(be[n])))
                e0 = min(e for _, e in parts)
                total = sum(x << (e - e0) for x, e in parts)
                out[i, n] = _round_dyadic(total, e0, self.dtype)
        # non-finite A or bias: the IEEE value of the sum (NaN, or the infinity every infinite
        # term agrees on), which float64 arithmetic gives here (finite terms cannot overflow it)
        special = ~fin.all(axis=1)[:, None] | (np.zeros((1, N), bool) if self._bias is None
                                               else ~np.isfinite(self._bias)[None, :])
        if special.any():
            rows = np.flatnonzero(special.any(axis=1))
            for n0 in range(0, N, 256):
                n1 = min(N, n0 + 256)
                w = self._weights_exact_f64(n0, n1)
                with np.errstate(invalid="ignore", over="ignore"):
                    ys = a[rows].astype(F64) @ w.T
                    if self._bias is not None:
                        ys = ys + self._bias[n0:n1].astype(F64)
                out[rows, n0:n1] = np.where(special[rows, n0:n1], ys, out[rows, n0:n1])
        return out

    def _weights_exact_f64(self, n0: int, n1: int) -> np.ndarray:
        g = self._block_of_k()
        q = self._codes(n0, n1).astype(F64)
        return (q - self._zp[n0:n1][:, g].astype(F64)) * self._scales[n0:n1][:, g].astype(F64)

    # -- public -----------------------------------------------------------------------------

    def run(self, A: np.ndarray) -> np.ndarray:
        """Y = A·Wᵀ + bias for A of shape (..., K) and the prepared dtype; Y has shape (..., N)."""
        op = self.op
        if not isinstance(A, np.ndarray):
            raise TypeError(f"{op}: A must be a NumPy {self.dtype} array; got {type(A).__name__}")
        a = v.as_array(op, "A", A)
        if a.dtype != self.dtype:
            raise TypeError(f"{op}: A must have the dtype of scales ({self.dtype}); got dtype {a.dtype}")
        if a.ndim < 1 or a.shape[-1] != self.K:
            raise ValueError(f"{op}: A must have shape (..., K) with K={self.K}; got shape {a.shape}")
        lead = a.shape[:-1]
        v.check_size(op, "the output", lead + (self.N,), max(4, a.dtype.itemsize))
        a2 = a.reshape(-1, self.K).astype(F32, copy=False)
        if a2.shape[0] == 0:
            return np.zeros(lead + (self.N,), self.dtype)
        with np.errstate(all="ignore"):
            if self.mode == "exact":
                y = self._exact(a2)
                return y.astype(self.dtype).reshape(lead + (self.N,))  # exact: already representable
            C = _native.native()
            if C is not None and self._native is not None:
                y = self._native.run(C, a2)  # bias included
                return y.astype(self.dtype, copy=False).reshape(lead + (self.N,))
            y = self._int8_level(a2) if self.int8 else self._float_levels(a2)
            if self._bias is not None:
                np.add(y, self._bias, out=y)  # one float32 addition, in place (no second output)
            return y.astype(self.dtype, copy=False).reshape(lead + (self.N,))


def prepare_matmul_nbits(B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None,
                         g_idx: np.ndarray | None = None, bias: np.ndarray | None = None, *, K: int, N: int,
                         bits: int = 4, block_size: int, accuracy_level: int = 0,
                         mode: str = "contract") -> PreparedMatMulNBits:
    """Validate and keep MatMulNBits' constant inputs once for repeated ``run(A)`` calls."""
    return PreparedMatMulNBits(B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits, block_size=block_size,
                               accuracy_level=accuracy_level, mode=mode)


def matmul_nbits(A: np.ndarray, B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None,
                 g_idx: np.ndarray | None = None, bias: np.ndarray | None = None, *, K: int, N: int,
                 bits: int = 4, block_size: int, accuracy_level: int = 0, mode: str = "contract") -> np.ndarray:
    """com.microsoft MatMulNBits: Y = A·Wᵀ + bias, W[n, k] = (q − zp)·scale of k's block.

    A: float32 or float16 (..., K). B: uint8 [N, ceil(K/block_size), block_size·bits/8], element j
    of a block in byte j·bits/8, low bits first. scales: A's dtype, [N, kblocks]. zero_points:
    absent (2**(bits-1)), packed uint8 [N, ceil(kblocks·bits/8)], or A's float dtype [N, kblocks]
    (not with bits=8). g_idx: int32 [K], the block of each k. bias: A's dtype [N].
    ``mode="contract"`` computes docs/contract.md's arithmetic for the accuracy level (the same
    bits everywhere); ``mode="exact"`` the exact sum rounded once (for diagnosis).
    """
    op = PreparedMatMulNBits.op
    if not isinstance(A, np.ndarray):
        raise TypeError(f"{op}: A must be a NumPy float32 or float16 array; got {type(A).__name__}")
    A = v.as_array(op, "A", A)  # native byte order
    if A.dtype not in _FLOATS:
        raise TypeError(f"{op}: A must have dtype float32 or float16; got dtype {A.dtype}")
    if isinstance(scales, np.ndarray) and scales.dtype.newbyteorder("=") != A.dtype:
        raise TypeError(f"{op}: scales must have A's dtype ({A.dtype}); got dtype {scales.dtype}")
    return PreparedMatMulNBits(B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits, block_size=block_size,
                               accuracy_level=accuracy_level, mode=mode).run(A)


# ------------------------------------------------------------------------------------------
# GatherBlockQuantized
# ------------------------------------------------------------------------------------------

# the types GatherBlockQuantized takes, from the registry (qlinear.dtypes)
_INT4_DATA = (dtypes.get("int4").dtype, dtypes.get("uint4").dtype)
#: float8 e4m3fn, e4m3fnuz, e5m2, e5m2fnuz and float4e2m1
_FLOAT_DATA = tuple(t.dtype for t in dtypes.TYPES if t.is_float and t.bits in (8, 4))
_OUT_DTYPES = (dtypes.F32.dtype, dtypes.F16.dtype, dtypes.BF16.dtype)


def gather_block_quantized(data: np.ndarray, indices: np.ndarray, scales: np.ndarray,
                           zero_points: np.ndarray | None = None, *, bits: int = 4, block_size: int = 128,
                           gather_axis: int = 0, quantize_axis: int = 1) -> np.ndarray:
    """com.microsoft GatherBlockQuantized: Gather along ``gather_axis``, then
    out = f32(q − zp)·f32(scale of q's block along ``quantize_axis``), rounded once to the
    scales' dtype (float32, float16 or bfloat16).

    data: ml_dtypes int4/uint4 (one element per byte; default zp 0); uint8 with ``bits`` 2/4/8
    (bits < 8: packed along the last axis, low bits first; gather_axis must be 0 and differ
    from quantize_axis; default zp 2**(bits-1); zero_points packed the same way); or a float8 /
    float4e2m1 dtype (no zero_points; ``block_size`` 0 makes the whole axis one block; scale
    dimensions of 1 broadcast). Indices (int32/int64, any shape) in [-s, s) select along the
    axis (negative ones wrap); any other index gives a slice of zeros, as onnxruntime does.
    """
    op = "gather_block_quantized"
    for name, val in (("data", data), ("indices", indices), ("scales", scales)):
        if not isinstance(val, np.ndarray):
            raise TypeError(f"{op}: {name} must be a NumPy array; got {type(val).__name__}")
    d = v.as_array(op, "data", data)
    ind = v.as_array(op, "indices", indices)
    sc = v.as_array(op, "scales", scales)
    bits = _int_attr(op, "bits", bits)
    bs = _int_attr(op, "block_size", block_size)
    int4s, floats = _INT4_DATA, _FLOAT_DATA
    is_float = d.dtype in floats
    if d.dtype not in int4s + floats + (np.dtype(np.uint8),):
        raise TypeError(f"{op}: data must be int4, uint4 (ml_dtypes), uint8 or a float8/float4e2m1 dtype; "
                        f"got dtype {d.dtype}")
    if ind.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{op}: indices must have dtype int32 or int64; got dtype {ind.dtype}")
    if sc.dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: scales must have dtype float32, float16 or bfloat16; got dtype {sc.dtype}")
    if d.ndim < 1:
        raise ValueError(f"{op}: data must have rank >= 1; got shape {d.shape}")
    r = d.ndim
    ga = v.axis_attribute(op, gather_axis, r)
    qa = v.axis_attribute(op, quantize_axis, r)
    if not (bs == 0 and is_float) and (bs < 16 or bs & (bs - 1)):
        raise ValueError(f"{op}: attribute block_size must be a power of two >= 16"
                         f"{' (or 0)' if is_float else ''}; got {bs}")
    per = 1
    if d.dtype == np.uint8:
        if bits not in (2, 4, 8):
            raise ValueError(f"{op}: attribute bits must be 2, 4 or 8 for uint8 data; got {bits}")
        if ga != 0:
            raise ValueError(f"{op}: uint8 data needs gather_axis 0; got gather_axis={gather_axis}")
        per = 8 // bits
        if per > 1 and qa == ga:
            raise ValueError(f"{op}: packed uint8 data (bits={bits}) needs quantize_axis different from gather_axis; "
                             f"got both {ga}")
    elif not is_float and bits != 4:
        raise ValueError(f"{op}: attribute bits must be 4 for {d.dtype} data; got {bits}")
    shape = d.shape[:-1] + (d.shape[-1] * per,)  # the logical (unpacked) shape
    D = shape[qa]
    nblk = 1 if bs == 0 else -(-D // bs)
    blk = D if bs == 0 else bs
    if sc.ndim != r:
        raise ValueError(f"{op}: scales must have data's rank {r}; got shape {sc.shape}")
    for ax in range(r):
        want = nblk if ax == qa else shape[ax]
        if sc.shape[ax] != want and not (is_float and ax != qa and sc.shape[ax] == 1):
            raise ValueError(f"{op}: scales must have shape {tuple(nblk if i == qa else shape[i] for i in range(r))} "
                             f"(ceil({D} / block_size {bs}) along quantize_axis {qa}"
                             f"{'; 1 broadcasts on other axes' if is_float else ''}); got shape {sc.shape}")
    zp = None
    if zero_points is not None:
        if is_float:
            raise TypeError(f"{op}: zero_points must not be given with {d.dtype} data")
        if not isinstance(zero_points, np.ndarray):
            raise TypeError(f"{op}: zero_points must be a NumPy array; got {type(zero_points).__name__}")
        z = v.as_array(op, "zero_points", zero_points)
        if z.dtype != d.dtype:
            raise TypeError(f"{op}: zero_points must have data's dtype ({d.dtype}); got dtype {z.dtype}")
        zshape = sc.shape[:-1] + (-(-sc.shape[-1] // per),)
        if z.shape != zshape:
            raise ValueError(f"{op}: zero_points must have shape {zshape} (the scales' shape"
                             f"{', packed along the last axis' if per > 1 else ''}); got shape {z.shape}")
        zp = unpack_codes(z, bits, sc.shape[-1]) if per > 1 else z
        zp = zp.astype(np.int16)
    elif not is_float:
        zp = np.full((1,) * r, (1 << (bits - 1)) if d.dtype == np.uint8 else 0, np.int16)
    out_shape = shape[:ga] + ind.shape + shape[ga + 1:]
    v.check_size(op, "the output", out_shape, 4)
    s = shape[ga]
    idx = ind.astype(np.int64)
    valid = (idx >= -s) & (idx < s)
    idx = np.where(valid, np.where(idx < 0, idx + s, idx), 0)
    g = np.take(d, idx, axis=ga)
    if per > 1:
        g = unpack_codes(g, bits, shape[-1])
    if is_float:
        vals = g.astype(F32)  # every float8/float4 value is exact in float32
    else:
        vals = g.astype(np.int16)
    qa_out = qa if qa < ga else qa + ind.ndim - 1 if qa > ga else None

    def expand(p: np.ndarray) -> np.ndarray:
        """a [..scales-shaped..] parameter taken to the output's coordinates (broadcastable)."""
        if qa_out is None:  # quantize along the gathered axis: the block of the index
            return np.take(p, idx // blk if p.shape[ga] > 1 else np.zeros_like(idx), axis=ga)
        p = np.take(p, idx if p.shape[ga] > 1 else np.zeros_like(idx), axis=ga)
        if p.shape[qa_out] > 1 or D == 1:
            p = np.repeat(p, blk, axis=qa_out)
            p = np.take(p, np.arange(D), axis=qa_out)
        return p

    sg = expand(sc).astype(F32)  # exact: float16/bfloat16 widen exactly
    if zp is not None:
        diff = (vals - expand(zp)).astype(F32)  # |q − zp| <= 255: exact
    else:
        diff = vals
    with np.errstate(all="ignore"):
        out = diff * sg
    out = np.broadcast_to(out, out_shape)
    mask = np.reshape(valid, (1,) * ga + ind.shape + (1,) * (r - ga - 1))
    out = np.where(mask, out, F32(0))
    return out.astype(sc.dtype)
