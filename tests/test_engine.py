"""The integer engine: the float32 exactness bound at its worst case, and every fast path
against a plain int64 computation.

The reference here is deliberately naive: int64 arrays, one einsum per kernel tap.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import qlinear
from qlinear import _engine

U8, I8, I32 = np.uint8, np.int8, np.int32
F32_EXACT = 1 << 24


# ------------------------------------------------------------------------------------------
# Plain int64 references
# ------------------------------------------------------------------------------------------

def conv_int64(x, w, x_zp=0, w_zp=0, *, pads=None, strides=None, dilations=None, group=1):
    """Σ (x - x_zp)(w - w_zp) over each window, int64, padded positions contributing 0."""
    nsp = x.ndim - 2
    pads = pads or [0] * (2 * nsp)
    strides = strides or [1] * nsp
    dilations = dilations or [1] * nsp
    xc = x.astype(np.int64) - np.int64(x_zp)
    wz = np.asarray(w_zp, dtype=np.int64)
    wc = w.astype(np.int64) - (wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.ndim else wz)
    xp = np.pad(xc, [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    kernel = w.shape[2:]
    out_sp = [(xp.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
              for i in range(nsp)]
    n, m = x.shape[0], w.shape[0]
    cg, mg = w.shape[1], m // group
    y = np.zeros((n, m, *out_sp), dtype=np.int64)
    for tap in itertools.product(*(range(k) for k in kernel)):
        idx = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                    for t, d, s, o in zip(tap, dilations, strides, out_sp))
        for g in range(group):
            xs = xp[(slice(None), slice(g * cg, (g + 1) * cg), *idx)]
            ws = wc[(slice(g * mg, (g + 1) * mg), slice(None), *tap)]
            y[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...", xs, ws)
    return y


def wrap32(v):
    return v.astype(np.int64).astype(I32)  # keeps the low 32 bits


def requantize_ref(acc_int32, x_scale, w_scale, y_scale, y_zp, channel_axis=1):
    """The contract's requantization, one float32 operation at a time."""
    ws = np.asarray(w_scale, np.float32)
    m = (np.float32(x_scale) * ws) / np.float32(y_scale)
    if m.ndim:
        m = m.reshape((-1,) + (1,) * (acc_int32.ndim - channel_axis - 1))
    v = np.rint(acc_int32.astype(np.float32) * m)
    info = np.iinfo(np.asarray(y_zp).dtype)
    return np.clip(v + np.float32(y_zp), info.min, info.max).astype(np.asarray(y_zp).dtype)


def rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape, dtype=dtype)


# ------------------------------------------------------------------------------------------
# The bound, at its worst case
# ------------------------------------------------------------------------------------------

def test_worst_case_bound_is_tight_and_naive_float32_is_wrong():
    # Extremes: a - a_zp = 255 (uint8 255, zero point 0) against b - b_zp = -255 (uint8 0,
    # zero point 255): every product is -65025, the largest magnitude 8-bit operands allow.
    # The proved chunk is 2**24 // 65025 = 258 terms.
    k = 259
    a = np.full((2, k), 255, U8)
    b = np.zeros((k, 3), U8)
    exact = -65025 * k  # -16,841,475: odd and beyond 2**24, so no float32 can hold it
    assert abs(exact) > F32_EXACT and exact % 2

    # A single float32 GEMM over the 259 terms (one longer than the bound) is wrong.
    naive = np.matmul(a.astype(np.float32), b.astype(np.float32) - np.float32(255))
    assert not np.all(naive.astype(np.int64) == exact)

    # The engine's chunk plan for these weights: 258 terms, then 1; 258 is the bound itself.
    centered = b.astype(np.float32) - np.float32(255)
    red = _engine.Reduction(centered.T)
    assert red.chunks(255) == [(0, 258), (258, 259)]
    assert 255 * 255 * 258 <= F32_EXACT < 255 * 255 * 259

    got = qlinear.matmul_integer(a, b, np.uint8(0), np.uint8(255))
    assert got.dtype == I32
    assert np.all(got == exact)


