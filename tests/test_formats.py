"""The newer quantization formats (QuantizeLinear/DequantizeLinear 19-28): every type, version,
granularity and attribute against the independent oracle (tests/oracle.py, written from the
spec text with exact rationals), bit for bit.

Tests whose name contains "engine" run on the NumPy engine and on the native engine at every
ISA level this CPU runs (conftest.py); the new types take the exact NumPy path on every level.
"""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import qlinear
from qlinear import dtypes
from conftest import assert_exact

F32, F16, BF16 = np.float32, np.float16, ml_dtypes.bfloat16
E8M0 = ml_dtypes.float8_e8m0fnu
FLOATS = list(oracle.FLOAT_FORMATS)
INTS = list(oracle.INT_TYPES)
STORAGE = {**{n: v[4] for n, v in oracle.FLOAT_FORMATS.items()}, **{n: v[2] for n, v in oracle.INT_TYPES.items()}}


def bits_equal(got, want):
    """Same dtype, shape and bytes (a NaN is compared by its bits)."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    g = np.ascontiguousarray(got).view(np.uint8)
    w = np.ascontiguousarray(want).view(np.uint8)
    if not np.array_equal(g, w):
        bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
        raise AssertionError(f"{bad.size} bytes differ, first at byte {bad[0]}: got {g.reshape(-1)[bad[:5]]} "
                             f"want {w.reshape(-1)[bad[:5]]}")


# ----------------------------------------------------------------------------- the registry


def test_registry_matches_onnx_element_types():
    from onnx import TensorProto as T
    for name, elem in [("float8e4m3fn", T.FLOAT8E4M3FN), ("float8e4m3fnuz", T.FLOAT8E4M3FNUZ),
                       ("float8e5m2", T.FLOAT8E5M2), ("float8e5m2fnuz", T.FLOAT8E5M2FNUZ),
                       ("float4e2m1", T.FLOAT4E2M1), ("float6e2m3", T.FLOAT6E2M3), ("float6e3m2", T.FLOAT6E3M2),
                       ("float8e8m0", T.FLOAT8E8M0), ("int4", T.INT4), ("uint4", T.UINT4), ("int2", T.INT2),
                       ("uint2", T.UINT2), ("int16", T.INT16), ("uint16", T.UINT16), ("int8", T.INT8),
                       ("uint8", T.UINT8), ("int32", T.INT32), ("float16", T.FLOAT16), ("bfloat16", T.BFLOAT16),
                       ("float32", T.FLOAT)]:
        t = dtypes.get(name)
        assert t.onnx == elem and dtypes.from_onnx(elem) is t
        assert dtypes.get(t.dtype) is t
    for name, (lo, hi, storage) in oracle.INT_TYPES.items():
        t = dtypes.get(name)
        assert (t.lo, t.hi, t.dtype) == (lo, hi, np.dtype(storage))
    assert dtypes.get("float8e4m3fn").max == 448 and dtypes.get("float8e5m2").max == 57344
    assert dtypes.get("float6e3m2").max == 28 and dtypes.get("float4e2m1").max == 6


@pytest.mark.parametrize("name", FLOATS + ["int4", "uint4", "int2", "uint2", "int8", "uint8"])
def test_packing_matches_onnx(name):
    """pack/unpack against onnx.numpy_helper's packers (the TensorProto layout), odd counts too."""
    from onnx import numpy_helper as nh
    t = dtypes.get(name)
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 3, 5, 8, 33):
        codes = rng.integers(0, 1 << t.bits, n).astype(np.uint8)
        arr = t.from_codes(codes)
        packed = t.pack(arr)
        if t.bits == 4:
            want = nh._pack_4bitx2(codes)
        elif t.bits == 2:
            want = nh._pack_2bitx4(codes)
        elif t.bits == 6:
            want = nh._pack_6bit(codes)
        else:
            want = codes
        np.testing.assert_array_equal(packed, np.asarray(want, np.uint8).reshape(-1))
        assert packed.size == (n * t.bits + 7) // 8
        back = t.unpack(packed, (n,))
        bits_equal(back, arr)


# ----------------------------------------------------------------------------- every code decoded


@pytest.mark.parametrize("name", FLOATS)
def test_engine_every_code_decoded(name, engine_level):
    table = oracle.decode_table(name)
    width = table.size
    codes = np.arange(width, dtype=np.uint8)
    x = oracle.as_format(codes, name)
    want = table.astype(np.float32)
    assert_exact(dtypes.get(name).decode(x), want)
    # through DequantizeLinear (scale 1: the product is the value)
    y = qlinear.dequantize_linear(x, F32(1))
    assert_exact(y, want)
    # ml_dtypes, the API's storage, agrees (NaN codes: NaN)
    ml = x.astype(np.float32)
    assert np.array_equal(np.isnan(ml), np.isnan(want))
    assert_exact(np.where(np.isnan(ml), 0, ml).astype(np.float32), np.where(np.isnan(want), 0, want).astype(np.float32))


def test_e8m0_every_code_decoded():
    codes = np.arange(256, dtype=np.uint8)
    want = np.array([np.nan if c == 255 else 2.0 ** (c - 127) for c in range(256)]).astype(np.float32)
    assert_exact(dtypes.get("float8e8m0").decode(codes.view(E8M0)), want)


@pytest.mark.parametrize("name", INTS)
def test_engine_every_integer_code_dequantized(name, engine_level):
    lo, hi, storage = oracle.INT_TYPES[name]
    x = np.arange(lo, hi + 1).astype(storage)
    for zp in (lo, 0, hi):
        y = qlinear.dequantize_linear(x, F32(0.5), np.asarray(zp).astype(storage))
        assert_exact(y, ((np.arange(lo, hi + 1) - zp) * 0.5).astype(np.float32))


# ----------------------------------------------------------------------------- exhaustive conversions


def _all16(dtype):
    return np.arange(1 << 16, dtype=np.uint16).view(dtype)


