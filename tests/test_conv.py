"""Differential tests: qlinear.qlinear_conv / qlinear.conv_integer against the oracle, bit for bit."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import oracle
import qlinear
from conftest import (ALL_8BIT_COMBOS, I8, I32, U8, assert_exact, call_untouched, num_threads, rand_extreme, rand_int,
                      rand_scale)

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# ----------------------------------------------------------------------------- case generation


def random_geometry(rng, nsp, auto_pad, max_size=7, max_kernel=3):
    """Random kernel/strides/dilations/pads and an input size that gives a non-empty output."""
    kernel = [int(v) for v in rng.integers(1, max_kernel, nsp, endpoint=True)]
    strides = [int(v) for v in rng.integers(1, 3, nsp, endpoint=True)]
    dilations = [int(v) for v in rng.integers(1, 2, nsp, endpoint=True)]
    size = [int(v) for v in rng.integers(1, max_size, nsp, endpoint=True)]
    pads = None
    if auto_pad == "NOTSET":
        pads = [int(v) for v in rng.integers(0, 2, 2 * nsp, endpoint=True)]
    for i in range(nsp):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = 0 if pads is None or auto_pad != "NOTSET" else pads[i] + pads[nsp + i]
        if auto_pad in ("NOTSET", "VALID"):
            size[i] = max(size[i], span - room)
    return size, kernel, strides, dilations, pads


def random_qconv_case(rng, nsp, auto_pad="NOTSET", *, dtypes=None, group=None, batch=None,
                      per_channel=None, bias=None, give_kernel_shape=None):
    xdt, wdt, ydt = dtypes or ALL_8BIT_COMBOS[int(rng.integers(len(ALL_8BIT_COMBOS)))]
    size, kernel, strides, dilations, pads = random_geometry(
        rng, nsp, auto_pad, max_size=7 if nsp <= 2 else 4, max_kernel=3 if nsp <= 2 else 2)
    group = int(rng.choice([1, 1, 2, 3])) if group is None else group
    c_per_group = int(rng.integers(1, 3, endpoint=True))
    m_per_group = int(rng.integers(1, 3, endpoint=True))
    m_out = m_per_group * group
    batch = int(rng.integers(1, 2, endpoint=True)) if batch is None else batch
    per_channel = bool(rng.integers(2)) if per_channel is None else per_channel
    bias = bool(rng.integers(2)) if bias is None else bias
    give_kernel_shape = bool(rng.integers(2)) if give_kernel_shape is None else give_kernel_shape

    x = rand_int(rng, xdt, (batch, c_per_group * group, *size))
    w = rand_int(rng, wdt, (m_out, c_per_group, *kernel))
    xz = rand_int(rng, xdt, ())
    if per_channel:
        ws = rand_scale(rng, (m_out,))
        wz = rand_int(rng, wdt, (m_out,))
    else:
        ws = rand_scale(rng, ())
        wz = rand_int(rng, wdt, ())
    # y_scale sized so that outputs spread over the range instead of all saturating
    k = c_per_group * int(np.prod(kernel))
    xs = rand_scale(rng, ())
    ys = np.float32(float(xs) * float(np.max(ws)) * 120.0 * np.sqrt(k) * rng.uniform(0.3, 3.0))
    yz = rand_int(rng, ydt, ())
    args = [x, xs, xz, w, ws, wz, ys, yz]
    if bias:
        args.append(rand_int(rng, I32, (m_out,), -50000, 50000))
    kwargs = dict(auto_pad=auto_pad, group=group)
    if rng.integers(2) or any(s != 1 for s in strides):
        kwargs["strides"] = strides
    if rng.integers(2) or any(d != 1 for d in dilations):
        kwargs["dilations"] = dilations
    if pads is not None and (rng.integers(3) or any(pads)):
        kwargs["pads"] = pads
    if give_kernel_shape:
        kwargs["kernel_shape"] = kernel
    return args, kwargs


def check_qconv(args, kwargs):
    want = oracle.qlinear_conv(*args, **kwargs)
    got = call_untouched(qlinear.qlinear_conv, *args, **kwargs)
    assert_exact(got, want)
    return got


def check_convint(args, kwargs):
    want = oracle.conv_integer(*args, **kwargs)
    got = call_untouched(qlinear.conv_integer, *args, **kwargs)
    assert_exact(got, want)
    return got


def as_convint_args(args):
    """(x, w, x_zero_point, w_zero_point) from a QLinearConv argument list."""
    x, _xs, xz, w, _ws, wz = args[:6]
    return [x, w, xz, wz]


# ----------------------------------------------------------------------------- random sweeps


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_qlinear_conv_random(nsp, auto_pad, seed):
    rng = np.random.default_rng([nsp, AUTO_PADS.index(auto_pad), seed, 101])
    for _ in range(4):
        check_qconv(*random_qconv_case(rng, nsp, auto_pad))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_conv_integer_random(nsp, auto_pad, seed):
    rng = np.random.default_rng([nsp, AUTO_PADS.index(auto_pad), seed, 202])
    for _ in range(4):
        args, kwargs = random_qconv_case(rng, nsp, auto_pad)
        check_convint(as_convint_args(args), kwargs)


@pytest.mark.parametrize("auto_pad", AUTO_PADS)
def test_four_spatial_dims(auto_pad):
    rng = np.random.default_rng([4, AUTO_PADS.index(auto_pad)])
    for _ in range(2):
        args, kwargs = random_qconv_case(rng, 4, auto_pad)
        y = check_qconv(args, kwargs)
        assert y.ndim == 6
        check_convint(as_convint_args(args), kwargs)


# ----------------------------------------------------------------------------- types and ranges


@pytest.mark.parametrize("xdt,wdt,ydt", ALL_8BIT_COMBOS,
                         ids=[f"{a.__name__}-{b.__name__}-{c.__name__}" for a, b, c in ALL_8BIT_COMBOS])
def test_all_type_combinations_full_range(xdt, wdt, ydt):
    rng = np.random.default_rng([ALL_8BIT_COMBOS.index((xdt, wdt, ydt)), 5])
    for _ in range(3):
        args, kwargs = random_qconv_case(rng, 2, dtypes=(xdt, wdt, ydt))
        y = check_qconv(args, kwargs)
        assert y.dtype == ydt
        assert check_convint(as_convint_args(args), kwargs).dtype == I32
    # extreme values and extreme zero points: every (x - xz)(w - wz) term is as large as possible
    for xz_v in (np.iinfo(xdt).min, np.iinfo(xdt).max):
        for wz_v in (np.iinfo(wdt).min, np.iinfo(wdt).max):
            x = rand_extreme(rng, xdt, (2, 3, 5, 6))
            w = rand_extreme(rng, wdt, (4, 3, 3, 2))
            for yz in (np.iinfo(ydt).min, np.iinfo(ydt).max, (np.iinfo(ydt).min + np.iinfo(ydt).max) // 2):
                args = [x, np.float32(0.02), xdt(xz_v), w, np.float32(0.03), wdt(wz_v),
                        np.float32(7.0), ydt(yz)]  # 18 * 255 * 255 * 6e-4 / 7 ~ 100
                check_qconv(args, dict(pads=[1, 0, 0, 1]))
            check_convint([x, w, xdt(xz_v), wdt(wz_v)], dict(pads=[1, 0, 0, 1]))


@pytest.mark.parametrize("xdt,wdt", [(U8, I8), (U8, U8), (I8, I8), (I8, U8)])
def test_large_reduction_exceeds_float32_exactness(xdt, wdt):
    """K = 80 * 3 * 3 = 720 terms of magnitude up to 255 * 255: sums far beyond 2**24."""
    rng = np.random.default_rng([720, int(xdt == I8), int(wdt == I8)])
    x_lo, x_hi = np.iinfo(xdt).min, np.iinfo(xdt).max
    w_lo, w_hi = np.iinfo(wdt).min, np.iinfo(wdt).max
    xs, ws = np.float32(0.02), np.float32(0.03)
    # zero points at the extremes: x - xz and w - wz take only the values 0 and +-255
    for xz, wz in ((x_lo, w_hi), (x_hi, w_lo), (x_lo, w_lo)):
        x = rand_extreme(rng, xdt, (2, 80, 4, 4))
        w = rand_extreme(rng, wdt, (3, 80, 3, 3))
        # batch 1 x output channel 0: all 720 terms at magnitude 255 * 255 with the same sign
        x[1] = x_hi if xz == x_lo else x_lo
        w[0] = w_hi if wz == w_lo else w_lo
        kwargs = dict(pads=[1, 1, 1, 1])
        exact = check_convint([x, w, xdt(xz), wdt(wz)], kwargs)
        assert np.abs(exact.astype(np.int64)).max() == 720 * 255 * 255 > 2**24  # beyond float32
        # y_scale mapping the largest accumulators, then the typical ones, to about 120 steps
        for ys in (np.float32(xs * ws * 720 * 255 * 255 / 120), np.float32(xs * ws * 180 * 255 * 255 / 60)):
            for yz in (U8(128), I8(0)):
                check_qconv([x, xs, xdt(xz), w, ws, wdt(wz), ys, yz], kwargs)


def test_python_int_zero_points():
    rng = np.random.default_rng(7)
    for xdt, wdt, ydt in ALL_8BIT_COMBOS:
        x = rand_int(rng, xdt, (1, 2, 5, 5))
        w = rand_int(rng, wdt, (3, 2, 3, 3))
        xz, wz = int(rand_int(rng, xdt, ())), int(rand_int(rng, wdt, ()))
        args = [x, 0.01, xz, w, 0.02, wz, 0.5, ydt(3)]
        want = oracle.qlinear_conv(x, 0.01, xdt(xz), w, 0.02, wdt(wz), 0.5, ydt(3))
        assert_exact(qlinear.qlinear_conv(*args), want)
        want_i = oracle.conv_integer(x, w, xdt(xz), wdt(wz))
        assert_exact(qlinear.conv_integer(x, w, xz, wz), want_i)
        assert_exact(qlinear.conv_integer(x, w, xz), oracle.conv_integer(x, w, xdt(xz)))


def test_scale_representations_are_equivalent():
    """Python floats, float64/float16 NumPy values, 0-d and 1-element arrays: float32 first."""
    rng = np.random.default_rng(8)
    x = rand_int(rng, U8, (1, 2, 6, 6))
    w = rand_int(rng, I8, (3, 2, 3, 3))
    # float64 values that are not float32-representable: they must be rounded to float32 first
    xs64, ws64, ys64 = 0.0123456789012345, 0.0234567890123456, 0.987654321098765
    want = oracle.qlinear_conv(x, np.float32(xs64), U8(100), w, np.float32(ws64), I8(-3),
                               np.float32(ys64), U8(128))
    for conv in (float, np.float64, lambda v: np.array(v, np.float64), lambda v: np.array([v]),
                 lambda v: np.array([v], np.float32), np.float32):
        got = qlinear.qlinear_conv(x, conv(xs64), U8(100), w, conv(ws64), I8(-3), conv(ys64), U8(128))
        assert_exact(got, want)
    want16 = oracle.qlinear_conv(x, np.float16(0.0123), U8(100), w, np.float16(0.0234), I8(-3),
                                 np.float16(0.9877), U8(128))
    got16 = qlinear.qlinear_conv(x, np.float16(0.0123), U8(100), w, np.float16(0.0234), I8(-3),
                                 np.float16(0.9877), U8(128))
    assert_exact(got16, want16)


def test_one_element_zero_points():
    rng = np.random.default_rng(9)
    x = rand_int(rng, I8, (2, 3, 5, 4))
    w = rand_int(rng, U8, (2, 3, 2, 2))
    want = oracle.qlinear_conv(x, 0.02, I8(-7), w, 0.01, U8(131), 0.3, I8(5))
    got = qlinear.qlinear_conv(x, np.array([0.02], np.float32), np.array([-7], I8), w,
                               np.array([0.01], np.float32), np.array([131], U8),
                               np.array([0.3], np.float32), np.array([5], I8))
    assert_exact(got, want)


# ----------------------------------------------------------------------------- geometry


@pytest.mark.parametrize("auto_pad,expected_shape", [
    ("NOTSET", (8 - 5) // 3 + 1),
    ("VALID", (8 - 5) // 3 + 1),
    ("SAME_UPPER", 3),  # ceil(8 / 3)
    ("SAME_LOWER", 3),
])
def test_auto_pad_with_dilations_and_strides(auto_pad, expected_shape):
    """in 8, kernel 3, dilation 2 (span 5), stride 3: SAME needs total pad 3 (1+2 or 2+1)."""
    rng = np.random.default_rng(10)
    x = rand_int(rng, U8, (2, 2, 8, 8))
    w = rand_int(rng, I8, (3, 2, 3, 3))
    kwargs = dict(auto_pad=auto_pad, dilations=[2, 2], strides=[3, 3])
    args = [x, 0.02, U8(77), w, 0.01, I8(0), 0.25, U8(120)]
    y = check_qconv(args, kwargs)
    assert y.shape == (2, 3, expected_shape, expected_shape)
    check_convint([x, w, U8(77), I8(5)], kwargs)
    # SAME_UPPER and SAME_LOWER place the odd pixel differently: the test can tell them apart
    if auto_pad.startswith("SAME"):
        other = "SAME_LOWER" if auto_pad == "SAME_UPPER" else "SAME_UPPER"
        assert not np.array_equal(oracle.conv_integer(x, w, U8(77), I8(5), **kwargs),
                                  oracle.conv_integer(x, w, U8(77), I8(5), **dict(kwargs, auto_pad=other)))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("size,kernel,stride,dilation", [
    (7, 3, 1, 1), (7, 2, 1, 1), (7, 3, 2, 1), (6, 3, 2, 1), (5, 4, 3, 1), (9, 3, 1, 3),
    (4, 3, 2, 2), (1, 3, 1, 1), (2, 5, 1, 1), (10, 2, 4, 3),
])
def test_same_padding_1d(auto_pad, size, kernel, stride, dilation):
    rng = np.random.default_rng([size, kernel, stride, dilation])
    x = rand_int(rng, I8, (1, 2, size))
    w = rand_int(rng, I8, (2, 2, kernel))
    kwargs = dict(auto_pad=auto_pad, strides=[stride], dilations=[dilation], kernel_shape=[kernel])
    y = check_qconv([x, 0.05, I8(-1), w, 0.04, I8(2), 0.2, I8(0)], kwargs)
    assert y.shape == (1, 2, -(-size // stride))
    check_convint([x, w, I8(-1), I8(2)], kwargs)


@pytest.mark.parametrize("pads", [
    [0, 2, 3, 1], [2, 0, 0, 3], [3, 3, 0, 0], [0, 0, 1, 4], [4, 1, 2, 0],
])
def test_explicit_asymmetric_pads(pads):
    rng = np.random.default_rng(pads)
    x = rand_int(rng, U8, (2, 3, 5, 6))
    w = rand_int(rng, U8, (4, 3, 2, 3))
    for strides in ([1, 1], [2, 3]):
        kwargs = dict(pads=pads, strides=strides)
        y = check_qconv([x, 0.01, U8(3), w, 0.02, U8(250), 0.2, U8(9), rand_int(rng, I32, (4,), -999, 999)],
                        kwargs)
        assert y.shape[2:] == ((5 + pads[0] + pads[2] - 2) // strides[0] + 1,
                               (6 + pads[1] + pads[3] - 3) // strides[1] + 1)
        check_convint([x, w, U8(3), U8(250)], kwargs)


def test_padding_far_beyond_kernel():
    """Output positions that see only padding contribute 0 (x is padded with x_zero_point)."""
    rng = np.random.default_rng(11)
    x = rand_int(rng, U8, (1, 1, 3))
    w = rand_int(rng, I8, (2, 1, 2))
    B = np.array([1000, -1000], I32)
    kwargs = dict(pads=[4, 3])
    y = check_qconv([x, 0.1, U8(200), w, 0.1, I8(-5), 0.5, U8(128), B], kwargs)
    assert y.shape == (1, 2, 9)
    ci = check_convint([x, w, U8(200), I8(-5)], kwargs)
    assert (ci[..., :3] == 0).all() and (ci[..., -2:] == 0).all()


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_kernel_shape_given(nsp):
    rng = np.random.default_rng([nsp, 12])
    for _ in range(3):
        args, kwargs = random_qconv_case(rng, nsp, give_kernel_shape=True)
        assert "kernel_shape" in kwargs
        check_qconv(args, kwargs)
        check_convint(as_convint_args(args), kwargs)


# ----------------------------------------------------------------------------- groups, batch


@pytest.mark.parametrize("group,c_per_group,m_per_group", [
    (2, 2, 3), (3, 1, 2), (4, 2, 1),
    (6, 1, 1),  # depthwise
    (5, 1, 2),  # depthwise with channel multiplier 2
])
def test_groups(group, c_per_group, m_per_group):
    rng = np.random.default_rng([group, c_per_group, m_per_group])
    m_out = group * m_per_group
    for per_channel in (False, True):
        x = rand_int(rng, U8, (2, group * c_per_group, 6, 5))
        w = rand_int(rng, I8, (m_out, c_per_group, 3, 3))
        ws = rand_scale(rng, (m_out,)) if per_channel else np.float32(0.02)
        wz = rand_int(rng, I8, (m_out,), -20, 20) if per_channel else I8(0)
        B = rand_int(rng, I32, (m_out,), -3000, 3000)
        kwargs = dict(group=group, pads=[1, 1, 1, 1], strides=[1, 2])
        check_qconv([x, 0.01, U8(128), w, ws, wz, 0.05, U8(128), B], kwargs)
        check_convint([x, w, U8(128), wz], kwargs)


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_empty_batch(nsp):
    rng = np.random.default_rng([nsp, 13])
    x = np.zeros((0, 4) + (5,) * nsp, U8)
    w = rand_int(rng, I8, (6, 2) + (3,) * nsp)
    kwargs = dict(group=2, pads=[1] * (2 * nsp), strides=[2] * nsp)
    y = check_qconv([x, 0.01, U8(1), w, rand_scale(rng, (6,)), rand_int(rng, I8, (6,)), 0.1, I8(0),
                     rand_int(rng, I32, (6,))], kwargs)
    assert y.shape == (0, 6) + (3,) * nsp and y.dtype == I8
    yi = check_convint([x, w, U8(1), I8(0)], kwargs)
    assert yi.shape == (0, 6) + (3,) * nsp


# ----------------------------------------------------------------------------- per-channel, bias


@pytest.mark.parametrize("wdt", [U8, I8])
def test_per_channel_differing_zero_points(wdt):
    rng = np.random.default_rng([14, int(wdt == I8)])
    m_out = 5
    x = rand_int(rng, U8, (2, 3, 6, 6))
    w = rand_int(rng, wdt, (m_out, 3, 3, 3))
    wz = np.array([np.iinfo(wdt).min, np.iinfo(wdt).max, 0, 1, 17], dtype=wdt)
    ws = np.array([0.001, 0.05, 0.01, 0.003, 0.02], np.float32)
    for ydt in (U8, I8):
        y = check_qconv([x, 0.02, U8(5), w, ws, wz, 0.6, ydt(np.iinfo(ydt).min + 100)],
                        dict(pads=[1, 0, 1, 2]))
        assert y.dtype == ydt
    check_convint([x, w, U8(5), wz], dict(pads=[1, 0, 1, 2]))
    # the same call with per-tensor parameters repeated per channel gives the per-tensor result
    same = check_qconv([x, 0.02, U8(5), w, np.full(m_out, 0.01, np.float32), np.full(m_out, wz[3], wdt),
                        0.6, U8(0)], {})
    assert_exact(same, oracle.qlinear_conv(x, 0.02, U8(5), w, np.float32(0.01), wdt(wz[3]), 0.6, U8(0)))


@pytest.mark.parametrize("bias_values", [
    [2**31 - 1, -(2**31), 0, 1],          # accumulator + B wraps to int32
    [2**30, -(2**30), 2**24 + 1, -(2**24 + 3)],
    [16777217, 16777219, -16777217, 33554435],  # float32(acc) rounding matters above 2**24
    [123456789, -987654321, 7, -7],
])
def test_int32_bias_large_values(bias_values):
    rng = np.random.default_rng(15)
    B = np.array(bias_values, dtype=np.int64).astype(I32)
    x = rand_int(rng, U8, (1, 2, 5, 5))
    w = rand_int(rng, I8, (4, 2, 3, 3))
    for ys in (np.float32(2.0**-7), np.float32(1e-4 * 1e6), np.float32(1e-4 * 2**25 / 100)):
        check_qconv([x, 0.01, U8(128), w, 0.01, I8(0), ys, U8(128), B], dict(pads=[1, 1, 1, 1]))
        check_qconv([x, 0.01, U8(128), w, 0.01, I8(0), ys, I8(0), B], dict(pads=[1, 1, 1, 1]))


def test_bias_near_int32_limits_wraps():
    """B + acc beyond int32 wraps (wrap32), it does not saturate."""
    x = np.full((1, 1, 1, 1), 255, U8)
    w = np.full((2, 1, 1, 1), 127, I8)
    B = np.array([2**31 - 1, -(2**31)], I32)
    # acc = 255 * 127 = 32385 -> channel 0 wraps to a large negative number, channel 1 stays negative
    y = check_qconv([x, 1.0, U8(0), w, 1.0, I8(0), 2.0**24, I8(0), B], {})
    assert y.ravel().tolist() == [-128, -128]
    acc = oracle.wrap32(np.array([2**31 - 1 + 32385, -(2**31) + 32385]))
    assert acc.tolist() == [-(2**31) + 32384, -(2**31) + 32385]


def test_requantization_is_float32_in_contract_order():
    """1x1 convolution over a grid of accumulators 255 q + r (q per output channel, r per pixel),
    with scales where float64 or reordered requantization would differ from the contract."""
    from test_matmul import discriminating_scales, grid_operands

    a, b, acc = grid_operands()
    x = a.T.reshape(1, 2, 255, 1).copy()  # channel 0: 255, channel 1: r
    w = b.T.reshape(256, 2, 1, 1).copy()  # output channel q: (q, 1)
    xs, ws, ys = discriminating_scales(acc, 75)
    y = check_qconv([x, xs, U8(0), w, ws, I8(0), ys, I8(0)], {})
    assert y.shape == (1, 256, 255, 1)
    check_qconv([x, xs, U8(0), w, np.full(256, ws, np.float32), np.zeros(256, I8), ys, U8(128)], {})
    assert_exact(check_convint([x, w], {}), acc.T.reshape(1, 256, 255, 1).astype(I32))


def readonly(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_non_contiguous_and_readonly_inputs():
    """Strided, reversed, Fortran-ordered and read-only views give the same bits."""
    rng = np.random.default_rng(16)
    base_x = rand_int(rng, U8, (2, 6, 9, 14))
    base_w = rand_int(rng, I8, (3, 4, 3, 3))
    xs = [base_x[:, ::2, :, ::2], base_x[:, 1::2, ::-1, 1::2], np.asfortranarray(base_x[:, :3, :, :7]),
          readonly(base_x[:, :3, :, :7])]
    ws = [base_w[:, ::-1][:, :3], np.asfortranarray(base_w[:, 1:]), base_w.transpose(0, 1, 3, 2)[:, :3],
          readonly(base_w[:, :3])]
    kwargs = dict(pads=[1, 0, 2, 1], strides=[1, 2])
    B = readonly(rand_int(rng, I32, (3,), -999, 999))
    w_scale = readonly(rand_scale(rng, (3,)))
    w_zp = readonly(rand_int(rng, I8, (3,)))
    for x in xs:
        for w in ws:
            check_qconv([x, 0.01, U8(7), w, w_scale, w_zp, 0.2, U8(100), B], kwargs)
            check_convint([x, w, U8(7), w_zp], kwargs)


def test_small_workspace_limit_gives_same_bits():
    """Tiling under a tiny scratch-memory bound must not change results."""
    limit = qlinear.workspace_limit()
    rng = np.random.default_rng(17)
    try:
        for nbytes in (1, 900, 20000):
            qlinear.set_workspace_limit(nbytes)
            for nsp in (1, 2, 3):
                for auto_pad in AUTO_PADS:
                    args, kwargs = random_qconv_case(rng, nsp, auto_pad)
                    check_qconv(args, kwargs)
                    check_convint(as_convint_args(args), kwargs)
            x = rand_extreme(rng, U8, (2, 40, 6, 6))
            w = rand_extreme(rng, I8, (5, 40, 3, 3))
            check_qconv([x, 0.02, U8(0), w, 0.03, I8(127), np.float32(0.02 * 0.03 * 360 * 65025 / 4 / 60), U8(128)],
                        dict(pads=[1, 1, 1, 1]))
    finally:
        qlinear.set_workspace_limit(limit)
    assert qlinear.workspace_limit() == limit


@pytest.mark.parametrize("c_in,kernel", [
    (86, (3, 1)), (43, (3, 2)), (37, (7, 1)), (257, (1, 2)),  # K = 258, 258, 259, 514
    (103, (5, 1)), (172, (3, 1)), (129, (2, 2)), (115, (3, 3)),  # K = 515, 516, 516, 1035
])
def test_reduction_lengths_around_exact_chunk_sizes(c_in, kernel):
    rng = np.random.default_rng([c_in, *kernel, 18])
    x = rand_extreme(rng, U8, (1, c_in, 9, 4))
    w = rand_extreme(rng, I8, (4, c_in, *kernel))
    x[0, :, :, :2] = 255  # output column 0 sees only 255s: full-K same-sign sums on channels 0, 1
    w[0] = -128
    w[1] = 127
    for wz in (I8(0), np.array([127, -128, 0, 127], I8)):
        kwargs = dict(auto_pad="SAME_UPPER")
        exact = check_convint([x, w, U8(0), wz], kwargs)
        assert np.abs(exact.astype(np.int64)).max() >= 128 * 255 * c_in * kernel[0] * kernel[1] // 2
        ys = np.float32(0.01 * 0.01 * float(np.abs(exact.astype(np.int64)).max()) / 120)
        ws = np.array([0.01, 0.01, 0.005, 0.02], np.float32) if wz.ndim else np.float32(0.01)
        check_qconv([x, 0.01, U8(0), w, ws, wz, ys, I8(0)], kwargs)
        check_qconv([x, 0.01, U8(255), w, ws, wz, ys, U8(128)], kwargs)


# Stride-1 geometries on wider images (the padded-width overhead is small, so flat-image
# formulations apply), with dilations, asymmetric pads and every auto_pad.
STRIDE1_GEOMETRIES = [
    ((10, 16), (3, 3), dict(pads=[1, 1, 1, 1])),
    ((9, 20), (3, 3), dict(pads=[0, 2, 2, 0])),
    ((8, 24), (2, 5), dict(pads=[1, 2, 0, 2])),
    ((7, 30), (3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((6, 25), (3, 2), dict(dilations=[1, 3], pads=[0, 0, 1, 3])),
    ((11, 14), (3, 1), dict(pads=[1, 0, 1, 0])),
    ((12, 12), (5, 5), dict(auto_pad="SAME_UPPER")),
    ((12, 13), (4, 4), dict(auto_pad="SAME_LOWER")),
    ((9, 18), (2, 4), dict(auto_pad="SAME_UPPER", dilations=[2, 1])),
    ((10, 22), (3, 3), dict(auto_pad="VALID")),
    ((4, 5, 12), (2, 2, 3), dict(pads=[1, 0, 1, 0, 1, 1])),
    ((3, 4, 20), (3, 2, 3), dict(auto_pad="SAME_LOWER")),
    ((40,), (5,), dict(pads=[2, 3])),
    ((33,), (3,), dict(dilations=[4], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("layout", ["dense", "depthwise", "depthwise_x2", "grouped"])
@pytest.mark.parametrize("spatial,kernel,attrs", STRIDE1_GEOMETRIES,
                         ids=[f"{s}-{k}-{sorted(a.items())}".replace(" ", "") for s, k, a in STRIDE1_GEOMETRIES])
def test_stride_one_wide_images(spatial, kernel, attrs, layout):
    rng = np.random.default_rng([len(spatial), *spatial, *kernel, len(layout), 19])
    c, group, m = {"dense": (4, 1, 5), "depthwise": (4, 4, 4), "depthwise_x2": (3, 3, 6), "grouped": (4, 2, 4)}[layout]
    x = rand_int(rng, U8, (2, c, *spatial))
    w = rand_int(rng, I8, (m, c // group, *kernel))
    kwargs = dict(attrs, group=group)
    wz = rand_int(rng, I8, (m,))
    ws = rand_scale(rng, (m,))
    k = (c // group) * int(np.prod(kernel))
    ys = np.float32(0.02 * float(ws.max()) * 120 * np.sqrt(k))
    for B in (None, rand_int(rng, I32, (m,), -5000, 5000), rand_int(rng, I32, (m,))):  # large B: int32 path
        check_qconv([x, 0.02, U8(131), w, ws, wz, ys, U8(128), B], kwargs)
    check_convint([x, w, U8(131), wz], kwargs)
    # extreme values: accumulators beyond 2**24 force the integer path on the same geometry
    xe = rand_extreme(rng, U8, x.shape)
    we = rand_extreme(rng, I8, w.shape)
    check_convint([xe, we, U8(0), I8(127)], kwargs)
    check_qconv([xe, 0.02, U8(0), we, 0.01, I8(127), np.float32(0.02 * 0.01 * 65025 * k / 240), I8(0)], kwargs)


# ----------------------------------------------------------------------------- engine paths
# Every test in this module runs on the NumPy engine and on the native engine at every ISA
# level this CPU runs (tests/conftest.py). The cases below aim at the native engine's paths:
# the im2col panel packer (contiguous runs, border segments, gathers), K blocks and tile
# tails of the GEMM, and the depthwise kernel's plane mode, shared-row mode and gather mode.


def _qconv_args(rng, x, w, *, per_channel=True, bias=True, wz=None, ydt=U8):
    """Full-range QLinearConv arguments for x, w with differing per-channel zero points."""
    m = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    ws = rand_scale(rng, (m,)) if per_channel else rand_scale(rng, ())
    if wz is None:
        wz = rand_int(rng, w.dtype, (m,)) if per_channel else rand_int(rng, w.dtype, ())
    xs = rand_scale(rng, ())
    ys = np.float32(float(xs) * float(np.max(ws)) * 120.0 * np.sqrt(k))
    args = [x, xs, rand_int(rng, x.dtype, ()), w, ws, wz, ys, rand_int(rng, ydt, ())]
    if bias:
        args.append(rand_int(rng, I32, (m,)))  # full int32 range: wraps
    return args


@pytest.mark.parametrize("case", [
    # (x spatial, kernel, attributes): huge pads, strides far beyond the input, dilations
    ((7,), (1,), dict(pads=[2**20, 2**20 - 3])),
    ((9,), (3,), dict(pads=[2**20, 5], dilations=[2])),
    ((300_001,), (2,), dict(strides=[100_000])),
    ((3, 200_003), (1, 3), dict(strides=[1, 100_000], pads=[0, 1, 2, 100_001])),
    ((5, 6), (1, 1), dict(pads=[0, 2**20, 0, 3])),
], ids=["pads2^20", "pads2^20-dil", "stride1e5", "stride1e5-2d", "pads2^20-2d"])
def test_huge_pads_and_strides(case, engine_level):
    """No padded copy, no loop over the strides' product: exact and quick on the native
    engine (the NumPy engine pads and strides in memory: native levels only)."""
    if engine_level == "numpy":
        pytest.skip("the NumPy engine materializes padded inputs; the native engine does not")
    spatial, kernel, attrs = case
    rng = np.random.default_rng([len(spatial), *kernel, 31])
    for group, cg, mg in ((1, 2, 3), (2, 1, 1), (2, 2, 2)):
        x = rand_int(rng, U8, (1, group * cg, *spatial))
        w = rand_int(rng, I8, (group * mg, cg, *kernel))
        kwargs = dict(attrs, group=group)
        for op, args in (("QLinearConv", _qconv_args(rng, x, w)),
                         ("ConvInteger", [x, w, U8(17), rand_int(rng, I8, (group * mg,))])):
            _check_huge(op, args, kwargs)


_HUGE_DIGESTS: dict = {}


def _digest(a):
    return a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _check_huge(op, args, kwargs):
    """check_qconv / check_convint for the huge cases, with the oracle run once per process:
    every engine level gets the same seeded inputs, and the int64 oracle over a million-column
    output costs seconds each time. Later levels compare their output's SHA-256 with the
    oracle output's (the key holds the inputs' bytes); on a mismatch the oracle runs again so
    assert_exact reports the differing elements."""
    fn, ref = ((qlinear.qlinear_conv, oracle.qlinear_conv) if op == "QLinearConv"
               else (qlinear.conv_integer, oracle.conv_integer))
    got = call_untouched(fn, *args, **kwargs)
    key = (op, repr(sorted(kwargs.items())), tuple(_digest(np.asarray(a)) for a in args))
    if _HUGE_DIGESTS.get(key) == _digest(got):
        return
    want = ref(*args, **kwargs)
    assert_exact(got, want)
    _HUGE_DIGESTS[key] = _digest(want)


@pytest.mark.parametrize("cin,kernel", [
    (2046, (1, 1)), (2048, (1, 1)), (2050, (1, 1)),       # around the native K block (2048)
    (3071, (1, 1)), (3073, (1, 1)), (455, (3, 3)),        # one block vs several (K = 4095)
    (4097, (1, 1)), (3, (1, 1)), (1, (1, 1)), (1, (3, 3)),
])
def test_reduction_lengths_around_block_sizes(cin, kernel):
    rng = np.random.default_rng([cin, *kernel, 32])
    x = rand_extreme(rng, U8, (1, cin, 3, 5))
    w = rand_extreme(rng, I8, (7, cin, *kernel))
    x[0, :, 0, 0] = 255   # pixel 0, channels 0/1: full-K same-sign sums far above 2**24
    w[0], w[1] = -128, 127
    kwargs = dict(pads=[kernel[0] // 2, kernel[1] // 2] * 2)
    check_convint([x, w, U8(0), np.array([127, -128, 0, 5, 127, -128, 1], I8)], kwargs)
    check_qconv(_qconv_args(rng, x, w), kwargs)


@pytest.mark.parametrize("m,spatial", [(1, (1, 1)), (5, (3, 5)), (7, (4, 4)), (13, (1, 17)),
                                       (6, (5, 7)), (12, (2, 33)), (19, (7, 9))])
def test_tile_tails(m, spatial):
    """Output channels around the micro-kernel's rows (6 on AVX2) and pixels around its
    panel width (16), with pads so that panels straddle output rows and borders."""
    rng = np.random.default_rng([m, *spatial, 33])
    for xdt, wdt, ydt in ((U8, I8, U8), (I8, U8, I8), (I8, I8, U8)):
        x = rand_int(rng, xdt, (2, 3, *spatial))
        w = rand_int(rng, wdt, (m, 3, 2, 3))
        kwargs = dict(pads=[1, 1, 0, 1])
        check_qconv(_qconv_args(rng, x, w, ydt=ydt), kwargs)
        check_convint([x, w, rand_int(rng, xdt, ()), rand_int(rng, wdt, (m,))], kwargs)


@pytest.mark.parametrize("spatial,kernel,attrs,mult", [
    ((9, 11), (7, 7), dict(pads=[3, 3, 3, 3]), 1),                     # 49 taps: several passes
    ((6, 40), (3, 3), dict(strides=[2, 3], pads=[1, 0, 2, 1]), 1),      # strided: gather rows
    ((2, 3000), (1, 3), dict(dilations=[1, 600], pads=[0, 0, 0, 7]), 1),  # plane mode, 1 row
    ((2, 3000), (1, 3), dict(strides=[1, 5], dilations=[1, 600]), 1),   # stride 5: row mode, gathers
    ((300, 301), (3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 1]), 1),  # plane too large: gathers
    ((2, 90000), (1, 4), dict(dilations=[1, 400], pads=[0, 1, 0, 2]), 1),  # span > 1024, row mode
    ((300, 260), (3, 3), dict(pads=[1, 1, 1, 1]), 1),                  # plane too large: rows
    ((2, 300), (2, 5), dict(auto_pad="SAME_UPPER"), 2),                # channel multiplier
    ((5, 7), (3, 3), dict(auto_pad="SAME_LOWER", dilations=[2, 1]), 40),  # large multiplier
    ((4, 5, 6), (3, 2, 3), dict(pads=[1, 0, 1, 1, 1, 2]), 1),         # 3-D, plane mode
    ((4, 5, 6), (2, 2, 3), dict(strides=[2, 1, 2]), 3),                # 3-D, strided
    ((70,), (5,), dict(pads=[2, 9]), 1),                               # 1-D
    ((3, 2000), (3, 3), dict(pads=[1, 1, 1, 1]), 1),                   # rows longer than a segment
])
def test_depthwise_paths(spatial, kernel, attrs, mult):
    rng = np.random.default_rng([len(spatial), *spatial, *kernel, mult, 34])
    c = 3
    for xdt, wdt, ydt in ((U8, I8, U8), (I8, U8, I8)):
        x = rand_int(rng, xdt, (2, c, *spatial))
        w = rand_int(rng, wdt, (c * mult, 1, *kernel))
        kwargs = dict(attrs, group=c)
        check_qconv(_qconv_args(rng, x, w, ydt=ydt), kwargs)
        check_convint([x, w, rand_int(rng, xdt, ()), rand_int(rng, wdt, (c * mult,))], kwargs)
    # extreme values: every tap product at 255 * 255
    x = rand_extreme(rng, U8, (1, c, *spatial))
    w = rand_extreme(rng, I8, (c * mult, 1, *kernel))
    check_convint([x, w, U8(0), I8(127)], dict(attrs, group=c))


def test_prepared_conv_owns_its_weights(engine_level):
    """A prepared convolution keeps copies: changing the caller's arrays afterwards changes
    nothing (the packed weights are built lazily, per engine and ISA level)."""
    rng = np.random.default_rng(35)
    for group, cg in ((1, 3), (3, 1)):
        x = rand_int(rng, U8, (1, 3, 6, 6))
        w = rand_int(rng, I8, (3, cg, 3, 3))
        wz = rand_int(rng, I8, (3,))
        ws = rand_scale(rng, (3,))
        B = rand_int(rng, I32, (3,))
        want = oracle.qlinear_conv(x, 0.02, U8(3), w, ws, wz, 0.5, U8(9), B, pads=[1, 1, 1, 1], group=group)
        p = qlinear.prepare_qlinear_conv(w, ws, wz, B, pads=[1, 1, 1, 1], group=group)
        pi = qlinear.prepare_conv_integer(w, wz, pads=[1, 1, 1, 1], group=group)
        want_i = oracle.conv_integer(x, w, U8(3), wz, pads=[1, 1, 1, 1], group=group)
        for arr in (w, wz, ws, B):
            arr[...] = 0 if arr.dtype != np.float32 else 1.0
        assert_exact(p.run(x, 0.02, U8(3), 0.5, U8(9)), want)
        assert_exact(pi.run(x, U8(3)), want_i)


# ----------------------------------------------------------------------------- 7-bit fast path


def _seven_bit(rng, wdt, shape, m, spread=64):
    """Weights within ``spread`` of per-channel zero points (the convolution's fast path
    needs |w - w_zero_point| <= 64) and those zero points."""
    info = np.iinfo(wdt)
    wz = rng.integers(info.min + spread, info.max - spread, m, endpoint=True).astype(wdt)
    d = rng.integers(-spread, spread, shape, endpoint=True)
    return (wz.reshape((m,) + (1,) * (len(shape) - 1)).astype(np.int32) + d).astype(wdt), wz


def _conv_kind(w, wz, **attrs):
    """The native path a prepared convolution takes (conv.py's kinds), at the current level."""
    from qlinear import _native
    if _native.native() is None:
        return None
    p = qlinear.prepare_conv_integer(w, wz, **attrs)._weights
    return p.native_kind(_native._C.get_isa(), False)


@pytest.mark.parametrize("seed", range(12))
def test_seven_bit_weights_random_geometry(seed):
    """Weights on the fast path's side of its bound, around differing per-channel zero points,
    every type combination, random 1-3-D geometry (strides, dilations, pads, auto_pad, groups)."""
    rng = np.random.default_rng([seed, 40])
    nsp = 1 + seed % 3
    auto_pad = AUTO_PADS[seed % 4]
    size, kernel, strides, dilations, pads = random_geometry(rng, nsp, auto_pad, max_size=9)
    group = 1 + seed % 2
    xdt, wdt, ydt = ALL_8BIT_COMBOS[seed % len(ALL_8BIT_COMBOS)]
    m = group * int(rng.integers(1, 9))
    cin = group * int(rng.integers(1, 6))
    x = rand_int(rng, xdt, (2, cin, *size))
    w, wz = _seven_bit(rng, wdt, (m, cin // group, *kernel), m)
    kwargs = dict(auto_pad=auto_pad, kernel_shape=kernel, strides=strides, dilations=dilations, group=group)
    if pads is not None:
        kwargs["pads"] = pads
    check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kwargs)
    check_convint([x, w, rand_int(rng, xdt, ()), wz], kwargs)


@pytest.mark.parametrize("m,spatial,kernel,attrs", [
    (1, (1, 1), (1, 1), {}),
    (5, (3, 5), (2, 3), dict(pads=[1, 1, 0, 1])),
    (4, (56, 56), (3, 3), dict(pads=[1, 1, 1, 1])),            # straddling panels, borders
    (9, (17, 33), (3, 3), dict(pads=[1, 1, 1, 1])),            # 4-row kernel tails, odd widths
    (13, (1, 17), (1, 3), dict(pads=[0, 2, 0, 2])),
    (3, (29, 31), (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),   # stem: stride 2
    (6, (20, 45), (3, 3), dict(strides=[3, 2], pads=[0, 1, 2, 0])),
    (7, (11, 40), (3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3])),
    (17, (5, 7), (1, 1), dict(strides=[2, 2])),
])
def test_seven_bit_tails_borders_strides(m, spatial, kernel, attrs):
    """Channel counts around the fast kernel's 4 rows, pixels around its 16-column panels,
    borders, strides (the stride-2 copy), dilations; K around its groups of 4."""
    rng = np.random.default_rng([m, *spatial, *kernel, 41])
    for cin in (1, 3, 4, 5):
        for xdt, wdt in ((U8, I8), (I8, U8), (I8, I8), (U8, U8)):
            x = rand_int(rng, xdt, (1, cin, *spatial))
            w, wz = _seven_bit(rng, wdt, (m, cin, *kernel), m)
            check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        check_qconv(_qconv_args(rng, x, w, wz=wz), attrs)


@pytest.mark.parametrize("xdt", [U8, I8])
@pytest.mark.parametrize("wdt", [I8, U8])
@pytest.mark.parametrize("delta,fast", [(64, True), (-64, True), (65, False), (-65, False)])
def test_seven_bit_bound_extremes(xdt, wdt, delta, fast):
    """Every weight at w_zero_point + delta and x at its extremes: the pair sums reach
    2*255*64 = 32640 (the int16 limit is 32767) at the bound; one past it (65) the exact kernel
    must run on avx2, since vpmaddubsw would saturate there (2*255*65 = 33150). The VNNI
    levels' fast kernel (vpdpbusd, s8_bound 128) takes 65 too
    (test_vnni_fast_path_full_int8_weights tests its own bound)."""
    rng = np.random.default_rng([int(delta) & 0xFF, 42])
    info = np.iinfo(wdt)
    zw = info.min + 65 if delta > 0 else info.max - 65
    w = np.full((6, 8, 3, 3), zw + delta, dtype=wdt)
    w[1] = zw + delta * (1 if delta > 0 else 1)  # same sign everywhere: no cancellation
    w[2, ::2] = zw - np.sign(delta)               # a few of the other sign
    wz = np.full(6, zw, dtype=wdt)
    xinfo = np.iinfo(xdt)
    for xz, fill in ((xinfo.min, xinfo.max), (xinfo.max, xinfo.min)):
        # x' (x in its u8 form) at 255 or 0, x - zx at +-255: the largest products
        x = np.full((1, 8, 9, 18), fill, dtype=xdt)
        x[0, :, 4, 5] = xz
        kwargs = dict(pads=[1, 1, 1, 1])
        check_convint([x, w, xdt(xz), wz], kwargs)
        check_qconv(_qconv_args(rng, x, w, wz=wz), kwargs)
    kind = _conv_kind(w, wz, pads=[1, 1, 1, 1])
    from qlinear import _native
    info = None if kind is None else _native._C.kernel_info(_native._C.get_isa(), 2)
    if info is not None:
        assert (kind == 2) == (fast or info["s8_bound"] >= 65)


# Geometries of test_vnni_fast_path_full_int8_weights: (x spatial, kernel, attributes, input
# channels, group); 1-D, 2-D, 3-D, grouped, strides, dilations, asymmetric pads, channel counts
# that are and are not multiples of the 4-channel k-group, rows around the 16-column tile
_VNNI_CASES = [
    ((37,), (3,), dict(pads=[1, 2]), 8, 1),                                   # 1-D
    ((9, 21), (3, 3), dict(pads=[1, 1, 1, 1]), 4, 1),
    ((17, 30), (3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1]), 8, 1),      # stride 2, asymmetric
    ((11, 40), (3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3]), 12, 1),
    ((26, 32), (3, 3), dict(strides=[3, 3], pads=[1, 2, 0, 1]), 8, 2),      # stride 3, two groups
    ((23, 29), (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), 3, 1),      # a stem: 3 channels
    ((5, 7, 9), (3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), 4, 1),            # 3-D
    ((13, 17), (1, 1), {}, 132, 1),                                          # pointwise, 33 k-groups
    ((9, 9), (3, 3), dict(pads=[1, 1, 1, 1]), 16, 4),                       # 4 groups of 4
]


