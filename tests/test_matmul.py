"""Differential tests: qlinear.qlinear_matmul / qlinear.matmul_integer against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import (ALL_8BIT_COMBOS, I8, I32, U8, assert_exact, call_untouched, num_threads, rand_extreme, rand_int,
                      rand_scale)

# (a shape, b shape) pairs following numpy.matmul rules, incl. 1-D operands and broadcasting
SHAPES = [
    ((5,), (5,)),
    ((4,), (4, 3)),
    ((2, 4), (4,)),
    ((3, 4), (4, 2)),
    ((1, 7), (7, 1)),
    ((6,), (2, 6, 3)),
    ((2, 3, 6), (6,)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((3, 1, 2, 5), (4, 5, 3)),
    ((1, 4, 2, 3), (2, 1, 3, 2)),
    ((2, 1, 1, 2, 3), (1, 3, 1, 3, 4)),
]


def ids(pairs):
    return [f"{a}x{b}".replace(" ", "") for a, b in pairs]


def check_qmm(*args):
    want = oracle.qlinear_matmul(*args)
    got = call_untouched(qlinear.qlinear_matmul, *args)
    assert_exact(got, want)
    assert got.shape == np.matmul(np.asarray(args[0], np.int64), np.asarray(args[3], np.int64)).shape
    return got


def check_mmi(*args):
    want = oracle.matmul_integer(*args)
    got = call_untouched(qlinear.matmul_integer, *args)
    assert_exact(got, want)
    return got


def y_scale_for(rng, a_scale, b_scale, k):
    """y_scale spreading results over roughly +-120 steps (not all saturated)."""
    return np.float32(float(np.max(a_scale)) * float(np.max(b_scale)) * 120 * np.sqrt(k) * rng.uniform(0.3, 3))


# ----------------------------------------------------------------------------- random sweeps


@pytest.mark.parametrize("shape_a,shape_b", SHAPES, ids=ids(SHAPES))
def test_qlinear_matmul_shapes_and_types(shape_a, shape_b):
    rng = np.random.default_rng([SHAPES.index((shape_a, shape_b)), 31])
    for adt, bdt, ydt in ALL_8BIT_COMBOS:
        a = rand_int(rng, adt, shape_a)
        b = rand_int(rng, bdt, shape_b)
        a_s, b_s = rand_scale(rng), rand_scale(rng)
        y = check_qmm(a, a_s, rand_int(rng, adt, ()), b, b_s, rand_int(rng, bdt, ()),
                      y_scale_for(rng, a_s, b_s, shape_a[-1]), rand_int(rng, ydt, ()))
        assert y.dtype == ydt


@pytest.mark.parametrize("shape_a,shape_b", SHAPES, ids=ids(SHAPES))
def test_matmul_integer_shapes_and_types(shape_a, shape_b):
    rng = np.random.default_rng([SHAPES.index((shape_a, shape_b)), 32])
    for adt in (U8, I8):
        for bdt in (U8, I8):
            a = rand_int(rng, adt, shape_a)
            b = rand_int(rng, bdt, shape_b)
            check_mmi(a, b, rand_int(rng, adt, ()), rand_int(rng, bdt, ()))
            check_mmi(a, b, rand_int(rng, adt, (1,)))
            y = check_mmi(a, b)
            assert y.dtype == I32


@pytest.mark.parametrize("seed", range(6))
def test_qlinear_matmul_random_bigger(seed):
    rng = np.random.default_rng([seed, 33])
    for _ in range(3):
        batch = tuple(int(v) for v in rng.integers(1, 3, int(rng.integers(0, 3)), endpoint=True))
        m, k, n = (int(v) for v in rng.integers(1, 40, 3, endpoint=True))
        adt, bdt, ydt = ALL_8BIT_COMBOS[int(rng.integers(8))]
        a = rand_int(rng, adt, batch + (m, k))
        b = rand_int(rng, bdt, (k, n))
        a_s, b_s = rand_scale(rng), rand_scale(rng)
        check_qmm(a, a_s, rand_int(rng, adt, ()), b, b_s, rand_int(rng, bdt, ()),
                  y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ()))
        check_mmi(a, b, rand_int(rng, adt, ()), rand_int(rng, bdt, ()))


# ----------------------------------------------------------------------------- per-row / per-column


@pytest.mark.parametrize("form", ["flat", "keepdims"])
@pytest.mark.parametrize("adt,bdt,ydt", ALL_8BIT_COMBOS,
                         ids=[f"{a.__name__}-{b.__name__}-{c.__name__}" for a, b, c in ALL_8BIT_COMBOS])
def test_per_row_a_per_column_b_2d(adt, bdt, ydt, form):
    rng = np.random.default_rng([ALL_8BIT_COMBOS.index((adt, bdt, ydt)), form == "flat", 34])
    m, k, n = 5, 9, 4
    a = rand_int(rng, adt, (m, k))
    b = rand_int(rng, bdt, (k, n))
    row_shape, col_shape = ((m,), (n,)) if form == "flat" else ((m, 1), (1, n))
    a_s, a_z = rand_scale(rng, row_shape), rand_int(rng, adt, row_shape)
    b_s, b_z = rand_scale(rng, col_shape), rand_int(rng, bdt, col_shape)
    ys = y_scale_for(rng, a_s, b_s, k)
    y = check_qmm(a, a_s, a_z, b, b_s, b_z, ys, rand_int(rng, ydt, ()))
    # per-row only / per-column only mixed with per-tensor on the other side
    check_qmm(a, a_s, a_z, b, b_s[..., 0].reshape(()), bdt(b_z.ravel()[0]), ys, ydt(0))
    check_qmm(a, np.float32(a_s.ravel()[0]), adt(a_z.ravel()[0]), b, b_s, b_z, ys, ydt(0))
    assert y.shape == (m, n)
    check_mmi(a, b, a_z, b_z)
    check_mmi(a, b, adt(0), b_z)
    check_mmi(a, b, a_z)


@pytest.mark.parametrize("a_param_batch,b_param_batch", [
    ((2, 3), (3,)), ((1, 3), (1,)), ((2, 1), (3,)), ((1, 1), (1,)),
])
def test_per_row_per_column_with_batch(a_param_batch, b_param_batch):
    """a [2, 3, M, K] with params [..., M, 1]; b [3, K, N] with params [..., 1, N] or [N]."""
    rng = np.random.default_rng([len(a_param_batch), a_param_batch[0], a_param_batch[1], b_param_batch[0]])
    m, k, n = 4, 6, 5
    a = rand_int(rng, U8, (2, 3, m, k))
    b = rand_int(rng, I8, (3, k, n))
    a_s, a_z = rand_scale(rng, a_param_batch + (m, 1)), rand_int(rng, U8, a_param_batch + (m, 1))
    for b_shape in (b_param_batch + (1, n), (n,)):
        b_s, b_z = rand_scale(rng, b_shape), rand_int(rng, I8, b_shape)
        for ydt in (U8, I8):
            y = check_qmm(a, a_s, a_z, b, b_s, b_z, y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ()))
            assert y.shape == (2, 3, m, n)
        check_mmi(a, b, a_z, b_z)
        if a_param_batch == (1, 1):  # the flat [M] form applies to every batch
            check_qmm(a, a_s.reshape(m), a_z.reshape(m), b, b_s, b_z, np.float32(0.3), U8(128))
            check_mmi(a, b, a_z.reshape(m), b_z)


def test_per_column_b_with_1d_a():
    rng = np.random.default_rng(35)
    a = rand_int(rng, I8, (7,))
    b = rand_int(rng, U8, (2, 7, 3))
    b_s, b_z = rand_scale(rng, (3,)), rand_int(rng, U8, (3,))
    y = check_qmm(a, 0.02, I8(-5), b, b_s, b_z, np.float32(0.1), U8(100))
    assert y.shape == (2, 3)
    check_mmi(a, b, I8(-5), b_z)


# ----------------------------------------------------------------------------- ranges, exactness, wrap


@pytest.mark.parametrize("adt,bdt", [(U8, I8), (U8, U8), (I8, I8), (I8, U8)])
def test_large_k_beyond_float32_exactness(adt, bdt):
    """K = 1000 terms of magnitude 255 * 255 (zero points at the opposite extremes)."""
    rng = np.random.default_rng([1000, int(adt == I8), int(bdt == I8)])
    a_lo, a_hi = np.iinfo(adt).min, np.iinfo(adt).max
    b_lo, b_hi = np.iinfo(bdt).min, np.iinfo(bdt).max
    k = 1000
    a = rand_extreme(rng, adt, (3, k))
    b = rand_extreme(rng, bdt, (k, 4))
    a[0] = a_hi
    b[:, 0] = b_lo
    a_z, b_z = adt(a_lo), bdt(b_hi)
    exact = check_mmi(a, b, a_z, b_z)
    assert exact[0, 0] == -k * 255 * 255 and abs(int(exact[0, 0])) > 2**24
    a_s, b_s = np.float32(0.01), np.float32(0.02)
    for ys in (np.float32(a_s * b_s * k * 255 * 255 / 120), np.float32(a_s * b_s * k * 255 * 255 / 4 / 60)):
        for yz in (U8(128), I8(0)):
            check_qmm(a, a_s, a_z, b, b_s, b_z, ys, yz)


def test_matmul_integer_int32_wrap():
    """K = 40000 products of 255 * 255: the exact sum (2.6e9) leaves int32 and wraps."""
    rng = np.random.default_rng(36)
    k = 40000
    a = np.full((2, k), 255, U8)
    a[1] = rand_extreme(rng, U8, (k,))
    b = np.full((k, 3), -128, I8)
    b[:, 1] = 127
    b[:, 2] = rand_extreme(rng, I8, (k,))
    a_z, b_z = U8(0), I8(127)  # b - b_z in {-255, 0}
    y = check_mmi(a, b, a_z, b_z)
    exact = -255 * 255 * k
    assert exact < -(2**31)
    assert int(y[0, 0]) == exact + 2**32  # wrapped, not saturated
    assert int(y[0, 1]) == 0
    # the same wrap feeds QLinearMatMul's requantization
    check_qmm(a, np.float32(1e-4), a_z, b, np.float32(1e-4), b_z, np.float32(1e-8 * 2**31 / 100), I8(0))
    # positive overflow with int8 activations
    a8 = np.full((1, k), -128, I8)
    y8 = check_mmi(a8, b[:, :1], I8(127), b_z)
    assert int(y8[0, 0]) == 255 * 255 * k - 2**32


def test_python_int_zero_points():
    rng = np.random.default_rng(37)
    for adt, bdt, ydt in ALL_8BIT_COMBOS:
        a = rand_int(rng, adt, (3, 5))
        b = rand_int(rng, bdt, (5, 2))
        az, bz = int(rand_int(rng, adt, ())), int(rand_int(rng, bdt, ()))
        want = oracle.qlinear_matmul(a, 0.05, adt(az), b, 0.03, bdt(bz), 0.4, ydt(-1 if ydt == I8 else 1))
        got = qlinear.qlinear_matmul(a, 0.05, az, b, 0.03, bz, 0.4, ydt(-1 if ydt == I8 else 1))
        assert_exact(got, want)
        assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, adt(az), bdt(bz)))
        assert_exact(qlinear.matmul_integer(a, b, az), oracle.matmul_integer(a, b, adt(az)))


def test_one_element_and_0d_params():
    rng = np.random.default_rng(38)
    a = rand_int(rng, U8, (2, 4, 6))
    b = rand_int(rng, I8, (6, 3))
    want = oracle.qlinear_matmul(a, 0.02, U8(9), b, 0.01, I8(-2), 0.05, U8(7))
    for wrap in (lambda v, t: np.array(v, t), lambda v, t: np.array([v], t)):
        got = qlinear.qlinear_matmul(a, wrap(0.02, np.float32), wrap(9, U8), b, wrap(0.01, np.float64),
                                     wrap(-2, I8), wrap(0.05, np.float32), wrap(7, U8))
        assert_exact(got, want)


@pytest.mark.parametrize("shape_a,shape_b,shape_y", [
    ((0, 3, 4), (4, 5), (0, 3, 5)),
    ((2, 0, 4), (4, 5), (2, 0, 5)),
    ((3, 4), (0, 4, 2), (0, 3, 2)),
    ((3, 4), (4, 0), (3, 0)),
])
def test_empty_outputs(shape_a, shape_b, shape_y):
    a = np.ones(shape_a, U8)
    b = np.ones(shape_b, I8)
    y = check_qmm(a, 0.1, U8(0), b, 0.1, I8(0), 0.1, U8(0))
    assert y.shape == shape_y
    assert check_mmi(a, b).shape == shape_y


def test_saturation_both_ends():
    a = np.array([[255, 0]], U8)
    b = np.array([[127, -128], [0, 0]], I8)
    for ydt in (U8, I8):
        y = check_qmm(a, 1.0, U8(0), b, 1.0, I8(0), 1.0, ydt(0))
        info = np.iinfo(ydt)
        assert y.tolist() == [[info.max, info.min]]


# ----------------------------------------------------------------------------- requantization order


def grid_operands():
    """a [255, 2] rows (255, r), b [2, 256] columns (q, 1): y[r, q] sees acc = 255 q + r, which
    covers every integer in [-32640, 32639 + 254]."""
    r = np.arange(255)
    q = np.arange(-128, 128)
    a = np.stack([np.full(255, 255), r], axis=1).astype(U8)
    b = np.stack([q, np.ones(256, np.int64)], axis=0).astype(I8)
    acc = 255 * q[None, :] + r[:, None]
    return a, b, acc


def discriminating_scales(acc, seed):
    """Scales where the contract's float32 requantization differs, on some acc of the grid,
    from (1) a float64 multiplier, (2) x_scale * (w_scale / y_scale), (3) a float64 product."""
    rng = np.random.default_rng(seed)
    acc_f = acc.astype(np.float32)
    for _ in range(2000):
        xs, ws = np.float32(rng.uniform(1e-3, 5e-2)), np.float32(rng.uniform(1e-3, 5e-2))
        ys = np.float32(float(xs) * float(ws) * 32000 / 120 * rng.uniform(0.5, 1))
        m = np.float32(np.float32(xs * ws) / ys)
        contract = np.rint(np.float32(acc_f * m))
        alternatives = [
            np.rint(acc * (float(xs) * float(ws) / float(ys))),
            np.rint(np.float32(acc_f * np.float32(xs * np.float32(ws / ys)))),
            np.rint(acc * float(m)),
        ]
        if all((alt != contract).any() for alt in alternatives):
            return xs, ws, ys
    raise AssertionError("no discriminating scales found")


def test_requantization_is_float32_in_contract_order():
    a, b, acc = grid_operands()
    xs, ws, ys = discriminating_scales(acc, 71)
    for yz in (I8(0), I8(-3)):
        y = check_qmm(a, xs, U8(0), b, ws, I8(0), ys, yz)
        assert y.shape == (255, 256)
    assert_exact(check_mmi(a, b), acc.astype(I32))


def test_requantization_order_per_column_scales():
    """Per-column b_scale with three different multipliers near discriminating ones."""
    a, b, acc = grid_operands()
    triples = [discriminating_scales(acc, seed) for seed in (72, 73, 74)]
    # rescale so that a single a_scale / y_scale serve all columns: b_scale_j = xs_j * ws_j / xs_0
    xs0, _, ys0 = triples[0]
    cols = np.array([np.float32(t[0] * t[1] / xs0 * (ys0 / t[2])) for t in triples], np.float32)
    b_s = np.resize(cols, 256).astype(np.float32)
    check_qmm(a, xs0, U8(0), b, b_s, np.zeros(256, I8), ys0, I8(0))


def test_non_contiguous_and_readonly_inputs():
    rng = np.random.default_rng(39)
    big_a = rand_int(rng, U8, (2, 10, 16))
    big_b = rand_int(rng, I8, (16, 12))
    ro = big_b[:, :5].copy()
    ro.flags.writeable = False
    a_views = [big_a[:, ::2, ::2], big_a[:, ::-2, 1::2], np.asfortranarray(big_a[:, :5, :8])]
    b_views = [big_b[::2, ::2], big_b.T.copy().T[1::2, ::-2][:, :5], ro[::2]]
    for a in a_views:
        for b in b_views:
            b = b[:, :5]
            check_qmm(a, 0.02, U8(1), b, 0.01, I8(-1), 0.1, I8(3))
            check_mmi(a, b, U8(1), I8(-1))


# K values around the float32-exact chunk lengths 2**24 / (max|a| * max|b|):
# 258 (255 * 255), 514 (255 * 128 and 128 * 255... uint8 vs int8 at zero point 0), 1032, 2^16...
BOUNDARY_K = [257, 258, 259, 260, 513, 514, 515, 516, 1031, 1032, 1033, 2065, 4113]


def farthest(dtype, zp):
    """The value of dtype farthest from zp."""
    info = np.iinfo(dtype)
    return info.min if int(zp) - info.min > info.max - int(zp) else info.max


@pytest.mark.parametrize("k", BOUNDARY_K)
def test_reduction_lengths_around_exact_chunk_sizes(k):
    rng = np.random.default_rng([k, 40])
    cases = [
        (U8, U8(0), I8, I8(0)),      # |a| <= 255, |b| <= 128
        (U8, U8(255), U8, U8(0)),    # |a| <= 255, |b| <= 255
        (I8, I8(127), I8, I8(-128)),  # both up to 255
        (U8, U8(0), I8, I8(127)),    # b - bz in [-255, 0]
    ]
    for adt, az, bdt, bz in cases:
        a = rand_extreme(rng, adt, (3, k))
        b = rand_extreme(rng, bdt, (k, 4))
        a[0] = farthest(adt, az)  # row 0 x column 0: k terms of the largest magnitude, same sign
        b[:, 0] = farthest(bdt, bz)
        exact = check_mmi(a, b, az, bz)
        assert abs(int(exact[0, 0])) >= k * 127 * 255
        ys = np.float32(0.01 * 0.01 * abs(int(exact[0, 0])) / 120)
        check_qmm(a, np.float32(0.01), az, b, np.float32(0.01), bz, ys, I8(0))
        # values close to the zero point except one extreme column: per-operand maxima, not dtype bounds
        info = np.iinfo(adt)
        a2 = rand_int(rng, adt, (3, k), max(info.min, int(az) - 2), min(info.max, int(az) + 2))
        a2[:, k // 2] = farthest(adt, az)
        check_mmi(a2, b, az, bz)


def test_small_workspace_limit_gives_same_bits():
    """Tiling under a tiny scratch-memory bound must not change results."""
    limit = qlinear.workspace_limit()
    rng = np.random.default_rng(41)
    try:
        for nbytes in (1, 700, 5000):
            qlinear.set_workspace_limit(nbytes)
            for _ in range(3):
                a = rand_int(rng, U8, (2, 9, 300))
                b = rand_int(rng, I8, (300, 7))
                check_qmm(a, np.float32(0.01), U8(3), b, np.float32(0.02), I8(-4), np.float32(0.5), U8(128))
                check_mmi(a, b, U8(3), I8(-4))
    finally:
        qlinear.set_workspace_limit(limit)
    assert qlinear.workspace_limit() == limit


@pytest.mark.parametrize("xs,ws,ys", [
    (1e-20, 1e-20, 1e-37),   # x_scale * w_scale is subnormal in float32 (precision lost there)
    (1e-20, 3e-19, 7e-36),
    (1e19, 1e19, 1.0),       # multiplier 1e38: everything but acc 0 saturates
    (3e38, 1.0, 3e38),       # huge scales, ordinary multiplier
    (1e-30, 1e-30, 1.0),     # x_scale * w_scale underflows to 0: every output is y_zero_point
])
def test_extreme_finite_multipliers(xs, ws, ys):
    a, b, acc = grid_operands()
    xs, ws, ys = np.float32(xs), np.float32(ws), np.float32(ys)
    assert np.isfinite(oracle.multiplier(xs, ws, ys))
    for yz in (I8(0), U8(128)):
        check_qmm(a, xs, U8(0), b, ws, I8(0), ys, yz)


@pytest.mark.parametrize("k", [300, 700])
def test_per_row_per_column_large_k_extremes(k):
    """Per-row a and per-column b zero points at the extremes with K beyond one exact chunk."""
    rng = np.random.default_rng([k, 42])
    m, n = 4, 5
    a = rand_extreme(rng, U8, (2, m, k))
    b = rand_extreme(rng, I8, (k, n))
    a_z = np.array([0, 255, 0, 128], U8).reshape(1, m, 1)  # [..., M, 1]: same ndim as a
    b_z = np.array([127, -128, 0, 127, -128], I8)
    a[:, 0] = 255
    b[:, 0] = -128
    exact = check_mmi(a, b, a_z, b_z)
    assert np.abs(exact.astype(np.int64)).max() > 2**24 or k * 255 * 255 <= 2**24
    a_s = rand_scale(rng, (1, m, 1))
    b_s = rand_scale(rng, (n,))
    for ydt in (U8, I8):
        ys = np.float32(float(a_s.max()) * float(b_s.max()) * 255 * 255 * k / 4 / 100)
        check_qmm(a, a_s, a_z, b, b_s, b_z, ys, ydt(0))


# ----------------------------------------------------------------------------- batched products


@pytest.mark.parametrize("batches", range(1, 14))
def test_batched_equal_and_broadcast_batches(batches):
    """Attention-like batched products (b variable, as many a as b matrices: batch entry i
    reads matrix i of each), 1..13 of them, odd M/N/K, full-range values, every type
    combination over two counts; per-row a and per-column b parameters that vary per batch entry; and the
    same counts with b's batch broadcast against a's. On one thread and on two (small products
    are split over batch entries, larger ones within each product)."""
    rng = np.random.default_rng([batches, 97])
    for threads in (1, 2):
        with num_threads(threads):
            # half the type combinations per count (all of them over two counts)
            for i, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS[batches % 2::2]):
                m, k, n = (int(v) for v in rng.integers(1, 24, 3))
                if i == 0:  # a few full tiles and odd tails of every dimension
                    m, k, n = (151, 101, 139) if batches <= 2 else (37, 67, 35)
                    # (1-2 products of 2.1M MACs: on two threads, threads within each product)
                rand = rand_extreme if i == 1 else rand_int
                a = rand(rng, adt, (batches, m, k))
                b = rand(rng, bdt, (batches, k, n))
                a_s, a_z = rand_scale(rng, (batches, m, 1)), rand_int(rng, adt, (batches, m, 1))
                b_s, b_z = rand_scale(rng, (batches, 1, n)), rand_int(rng, bdt, (batches, 1, n))
                y_s = y_scale_for(rng, a_s, b_s, k)
                y_z = rand_int(rng, ydt, ())
                check_qmm(a, a_s, a_z, b, b_s, b_z, y_s, y_z)
                check_qmm(a, np.float32(0.02), adt(3), b, np.float32(0.01), bdt(1), y_s, y_z)
                check_mmi(a, b, a_z, b_z)
                # broadcasting: a [2, batches, M, K] against b [batches, K, N] and [1, K, N]
                # (row parameters take a's full rank: [2, batches, M, 1])
                a2 = rand(rng, adt, (2, batches, m, k))
                a2_s = np.ascontiguousarray(np.broadcast_to(a_s, (2, batches, m, 1)))
                a2_z = rand_int(rng, adt, (2, batches, m, 1))
                check_qmm(a2, a2_s, a2_z, b, b_s, b_z, y_s, y_z)
                check_mmi(a2, b[:1], a2_z, b_z[:1])
                check_mmi(a2[:, :1], b, a2_z[:, :1], b_z)


# ----------------------------------------------------------------------------- narrow tails


@pytest.mark.parametrize("seven_bit", [False, True])
def test_narrow_column_tails(seven_bit, engine_level):
    """n = 1..40 output columns (the last 16-column panel: every width 1..16) against the
    oracle at every level, all 8 type combinations in turn, full-range a, b full range (the
    exact kernel) or within 64 of 0 in the s8 form (avx2's vpmaddubsw kernel), differing
    per-column zero points; and that avx2's 8-column tail kernel ran exactly for the last
    panels of at most 8 columns."""
    from qlinear import _native
    native = engine_level != "numpy" and _native.native() is not None
    rng = np.random.default_rng([seven_bit, 47])
    m, k = 7, 37
    for n in range(1, 41):
        adt, bdt, ydt = ALL_8BIT_COMBOS[n % len(ALL_8BIT_COMBOS)]
        a = rand_extreme(rng, adt, (m, k))
        if seven_bit:
            mid = 0 if bdt == I8 else 128
            b = (mid + rng.integers(-64, 64, (k, n), endpoint=True)).astype(bdt)
        else:
            b = rand_extreme(rng, bdt, (k, n))
        a_s, a_z = rand_scale(rng, ()), rand_int(rng, adt, ())
        b_s, b_z = rand_scale(rng, (n,)), rand_int(rng, bdt, (n,))
        before = _native._C.tail_counts() if native else None
        check_qmm(a, a_s, a_z, b, b_s, b_z, y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ()))
        check_mmi(a, b, a_z, b_z)
        if native and _native._C.get_isa() == "avx2":
            panels = _native._C.tail_counts()[1] - before[1]
            assert (panels > 0) == (n - (n - 1) // 16 * 16 <= 8), (n, panels)


# ----------------------------------------------------------------------------- fused epilogue

# (M, K, N): rows around the tiles (avx2 6/4, avxvnni 6, avx512vnni 8), columns around the
# 16-column half-tiles and the 32-column avx512vnni tile (a last panel of 1-15 real columns in
# either half, a whole one, one and a half), K of one k-group up to several
_FUSED_CASES = [
    (1, 1, 1), (5, 37, 15), (7, 4, 16), (8, 100, 17), (9, 13, 31), (13, 64, 32), (17, 259, 33),
    (6, 29, 47), (3, 130, 64), (11, 8, 70),
]


@pytest.mark.parametrize("case", range(len(_FUSED_CASES)))
def test_fused_epilogue_per_level(case, engine_level):
    """The GEMM kernels' fused epilogue (kernel_ep: the U8S8 corrections and the requantization
    straight from the accumulators) against the oracle, on every level: all 8 type
    combinations, full-range operands (a at its type's ends every 3rd element), per-row a
    scale / zero point and per-column b scale / zero point (and per-tensor ones on the other
    side), QLinearMatMul and MatMulInteger (int32 out), plain calls (b packed per panel) and
    prepared forms (b packed once); and that every one of those GEMMs ran on kernel_ep on a
    level whose matmul kernel has it, which the VNNI levels' must (avx512vnni-u8s8,
    avxvnni-u8s8; both run natively on VNNI CPUs and under scripts/emulated_isa.sh), but the
    prepared forms' products of a one-row a by a narrow b, which are matrix-vector products
    (gemm/gemv.c, tests/test_gemv.py) and run no GEMM."""
    from qlinear import _native
    native = engine_level not in (None, "numpy") and _native.native() is not None
    level = _native._C.get_isa() if native else None
    if level in ("amx", "avx512vnni", "avxvnni"):
        assert _native._C.kernel_info(level, 0)["fused"]
        assert _native._C.kernel_info(level, 1) is None   # the exact kernel is the only one
    m, k, n = _FUSED_CASES[case]
    rng = np.random.default_rng([case, 61])
    for r, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        a = rand_int(rng, adt, (m, k))
        a.flat[::3] = rand_extreme(rng, adt, a.flat[::3].shape)
        b = rand_int(rng, bdt, (k, n))
        per_row, per_col = r % 4 != 3, r % 4 != 2   # both, both, per-column only, per-row only
        a_s = rand_scale(rng, (m, 1) if per_row else ())
        a_z = rand_int(rng, adt, (m, 1) if per_row else ())
        b_s = rand_scale(rng, (n,) if per_col else ())
        b_z = rand_int(rng, bdt, (n,) if per_col else ())
        ys, yz = y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ())
        before = _native._C.gemm_fused_count() if native else None
        gemv_before = _native._C.gemv_count() if native else None
        check_qmm(a, a_s, a_z, b, b_s, b_z, ys, yz)
        check_mmi(a, b, a_z, b_z)
        want = oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, ys, yz)
        assert_exact(qlinear.prepare_qlinear_matmul(b, b_s, b_z).run(a, a_s, a_z, ys, yz), want)
        assert_exact(qlinear.prepare_matmul_integer(b, b_z).run(a, a_z), oracle.matmul_integer(a, b, a_z, b_z))
        if native:
            which = [w for w in (0, 1) if _native._C.kernel_info(level, w) is not None]
            fused = all(_native._C.kernel_info(level, w)["fused"] for w in which)
            ran = _native._C.gemm_fused_count() - before
            gemv = _native._C.gemv_count() - gemv_before
            assert gemv in ((2,) if m == 1 and n < 8 else (0,)), (level, gemv)
            assert ran == (4 - gemv if fused else 0), (level, ran)


# ----------------------------------------------------------------------------- 512-bit tile epilogue

# (M, K, N): row counts that pair up or leave one row (the two-row narrowing of the 8-bit
# epilogue, ql_ep32_row2, and the single last row), within one 8-row avx512vnni tile, across
# tiles and one 32-row amx tile; whole 32-column tiles (narrowed by packs) and last panels of
# 1-31 columns (masked vpmov stores); K of one k-group and several
_WIDE_CASES = [(2, 64, 32), (3, 4, 64), (8, 131, 96), (9, 64, 33), (16, 20, 100), (17, 64, 31),
               (33, 9, 64), (40, 128, 128)]


@pytest.mark.parametrize("case", range(len(_WIDE_CASES)))
def test_wide_tile_epilogue(case, engine_level):
    """The 512-bit tile epilogue of avx512vnni-u8s8 and amx-u8s8 (simd_common_avx512.h:
    ql_ep32; the other levels run their own on the same inputs) against the oracle: all 8 type
    combinations with full-range operands, zero points per tensor (the 'usual' specialization,
    ql_ep32_usual: its fields taken as constants), per row of a only (still usual: a
    multiplier per row), per column of b and both; y zero points at the output type's ends
    and y scales that saturate most outputs at both ends as well as ones that do not;
    QLinearMatMul and MatMulInteger, plain calls and prepared forms, a 2-D and a batched a."""
    m, k, n = _WIDE_CASES[case]
    rng = np.random.default_rng([case, 67])
    for r, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        mode = (r + case) % 4   # 0: per tensor, 1: a per row, 2: b per column, 3: both
        a = rand_int(rng, adt, (m, k))
        a.flat[::3] = rand_extreme(rng, adt, a.flat[::3].shape)
        b = rand_int(rng, bdt, (k, n))
        b.flat[1::4] = rand_extreme(rng, bdt, b.flat[1::4].shape)
        rows, cols = mode in (1, 3), mode in (2, 3)
        a_s = rand_scale(rng, (m, 1) if rows else ())
        a_z = rand_int(rng, adt, (m, 1) if rows else ())
        b_s = rand_scale(rng, (n,) if cols else ())
        b_z = rand_int(rng, bdt, (n,) if cols else ())
        info = np.iinfo(ydt)
        for ys, yz in ((y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ())),
                       (y_scale_for(rng, a_s, b_s, k) / 50, np.array(info.min if r % 2 else info.max, ydt))):
            check_qmm(a, a_s, a_z, b, b_s, b_z, np.float32(ys), yz)
            want = oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, np.float32(ys), yz)
            assert_exact(qlinear.prepare_qlinear_matmul(b, b_s, b_z).run(a, a_s, a_z, np.float32(ys), yz), want)
        check_mmi(a, b, a_z, b_z)
        assert_exact(qlinear.prepare_matmul_integer(b, b_z).run(a, a_z), oracle.matmul_integer(a, b, a_z, b_z))
        if not rows:   # batched: 3 entries of a against one b, and 3 against 3
            a3 = rand_int(rng, adt, (3, m, k))
            b3 = rand_int(rng, bdt, (3, k, n))
            ys = np.float32(y_scale_for(rng, a_s, b_s, k))
            check_qmm(a3, a_s, a_z, b, b_s, b_z, ys, yz)
            check_qmm(a3, a_s, a_z, b3, b_s, b_z, ys, yz)
            check_mmi(a3, b3, a_z, b_z)


# ----------------------------------------------------------------------------- streamed int32 output

# (a shape, b shape): outputs of 1 MiB and more (a block of the output pool: 64-byte aligned,
# rows of whole lines, so the non-temporal stores run on every row of full tiles) and small
# ones (numpy.empty's alignment, rows alternating in alignment, last panels of 1-31 columns:
# the ordinary stores within a streamed call); batched and plain / prepared b
_STREAM_CASES = [((512, 70), (70, 512)), ((300, 129), (129, 1000)), ((37, 200), (200, 77)),
                 ((3, 33, 64), (64, 50)), ((2, 40, 65), (2, 65, 48))]


@pytest.mark.parametrize("case", range(len(_STREAM_CASES)))
def test_streamed_int32_output(case, engine_level):
    """MatMulInteger's int32 output written with non-temporal stores (gemm.c's
    ql_gemm_stream_bytes, 32 MiB, lowered here to the case's own output size) against the
    oracle on every level, all four type combinations, per-row a zero points and per-column b
    zero points or per-tensor ones, plain calls and prepared forms, 1 and 2 threads; and that
    the call streamed exactly when its output reached the threshold (GEMM tasks counted by
    the driver; one byte above the output's size: none)."""
    from qlinear import _native
    native = engine_level not in (None, "numpy") and _native.native() is not None
    a_shape, b_shape = _STREAM_CASES[case]
    rng = np.random.default_rng([case, 67])
    out_bytes = 4 * int(np.prod(np.matmul(np.zeros(a_shape, np.int64), np.zeros(b_shape, np.int64)).shape))
    saved = _native._C.gemm_stream()[0] if native else None
    try:
        for r, (adt, bdt) in enumerate([(U8, I8), (U8, U8), (I8, I8), (I8, U8)]):
            a = rand_int(rng, adt, a_shape)
            a.flat[::5] = rand_extreme(rng, adt, a.flat[::5].shape)
            b = rand_extreme(rng, bdt, b_shape)
            per_elem = r % 2 == 0
            a_z = rand_int(rng, adt, (*a_shape[:-1], 1) if per_elem else ())
            b_z = rand_int(rng, bdt, (b_shape[-1],) if per_elem else ())
            want = oracle.matmul_integer(a, b, a_z, b_z)
            prep = qlinear.prepare_matmul_integer(b, b_z)
            for threads in (1, 2):
                with num_threads(threads):
                    for limit, streams in ((out_bytes, True), (out_bytes + 1, False)):
                        if native:
                            _native._C.gemm_stream(limit)
                            before = _native._C.gemm_stream()[1]
                        assert_exact(call_untouched(qlinear.matmul_integer, a, b, a_z, b_z), want)
                        assert_exact(prep.run(a, a_z), want)
                        if native:
                            ran = _native._C.gemm_stream()[1] - before
                            assert (ran >= 2) == streams and (ran > 0) == streams, (limit, ran)
    finally:
        if native:
            _native._C.gemm_stream(saved)


# ----------------------------------------------------------------------------- panel pairs

# (M, K, N): N around the 64 columns of a pair of 32-column panels (a last panel of 1-31
# columns after pairs, an odd count of whole panels: the last one alone), K with a partial last
# k-group (K % 4) and K's padding to 64 (amx)
_PAIR_CASES = [(5, 37, 64), (9, 5, 95), (3, 64, 96), (17, 130, 130), (2, 1, 200), (33, 771, 257)]


@pytest.mark.parametrize("case", range(len(_PAIR_CASES)))
def test_plain_panel_pairs(case, engine_level):
    """Plain calls (b packed per panel inside the GEMM) whose packer takes two 32-column
    panels in one pass (ql_gemm_kernel.pack_R_pairs: avx512vnni and amx) against the oracle on
    every level: uint8 and int8 b at its type's ends, per-column and per-tensor zero points,
    QLinearMatMul and MatMulInteger, 1 and 2 threads; on one thread at a pairing level, exactly
    N // 64 pairs (every pair of whole panels from the first, the rest alone)."""
    from qlinear import _native
    native = engine_level not in (None, "numpy") and _native.native() is not None
    pairs_level = native and _native._C.get_isa() in ("amx", "avx512vnni")
    m, k, n = _PAIR_CASES[case]
    rng = np.random.default_rng([case, 71])
    for r, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        a = rand_int(rng, adt, (m, k))
        b = rand_extreme(rng, bdt, (k, n))
        per_col = r % 2 == 0
        a_s, a_z = rand_scale(rng, ()), rand_int(rng, adt, ())
        b_s = rand_scale(rng, (n,) if per_col else ())
        b_z = rand_int(rng, bdt, (n,) if per_col else ())
        ys, yz = y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ())
        for threads in (1, 2):
            with num_threads(threads):
                before = _native._C.gemm_pair_count() if native else 0
                check_mmi(a, b, a_z, b_z)
                ran = _native._C.gemm_pair_count() - before if native else 0
                check_qmm(a, a_s, a_z, b, b_s, b_z, ys, yz)
            if threads == 1:
                assert ran == (n // 64 if pairs_level else 0), (n, ran)


# ----------------------------------------------------------------------------- tile edges

# (M, K, N) around amx-u8s8's tile (2 x 2 tiles of 16 rows x 16 columns, K steps of 64, K
# padded to 64 with zeros): rows 1-15 (one row tile of fewer rows), 16, 17-31 (a second row
# tile of fewer rows), 32, 33 (a next call); columns 1-15 / 17-31 (masked epilogue lanes);
# K one below, at and above multiples of 64. Every level runs them (the other levels' tiles
# have edges there too: mr 4-16, nr 16-32, kpack 2-4).
_TILE_EDGE_CASES = [(1, 1, 1), (15, 63, 17), (16, 64, 16), (17, 65, 31), (31, 127, 32), (32, 128, 33),
                    (33, 129, 15), (47, 191, 49), (64, 256, 64), (5, 1000, 70)]


@pytest.mark.parametrize("case", range(len(_TILE_EDGE_CASES)))
def test_tile_edges_every_type_and_parameter_kind(case, engine_level):
    """QLinearMatMul and MatMulInteger at the tile edges above, all 8 type combinations,
    full-range operands, per-row a zero points that change from row to row (amx's epilogue
    reuses row_z * colsum across rows with the same row_z: this breaks every run), per-column
    b zero points and scales (its per-lane column path) and per-tensor ones; prepared and
    plain calls, against the oracle."""
    m, k, n = _TILE_EDGE_CASES[case]
    rng = np.random.default_rng([case, 71])
    for r, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        a = rand_extreme(rng, adt, (m, k)) if r % 2 else rand_int(rng, adt, (m, k))
        b = rand_extreme(rng, bdt, (k, n)) if r % 3 else rand_int(rng, bdt, (k, n))
        per_row, per_col = r % 2 == 0, r % 4 < 2
        a_s = rand_scale(rng, (m, 1) if per_row else ())
        a_z = rand_int(rng, adt, (m, 1) if per_row else ())
        if per_row and m > 2:
            a_z[1::3] = a_z[0]   # runs of equal and of changing zero points
        b_s = rand_scale(rng, (n,) if per_col else ())
        b_z = rand_int(rng, bdt, (n,) if per_col else ())
        ys, yz = y_scale_for(rng, a_s, b_s, k), rand_int(rng, ydt, ())
        check_qmm(a, a_s, a_z, b, b_s, b_z, ys, yz)
        check_mmi(a, b, a_z, b_z)
        assert_exact(qlinear.prepare_qlinear_matmul(b, b_s, b_z).run(a, a_s, a_z, ys, yz),
                     oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, ys, yz))
        assert_exact(qlinear.prepare_matmul_integer(b, b_z).run(a, a_z), oracle.matmul_integer(a, b, a_z, b_z))


