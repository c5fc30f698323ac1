"""Oracle for MatMulNBits and GatherBlockQuantized, written plainly from the operator
definitions and docs/contract.md: explicit loops over bytes, bits, blocks and k, exact
rational arithmetic (fractions.Fraction) and one explicit rounding function. Slow on purpose;
shares no code with qlinear.contrib.nbits."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32

# target formats: (significand bits incl. the hidden one, smallest normal exponent, largest exponent)
FORMATS = {np.dtype(np.float32): (24, -126, 127), np.dtype(np.float16): (11, -14, 15)}


def round_fraction(x: Fraction, dtype, negative_zero: bool = False) -> float:
    """x rounded once to nearest, ties to even, in dtype (float32 or float16), as a Python
    float. Overflow past the largest finite value's rounding boundary gives ±inf; a result
    that rounds to zero keeps x's sign (``negative_zero`` gives the sign of an exact 0)."""
    p, emin, emax = FORMATS[np.dtype(dtype)]
    if x == 0:
        return -0.0 if negative_zero else 0.0
    sign = -1 if x < 0 else 1
    ax = abs(x)
    e = ax.numerator.bit_length() - ax.denominator.bit_length()  # 2**e <= ax < 2**(e+2)
    while Fraction(2) ** e > ax:
        e -= 1
    while Fraction(2) ** (e + 1) <= ax:
        e += 1
    e = max(e, emin)  # subnormals share the smallest normal exponent
    ulp = Fraction(2) ** (e - p + 1)
    q = ax / ulp
    n = math.floor(q)
    rem = q - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    value = n * ulp
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if value > largest:
        return sign * math.inf
    if value == 0:
        return -0.0 if sign < 0 else 0.0
    return sign * float(value)  # exact: value has at most p significant bits


