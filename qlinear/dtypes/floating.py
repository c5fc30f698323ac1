"""The narrow float formats: float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), float6 (e2m3, e3m2),
float4 (e2m1) and the float8e8m0 block scale. One parametric definition serves them all: a
format is its exponent and mantissa widths, its bias and how it spells the special values.

Decoding is a table of every code (exact: every value of these formats is a float32).
Encoding from float32 (and so from float16 and bfloat16, which widen to float32 exactly) is
exact round-to-nearest-even by integer work on the float32 bits, with ONNX's ``saturate`` rule
(the Cast tables) and the encodings FORMATS.md Part A fixes:

- saturate=1: ±inf and values rounding past the largest finite go to ±max;
- saturate=0: they go to NaN (e4m3fn: 0x7F|sign; both fnuz: 0x80) or ±inf (e5m2);
- NaN: e4m3fn and e5m2 0x7F|sign, fnuz 0x80;
- fnuz formats have no -0: a negative value rounding to zero gives +0;
- float4/float6 always saturate, NaN gives +max and ±0 keep their sign.

ml_dtypes' own cast is exact round-to-nearest-even from float32 with saturate=0 semantics
(FORMATS.md Part B, and the tests compare it with the exact encoder on every float16 and
bfloat16 value and at every rounding boundary), so for float8 it does the rounding and the
special values are then set by this module. It is never used from float64 (it rounds through
float32 first: double rounding), nor for float4/float6 (its NaN handling differs from ONNX's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def rne_shift(v: np.ndarray, d: np.ndarray) -> np.ndarray:
    """round(v / 2**d) to nearest, ties to even, for int64 v >= 0 and shifts 1 <= d <= 62."""
    d = np.asarray(d, dtype=np.int64)
    q = v >> d
    rem = v - (q << d)
    half = np.int64(1) << (d - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + up


@dataclass(frozen=True, eq=False)
class FloatFormat:
    """A sign/exponent/mantissa format of at most 8 bits and how it spells specials.

    ``flavour``: "fn" (no infinity, NaN = all exponent and mantissa bits set, -0 exists),
    "fnuz" (no infinity, no -0, NaN = the code 0x80), "ieee" (e5m2: inf and NaNs as IEEE),
    "finite" (float4/float6: every code a finite number; saturating, NaN -> +max).
    """

    ebits: int
    mbits: int
    bias: int
    flavour: str
    storage: np.dtype
    table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", self._decode_table())

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def max_code(self) -> int:
        """The code (sign clear) of the largest finite value."""
        top = self.sign_bit - 1
        if self.flavour == "fn":
            return top - 1  # all ones is NaN
        if self.flavour == "ieee":
            return ((1 << self.ebits) - 2) << self.mbits | ((1 << self.mbits) - 1)
        return top  # fnuz, finite: every non-negative code is a number

    @property
    def max(self) -> float:
        return float(self.table[self.max_code])

    @property
    def nan_code(self) -> int | None:
        """The code of +NaN this project writes (None: the format has no NaN)."""
        if self.flavour == "fnuz":
            return 0x80
        if self.flavour in ("fn", "ieee"):
            return self.sign_bit - 1
        return None

    @property
    def unit_exponent(self) -> int:
        """e such that every value is an integer multiple of 2**e (the smallest subnormal)."""
        return 1 - self.bias - self.mbits

    @property
    def max_units(self) -> int:
        """max / 2**unit_exponent: the largest |value| as an integer number of units."""
        return int(self.max * 2.0 ** -self.unit_exponent)

    def _decode_table(self) -> np.ndarray:
        table = np.zeros(256, np.float32)
        for code in range(1 << self.bits):
            table[code] = self._value(code)
        return table

    def _value(self, code: int) -> float:
        sign = -1.0 if code & self.sign_bit else 1.0
        mag = code & (self.sign_bit - 1)
        e = mag >> self.mbits
        m = mag & ((1 << self.mbits) - 1)
        if self.flavour == "fnuz" and code == 0x80:
            return float("nan")
        if self.flavour == "fn" and mag == self.sign_bit - 1:
            return sign * float("nan")
        if self.flavour == "ieee" and e == (1 << self.ebits) - 1:
            return sign * (float("inf") if m == 0 else float("nan"))
        if e == 0:
            return sign * m * 2.0 ** (1 - self.bias - self.mbits)
        return sign * ((1 << self.mbits) + m) * 2.0 ** (e - self.bias - self.mbits)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float32 values of uint8 codes (exact)."""
        return self.table[codes]

    def encode(self, x: np.ndarray, saturate: bool) -> np.ndarray:
        """uint8 codes of float32 values: ``encode_exact``'s bits, by ml_dtypes' cast where it
        is exact (float8 from float32) with the specials then set here."""
        x = np.asarray(x, dtype=np.float32)
        if self.flavour == "finite":
            return self.encode_exact(x, saturate)
        code = x.astype(self.storage).view(np.uint8)
        nan = np.isnan(x)
        sign = (x.view(np.uint32) >> 24).astype(np.uint8) & np.uint8(0x80)
        if self.flavour == "fnuz":
            overflow = (code == 0x80) & ~nan  # ml_dtypes spells overflow and NaN 0x80 too
            if saturate:
                code = np.where(overflow, np.uint8(self.max_code) | sign, code)
            return code
        mag = code & np.uint8(0x7F)
        overflow = (mag > self.max_code) & ~nan
        if saturate:
            code = np.where(overflow, np.uint8(self.max_code) | sign, code)
        elif self.flavour == "fn":
            code = np.where(overflow, np.uint8(self.nan_code) | sign, code)
        if self.flavour == "ieee":  # ml_dtypes writes NaN as 0x7E|sign; ONNX/onnxruntime 0x7F|sign
            code = np.where(nan, np.uint8(self.nan_code) | sign, code)
        return code

    def encode_exact(self, x: np.ndarray, saturate: bool) -> np.ndarray:
        """uint8 codes of float32 values, by integer arithmetic on their bits (see the module)."""
        x = np.asarray(x, dtype=np.float32)
        bits = x.view(np.uint32).astype(np.int64)
        neg = (bits >> 31) == 1
        u = bits & 0x7FFFFFFF
        nan = u > 0x7F800000
        inf = u == 0x7F800000
        E = u >> 23
        M = u & 0x7FFFFF
        emin = 1 - self.bias  # unbiased exponent of the smallest normal
        e = np.maximum(E, 1) - 127  # a float32 subnormal has exponent -126 and no hidden bit
        sig = np.where(E == 0, M, M | (1 << 23))
        normal = e >= emin
        shift = 23 - self.mbits
        # normal in the target: rebias the exponent and drop mantissa bits; a carry out of the
        # mantissa steps the exponent, as it should
        with np.errstate(over="ignore"):
            n_code = rne_shift(((e + self.bias) << 23 | M) * normal, shift)
        # subnormal in the target: the significand scaled to units of the smallest subnormal
        # (a shift above 40 leaves < 2**-16 of a unit: rounds to 0, as a shift of 40 does)
        s_code = rne_shift(sig, np.minimum(shift + emin - e, 40))
        mag = np.where(normal, n_code, s_code)
        overflow = inf | (mag > self.max_code)
        sign = np.where(neg, self.sign_bit, 0)
        code = mag | sign
        if self.flavour == "fnuz":
            code = np.where(mag == 0, 0, code)
        if saturate or self.flavour == "finite":
            code = np.where(overflow, self.max_code | sign, code)
        elif self.flavour == "ieee":
            code = np.where(overflow, (self.max_code + 1) | sign, code)  # ±inf
        elif self.flavour == "fn":
            code = np.where(overflow, self.nan_code | sign, code)
        else:
            code = np.where(overflow, self.nan_code, code)
        if self.flavour == "finite":
            code = np.where(nan, self.max_code, code)
        elif self.flavour == "fnuz":
            code = np.where(nan, self.nan_code, code)
        else:
            code = np.where(nan, self.nan_code | sign, code)
        return code.astype(np.uint8)


@dataclass(frozen=True, eq=False)
class E8M0Format:
    """float8e8m0: 2**(code - 127), no sign, no zero; 0xFF is NaN. Used only as a scale here."""

    table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        t = np.ldexp(np.ones(256), np.arange(256) - 127)
        t[255] = np.nan  # (not 2**128)
        t = t.astype(np.float32)  # exact: 2**-127 is a float32 subnormal
        object.__setattr__(self, "table", t)

    bits = 8
    unit_exponent = -127
    nan_code = 0xFF

    @property
    def max(self) -> float:
        return 2.0 ** 127

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self.table[codes]
