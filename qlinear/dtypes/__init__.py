"""The registry of the types quantization uses: one entry per type, the one home of its facts.

Each :class:`QType` holds the ONNX element type, the NumPy storage dtype (ml_dtypes' dtypes for
bfloat16, float8, float6, float4, float8e8m0 and the sub-byte integers: one element per byte),
its width, sign and range, how it is packed in ONNX's layout, how values are encoded into it
and decoded from it exactly, the first QuantizeLinear/DequantizeLinear version that takes it,
and whether the native engine takes it. Operators, the graph runtime and the model tools ask
this registry instead of keeping their own tables.

Layer: imports NumPy and ml_dtypes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import ml_dtypes
import numpy as np

from . import packing
from .floating import E8M0Format, FloatFormat
from .integer import IntFormat

__all__ = ["QType", "get", "lookup", "from_onnx", "TYPES", "to_float32", "round_float32", "to_precision"]

Format = Union[IntFormat, FloatFormat, E8M0Format, None]


@dataclass(frozen=True, eq=False)
class QType:
    """One type's facts.

    ``kind``: "int" (integer codes), "float" (a narrow float format of at most 8 bits),
    "e8m0" (the power-of-two scale format), "wide" (float16, bfloat16, float32: scale, input
    and output types). ``since``: the first QuantizeLinear/DequantizeLinear version taking the
    type as quantized data (for "wide" types: as x, scale and output). ``native``: the native
    engine's quantize/dequantize kernels take it.
    """

    name: str
    onnx: int
    dtype: np.dtype
    bits: int
    kind: str
    fmt: Format
    since: int
    native: bool = False

    @property
    def signed(self) -> bool:
        return self.kind != "e8m0" and (not isinstance(self.fmt, IntFormat) or self.fmt.signed)

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_float(self) -> bool:
        """A narrow float format (float8, float6, float4): encoded by the Cast rules."""
        return self.kind == "float"

    @property
    def lo(self) -> int | float:
        """The smallest value (integers) or -max (floats)."""
        return self.fmt.lo if self.is_int else -self.max

    @property
    def hi(self) -> int | float:
        """The largest value (integers) or the largest finite value (floats)."""
        return self.fmt.hi if self.is_int else self.max

    @property
    def max(self) -> float:
        if self.kind == "wide":
            return float(np.finfo(self.dtype).max) if self.dtype != _BF16 else float(ml_dtypes.finfo(_BF16).max)
        return self.fmt.max if not self.is_int else float(self.fmt.hi)

    # ---- codes and ONNX's packed layout (types of at most 8 bits)

    def codes(self, arr: np.ndarray) -> np.ndarray:
        """Each element's ``bits``-bit code as uint8."""
        if self.is_int:
            return self.fmt.codes(arr)
        return np.asarray(arr).view(np.uint8) & np.uint8((1 << self.bits) - 1)

    def from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Elements of this type from their codes."""
        if self.is_int:
            return self.fmt.from_codes(codes)
        c = np.asarray(codes, dtype=np.uint8) & np.uint8((1 << self.bits) - 1)
        return c.view(self.dtype)

    def pack(self, arr: np.ndarray) -> np.ndarray:
        """ONNX's packed bytes (raw_data) of an array of this type, in C order."""
        return packing.pack(self.codes(arr), self.bits)

    def unpack(self, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """An array of this type and shape from ONNX's packed bytes."""
        count = int(np.prod(shape, dtype=np.int64))
        return self.from_codes(packing.unpack(data, count, self.bits)).reshape(shape)

    # ---- values

    def decode(self, arr: np.ndarray) -> np.ndarray:
        """The exact float32 values of an array of this narrow float type (a table lookup)."""
        return self.fmt.decode(np.asarray(arr).view(np.uint8))

    def encode(self, values: np.ndarray, saturate: bool = True) -> np.ndarray:
        """float32 (or float16/bfloat16) values converted to this narrow float type: one
        round-to-nearest-even with ONNX's ``saturate`` rule (float4/float6 always saturate)."""
        v = np.asarray(values)
        if v.dtype != np.float32:
            if v.dtype not in (np.dtype(np.float16), _BF16):
                raise TypeError(f"encode: values must be float32, float16 or bfloat16; got {v.dtype}")
            v = v.astype(np.float32)  # exact
        return self.fmt.encode(v, bool(saturate)).view(self.dtype)

    def __repr__(self) -> str:
        return f"QType({self.name})"


_BF16 = np.dtype(ml_dtypes.bfloat16)


def _int(name: str, onnx: int, storage: Any, bits: int, signed: bool, since: int, native: bool = False) -> QType:
    dt = np.dtype(storage)
    return QType(name, onnx, dt, bits, "int", IntFormat(bits, signed, dt), since, native)


def _float(name: str, onnx: int, storage: Any, e: int, m: int, bias: int, flavour: str, since: int) -> QType:
    dt = np.dtype(storage)
    return QType(name, onnx, dt, 1 + e + m, "float", FloatFormat(e, m, bias, flavour, dt), since)


TYPES: tuple[QType, ...] = (
    _int("uint8", 2, np.uint8, 8, False, 10, native=True),
    _int("int8", 3, np.int8, 8, True, 10, native=True),
    _int("uint16", 4, np.uint16, 16, False, 21),
    _int("int16", 5, np.int16, 16, True, 21),
    _int("int32", 6, np.int32, 32, True, 10),
    _int("uint4", 21, ml_dtypes.uint4, 4, False, 21),
    _int("int4", 22, ml_dtypes.int4, 4, True, 21),
    _int("uint2", 25, ml_dtypes.uint2, 2, False, 25),
    _int("int2", 26, ml_dtypes.int2, 2, True, 25),
    _float("float8e4m3fn", 17, ml_dtypes.float8_e4m3fn, 4, 3, 7, "fn", 19),
    _float("float8e4m3fnuz", 18, ml_dtypes.float8_e4m3fnuz, 4, 3, 8, "fnuz", 19),
    _float("float8e5m2", 19, ml_dtypes.float8_e5m2, 5, 2, 15, "ieee", 19),
    _float("float8e5m2fnuz", 20, ml_dtypes.float8_e5m2fnuz, 5, 2, 16, "fnuz", 19),
    _float("float4e2m1", 23, ml_dtypes.float4_e2m1fn, 2, 1, 1, "finite", 23),
    _float("float6e2m3", 27, ml_dtypes.float6_e2m3fn, 2, 3, 1, "finite", 28),
    _float("float6e3m2", 28, ml_dtypes.float6_e3m2fn, 3, 2, 3, "finite", 28),
    QType("float8e8m0", 24, np.dtype(ml_dtypes.float8_e8m0fnu), 8, "e8m0", E8M0Format(), 24),
    QType("float32", 1, np.dtype(np.float32), 32, "wide", None, 10),
    QType("float16", 10, np.dtype(np.float16), 16, "wide", None, 19),
    QType("bfloat16", 16, _BF16, 16, "wide", None, 19),
)

_BY_DTYPE = {t.dtype: t for t in TYPES}
_BY_ONNX = {t.onnx: t for t in TYPES}
_BY_NAME = {t.name: t for t in TYPES}


def lookup(dtype: Any) -> QType | None:
    """The entry of a NumPy dtype, None for a dtype quantization does not use."""
    try:
        return _BY_DTYPE.get(np.dtype(dtype))
    except TypeError:
        return None


def get(dtype: Any) -> QType:
    """The entry of a NumPy dtype, an ONNX element type (int) or a registry name; KeyError if none."""
    if isinstance(dtype, QType):
        return dtype
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return from_onnx(int(dtype))
    t = lookup(dtype)
    if t is None:
        raise KeyError(f"no quantization type for {dtype!r}")
    return t


def from_onnx(elem_type: int) -> QType:
    """The entry of an ONNX TensorProto element type; KeyError if quantization does not use it."""
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        raise KeyError(f"no quantization type for ONNX element type {elem_type}") from None


F32, F16, BF16 = _BY_NAME["float32"], _BY_NAME["float16"], _BY_NAME["bfloat16"]

#: the 8-bit integer types (the QLinear operators' and the native engine's operand types)
EIGHT_BIT: tuple[np.dtype, ...] = tuple(t.dtype for t in TYPES if t.is_int and t.bits == 8)
#: (lo, hi) of every integer type by dtype
INT_RANGE: dict[np.dtype, tuple[int, int]] = {t.dtype: (t.lo, t.hi) for t in TYPES if t.is_int}
#: (lo, hi) of the integer types the native engine takes, by dtype
NATIVE_INT_RANGE: dict[np.dtype, tuple[int, int]] = {t.dtype: (t.lo, t.hi) for t in TYPES if t.is_int and t.native}
#: the same facts by ONNX element type, for the graph runtime and the model passes
EIGHT_BIT_ONNX: frozenset[int] = frozenset(t.onnx for t in TYPES if t.is_int and t.bits == 8)
SIXTEEN_BIT_ONNX: frozenset[int] = frozenset(t.onnx for t in TYPES if t.is_int and t.bits == 16)
ONNX_INT_RANGE: dict[int, tuple[int, int]] = {t.onnx: (t.lo, t.hi) for t in TYPES if t.is_int}
#: the integers of fewer than 8 bits and the narrow float formats (float8, float6, float4)
NARROW_ONNX: frozenset[int] = frozenset(t.onnx for t in TYPES if (t.is_int and t.bits < 8) or t.is_float)


def to_float32(arr: np.ndarray) -> np.ndarray:
    """Exact float32 values of an array of any registered type of at most 16 bits, or float32
    (int32 rounds to nearest above 2**24)."""
    arr = np.asarray(arr)
    t = lookup(arr.dtype)
    if t is not None and t.kind in ("float", "e8m0"):
        return t.decode(arr)
    if arr.dtype == np.float32:
        return arr
    return arr.astype(np.float32)


def round_float32(values: np.ndarray, to: QType) -> np.ndarray:
    """float32 values rounded once (to nearest, ties to even) to a wide type: float32 itself,
    float16 (NumPy's cast) or bfloat16 (ml_dtypes' cast, exact from float32)."""
    if to is F32:
        return values
    with np.errstate(over="ignore"):
        return values.astype(to.dtype)


def _round_int_to_bits(v: np.ndarray, p: int) -> np.ndarray:
    """int64 values (|v| < 2**53) rounded to p significant bits, ties to even."""
    a = np.abs(v)
    nbits = np.frexp(a.astype(np.float64))[1].astype(np.int64)  # bit length: exact below 2**53
    d = np.maximum(nbits - p, 1)
    q = a >> d
    rem = a - (q << d)
    half = np.int64(1) << (d - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    return np.where(nbits > p, np.sign(v) * (q << d), v)


def to_precision(arr: np.ndarray, to: QType) -> np.ndarray:
    """An array (float32, float16, bfloat16, int32, or float8e8m0) converted to the wide type
    ``to`` with one rounding (to nearest, ties to even)."""
    arr = np.asarray(arr)
    if arr.dtype == to.dtype:
        return arr
    if arr.dtype == np.int32:
        if to is BF16:
            # int32 -> float32 rounds, and float32 -> bfloat16 again: round to bfloat16's 8
            # significant bits in integers, which float32 then holds exactly
            return _round_int_to_bits(arr.astype(np.int64), 8).astype(np.float32).astype(to.dtype)
        # int32 -> float32 rounds once; for float16 every |v| < 2**24 is exact in float32 and
        # every larger one overflows float16 either way: one rounding
        f = arr.astype(np.float32)
        return f if to is F32 else round_float32(f, to)
    return round_float32(to_float32(arr), to)