def _int8_weights_with_edges(rng, wdt, shape, spread):
    """Weights w = zw + d whose centered values d = w - zw reach the VNNI kernels' bound
    [-128, 127] where the type allows: per-channel zero points differing within ``spread`` of
    0 (int8) or 128 (uint8), d drawn from the largest range the channel's w can hold, and its
    two ends forced every 5th / 7th element (int8 zw 0 or uint8 zw 128: exactly -128 and 127)."""
    m = shape[0]
    mid = 0 if wdt == I8 else 128
    wz = (mid + rng.integers(-spread, spread, m, endpoint=True)).astype(np.int32)
    wz[0] = mid   # one channel with the whole range
    info = np.iinfo(wdt)
    lo = np.maximum(-128, info.min - wz).reshape(m, *(1,) * (len(shape) - 1))
    hi = np.minimum(127, info.max - wz).reshape(m, *(1,) * (len(shape) - 1))
    d = lo + np.floor(rng.random(shape) * (hi - lo + 1)).astype(np.int32)
    d = np.minimum(d, hi)
    d.reshape(m, -1)[:, ::5] = lo.reshape(m, 1)
    d.reshape(m, -1)[:, 3::7] = hi.reshape(m, 1)
    w = (wz.reshape(lo.shape) + d).astype(wdt)
    return w, wz.astype(wdt)


