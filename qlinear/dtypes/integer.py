"""The integer quantized types: int2/uint2, int4/uint4, int8/uint8, int16/uint16 (and int32,
DequantizeLinear's and the accumulators' type). One parametric definition: a width and a sign.

Sub-byte types are ml_dtypes' int2/uint2/int4/uint4 at the API: one element per byte, the
value in the low bits, zero-extended (int4 -1 is the byte 0x0F); ONNX packs them (packing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class IntFormat:
    bits: int
    signed: bool
    storage: np.dtype

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def max_centered(self) -> int:
        """The largest |q - zp| for q and zp of this type: what bounds an exact accumulation."""
        return self.hi - self.lo

    def to_int(self, arr: np.ndarray) -> np.ndarray:
        """Values as int32 (int64 for int32 storage) for exact integer arithmetic."""
        return np.asarray(arr).astype(np.int64 if self.bits > 16 else np.int32)

    def from_int(self, values: np.ndarray) -> np.ndarray:
        """Storage of integer values already in [lo, hi] (exact)."""
        return np.asarray(values).astype(self.storage)

    def codes(self, arr: np.ndarray) -> np.ndarray:
        """The low ``bits`` bits of each element as uint8 (types of at most 8 bits)."""
        return np.asarray(arr).view(np.uint8) & np.uint8((1 << self.bits) - 1)

    def from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Elements from their ``bits``-bit codes (the inverse of ``codes``)."""
        c = np.asarray(codes, dtype=np.uint8) & np.uint8((1 << self.bits) - 1)
        if self.storage.itemsize == 1:
            # one byte per element holding the code: int8's two's complement byte, and ml_dtypes'
            # sub-byte storage (the code in the low bits, zero-extended): a view, no conversion
            # (ml_dtypes' element-by-element cast took 50 ns per element)
            return c.view(self.storage)
        v = c.astype(np.int16)
        if self.signed:
            v = np.where(v >= (1 << (self.bits - 1)), v - (1 << self.bits), v)
        return v.astype(self.storage)