def test_worst_case_long_reduction_matches_int64():
    # K = 5000 at the extremes with random signs: 20 chunks, each at the bound.
    rng = np.random.default_rng(0)
    k = 5000
    a = rng.choice(np.array([0, 255], U8), (4, k))
    b = rng.choice(np.array([0, 255], U8), (k, 5))
    want = wrap32((a.astype(np.int64) - 128) @ (b.astype(np.int64) - 128))
    got = qlinear.matmul_integer(a, b, np.uint8(128), np.uint8(128))
    np.testing.assert_array_equal(got, want)
    # Same length, all products of one sign: the exact sum is far beyond 2**24.
    a = np.full((1, k), 255, U8)
    b = np.zeros((k, 1), U8)
    got = qlinear.matmul_integer(a, b, None, np.uint8(255))
    assert got[0, 0] == -65025 * k


def test_chunk_plan_uses_weight_l1_norms():
    # Weights of magnitude 1 except one output column: chunks are sized by the L1 norm of
    # the heaviest output, never longer than the bound allows.
    rng = np.random.default_rng(1)
    w = rng.choice(np.array([-1, 1], np.float32), (3, 100000))
    w[1, :] *= 127
    red = _engine.Reduction(w)
    plan = red.chunks(255)
    assert plan[0][0] == 0 and plan[-1][1] == w.shape[1]
    for (k0, k1), (k2, _) in zip(plan, plan[1:] + [(w.shape[1], None)]):
        assert k1 == k2
        mass = np.abs(w[:, k0:k1]).sum(axis=1).max()
        assert 255 * mass <= F32_EXACT
        if k1 < w.shape[1]:  # one more term would break the bound
            assert 255 * np.abs(w[:, k0:k1 + 1]).sum(axis=1).max() > F32_EXACT


def test_conv_worst_case_extremes():
    # A 3x3 convolution over 29 channels (K = 261 > 258) with every product at -65025.
    x = np.full((1, 29, 6, 7), 255, U8)
    w = np.zeros((4, 29, 3, 3), U8)
    got = qlinear.conv_integer(x, w, np.uint8(0), np.uint8(255), pads=[1, 1, 1, 1])
    want = conv_int64(x, w, 0, 255, pads=[1, 1, 1, 1])
    assert want.min() == -65025 * 261
    np.testing.assert_array_equal(got, wrap32(want))
    naive = np.float32(-65025) * 261  # one float32 can't even hold the interior value
    assert int(naive) != -65025 * 261


def test_float64_fallback_for_wide_operands():
    # exact_int_gemm with 16-bit-sized operands: chunks would be shorter than MIN_F32_CHUNK.
    rng = np.random.default_rng(2)
    a = rng.integers(-30000, 30001, (5, 300)).astype(np.float32)
    b = rng.integers(-30000, 30001, (300, 4)).astype(np.float32)
    got = _engine.exact_int_gemm(a, b, 30000, 30000)
    want = wrap32(a.astype(np.int64) @ b.astype(np.int64))
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------------------
# Fast paths against the int64 reference
# ------------------------------------------------------------------------------------------

