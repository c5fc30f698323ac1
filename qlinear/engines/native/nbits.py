"""MatMulNBits on the native engine: the weights repacked once into the kernels' layouts
(qlinear/csrc/nbits/nbits.h), then one C call per ``run``.

One layout serves both arithmetics (docs/contract.md, "MatMulNBits"; docs/engine.md): columns
in groups of 16, each K-block as ``block_size * bits / 32`` lines of 64 bytes, a line holding 4
bytes per column that pack the codes of 4 consecutive k for each of ``8 // bits`` steps. The
int8 level reads a line as ``8 // bits`` ``vpdpbusd`` operands (16 columns x 4 k); the float
levels read it k by k, one column an int32 lane (one shift and one mask), for their one
accumulator per output. Scales [group][block][16] float32; zero points uint8 (int8 level) or
float32 (float levels) in the same order.

The codes stay at their bit width (no float32 copy of the weights); the float levels' kernels
dequantize 256 k of 32 columns at a time into a 32 KiB panel, or straight into registers.
"""

from __future__ import annotations

import numpy as np

from ... import _native
from ...dtypes.packing import unpack_last_axis

F32 = np.float32
_CHUNK = 256  # columns repacked at a time (a multiple of 16): bounded temporaries




def _pack_steps(x: np.ndarray, bits: int) -> np.ndarray:
    """x[..., per] codes → bytes: step s at bit bits·s."""
    out = np.zeros(x.shape[:-1], np.uint8)
    for s in range(x.shape[-1]):
        out |= (x[..., s] << np.uint8(bits * s)).astype(np.uint8)
    return out


class NativeMatMulNBits:
    """The kernels' layouts of one MatMulNBits' constants.

    ``B`` uint8 [N, kblocks, blob]; ``scales`` float32 [N, kblocks]; ``zp`` int16 (integer zero
    points, unpacked) or float32 [N, kblocks]; ``zp_given``: False when the zero points are the
    default 2**(bits-1); ``g`` intp [K] or None; ``bias`` float32 [N] or None."""

    def __init__(self, B: np.ndarray, scales: np.ndarray, zp: np.ndarray, zp_given: bool, g: np.ndarray | None,
                 bias: np.ndarray | None, *, K: int, N: int, bits: int, block_size: int, int8: bool) -> None:
        self.K, self.N, self.bits, self.bs, self.int8 = K, N, bits, block_size, int8
        nb = -(-K // block_size)
        per = 8 // bits
        kpad = nb * block_size
        self.bias = None if bias is None else np.ascontiguousarray(bias, F32)
        self.w8 = self.z8 = self.zf = self.g = None
        self.zconst = 1 << (bits - 1)
        self.zint = True
        ng = -(-N // 16)
        lines = block_size * bits // 32
        w8 = np.zeros((ng, nb, lines, 16, 4), np.uint8)
        for n0 in range(0, N, _CHUNK):
            n1 = min(N, n0 + _CHUNK)
            q = unpack_last_axis(B[n0:n1].reshape(n1 - n0, -1), bits, kpad)
            gc = -(-(n1 - n0) // 16)
            qp = np.zeros((gc * 16, kpad), np.uint8)
            qp[:n1 - n0] = q
            # k in a block = line·4·per + s·4 + t  →  [group, block, line, column, t, s]
            x = qp.reshape(gc, 16, nb, lines, per, 4).transpose(0, 2, 3, 1, 5, 4)
            w8[n0 // 16:n0 // 16 + gc] = _pack_steps(x, bits)
        self.w8 = w8

        def by_group(v: np.ndarray, dtype: type) -> np.ndarray:
            out = np.zeros((ng * 16, nb), dtype)
            out[:N] = v  # integer zero points are exact in float32
            return np.ascontiguousarray(out.reshape(ng, 16, nb).transpose(0, 2, 1))

        self.s8 = by_group(scales, F32)
        if int8:
            if zp_given:
                self.z8 = by_group(zp, np.uint8)
        else:
            self.zint = zp.dtype != np.float32
            self.zf = by_group(zp, F32)
            if g is not None:
                self.g = np.ascontiguousarray(g, np.int32)

    def run(self, C, a: np.ndarray) -> np.ndarray:
        """Y [M, N] float32 for a float32 [M, K] (bias included), on the selected ISA level."""
        a = np.ascontiguousarray(a, F32)
        M = a.shape[0]
        y = np.empty((M, self.N), F32)
        C.nbits_run(_native.isa(), self.int8, self.bits, self.bs, self.K, self.N, self.w8, self.s8, self.z8,
                    self.zconst, self.zf, self.zint, self.g, self.bias, a, M, y)
        return y