@pytest.mark.parametrize("src", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", FLOATS)
def test_engine_every_16bit_value_to_float_formats(name, src, engine_level):
    """All 2**16 float16 and bfloat16 values, both saturate modes, through QuantizeLinear with a
    scale of 1 of the same type (P = that type: the quotient is x, exactly)."""
    x = _all16(src)
    exact = x.astype(np.float64)
    for sat in (0, 1):
        want = oracle.as_format(oracle.encode_float(exact, name, sat), name)
        got = qlinear.quantize_linear(x, np.asarray(1, src), output_dtype=STORAGE[name], saturate=sat)
        bits_equal(got, want)
        # the registry's exact encoder (the integer-bit one) gives the same codes
        bits_equal(dtypes.get(name).fmt.encode_exact(x.astype(np.float32), sat).view(STORAGE[name]), want)


@pytest.mark.parametrize("src", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", INTS)
def test_engine_every_16bit_value_to_integers(name, src, engine_level):
    lo, hi, storage = oracle.INT_TYPES[name]
    x = _all16(src)
    zp = (lo + hi + 1) // 2
    got = qlinear.quantize_linear(x, np.asarray(1, src), np.asarray(zp).astype(storage))
    want = oracle.round_saturate_exact(x.astype(np.float64), zp, lo, hi).astype(storage)
    bits_equal(got, want)


def _boundaries(name):
    """float32 values at and around every rounding boundary of a format: each representable
    value, each midpoint between neighbours and the overflow midpoint, each ±1 ulp, both
    signs; plus ±inf, NaN, ±0, float32 subnormals and huge values."""
    table = oracle.decode_table(name)
    vals = np.unique(np.abs(table[np.isfinite(table)]))
    mids = (vals[:-1] + vals[1:]) / 2
    top = vals[-1] + (vals[-1] - vals[-2]) / 2
    pts = np.concatenate([vals, mids, [top, vals[-1] * 2, vals[-1] * 4]]).astype(np.float32)
    around = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    extra = np.array([np.inf, np.nan, 0.0, 1e-45, 1e-40, 1.1754942e-38, 3.4e38, 1e30, 1e-30], np.float32)
    allp = np.concatenate([around, extra])
    return np.concatenate([allp, -allp]).astype(np.float32)


@pytest.mark.parametrize("name", FLOATS)
def test_engine_float32_rounding_boundaries(name, engine_level):
    x = _boundaries(name)
    for sat in (0, 1):
        want = oracle.as_format(oracle.encode_float(x.astype(np.float64), name, sat), name)
        bits_equal(qlinear.quantize_linear(x, F32(1), output_dtype=STORAGE[name], saturate=sat), want)
        bits_equal(dtypes.get(name).fmt.encode_exact(x, sat).view(STORAGE[name]), want)


@pytest.mark.parametrize("n", [65537, (1 << 17) - 1, 1 << 17, (1 << 17) + 1])
@pytest.mark.parametrize("name", ["float8e4m3fn", "float8e5m2fnuz", "float4e2m1", "float6e3m2"])
def test_engine_float32_boundaries_at_thread_split_and_tails(name, n, engine_level):
    """The rounding boundaries (every value, midpoint, +-1 ulp, specials) spread over a tensor
    of 65537 (a prime), 2^17 - 1, 2^17 (the size from which the conversion runs on both
    threads) and 2^17 + 1 elements, read from an unaligned start (one element into a buffer): every
    vector tail, tile and task split of the native encoder meets them; a float32 and a float16
    x (its hardware conversions) against the oracle."""
    rng = np.random.default_rng(n)
    pts = _boundaries(name)
    buf = np.empty(n + 1, F32)
    x = buf[1:]
    x[:] = pts[rng.integers(0, pts.size, n)]
    x[-pts.size:] = pts  # every one, in order, up to the very last element
    for sat in (0, 1):
        want = oracle.as_format(oracle.encode_float(x.astype(np.float64), name, sat), name)
        bits_equal(qlinear.quantize_linear(x, F32(1), output_dtype=STORAGE[name], saturate=sat), want)
    h = x.astype(F16)
    want = oracle.as_format(oracle.encode_float(h.astype(np.float64), name, 1), name)
    bits_equal(qlinear.quantize_linear(h, F16(1), output_dtype=STORAGE[name]), want)


def test_engine_documented_special_values(engine_level):
    """FORMATS.md Part A's spelled-out cases, independent of the oracle."""
    def q(v, name, sat):
        return int(qlinear.quantize_linear(np.array([v], F32), F32(1), output_dtype=STORAGE[name],
                                           saturate=sat).view(np.uint8)[0])
    assert q(464, "float8e4m3fn", 0) == 0x7E  # a tie rounding to 448
    assert q(465, "float8e4m3fn", 0) == 0x7F and q(-465, "float8e4m3fn", 0) == 0xFF
    assert q(480, "float8e4m3fn", 0) == 0x7F  # onnxruntime gives 448 here: a listed divergence
    assert q(480, "float8e4m3fn", 1) == 0x7E
    assert q(61440, "float8e5m2", 0) == 0x7C and q(-61440, "float8e5m2", 0) == 0xFC
    assert q(np.inf, "float8e5m2", 1) == 0x7B
    assert q(np.nan, "float8e5m2", 1) == 0x7F and q(np.nan, "float8e4m3fn", 1) == 0x7F
    assert q(np.nan, "float8e4m3fnuz", 1) == 0x80 and q(248, "float8e4m3fnuz", 0) == 0x80
    assert q(-0.0, "float8e4m3fnuz", 0) == 0x00 and q(-1e-9, "float8e5m2fnuz", 0) == 0x00
    assert q(-0.0, "float8e4m3fn", 0) == 0x80
    assert q(np.nan, "float4e2m1", 0) == 0x7 and q(-np.inf, "float4e2m1", 0) == 0xF
    assert q(-0.0, "float4e2m1", 0) == 0x8 and q(np.nan, "float6e3m2", 0) == 0x1F
    assert q(7, "float4e2m1", 0) == 0x7  # saturates whatever saturate says


# ----------------------------------------------------------------------------- QuantizeLinear


def _scales(rng, shape, dtype, lo=0.01, hi=2.0):
    s = rng.uniform(lo, hi, size=shape) * rng.choice([-1, 1], size=shape)
    return np.asarray(s).astype(dtype)


def _x(rng, shape, dtype, spread=300.0):
    x = rng.normal(0, spread, size=shape)
    x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -0.0][: x.size]
    if dtype == np.int32:
        return np.nan_to_num(x, nan=0, posinf=2**31 - 1, neginf=-(2**31)).astype(np.int64).clip(-(2**31), 2**31 - 1).astype(np.int32)
    return x.astype(dtype)


GRANULARITIES = [
    # (x shape, param shape, axis, block_size)
    ((3, 5, 4), (), 1, 0),
    ((3, 5, 4), (1,), 1, 0),
    ((3, 5, 4), (5,), 1, 0),
    ((3, 5, 4), (4,), -1, 0),
    ((3, 5, 4), (3, 2, 4), 1, 3),   # partial last block (5 = 3 + 2)
    ((3, 5, 4), (3, 5, 1), 2, 4),   # one block
    ((3, 5, 4), (1, 5, 4), 0, 4),
    ((6, 7), (6, 2), -1, 4),
    ((7,), (4,), 0, 2),
]


@pytest.mark.parametrize("gran", GRANULARITIES, ids=lambda g: f"{g[0]}-{g[1]}-ax{g[2]}-b{g[3]}")
@pytest.mark.parametrize("out", INTS + FLOATS)
def test_engine_quantize_granularities(out, gran, engine_level):
    x_shape, p_shape, axis, block = gran
    rng = np.random.default_rng(hash((out, gran)) % 2**32)
    x = _x(rng, x_shape, F32, spread=30.0 if out in INTS[:2] else 5.0)
    s = _scales(rng, p_shape, F32, 0.05, 1.5)
    if out in INTS:
        lo, hi, storage = oracle.INT_TYPES[out]
        zp = rng.integers(lo, hi + 1, size=p_shape).astype(storage)
    else:
        zp = None
    for sat in (0, 1):
        got = qlinear.quantize_linear(x, s, zp, axis=axis, block_size=block, saturate=sat, output_dtype=STORAGE[out])
        want = oracle.quantize_linear_v(x, s, zp, axis=axis, block_size=block, saturate=sat,
                                        output_dtype=STORAGE[out])
        bits_equal(got, want)


PRECISIONS = [
    # (x dtype, scale dtype, precision, version)
    (F32, F16, None, 28), (F32, BF16, None, 28), (F16, F16, None, 28), (BF16, BF16, None, 28),
    (F16, F32, None, 28), (F16, F16, None, 21), (BF16, BF16, None, 19), (F32, F32, F16, 23),
    (F32, F16, F32, 25), (F32, F32, BF16, 28), (np.int32, F16, None, 28), (np.int32, BF16, None, 28),
    (np.int32, np.int32, None, 21), (F32, np.int32, None, 28), (F16, F32, BF16, 24),
]


@pytest.mark.parametrize("case", PRECISIONS, ids=lambda c: f"{np.dtype(c[0])}-{np.dtype(c[1])}-{c[2] and np.dtype(c[2])}-v{c[3]}")
@pytest.mark.parametrize("out", ["int8", "uint8", "int16", "int4", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_engine_quantize_division_precision(out, case, engine_level):
    xt, stype, prec, version = case
    if version < dtypes.get(out).since:
        pytest.skip(f"{out} needs version {dtypes.get(out).since}")
    rng = np.random.default_rng(7)
    x = _x(rng, (4, 6), xt, spread=3e4 if out == "int16" else 200.0)
    if stype == np.int32:
        s = rng.integers(1, 9, size=(6,)).astype(np.int32)
    else:
        s = _scales(rng, (6,), stype, 0.3, 70.0)
    if version < 21:  # no output_dtype yet: the zero point's type decides
        zp, od = np.zeros(6, STORAGE[out]), None
    else:
        zp, od = None, STORAGE[out]
    got = qlinear.quantize_linear(x, s, zp, axis=1, output_dtype=od, precision=prec, version=version)
    want = oracle.quantize_linear_v(x, s, zp, axis=1, output_dtype=od, precision=prec, version=version)
    bits_equal(got, want)


def test_engine_precision_changes_results(engine_level):
    """float16 division differs from float32 division on some inputs: P is honoured (else a
    broken P rule would pass every test above by luck)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-3e4, 3e4, 4096).astype(F32)
    s = F16(0.37)
    a = qlinear.quantize_linear(x, s, output_dtype=np.int16)                # P = float16
    b = qlinear.quantize_linear(x, s.astype(F32), output_dtype=np.int16)    # P = float32
    c = qlinear.quantize_linear(x.astype(F16), s, output_dtype=np.int16, version=21)  # P = float32
    assert np.any(a != b) and np.any(a != c)
    bits_equal(a, oracle.quantize_linear_v(x, s, output_dtype=np.int16))


def test_engine_float_zero_point_and_e8m0_scale(engine_level):
    rng = np.random.default_rng(5)
    x = _x(rng, (4, 8), F32, 20.0)
    for name in ("float8e4m3fn", "float8e5m2fnuz", "float6e2m3"):
        zp = oracle.as_format(oracle.encode_float(np.array([0.5, -1.0, 0.0, -0.0] * 2), name, 1), name)
        got = qlinear.quantize_linear(x, np.full(8, 1.5, F32), zp, axis=1)
        bits_equal(got, oracle.quantize_linear_v(x, np.full(8, 1.5, F32), zp, axis=1))
    s = np.array([100, 127, 130, 0, 254, 120, 127, 128], np.uint8).view(E8M0)
    for out in (np.int8, ml_dtypes.int4, ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn):
        got = qlinear.quantize_linear(x, s, axis=1, output_dtype=out)
        bits_equal(got, oracle.quantize_linear_v(x, s, axis=1, output_dtype=out))


def test_engine_huge_and_tiny_scales(engine_level):
    x = np.array([1.0, -1.0, 3e38, -3e38, 1e-30, 5.0, 0.0, -0.0], F32)
    for s in (F32(1e-38), F32(1e-45), F32(3e38), F16(6e-8), F16(65504), BF16(1e-38), BF16(3e38)):
        for out in ("int8", "int16", "uint4", "float8e4m3fn", "float8e5m2", "float6e3m2"):
            for sat in (0, 1):
                got = qlinear.quantize_linear(x, s, output_dtype=STORAGE[out], saturate=sat)
                bits_equal(got, oracle.quantize_linear_v(x, s, output_dtype=STORAGE[out], saturate=sat))


# ----------------------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("gran", GRANULARITIES, ids=lambda g: f"{g[0]}-{g[1]}-ax{g[2]}-b{g[3]}")
@pytest.mark.parametrize("xname", INTS + FLOATS)
def test_engine_dequantize_granularities(xname, gran, engine_level):
    x_shape, p_shape, axis, block = gran
    rng = np.random.default_rng(hash((xname, gran, 1)) % 2**32)
    if xname in INTS:
        lo, hi, storage = oracle.INT_TYPES[xname]
        x = rng.integers(lo, hi + 1, size=x_shape).astype(storage)
        zp = rng.integers(lo, hi + 1, size=p_shape).astype(storage)
    else:
        width = 1 + oracle.FLOAT_FORMATS[xname][0] + oracle.FLOAT_FORMATS[xname][1]
        x = oracle.as_format(rng.integers(0, 1 << width, size=x_shape), xname)
        zp = None
    combos = ((F32, None), (F16, None), (BF16, None), (F32, F16), (F16, BF16), (BF16, F32), (E8M0, None))
    k = GRANULARITIES.index(gran) + (INTS + FLOATS).index(xname)
    for stype, out in (combos[k % 7], combos[(k + 3) % 7]):  # every combination over the cases
        if stype is E8M0:
            s = rng.integers(110, 140, size=p_shape).astype(np.uint8).view(E8M0)
        else:
            s = _scales(rng, p_shape, stype, 0.001, 3.0)
        got = qlinear.dequantize_linear(x, s, zp, axis=axis, block_size=block, output_dtype=out)
        want = oracle.dequantize_linear_v(x, s, zp, axis=axis, block_size=block, output_dtype=out)
        bits_equal(got, want)


def test_engine_dequantize_int16_double_rounding_and_float_zero_point(engine_level):
    """int16 x, float16 output: one float32 product, then one rounding to float16 (FORMATS.md
    §3: this double rounding is the contract); float8 x with a non-zero zero point: the exact
    difference, rounded once to float32."""
    x = np.arange(-32768, 32768, 41).astype(np.int16)
    s = F16(0.0999)
    bits_equal(qlinear.dequantize_linear(x, s, np.int16(-3)), oracle.dequantize_linear_v(x, s, np.int16(-3)))
    codes = np.arange(256, dtype=np.uint8)
    for name in ("float8e5m2", "float8e5m2fnuz", "float8e4m3fn"):
        x8 = oracle.as_format(codes, name)
        zp = oracle.as_format(oracle.encode_float(np.array([2.0 ** -14]), name, 1), name).reshape(())
        bits_equal(qlinear.dequantize_linear(x8, F32(1), zp), oracle.dequantize_linear_v(x8, F32(1), zp))


def test_engine_int32_dequantize_and_huge_scales(engine_level):
    x = np.array([2**31 - 1, -(2**31), 2**24 + 1, 3, 0], np.int32)
    for s in (F32(3e38), F32(1e-45), F16(65504), BF16(3e38)):
        bits_equal(qlinear.dequantize_linear(x, s), oracle.dequantize_linear_v(x, s))


# ----------------------------------------------------------------------------- random cases


_QTYPES = INTS + FLOATS


def _every_level():
    """Context managers selecting the NumPy engine and each native ISA level this CPU runs."""
    from qlinear import _native
    yield _native.use_engine("numpy")
    if _native.available():
        for isa in _native.engine_info()["isas"]:
            yield _native.use_isa(isa)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_hypothesis_quantize_dequantize_every_level(data):
    rank = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    axis = data.draw(st.integers(-rank, rank - 1))
    kind = data.draw(st.sampled_from(["tensor", "axis", "blocked"]))
    d = shape[axis % rank]
    block = data.draw(st.integers(1, d + 1)) if kind == "blocked" else 0
    if kind == "tensor":
        p_shape = ()
    elif kind == "axis":
        p_shape = (d,)
    else:
        p_shape = tuple(-(-n // block) if i == axis % rank else n for i, n in enumerate(shape))
    out = data.draw(st.sampled_from(_QTYPES))
    stype = data.draw(st.sampled_from([F32, F16, BF16]))
    xtype = data.draw(st.sampled_from([F32, F16, BF16]))
    sat = data.draw(st.integers(0, 1))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = _x(rng, shape, xtype, spread=data.draw(st.sampled_from([0.5, 10.0, 1e3, 1e5])))
    s = _scales(rng, p_shape, stype, 0.01, 4.0)
    zp = None
    if out in INTS and data.draw(st.booleans()):
        lo, hi, storage = oracle.INT_TYPES[out]
        zp = rng.integers(lo, hi + 1, size=p_shape).astype(storage)
    want = oracle.quantize_linear_v(x, s, zp, axis=axis, block_size=block, saturate=sat, output_dtype=STORAGE[out])
    outd = data.draw(st.sampled_from([None, F32, F16, BF16]))
    want_y = oracle.dequantize_linear_v(want, s, zp, axis=axis, block_size=block, output_dtype=outd)
    for level in _every_level():
        with level:
            got = qlinear.quantize_linear(x, s, zp, axis=axis, block_size=block, saturate=sat,
                                          output_dtype=STORAGE[out])
            bits_equal(got, want)
            y = qlinear.dequantize_linear(want, s, zp, axis=axis, block_size=block, output_dtype=outd)
            bits_equal(y, want_y)


# ----------------------------------------------------------------------------- both engines


@pytest.mark.parametrize("out", ["int8", "uint8", "int16", "int4", "float8e4m3fn", "float4e2m1"])
def test_engine_quantize_routes(out, engine_level):
    """Every engine and ISA level: 8-bit per-tensor/per-axis (the native kernels), and the new
    types and attributes (the exact NumPy path on every level)."""
    rng = np.random.default_rng(11)
    x = _x(rng, (2, 6, 5), F32, 50.0)
    for s, block in ((F32(0.7), 0), (_scales(rng, (6,), F32), 0), (_scales(rng, (6,), F16), 0),
                     (_scales(rng, (2, 2, 5), F32), 4)):
        got = qlinear.quantize_linear(x, s, axis=1, block_size=block, output_dtype=STORAGE[out])
        bits_equal(got, oracle.quantize_linear_v(x, s, axis=1, block_size=block, output_dtype=STORAGE[out]))
        y = qlinear.dequantize_linear(got, s, axis=1, block_size=block)
        bits_equal(y, oracle.dequantize_linear_v(got, s, axis=1, block_size=block))


def test_engine_output_dtype_per_axis_without_zero_point(engine_level):
    """The 8-bit bug of issue 29: QuantizeLinear-21, output_dtype int8, per-axis y_scale and no
    zero point raised a shape error."""
    x = np.linspace(-50, 50, 24, dtype=F32).reshape(2, 3, 4)
    s = np.array([0.5, 1.0, 2.0], F32)
    got = qlinear.quantize_linear(x, s, axis=1, output_dtype=np.int8, version=21)
    bits_equal(got, oracle.quantize_linear_v(x, s, axis=1, output_dtype=np.int8))
    got = qlinear.quantize_linear(x, s, axis=1, output_dtype=3, version=21)  # ONNX's INT8
    assert got.dtype == np.int8


_ROUNDING_WANT: dict = {}


def _rounding_case(out):
    """int16 values (every one in [-1100, 1100], the extremes and 900 random others) times scales
    that put the float32 products at, and one ulp around, the float16/bfloat16 rounding
    midpoints, their subnormals and past their largest finite value; the oracle's results,
    computed once for every level."""
    rng = np.random.default_rng(16)
    x = np.concatenate([np.arange(-1100, 1101), [-32768, 32767], rng.integers(-32768, 32768, 900)]).astype(np.int16)
    scales = (F32(2.0 ** -30), F32(2.0 ** -10), F32(3.0517578e-05), F32(0.1), F32(1.0000001), F32(3e38))
    key = np.dtype(out).name
    if key not in _ROUNDING_WANT:
        _ROUNDING_WANT[key] = [oracle.dequantize_linear_v(x, s, output_dtype=out) for s in scales]
    return x, scales, _ROUNDING_WANT[key]


@pytest.mark.parametrize("out", [F16, BF16], ids=["float16", "bfloat16"])
def test_engine_dequantize_rounding_to_16bit_outputs(out, engine_level):
    """The one rounding of the float32 product to float16/bfloat16, on every level."""
    x, scales, wants = _rounding_case(out)
    for s, want in zip(scales, wants):
        bits_equal(qlinear.dequantize_linear(x, s, output_dtype=out), want)


@pytest.mark.parametrize("name", FLOATS)
def test_engine_every_code_dequantized_to_every_output(name, engine_level):
    """Every code of a narrow float format (NaN and infinities included), with a zero point and
    scales of each scale type, to float32, float16 and bfloat16."""
    width = oracle.decode_table(name).size
    x = oracle.as_format(np.arange(width, dtype=np.uint8), name)
    zp = oracle.as_format(oracle.encode_float(np.array([0.5]), name, 1), name).reshape(())
    for s in (F32(0.3), F16(1e-3), BF16(7.5), np.uint8(130).view(E8M0)):
        for out in (F32, F16, BF16):
            for z in (None, zp):
                got = qlinear.dequantize_linear(x, s, z, output_dtype=out)
                bits_equal(got, oracle.dequantize_linear_v(x, s, z, output_dtype=out))


LARGE = [
    # (x shape, param shape, axis, block): more than one task and one tile, threads (>= 2**17
    # elements), partial blocks, vector tails
    ((3, 301, 157), (), 1, 0),
    ((3, 301, 157), (301,), 1, 0),
    ((3, 301, 157), (157,), -1, 0),
    ((3, 301, 157), (3, 10, 157), 1, 32),
    ((3, 301, 157), (3, 301, 5), 2, 32),
    ((1, 70001, 3), (1, 70001, 1), 2, 3),
    ((300, 1000), (300, 8), 1, 128),
    ((1000, 300), (32, 300), 0, 32),
]


@pytest.mark.parametrize("gran", LARGE, ids=lambda g: f"{g[0]}-{g[1]}-ax{g[2]}-b{g[3]}")
@pytest.mark.parametrize("qname", ["int16", "uint4", "int2", "float8e4m3fn", "float8e5m2fnuz", "float6e3m2", "float4e2m1"])
def test_engine_large_granularities(qname, gran, engine_level):
    """Tensors of 10^5 elements and more: several tasks and tiles per run, both threads, partial
    blocks and vector tails. Compared with the NumPy engine, bit for bit (the oracle is too slow
    at this size; the NumPy path is checked against it on every granularity above)."""
    if engine_level == "numpy":
        pytest.skip("compares the native levels with the NumPy engine")
    from qlinear import _native
    x_shape, p_shape, axis, block = gran
    rng = np.random.default_rng(hash((qname, gran)) % 2**32)
    xt = F16 if "4" in qname else F32
    x = _x(rng, x_shape, xt, spread=3e4 if qname == "int16" else 20.0)
    s = _scales(rng, p_shape, BF16 if "6" in qname else F32, 0.05, 3.0)
    zp = None
    if qname in INTS:
        lo, hi, storage = oracle.INT_TYPES[qname]
        zp = rng.integers(lo, hi + 1, size=p_shape).astype(storage)

    def both(f, *args, **kw):
        got = f(*args, **kw)
        with _native.use_engine("numpy"):
            want = f(*args, **kw)
        bits_equal(got, want)
        return got
    for sat in (0, 1):
        q = both(qlinear.quantize_linear, x, s, zp, axis=axis, block_size=block, saturate=sat,
                 output_dtype=STORAGE[qname])
    for out in (None, F16):
        both(qlinear.dequantize_linear, q, s, zp, axis=axis, block_size=block, output_dtype=out)


def test_native_conversions_run_natively(monkeypatch):
    """The native engine computes the newer types itself: with the NumPy kernels disabled, every
    type still converts (so the engine tests above compare the native kernels, not a fallback)."""
    from qlinear import _native, _qdq
    if not _native.available():
        pytest.skip("native engine not built")

    def refuse(*args, **kwargs):
        raise AssertionError("the NumPy path ran")
    monkeypatch.setattr(_qdq, "quantize", refuse)
    monkeypatch.setattr(_qdq, "dequantize", refuse)
    x = np.linspace(-9, 9, 64, dtype=F32).reshape(4, 16)
    with _native.use_engine("native"):
        for name in INTS + FLOATS:
            q = qlinear.quantize_linear(x.astype(F16), F16(0.5), output_dtype=STORAGE[name])
            qlinear.dequantize_linear(q, np.full((4, 4), 0.5, F32), axis=1, block_size=4, output_dtype=BF16)
        qlinear.quantize_linear(x, np.full((4, 4), 3, np.uint8).view(E8M0), axis=1, block_size=4,
                                output_dtype=ml_dtypes.int4)


def test_engine_prepared_forms_match_plain_calls(engine_level):
    """PreparedQuantizeLinear / PreparedDequantizeLinear: the parameters checked once, the same
    bits as the plain calls (and the oracle) on every call, for several x shapes."""
    from qlinear.quantize import PreparedDequantizeLinear, PreparedQuantizeLinear
    rng = np.random.default_rng(21)
    s = _scales(rng, (3, 2, 4), F16, 0.05, 2.0)
    zp = rng.integers(-8, 8, (3, 2, 4)).astype(ml_dtypes.int4)
    pq = PreparedQuantizeLinear(s, zp, axis=1, block_size=4, output_dtype=ml_dtypes.int4)
    pd = PreparedDequantizeLinear(s, zp, axis=1, block_size=4, output_dtype=BF16)
    for d in (5, 8, 5):
        x = _x(rng, (3, d, 4), F32, 10.0)
        q = pq.run(x)
        bits_equal(q, oracle.quantize_linear_v(x, s, zp, axis=1, block_size=4, output_dtype=ml_dtypes.int4))
        bits_equal(q, qlinear.quantize_linear(x, s, zp, axis=1, block_size=4, output_dtype=ml_dtypes.int4))
        bits_equal(pd.run(q), oracle.dequantize_linear_v(q, s, zp, axis=1, block_size=4, output_dtype=BF16))
    with pytest.raises(ValueError, match="y_scale must have shape"):
        pq.run(np.zeros((3, 9, 4), F32))
    p8 = PreparedQuantizeLinear(np.float32(0.5), saturate=0, output_dtype=ml_dtypes.float8_e4m3fn)
    x = _boundaries("float8e4m3fn")
    bits_equal(p8.run(x), oracle.quantize_linear_v(x, np.float32(0.5), saturate=0,
                                                    output_dtype=ml_dtypes.float8_e4m3fn))


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_blocked_int4_memory(op):
    """A blocked int4 Q or DQ never holds a float32 copy of the scales broadcast to the tensor:
    the peak above input + output stays <= 10% of the output (traced NumPy allocations)."""
    rows, cols, block = 2048, 1024, 32
    rng = np.random.default_rng(0)
    s = _scales(rng, (rows, cols // block), F32)
    if op == "quantize":
        x = rng.normal(0, 1, (rows, cols)).astype(F32)
        out_bytes = rows * cols
        call = lambda: qlinear.quantize_linear(x, s, axis=1, block_size=block, output_dtype=ml_dtypes.int4)  # noqa: E731
    else:
        x = rng.integers(-8, 8, (rows, cols)).astype(ml_dtypes.int4)
        out_bytes = rows * cols * 4
        call = lambda: qlinear.dequantize_linear(x, s, axis=1, block_size=block)  # noqa: E731
    call()  # warm caches
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        y = call()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert y.nbytes == out_bytes
    assert peak - out_bytes <= 0.10 * out_bytes, f"peak {peak} bytes above the output's {out_bytes}"


_RSS_CHILD = r"""
import sys
import ml_dtypes
import numpy as np
import qlinear
op, broadcast = sys.argv[1], sys.argv[2] == "1"
rows, cols, block = 4096, 4096, 32
rng = np.random.default_rng(0)
s = rng.uniform(0.01, 2.0, (rows // block, cols)).astype(np.float32)
if op == "quantize":
    x = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    call = lambda a, b: qlinear.quantize_linear(a, b, axis=0, block_size=block, output_dtype=ml_dtypes.int4)
else:
    x = rng.integers(-8, 8, (rows, cols)).astype(ml_dtypes.int4)
    call = lambda a, b: qlinear.dequantize_linear(a, b, axis=0, block_size=block)
call(x[:64], s[:2])  # every code path warm, nothing of the measured size kept
before = reset_peak()
if broadcast:  # what the test must catch: the scales broadcast to the tensor, as float32
    full = np.repeat(s, block, axis=0)
y = call(x, s)
print((status_kib("VmHWM") - before) * 1024, y.nbytes)
"""


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_native_blocked_int4_memory_rss(op):
    """The native engine's blocked int4 Q / DQ (4096 x 4096, block 32): the peak resident set
    above the inputs stays within the output plus 10% of it (a child process; /proc's VmHWM).
    The same measurement with a float32 copy of the scales broadcast to the tensor fails."""
    import subprocess
    import sys
    import rss_probe
    from qlinear import _native
    if not _native.available():
        pytest.skip("native engine not built")
    if "asan" in __import__("os").environ.get("LD_PRELOAD", ""):
        pytest.skip("resident-set sizes mean nothing under AddressSanitizer (scripts/sanitize.sh)")
    here = __import__("os").path.dirname(__file__)

    def measure(broadcast):
        out = subprocess.run([sys.executable, "-c", rss_probe.PRELUDE + _RSS_CHILD, op, str(int(broadcast))],
                             capture_output=True, text=True, check=True, cwd=here)
        peak, out_bytes = map(int, out.stdout.split())
        return peak, out_bytes
    peak, out_bytes = measure(False)
    assert peak - out_bytes <= 0.10 * out_bytes, f"peak {peak} bytes above the output's {out_bytes}"
    peak, out_bytes = measure(True)
    assert peak - out_bytes > 0.10 * out_bytes  # the measurement sees a broadcast copy


# ----------------------------------------------------------------------------- bad input


def _bad_cases():
    x = np.zeros((2, 6), F32)
    i4 = ml_dtypes.int4
    return {
        "scale shape fits no granularity": (ValueError, "y_scale", lambda: qlinear.quantize_linear(x, np.ones((2, 3), F32))),
        "block size mismatch": (ValueError, "y_scale", lambda: qlinear.quantize_linear(
            x, np.ones((2, 2), F32), axis=1, block_size=2, output_dtype=i4)),
        "extra blocks": (ValueError, "x_scale", lambda: qlinear.dequantize_linear(
            np.zeros((2, 6), i4), np.ones((2, 4), F32), axis=1, block_size=2)),
        "zero point type != output_dtype": (TypeError, "y_zero_point", lambda: qlinear.quantize_linear(
            x, F32(1), np.int8(0), output_dtype=np.int16)),
        "non-zero int32 zero point": (ValueError, "x_zero_point", lambda: qlinear.dequantize_linear(
            np.zeros(3, np.int32), F32(1), np.int32(2))),
        "e8m0 NaN scale": (ValueError, "x_scale", lambda: qlinear.dequantize_linear(
            np.zeros(3, np.int8), np.uint8(255).reshape(()).view(E8M0))),
        "e8m0 scale before version 24": (TypeError, "y_scale", lambda: qlinear.quantize_linear(
            x, np.uint8(127).reshape(()).view(E8M0), version=23)),
        "int4 before version 21": (TypeError, "output", lambda: qlinear.quantize_linear(
            x, F32(1), np.zeros((), i4), version=19)),
        "float4 before version 23": (TypeError, "output", lambda: qlinear.quantize_linear(
            x, F32(1), output_dtype=ml_dtypes.float4_e2m1fn, version=21)),
        "int2 before version 25": (TypeError, "x", lambda: qlinear.dequantize_linear(
            np.zeros(3, ml_dtypes.int2), F32(1), version=24)),
        "float6 before version 28": (TypeError, "x", lambda: qlinear.dequantize_linear(
            np.zeros(3, ml_dtypes.float6_e2m3fn), F32(1), version=25)),
        "precision before version 23": (ValueError, "precision", lambda: qlinear.quantize_linear(
            x, F32(1), precision=F16, version=21)),
        "precision not a float type": (TypeError, "precision", lambda: qlinear.quantize_linear(
            x, F32(1), precision=np.int8)),
        "block_size before version 21": (ValueError, "block_size", lambda: qlinear.quantize_linear(
            x, np.ones((2, 3), F32), block_size=2, version=19)),
        "x and scale types differ at version 21": (TypeError, "y_scale", lambda: qlinear.quantize_linear(
            x, F16(1), version=21)),
        "output_dtype not a quantized type": (TypeError, "output_dtype", lambda: qlinear.quantize_linear(
            x, F32(1), output_dtype=np.float64)),
        "DQ output_dtype int8": (TypeError, "output_dtype", lambda: qlinear.dequantize_linear(
            np.zeros(3, np.int8), F32(1), output_dtype=np.int8)),
        "saturate 2": (ValueError, "saturate", lambda: qlinear.quantize_linear(
            x, F32(1), output_dtype=ml_dtypes.float8_e4m3fn, saturate=2)),
        "negative block_size": (ValueError, "block_size", lambda: qlinear.quantize_linear(x, F32(1), block_size=-1)),
        "float16 scale underflows in P": (ValueError, "y_scale", lambda: qlinear.quantize_linear(
            x, F32(1e-10), precision=F16)),
        "zero bfloat16 scale": (ValueError, "y_scale", lambda: qlinear.quantize_linear(x, BF16(0))),
        "version 9": (ValueError, "version", lambda: qlinear.quantize_linear(x, F32(1), version=9)),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_clear_error(case):
    exc, name, fn = BAD[case]
    with pytest.raises(exc, match=rf"^(quantize|dequantize)_linear: .*\b{name}\b") as info:
        fn()
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- QLinearMatMul-21

_MM_TYPES = ["int8", "uint8", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"]


def _mm_operand(rng, name, shape, specials=False):
    if name in INTS:
        lo, hi, storage = oracle.INT_TYPES[name]
        return rng.integers(lo, hi + 1, size=shape).astype(storage)
    codes = rng.integers(0, 256, size=shape).astype(np.uint8)
    x = oracle.as_format(codes, name)
    if not specials:  # NaN/inf codes replaced by finite ones
        f = x.astype(np.float32)
        codes = np.where(np.isfinite(f), codes, codes & 0x3F)
        x = oracle.as_format(codes, name)
    return x


def _mm_zero(rng, name, shape):
    if name in INTS:
        lo, hi, storage = oracle.INT_TYPES[name]
        return rng.integers(lo, hi + 1, size=shape).astype(storage)
    vals = rng.choice([0.0, 0.5, -2.0, 0.0], size=shape)
    return oracle.as_format(oracle.encode_float(np.asarray(vals, np.float64), name, 1), name)


@pytest.mark.parametrize("yt", ["uint8", "int8", "float8e4m3fn", "float8e5m2"])
@pytest.mark.parametrize("at,bt", [(x, w) for x in _MM_TYPES for w in _MM_TYPES
                                   if "float8" in x or "float8" in w] + [("int8", "uint8")])
def test_qlinear_matmul_21(at, bt, yt):
    rng = np.random.default_rng(abs(hash((at, bt, yt))) % 2**32)
    M, K, N = 3, 7, 4
    a = _mm_operand(rng, at, (M, K))
    b = _mm_operand(rng, bt, (K, N))
    for gran in ("tensor", "row-col"):
        shp_a, shp_b = ((), ()) if gran == "tensor" else ((M,), (N,))
        stypes = [F32, F16, BF16]
        sa = _scales(rng, shp_a, stypes[rng.integers(3)], 0.01, 0.5)
        sb = _scales(rng, shp_b, stypes[rng.integers(3)], 0.01, 0.5)
        ys = _scales(rng, (), stypes[rng.integers(3)], 0.5, 4.0)
        za, zb, zy = _mm_zero(rng, at, shp_a), _mm_zero(rng, bt, shp_b), _mm_zero(rng, yt, ())
        got = qlinear.qlinear_matmul(a, sa, za, b, sb, zb, ys, zy)
        want = oracle.qlinear_matmul_v21(a, sa, za, b, sb, zb, ys, zy)
        bits_equal(got, want)


def test_qlinear_matmul_21_specials_and_wide_sums():
    """NaN/inf operands (IEEE rules), and e5m2 x e5m2 sums beyond int64 (the split path)."""
    rng = np.random.default_rng(9)
    for at, bt in (("float8e5m2", "float8e5m2"), ("float8e4m3fn", "float8e5m2"), ("float8e5m2fnuz", "int8")):
        a = _mm_operand(rng, at, (4, 9), specials=True)
        b = _mm_operand(rng, bt, (9, 3), specials=True)
        for yt in ("int8", "float8e4m3fn"):
            z = lambda n, s=(): _mm_zero(rng, n, s) * 0 if n in INTS else oracle.as_format(np.zeros(s, np.uint8), n)  # noqa: E731
            got = qlinear.qlinear_matmul(a, F32(0.01), z(at), b, F32(0.02), z(bt), F32(1e6), z(yt))
            bits_equal(got, oracle.qlinear_matmul_v21(a, F32(0.01), z(at), b, F32(0.02), z(bt), F32(1e6), z(yt)))
    # largest magnitudes: every product 57344^2 units of 2^-32, K = 600 (> 2^63 in int64 units)
    a = oracle.as_format(np.full((2, 600), 0x7B, np.uint8), "float8e5m2")
    b = oracle.as_format(np.array([[0x7B], [0xFB]] * 300, np.uint8), "float8e5m2")
    b = np.concatenate([b, oracle.as_format(np.full((600, 1), 0x04, np.uint8), "float8e5m2")], axis=1)
    zero = oracle.as_format(np.zeros((), np.uint8), "float8e5m2")
    for ys in (F32(1e9), F32(1e5)):
        got = qlinear.qlinear_matmul(a, F32(1), zero, b, F32(1), zero, ys, np.int8(0))
        bits_equal(got, oracle.qlinear_matmul_v21(a, F32(1), zero, b, F32(1), zero, ys, np.int8(0)))


def test_engine_qlinear_matmul_21_batched_and_8bit_float16_scales(engine_level):
    """Batches and 1-D operands follow numpy.matmul (checked slice by slice against the
    oracle); 8-bit operands with float16/bfloat16 scales take the 8-bit contract (the native
    kernels) with the scales widened exactly."""
    rng = np.random.default_rng(4)
    a = _mm_operand(rng, "float8e4m3fn", (2, 3, 5))
    b = _mm_operand(rng, "int8", (5, 4))
    za, zb, zy = oracle.as_format(np.zeros((), np.uint8), "float8e4m3fn"), np.int8(3), np.uint8(7)
    got = qlinear.qlinear_matmul(a, F16(0.1), za, b, BF16(0.2), zb, F32(0.3), zy)
    for i in range(2):
        bits_equal(got[i], oracle.qlinear_matmul_v21(a[i], F16(0.1), za, b, BF16(0.2), zb, F32(0.3), zy))
    v = qlinear.qlinear_matmul(a[0, 0], F16(0.1), za, b, BF16(0.2), zb, F32(0.3), zy)
    bits_equal(v, oracle.qlinear_matmul_v21(a[0, :1], F16(0.1), za, b, BF16(0.2), zb, F32(0.3), zy)[0])
    a8 = _mm_operand(rng, "uint8", (6, 9))
    b8 = _mm_operand(rng, "int8", (9, 5))
    sb = _scales(rng, (5,), F16, 0.01, 0.1)
    got = qlinear.qlinear_matmul(a8, BF16(0.05), np.uint8(128), b8, sb, np.zeros(5, np.int8), F16(0.7), np.int8(-3))
    bits_equal(got, oracle.qlinear_matmul_v21(a8, BF16(0.05), np.uint8(128), b8, sb, np.zeros(5, np.int8),
                                              F16(0.7), np.int8(-3)))
    # ... which is the 10's contract on float32-widened scales
    bits_equal(got, qlinear.qlinear_matmul(a8, F32(BF16(0.05)), np.uint8(128), b8, sb.astype(F32),
                                           np.zeros(5, np.int8), F32(F16(0.7)), np.int8(-3)))


def _f8(name, values):
    return oracle.as_format(oracle.encode_float(np.asarray(values, np.float64), name, 1), name)


def test_qlinear_matmul_21_accumulator_rounds_once():
    """The exact sum is rounded to float32 once: sums built so that a rounding through float64
    first (double rounding) lands on a tie and gives another output. int64 path (e4m3fn x
    e5m2, S = 2**60 + 2**36 + 1 units) and the split path (e5m2 x e5m2, S = 2**64 + 2**40 + 1)."""
    zero4, zero5 = _f8("float8e4m3fn", 0.0).reshape(()), _f8("float8e5m2", 0.0).reshape(())
    a = _f8("float8e4m3fn", [[256.0] * 4097 + [2.0 ** -9]])
    b = _f8("float8e5m2", [[32768.0]] * 4096 + [[8.0], [2.0 ** -16]])
    got = qlinear.qlinear_matmul(a, F32(100.5), zero4, b, F32(2.0 ** -35), zero5, F32(1), np.int8(0))
    want = oracle.qlinear_matmul_v21(a, F32(100.5), zero4, b, F32(2.0 ** -35), zero5, F32(1), np.int8(0))
    assert int(want[0, 0]) == 101
    bits_equal(got, want)
    a = _f8("float8e5m2", [[32768.0] * 4 + [256.0, 2.0 ** -16]])
    b = _f8("float8e5m2", [[32768.0]] * 4 + [[1.0], [2.0 ** -16]])
    got = qlinear.qlinear_matmul(a, F32(100.5), zero5, b, F32(2.0 ** -32), zero5, F32(1), np.int8(0))
    want = oracle.qlinear_matmul_v21(a, F32(100.5), zero5, b, F32(2.0 ** -32), zero5, F32(1), np.int8(0))
    assert int(want[0, 0]) == 101
    bits_equal(got, want)


def test_qlinear_matmul_21_multiplier_order():
    """m = float32(float32(a_scale · b_scale) / y_scale), in that order: scales found (seeded
    search) where another order moves y = 1 · m across 0.5."""
    rng = np.random.default_rng(0)
    sa = rng.uniform(0.5, 2, 200000).astype(F32)
    ys = rng.uniform(0.5, 2, 200000).astype(F32)
    sb = ((F32(0.5) * ys) / sa).astype(F32)
    m1 = (sa * sb) / ys
    m2 = sa * (sb / ys)
    i = int(np.flatnonzero(np.rint(m1) != np.rint(m2))[0])
    a = _f8("float8e4m3fn", [[1.0]])
    zero = _f8("float8e4m3fn", 0.0).reshape(())
    got = qlinear.qlinear_matmul(a, sa[i], zero, np.ones((1, 1), np.int8), sb[i], np.int8(0), ys[i], np.uint8(0))
    assert int(got[0, 0]) == int(np.rint(m1[i]))


def test_engine_repeat_cache_keeps_attributes_apart(engine_level):
    """The per-tensor repeat-call cache is keyed on the scale/zero-point objects only: a call
    with output_dtype or another version must not leave an entry a plain call would take."""
    x = np.linspace(-300, 300, 64, dtype=F32)
    s = F32(2.0)
    a = qlinear.quantize_linear(x, s, output_dtype=np.int8)
    b = qlinear.quantize_linear(x, s)
    c = qlinear.quantize_linear(x, s, output_dtype=np.int8)
    assert a.dtype == np.int8 and b.dtype == np.uint8 and c.dtype == np.int8
    bits_equal(b, oracle.quantize_linear_v(x, s))
    bits_equal(c, oracle.quantize_linear_v(x, s, output_dtype=np.int8))
    d = qlinear.dequantize_linear(c, s, version=13)
    bits_equal(qlinear.dequantize_linear(c, s), d)


# ----------------------------------------------------------------------------- ONNX's own cases


#: the node cases onnx 1.23 ships for the family (test_onnx_family_cases_are_listed guards the list)
ONNX_CASES = [
    "test_dequantizelinear",
    "test_dequantizelinear_axis",
    "test_dequantizelinear_blocked",
    "test_dequantizelinear_e4m3fn",
    "test_dequantizelinear_e4m3fn_float16",
    "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2",
    "test_dequantizelinear_float4e2m1",
    "test_dequantizelinear_int16",
    "test_dequantizelinear_int2",
    "test_dequantizelinear_int4",
    "test_dequantizelinear_uint16",
    "test_dequantizelinear_uint2",
    "test_dequantizelinear_uint4",
    "test_qlinearmatmul_2D_int8_float16",
    "test_qlinearmatmul_2D_int8_float32",
    "test_qlinearmatmul_2D_uint8_float16",
    "test_qlinearmatmul_2D_uint8_float32",
    "test_qlinearmatmul_3D_int8_float16",
    "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_3D_uint8_float16",
    "test_qlinearmatmul_3D_uint8_float32",
    "test_quantizelinear",
    "test_quantizelinear_axis",
    "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_blocked_symmetric",
    "test_quantizelinear_e4m3fn",
    "test_quantizelinear_e5m2",
    "test_quantizelinear_float4e2m1",
    "test_quantizelinear_int16",
    "test_quantizelinear_int2",
    "test_quantizelinear_int4",
    "test_quantizelinear_uint16",
    "test_quantizelinear_uint2",
    "test_quantizelinear_uint4",
]


def _onnx_family_cases():
    # test_onnx_cases collects onnx's node cases once per process (several seconds): shared
    from test_onnx_cases import onnx_cases
    return {n: c for n, c in onnx_cases().items()
            if n.startswith(("test_quantizelinear", "test_dequantizelinear", "test_qlinearmatmul"))}


def test_onnx_family_cases_are_listed():
    assert sorted(_onnx_family_cases()) == sorted(ONNX_CASES)


@pytest.mark.parametrize("name", ONNX_CASES)
def test_onnx_node_cases(name):
    """Every node test case onnx ships for QuantizeLinear, DequantizeLinear and QLinearMatMul,
    at the model's opset version, bit for bit against ONNX's expected output and the oracle."""
    import onnx
    from onnx import helper, numpy_helper

    def array(a):
        return numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)

    case = _onnx_family_cases()[name]
    (node,) = case.model.graph.node
    version = [o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")][0]
    fn = {"QuantizeLinear": (qlinear.quantize_linear, oracle.quantize_linear_v),
          "DequantizeLinear": (qlinear.dequantize_linear, oracle.dequantize_linear_v),
          "QLinearMatMul": (qlinear.qlinear_matmul, None)}[node.op_type]
    for inputs, outputs in case.data_sets:
        present = iter([array(a) for a in inputs])
        args = [next(present) if n else None for n in node.input]
        kwargs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        want = array(outputs[0])
        if node.op_type == "QLinearMatMul":
            bits_equal(fn[0](*args, **kwargs), want)
            continue
        got = fn[0](*args, **kwargs, version=version)
        bits_equal(got, want)
        if "output_dtype" in kwargs:
            kwargs["output_dtype"] = dtypes.from_onnx(kwargs["output_dtype"]).dtype
        bits_equal(fn[1](*args, **kwargs, version=version) if node.op_type == "QuantizeLinear"
                   else fn[1](*args, **kwargs), want)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_hypothesis_qlinear_matmul_21(data):
    at = data.draw(st.sampled_from(_MM_TYPES))
    bt = data.draw(st.sampled_from(_MM_TYPES))
    yt = data.draw(st.sampled_from(_MM_TYPES))
    M, K, N = (data.draw(st.integers(1, 6)) for _ in range(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    specials = data.draw(st.booleans())
    a = _mm_operand(rng, at, (M, K), specials)
    b = _mm_operand(rng, bt, (K, N), specials)
    per_row, per_col = data.draw(st.booleans()), data.draw(st.booleans())
    shp_a, shp_b = ((M,) if per_row else ()), ((N,) if per_col else ())
    stypes = [F32, F16, BF16]
    sa = _scales(rng, shp_a, stypes[data.draw(st.integers(0, 2))], 1e-3, 1.0)
    sb = _scales(rng, shp_b, stypes[data.draw(st.integers(0, 2))], 1e-3, 1.0)
    ys = _scales(rng, (), stypes[data.draw(st.integers(0, 2))], 1e-3, 10.0)
    za, zb, zy = _mm_zero(rng, at, shp_a), _mm_zero(rng, bt, shp_b), _mm_zero(rng, yt, ())
    got = qlinear.qlinear_matmul(a, sa, za, b, sb, zb, ys, zy)
    bits_equal(got, oracle.qlinear_matmul_v21(a, sa, za, b, sb, zb, ys, zy))


def test_int32_x_rounds_once_to_bfloat16():
    """An int32 x goes to P = bfloat16 in one rounding: 2**30 + 2**22 + 1 is above the midpoint
    between two bfloat16 values, but through float32 it becomes the midpoint and ties to even."""
    x = np.array([2**30 + 2**22 + 1, -(2**30 + 2**22 + 1), 2**30 + 2**22, 2**24 + 2**16 + 1], np.int32)
    s = BF16(2.0 ** 23)
    got = qlinear.quantize_linear(x, s, output_dtype=np.int16)
    assert got[0] == 129 and got[1] == -129 and got[2] == 128
    bits_equal(got, oracle.quantize_linear_v(x, s, output_dtype=np.int16))


def test_backend_quantize_21_output_dtype_per_axis_without_zero_point():
    """Issue 29's 8-bit bug through the graph runtime: QuantizeLinear-21, output_dtype int8,
    per-axis y_scale, no zero point."""
    import onnx
    from onnx import helper, numpy_helper

    from qlinear import backend
    T = onnx.TensorProto
    s = np.array([0.5, 1.0, 2.0], F32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, output_dtype=T.INT8)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", T.INT8, [2, 3, 4])],
                              [numpy_helper.from_array(s, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.linspace(-300, 300, 24, dtype=F32).reshape(2, 3, 4)
    (y,) = backend.prepare(model).run([x])
    bits_equal(y, oracle.quantize_linear_v(x, s, axis=1, output_dtype=np.int8))


@pytest.mark.parametrize("name", ["float8e4m3fn", "float8e5m2fnuz", "int2", "float4e2m1", "float6e3m2", "int4", "int16"])
def test_backend_qdq_models_with_newer_types(name):
    """A QDQ MatMul whose Q/DQ pairs use a newer type runs in the default (fusing) mode as
    written (no fusion takes float formats or 2/4-bit integers), bit for bit as the literal
    mode, which is the functions' arithmetic node by node."""
    import onnx
    from onnx import helper, numpy_helper

    from qlinear import backend
    T = onnx.TensorProto
    t = dtypes.get(name)
    rng = np.random.default_rng(2)
    w = qlinear.quantize_linear(rng.normal(0, 2, (8, 4)).astype(F32), F32(0.5), output_dtype=t.dtype)
    zero = np.zeros((), t.dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "z"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(F32(0.05), "s"),
             numpy_helper.from_array(zero, "z"), numpy_helper.from_array(F32(0.5), "ws")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [3, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [3, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    x = rng.normal(0, 1, (3, 8)).astype(F32)
    fused = backend.prepare(model).run([x])[0]
    literal = backend.prepare(model, qdq="literal").run([x])[0]
    bits_equal(fused, literal)
    xd = qlinear.dequantize_linear(qlinear.quantize_linear(x, F32(0.05), zero), F32(0.05), zero)
    np.testing.assert_allclose(literal, xd @ qlinear.dequantize_linear(w, F32(0.5), zero), rtol=1e-5, atol=1e-6)