def test_tile_sums_wrap(engine_level):
    """The kernels' own int32 sums wrap (not only the corrections): a u8 row of 255 times an
    int8 column of -128 over K = 67000 is -2.19e9 in the U8S8 form before any correction
    (tdpbusd / vpdpbusd / vpmaddwd accumulate with wraparound), and +2.17e9 with 127."""
    k = 67000
    a = np.full((3, k), 255, U8)
    b = np.full((k, 2), -128, I8)
    b[:, 1] = 127
    y = check_mmi(a, b, U8(0), I8(0))
    assert int(y[0, 0]) == -255 * 128 * k + 2**32 and int(y[0, 1]) == 255 * 127 * k - 2**32
    assert_exact(qlinear.prepare_matmul_integer(b, I8(0)).run(a, U8(0)), y)


def test_amx_tile_configuration_shared_with_another_library():
    """The tile configuration is per-thread state that other AMX code on the thread also uses
    (onnxruntime's MLAS, on its caller's thread, keeps its shapes loaded across calls and faults
    if they changed). amx-u8s8 saves it at the start of each task and restores it at the end,
    and within a task reloads its own shapes only on a change. Here a foreign configuration
    (every tile 1 row x 4 bytes) is loaded on this thread between calls of one shape (32 rows:
    every tile wants the same full shapes, so a kernel trusting its own record of the last
    load would run on the foreign shapes), on one thread (every task on this thread): the
    results stay exact, and after each call the foreign configuration is loaded again."""
    from qlinear import _native
    if not _native.available() or "amx" not in _native.engine_info()["isas"]:
        pytest.skip("needs the amx level (a CPU with AMX-INT8, or scripts/emulated_isa.sh)")
    rng = np.random.default_rng(72)
    a = rand_int(rng, U8, (32, 300))
    b = rand_int(rng, I8, (300, 40))
    want = oracle.matmul_integer(a, b, U8(3), I8(-2))
    prepared = qlinear.prepare_matmul_integer(b, I8(-2))
    with _native.use_isa("amx"), num_threads(1):
        for _ in range(3):
            _native._C.amx_foreign_tiles(True)
            assert_exact(prepared.run(a, U8(3)), want)
            assert _native._C.amx_foreign_tiles(False)
            assert_exact(qlinear.matmul_integer(a, b, U8(3), I8(-2)), want)
            assert _native._C.amx_foreign_tiles(False)


