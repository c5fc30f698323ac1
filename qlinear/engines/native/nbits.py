"""MatMulNBits on the native engine: the weights repacked once into the kernels' layouts
(qlinear/csrc/nbits/nbits.h), then one C call per ``run``.

Two layouts, one per arithmetic (docs/contract.md, "MatMulNBits"; docs/engine.md):

- int8 activations (accuracy_level 4 where the contract quantizes them): columns in groups of
  16, each K-block as ``block_size * bits / 32`` lines of 64 bytes, a line holding 4 bytes per
  column that pack the codes of 4 consecutive k for each of ``8 // bits`` steps: one
  ``vpdpbusd`` operand (16 columns x 4 k) per step after a shift and a mask;
- float levels: per column, 16 bytes per ``16 * 8 // bits`` k, byte i packing the codes of
  k = 16·s + i at bit ``bits·s``: one 16-byte load widened to 16 lanes gives 16 consecutive k.

Both keep the codes at their bit width (no float32 copy of the weights); the float levels'
kernels dequantize 16 k of 32 columns at a time into a 32 KiB panel.
"""

from __future__ import annotations

import numpy as np

from ... import _native

F32 = np.float32
_CHUNK = 256  # columns repacked at a time (a multiple of 16 and 32): bounded temporaries
_FCOLS = 8  # the float layout's column group (QL_NB_FCOLS)


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Codes packed low bits first along the last axis, as uint8 with ``count`` elements."""
    if bits == 8:
        return packed[..., :count]
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.empty(packed.shape + (per,), np.uint8)
    for s in range(per):
        np.bitwise_and(np.right_shift(packed, np.uint8(s * bits)), mask, out=out[..., s])
    return out.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))[..., :count]


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
        self.w8 = self.s8 = self.z8 = self.wf = self.sf = self.zf = self.g = None
        self.zconst = 1 << (bits - 1)
        self.wf_row = 0
        if int8:
            ng = -(-N // 16)
            lines = block_size * bits // 32
            w8 = np.zeros((ng, nb, lines, 16, 4), np.uint8)
            for n0 in range(0, N, _CHUNK):
                n1 = min(N, n0 + _CHUNK)
                q = _unpack(B[n0:n1].reshape(n1 - n0, -1), bits, kpad)
                gc = -(-(n1 - n0) // 16)
                qp = np.zeros((gc * 16, kpad), np.uint8)
                qp[:n1 - n0] = q
                # k in a block = line·4·per + s·4 + t  →  [group, block, line, column, t, s]
                x = qp.reshape(gc, 16, nb, lines, per, 4).transpose(0, 2, 3, 1, 5, 4)
                w8[n0 // 16:n0 // 16 + gc] = _pack_steps(x, bits)
            self.w8 = w8
            sp = np.zeros((ng * 16, nb), F32)
            sp[:N] = scales
            self.s8 = np.ascontiguousarray(sp.reshape(ng, 16, nb).transpose(0, 2, 1))
            if zp_given:
                zpad = np.zeros((ng * 16, nb), np.uint8)
                zpad[:N] = zp
                self.z8 = np.ascontiguousarray(zpad.reshape(ng, 16, nb).transpose(0, 2, 1))
        else:
            kpadf = -(-kpad // (16 * per)) * (16 * per)
            nsc = kpadf // (16 * per)
            G = -(-N // _FCOLS)
            wf = np.zeros((G, nsc, _FCOLS, 16), np.uint8)
            for n0 in range(0, N, _CHUNK):
                n1 = min(N, n0 + _CHUNK)
                gc = -(-(n1 - n0) // _FCOLS)
                q = np.zeros((gc * _FCOLS, kpadf), np.uint8)
                q[:n1 - n0, :kpad] = _unpack(B[n0:n1].reshape(n1 - n0, -1), bits, kpad)
                # k = superchunk·16·per + s·16 + i  →  [group, superchunk, column, i, s]
                x = q.reshape(gc, _FCOLS, nsc, per, 16).transpose(0, 2, 1, 4, 3)
                wf[n0 // _FCOLS:n0 // _FCOLS + gc] = _pack_steps(x, bits)
            self.wf, self.wf_row = wf, nsc * 16

            def by_group(v: np.ndarray) -> np.ndarray:
                out = np.zeros((G * _FCOLS, nb), F32)
                out[:N] = v  # integer zero points are exact in float32
                return np.ascontiguousarray(out.reshape(G, _FCOLS, nb).transpose(0, 2, 1))

            self.sf, self.zf = by_group(scales), by_group(zp)
            if g is not None:
                gp = np.zeros(kpadf, np.int32)
                gp[:K] = g
                self.g = gp

    def run(self, C, a: np.ndarray) -> np.ndarray:
        """Y [M, N] float32 for a float32 [M, K] (bias included), on the selected ISA level."""
        a = np.ascontiguousarray(a, F32)
        M = a.shape[0]
        y = np.empty((M, self.N), F32)
        C.nbits_run(_native.isa(), self.int8, self.bits, self.bs, self.K, self.N, self.w8, self.s8, self.z8,
                    self.zconst, self.wf, self.wf_row, self.sf, self.zf, self.g, self.bias, a, M, y)
        return y
