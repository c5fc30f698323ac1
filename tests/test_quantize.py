"""Differential and hand-derived tests for qlinear.quantize_linear / qlinear.dequantize_linear."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import I8, I32, U8, assert_exact, call_untouched, rand_int

F32 = np.float32


def check_q(*args, **kwargs):
    want = oracle.quantize_linear(*args, **kwargs)
    got = call_untouched(qlinear.quantize_linear, *args, **kwargs)
    assert_exact(got, want)
    return got


def check_dq(*args, **kwargs):
    want = oracle.dequantize_linear(*args, **kwargs)
    got = call_untouched(qlinear.dequantize_linear, *args, **kwargs)
    assert_exact(got, want)
    return got


def near_ties(rng, scale, n):
    """float32 x with x / scale within a few ulps of k + 0.5 (where rounding choices matter)."""
    k = rng.integers(-140, 140, n)
    x = ((k + 0.5) * np.asarray(scale, np.float64)).astype(F32)
    steps = rng.integers(-2, 2, n, endpoint=True)
    for _ in range(2):
        up = steps > 0
        down = steps < 0
        x = np.where(up, np.nextafter(x, F32(np.inf)), np.where(down, np.nextafter(x, F32(-np.inf)), x))
        steps = steps - np.sign(steps)
    return x.astype(F32)


# ----------------------------------------------------------------------------- QuantizeLinear


@pytest.mark.parametrize("zp_kind", ["none", "uint8", "int8"])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 2, 2)])
def test_quantize_per_tensor(shape, zp_kind):
    rng = np.random.default_rng([len(shape), ["none", "uint8", "int8"].index(zp_kind), 41])
    for _ in range(5):
        scale = F32(rng.uniform(0.001, 4))
        x = (rng.standard_normal(shape) * float(rng.choice([1, 30, 300])) * scale).astype(F32)
        if zp_kind == "none":
            y = check_q(x, scale)
            assert y.dtype == U8
        else:
            dt = U8 if zp_kind == "uint8" else I8
            y = check_q(x, scale, rand_int(rng, dt, ()))
            assert y.dtype == dt
            check_q(x, scale, rand_int(rng, dt, (1,)))
            check_q(x, np.array([scale]), dt(np.iinfo(dt).min))
            check_q(x, float(scale), dt(np.iinfo(dt).max))


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("shape,axis", [
    ((6,), 0), ((6,), -1),
    ((3, 4), 0), ((3, 4), 1), ((3, 4), -1), ((3, 4), -2),
    ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), -3), ((2, 3, 4), 0),
    ((1, 3, 2, 5), 1), ((1, 3, 2, 5), 3), ((1, 3, 2, 5), -2),
])
def test_quantize_per_axis(shape, axis, dt):
    rng = np.random.default_rng([len(shape), axis + 5, int(dt == I8), 42])
    n = shape[axis]
    scale = rng.uniform(0.01, 2, n).astype(F32)
    x = (rng.standard_normal(shape) * 100).astype(F32)
    y = check_q(x, scale, rand_int(rng, dt, (n,)), axis=axis)
    assert y.shape == shape and y.dtype == dt
    check_q(x, scale, axis=axis)  # no zero point: uint8, 0
    # per-tensor parameters ignore the axis
    check_q(x, F32(0.5), dt(3), axis=axis)
    # near-tie values along the axis
    xt = near_ties(rng, scale.reshape([n if i == axis % len(shape) else 1 for i in range(len(shape))]),
                   shape).reshape(shape)
    check_q(xt, scale, rand_int(rng, dt, (n,)), axis=axis)


def test_quantize_axis_default_is_1():
    rng = np.random.default_rng(43)
    x = (rng.standard_normal((2, 3, 4)) * 50).astype(F32)
    scale = np.array([0.5, 1.0, 2.0], F32)
    zp = np.array([1, 2, 3], U8)
    assert_exact(qlinear.quantize_linear(x, scale, zp), oracle.quantize_linear(x, scale, zp, axis=1))


@pytest.mark.parametrize("dt", [U8, I8])
def test_ties_to_even(dt):
    zp = dt(10)
    # x / scale is exactly k + 0.5 (power-of-two scale and a non power of two)
    halves = np.array([-4.5, -3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5], np.float64)
    expected = [-4, -4, -2, -2, 0, 0, 2, 2, 4, 4]
    for scale in (0.25, 3.0, 1.0, 0.75):
        x = (halves * scale).astype(F32)
        assert np.array_equal(x.astype(np.float64) / scale, halves)  # exact halves by construction
        y = check_q(x, F32(scale), zp)
        assert y.astype(int).tolist() == [e + 10 for e in expected]


@pytest.mark.parametrize("dt", [U8, I8])
def test_saturation_and_infinities(dt):
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    x = np.array([1e6, -1e6, 3e38, -3e38, np.inf, -np.inf, 127.6, -128.6, 255.4, 255.6], F32)
    for zp in (lo, 0 if dt == I8 else 128, hi):
        y = check_q(x, F32(1e-3), dt(zp))
        assert y[:6].tolist() == [hi, lo, hi, lo, hi, lo]
    # at scale 1, zero point 0: exactly the clamp of the rounded value
    y = check_q(x, F32(1.0), dt(0))
    assert y.tolist() == [hi, lo, hi, lo, hi, lo, min(128, hi), max(-129, lo), min(255, hi), min(256, hi)]


@pytest.mark.parametrize("dt", [U8, I8])
def test_nan_gives_type_minimum(dt):
    """NaN -> T's min (what onnxruntime's CPU kernel gives; see test_onnxruntime.py)."""
    x = np.array([np.nan, 1.0, -np.nan, np.float32(np.nan) * 0], F32)
    for zp in (np.iinfo(dt).min, 0, np.iinfo(dt).max, 7):
        y = check_q(x, F32(0.5), dt(zp))
        assert y[[0, 2, 3]].tolist() == [np.iinfo(dt).min] * 3
    assert check_q(np.array([np.nan], F32), F32(2.0)).tolist() == [0]


def test_division_not_reciprocal_hand_picked():
    # x / s in float32 is exactly -9.5 -> -10 (ties to even); x * float32(1 / s) is -9.499999 -> -9
    x = F32(float.fromhex("-0x1.f087d8p+2"))
    s = F32(float.fromhex("0x1.a2218ep-1"))
    assert np.rint(x * (F32(1) / s)) == -9
    assert check_q(np.array([x]), s, I8(0)).tolist() == [-10]
    # x / s is exactly 14.5 -> 14; the reciprocal product is 14.500001 -> 15
    x = F32(float.fromhex("0x1.c3432ep+4"))
    s = F32(float.fromhex("0x1.f1f1dap+0"))
    assert np.rint(x * (F32(1) / s)) == 15
    assert check_q(np.array([x]), s, U8(0)).tolist() == [14]


def test_division_not_reciprocal_search():
    """Among near-tie inputs, find those where x / s and x * (1 / s) round differently."""
    rng = np.random.default_rng(44)
    n = 20000
    s = rng.uniform(0.01, 3, n).astype(F32)
    x = near_ties(rng, s, n)
    by_division = np.rint(np.divide(x, s, dtype=F32))
    by_reciprocal = np.rint(np.multiply(x, np.divide(F32(1), s, dtype=F32), dtype=F32))
    differ = by_division != by_reciprocal
    assert differ.sum() > 100
    xd, sd = x[differ], s[differ]
    # per-axis along the only axis: each element gets its own scale
    y = check_q(xd, sd, np.full(xd.shape, 0, I8), axis=0)
    assert np.array_equal(y.astype(np.float64), np.clip(by_division[differ], -128, 127))
    # the whole sample, per element, for both output types
    check_q(x, s, np.zeros(n, U8) + 128, axis=0)
    check_q(x, s, np.zeros(n, I8), axis=0)


@pytest.mark.parametrize("xi,scale_hex,want", [
    # int32 inputs are first converted to float32: float32(463644408) = 463644416, and
    # 463644416 / s rounds to 53.5 in float32 -> 54; the exact quotient 53.4999976 would give 53
    (463644408, "0x1.087916p+23", 54),
    (1619772235, "0x1.9f6418p+24", 60),
    (618882837, "0x1.856b2cp+23", 48),
])
def test_quantize_int32_input_converted_to_float32_first(xi, scale_hex, want):
    s = F32(float.fromhex(scale_hex))
    y = check_q(np.array([xi], I32), s, U8(0))
    assert y.tolist() == [want]


def test_quantize_int32_input_random():
    rng = np.random.default_rng(45)
    x = rng.integers(-(2**31), 2**31 - 1, (4, 50), endpoint=True).astype(I32)
    for scale in (F32(1e7), F32(2.0**24), F32(3.3e6)):
        check_q(x, scale, U8(128))
        check_q(x, scale, I8(0))
    check_q(x, rng.uniform(1e6, 1e8, 4).astype(F32), rand_int(rng, I8, (4,)), axis=0)
    small = rng.integers(-300, 300, (3, 7)).astype(I32)
    check_q(small, F32(1.5), I8(-2))
    check_q(small, F32(2.0), U8(100))


def test_quantize_empty_and_scalar():
    check_q(np.zeros((0, 3), F32), F32(0.1), I8(1))
    check_q(np.zeros((2, 0), F32), np.array([0.1, 0.2], F32), np.array([1, 2], U8), axis=0)
    y = check_q(np.array(2.6, F32), F32(1.0), U8(0))
    assert y.shape == () and int(y) == 3


# ----------------------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 2, 2)])
def test_dequantize_per_tensor(dt, shape):
    rng = np.random.default_rng([len(shape), int(dt == I8), 46])
    x = rand_int(rng, dt, shape)
    for _ in range(4):
        scale = F32(rng.uniform(1e-4, 10))
        y = check_dq(x, scale, rand_int(rng, dt, ()))
        assert y.dtype == np.float32 and y.shape == shape
        check_dq(x, scale)
        check_dq(x, np.array([scale]), rand_int(rng, dt, (1,)))
        check_dq(x, float(scale), dt(np.iinfo(dt).max))


@pytest.mark.parametrize("dt", [U8, I8, I32])
@pytest.mark.parametrize("shape,axis", [
    ((6,), 0), ((6,), -1), ((3, 4), 0), ((3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), -3),
    ((1, 3, 2, 5), 3), ((1, 3, 2, 5), -3),
])
def test_dequantize_per_axis(shape, axis, dt):
    rng = np.random.default_rng([len(shape), axis + 5, np.dtype(dt).itemsize, int(dt == I8), 47])
    n = shape[axis]
    x = rand_int(rng, dt, shape)
    scale = rng.uniform(1e-3, 3, n).astype(F32)
    if dt == I32:
        y = check_dq(x, scale, axis=axis)
        check_dq(x, scale, np.zeros(n, I32), axis=axis)
    else:
        y = check_dq(x, scale, rand_int(rng, dt, (n,)), axis=axis)
        check_dq(x, scale, axis=axis)
    assert y.shape == shape and y.dtype == np.float32


def test_dequantize_axis_default_is_1():
    rng = np.random.default_rng(48)
    x = rand_int(rng, I8, (2, 3, 4))
    scale = np.array([0.5, 1.25, 2.0], F32)
    zp = np.array([1, -2, 3], I8)
    assert_exact(qlinear.dequantize_linear(x, scale, zp), oracle.dequantize_linear(x, scale, zp, axis=1))


def test_dequantize_int32_large_values():
    """x - 0 is exact, its float32 conversion rounds (above 2**24), then one multiplication."""
    x = np.array([2**31 - 1, -(2**31), 2**24 + 1, 2**24 + 3, -(2**25) - 3, 123456789, 0, 1], I32)
    y = check_dq(x, F32(1.0))
    assert y.tolist() == [2.0**31, -(2.0**31), 2.0**24, 2.0**24 + 4, -(2.0**25) - 4, 123456792.0, 0.0, 1.0]
    check_dq(x, F32(0.3))
    check_dq(x, F32(3.0e-7), I32(0))
    check_dq(x, F32(7.5), np.array([0], I32))
    rng = np.random.default_rng(49)
    xr = rng.integers(-(2**31), 2**31 - 1, (5, 40), endpoint=True).astype(I32)
    for scale in (F32(1e-3), F32(0.1234567), F32(3.5e-10)):
        check_dq(xr, scale)


@pytest.mark.parametrize("dt", [U8, I8])
def test_dequantize_full_range_and_extreme_zero_points(dt):
    info = np.iinfo(dt)
    x = np.arange(info.min, info.max + 1).astype(dt)
    for zp in (info.min, info.max, 0, 1):
        for scale in (F32(1.0), F32(0.1), F32(2.0**-140), F32(3.4e36)):  # incl. subnormal, huge
            y = check_dq(x, scale, dt(zp))
            if scale == 1.0:
                assert y.tolist() == [float(v - zp) for v in range(info.min, info.max + 1)]


def test_python_int_zero_points():
    rng = np.random.default_rng(50)
    for dt in (U8, I8):
        x = rand_int(rng, dt, (3, 4))
        zp = int(rand_int(rng, dt, ()))
        assert_exact(qlinear.dequantize_linear(x, 0.25, zp), oracle.dequantize_linear(x, 0.25, dt(zp)))
    xi = rng.integers(-(2**31), 2**31 - 1, 10).astype(I32)
    assert_exact(qlinear.dequantize_linear(xi, 0.5, 0), oracle.dequantize_linear(xi, 0.5))


def test_round_trip_is_identity_on_grid():
    rng = np.random.default_rng(51)
    for dt in (U8, I8):
        q = rand_int(rng, dt, (4, 6))
        scale, zp = F32(0.037), dt(np.iinfo(dt).min + 77)
        x = check_dq(q, scale, zp)
        assert_exact(check_q(x, scale, zp), q)


def test_non_contiguous_and_readonly_inputs():
    rng = np.random.default_rng(52)
    x = (rng.standard_normal((6, 8, 10)) * 50).astype(F32)
    q = rand_int(rng, I8, (6, 8, 10))
    ro = x[:, :4].copy()
    ro.flags.writeable = False
    scale = np.linspace(0.1, 1, 8).astype(F32)[::2]
    for xv in (x[::2, ::2, ::-1], x.transpose(2, 1, 0)[:, ::2], np.asfortranarray(x[:, :4]), ro):
        assert xv.shape[1] == 4
        check_q(xv, scale, np.arange(4).astype(I8), axis=1)
        check_q(xv, F32(0.3), U8(9))
    for qv in (q[::2, ::2, ::-1], np.asfortranarray(q[:, :4])):
        check_dq(qv, scale, np.arange(4).astype(I8), axis=1)
        check_dq(qv, F32(0.3), I8(9))


# ----------------------------------------------------------- prepared forms (the backend's)


@pytest.mark.parametrize("zdt", [U8, I8])
def test_prepared_quantize_and_dequantize_match_the_oracle(zdt):
    """The backend's QuantizeLinear/DequantizeLinear with constant parameters validate them
    once (qlinear.quantize.PreparedQuantize / PreparedDequantize); their fast path and every
    fallback (per axis, views, int32 x, the NumPy engine) give the oracle's bits."""
    from qlinear import _native
    from qlinear.quantize import PreparedDequantize, PreparedQuantize

    rng = np.random.default_rng([zdt == I8, 21])
    engines = ["numpy"] + (["native"] if _native.available() else [])
    for n in (1, 7, 64, 1000, 70000):
        x = (rng.standard_normal(n) * 300).astype(np.float32)
        x[: min(n, 4)] = np.array([np.nan, np.inf, -np.inf, 0.5], np.float32)[: min(n, 4)]
        s = np.array(rng.uniform(0.01, 2), np.float32)
        z = rand_int(rng, zdt, ())
        q, d = PreparedQuantize(s, z), PreparedDequantize(s, z)
        want_q = oracle.quantize_linear(x, s, z)
        for name in engines:
            with _native.use_engine(name):
                for view in (x, x[::2], x.reshape(1, -1)):
                    assert_exact(q.run(view), oracle.quantize_linear(view, s, z))
                got = q.run(x)
                assert_exact(got, want_q)
                assert_exact(d.run(got), oracle.dequantize_linear(got, s, z))
                assert_exact(d.run(got[::3]), oracle.dequantize_linear(got[::3], s, z))
    # per axis and int32 inputs take the plain functions
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    s = rng.uniform(0.01, 1, 3).astype(np.float32)
    z = rand_int(rng, zdt, (3,))
    got = PreparedQuantize(s, z, axis=1).run(x)
    assert_exact(got, oracle.quantize_linear(x, s, z, axis=1))
    assert_exact(PreparedDequantize(s, z, axis=1).run(got), oracle.dequantize_linear(got, s, z, axis=1))
    xi = rng.integers(-1000, 1000, 10).astype(np.int32)
    assert_exact(PreparedDequantize(np.float32(0.5), None).run(xi), oracle.dequantize_linear(xi, np.float32(0.5), None))
    # a wrong zero point type is refused as dequantize_linear refuses it
    with pytest.raises(TypeError, match="dequantize_linear"):
        PreparedDequantize(np.float32(0.5), np.zeros((), U8)).run(np.zeros(3, I8))