@pytest.mark.parametrize("case", range(len(_VNNI_CASES)))
def test_vnni_fast_path_full_int8_weights(case, engine_level):
    """The VNNI levels' convolution fast path (avx512vnni-s8u8 / avxvnni-s8u8: vpdpbusd, exact
    for every int8 centered weight, s8_bound 128) against the oracle: all 8 type combinations,
    centered weights at both ends -128 and 127 (int8 weights with zero point 0, uint8 with 128,
    and differing per-channel zero points around them), full-range activations (x at its type's
    extremes every 7th / 11th element: the largest products 255 * 128), 1-3-D geometry with
    strides, dilations, pads and groups; that the fast kind and the implicit path ran
    (conv_path_counts), and that weights one past the bound (w - zw = 128 or -129) fall back to
    the exact form (the U8S8 im2col GEMM) with the same bits."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level not in ("amx", "avx512vnni", "avxvnni"):   # (amx: avx512vnni's conv kernels)
        pytest.skip(f"needs a VNNI level (this run: {engine_level}); runs natively on VNNI CPUs and "
                    "under scripts/emulated_isa.sh")
    assert _native._C.kernel_info(level, 2)["s8_bound"] == 128
    spatial, kernel, attrs, cin, group = _VNNI_CASES[case]
    rng = np.random.default_rng([case, 48])
    kw = dict(attrs, group=group)
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = group * (5 + 6 * ((r + case) % 3))   # 5, 11, 17 per group: the 16-row tile's tails
        shape = (m, cin // group, *kernel)
        x = rand_int(rng, xdt, (2, cin, *spatial))
        x.flat[::7] = np.iinfo(xdt).min
        x.flat[3::11] = np.iinfo(xdt).max
        w, wz = _int8_weights_with_edges(rng, wdt, shape, 20 if r % 2 else 0)
        for outside in (False, True):
            if outside:   # one weight one past the bound: the whole layer takes the exact form
                w = w.copy()
                if wdt == I8:
                    wz = wz.copy()
                    wz[-1] = -1
                    w[-1].flat[-1] = 127                    # 127 - (-1) = 128
                else:
                    wz = wz.copy()
                    wz[-1] = 129
                    w[-1].flat[-1] = 0                      # 0 - 129 = -129
            kind = _conv_kind(w, wz, **kw)
            exact = outside or _exact_first(level, kernel, shape)
            assert kind == (0 if exact else 2), (kind, outside)
            before = _native._C.conv_path_counts()
            check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
            check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
            after = _native._C.conv_path_counts()
            took = after[0] - before[0], after[1] - before[1]
            implicit = not exact and _takes_implicit(spatial, kernel, attrs, cin, group, True)
            assert took == ((2, 0) if implicit else (0, 2)), (took, outside)
            if not exact:
                assert implicit, "every case here is one the implicit path takes"


def _exact_first(level, kernel, w_shape):
    """Whether the level runs a convolution of this kernel and weights (M, C/group, ...) on its
    exact GEMM even when the weights fit the fast kernel's bound: amx's 1x1 convolutions of at
    least 96 output and 32 input channels (its exact GEMM is on AMX tiles; qlinear.h,
    exact_1x1_min_m / exact_1x1_min_k, which kernel_info reports) whose input channels per group
    are not a multiple of 64 (those run amx-s8u8, its implicit kernel on tiles)."""
    from qlinear import _native
    info = _native._C.kernel_info(level, 2)
    chunk = info["kchunk"] * info["kpack"] if info["kchunk"] > 1 else 0   # amx-s8u8's 64 channels
    return (math.prod(kernel) == 1 and info["exact_1x1_min_m"] > 0 and w_shape[0] >= info["exact_1x1_min_m"]
            and w_shape[1] >= info["exact_1x1_min_k"] and not (chunk and w_shape[1] % chunk == 0))


# Narrow last tiles on the VNNI fast path (test_vnni_dot_tiles): (x spatial, kernel, pads,
# input channels, output channels); the last tile's real columns, the dot kernel's k bytes
# (4 per k-group) and its blocks: 1 x n pointwise planes whose last tile has 1, 2, 3, 4, 5, 8
# columns (its 16x1, 8x2 and 4x4 blocks, one and two column blocks), 7x7 / 14x14 planes (49 =
# 3*16 + 1, 196 = 12*16 + 4) pointwise and 3x3 on shifted planes, k bytes below, at and past
# 64 (8, 64, 100, 144: masked tails and none), rows 5, 16, 21 (partial row blocks, two row
# tiles), and a reduction cut into K blocks (704 channels 3x3: the dot kernel over the whole K)
_VNNI_DOT_CASES = [
    ((1, 1), (1, 1), None, 8, 5),
    ((1, 2), (1, 1), None, 64, 16),
    ((1, 19), (1, 1), None, 100, 21),
    ((1, 20), (1, 1), None, 8, 16),
    ((1, 21), (1, 1), None, 64, 5),
    ((1, 24), (1, 1), None, 100, 16),
    ((7, 7), (1, 1), None, 64, 21),
    ((14, 14), (1, 1), None, 100, 16),
    ((7, 7), (3, 3), [1, 1, 1, 1], 16, 21),
    ((14, 14), (3, 3), [1, 1, 1, 1], 16, 16),
    ((1, 5), (3, 3), [1, 1, 1, 1], 704, 3),
]


@pytest.mark.parametrize("case", range(len(_VNNI_DOT_CASES)))
def test_vnni_dot_tiles(case, engine_level):
    """The VNNI fast path's narrow last tiles (at most 8 real columns: a 7x7 plane's 49th, a
    14x14 plane's last 4) through avx512vnni's dot kernel against the oracle: centered weights
    at both ends -128 and 127 (int8 weights with zero point 0, uint8 with 128, and per-channel
    zero points around them), activations at their type's extremes (products 255 * 128), every
    type combination, QLinearConv and ConvInteger (the requantizing and the int32 epilogue),
    batch 1; and that the implicit path and, on avx512vnni (and amx where its own amx-s8u8 does
    not take the channel count: avx512vnni's kernels), the dot kernel ran (tail_counts)."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level not in ("amx", "avx512vnni", "avxvnni"):   # (amx, where built: avx512vnni's conv kernels)
        pytest.skip(f"needs a VNNI level (this run: {engine_level}); runs natively on VNNI CPUs and "
                    "under scripts/emulated_isa.sh")
    spatial, kernel, pads, cin, m = _VNNI_DOT_CASES[case]
    attrs = dict(pads=pads) if pads else {}
    rng = np.random.default_rng([case, 50])
    combos = ALL_8BIT_COMBOS if cin < 704 else ALL_8BIT_COMBOS[:2]
    for r, (xdt, wdt, ydt) in enumerate(combos):
        x = rand_int(rng, xdt, (1, cin, *spatial))
        x.flat[::7] = np.iinfo(xdt).min
        x.flat[3::11] = np.iinfo(xdt).max
        w, wz = _int8_weights_with_edges(rng, wdt, (m, cin, *kernel), 20 if r % 2 else 0)
        exact = _exact_first(level, kernel, (m, cin))   # amx's wide 1x1: its exact GEMM, im2col (no dot kernel)
        assert _conv_kind(w, wz, **attrs) == (0 if exact else 2)
        before, paths = _native._C.tail_counts(), _native._C.conv_path_counts()
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        took = _native._C.conv_path_counts()
        assert (took[0] - paths[0], took[1] - paths[1]) == ((0, 2) if exact else (2, 0))   # implicit / im2col
        dot = _tail_delta(before)[2]
        # avxvnni has no dot kernel, nor has amx-s8u8 (amx's kernel where 64 divides the channels)
        tiles = _native._C.conv_kernel_name(level, 2, cin * math.prod(kernel), math.prod(kernel)) == "amx-s8u8"
        assert (dot > 0) == (level != "avxvnni" and not exact and not tiles), (level, dot)