# ----------------------------------------------------------------------------- regressions
# found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)


def test_prepared_matmuls_own_what_they_keep():
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    rng = np.random.default_rng(4)
    a = rand_int(rng, U8, (5, 7))
    b = rand_int(rng, I8, (7, 3))
    bzp = np.array([1, 2, 3], I8)
    bs = rand_scale(rng, (3,))
    want_i = oracle.matmul_integer(a, b, U8(9), bzp.copy())
    want_q = oracle.qlinear_matmul(a, np.float32(0.03), U8(9), b, bs.copy(), bzp.copy(), np.float32(0.5), U8(100))
    pi = qlinear.prepare_matmul_integer(b, bzp)
    pq = qlinear.prepare_qlinear_matmul(b, bs, bzp)
    bzp[...] = -100
    bs[...] = 7.0
    b[...] = 0
    assert_exact(pi.run(a, U8(9)), want_i)
    assert_exact(pq.run(a, np.float32(0.03), U8(9), np.float32(0.5), U8(100)), want_q)


MATMUL_SHAPES = [
    ((2, 3, 0), (0, 4)),   # K = 0: zeros
    ((0, 5), (5, 4)),      # M = 0
    ((3, 5), (5, 0)),      # N = 0
    ((0, 3, 5), (5, 4)),   # empty batch
    ((2, 0, 5), (2, 5, 0)),
    ((0,), (0, 3)),        # 1-D a with K = 0
    ((4, 0), (0,)),        # 1-D b with K = 0
    ((0,), (0,)),          # both 1-D, K = 0: a 0-d zero
]