def fma(a: float, b: float, c: float) -> float:
    """float32 a·b + c rounded once (a, b, c float32 values given as Python floats)."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return float(F32(a * b + c))  # inf/NaN: IEEE rules give the same value in any precision
    prod = Fraction(a) * Fraction(b)
    if prod == 0:
        prod_negative = (math.copysign(1, a) * math.copysign(1, b)) < 0
        if c == 0:
            return -0.0 if (prod_negative and math.copysign(1, c) < 0) else 0.0
        return c
    total = prod + Fraction(c)
    return round_fraction(total, F32)  # an exact zero of nonzero terms is +0


def add32(a: float, b: float) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        return float(F32(a) + F32(b))


def unpack(byte_rows, bits: int, count: int) -> list[int]:
    """Element j of a byte string sits in byte j*bits//8 at bits (j % (8//bits))*bits."""
    per = 8 // bits
    out = []
    for j in range(count):
        byte = int(byte_rows[j * bits // 8])
        out.append((byte >> ((j % per) * bits)) & ((1 << bits) - 1))
    return out


class Weights:
    """MatMulNBits' constant inputs read element by element."""

    def __init__(self, B, scales, zero_points, g_idx, *, K, N, bits, block_size):
        self.K, self.N, self.bits, self.bs = K, N, bits, block_size
        nb = -(-K // block_size)
        self.nb = nb
        self.q = []
        for n in range(N):
            row = []
            for blk in range(nb):
                row += unpack(B[n, blk], bits, block_size)
            self.q.append(row[:K])
        s = np.asarray(scales).reshape(N, nb)
        self.s = [[float(s[n, b]) for b in range(nb)] for n in range(N)]
        self.float_zp = zero_points is not None and zero_points.dtype != np.uint8
        if zero_points is None:
            self.zp = [[1 << (bits - 1)] * nb for _ in range(N)]
        elif self.float_zp:
            z = np.asarray(zero_points).reshape(N, nb)
            self.zp = [[float(z[n, b]) for b in range(nb)] for n in range(N)]
        else:
            z = np.asarray(zero_points).reshape(N, -1)
            self.zp = [unpack(z[n], bits, nb) for n in range(N)]
        self.block = [int(g_idx[k]) if g_idx is not None else k // block_size for k in range(K)]

    def w32(self, n: int, k: int) -> float:
        """f((q − zp)·s): q − zp exact for integer zp, one float32 subtraction for a float zp."""
        b = self.block[k]
        if self.float_zp:
            d = F32(self.q[n][k]) - F32(self.zp[n][b])
        else:
            d = F32(self.q[n][k] - self.zp[n][b])
        return float(d * F32(self.s[n][b]))

    def w_exact(self, n: int, k: int) -> Fraction:
        b = self.block[k]
        return (Fraction(self.q[n][k]) - Fraction(self.zp[n][b])) * Fraction(self.s[n][b])


def matmul_nbits_float(A, W: Weights, bias) -> np.ndarray:
    """The float levels: per output one float32 accumulator starts at -0 and takes
    fma(a_k, w_k, acc) for k = 0, 1, ..., K-1 in that order; then + bias (float32)."""
    A = np.asarray(A, F32)
    M = A.shape[0]
    y = np.zeros((M, W.N), F32)
    for m in range(M):
        for n in range(W.N):
            acc = -0.0
            for k in range(W.K):
                acc = fma(float(A[m, k]), W.w32(n, k), acc)
            if bias is not None:
                acc = add32(acc, float(bias[n]))
            y[m, n] = acc
    return y


def quantize_row_blocks(a_row, K: int, bs: int):
    """onnxruntime's CompInt8 activation quantization of one row, written as a loop: per block,
    amax = max |a|, s = f(amax / 127), inv = f(127 / amax) (0 if amax == 0), code =
    rne(f(a·inv)); an infinite product (inv overflowed) gives code 0 (AVX-512 truncation)."""
    codes, scales = [], []
    for start in range(0, K, bs):
        vals = [F32(a_row[k]) for k in range(start, min(K, start + bs))]
        amax = F32(0)
        for x in vals:
            if abs(x) > amax:
                amax = abs(x)
        s = F32(amax / F32(127))
        with np.errstate(over="ignore", divide="ignore"):
            inv = F32(F32(127) / amax) if amax != 0 else F32(0)
        block = []
        for x in vals:
            with np.errstate(over="ignore", invalid="ignore"):
                t = F32(x * inv)
            if not math.isfinite(float(t)):
                block.append(0)
                continue
            r = round(Fraction(float(t)))  # Python's round of a Fraction: half to even
            block.append(int(r))
        block += [0] * (bs - len(vals))
        codes.append(block)
        scales.append(s)
    return codes, scales


def matmul_nbits_int8(A, W: Weights, bias) -> np.ndarray:
    """accuracy_level 4: the activations are quantized in blocks of ab = min(block_size, 256)
    (onnxruntime's int8 kernels never take a longer block: measured, see docs/nbits.md);
    d_j = Σ code_a·(q − zp) exactly per activation block j; acc starts at -0 and takes
    fma(f32(d_j), f(s_a[j]·s_b[block of j]), acc) for j = 0, 1, ...; then + bias. A row holding
    NaN or ±inf gives NaN."""
    A = np.asarray(A, F32)
    M = A.shape[0]
    y = np.zeros((M, W.N), F32)
    for m in range(M):
        if not all(math.isfinite(float(x)) for x in A[m]):
            y[m, :] = np.nan
            continue
        ab = min(W.bs, 256)
        codes, sa = quantize_row_blocks(A[m], W.K, ab)
        for n in range(W.N):
            acc = -0.0
            for j in range(len(codes)):
                b = j * ab // W.bs  # the weights' block holding activation block j
                d = 0
                for i in range(ab):
                    k = j * ab + i
                    if k < W.K:
                        d += codes[j][i] * (W.q[n][k] - W.zp[n][b])
                d32 = round_fraction(Fraction(d), F32)
                sab = float(F32(sa[j]) * F32(W.s[n][b]))
                acc = fma(d32, sab, acc)
            if bias is not None:
                acc = add32(acc, float(bias[n]))
            y[m, n] = acc
    return y


def matmul_nbits_exact(A, W: Weights, bias, dtype) -> np.ndarray:
    """Σ_k a·(q − zp)·s + bias in exact rationals, rounded once to dtype (an exact zero is +0).
    Non-finite A or bias: the IEEE value of the sum."""
    A = np.asarray(A)
    M = A.shape[0]
    y = np.zeros((M, W.N), dtype)
    for m in range(M):
        for n in range(W.N):
            terms = [float(A[m, k]) for k in range(W.K)]
            b = None if bias is None else float(bias[n])
            if not all(math.isfinite(t) for t in terms) or (b is not None and not math.isfinite(b)):
                total = sum(t * float(W.w_exact(n, k)) for k, t in enumerate(terms)) + (b or 0.0)
                y[m, n] = total
                continue
            total = sum((Fraction(t) * W.w_exact(n, k) for k, t in enumerate(terms)), Fraction(0))
            if b is not None:
                total += Fraction(b)
            y[m, n] = round_fraction(total, dtype)
    return y


def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size,
                 accuracy_level=0, mode="contract") -> np.ndarray:
    """The oracle's MatMulNBits (A float32 or float16; output in A's dtype)."""
    W = Weights(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    dtype = np.asarray(A).dtype
    a32 = np.asarray(A).reshape(-1, K).astype(F32)
    b32 = None if bias is None else np.asarray(bias).astype(F32)
    lead = np.asarray(A).shape[:-1]
    if mode == "exact":
        return matmul_nbits_exact(a32, W, b32, dtype).reshape(lead + (N,))
    int8 = (accuracy_level == 4 and g_idx is None and not W.float_zp
            and (bits in (4, 8) or (bits == 2 and block_size in (32, 64, 128))))
    y = matmul_nbits_int8(a32, W, b32) if int8 else matmul_nbits_float(a32, W, b32)
    return y.astype(dtype).reshape(lead + (N,))


def gather_block_quantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128,
                           gather_axis=0, quantize_axis=1):
    """GatherBlockQuantized by explicit loops over the output: out[...] = f32(q − zp)·f32(s)
    rounded to the scales' dtype; an index outside [-s, s) gives 0."""
    data = np.asarray(data)
    r = data.ndim
    ga, qa = gather_axis % r, quantize_axis % r
    packed = data.dtype == np.uint8 and bits < 8
    per = 8 // bits if packed else 1
    shape = list(data.shape[:-1]) + [data.shape[-1] * per]
    is_float = data.dtype.name.startswith("float")  # float8_*, float4_e2m1fn (ml_dtypes names)

    def code(pos):
        if packed:
            byte = int(data[tuple(pos[:-1]) + (pos[-1] // per,)])
            return (byte >> ((pos[-1] % per) * bits)) & ((1 << bits) - 1)
        x = data[tuple(pos)]
        return float(np.float32(x)) if is_float else int(x)

    def zp_at(bpos):
        if is_float:
            return 0
        if zero_points is None:
            return (1 << (bits - 1)) if data.dtype == np.uint8 else 0
        if packed:
            byte = int(zero_points[tuple(bpos[:-1]) + (bpos[-1] // per,)])
            return (byte >> ((bpos[-1] % per) * bits)) & ((1 << bits) - 1)
        return int(zero_points[tuple(bpos)])

    ind = np.asarray(indices)
    out_shape = shape[:ga] + list(ind.shape) + shape[ga + 1:]
    out = np.zeros(out_shape, scales.dtype)
    blk = shape[qa] if block_size == 0 else block_size
    s_gather = shape[ga]
    for opos in np.ndindex(*out_shape):
        ipos = opos[ga:ga + ind.ndim]
        i = int(ind[ipos])
        if i < -s_gather or i >= s_gather:
            continue
        if i < 0:
            i += s_gather
        pos = list(opos[:ga]) + [i] + list(opos[ga + ind.ndim:])
        bpos = list(pos)
        bpos[qa] = pos[qa] // blk
        spos = tuple(0 if scales.shape[ax] == 1 else bpos[ax] for ax in range(r))
        diff = F32(code(pos) - zp_at(bpos)) if not is_float else F32(code(pos))
        out[opos] = (diff * F32(scales[spos])).astype(scales.dtype)
    return out