def test_prepared_forms_take_transposed_views_and_refuse_huge_strided_ones():
    """A transposed activation (a view, as onnx.reference's Transpose returns) goes through the
    prepared fast path after a copy, with the oracle's bits; a sliding-window view far larger
    than its buffer is refused by the size limit before any copy."""
    from numpy.lib.stride_tricks import as_strided

    from qlinear.quantize import PreparedDequantize, PreparedQuantize

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 40, 7)) * 50).astype(np.float32).transpose(2, 0, 1)
    s, z = np.array(0.3, np.float32), np.array(9, U8)
    q = PreparedQuantize(s, z).run(x)
    assert_exact(q, oracle.quantize_linear(x, s, z))
    assert_exact(PreparedDequantize(s, z).run(q.transpose(1, 2, 0)),
                 oracle.dequantize_linear(q.transpose(1, 2, 0), s, z))
    base = np.zeros(1000, np.float32)
    huge = as_strided(base, shape=(1 << 20, 1 << 20), strides=(4, 4))
    with pytest.raises(ValueError, match="quantize_linear"):
        PreparedQuantize(s, z).run(huge)


def test_repeat_path_tells_a_negative_zero_scale_apart():
    """The repeat path (``_prepared.RepeatMemo``) reuses a call whose parameters are equal
    immutable values; -0.0 == 0.0, yet x_scale's sign reaches DequantizeLinear's float output,
    so a call with the other zero takes the full path: its own signed zeros."""
    x = np.array([1, 2, 3], np.uint8)
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        a = qlinear.dequantize_linear(x, np.float32(first), np.uint8(0))
        b = qlinear.dequantize_linear(x, np.float32(second), np.uint8(0))
        assert np.all(np.signbit(a) == np.signbit(np.float32(first)))
        assert np.all(np.signbit(b) == np.signbit(np.float32(second)))