@pytest.mark.parametrize("ashape,bshape", MATMUL_SHAPES, ids=[f"{a}x{b}" for a, b in MATMUL_SHAPES])
def test_matmul_integer_zero_size_like_numpy(ashape, bshape):
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    a = np.zeros(ashape, U8)
    b = np.zeros(bshape, I8)
    want = np.matmul(a.astype(np.int32), b.astype(np.int32))
    assert_exact(qlinear.matmul_integer(a, b), want)
    assert_exact(qlinear.matmul_integer(a, b, U8(3), I8(-2)), want)  # K = 0 or nothing to sum
    y = qlinear.qlinear_matmul(a, np.float32(0.1), U8(3), b, np.float32(0.2), I8(-2), np.float32(0.5), U8(7))
    assert y.dtype == np.uint8 and y.shape == want.shape
    assert (y == 7).all()  # acc 0 -> y_zero_point


@pytest.mark.parametrize("m,n", [(0, 4), (3, 0), (0, 0)])
def test_matmul_per_row_and_per_column_zero_points_with_empty_m_or_n(m, n):
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    rng = np.random.default_rng(5)
    a = rand_int(rng, U8, (m, 6))
    b = rand_int(rng, I8, (6, n))
    azp = rand_int(rng, U8, (m,))
    bzp = rand_int(rng, I8, (n,))
    want = np.zeros((m, n), np.int32)
    assert_exact(qlinear.matmul_integer(a, b, azp, bzp), want)
    assert_exact(qlinear.matmul_integer(a, b, azp.reshape(m, 1), bzp.reshape(1, n)), want)
    y = qlinear.qlinear_matmul(a, rand_scale(rng, (m,)), azp, b, rand_scale(rng, (n,)), bzp,
                               np.float32(0.5), U8(7))
    assert y.shape == (m, n) and y.dtype == np.uint8