def test_prepared_conv_repeated_calls_with_changing_parameters():
    """Repeated calls reuse the derived call arguments only while shapes, zero points and
    scales stay the same: alternating them gives the oracle's answer every time."""
    rng = np.random.default_rng(43)
    w = rand_int(rng, I8, (5, 3, 3, 3))
    ws, wz, b = rand_scale(rng, (5,)), rand_int(rng, I8, (5,)), rand_int(rng, I32, (5,))
    p = qlinear.prepare_qlinear_conv(w, ws, wz, b, pads=[1, 1, 1, 1])
    xs = [rand_int(rng, U8, (1, 3, 6, 7)), rand_int(rng, U8, (2, 3, 4, 9)), rand_int(rng, I8, (1, 3, 6, 7))]
    params = [(np.float32(0.02), 3, np.float32(40.0), np.uint8(7)),
              (np.float32(0.03), 200, np.float32(25.0), np.int8(-3))]
    for r in range(12):
        x = xs[r % 3]
        xsc, xz, ys, yz = params[(r // 3) % 2]
        xz = x.dtype.type(xz if x.dtype == U8 else xz - 128)
        want = oracle.qlinear_conv(x, xsc, xz, w, ws, wz, ys, yz, b, pads=[1, 1, 1, 1])
        assert_exact(p.run(x, xsc, xz, ys, yz), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,kernel,attrs,mult", [
    ((2, 64, 48, 48), (3, 3), dict(pads=[1, 1, 1, 1]), 1),                 # channels-last, 2.6M MACs
    ((2, 40, 96, 70), (3, 3), dict(pads=[0, 1, 1, 0], strides=[2, 1]), 1),  # bands, C % 16 != 0
    ((1, 32, 101, 90), (3, 3), dict(pads=[1, 1, 1, 1]), 1),               # 2 blocks: rows split
    ((1, 24, 5, 4200), (3, 3), dict(pads=[1, 1, 1, 1]), 1),                # too wide: row path
    ((2, 12, 36, 36), (5, 5), dict(pads=[2, 2, 2, 2]), 3),                 # multiplier: plane mode
    ((2, 16, 70000), (3,), dict(pads=[1, 1], strides=[2]), 1),             # 1-D, gathers
])
def test_depthwise_threads_all_types(shape, kernel, attrs, mult, threads):
    """Depthwise layers above the threading threshold (2^21 MACs) on every path, on 1 and 2
    threads, every type combination (half of them per thread count), full-range values
    around differing per-channel zero points, full-range int32 biases."""
    rng = np.random.default_rng([*shape, *kernel, mult, threads, 47])
    c = shape[1]
    kwargs = dict(attrs, group=c)
    with num_threads(threads):
        for i, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS[threads - 1::2]):
            x = rand_int(rng, xdt, shape)
            w = rand_int(rng, wdt, (c * mult, 1, *kernel))
            args = _qconv_args(rng, x, w, ydt=ydt)
            got = check_qconv(args, kwargs)
            x, xs, xz, w, ws, wz, ys, yz, b = args
            assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, b, **kwargs).run(x, xs, xz, ys, yz), got)
            if i % 2 == 0:
                check_convint(as_convint_args(args), kwargs)


def test_prepared_conv_repeated_identical_calls():
    """A call repeating the last one's parameter objects skips their validation (NumPy scalars
    and Python numbers only): x changed in place, a new x of the same shape, a non-contiguous
    or byte-swapped x, 0-d array parameters written in place between calls, a change of
    engine: the oracle's answer every time."""
    from qlinear import _native

    rng = np.random.default_rng(46)
    w = rand_int(rng, I8, (16, 1, 3, 3))
    ws, wz = rand_scale(rng, (16,)), rand_int(rng, I8, (16,))
    b = rng.integers(-20000, 20000, 16, dtype=I32)   # outputs mostly unsaturated: changes show
    kw = dict(pads=[1, 1, 1, 1], group=16)
    p = qlinear.prepare_qlinear_conv(w, ws, wz, b, **kw)
    pi = qlinear.prepare_conv_integer(w, wz, **kw)
    xsc, xz, ys, yz = np.float32(0.02), np.uint8(3), np.float32(20.0), np.uint8(127)
    x = rand_int(rng, U8, (1, 16, 6, 7))

    def check(x, xsc=xsc, xz=xz, ys=ys, yz=yz):
        assert_exact(p.run(x, xsc, xz, ys, yz), oracle.qlinear_conv(x, xsc, xz, w, ws, wz, ys, yz, b, **kw))
        assert_exact(pi.run(x, xz), oracle.conv_integer(x, w, xz, wz, **kw))
        assert_exact(pi.run(x), oracle.conv_integer(x, w, U8(0), wz, **kw))

    for _ in range(2):
        check(x)
        x[...] = rand_int(rng, U8, x.shape)                       # written in place
        check(x)
        check(rand_int(rng, U8, x.shape))                         # another array
        check(np.asfortranarray(rand_int(rng, U8, x.shape)))      # not contiguous
        check(rand_int(rng, U8, x.shape).astype(np.dtype(U8).newbyteorder()))
        check(x, 0.02, 3, 20.0, yz)                               # Python numbers
        for one in (dict(xsc=np.float32(0.03)), dict(xz=np.uint8(5)), dict(ys=np.float32(30.0)),
                    dict(yz=np.uint8(9))):                        # one parameter changed
            check(x, **one)
            check(x)
    z0, s0 = np.array(3, U8), np.array(20.0, np.float32)          # 0-d arrays: mutable
    check(x, xsc, z0, s0, yz)
    z0[...] = 200
    s0[...] = 30.0
    check(x, xsc, z0, s0, yz)
    check(x)
    with _native.use_engine("numpy"):
        check(x)
    check(x)


@pytest.mark.parametrize("spatial", [(1, 1), (3, 5), (7, 9), (1, 17), (5, 56), (2, 3, 11)])
@pytest.mark.parametrize("seven_bit", [False, True])
def test_pointwise_panels_across_output_rows(spatial, seven_bit):
    """1x1, stride 1, no pads: panels of 16 pixels read x in place across output rows; the
    last panel is partial."""
    rng = np.random.default_rng([*spatial, seven_bit, 44])
    for xdt, wdt in ((U8, I8), (I8, U8)):
        x = rand_int(rng, xdt, (2, 5, *spatial))
        shape = (7, 5) + (1,) * len(spatial)
        w, wz = _seven_bit(rng, wdt, shape, 7) if seven_bit else (rand_int(rng, wdt, shape), rand_int(rng, wdt, (7,)))
        check_convint([x, w, rand_int(rng, xdt, ()), wz], {})
        check_qconv(_qconv_args(rng, x, w, wz=wz), {})


@pytest.mark.parametrize("c", [8, 15, 16, 17, 33])
@pytest.mark.parametrize("spatial,kernel,attrs", [
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1])),
    ((14, 14), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((5, 23), (3, 3), dict(pads=[0, 2, 1, 0], strides=[1, 3])),
    ((9, 16), (5, 5), dict(pads=[2, 2, 2, 2], dilations=[1, 2])),
    ((11, 13), (7, 7), dict(pads=[3, 3, 3, 3])),               # 49 taps: 25 pairs, one padding tap
    ((6, 6), (2, 2), {}),
    ((3, 40), (1, 3), dict(pads=[0, 1, 0, 1])),
    ((62, 62), (3, 3), dict(pads=[1, 1, 1, 1])),               # 64 x 64 padded: one band
    ((63, 63), (3, 3), dict(pads=[1, 1, 1, 1])),               # one row more: two bands
    ((112, 112), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # bands, stride 2
    ((40, 45), (3, 3), dict(pads=[50, 1, 3, 1])),              # bands of padding only
    ((2, 1400), (3, 3), dict(pads=[1, 1, 1, 1])),              # 3 rows of 1402: per-channel path
    ((10, 10), (9, 9), dict(pads=[4, 4, 4, 4])),               # 81 taps: the per-channel path
])
def test_depthwise_channels_last(c, spatial, kernel, attrs):
    """The channels-last depthwise path: channel counts around its blocks of 16, widths
    below and above 16 (scalar and SIMD transposes), strides, dilations, pads, kernels up to
    its 64 taps, planes in one band, in bands (halo rows, bands of padding only) and too wide."""
    rng = np.random.default_rng([c, *spatial, *kernel, 45])
    kwargs = dict(attrs, group=c)
    for xdt, wdt, ydt in ((U8, I8, U8), (I8, U8, I8), (I8, I8, U8)):
        x = rand_int(rng, xdt, (2, c, *spatial))
        w = rand_int(rng, wdt, (c, 1, *kernel))
        args = _qconv_args(rng, x, w, ydt=ydt)
        got = check_qconv(args, kwargs)
        # the prepared form (weights also in the channels-last kernel's layout)
        x, xs, xz, w, ws, wz, ys, yz, b = args
        assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, b, **kwargs).run(x, xs, xz, ys, yz), got)
        args = [x, w, rand_int(rng, xdt, ()), rand_int(rng, wdt, (c,))]
        got = check_convint(args, kwargs)
        assert_exact(qlinear.prepare_conv_integer(w, args[3], **kwargs).run(x, args[2]), got)
    x = rand_extreme(rng, U8, (1, c, *spatial))
    w = rand_extreme(rng, I8, (c, 1, *kernel))
    check_convint([x, w, U8(0), I8(127)], kwargs)
    check_convint([x, w, U8(255), I8(-128)], kwargs)


def _dw_cl_runs(level):
    """Depthwise calls run on the channels-last path so far (None on the NumPy engine)."""
    from qlinear import _native
    return None if level == "numpy" else _native._C.conv_dw_path_counts()[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("c,n,spatial,kernel,attrs", [
    (16, 2, (7, 7), (3, 3), dict(pads=[1, 1, 1, 1])),                     # rows below 16: scattered blocks
    (32, 1, (14, 14), (3, 3), dict(pads=[0, 0, 1, 1], strides=[2, 2])),   # stride 2, end pads only
    (48, 1, (13, 11), (3, 3), dict(pads=[2, 0, 1, 3], strides=[3, 3])),   # stride 3, asymmetric pads
    (31, 2, (9, 20), (5, 5), dict(pads=[2, 2, 2, 2], dilations=[2, 1])),  # dilation, 16 + 15 channels
    (33, 1, (6, 17), (1, 1), {}),                                         # 1x1: one pair (a padding tap)
    (16, 1, (11, 13), (7, 7), dict(pads=[3, 3, 3, 3])),                   # 7x7
    (15, 2, (3, 3), (3, 3), dict(pads=[1, 1, 1, 1])),                     # 9 positions: element by element
    (16, 1, (70, 40), (3, 3), dict(pads=[1, 1, 1, 1])),                   # bands: halo rows, padding per band
    (32, 1, (28, 28), (3, 3), dict(pads=[1, 1, 1, 1])),                   # the two-row 3x3 body, 28 rows
    (16, 1, (5, 30), (3, 3), dict(pads=[1, 1, 1, 1])),                    # 5 rows: the 3x3 body's odd last row
    (16, 1, (160, 100), (3, 3), dict(pads=[1, 1, 1, 1])),                 # 2.3 M MACs: 2 threads, 16 row groups
])
def test_depthwise_channels_last_requant_edges(c, n, spatial, kernel, attrs, threads, engine_level):
    """The channels-last path's requantization and its raw (uncentered) fill: x zero points at
    both ends of each type (the fill keeps x ^ 0x80 for int8 and pads with the zero point,
    which the bias takes back), y zero points at both ends, multipliers so large that
    float32(acc) * mult overflows to +-inf (the float upper clamp, the integer lower clamp)
    and so small that everything rounds to the zero point, every type combination, full-range
    per-channel weight zero points and int32 biases, 1 and 2 threads (the layers below 2^21
    MACs run on one thread either way; the 160x100 one is split into row groups and bands
    whose padding each thread keeps between its tasks); the path is asserted."""
    rng = np.random.default_rng([c, n, *spatial, *kernel, threads, 48])
    kwargs = dict(attrs, group=c)
    combos = ALL_8BIT_COMBOS
    with num_threads(threads):
        for i, (xdt, wdt, ydt) in enumerate(combos):
            xi, yi = np.iinfo(xdt), np.iinfo(ydt)
            x = rand_int(rng, xdt, (n, c, *spatial))
            w = rand_int(rng, wdt, (c, 1, *kernel))
            wz = rand_int(rng, wdt, (c,))
            b = rand_int(rng, I32, (c,))
            xz = xdt((xi.min, xi.max, 0, xi.min + 1)[i % 4])
            yz = ydt((yi.max, yi.min, 0)[i % 3])
            ws = rand_scale(rng, (c,))
            xs = np.float32(0.01)
            # y_scale: ordinary (outputs spread over the range), tiny (products beyond float32:
            # +-inf, and the multiplier itself stays finite), huge (every output rounds to 0)
            mult = (np.float32(1e-5), np.float32(1e32), np.float32(1e-38))[i % 3]
            ys = np.float32(np.float32(xs * np.max(ws)) / mult)
            args = [x, xs, xz, w, ws, wz, ys, yz, b]
            before = _dw_cl_runs(engine_level)
            got = check_qconv(args, kwargs)
            assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, b, **kwargs).run(x, xs, xz, ys, yz), got)
            if before is not None:
                assert _dw_cl_runs(engine_level) - before == 2
            if i % 4 == 0:
                check_convint([x, w, xz, wz], kwargs)


def test_depthwise_requant_saturates_both_ways(engine_level):
    """Every output at qmin or qmax (accumulators far beyond the range, both signs, through
    the channels-last kernel's clamps), and exactly at the zero point (acc 0)."""
    rng = np.random.default_rng(49)
    c = 32
    kwargs = dict(pads=[1, 1, 1, 1], group=c)
    for xdt, wdt, ydt in ALL_8BIT_COMBOS:
        x = rand_extreme(rng, xdt, (1, c, 9, 9))
        w = rand_extreme(rng, wdt, (c, 1, 3, 3))
        wz = np.zeros(c, wdt)
        b = rng.choice(np.array([-2**31, 2**31 - 1, 0], I32), size=c)
        for yz in np.iinfo(ydt).min, np.iinfo(ydt).max:
            args = [x, np.float32(1.0), xdt(0), w, np.ones(c, np.float32), wz, np.float32(1e-3), ydt(yz), b]
            check_qconv(args, kwargs)


# (x spatial, kernel, attributes, input channels, group): the implicit GEMM's cases (conv.c's
# ig_run: 1-D/2-D, channels per group a multiple of the kernel's k-group (2 exact, 4 7-bit),
# more than one tap), and the im2col path's for what it declines
_IMPLICIT_CASES = [
    ((9, 21), (3, 3), dict(pads=[1, 1, 1, 1]), 4, 1),                    # row tails: 21 = 16 + 5
    ((17, 30), (3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1]), 8, 1),   # stride 2, asymmetric pads
    ((12, 35), (5, 5), dict(pads=[2, 2, 2, 2], dilations=[2, 1]), 4, 1),
    ((23, 29), (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), 4, 1),   # a stem: 4 phase planes
    ((26, 32), (3, 3), dict(strides=[3, 3], pads=[1, 2, 0, 1]), 8, 2),   # stride 3, two groups
    ((11, 40), (3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3]), 12, 1),
    ((14, 33), (3, 3), dict(strides=[1, 3], pads=[0, 1, 2, 0]), 8, 1),   # mixed strides
    ((8, 70), (2, 4), dict(pads=[0, 1, 1, 2], strides=[2, 1]), 4, 2),    # even kernel, one h phase
    ((90,), (3,), dict(pads=[1, 2], strides=[2]), 8, 1),                 # 1-D
    ((9, 75), (3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2]), 4, 1),    # stride-2 rows of 16+ (SIMD gather)
    ((9, 11), (3, 3), dict(strides=[2, 2], pads=[0, 1, 1, 0]), 8, 1),    # stride 2, rows below 16 bytes
    ((21, 37), (3, 3), dict(strides=[4, 4], pads=[1, 3, 2, 1]), 8, 1),   # stride 4: 4 column phases
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 8, 1),                     # 7x7: 4 tiles like 4 panels
    ((40, 3), (3, 3), dict(pads=[1, 1, 1, 1]), 8, 1),                    # 3 wide: shifted planes (no dropped column)
    ((10, 10), (3, 3), dict(pads=[300, 300, 300, 300], dilations=[300, 300]), 4, 1),  # copy too large
    ((16, 19), (3, 3), dict(pads=[1, 1, 1, 1]), 6, 1),                   # 6 channels: 4-blocks padded to 8
    ((16, 19), (3, 3), dict(pads=[1, 1, 1, 1]), 3, 1),                   # a stem's 3 channels: padded to 4
    ((16, 19), (3, 3), dict(pads=[1, 1, 1, 1]), 5, 1),                   # 5: padded to 6 (exact), im2col (7-bit)
    ((16, 19), (3, 3), dict(pads=[1, 1, 1, 1]), 1, 1),                   # 1 channel: im2col
    ((9, 21), (1, 1), {}, 5, 1),                                         # pointwise: one run, 5 channels
    ((15, 22), (1, 1), dict(strides=[2, 2]), 6, 1),                      # pointwise stride 2: one phase
    ((6, 37), (1, 1), dict(pads=[1, 0, 2, 0]), 3, 1),                    # pointwise, rows of padding
    ((40, 40), (1, 1), {}, 208, 1),   # pointwise copy above 512 KiB exact (im2col), 7-bit below
    ((40, 40), (1, 1), {}, 416, 1),   # 1.3 MiB exact (im2col), 7-bit 0.66 MiB: below its 1 MiB
    # 3-D and 4-D: the same path, the outer axes flattened into the planes' rows (dropped rows
    # between outer slices where a kernel reaches past them)
    ((5, 14, 21), (3, 3, 3), dict(pads=[1] * 6), 4, 1),                                 # dropped rows
    ((5, 9, 21), (3, 3, 3), dict(pads=[1] * 6), 8, 1),                                  # shifted planes only
    ((7, 11, 30), (3, 3, 3), dict(strides=[2, 2, 2], pads=[1, 0, 2, 0, 1, 1]), 8, 1),   # 8 phase tuples x 2
    ((6, 8, 35), (2, 3, 5), dict(dilations=[2, 1, 2], pads=[1, 1, 4, 0, 1, 4]), 4, 1),
    ((9, 10, 26), (3, 3, 3), dict(strides=[3, 1, 2], pads=[1, 2, 0, 0, 1, 1]), 8, 2),   # stride 3, groups
    ((5, 6, 40), (3, 1, 3), dict(strides=[4, 2, 4], pads=[2, 1, 3, 1, 0, 2]), 8, 1),    # stride 4
    ((4, 6, 7), (3, 1, 3), dict(pads=[1, 0, 1, 1, 0, 1]), 8, 1),                        # rows below 16, no dropped row
    ((6, 9, 21), (1, 1, 1), {}, 5, 1),                                                  # pointwise: one run
    ((6, 9, 21), (1, 1, 1), dict(pads=[1, 0, 0, 2, 0, 0]), 6, 1),                       # ... between padding slices
    ((4, 6, 21), (1, 1, 1), dict(strides=[2, 2, 2]), 6, 1),                             # pointwise stride 2
    ((6, 7, 17), (3, 3, 3), dict(pads=[1] * 6), 6, 1),                                  # 4-blocks padded to 8
    ((4, 5, 6), (3, 3, 3), dict(pads=[300] * 6, dilations=[300] * 3), 4, 1),            # copy too large: im2col
    ((11, 6, 30), (3, 3, 3), dict(strides=[5, 1, 1], pads=[1] * 6), 8, 1),              # stride 5: im2col
    ((3, 4, 5, 20), (2, 2, 3, 3), dict(strides=[1, 2, 1, 1], pads=[1, 0, 1, 1, 0, 1, 1, 1]), 4, 1),  # 4-D
    ((7, 7, 7, 20), (3, 3, 3, 3), dict(strides=[3, 3, 3, 1]), 4, 1),   # 4-D, 27 phase tuples: im2col
]


