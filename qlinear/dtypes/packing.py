"""ONNX's packed layout of sub-byte elements (TensorProto raw_data), to and from one code per byte.

At the API every element takes one byte (ml_dtypes' storage: the code in the low bits); only
TensorProto and the native engine pack them. The layouts (onnx.proto, numpy_helper):

- 4 bits: two per byte, the first element in the low nibble;
- 2 bits: four per byte, ``x0 | x1 << 2 | x2 << 4 | x3 << 6``;
- 6 bits (float6): an LSB-first bitstream, element i in bits 6i .. 6i+5, ceil(6n / 8) bytes.

Tails are zero-padded. Codes are uint8 arrays holding the element's bits in the low bits.
"""

from __future__ import annotations

import numpy as np


def packed_size(count: int, bits: int) -> int:
    """Bytes ONNX's packed layout takes for ``count`` elements of ``bits`` bits."""
    return (count * bits + 7) // 8


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The packed bytes (uint8, 1-D) of a flat sequence of ``bits``-bit codes."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1) & np.uint8((1 << bits) - 1)
    n = c.size
    if bits == 8:
        return c.copy()
    if bits in (4, 2):
        per = 8 // bits
        padded = np.zeros(-(-n // per) * per, np.uint8)
        padded[:n] = c
        groups = padded.reshape(-1, per)
        out = np.zeros(groups.shape[0], np.uint8)
        for j in range(per):
            out |= groups[:, j] << np.uint8(bits * j)
        return out
    if bits == 6:
        padded = np.zeros(-(-n // 4) * 4, np.uint8)
        padded[:n] = c
        g = padded.reshape(-1, 4)
        out = np.empty((g.shape[0], 3), np.uint8)
        out[:, 0] = g[:, 0] | (g[:, 1] << 6)
        out[:, 1] = (g[:, 1] >> 2) | (g[:, 2] << 4)
        out[:, 2] = (g[:, 2] >> 4) | (g[:, 3] << 2)
        return out.reshape(-1)[:packed_size(n, 6)].copy()
    raise ValueError(f"pack: bits must be 2, 4, 6 or 8; got {bits}")


def unpack_last_axis(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Codes packed ``8 // bits`` to a byte along the last axis (element j in byte j·bits // 8
    at bit (j mod (8 // bits))·bits, low bits first: MatMulNBits' and GatherBlockQuantized's
    rows), as uint8 with ``count`` elements along the last axis; bits 2, 4 or 8."""
    if bits == 8:
        return packed[..., :count]
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.empty(packed.shape + (per,), np.uint8)
    for j in range(per):
        np.bitwise_and(np.right_shift(packed, np.uint8(j * bits)), mask, out=out[..., j])
    return out.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))[..., :count]


def unpack(data: np.ndarray, count: int, bits: int) -> np.ndarray:
    """``count`` codes (uint8, 1-D, one per byte) from ONNX's packed bytes."""
    b = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    need = packed_size(count, bits)
    if b.size < need:
        raise ValueError(f"unpack: {count} elements of {bits} bits need {need} bytes; got {b.size}")
    b = b[:need]
    if bits == 8:
        return b.copy()
    mask = np.uint8((1 << bits) - 1)
    if bits in (4, 2):
        per = 8 // bits
        out = np.empty((b.size, per), np.uint8)
        for j in range(per):
            out[:, j] = (b >> np.uint8(bits * j)) & mask
        return out.reshape(-1)[:count].copy()
    if bits == 6:
        padded = np.zeros(-(-b.size // 3) * 3, np.uint8)
        padded[:b.size] = b
        g = padded.reshape(-1, 3)
        out = np.empty((g.shape[0], 4), np.uint8)
        out[:, 0] = g[:, 0] & mask
        out[:, 1] = ((g[:, 0] >> 6) | (g[:, 1] << 2)) & mask
        out[:, 2] = ((g[:, 1] >> 4) | (g[:, 2] << 4)) & mask
        out[:, 3] = g[:, 2] >> 2
        return out.reshape(-1)[:count].copy()
    raise ValueError(f"unpack: bits must be 2, 4, 6 or 8; got {bits}")