def test_matmul_per_row_zero_points_with_empty_k():
    """regression: found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)."""
    a = np.zeros((3, 0), U8)
    b = np.zeros((0, 2), I8)
    y = qlinear.matmul_integer(a, b, np.array([1, 2, 3], U8), np.array([4, 5], I8))
    assert_exact(y, np.zeros((3, 2), np.int32))


def test_float16_scales_take_the_lean_path(monkeypatch):
    """QLinearMatMul-21 with float16/bfloat16 scales: widened exactly to float32 before the lean
    path, so a repeated plain call does not build (and pack) a new prepared form every time, and
    the bits are those of the float32 call."""
    import ml_dtypes
    from qlinear import _prepared, matmul as mm
    rng = np.random.default_rng(21)
    a = rng.integers(0, 256, (64, 96), dtype=np.uint8)
    b = rng.integers(-128, 128, (96, 48), dtype=np.int8)
    for narrow in (np.float16, ml_dtypes.bfloat16):
        _prepared.PLAIN.clear()
        s = [np.array(x, narrow) for x in (0.05, 0.01, 2.0)]
        want = qlinear.qlinear_matmul(a, s[0].astype(np.float32), np.uint8(128), b, s[1].astype(np.float32),
                                      np.int8(0), s[2].astype(np.float32), np.uint8(128))
        built = []
        real = mm.PreparedQLinearMatMul
        monkeypatch.setattr(mm, "PreparedQLinearMatMul", lambda *args, **kw: built.append(1) or real(*args, **kw))
        for _ in range(3):
            got = qlinear.qlinear_matmul(a, s[0], np.uint8(128), b, s[1], np.int8(0), s[2], np.uint8(128))
            np.testing.assert_array_equal(got, want)
        monkeypatch.setattr(mm, "PreparedQLinearMatMul", real)
        if qlinear.engine_info()["engine"] == "native":
            assert len(built) == 0, f"{narrow}: {len(built)} prepared forms built for 3 plain calls"