CONV_CASES = {
    # name: (x shape, w shape, attributes)
    "1x1": ((2, 16, 9, 11), (24, 16, 1, 1), {}),
    "1x1 stride 2": ((2, 16, 9, 11), (8, 16, 1, 1), {"strides": [2, 2]}),
    "1x1 padded": ((1, 8, 5, 6), (4, 8, 1, 1), {"pads": [1, 0, 0, 1]}),
    "depthwise": ((2, 12, 10, 9), (12, 1, 3, 3), {"group": 12, "pads": [1, 1, 1, 1]}),
    "depthwise stride 2": ((1, 8, 11, 12), (8, 1, 3, 3),
                           {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "depthwise multiplier 2": ((1, 6, 7, 8), (12, 1, 3, 3), {"group": 6, "pads": [0, 1, 2, 1]}),
    "depthwise dilated 1-D": ((2, 5, 20), (5, 1, 4), {"group": 5, "dilations": [2], "pads": [3, 0]}),
    "grouped": ((2, 6, 8, 8), (8, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "3x3": ((3, 7, 12, 10), (9, 7, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3 stride 2 dilated": ((1, 5, 13, 12), (6, 5, 3, 3),
                             {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 0, 1]}),
    "7x7 stride 2": ((1, 3, 23, 23), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    "1-D": ((2, 9, 30), (5, 9, 3), {"pads": [1, 1]}),
    "3-D": ((1, 4, 5, 6, 7), (3, 4, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    "long K (multi-chunk)": ((1, 300, 4, 4), (3, 300, 3, 3), {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
@pytest.mark.parametrize("types", ["u8s8", "s8u8"])
def test_conv_fast_paths_match_int64(name, types):
    xs, ws, attrs = CONV_CASES[name]
    rng = np.random.default_rng(zlib.crc32(f"{name} {types}".encode()))
    xdt, wdt = (U8, I8) if types == "u8s8" else (I8, U8)
    x, w = rand(rng, xdt, xs), rand(rng, wdt, ws)
    xz = rand(rng, xdt, ())
    wz = rand(rng, wdt, (ws[0],))  # per-channel weight zero points
    got = qlinear.conv_integer(x, w, xz, wz, **attrs)
    want = conv_int64(x, w, xz, wz, **attrs)
    np.testing.assert_array_equal(got, wrap32(want))

    # QLinearConv through the same paths, with a bias: both the float32 path (small bias)
    # and the int32 path (a bias so large the float32 shortcut is not exact).
    m = ws[0]
    w_scale = rng.uniform(0.001, 0.01, m).astype(np.float32)
    y_scale = np.float32(0.02 * 0.005 * 40 * np.sqrt(np.prod(ws[1:])) * 8)
    for bias in (rng.integers(-5000, 5000, m).astype(I32),
                 rng.integers(-2**31, 2**31, m, dtype=np.int64).astype(I32)):
        got = qlinear.qlinear_conv(x, np.float32(0.02), xz, w, w_scale, wz, y_scale, U8(128),
                                   bias, **attrs)
        acc = wrap32(want + bias.reshape((-1,) + (1,) * (len(xs) - 2)))
        np.testing.assert_array_equal(got, requantize_ref(acc, 0.02, w_scale, y_scale, U8(128)))


def test_prepared_conv_reused_across_inputs_and_batches():
    rng = np.random.default_rng(3)
    w = rand(rng, I8, (10, 6, 3, 3))
    p = qlinear.prepare_conv_integer(w, I8(3), pads=[1, 1, 1, 1])
    for n, size in ((1, 9), (5, 4), (2, 17)):
        x = rand(rng, U8, (n, 6, size, size))
        np.testing.assert_array_equal(p.run(x, U8(77)),
                                      wrap32(conv_int64(x, w, 77, 3, pads=[1, 1, 1, 1])))


@pytest.mark.parametrize("limit", [1, 4096, 100_000])
def test_tiling_under_tiny_workspace(limit):
    rng = np.random.default_rng(4)
    cases = [((3, 5, 14, 9), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
             ((4, 8, 6, 6), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
             ((3, 6, 10, 7), (4, 6, 1, 1), {"strides": [2, 1]}),
             ((2, 4, 4, 5, 6), (3, 4, 2, 3, 3), {"pads": [0, 1, 1, 1, 1, 1]})]
    old = qlinear.workspace_limit()
    try:
        qlinear.set_workspace_limit(limit)
        for xs, ws, attrs in cases:
            x, w = rand(rng, U8, xs), rand(rng, I8, ws)
            got = qlinear.conv_integer(x, w, U8(100), I8(-2), **attrs)
            np.testing.assert_array_equal(got, wrap32(conv_int64(x, w, 100, -2, **attrs)))
    finally:
        qlinear.set_workspace_limit(old)
    assert qlinear.workspace_limit() == old


def test_matmul_paths_match_int64():
    rng = np.random.default_rng(5)
    for sa, sb in [((7, 40), (40, 9)), ((3, 5, 40), (40, 6)), ((2, 1, 4, 30), (3, 30, 5)),
                   ((6, 3000), (3000, 4))]:
        a, b = rand(rng, U8, sa), rand(rng, I8, sb)
        want = wrap32(np.matmul(a.astype(np.int64) - 131, b.astype(np.int64) + 5))
        np.testing.assert_array_equal(qlinear.matmul_integer(a, b, U8(131), I8(-5)), want)
        p = qlinear.prepare_qlinear_matmul(b, np.float32(0.01), I8(-5))
        y_scale = np.float32(0.02 * 0.01 * 74 * 74 * np.sqrt(sa[-1]) * 6 / 255)
        got = p.run(a, np.float32(0.02), U8(131), y_scale, U8(128))
        np.testing.assert_array_equal(got, requantize_ref(want, 0.02, 0.01, y_scale, U8(128)))


def test_same_result_with_one_and_two_blas_threads():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(6)
    x, w = rand(rng, U8, (2, 32, 20, 20)), rand(rng, I8, (48, 32, 3, 3))
    results = []
    for threads in (1, 2):
        with threadpoolctl.threadpool_limits(threads):
            results.append(qlinear.conv_integer(x, w, U8(128), None, pads=[1, 1, 1, 1]))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], wrap32(conv_int64(x, w, 128, 0, pads=[1, 1, 1, 1])))


@pytest.mark.parametrize("method", ["taps", "gemm"])
def test_depthwise_methods(monkeypatch, method):
    monkeypatch.setattr(_engine, "_DW_METHOD", method)
    rng = np.random.default_rng(8)
    # Strides > 1 split the padded input into stride phases: odd and even sizes, pads of
    # every parity, dilations that land taps in other phases, 1-D to 3-D.
    for xs, pads, dil, st in (((2, 24, 7, 7), [1, 1, 1, 1], [1, 1], [1, 1]),
                              ((1, 6, 13, 9), [2, 0, 1, 2], [2, 1], [1, 1]),
                              ((1, 5, 11), [1, 1], [1], [1]),
                              ((2, 8, 12, 11), [1, 1, 1, 1], [1, 1], [2, 2]),
                              ((1, 7, 14, 13), [0, 2, 1, 0], [2, 3], [3, 2]),
                              ((1, 4, 17), [2, 1], [2], [3]),
                              ((1, 3, 6, 7, 8), [1, 0, 1, 1, 1, 0], [1, 1, 2], [2, 1, 2])):
        w = rand(rng, I8, (xs[1], 1) + (3,) * (len(xs) - 2))
        x = rand(rng, U8, xs)
        attrs = {"group": xs[1], "pads": pads, "dilations": dil, "strides": st}
        np.testing.assert_array_equal(qlinear.conv_integer(x, w, U8(90), I8(1), **attrs),
                                      wrap32(conv_int64(x, w, 90, 1, **attrs)))


def test_repeated_calls_keep_results_and_padding_apart():
    # Results of repeated calls stay independent, and geometries with the same padded shape
    # but different pads (SAME_UPPER on sizes 5 and 6) do not leak values into each other.
    rng = np.random.default_rng(9)
    w = rand(rng, I8, (4, 3, 3))
    p = qlinear.prepare_qlinear_conv(w, np.float32(0.01), I8(0), None, auto_pad="SAME_UPPER",
                                     strides=[2])
    results = []
    for size in (5, 6, 5, 6):  # both pad to 7, with pads (1, 1) and (0, 1)
        x = rand(rng, U8, (2, 3, size))
        y = p.run(x, np.float32(0.02), U8(128), np.float32(0.05), U8(128))
        total = 4 + 3 - size  # SAME_UPPER: (out - 1) * stride + kernel - size, out = 3
        acc = conv_int64(x, w, 128, 0, pads=[total // 2, total - total // 2], strides=[2])
        results.append((y, requantize_ref(wrap32(acc), 0.02, 0.01, 0.05, U8(128))))
    for got, want in results:  # earlier outputs untouched by later calls
        np.testing.assert_array_equal(got, want)