def _mirror_axes(spatial, kernel, attrs):
    """Per axis, what conv.c's ig_run derives for any rank: stride, dilation, begin pad, output
    size, and the phase extent ceil(max(in + begin pad, the windows' reach) / stride)."""
    n = len(spatial)
    strides = attrs.get("strides", [1] * n)
    dils = attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * (2 * n))
    axes = []
    for a in range(n):
        s, d, k, pb = strides[a], dils[a], kernel[a], pads[a]
        o = (spatial[a] + pb + pads[n + a] - (k - 1) * d - 1) // s + 1
        e = max(spatial[a] + pb, (o - 1) * s + (k - 1) * d + 1)
        axes.append((s, d, pb, o, -(-e // s)))
    return axes


def _implicit_geometry_fits(spatial, kernel, attrs, cin, kpack):
    """ig_run's geometric rules, any rank (docs/engine.md): strides up to 4, at most 16 used
    phase tuples of the outer axes, and phase planes of at most 2 (input + output) + 4096
    positions (huge pads or dilations: im2col, which never materializes padding); and, for the
    cases that pass those, the tiles within a quarter more than im2col's panels. ig_run's
    tiling is the standard planes' 16-column tiles or fewer (row-aligned tiles, or shifted
    planes, taken only where they cost less): where those fit, the path is taken; where only
    the shifted planes' fit (a 2-D case here), whether it is depends on ig_shift_pays
    (_takes_shifted)."""
    axes = _mirror_axes(spatial, kernel, attrs)
    if any(s > 4 for s, *_ in axes):
        return False
    tuples = int(np.prod([len({t * d % s for t in range(k)}) for (s, d, *_), k in zip(axes[:-1], kernel)]))
    if tuples > 16:
        return False
    plane_in, plane_out = int(np.prod(spatial)), int(np.prod([o for *_, o, _ in axes]))
    if int(np.prod([e for *_, e in axes])) > 2 * (plane_in + plane_out) + 4096:
        return False
    ow, wph = axes[-1][3], axes[-1][4]
    ro, st = 1, 1   # the rows the outputs span over the phase grid
    for _, _, _, o, e in reversed(axes[:-1]):
        ro += (o - 1) * st
        st *= e
    panels = -(-plane_out // 16)
    fits = [4 * -(-((ro - 1) * w + ow) // 16) <= 5 * panels for w in (wph, ow)]
    if fits[0] or not fits[1]:
        return fits[0]
    from qlinear import _native
    return _takes_shifted(spatial, kernel, attrs, cin, kpack, _native._C.get_isa() == "avx2")


def _takes_implicit(spatial, kernel, attrs, cin, group, seven_bit):
    """Whether conv.c's implicit GEMM takes the case at the current level (the exact kernels'
    k-group is 2 channels, the fast S8U8 kernels' 4, channels padded up to it when that adds at
    most a third; the scalar level has no fast kernel; the VNNI levels' exact kernel is the
    U8S8 GEMM, im2col only, so there only the fast path - seven_bit: the call's kind is the
    fast one - is implicit), from the path rules documented in docs/engine.md."""
    from qlinear import _native
    cg = cin // group
    level = _native._C.get_isa()
    vnni = level in ("amx", "avx512vnni", "avxvnni")   # (amx: avx512vnni's conv kernels)
    kpack = 4 if seven_bit and (level == "avx2" or vnni) else 2
    blocks = -(-cg // kpack)
    if level not in ("avx2", "scalar") and not (vnni and seven_bit):
        return False
    pointwise = all(k == 1 for k in kernel)
    if not pointwise and 3 * blocks * kpack > 4 * cg:   # channel padding: at most 1/3 more
        return False
    pw_max = 1 << 20 if kpack == 4 else 512 << 10   # the 7-bit form: twice the work per byte
    if pointwise and not attrs and blocks * 4 * (-(-(int(np.prod(spatial)) + 16) // 16) * 16) > pw_max:
        return False   # a pointwise copy larger than L2
    return _implicit_geometry_fits(spatial, kernel, attrs, cg, kpack)


def _implicit_operands(rng, xdt, wdt, xshape, wshape, seven_bit, at_bound=False):
    """x with its type's extremes every 7th / 11th element, and w (full-range or 7-bit) with
    per-output-channel zero points: the implicit-path tests' operands. at_bound (7-bit): every
    5th |w - w_zero_point| set to 64, the largest the 7-bit kernel takes."""
    x = rand_int(rng, xdt, xshape)
    x.flat[::7] = np.iinfo(xdt).min
    x.flat[3::11] = np.iinfo(xdt).max
    m = wshape[0]
    if seven_bit:
        w, wz = _seven_bit(rng, wdt, wshape, m)
        if at_bound:
            wzc = wz.astype(np.int32).reshape(m, *(1,) * (len(wshape) - 1))
            d = w.astype(np.int32) - wzc
            d.flat[::5] = 64 * rng.choice([-1, 1], d.flat[::5].shape)
            w = (wzc + d).astype(wdt)
    else:
        w, wz = rand_extreme(rng, wdt, wshape), rand_int(rng, wdt, (m,))
    return x, w, wz


@pytest.mark.parametrize("case", range(len(_IMPLICIT_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_gemm_paths(case, seven_bit, engine_level):
    """The implicit GEMM (padded phase-plane copy read in place by the kernel) against the
    oracle at every level: kernels 2x4-7x7, strides 1-4, dilations, asymmetric pads, 1-D, 3-D
    and 4-D (dropped rows, phase tuples, pointwise runs), groups, batch 2, rows not a multiple
    of the 16-pixel tile, output channels around the kernels' row tiles, all 8 type
    combinations, differing per-channel zero points, full-range int32 bias (wraps), full-range
    and 7-bit weights; and that the path was taken (or, for the cases it declines - stride 5,
    too many phase tuples, huge pads - that the im2col path ran)."""
    from qlinear import _native
    spatial, kernel, attrs, cin, group = _IMPLICIT_CASES[case]
    rng = np.random.default_rng([case, seven_bit, 45])
    native = engine_level != "numpy" and _native.native() is not None
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = group * (3 + 2 * ((r + case) % 4))   # 3, 5, 7, 9 per group: tails of 4 and 6
        shape = (m, cin // group, *kernel)
        x, w, wz = _implicit_operands(rng, xdt, wdt, (2, cin, *spatial), shape, seven_bit)
        kw = dict(attrs, group=group)
        before = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        if native:
            after = _native._C.conv_path_counts()
            took = after[0] - before[0], after[1] - before[1]
            want_fast = _conv_kind(w, wz, **kw) == 2
            implicit = _takes_implicit(spatial, kernel, attrs, cin, group, want_fast)
            assert took == ((2, 0) if implicit else (0, 2)), (took, implicit)


@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_gemm_k_blocks(seven_bit, engine_level):
    """A reduction the implicit path cuts into K blocks (1376 channels x 3x3 = 12384: 6192 exact
    k-groups, 3096 7-bit ones, above the 3072 that run unblocked): partial sums added in wrap32,
    then the epilogue; x and w at their extremes so that the sums reach past 2^24 and the bias
    wraps."""
    from qlinear import _native
    rng = np.random.default_rng([seven_bit, 46])
    for xdt, wdt, ydt in ((U8, I8, U8), (I8, U8, I8)):
        x = rand_extreme(rng, xdt, (1, 1376, 4, 17))
        if seven_bit:
            w, wz = _seven_bit(rng, wdt, (5, 1376, 3, 3), 5)
        else:
            w, wz = rand_extreme(rng, wdt, (5, 1376, 3, 3)), rand_int(rng, wdt, (5,))
        kw = dict(pads=[1, 1, 1, 1])
        before = _native._C.conv_path_counts() if engine_level != "numpy" else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        if before is not None and _native._C.get_isa() in ("avx2", "scalar"):
            assert _native._C.conv_path_counts()[0] - before[0] == 2


@pytest.mark.parametrize("cin,kernel", [(29, (1, 1)), (31, (1, 1)), (32, (1, 1)), (34, (1, 1)), (35, (1, 1)),
                                        (38, (1, 1)), (62, (1, 1)), (66, (1, 1)), (70, (1, 1)), (74, (1, 1)),
                                        (130, (1, 1)), (3, (3, 3)), (4, (3, 3)), (8, (3, 3))])
@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_kernel_k_group_counts(cin, kernel, seven_bit, engine_level):
    """The implicit tile kernels' k-group loop around its split points (avx2: the k-groups
    that prefetch group g + 16, unrolled by 2, then the last 16 without): pointwise, the
    exact kernel's k-groups are ceil(cin / 2) (15-19, 31-37, 65), the 7-bit kernel's
    ceil(cin / 4) (8-10, 16-19, 33); 3x3, 9 or 18 per channel block; so the prefetching loop
    runs 0, 1 (odd) and 2 (even) times and past the unrolled pairs. Every row tail (1-6 rows
    of the 6-row exact tile, 1-4 of the 7-bit one, then 7 and 13); x and w at their extremes
    (sums past 2^24), against the oracle, and the implicit path taken."""
    from qlinear import _native
    rng = np.random.default_rng([cin, kernel[0], seven_bit, 47])
    native = engine_level != "numpy" and _native.native() is not None
    pads = dict(pads=[1, 1, 1, 1]) if kernel == (3, 3) else {}
    for r, m in enumerate((1, 2, 3, 4, 5, 6, 7, 13)):
        xdt, wdt, ydt = ALL_8BIT_COMBOS[r % len(ALL_8BIT_COMBOS)]
        x = rand_extreme(rng, xdt, (2, cin, 5, 19))
        if seven_bit:
            w, wz = _seven_bit(rng, wdt, (m, cin, *kernel), m)
        else:
            w, wz = rand_extreme(rng, wdt, (m, cin, *kernel)), rand_int(rng, wdt, (m,))
        before = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), pads)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], pads)   # the int32 sums themselves
        if native:
            want_fast = _conv_kind(w, wz, **pads) == 2
            implicit = _takes_implicit((5, 19), kernel, pads, cin, 1, want_fast)
            took = _native._C.conv_path_counts()[0] - before[0]
            assert took == (2 if implicit else 0)


# (x spatial, kernel, attributes, input channels, whether avx2 takes the shifted planes)
_SHIFT_CASES = [
    ((14, 14), (3, 3), dict(pads=[1, 1, 1, 1]), 8, True),         # ResNet-50 l3: 12 tiles + 4 dot columns
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 12, True),          # l4: 3 tiles + 1 dot column
    ((14, 14), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 8, True),   # 2 row phases x 3 taps
    ((15, 15), (3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1]), 6, True),   # odd sizes, 6 -> 8 channels
    ((12, 11), (3, 5), dict(pads=[1, 2, 1, 2], dilations=[1, 2]), 4, True),  # column dilation 2
    ((20, 23), (3, 3), dict(strides=[2, 2], pads=[1, 2, 1, 2], dilations=[1, 2]), 8, True),  # stride 2, dilation 2: taps in phase 0 at 0, 1, 2
    ((21, 24), (2, 4), dict(strides=[2, 2], pads=[0, 3, 1, 2], dilations=[1, 3]), 6, True),  # dilation 3: phases 0 1 0 1 at 0, 1, 3, 4
    ((9, 20), (1, 3), dict(pads=[0, 1, 0, 1]), 3, True),          # one row tap, 3 -> 4 channels
    ((10, 17), (2, 2), dict(strides=[2, 2]), 8, True),            # no pads: the stride's spare column
    ((23, 29), (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), 4, True),   # a stem: 2 x 7 planes
    ((26, 32), (3, 3), dict(strides=[3, 3], pads=[1, 2, 0, 1]), 8, True),   # stride 3, 3 row phases
    ((40, 3), (3, 3), dict(pads=[1, 1, 1, 1]), 8, True),          # 3 wide: 8 tiles, not 13 (im2col before)
    ((2, 14), (3, 3), dict(pads=[1, 1, 1, 1]), 8, False),         # 2 tiles either way: standard
    ((9, 21), (1, 1), {}, 8, False),                              # one column tap: nothing to shift
    # 3-D: planes per (tuple of outer phases, column tap), dropped rows between depth slices
    ((5, 9, 21), (3, 3, 3), dict(pads=[1] * 6), 8, True),
    ((6, 10, 24), (3, 3, 3), dict(strides=[2, 2, 2], pads=[1] * 6), 8, True),   # 4 outer tuples, the s2 split
    ((4, 7, 7), (3, 3, 3), dict(pads=[1] * 6), 8, True),          # standard planes: too many tiles
    ((6, 12, 20), (2, 3, 3), dict(strides=[1, 2, 2], pads=[0, 1, 1, 1, 1, 1]), 6, True),
    ((5, 14, 21), (3, 3, 1), dict(pads=[1, 1, 0, 1, 1, 0]), 8, False),   # one column tap: dropped rows only
    ((4, 12, 40), (2, 1, 9), dict(pads=[0, 0, 4, 1, 1, 4]), 4, False),    # 9 column taps: standard planes
]


def _mirror_planes(spatial, kernel, attrs):
    """The geometry conv.c's ig_run derives for a 2-D convolution, for the rules' Python
    mirrors: strides, dilations, begin pads (rows, columns), the output's OH and OW and the
    phase planes' rows and columns Hph and Wph (what the input and its begin pads cover, and
    what the windows reach, over the stride)."""
    (h, w), (kh, kw) = spatial, kernel
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    ph, pw, ph1, pw1 = attrs.get("pads", [0, 0, 0, 0])
    oh = (h + ph + ph1 - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pw + pw1 - (kw - 1) * dw - 1) // sw + 1
    hph = -(-max(h + ph, (oh - 1) * sh + (kh - 1) * dh + 1) // sh)
    wph = -(-max(w + pw, (ow - 1) * sw + (kw - 1) * dw + 1) // sw)
    return (sh, sw), (dh, dw), ph, pw, oh, ow, hph, wph


def _takes_shifted(spatial, kernel, attrs, cin, kpack, dot):
    """Whether conv.c's ig_shift_pays takes the shifted planes for a convolution (as
    docs/engine.md describes it): more than one column tap (at most 8), dropped columns on
    the standard planes, a shifted copy within 1 MiB, and tiles that cost less (in dot column
    pairs, a full tile 6) than the standard planes' best tiling (16-q or row-aligned). Any
    rank: the outer axes' rows flattened as ig_run does (oh: the rows the outputs span, hph:
    the rows of a plane, nfh: the used tuples of outer phases)."""
    kw = kernel[-1]
    axes = _mirror_axes(spatial, kernel, attrs)
    ow, wph = axes[-1][3], axes[-1][4]
    oh, hph, nfh = 1, 1, 1
    for (s, d, _, o, e), k in reversed(list(zip(axes[:-1], kernel))):
        oh += (o - 1) * hph
        hph *= e
        nfh *= len({t * d % s for t in range(k)})
    if not 2 <= kw <= 8 or wph <= ow or oh < 2:
        return False
    if 4 * -(-cin // kpack) * nfh * kw * (hph * ow + 48) > 1 << 20:
        return False

    def cost(nt, wl):   # nt tiles, the last wl columns wide (a dot tile up to 8)
        return 6 * (nt - 1) + ((wl + 1) // 2 if dot and wl <= 8 else 6)

    def cost16(q):
        nt = -(-q // 16)
        return cost(nt, q - (nt - 1) * 16)

    std = cost16((oh - 1) * wph + ow)
    if ow <= 16 and dot:   # row-aligned tiles of r rows
        r = (16 - ow) // wph + 1
        ntr = -(-oh // r)
        std = min(std, cost(ntr, (oh - (ntr - 1) * r - 1) * wph + ow))
    return cost16(oh * ow) < std


def _implicit_combo_runs(rng, spatial, kernel, attrs, cin, seven_bit, counts):
    """For each of the 8 type combinations (output channels 3-9 and 13): implicit-path
    operands of batch 2 (_implicit_operands, weights at the bound), QLinearConv and ConvInteger
    checked against the oracle; yields (w, wz, took), took the change of the diagnostic
    ``counts()`` over the two calls (None off the native engine)."""
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = (3, 4, 5, 6, 7, 8, 9, 13)[r]
        x, w, wz = _implicit_operands(rng, xdt, wdt, (2, cin, *spatial), (m, cin, *kernel), seven_bit,
                                      at_bound=True)
        before = counts() if counts else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        yield w, wz, (tuple(a - b for a, b in zip(counts(), before)) if counts else None)


@pytest.mark.parametrize("case", range(len(_SHIFT_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
def test_shifted_planes(case, seven_bit, engine_level):
    """The implicit GEMM on shifted planes (one plane per column tap and row phase, rows OW
    wide: no dropped columns) against the oracle: strides 1-3, dilation, asymmetric pads,
    channel blocks padded, output channels around the kernels' row tiles (4 at 7 bits, 6
    exact) and their tails, all 8 type combinations, differing per-channel zero points,
    full-range int32 biases (wrap), full-range and 7-bit weights, batch 2 (the copy is per
    image), 2-D and 3-D; and that the implicit path ran on the planes the rule picks (avx2 and
    scalar)."""
    from qlinear import _native
    spatial, kernel, attrs, cin, shifted = _SHIFT_CASES[case]
    rng = np.random.default_rng([case, seven_bit, 50])
    native = engine_level != "numpy" and _native.native() is not None
    level = _native._C.get_isa() if native else None
    counts = _native._C.conv_path_counts if native else None
    for w, wz, took in _implicit_combo_runs(rng, spatial, kernel, attrs, cin, seven_bit, counts):
        if level in ("avx2", "scalar"):
            fast = seven_bit and level == "avx2"
            assert (_conv_kind(w, wz, **attrs) == 2) == fast   # the 7-bit kernel where it runs
            want = _takes_shifted(spatial, kernel, attrs, cin, 4 if fast else 2, level == "avx2")
            if level == "avx2":
                assert want == shifted   # the rule's mirror agrees with the case's note
            took = (took[0], took[1], took[5])   # implicit, im2col, on shifted planes
            assert took == (2, 0, 2 if want else 0), (took, level)


@pytest.mark.parametrize("threads", [1, 2])
def test_shifted_planes_threads_and_copy_bound(threads, engine_level):
    """Shifted planes above the threading threshold (2^21 MACs: the copy's channel blocks and
    the GEMM tasks split between threads) on 1 and 2 threads, 7-bit weights at the bound
    (|w - w_zero_point| = 64: the fast kernel) and one past it (65: the exact kernel); and the
    copy bound: 1024 channels of a 14x14 plane are 1.6 MiB of shifted planes in the exact form
    (2 channels per 4 bytes: the standard planes run) and 0.8 MiB in the 7-bit one (shifted)."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    level = _native._C.get_isa() if native else None
    rng = np.random.default_rng([threads, 51])
    pads = dict(pads=[1, 1, 1, 1])
    cases = (((14, 14), 128, 17, 64, (U8, I8, U8)),    # 7-bit at the bound: fast
             ((7, 7), 256, 11, 65, (I8, U8, I8)),      # one past: exact
             ((14, 14), 1024, 5, 64, (U8, U8, U8)))    # exact copy above 1 MiB, 7-bit below
    with num_threads(threads):
        for spatial, cin, m, delta, (xdt, wdt, ydt) in cases:
            info = np.iinfo(wdt)
            wz = rng.integers(info.min + 65, info.max - 65, m, endpoint=True).astype(wdt)
            d = rng.integers(-64, 64, (m, cin, 3, 3), endpoint=True)
            d.flat[::3] = delta * rng.choice([-1, 1], d.flat[::3].shape)
            w = (wz.astype(np.int32).reshape(m, 1, 1, 1) + d).astype(wdt)
            x = rand_extreme(rng, xdt, (1, cin, *spatial))
            before = _native._C.conv_path_counts() if native else None
            check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), pads)
            check_convint([x, w, rand_int(rng, xdt, ()), wz], pads)
            if level in ("avx2", "scalar"):
                fast = level == "avx2" and delta == 64
                assert (_conv_kind(w, wz, **pads) == 2) == fast
                shifted = _takes_shifted(spatial, (3, 3), pads, cin, 4 if fast else 2, level == "avx2")
                if level == "avx2":
                    # the copy bound: the exact form's 1024 channels of 14x14 stay on standard planes
                    assert shifted == (not (cin == 1024 and not fast))
                took = tuple(a - b for a, b in zip(_native._C.conv_path_counts(), before))
                took = (took[0], took[1], took[5])   # implicit, im2col, on shifted planes
                assert took == (2, 0, 2 if shifted else 0), (spatial, took, level)


# (x spatial, kernel, attributes, input channels): the stride-2 copy (conv.c's ig_split_s2, both
# column phases at once, and the shifted tap rows copied from its phase rows); planes as picked
# at 7 bits on avx2 (the exact form on scalar: see _takes_shifted)
_S2X4_CASES = [
    ((14, 14), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 8),    # ResNet-50 l4-like: OW 7
    ((31, 35), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 12),   # OW 18 of 32 positions
    ((9, 63), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 4),     # OW 32 = Wr
    ((9, 31), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 4),     # standard planes (both phases)
    ((23, 29), (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), 4),    # a stem: taps up to 3 positions on
    ((15, 15), (3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1]), 6),    # odd sizes, 6 -> 8 channels
    ((10, 16), (2, 2), dict(strides=[2, 2]), 8),                       # no dropped column: standard planes
    ((14, 14), (3, 3), dict(strides=[2, 2], pads=[2, 2, 2, 2], dilations=[1, 2]), 8),  # column dilation 2: phase 0 only
    ((14, 14), (3, 3), dict(strides=[2, 2], pads=[3, 3, 3, 3], dilations=[1, 3]), 8),  # dilation 3: taps 0, 3, 6
    ((30, 31), (3, 7), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 4),    # last row's phases in scratch (7-bit)
    ((9, 31), (3, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3], dilations=[1, 5]), 4),  # ... both forms
    ((12, 12), (3, 3), dict(pads=[1, 1, 1, 1]), 8),                    # stride 1: none
]


def _stride2_copy_rows(spatial, kernel, attrs, cin, kpack, dot):
    """conv_copy_counts' growth for one image of a convolution on the implicit path (conv.c's
    copy tasks, as docs/engine.md describes them), kpack channels a block: per channel block
    and copied input row, column stride 2 splits both column phases once. On shifted planes
    each phase row holds s2len = OW + (kw - 1) * dw // 2 positions rounded up to the split's
    step (8 exact, 16 at 7 bits) and is the row of the tap on its first column (tap 0; tap 1
    at dilation 1) where row i's s2len positions end within the plane (i * OW + s2len <= PL,
    the plane's positions: its rows and a spare of 16, to a multiple of 16, and 16 more when
    that is an even number of 64-byte lines), else scratch; every other tap row is copied from
    its phase row (any dilation). On the standard planes, where both column phases are used,
    they are split straight into their planes; else none."""
    h, (kh, kw) = spatial[0], kernel
    (sh, sw), (dh, dw), ph, _, _, ow, hph, _ = _mirror_planes(spatial, kernel, attrs)
    copied = [i for f in sorted({t * dh % sh for t in range(kh)}) for i in range(hph)
              if 0 <= f + sh * i - ph < h]   # plane row of each copied input row
    blocks = -(-cin // kpack)
    if sw != 2:
        return 0, 0
    if _takes_shifted(spatial, kernel, attrs, cin, kpack, dot):
        plane = (hph * ow + 16 + 15) // 16 * 16
        plane += 16 if plane // 16 % 2 == 0 else 0
        step = 8 if kpack == 2 else 16
        s2len = -(-(ow + (kw - 1) * dw // 2) // step) * step
        taps = sum(kw - ((1 + (dw == 1)) if i * ow + s2len <= plane else 0) for i in copied)
        return blocks * len(copied), blocks * taps
    both = len({t * dw % 2 for t in range(kw)}) == 2
    return (blocks * len(copied), 0) if both else (0, 0)


@pytest.mark.parametrize("case", range(len(_S2X4_CASES)))
def test_seven_bit_stride2_copy(case, engine_level):
    """The stride-2 copy (both column phases split once, 4 channels in one AVX2 pass at 7 bits
    or 2 channels paired exact, and each shifted tap row copied from its phase row) against
    the oracle: 3x3 and 7x7 kernels, OW below, at and above a multiple of 16, column
    dilations 2 and 3, asymmetric pads, channels padded to the block, standard and shifted
    planes, batch 2, all 8 type combinations, weights at the 7-bit bound; and that the rows
    went the way the rule says (the 7-bit form on avx2, the exact form on scalar), none for
    stride 1."""
    from qlinear import _native
    spatial, kernel, attrs, cin = _S2X4_CASES[case]
    rng = np.random.default_rng([case, 52])
    native = engine_level != "numpy" and _native.native() is not None
    level = _native._C.get_isa() if native else None
    counts = _native._C.conv_copy_counts if native else None
    for w, wz, took in _implicit_combo_runs(rng, spatial, kernel, attrs, cin, True, counts):
        if level in ("avx2", "scalar"):
            fast = level == "avx2"
            assert (_conv_kind(w, wz, **attrs) == 2) == fast   # the 7-bit kernel where it runs
            split, taps = _stride2_copy_rows(spatial, kernel, attrs, cin, 4 if fast else 2, fast)
            assert took == (4 * split, 4 * taps), (took, split, taps, level)   # 2 calls x 2 images
            if case < len(_S2X4_CASES) - 1:
                assert split > 0


@pytest.mark.parametrize("width", [16, 21, 29, 33, 40])
def test_seven_bit_im2col_fused_epilogue(width, engine_level):
    """The 7-bit kernel on the im2col path (a column stride of 5: beyond the implicit path's
    4) with its epilogue fused (avx2-s8u8 kernel_ep): full 16-column panels and last panels of
    5, 13, 1 and 8 columns (the 8-column one on the narrow tail kernel, then the level's
    epilogue), output channels around the 4-row tile, every type combination, weights at the
    7-bit bound, differing per-channel zero points, full-range int32 biases, 8-bit and int32
    outputs."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    rng = np.random.default_rng([width, 52])
    attrs = dict(strides=[1, 5], pads=[0, 1, 0, 1])   # one output row of `width` pixels
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = (3, 4, 5, 7, 8, 9, 12, 13)[r]
        x = rand_int(rng, xdt, (1, 8, 3, (width - 1) * 5 + 3))
        w, wz = _seven_bit(rng, wdt, (m, 8, 3, 3), m)
        wzc = wz.astype(np.int32).reshape(m, 1, 1, 1)
        d = w.astype(np.int32) - wzc
        d.flat[::3] = 64 * rng.choice([-1, 1], d.flat[::3].shape)   # at the bound
        w = (wzc + d).astype(wdt)
        before = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        if native and _native._C.get_isa() in ("avx2", "scalar"):
            assert _native._C.conv_path_counts()[1] - before[1] == 2   # the im2col path
            assert (_conv_kind(w, wz, **attrs) == 2) == (_native._C.get_isa() == "avx2")


# (x shape, kernel, attributes, output channels): above the threading threshold (2^21 MACs),
# so that on 2 threads the copy's channel blocks and the GEMM's tasks are shared by both
_IMPLICIT_THREADED = [
    ((1, 64, 30, 31), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 40),   # both column phases
    ((1, 66, 25, 27), (3, 3), dict(strides=[2, 2], pads=[0, 1, 1, 0]), 38),   # odd pairs, 7-bit 4-blocks padded
    ((1, 128, 14, 14), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 64),  # ResNet-50 l4-like: rows below 16
    ((1, 48, 40, 38), (3, 3), dict(strides=[3, 3], pads=[1, 1, 1, 1]), 56),   # stride 3
    ((1, 64, 33, 29), (3, 3), dict(strides=[2, 2], pads=[2, 2, 2, 2], dilations=[2, 2]), 40),  # one phase
    ((1, 50, 31, 40), (3, 3), dict(strides=[2, 1], pads=[1, 1, 1, 1], dilations=[1, 2]), 36),  # mixed
    ((1, 64, 3001), (3,), dict(strides=[2], pads=[1, 1]), 40),                # 1-D
    ((1, 704, 9, 9), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 24),    # K blocks (exact form)
    ((1, 32, 6, 14, 30), (3, 3, 3), dict(strides=[1, 2, 1], pads=[1, 1, 1, 1, 0, 2]), 40),  # 3-D
    ((2, 24, 5, 9, 33), (3, 3, 3), dict(strides=[2, 1, 2], pads=[1] * 6), 36),  # 3-D, batch 2
    ((1, 240, 2, 8, 24), (3, 3, 3), dict(pads=[1] * 6), 8),    # 3-D K blocks (3240 exact k-groups; 7-bit 1620)
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(_IMPLICIT_THREADED)))
def test_implicit_gemm_threads_strides(case, threads, engine_level):
    """Strided, dilated and padded convolutions above the threading threshold on the implicit
    path, on 1 and 2 threads (the copy's channel blocks and the GEMM's row x tile tasks split
    between threads: per-thread scratch rows, K-block partial sums), against the oracle: every
    type combination (half per thread count), full-range weights with differing per-channel
    zero points and 7-bit ones (the exact and the 7-bit kernels' forms), x at its extremes,
    full-range int32 bias; and that the implicit path ran where the level has it."""
    from qlinear import _native
    shape, kernel, attrs, m = _IMPLICIT_THREADED[case]
    rng = np.random.default_rng([case, threads, 50])
    native = engine_level != "numpy" and _native.native() is not None
    with num_threads(threads):
        for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS[threads - 1::2]):
            wshape = (m, shape[1], *kernel)
            x, w, wz = _implicit_operands(rng, xdt, wdt, shape, wshape, r % 2 == 1)
            paths = _native._C.conv_path_counts() if native else None
            check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
            if r < 2:
                check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
            if native and _native._C.get_isa() in ("avx2", "scalar"):
                assert _native._C.conv_path_counts()[0] - paths[0] == (2 if r < 2 else 1), (case, r)

# ----------------------------------------------------------------------- merged images

# (x spatial, kernel, attributes, input channels, group, batch, merged tails on avx2, on the
# scalar level): convolutions over several images whose padded copies all fit conv.c's
# IG_BATCH_BYTES (512 KiB), so that the implicit path runs the whole batch as one GEMM over
# (image, tile) pairs; where the last tile has at most 8 columns (avx2: row-aligned tiles, the
# scalar level: tiles of 16) and there is one group, those of 16 // width images share a
# merged tail panel (on avx2 a last partial panel of fewer than 8 columns leaves its images to
# the dot kernel)
_MERGED_CASES = [
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 8, 1, 8, True, False),                    # 7x7: last tile 7 (avx2)
    ((7, 7), (1, 1), {}, 16, 1, 10, True, True),                                         # pointwise 7x7: last 1
    # 14x14 s2: on avx2 shifted planes (3 tiles and 1 column an image: the 3 images' last columns
    # go to the dot kernel, too few for a panel); on scalar standard planes, a panel
    ((14, 14), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 8, 1, 3, False, True),
    ((14, 14), (1, 1), dict(strides=[2, 2]), 12, 1, 2, False, True),                     # pointwise s2: 2 columns
    ((9, 16), (3, 3), dict(dilations=[2, 1], pads=[2, 1, 3, 1]), 8, 2, 3, False, False),  # dilation, pads, groups
    ((7, 7), (3, 3), dict(pads=[0, 1, 2, 1]), 12, 3, 9, False, False),                   # 3 groups (no panels)
    ((6, 37), (1, 1), dict(pads=[1, 0, 2, 0]), 3, 1, 4, False, False),                   # pointwise, padding rows
    ((30,), (3,), dict(pads=[1, 2], strides=[2]), 8, 1, 5, False, False),                # 1-D
    ((2, 3), (3, 3), dict(pads=[1, 1, 1, 1]), 4, 1, 11, True, True),                     # one tile of 8 an image
]


def _merge_delta(before):
    """conv_path_counts' growth since before: (implicit, im2col, merged GEMMs, their images,
    merged tail panels); the shifted-plane count (the sixth) is the shifted-plane tests'."""
    from qlinear import _native
    after = _native._C.conv_path_counts()
    return tuple(a - b for a, b in zip(after[:5], before[:5]))


@pytest.mark.parametrize("case", range(len(_MERGED_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_gemm_merged_images(case, seven_bit, engine_level):
    """The implicit GEMM over a batch at once (every image's copy side by side, one GEMM over
    the (image, tile) pairs, narrow last tiles of several images merged into one panel, each
    image's own output) against the oracle at every level: 2-11 images, 7x7 planes
    (row-aligned tiles), 14x14 stride 2, 1x1 and 3x3, dilation, asymmetric pads, groups, 1-D,
    all 8 type combinations, differing per-channel zero points, full-range and 7-bit weights,
    on 1 and 2 threads; and that on avx2 / scalar each call ran as one merged GEMM of all its
    images, with merged tail panels where the last tile is narrow."""
    from qlinear import _native
    spatial, kernel, attrs, cin, group, n, tails_avx2, tails_scalar = _MERGED_CASES[case]
    rng = np.random.default_rng([case, seven_bit, 50])
    native = engine_level != "numpy" and _native.native() is not None
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = group * (3 + 2 * ((r + case) % 4))   # 3, 5, 7, 9 per group: row tails
        shape = (m, cin // group, *kernel)
        x, w, wz = _implicit_operands(rng, xdt, wdt, (n, cin, *spatial), shape, seven_bit)
        kw = dict(attrs, group=group)
        before = _native._C.conv_path_counts() if native else None
        with num_threads(1 + r % 2):
            check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
            check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        level = _native._C.get_isa() if native else None
        if level in ("avx2", "scalar"):
            implicit, im2col, merged, images, tails = _merge_delta(before)
            assert (implicit, im2col, merged, images) == (2, 0, 2, 2 * n), (implicit, im2col, merged, images)
            assert (tails > 0) == (tails_avx2 if level == "avx2" else tails_scalar), tails


@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_gemm_merged_chunks(seven_bit, engine_level):
    """A batch cut into chunks by the copy budget (conv.c's IG_BATCH_BYTES, 512 KiB): 200
    channels of 20x23, a 3x1 kernel, pads 1 on the rows (one column tap: never shifted planes):
    channel blocks of 2 (exact) or 4 (7-bit, avx2) channels, each a padded 22x23 plane of 480
    positions (30 lines of 16, made 31: blocks an odd number of lines apart), 4 bytes each, plus
    the last block's reach (the taps' 46 and the last tile's 448 + 16 positions past its start,
    14 more), so one image's copy is 198456 bytes exact (198464 with its line: 2 images a chunk)
    or 99256 7-bit (99264: 5 a chunk); the last tile has 12 columns (no dot tail, nothing else
    in the budget). 7 images: chunks of 2, 2, 2, 1 or of 5, 2; against the oracle, every image
    of every chunk, x and w at their extremes."""
    from qlinear import _native
    rng = np.random.default_rng([seven_bit, 51])
    native = engine_level != "numpy" and _native.native() is not None
    n, cin, m = 7, 200, 5
    for xdt, wdt, ydt in ((U8, I8, U8), (I8, U8, I8)):
        x = rand_extreme(rng, xdt, (n, cin, 20, 23))
        shape = (m, cin, 3, 1)
        if seven_bit:
            w, wz = _seven_bit(rng, wdt, shape, m)
        else:
            w, wz = rand_extreme(rng, wdt, shape), rand_int(rng, wdt, (m,))
        kw = dict(pads=[1, 0, 1, 0])
        before = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        level = _native._C.get_isa() if native else None
        if level in ("avx2", "scalar"):
            per_chunk = 5 if seven_bit and level == "avx2" else 2
            chunks = [min(per_chunk, n - n0) for n0 in range(0, n, per_chunk)]
            merged = [k for k in chunks if k > 1]
            assert _merge_delta(before) == (2, 0, 2 * len(merged), 2 * sum(merged), 0)


def test_implicit_gemm_merged_workspace_fallback():
    """Two images whose padded copy (8 channels of 1024 x 1040, exact: 4 blocks of 1064960
    positions of 4 bytes, 17039360 bytes) is above the smallest workspace the native engine is
    given (16 MiB): with the default limit the implicit path runs them an image at a time (no
    chunk fits the budget), with a 1-byte limit the im2col path runs; both exact."""
    from qlinear import _native
    rng = np.random.default_rng(52)
    native = _native.native() is not None
    x = rand_int(rng, U8, (2, 8, 1024, 1040))
    w = rand_extreme(rng, I8, (2, 8, 2, 1))
    wz = rand_int(rng, I8, (2,))
    args = _qconv_args(rng, x, w, wz=wz)
    want = oracle.qlinear_conv(*args)
    limit = qlinear.workspace_limit()
    try:
        for nbytes, took in ((limit, (1, 0, 0, 0, 0)), (1, (0, 1, 0, 0, 0))):
            qlinear.set_workspace_limit(nbytes)
            before = _native._C.conv_path_counts() if native else None
            assert_exact(call_untouched(qlinear.qlinear_conv, *args), want)
            if native and _native._C.get_isa() in ("avx2", "scalar"):
                assert _merge_delta(before) == took
    finally:
        qlinear.set_workspace_limit(limit)


# (x spatial, kernel, attributes, input channels, output channels, batch, threads, images in
# parallel): batches above the threading threshold (2^21 MACs) whose images run side by side,
# each whole on one thread (conv.c's ig_chunk_task: the thread's own copy region, the GEMM over
# the image's tiles), then the merged tail panels the threads' images filled together, and the
# batches that keep the chunk-after-chunk schedule
_PARALLEL_IMAGE_CASES = [
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 23, 8, 2, True),     # 8 last columns: one panel of both threads'
    ((7, 7), (1, 1), {}, 64, 40, 20, 2, True),                         # a full panel, 4 images left (avx2: dot)
    ((14, 14), (3, 3), dict(pads=[1, 1, 1, 1]), 16, 13, 9, 2, True),   # 9 images (>= 4 a thread); panels, 1 left
    ((28, 28), (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), 32, 11, 4, 2, True),   # stride 2
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 704, 5, 2, 2, True),     # exact: K blocks (the threads' C blocks)
    ((60,), (3,), dict(pads=[1, 1]), 32, 24, 16, 2, True),             # 1-D
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 23, 9, 3, True),     # 3 threads: three copy regions
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 64, 30, 3, 2, False),    # 3 images on 2 threads: in turn
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 23, 8, 1, False),    # one thread
]


@pytest.mark.parametrize("case", range(len(_PARALLEL_IMAGE_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
def test_implicit_gemm_parallel_images(case, seven_bit, engine_level):
    """The images of a batch in parallel, one thread an image, against the oracle at every
    level: tail panels filled by several threads' images, a partial panel's images on the dot
    kernel, an odd batch, stride 2, K blocks, 1-D, 3 threads, all 8 type combinations in turn,
    full-range and 7-bit weights with differing per-channel zero points; and (avx2, scalar)
    that the schedule ran where the batch allows it (a multiple of the threads or 4 images a
    thread, above the threading threshold) and not elsewhere."""
    from qlinear import _native
    spatial, kernel, attrs, cin, m, n, threads, taken = _PARALLEL_IMAGE_CASES[case]
    rng = np.random.default_rng([case, seven_bit, 53])
    native = engine_level != "numpy" and _native.native() is not None
    xdt, wdt, ydt = ALL_8BIT_COMBOS[(case + 3 * seven_bit) % len(ALL_8BIT_COMBOS)]
    x, w, wz = _implicit_operands(rng, xdt, wdt, (n, cin, *spatial), (m, cin, *kernel), seven_bit)
    before = _native._C.conv_path_counts() if native else None
    with num_threads(threads):
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
    if native and _native._C.get_isa() in ("avx2", "scalar"):
        took = [a - b for a, b in zip(_native._C.conv_path_counts(), before)]
        assert (took[0], took[1], took[6]) == (2, 0, 2 if taken else 0), took


# ----------------------------------------------------------------------------- narrow tails

# output widths whose last 16-column tile has every width 1..16 (and 7x7 / 14x14 planes' 49,
# 196 flattened): the implicit path's dot kernel (at most 8 real columns, the whole K), its
# 8-column tile kernels (the scalar level, and K blocks) and full tiles
_TAIL_WIDTHS = list(range(1, 41)) + [49, 196]


def _tail_delta(before):
    from qlinear import _native
    after = _native._C.tail_counts()
    return tuple(a - b for a, b in zip(after, before))


@pytest.mark.parametrize("seven_bit", [False, True])
def test_narrow_tails_pointwise(seven_bit, engine_level):
    """1x1 convolutions over planes of 1 x n for n = 1..40, 49, 196 (the last tile's real
    columns: every width 1..16) against the oracle at every level, all 8 type combinations in
    turn, full-range (or 7-bit) weights with differing per-channel zero points, batch 1 and 3;
    and that the narrow kernels ran: at batch 1 on avx2 the dot kernel for a last tile of at
    most 8 columns, on the scalar level its 8-column implicit tile; at batch 3 (one GEMM over
    the three images) merged tail panels instead, of 16 // width images' last tiles."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    rng = np.random.default_rng([seven_bit, 47])
    for n, batch in ((n, batch) for n in _TAIL_WIDTHS for batch in (1, 3)):
        xdt, wdt, ydt = ALL_8BIT_COMBOS[(n + batch) % len(ALL_8BIT_COMBOS)]
        m = 5 + n % 4                              # 5..8 rows: micro-tile row tails
        cin = 8
        x = rand_int(rng, xdt, (batch, cin, 1, n))
        x.flat[::5] = np.iinfo(xdt).min
        x.flat[2::7] = np.iinfo(xdt).max
        shape = (m, cin, 1, 1)
        if seven_bit:
            w, wz = _seven_bit(rng, wdt, shape, m)
        else:
            w, wz = rand_extreme(rng, wdt, shape), rand_int(rng, wdt, (m,))
        before = _native._C.tail_counts() if native else None
        paths = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), {})
        check_convint([x, w, rand_int(rng, xdt, ()), wz], {})
        if not native:
            continue
        level = _native._C.get_isa()
        if level not in ("avx2", "scalar"):
            continue
        after = _native._C.conv_path_counts()
        assert after[0] - paths[0] == 2   # the implicit path
        last = n - (n - 1) // 16 * 16
        implicit_t8, _, dot = _tail_delta(before)
        if batch > 1:
            # panels of 16 // last images; on avx2 a partial one of fewer than 8 columns: dot tiles
            tpm = 16 // last
            rem = batch % tpm if last <= 8 else 0
            left = rem if level == "avx2" and rem * last < 8 else 0
            panels = (batch // tpm + (rem > 0 and not left)) if last <= 8 else 0
            assert (after[4] > paths[4]) == (panels > 0) and (dot > 0) == (left > 0), (n, after[4] - paths[4], dot)
        elif level == "avx2":
            # one dot tile per image and call (per row block: the tile is in every task)
            assert (dot > 0) == (last <= 8) and implicit_t8 == 0, (n, implicit_t8, dot)
        elif not seven_bit:
            assert (implicit_t8 > 0) == (last <= 8) and dot == 0, (n, implicit_t8, dot)


@pytest.mark.parametrize("spatial,pads,strides", [((2, 3), [1, 1, 1, 1], [1, 1]), ((2, 11), [1, 1, 1, 1], [1, 1]),
                                                  ((3, 6), [1, 1, 1, 1], [1, 1]), ((7, 7), [1, 1, 1, 1], [1, 1]),
                                                  ((7, 7), [0, 0, 0, 0], [1, 1]), ((14, 14), [0, 0, 0, 0], [1, 1]),
                                                  ((40, 3), [1, 1, 1, 1], [1, 1]), ((40, 11), [1, 1, 1, 1], [1, 5])])
def test_narrow_tails_planes(spatial, pads, strides, engine_level):
    """2-D planes whose last tile is narrow: 3x3 with pads of 1 (shifted planes: 6, 22 and 18
    columns, a 7x7 plane 3 tiles and 1 column, a plane 3 wide 7 tiles and 8 columns: dot
    tiles), 7x7 / 14x14 pointwise planes, and a plane 3 wide by a column stride of 5 (the
    im2col path: 120 pixels, a last packed panel of 8 columns), every type combination, 7-bit
    and full-range weights."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    rng = np.random.default_rng([*spatial, *pads, *strides, 48])
    kernel = (3, 3) if any(pads) else (1, 1)
    attrs = dict(pads=pads, strides=strides)
    before = _native._C.tail_counts() if native else None
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = 4 + r
        x = rand_int(rng, xdt, (1, 6, *spatial))
        shape = (m, 6, *kernel)
        if r % 2:
            w, wz = _seven_bit(rng, wdt, shape, m)
        else:
            w, wz = rand_extreme(rng, wdt, shape), rand_int(rng, wdt, (m,))
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
    if native and _native._C.get_isa() == "avx2":
        _, packed, dot = _tail_delta(before)
        if strides[1] == 5:
            assert packed > 0 and dot == 0
        else:
            assert dot > 0 and packed == 0


@pytest.mark.parametrize("seven_bit", [False, True])
def test_narrow_tails_k_blocks(seven_bit, engine_level):
    """Reductions the implicit path cuts into K blocks (above 3072 k-groups: 704 channels 3x3,
    3168 exact k-groups; 1376, 3096 7-bit ones; a pointwise copy that long would exceed L2 and
    take the im2col path) on 1 x 8, 1 x 13, 1 x 5 and 7 x 7 planes with pads of 1 (a last tile
    of 8, 13, 5 and 7 columns): on avx2 the dot kernel over the whole K for the narrow ones,
    on the scalar level the 8-column tile kernel adding partial sums (its columns 8..15 written
    as 0); x and w at their extremes so that the sums pass 2^24."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    rng = np.random.default_rng([seven_bit, 49])
    pads = dict(pads=[1, 1, 1, 1])
    cases = (((1, 8), (U8, I8, U8)), ((1, 13), (I8, U8, I8)), ((1, 5), (I8, I8, U8)), ((7, 7), (U8, U8, I8)))
    for spatial, (xdt, wdt, ydt) in cases:
        kernel, attrs = (3, 3), pads
        cin = 1376 if seven_bit else 704
        x = rand_extreme(rng, xdt, (1, cin, *spatial))
        shape = (3, cin, *kernel)
        if seven_bit:
            w, wz = _seven_bit(rng, wdt, shape, 3)
        else:
            w, wz = rand_extreme(rng, wdt, shape), rand_int(rng, wdt, (3,))
        before = _native._C.tail_counts() if native else None
        paths = _native._C.conv_path_counts() if native else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        if not native:
            continue
        if _native._C.get_isa() in ("avx2", "scalar"):
            assert _native._C.conv_path_counts()[0] - paths[0] == 2   # the implicit path
        implicit_t8, _, dot = _tail_delta(before)
        narrow = spatial != (1, 13)
        if _native._C.get_isa() == "avx2":
            assert implicit_t8 == 0 and (dot > 0) == narrow, (spatial, implicit_t8, dot)
        elif _native._C.get_isa() == "scalar" and not seven_bit:
            # no dot kernel there, so no row-aligned tiles: 7x7's last tile has 13 columns
            assert dot == 0 and (implicit_t8 > 0) == (narrow and spatial != (7, 7)), (spatial, implicit_t8, dot)


# (x spatial, M, C, group, strides): 1x1 convolutions around amx's exact_1x1 thresholds (96
# output channels, 32 input channels per group, not a multiple of 64), strided ones, a grouped one
_EXACT_1X1_CASES = [((7, 9), 96, 32, 1, None), ((7, 9), 95, 40, 1, None), ((5, 11), 100, 31, 1, None),
                    ((13, 6), 130, 64, 1, [2, 2]), ((3, 70), 97, 33, 1, None), ((6, 6), 192, 64, 2, None),
                    ((6, 5), 96, 96, 1, None), ((4, 7), 128, 128, 1, None)]


@pytest.mark.parametrize("case", range(len(_EXACT_1X1_CASES)))
def test_wide_pointwise_conv_path(case, engine_level):
    """1x1 convolutions at every level against the oracle, with weights inside the VNNI fast
    kernel's bound (full-range int8 centered weights -128 and 127), all 8 type combinations:
    on amx those of at least 96 output and 32 input channels (per group), the latter not a
    multiple of 64, run on the exact GEMM (AMX tiles, im2col) and the others on the fast
    implicit kernel (amx-s8u8 where 64 divides the channels); every level's path is asserted
    (conv_path_counts, the prepared form's kind)."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    spatial, m, cin, group, strides = _EXACT_1X1_CASES[case]
    attrs = dict(group=group, **({"strides": strides} if strides else {}))
    rng = np.random.default_rng([case, 73])
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        x = rand_int(rng, xdt, (2, cin, *spatial))
        x.flat[::5] = np.iinfo(xdt).max
        w, wz = _int8_weights_with_edges(rng, wdt, (m, cin // group, 1, 1), 20 if r % 2 else 0)
        before = _native._C.conv_path_counts() if level else None
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), attrs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], attrs)
        if level in ("amx", "avx512vnni", "avxvnni"):
            exact = _exact_first(level, (1, 1), w.shape)
            assert exact == (level == "amx" and m >= 96 and cin // group >= 32 and cin // group % 64 != 0), (level, case)
            assert _conv_kind(w, wz, **attrs) == (0 if exact else 2)
            took = _native._C.conv_path_counts()
            assert (took[0] - before[0], took[1] - before[1]) == ((0, 2) if exact else (2, 0)), (level, case)


# Geometries of test_amx_conv_tiles: (x spatial, kernel, attributes, input channels, group,
# batch). Channels per group multiples of 64 (amx-s8u8's chunk), then the fallback: 2-D with
# several tiles (pairs and a lone last tile), stride 2, dilations, 1-D, 3-D, pointwise, two
# groups of 64, a batch whose images run in parallel (4 on 2 threads) and one with merged tail
# panels (5 images of a 7x7 plane), stride 5 (beyond the implicit path: the im2col panels on the
# same kernel), a 9x9 kernel (81 taps: the chunked weights written from the source row), a
# reduction of 3168 k-groups (K blocks of whole chunks, no fused epilogue) and 96 channels (not
# a multiple of 64: avx512vnni-s8u8 packs and runs it)
_AMX_CONV_CASES = [
    ((9, 21), (3, 3), dict(pads=[1, 1, 1, 1]), 64, 1, 2),
    ((14, 15), (3, 3), dict(strides=[2, 2], pads=[1, 0, 0, 1]), 128, 1, 1),
    ((11, 40), (3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3]), 64, 1, 1),
    ((37,), (3,), dict(pads=[1, 2]), 64, 1, 2),
    ((5, 7, 9), (3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), 64, 1, 1),
    ((13, 17), (1, 1), {}, 128, 1, 2),
    ((9, 9), (3, 3), dict(pads=[1, 1, 1, 1]), 128, 2, 1),
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 192, 1, 4),
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 64, 1, 5),
    ((11, 12), (3, 3), dict(strides=[5, 5], pads=[2, 2, 2, 2]), 64, 1, 1),
    ((5, 6), (9, 9), dict(pads=[4, 4, 4, 4]), 64, 1, 1),
    ((4, 5), (3, 3), dict(pads=[1, 1, 1, 1]), 1408, 1, 1),
    ((9, 21), (3, 3), dict(pads=[1, 1, 1, 1]), 96, 1, 1),
]


@pytest.mark.parametrize("case", range(len(_AMX_CONV_CASES)))
def test_amx_conv_tiles(case, engine_level):
    """amx's convolution kernel (amx-s8u8: tdpbsud on tiles of 32 rows x 16 or, as tile pairs, 32
    columns; weights in 64-channel chunks per tap) against the oracle: all 8 type combinations,
    centered weights at both ends -128 and 127 with differing per-channel zero points, full-range
    activations, output channels around the 16- and 32-row tiles (1 to 65), the geometries above;
    that the kernel ran where its chunk divides the channels (conv_kernel_name, conv_tile_counts:
    chunked calls, tile pairs where a task has two full tiles of an image) and the implicit or
    im2col path each geometry takes, and that other channel counts run avx512vnni-s8u8."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level != "amx":
        pytest.skip(f"amx's own kernel (this run: {engine_level}); runs natively on AMX-INT8 CPUs and "
                    "under scripts/emulated_isa.sh")
    spatial, kernel, attrs, cin, group, n = _AMX_CONV_CASES[case]
    cg, taps = cin // group, math.prod(kernel)
    name = _native._C.conv_kernel_name(level, 2, cg * taps, taps)
    assert name == ("amx-s8u8" if cg % 64 == 0 else "avx512vnni-s8u8")
    rng = np.random.default_rng([case, 91])
    kw = dict(attrs, group=group)
    combos = ALL_8BIT_COMBOS if cg * taps < 4096 else ALL_8BIT_COMBOS[:2]
    for r, (xdt, wdt, ydt) in enumerate(combos):
        m = group * [1, 17, 32, 33, 16, 47, 65, 31][(r + case) % 8]
        shape = (m, cg, *kernel)
        x = rand_int(rng, xdt, (n, cin, *spatial))
        x.flat[::7] = np.iinfo(xdt).min
        x.flat[3::11] = np.iinfo(xdt).max
        w, wz = _int8_weights_with_edges(rng, wdt, shape, 20 if r % 2 else 0)
        assert _conv_kind(w, wz, **kw) == 2
        before, tiles0 = _native._C.conv_path_counts(), _native._C.conv_tile_counts()
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        after, tiles1 = _native._C.conv_path_counts(), _native._C.conv_tile_counts()
        implicit = _takes_implicit(spatial, kernel, attrs, cin, group, True)
        assert implicit == (case not in (9, 10)), "stride 5 and the 9x9 kernel's tiles: im2col"
        assert (after[0] - before[0], after[1] - before[1]) == ((2, 0) if implicit else (0, 2)), case
        assert tiles1[0] - tiles0[0] == (2 if name == "amx-s8u8" else 0), case
        if name == "amx-s8u8" and implicit and cg * taps < 4096:
            assert tiles1[1] > tiles0[1], "tile pairs"
        if cg * taps >= 4096:   # K blocks: the tiles' sums added, the level's epilogue after
            assert tiles1[1] == tiles0[1]


@pytest.mark.parametrize("seed", range(16))
def test_amx_conv_tiles_random_geometry(seed, engine_level):
    """amx-s8u8 on seeded random 1-3-D geometry (kernels 1-3, strides 1-3, dilations 1-2, pads,
    every auto_pad), 64 or 128 channels per group, 1 or 2 groups, batch 1-3, output channels 1-40
    per group, every type combination in turn, full-range centered weights and activations, on
    1, 2 and 3 threads in turn, against the oracle; that the kernel ran (conv_tile_counts)."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level != "amx":
        pytest.skip(f"amx's own kernel (this run: {engine_level}); runs natively on AMX-INT8 CPUs and "
                    "under scripts/emulated_isa.sh")
    rng = np.random.default_rng([seed, 92])
    nsp = 1 + seed % 3
    auto_pad = AUTO_PADS[seed % 4]
    size, kernel, strides, dilations, pads = random_geometry(rng, nsp, auto_pad, max_size=12 if nsp < 3 else 6)
    group = 1 + seed % 2
    cg = 64 * int(rng.integers(1, 2, endpoint=True))
    m = group * int(rng.integers(1, 40, endpoint=True))
    xdt, wdt, ydt = ALL_8BIT_COMBOS[seed % len(ALL_8BIT_COMBOS)]
    x = rand_int(rng, xdt, (int(rng.integers(1, 3, endpoint=True)), cg * group, *size))
    x.flat[::7] = np.iinfo(xdt).min
    x.flat[3::11] = np.iinfo(xdt).max
    w, wz = _int8_weights_with_edges(rng, wdt, (m, cg, *kernel), 20 if seed % 2 else 0)
    kwargs = dict(auto_pad=auto_pad, kernel_shape=kernel, strides=strides, dilations=dilations, group=group)
    if pads is not None:
        kwargs["pads"] = pads
    before = _native._C.conv_tile_counts()
    # 1, 2 and 3 threads in turn: the tasks' tile blocks of whole pairs (ig_tile_blocks) differ
    with num_threads(1 + seed % 3):
        check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kwargs)
        check_convint([x, w, rand_int(rng, xdt, ()), wz], kwargs)
    assert _native._C.conv_tile_counts()[0] - before[0] == 2


# (spatial, kernel, attrs, channels per group, group, batch): planes of at least two full
# 16-column tiles, so that the implicit path's tasks pair them (ikernel2_ep)
_VNNI_PAIR_CASES = [
    ((9, 21), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 1, 2),
    ((14, 14), (3, 3), dict(pads=[1, 1, 1, 1]), 48, 1, 1),
    ((13, 37), (3, 3), dict(pads=[0, 1, 0, 1]), 16, 1, 1),
    ((11, 40), (3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3]), 8, 2, 1),
    ((67,), (3,), dict(pads=[1, 2]), 96, 1, 3),
    ((4, 8, 9), (3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), 20, 1, 1),
    ((12, 12), (1, 1), {}, 36, 1, 2),
    ((7, 7), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 1, 4),
]


@pytest.mark.parametrize("case", range(len(_VNNI_PAIR_CASES)))
def test_vnni_conv_tile_pairs(case, engine_level):
    """avx512vnni-s8u8's tile pairs (ikernel2_ep: two adjacent 16-column tiles as 8 rows x 32
    columns per pass, one weight broadcast for both tiles' vpdpbusd) against the oracle: output
    channels 1-40 per group, so that row tiles of 16 and 8 rows take the pair body and others
    (5, 12, ...) its single-tile fallback; all 8 type combinations, centered weights at both
    ends -128 and 127 with differing per-channel zero points, full-range activations, 1, 2 and 3
    threads; and that tasks ran pairs (conv_tile_counts). On amx these channel counts run the
    same kernel (amx-s8u8's fallback: channels per group not a multiple of 64)."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level not in ("avx512vnni", "amx"):
        pytest.skip(f"avx512vnni-s8u8's tile pairs (this run: {engine_level}); run on AVX-512 VNNI "
                    "CPUs and under scripts/emulated_isa.sh")
    spatial, kernel, attrs, cg, group, n = _VNNI_PAIR_CASES[case]
    taps = math.prod(kernel)
    assert _native._C.conv_kernel_name(level, 2, cg * taps, taps) == "avx512vnni-s8u8"
    rng = np.random.default_rng([case, 93])
    kw = dict(attrs, group=group)
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = group * [16, 8, 5, 33, 12, 40, 1, 24][(r + case) % 8]
        x = rand_int(rng, xdt, (n, cg * group, *spatial))
        x.flat[::7] = np.iinfo(xdt).min
        x.flat[3::11] = np.iinfo(xdt).max
        w, wz = _int8_weights_with_edges(rng, wdt, (m, cg, *kernel), 20 if r % 2 else 0)
        assert _conv_kind(w, wz, **kw) == 2
        before = _native._C.conv_tile_counts()
        with num_threads(1 + r % 3):
            check_qconv(_qconv_args(rng, x, w, wz=wz, ydt=ydt), kw)
            check_convint([x, w, rand_int(rng, xdt, ()), wz], kw)
        assert _native._C.conv_tile_counts()[1] > before[1], ("tile pairs", case, r)


# (spatial, kernel, attrs, channels, batch): planes whose tile pairs are 32 consecutive output
# pixels of each row (1x1 kernels, and 3x3 on shifted planes), the tile pairs' packed epilogue
_VNNI_PAIR_WHOLE_CASES = [
    ((12, 12), (1, 1), {}, 36, 1),
    ((12, 12), (1, 1), {}, 64, 2),
    ((20, 20), (1, 1), {}, 16, 1),
    ((14, 14), (3, 3), dict(pads=[1, 1, 1, 1]), 32, 1),
    ((16, 16), (1, 1), dict(strides=[2, 2]), 24, 3),
]


@pytest.mark.parametrize("case", range(len(_VNNI_PAIR_WHOLE_CASES)))
def test_vnni_conv_tile_pair_epilogue(case, engine_level):
    """avx512vnni-s8u8's tile pairs' epilogue for two whole tiles of consecutive pixels (the
    bias in the accumulators' start, the requantized bytes of 4 tile rows packed and permuted
    into two 32-byte stores) against the oracle, with outputs spread over the output type (a
    small bias and an output scale that clamps only the tails: test_vnni_conv_tile_pairs' full-
    range bias clamps most rows to one value, which would hide bytes in the wrong column or row),
    16, 8, 24 and 40 output channels, every type combination, 1-3 threads."""
    from qlinear import _native
    level = _native._C.get_isa() if engine_level not in (None, "numpy") and _native.native() else None
    if level not in ("avx512vnni", "amx"):
        pytest.skip(f"avx512vnni-s8u8's tile pairs (this run: {engine_level}); run on AVX-512 VNNI "
                    "CPUs and under scripts/emulated_isa.sh")
    spatial, kernel, attrs, cg, n = _VNNI_PAIR_WHOLE_CASES[case]
    taps = math.prod(kernel)
    if level == "amx" and _native._C.conv_kernel_name(level, 2, cg * taps, taps) != "avx512vnni-s8u8":
        pytest.skip(f"the amx level runs case {case} on its tiles, not avx512vnni-s8u8's tile pairs")
    assert _native._C.conv_kernel_name(level, 2, cg * taps, taps) == "avx512vnni-s8u8"
    rng = np.random.default_rng([case, 94])
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        m = [16, 8, 24, 40][(r + case) % 4]
        x = rand_int(rng, xdt, (n, cg, *spatial))
        w, wz = _int8_weights_with_edges(rng, wdt, (m, cg, *kernel), 20 if r % 2 else 0)
        args = _qconv_args(rng, x, w, wz=wz, ydt=ydt, bias=False)
        # w scales within 1.5x of each other, the y scale about 2 standard deviations of the
        # accumulators (|x - zx| and |w - zw| about 74 each) over the output's half-range
        args[4] = rand_scale(rng, (m,), 0.02, 0.03)
        args[6] = np.float32(float(args[1]) * 0.03 * 74.0 * 74.0 * 2 * np.sqrt(cg * taps) / 128)
        args.append(rand_int(rng, I32, (m,), -(1 << 14), 1 << 14))
        before = _native._C.conv_tile_counts()
        with num_threads(1 + r % 3):
            got = check_qconv(args, attrs)
        assert _native._C.conv_tile_counts()[1] > before[1], ("tile pairs", case, r)
        # the outputs vary along each row: a misplaced byte shows
        assert np.mean([np.unique(row).size for row in got.reshape(n * m, -1)]) > 20, (case, r)


# ----------------------------------------------------------------------------- regressions
# found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)


def _conv_case(seed=0):
    rng = np.random.default_rng(seed)
    x = rand_int(rng, U8, (1, 4, 6, 6))
    w = rand_int(rng, I8, (3, 4, 3, 3))
    return rng, x, w


def test_prepared_qlinear_conv_zero_points_are_not_views():
    """regression: x_zero_point / y_zero_point memoized by value must not follow the caller's array."""
    rng, x, w = _conv_case(1)
    xs, ws, ys = np.float32(0.02), rand_scale(rng, (3,)), np.float32(0.3)
    wzp = np.zeros(3, I8)
    prep = qlinear.prepare_qlinear_conv(w, ws, wzp, pads=[1, 1, 1, 1])
    xzp = np.array(100, U8)
    yzp = np.array(10, U8)
    first = prep.run(x, xs, xzp, ys, yzp)
    assert_exact(first, oracle.qlinear_conv(x, xs, U8(100), w, ws, wzp, ys, U8(10), pads=[1, 1, 1, 1]))
    xzp[...] = 3  # the caller reuses its buffers
    yzp[...] = 200
    again = prep.run(x, xs, np.array(100, U8), ys, np.array(10, U8))  # fresh arrays, old values
    assert_exact(again, first)
    new = prep.run(x, xs, xzp, ys, yzp)
    assert_exact(new, oracle.qlinear_conv(x, xs, U8(3), w, ws, wzp, ys, U8(200), pads=[1, 1, 1, 1]))


def test_prepared_qlinear_conv_owns_weights_scales_and_bias():
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    rng, x, w = _conv_case(2)
    ws = rand_scale(rng, (3,))
    wzp = np.array([0, 5, -7], I8)
    B = rng.integers(-5000, 5000, 3).astype(np.int32)
    args = (np.float32(0.02), U8(128), np.float32(0.2), U8(120))
    want = oracle.qlinear_conv(x, args[0], args[1], w.copy(), ws.copy(), wzp.copy(), args[2], args[3], B.copy())
    prep = qlinear.prepare_qlinear_conv(w, ws, wzp, B)
    B[...] = -B  # changed in place after prepare: the prepared operator keeps the old values
    w[...] = 0
    ws[...] = 1.0
    wzp[...] = 1
    assert_exact(prep.run(x, *args), want)


def test_prepared_conv_integer_zero_points_are_not_views():
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    rng, x, w = _conv_case(3)
    wzp = np.array([1, -2, 3], I8)
    prep = qlinear.prepare_conv_integer(w, wzp, pads=[1, 0, 1, 0])
    want = oracle.conv_integer(x, w, U8(77), wzp.copy(), pads=[1, 0, 1, 0])
    xzp = np.array(77, U8)
    assert_exact(prep.run(x, xzp), want)
    xzp[...] = 250
    wzp[...] = 0
    assert_exact(prep.run(x, np.array(77, U8)), want)
    assert_exact(prep.run(x, xzp), oracle.conv_integer(x, w, U8(250), np.array([1, -2, 3], I8),
                                                       pads=[1, 0, 1, 0]))


@pytest.mark.parametrize("xshape,wshape,want_shape", [
    ((0, 4, 5, 5), (3, 4, 3, 3), (0, 3, 3, 3)),   # empty batch
    ((2, 4, 5, 5), (0, 4, 3, 3), (2, 0, 3, 3)),   # no output channels
    ((2, 0, 5, 5), (3, 0, 3, 3), (2, 3, 3, 3)),   # no input channels: a sum over nothing
])
def test_conv_zero_size(xshape, wshape, want_shape):
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    x = np.zeros(xshape, U8)
    w = np.zeros(wshape, I8)
    try:
        want = oracle.conv_integer(x, w, U8(3), I8(1))
    except Exception:  # the oracle may refuse empty shapes; the result is then zeros
        want = np.zeros(want_shape, np.int32)
    assert want.shape == want_shape
    assert_exact(qlinear.conv_integer(x, w, U8(3), I8(1)), want)
    y = qlinear.qlinear_conv(x, np.float32(0.1), U8(3), w, np.float32(0.1), I8(1), np.float32(0.3),
                             U8(9), None if wshape[0] == 0 else np.arange(wshape[0], dtype=np.int32))
    assert y.shape == want_shape and y.dtype == np.uint8


# ----------------------------------------------------------------------------- fused pointwise copy


# (input channels, plane, output channels): 16-column tiles in pairs and an odd one (28x28: 49),
# a narrow last tile for the dot kernel (14x14: 12 tiles and 4 columns; 7x7: 3 and 1), a plane
# of 1-D and 3-D extents, channels a whole number of 4-channel blocks (fused) and not (2, 6, 10:
# the exact form's 2-channel blocks fuse, the 7-bit form's 4-channel ones do not), enough MACs
# for two threads (several tasks, each copying its own tiles) and too few (one thread), and
# weights of several row blocks (600 rows of 512: not fused, tasks would share tiles)
_FUSED_CASES = [(64, (28, 28), 32), (32, (14, 14), 40), (128, (7, 7), 24), (16, (5, 9), 8),
                (40, (301,), 16), (8, (3, 4, 10), 12), (6, (17, 17), 20), (10, (12, 12), 64),
                (256, (56, 56), 16), (2, (33,), 3), (512, (3, 3), 600)]


def _fused_expected(cin, spatial, m, kpack):
    """Whether implicit_plan.c's ig_fuses takes a batch-1, group-1 pointwise call of cin
    channels on the implicit path: whole channel blocks and one row block of packed weights
    (at most 256 KiB: ig_block_rows)."""
    k = -(-cin // kpack) * kpack
    row = k * (2 if kpack == 2 else 1)   # a packed row's bytes (cases far from the bound)
    return cin % kpack == 0 and m * row <= 256 * 1024


@pytest.mark.parametrize("case", range(len(_FUSED_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_pointwise_copy(case, seven_bit, threads, engine_level):
    """A batch-1 pointwise convolution whose input copy runs inside its GEMM tasks (each task
    copies the columns of its own tiles; the task with the last tile zeroes the planes' spare
    and gathers a narrow last tile): against the oracle, plain and prepared, every type
    combination, x at its extremes; bit-identical with the path turned off; and taken exactly
    where ig_fuses says (counted by conv_fused_copy)."""
    from qlinear import _native
    cin, spatial, m = _FUSED_CASES[case]
    rng = np.random.default_rng([case, seven_bit, threads, 48])
    native = engine_level not in (None, "numpy") and _native.native() is not None
    with num_threads(threads):
        for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
            x, w, wz = _implicit_operands(rng, xdt, wdt, (1, cin, *spatial), (m, cin, *(1,) * len(spatial)),
                                          seven_bit)
            args = _qconv_args(rng, x, w, wz=wz, ydt=ydt)
            got = check_qconv(args, {})   # plain: fused where its weights' packing allows
            got_i = check_convint([x, w, args[2], wz], {})
            # the prepared forms on another input (the copy's scratch is kept between calls: a
            # column the fused copy failed to write would hold the plain call's bytes)
            x2 = _implicit_operands(rng, xdt, wdt, x.shape, w.shape, seven_bit)[0]
            want = oracle.qlinear_conv(x2, *args[1:])
            want_i = oracle.conv_integer(x2, w, args[2], wz)
            prepared = qlinear.prepare_qlinear_conv(*args[3:6], args[8])
            prepared_i = qlinear.prepare_conv_integer(w, wz)
            before = _native._C.conv_fused_copy() if native else None
            assert_exact(prepared.run(x2, *args[1:3], *args[6:8]), want)
            assert_exact(prepared_i.run(x2, args[2]), want_i)
            if not native:
                continue
            fused = _native._C.conv_fused_copy() - before
            kind = _conv_kind(w, wz)
            implicit = _takes_implicit(spatial, (1,) * len(spatial), {}, cin, 1, kind == 2)
            kpack = 4 if kind == 2 else 2
            expect = 2 if implicit and _fused_expected(cin, spatial, m, kpack) else 0
            if kind == 2 and _native._C.get_isa() == "amx" and cin % 64 == 0:
                expect = fused   # amx-s8u8 takes these on its tiles (its own path)
            assert fused == expect, (fused, expect, implicit, kind)
            try:   # the copy job instead: the same bytes
                _native._C.conv_fused_copy(0)
                before = _native._C.conv_fused_copy()
                assert_exact(prepared.run(x, *args[1:3], *args[6:8]), got)
                assert_exact(prepared_i.run(x, args[2]), got_i)
                assert_exact(qlinear.qlinear_conv(x2, *args[1:]), want)
                assert _native._C.conv_fused_copy() == before
            finally:
                _native._C.conv_fused_copy(1)


# (x spatial, kernel, strides, dilations, pads): every column tap on stride 2's phase 0 (one
# phase plane: a pointwise stride-2 layer's copy, ResNet-50's downsampling layers): rows of 56,
# 64, 7 and 33 (odd), a 3-wide kernel at dilation 2 with end pads (positions past the row: the
# padding), 1-D and 3-D
_S2_PHASE0_CASES = [((9, 56), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
                    ((4, 64), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
                    ((7, 7), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
                    ((5, 33), (1, 1), (1, 2), (1, 1), (0, 0, 0, 0)),
                    ((6, 40), (1, 3), (2, 2), (1, 2), (1, 0, 1, 3)),
                    ((70,), (1,), (2,), (1,), (0, 0)),
                    ((3, 4, 36), (1, 1, 1), (2, 1, 2), (1, 1, 1), (0,) * 6)]


@pytest.mark.parametrize("case", range(len(_S2_PHASE0_CASES)))
@pytest.mark.parametrize("seven_bit", [False, True])
def test_stride2_phase0_copy(case, seven_bit, engine_level):
    """Stride-2 convolutions whose copy builds one column phase (every column tap on phase 0):
    against the oracle at every level, every type combination, x at its
    extremes, whole and partial channel blocks (6 and 8 channels: the 7-bit form's 4-channel
    blocks, the exact form's 2), batch 1 and 2, plain and prepared."""
    spatial, kernel, strides, dilations, pads = _S2_PHASE0_CASES[case]
    rng = np.random.default_rng([case, seven_bit, 49])
    kw = dict(strides=list(strides), dilations=list(dilations), pads=list(pads))
    for r, (xdt, wdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        cin, n = (6, 1) if r % 2 else (8, 2)
        m = 5 + 4 * (r % 3)
        x, w, wz = _implicit_operands(rng, xdt, wdt, (n, cin, *spatial), (m, cin, *kernel), seven_bit)
        args = _qconv_args(rng, x, w, wz=wz, ydt=ydt)
        got = check_qconv(args, kw)
        check_convint([x, w, args[2], wz], kw)
        prepared = qlinear.prepare_qlinear_conv(*args[3:6], args[8], **kw)
        x2 = _implicit_operands(rng, xdt, wdt, x.shape, w.shape, seven_bit)[0]
        assert_exact(prepared.run(x2, *args[1:3], *args[6:8]), oracle.qlinear_conv(x2, *args[1:], **kw))
        assert_exact(prepared.run(x, *args[1:3], *args[6:8]), got)
