"""Plain calls (weights passed on every call, nothing prepared) against the prepared forms and
the oracle, bit for bit. On the native engine a plain matmul packs b inside the GEMM tasks
(each thread the panels it uses) or, for a tall a or b entries reused across batches, whole
first; a plain convolution packs its weights per call, choosing the 7-bit path from the given
weights. These tests aim at those decisions: both sides of every threshold and of the 7-bit
bound, K around the driver's blocks, odd tails, all type combinations, per-row / per-column
parameters, broadcast batches, one and two threads. Every test runs on the NumPy engine and on
the native engine at each ISA level this CPU runs (conftest)."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear

import oracle
from conftest import ALL_8BIT_COMBOS, DTYPES_8, I8, U8, assert_exact, num_threads, rand_int, rand_scale


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    with num_threads(request.param) as n:
        yield n


def _seven_bit(rng, dtype, shape, edge=True):
    """Values whose s8 form (int8 as is, uint8 - 128) lies in [-64, 64], both ends included."""
    lo, hi = (-64, 64) if dtype == I8 else (64, 192)
    v = rand_int(rng, dtype, shape, lo, hi)
    if edge and v.size >= 2:
        v.flat[0], v.flat[-1] = lo, hi
    return v


def _matmul_both(a, b, az, bz):
    """MatMulInteger plain and prepared, each checked against the oracle."""
    want = oracle.matmul_integer(a, b, az, bz)
    assert_exact(qlinear.matmul_integer(a, b, az, bz), want)
    assert_exact(qlinear.prepare_matmul_integer(b, bz).run(a, az), want)


# K around the driver's K block (2048 int16 or 4096 bytes of a 16-column panel; blocked from
# 1.5 blocks on), odd tails in M and N
@pytest.mark.parametrize("k", [1, 3, 2047, 2048, 3071, 3072, 3073, 4095, 4096, 6143, 6145])
def test_plain_matmul_k_blocks(k, threads):
    rng = np.random.default_rng([10, k, threads])
    for adt, bdt in [(U8, I8), (I8, U8)]:
        a, b = rand_int(rng, adt, (13, k)), rand_int(rng, bdt, (k, 37))
        _matmul_both(a, b, rand_int(rng, adt, (13,)), rand_int(rng, bdt, (37,)))
        b7 = _seven_bit(rng, bdt, (k, 37))
        _matmul_both(a, b7, rand_int(rng, adt, ()), None)


@pytest.mark.parametrize("adt,bdt,ydt", ALL_8BIT_COMBOS)
def test_plain_qlinear_matmul_all_types_both_paths(adt, bdt, ydt, threads):
    """Full-range and 7-bit b (both ends of the bound, and one value past it), per-row a and
    per-column b parameters, sizes that take both threads and several panels per task."""
    rng = np.random.default_rng([11, adt is U8, bdt is U8, ydt is U8, threads])
    m, k, n = 67, 301, 131
    a = rand_int(rng, adt, (m, k))
    lo, hi = (-64, 64) if bdt == I8 else (64, 192)
    b7 = _seven_bit(rng, bdt, (k, n))
    past = b7.copy()
    past[k // 2, n - 1] = hi + 1           # one value outside: the exact kernel
    below = b7.copy()
    below[3, 0] = lo - 1
    for b in (rand_int(rng, bdt, (k, n)), b7, past, below):
        args = (a, rand_scale(rng, (m, 1)), rand_int(rng, adt, (m, 1)), b, rand_scale(rng, (n,)),
                rand_int(rng, bdt, (n,)), np.float32(rng.uniform(0.5, 4.0)), rand_int(rng, ydt, ()))
        want = oracle.qlinear_matmul(*args)
        assert_exact(qlinear.qlinear_matmul(*args), want)
        assert_exact(qlinear.prepare_qlinear_matmul(*args[3:6]).run(*args[:3], *args[6:]), want)


@pytest.mark.parametrize("m", [1, 5, 31, 32, 700])
def test_plain_matmul_tall_a_and_reused_b(m, threads):
    """Either side of the native engine's choice to pack b whole first: a tall a (packed a
    above 1 MiB: 700 rows of K = 800 int16) and b entries reused by several batch entries of
    few rows (M < 32); with batch-varying per-column zero points."""
    rng = np.random.default_rng([12, m, threads])
    for adt, bdt in [(U8, I8), (I8, I8), (U8, U8)]:
        k = 800
        a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, 45))
        _matmul_both(a, b, rand_int(rng, adt, ()), rand_int(rng, bdt, (45,)))
        # a (4, 1, m, 40) x b (3, 40, 33): every b entry used by 4 output entries
        a4, b3 = rand_int(rng, adt, (4, 1, min(m, 40), 40)), rand_int(rng, bdt, (3, 40, 33))
        _matmul_both(a4, b3, None, rand_int(rng, bdt, (3, 1, 33)))
        _matmul_both(a4, _seven_bit(rng, bdt, (3, 40, 33)), rand_int(rng, adt, ()), rand_int(rng, bdt, (33,)))


@pytest.mark.parametrize("adt", DTYPES_8)
@pytest.mark.parametrize("bdt", DTYPES_8)
def test_plain_matmul_batches_and_layouts(adt, bdt, threads):
    """Broadcast batches, 1-D operands, a transposed (non-contiguous) b, per-row and
    per-column parameters broadcast over batches, b variable per batch entry."""
    rng = np.random.default_rng([13, adt is U8, bdt is U8, threads])
    cases = [((2, 3, 9, 70), (3, 70, 21)), ((5, 17, 64), (64, 50)), ((70,), (70, 19)),
             ((9, 70), (70,)), ((12, 20, 33), (12, 33, 20)), ((1, 6, 40), (6, 1, 40, 18))]
    for a_shape, b_shape in cases:
        a, b = rand_int(rng, adt, a_shape), rand_int(rng, bdt, b_shape)
        n = b_shape[-1] if len(b_shape) > 1 else 1
        bz = rand_int(rng, bdt, (n,)) if len(b_shape) > 1 else rand_int(rng, bdt, ())
        _matmul_both(a, b, rand_int(rng, adt, ()), bz)
    a, bt = rand_int(rng, adt, (11, 90)), rand_int(rng, bdt, (60, 90)).T   # b not contiguous
    _matmul_both(a, bt, rand_int(rng, adt, (11,)), rand_int(rng, bdt, (60,)))
    args = (rand_int(rng, adt, (3, 10, 50)), rand_scale(rng, (3, 10, 1)), rand_int(rng, adt, (3, 10, 1)),
            rand_int(rng, bdt, (3, 50, 17)), rand_scale(rng, (3, 1, 17)), rand_int(rng, bdt, (3, 1, 17)),
            np.float32(0.75), rand_int(rng, adt, ()))
    assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


def test_plain_matmul_leaves_its_inputs_alone():
    """The weights are read, never cached or written: a changed b gives the new product."""
    rng = np.random.default_rng(14)
    a, b = rand_int(rng, U8, (20, 300)), _seven_bit(rng, I8, (300, 40))
    before = b.copy()
    first = qlinear.matmul_integer(a, b, np.uint8(3))
    assert_exact(b, before)
    b[7, 5] = -128                       # now outside the 7-bit bound, same array object
    assert_exact(qlinear.matmul_integer(a, b, np.uint8(3)), oracle.matmul_integer(a, b, np.uint8(3)))
    b[7, 5] = before[7, 5]
    assert_exact(qlinear.matmul_integer(a, b, np.uint8(3)), first)


# ---------------------------------------------------------------------------------------------
# Convolutions: a plain call packs its weights per call, choosing the 7-bit path from them
# ---------------------------------------------------------------------------------------------

def _conv_both(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs):
    """QLinearConv plain and prepared, and ConvInteger plain, each against the oracle."""
    want = oracle.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs)
    assert_exact(qlinear.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs), want)
    assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, bias, **attrs).run(x, xs, xz, ys, yz), want)
    assert_exact(qlinear.conv_integer(x, w, xz, wz, **attrs), oracle.conv_integer(x, w, xz, wz, **attrs))


def _centered_weights(rng, dtype, shape, zp, bound):
    """Weights with w - zp[row] within [-bound, bound] (and inside the dtype), both ends used."""
    info = np.iinfo(dtype)
    m = shape[0]
    zps = np.broadcast_to(np.asarray(zp, dtype=np.int64).reshape(-1), (m,))
    w = np.empty(shape, dtype=dtype)
    for i in range(m):
        lo, hi = max(info.min, int(zps[i]) - bound), min(info.max, int(zps[i]) + bound)
        row = rng.integers(lo, hi, size=shape[1:], endpoint=True)
        row.flat[0], row.flat[-1] = lo, hi
        w[i] = row
    return w


@pytest.mark.parametrize("xdt,wdt,ydt", ALL_8BIT_COMBOS)
def test_plain_conv_seven_bit_boundary_all_types(xdt, wdt, ydt, threads):
    """Weights within 64 of their (per-channel) zero point take the 7-bit path, one weight at
    65 (first, middle or last row) the exact one: plain and prepared agree with the oracle.
    Large enough (M·K >= 2^15) for the packing to be shared by the threads."""
    rng = np.random.default_rng([20, xdt is U8, wdt is U8, ydt is U8, threads])
    m, c, k = 72, 128, 3
    x = rand_int(rng, xdt, (1, c, 7, 6))
    wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
    w7 = _centered_weights(rng, wdt, (m, c, k, k), wz, 64)
    args = dict(pads=[1, 0, 1, 2])
    xs, ws, ys = rand_scale(rng), rand_scale(rng, (m,)), np.float32(rng.uniform(0.5, 4.0))
    xz, yz = rand_int(rng, xdt, ()), rand_int(rng, ydt, ())
    bias = rand_int(rng, np.int32, (m,), -50000, 50000)
    _conv_both(x, xs, xz, w7, ws, wz, ys, yz, bias, **args)
    for row in (0, m // 2, m - 1):
        w = w7.copy()
        z = int(wz[row])
        if z + 65 <= np.iinfo(wdt).max:
            w[row, c // 2, 1, 2] = z + 65
        else:
            w[row, c // 2, 1, 2] = z - 65
        _conv_both(x, xs, xz, w, ws, wz, ys, yz, bias, **args)
    full = rand_int(rng, wdt, (m, c, k, k))
    _conv_both(x, xs, xz, full, ws, wz, ys, yz, None, **args)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 6, 9, 11), dict(kernel=(5, 3), strides=[2, 1], pads=[2, 1, 0, 1])),
    ((1, 33, 13), dict(kernel=(4,), dilations=[2], group=3)),
    ((1, 17, 5, 5), dict(kernel=(1, 1))),
    ((1, 4, 3, 4, 5), dict(kernel=(2, 2, 3), auto_pad="SAME_UPPER")),
])
def test_plain_conv_geometries(shape, attrs, threads):
    """Grouped, strided, dilated, auto-padded, pointwise and 3-D plain convolutions, per-tensor
    zero point, 7-bit and full-range weights, and repeated plain calls of one layer (its
    attributes and geometry are memoized by value) whose weights change in place."""
    rng = np.random.default_rng([21, len(shape), threads])
    attrs = dict(attrs)
    kernel = attrs.pop("kernel")
    group = attrs.get("group", 1)
    c = shape[1]
    m = 2 * group * 3
    x = rand_int(rng, U8, shape)
    for wdt in DTYPES_8:
        wz = rand_int(rng, wdt, ())
        w = _centered_weights(rng, wdt, (m, c // group) + kernel, wz, 64)
        args = (rand_scale(rng), rand_int(rng, U8, ()), w, rand_scale(rng), wz,
                np.float32(0.9), rand_int(rng, I8, ()))
        for _ in range(2):
            want = oracle.qlinear_conv(x, *args, None, **attrs)
            assert_exact(qlinear.qlinear_conv(x, *args, **attrs), want)
            w[...] = rand_int(rng, wdt, w.shape)          # the same array, now full range
            want = oracle.qlinear_conv(x, *args, None, **attrs)
            assert_exact(qlinear.qlinear_conv(x, *args, **attrs), want)
            w[...] = _centered_weights(rng, wdt, w.shape, wz, 64)


# ---------------------------------------------------------------------------------------------
# Prepared forms: a call repeating the last one's parameter objects skips re-validation
# ---------------------------------------------------------------------------------------------

def test_prepared_repeat_calls_stay_exact_and_validated():
    """A prepared call whose parameters are the very same immutable objects as the last
    call's reuses its arguments; anything else takes the full path: new values of x, mutated
    0-d parameter arrays, another dtype, another shape, a non-contiguous x, a lowered size
    limit, another ISA level, bad inputs (the same errors as the first call)."""
    rng = np.random.default_rng(22)
    w, wz = rand_int(rng, I8, (6, 4, 3, 3)), np.int8(0)
    ws, xs, ys, xz, yz = np.float32(0.02), np.float32(0.05), np.float32(0.7), np.uint8(9), np.int8(-3)
    pc = qlinear.prepare_qlinear_conv(w, ws, wz, pads=[1, 1, 1, 1])
    pi = qlinear.prepare_conv_integer(w, wz, pads=[1, 1, 1, 1])
    b, bs, bz = rand_int(rng, I8, (30, 7)), np.float32(0.03), np.int8(1)
    pq = qlinear.prepare_qlinear_matmul(b, bs, bz)
    pm = qlinear.prepare_matmul_integer(b, bz)
    for _ in range(3):
        x = rand_int(rng, U8, (2, 4, 5, 6))
        assert_exact(pc.run(x, xs, xz, ys, yz), oracle.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, pads=[1, 1, 1, 1]))
        assert_exact(pi.run(x, xz), oracle.conv_integer(x, w, xz, wz, pads=[1, 1, 1, 1]))
        a = rand_int(rng, U8, (3, 5, 30))
        assert_exact(pq.run(a, xs, xz, ys, yz), oracle.qlinear_matmul(a, xs, xz, b, bs, bz, ys, yz))
        assert_exact(pm.run(a, xz), oracle.matmul_integer(a, b, xz, bz))
    # a 0-d array parameter changed in place between calls
    xza = np.array(9, dtype=np.uint8)
    x, a = rand_int(rng, U8, (2, 4, 5, 6)), rand_int(rng, U8, (3, 5, 30))
    for value in (9, 200):
        xza[...] = value
        assert_exact(pc.run(x, xs, xza, ys, yz), oracle.qlinear_conv(x, xs, xza, w, ws, wz, ys, yz, pads=[1, 1, 1, 1]))
        assert_exact(pi.run(x, xza), oracle.conv_integer(x, w, xza, wz, pads=[1, 1, 1, 1]))
        assert_exact(pq.run(a, xs, xza, ys, yz), oracle.qlinear_matmul(a, xs, xza, b, bs, bz, ys, yz))
        assert_exact(pm.run(a, xza), oracle.matmul_integer(a, b, xza, bz))
    # parameters as fresh NumPy scalars every call, equal or changing values: the repeat path
    # takes equal ones (same type, same value), anything else the full path
    for value, scale in ((9, 0.05), (9, 0.05), (200, 0.05), (200, 0.5), (9, 0.05)):
        args = (np.float32(scale), np.uint8(value), np.float32(0.7), np.int8(-3))
        assert_exact(pc.run(x, *args), oracle.qlinear_conv(x, args[0], args[1], w, ws, wz, args[2], args[3],
                                                           pads=[1, 1, 1, 1]))
        assert_exact(pi.run(x, np.uint8(value)), oracle.conv_integer(x, w, np.uint8(value), wz, pads=[1, 1, 1, 1]))
        assert_exact(pq.run(a, *args), oracle.qlinear_matmul(a, args[0], args[1], b, bs, bz, args[2], args[3]))
    # the same values in another type: float64 scales compute in float32 all the same, a uint8
    # y zero point makes the output uint8
    y8 = pq.run(a, np.float64(0.05), np.uint8(9), np.float32(0.7), np.uint8(3))
    assert y8.dtype == U8
    assert_exact(y8, oracle.qlinear_matmul(a, np.float64(0.05), np.uint8(9), b, bs, bz, np.float32(0.7), np.uint8(3)))
    with pytest.raises(ValueError, match="scale"):
        pq.run(a, np.float32("nan"), np.uint8(9), np.float32(0.7), np.int8(-3))
    # MatMulInteger's zero point as a fresh NumPy scalar every call (its repeat path reads the
    # value each time); one of another dtype takes the full path and its error
    for value in (9, 200, 0, 255, 9):
        assert_exact(pm.run(a, np.uint8(value)), oracle.matmul_integer(a, b, np.uint8(value), bz))
    with pytest.raises(TypeError, match="a_zero_point must have the dtype of a"):
        pm.run(a, np.int8(9))
    pc.run(x, xs, xz, ys, yz), pq.run(a, xs, xz, ys, yz), pm.run(a, xz), pi.run(x, xz)
    # another shape, a non-contiguous input, an int8 input with the same parameter objects
    x2, a2 = rand_int(rng, U8, (1, 4, 8, 3)), rand_int(rng, U8, (4, 30))
    assert_exact(pc.run(x2, xs, xz, ys, yz), oracle.qlinear_conv(x2, xs, xz, w, ws, wz, ys, yz, pads=[1, 1, 1, 1]))
    assert_exact(pq.run(a2, xs, xz, ys, yz), oracle.qlinear_matmul(a2, xs, xz, b, bs, bz, ys, yz))
    xt = rand_int(rng, U8, (2, 4, 6, 5)).transpose(0, 1, 3, 2)
    assert_exact(pc.run(xt, xs, xz, ys, yz), oracle.qlinear_conv(xt, xs, xz, w, ws, wz, ys, yz, pads=[1, 1, 1, 1]))
    at = rand_int(rng, U8, (4, 30, 4)).transpose(0, 2, 1)[:, :3]
    assert_exact(pm.run(at, xz), oracle.matmul_integer(at, b, xz, bz))
    with pytest.raises(TypeError, match="x_zero_point must have the dtype of x"):
        pc.run(x2.view(I8), xs, xz, ys, yz)
    with pytest.raises(TypeError, match="a_zero_point must have the dtype of a"):
        pm.run(a.view(I8), xz)
    with pytest.raises(TypeError, match="qlinear_conv: x must not be a masked array"):
        pc.run(np.ma.masked_array(x2), xs, xz, ys, yz)
    with pytest.raises(TypeError, match="qlinear_matmul: a must be a NumPy array"):
        pq.run(a2.tolist(), xs, xz, ys, yz)
    # a lowered size limit is checked again
    from qlinear import _validate
    pc.run(x2, xs, xz, ys, yz), pq.run(a2, xs, xz, ys, yz)
    saved = _validate.max_output_bytes()
    try:
        qlinear.set_max_output_bytes(16)
        with pytest.raises(ValueError, match="above the limit"):
            pq.run(a2, xs, xz, ys, yz)
    finally:
        qlinear.set_max_output_bytes(saved)
    # another ISA level between two calls
    from qlinear import _native
    if _native.available():
        for isa in qlinear.engine_info()["isas"]:
            with _native.use_isa(isa):
                assert_exact(pc.run(x2, xs, xz, ys, yz), oracle.qlinear_conv(x2, xs, xz, w, ws, wz, ys, yz, pads=[1, 1, 1, 1]))
                assert_exact(pq.run(a2, xs, xz, ys, yz), oracle.qlinear_matmul(a2, xs, xz, b, bs, bz, ys, yz))


@pytest.mark.parametrize("xdt", DTYPES_8)
@pytest.mark.parametrize("wdt", DTYPES_8)
def test_plain_conv_weights_just_past_the_bound_are_exact(xdt, wdt, threads):
    """The case the 7-bit bound exists for: x at its largest u8-form value everywhere and a
    pair of adjacent weights (k = 0, 1 of a row) 65 and 64 above (below) the zero point, whose
    byte-kernel pair sum 255·65 + 255·64 = 32895 would leave int16. A plain call must see the
    65 and take the exact kernel; with 64 and 64 the fast path is exact (32640)."""
    rng = np.random.default_rng([23, xdt is U8, wdt is U8, threads])
    m, c = 40, 80
    x = np.full((1, c, 6, 6), 255 if xdt == U8 else 127, dtype=xdt)
    wz = np.uint8(128) if wdt == U8 else np.int8(0)
    for sign in (1, -1):
        for first in (64, 65):
            w = _centered_weights(rng, wdt, (m, c, 1, 2), wz, 64)
            row = int(rng.integers(m))
            v0 = int(wz) + sign * first
            if not np.iinfo(wdt).min <= v0 <= np.iinfo(wdt).max:
                continue
            w[row, 0, 0, 0], w[row, 0, 0, 1] = v0, int(wz) + sign * 64
            want = oracle.conv_integer(x, w, None, wz)
            assert_exact(qlinear.conv_integer(x, w, None, wz), want)
            assert_exact(qlinear.prepare_conv_integer(w, wz).run(x), want)



def _plain_twice(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs):
    """QLinearConv and ConvInteger plain, each called twice (the second call takes the lean
    path, one native crossing), and the prepared form, all against the oracle."""
    want = oracle.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs)
    want_i = oracle.conv_integer(x, w, xz, wz, **attrs)
    for _ in range(2):
        assert_exact(qlinear.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, bias, **attrs), want)
        assert_exact(qlinear.conv_integer(x, w, xz, wz, **attrs), want_i)
    assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, bias, **attrs).run(x, xs, xz, ys, yz), want)


# Channels per group around the packed forms' k-groups (2 int16 values, 4 bytes: the grouped
# order's blocks, padded when Cg is not a multiple) and the tap counts the packer unrolls (3, 9,
# 27, 49) or not (2, 25), 1-D to 3-D
@pytest.mark.parametrize("cg,kernel", [(1, (3, 3)), (2, (3,)), (3, (7, 7)), (4, (3, 3)), (5, (2,)), (6, (3, 3)),
                                       (7, (5, 5)), (8, (3, 3, 3)), (12, (3, 3)), (17, (3,)), (36, (3, 3))])
def test_plain_conv_grouped_order_channels_and_taps(cg, kernel, threads):
    """Weights packed in the grouped order (kpack channels at one tap per k-group, channels
    padded with the zero point), straight from w: 7-bit and full-range weights (both native
    kernels), per-channel zero points, both weight types, one group and three."""
    rng = np.random.default_rng([27, cg, len(kernel), kernel[0], threads])
    spatial = tuple(k + 3 for k in kernel)
    for group in (1, 3):
        m = 5 * group
        x = rand_int(rng, U8, (1, cg * group) + spatial)
        for wdt in DTYPES_8:
            wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
            args = dict(group=group, pads=[1] * len(kernel) + [0] * len(kernel))
            xs, ws, ys = rand_scale(rng), rand_scale(rng, (m,)), np.float32(rng.uniform(0.5, 4.0))
            xz, yz = rand_int(rng, U8, ()), rand_int(rng, I8, ())
            bias = rand_int(rng, np.int32, (m,), -50000, 50000)
            for w in (_centered_weights(rng, wdt, (m, cg) + kernel, wz, 64), rand_int(rng, wdt, (m, cg) + kernel)):
                _plain_twice(x, xs, xz, w, ws, wz, ys, yz, bias, **args)


# M·K around the size from which a plain call's weights are packed by the threads (conv.c's
# pack_w_threads: 2^15 weights), rows not a multiple of the tasks' blocks, 3x3 (the grouped
# order) and 1x1
@pytest.mark.parametrize("m,c,kernel", [(91, 40, (3, 3)), (8, 456, (3, 3)), (128, 256, (1, 1)), (113, 290, (1, 1)),
                                        (37, 1000, (1, 1))])
def test_plain_conv_pack_split_around_the_threads_threshold(m, c, kernel, threads, engine_level):
    """Packing shared by the threads (or not): 7-bit weights (the fast form), one weight past
    the bound in the first or the last row (every thread's work abandoned for the
    exact form), full-range weights, per-channel zero points that differ, both weight types."""
    if engine_level == "numpy":
        pytest.skip("the native engine's packing (the NumPy engine has none)")
    rng = np.random.default_rng([32, m, c, kernel[0], threads])
    x = rand_int(rng, U8, (1, c, 4, 3))
    for wdt in DTYPES_8:
        wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
        xs, ws, ys = rand_scale(rng), rand_scale(rng, (m,)), np.float32(rng.uniform(0.5, 4.0))
        xz, yz = rand_int(rng, U8, ()), rand_int(rng, I8, ())
        w7 = _centered_weights(rng, wdt, (m, c) + kernel, wz, 64)
        weights = [w7]
        for row in (0, m - 1):
            w = w7.copy()
            z = int(wz[row])
            w[row, -1, -1, -1] = z + 65 if z + 65 <= np.iinfo(wdt).max else z - 65
            weights.append(w)
        weights.append(rand_int(rng, wdt, (m, c) + kernel))
        for w in weights:
            _plain_twice(x, xs, xz, w, ws, wz, ys, yz, None, pads=[1, 1, 0, 0])


# The exact form's weights packed inside the implicit GEMM's tasks (conv.c's ig_gemm_task, each
# task its row block): row blocks of one and several tasks (Mg of 8 to 300 rows, L2-sized
# blocks of 18 rows at K = 6336), K blocked (6336 > 2 * 3072) or not, the grouped order and
# 1x1, two and three groups (each group's rows), stride 2, a batch (images in parallel on two
# threads: packed whole first).
# (The other fallback, a workspace limit the copy fits but not the tasks' scratch, needs a copy
# near the native engine's 16 MiB floor of the limit: not exercised here.)
@pytest.mark.parametrize("n,c,m,hw,kernel,stride,group", [
    (1, 16, 8, 9, (3, 3), 1, 1), (1, 64, 300, 5, (3, 3), 1, 1), (1, 704, 20, 4, (3, 3), 1, 1),
    (1, 96, 70, 6, (1, 1), 1, 1), (1, 40, 38, 11, (3, 3), 2, 2), (4, 32, 64, 10, (3, 3), 1, 1),
    (1, 6, 9, 10, (3, 3), 1, 3)])
def test_plain_conv_weights_packed_in_the_gemm_tasks(n, c, m, hw, kernel, stride, group, threads, engine_level):
    """A plain call's full-range weights (the exact form) packed by the GEMM tasks that use them
    give the oracle's answer and the prepared form's, per-channel zero points that differ, both
    weight types; on the native levels whose exact kernel has the implicit path the in-task
    packing is taken (conv_in_task_packs counts it) where the batch runs one image at a time."""
    if engine_level == "numpy":
        pytest.skip("the native engine's packing (the NumPy engine has none)")
    rng = np.random.default_rng([35, n, c, m, hw, threads])
    x = rand_int(rng, U8, (n, c, hw, hw))
    pads = [kernel[0] // 2] * 4
    native = engine_level not in (None, "numpy")
    C = None
    if native:
        from qlinear import _native
        C = _native._C
        info = C.kernel_info(C.get_isa(), 0)
    for wdt in DTYPES_8:
        w = rand_int(rng, wdt, (m, c // group) + kernel)
        w.flat[0], w.flat[-1] = np.iinfo(wdt).min, np.iinfo(wdt).max
        wz = rand_int(rng, wdt, (m,))
        xs, ws, ys = rand_scale(rng), rand_scale(rng, (m,)), np.float32(rng.uniform(0.5, 4.0))
        xz, yz = rand_int(rng, U8, ()), rand_int(rng, U8, ())
        before = C.conv_in_task_packs() if native else 0
        _plain_twice(x, xs, xz, w, ws, wz, ys, yz, None, pads=pads, strides=[stride, stride], group=group)
        if native and info["form"] == "i16" and (n == 1 or threads == 1):
            assert C.conv_in_task_packs() > before


# The fast form's weights packed in the implicit GEMM's first copy job (conv.c's
# ig_copy_pack_task): 3x3 (the grouped order, the SIMD packers), 1x1 and 1-D / 3-D kernels, two
# groups (every group's rows in the first group's job), stride 2, rows around the packing's
# tasks; the weights within the level's bound, or one weight just past it in the first or the
# last row (the attempt abandoned after the copy tasks began: the exact form runs, y untouched).
@pytest.mark.parametrize("c,m,spatial,kernel,stride,group", [
    (64, 40, (9, 9), (3, 3), 1, 1), (256, 96, (6, 6), (3, 3), 2, 1), (48, 24, (7, 7), (3, 3), 1, 2),
    (96, 70, (8, 8), (1, 1), 1, 1), (40, 33, (30,), (3,), 1, 1), (16, 20, (4, 5, 6), (3, 3, 3), 1, 1)])
def test_plain_conv_weights_packed_in_the_copy_job(c, m, spatial, kernel, stride, group, threads, engine_level):
    """A plain call's fast-path weights packed while the input is copied: the oracle's answer
    and the prepared form's, per-channel zero points that differ, both weight types, both x
    types; on the levels with a convolution fast path the lean (second) calls take the copy-job
    packing (conv_copy_job_packs counts the ones that ran) unless a weight is past the bound."""
    if engine_level == "numpy":
        pytest.skip("the native engine's packing (the NumPy engine has none)")
    from qlinear import _native
    C = _native._C
    fast = C.kernel_info(C.get_isa(), 2)
    bound = fast["s8_bound"] if fast and fast["form"] == "s8u8" else 0
    rng = np.random.default_rng([61, c, m, len(spatial), stride, group, threads])
    nd = len(kernel)
    args = dict(group=group, strides=[stride] * nd, pads=[k // 2 for k in kernel] * 2)
    for xdt, wdt in ((U8, I8), (I8, U8), (U8, U8), (I8, I8)):
        x = rand_int(rng, xdt, (1, c) + spatial)
        wz = rand_int(rng, wdt, (m,), -40 if wdt == I8 else 90, 40 if wdt == I8 else 165)
        xs, ws, ys = rand_scale(rng), rand_scale(rng, (m,)), np.float32(rng.uniform(0.5, 4.0))
        xz, yz = rand_int(rng, xdt, ()), rand_int(rng, U8, ())
        bias = rand_int(rng, np.int32, (m,), -50000, 50000)
        shape = (m, c // group) + kernel
        w_in = _centered_weights(rng, wdt, shape, wz, min(bound, 127) if bound else 64)
        cases = [(w_in, wz, True)]
        if bound:
            info = np.iinfo(wdt)
            for row in (0, m - 1):
                w, wzr = w_in.copy(), wz.copy()
                # w - z just past the bound: bound + 1 or -(bound + 1) (64: either), 128 (the
                # int8 store's top) or -129; where the row's zero point allows none (uint8 at
                # 128 against 128), that zero point one lower and w - z = 128
                z = int(wz[row])
                hi = z + (bound + 1 if bound < 127 else 128)
                v = hi if hi <= info.max else z - bound - 1
                if v < info.min:
                    wzr[row] = z - 1
                    v = z - 1 + 128
                w.flat[row * w[0].size + w[0].size // 2] = v
                cases.append((w, wzr, False))
        for w, wz, fits in cases:
            before = C.conv_copy_job_packs()
            _plain_twice(x, xs, xz, w, ws, wz, ys, yz, bias, **args)
            ran = C.conv_copy_job_packs() - before
            if bound and fits:
                assert ran >= 2, ran   # at least the lean (second) QLinearConv and ConvInteger calls
            else:
                assert ran == 0, ran


# The fast form packed in the GEMM tasks, one task per row block (conv.c's affine schedule)
# where no weight can be past the bound (int8 weights at zero point 0, uint8 at 128, on the
# VNNI levels): row blocks fewer than the threads' multiple (8 rows), many (300 rows), K blocked
# (704 channels of 3x3), 1x1, stride 2, two groups (each group's rows and per-row terms), a
# batch (images in parallel: packed whole first).
@pytest.mark.parametrize("n,c,m,hw,kernel,stride,group", [
    (1, 16, 8, 9, (3, 3), 1, 1), (1, 64, 300, 5, (3, 3), 1, 1), (1, 704, 40, 4, (3, 3), 1, 1),
    (1, 96, 70, 6, (1, 1), 1, 1), (1, 40, 38, 11, (3, 3), 2, 2), (3, 32, 64, 10, (3, 3), 1, 1)])
def test_plain_conv_centered_weights_packed_in_the_gemm_tasks(n, c, m, hw, kernel, stride, group, threads,
                                                              engine_level):
    """Full-range weights at the type's center zero point (every w - z an int8: the VNNI
    levels' fast form needs no proof), per tensor and per channel, biases near the wrap, both x
    types: the oracle's answer; on levels whose fast kernel takes any int8 the in-task packing
    runs for one image at a time (conv_in_task_packs counts it)."""
    if engine_level == "numpy":
        pytest.skip("the native engine's packing (the NumPy engine has none)")
    from qlinear import _native
    C = _native._C
    fast = C.kernel_info(C.get_isa(), 2)
    any_int8 = bool(fast) and fast["form"] == "s8u8" and fast["s8_bound"] >= 128
    rng = np.random.default_rng([62, n, c, m, hw, threads])
    pads = [kernel[0] // 2] * 4
    for xdt, wdt in ((U8, I8), (I8, U8), (U8, U8), (I8, I8)):
        x = rand_int(rng, xdt, (n, c, hw, hw))
        w = rand_int(rng, wdt, (m, c // group) + kernel)
        w.flat[0], w.flat[-1] = np.iinfo(wdt).min, np.iinfo(wdt).max
        center = 0 if wdt == I8 else 128
        for wz in (np.array(center, dtype=wdt), np.full((m,), center, dtype=wdt)):
            xs, ws, ys = rand_scale(rng), rand_scale(rng, wz.shape), np.float32(rng.uniform(0.5, 4.0))
            xz, yz = rand_int(rng, xdt, ()), rand_int(rng, U8, ())
            bias = rand_int(rng, np.int32, (m,), 2**31 - 40000, 2**31 - 1)
            before = C.conv_in_task_packs()
            _plain_twice(x, xs, xz, w, ws, wz, ys, yz, bias, pads=pads, strides=[stride, stride], group=group)
            if any_int8 and (n == 1 or threads == 1):
                assert C.conv_in_task_packs() > before


@pytest.mark.parametrize("xdt,wdt,ydt", ALL_8BIT_COMBOS)
def test_plain_conv_lean_path_all_types(xdt, wdt, ydt, threads):
    """Every type combination through the lean path (module.c's conv_plain) with per-tensor and
    per-channel parameters, 7-bit and full-range weights, a grouped-order 3x3 layer large enough
    (M·K >= 2^15) for the packing to be shared by the threads and a pointwise one."""
    rng = np.random.default_rng([28, xdt is U8, wdt is U8, ydt is U8, threads])
    for m, c, kernel in ((64, 456, (3, 3)), (24, 40, (1, 1))):
        x = rand_int(rng, xdt, (1, c, 4, 5))
        for per_channel in (False, True):
            if per_channel:
                wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
                ws = rand_scale(rng, (m,))
            else:
                wz, ws = rand_int(rng, wdt, ()), rand_scale(rng)
            xs, ys = rand_scale(rng), np.float32(rng.uniform(0.5, 4.0))
            xz, yz = rand_int(rng, xdt, ()), rand_int(rng, ydt, ())
            bias = rand_int(rng, np.int32, (m,), -50000, 50000)
            for w in (_centered_weights(rng, wdt, (m, c) + kernel, wz, 64), rand_int(rng, wdt, (m, c) + kernel)):
                _plain_twice(x, xs, xz, w, ws, wz, ys, yz, bias, pads=[1, 0, 0, 1])


@pytest.mark.parametrize("kernel", [(3, 3), (5, 5), (1, 2)])
def test_plain_depthwise_lean_path(kernel, threads):
    """Depthwise plain calls (the lean path centers the taps and lays out the channels-last
    kernel's form per call): channel counts past a block of 16, odd and even tap counts, both
    weight types, per-channel zero points."""
    rng = np.random.default_rng([29, kernel[0], kernel[1], threads])
    for c in (8, 20, 33):
        x = rand_int(rng, U8, (2, c, 9, 8))
        for wdt in DTYPES_8:
            wz = rand_int(rng, wdt, (c,))
            w = rand_int(rng, wdt, (c, 1) + kernel)
            xs, ws, ys = rand_scale(rng), rand_scale(rng, (c,)), np.float32(rng.uniform(0.05, 0.5))
            _plain_twice(x, xs, rand_int(rng, U8, ()), w, ws, wz, ys, rand_int(rng, U8, ()),
                         rand_int(rng, np.int32, (c,), -9000, 9000), group=c, pads=[1, 0, 2, 1])


def test_plain_multiplier_float32_corners():
    """The lean paths form the requantization multiplier in C (module.c's multiplier, conv_plain):
    float32(float32(x_scale * w_scale) / y_scale) bit for bit as NumPy's float32 arithmetic,
    denormal and zero results included; infinite or NaN results refused (None)."""
    from qlinear import _native
    if not _native.available():
        pytest.skip("the native engine is not built")
    rng = np.random.default_rng(30)
    vals = np.concatenate([rng.uniform(-3, 3, 200), 10.0 ** rng.uniform(-40, 38, 400),
                           [1e-45, 1.4e-45, 1e-38, 3e38, 3.4e38, -0.0, 0.0, 1.0]]).astype(np.float32)
    trip = rng.choice(vals, (3000, 3))
    with np.errstate(all="ignore"):
        want = (trip[:, 0] * trip[:, 1]) / trip[:, 2]
    for (a, b, c), m in zip(trip, want):
        got = _native._C.multiplier(float(a), float(b), float(c))
        if not np.isfinite(m) or c == 0:
            assert got is None, (a, b, c)
        else:
            assert got is not None and np.float32(got).tobytes() == m.tobytes(), (a, b, c, got, m)
    # through the lean path: a multiplier that underflows to a denormal, and one to zero
    x, w = rand_int(rng, U8, (1, 3, 5, 5)), rand_int(rng, I8, (4, 3, 3, 3))
    for xs, ys in ((np.float32(1e-20), np.float32(1e18)), (np.float32(1e-30), np.float32(1e30))):
        _plain_twice(x, xs, np.uint8(3), w, np.float32(0.5), np.int8(1), ys, np.uint8(9), None)


def esize_of(info: dict) -> int:
    """Bytes per packed weight of a kernel form (kernel_info)."""
    return 2 if info["form"] == "i16" else 1


def test_conv_grouped_pack_layout():
    """The grouped order's packed bytes (conv.c's pack_w_grouped, prepared and plain alike)
    against a NumPy construction of the layout conv.c documents: k' = (c / kpack * taps + t) *
    kpack + c % kpack, padding channels centered 0; I16 rows w - zw as int16 (full-range
    weights too: |w - zw| up to 255); the 7-bit form's rows w - zw as int8 followed by the row
    sums and zeros. 3x3 kernels with channel counts that are and are not multiples of the
    k-group: conv_avx2.c's shuffles for 9 taps (where the CPU runs AVX2: both forms) and the
    padded last block."""
    from qlinear import _native
    if not _native.available():
        pytest.skip("the native engine is not built")
    C = _native._C
    rng = np.random.default_rng(31)
    for isa in qlinear.engine_info()["isas"]:
        for which in (0, 2):
            info = C.kernel_info(isa, which)
            if info is None or (info["form"] != "i16" and which != 2):
                continue   # the VNNI levels' exact U8S8 form: covered by the emulated runs
            kpk = info["kpack"]
            for cg, taps in ((4, 9), (6, 9), (3, 49), (8, 2), (5, 25), (12, 27), (3, 3), (1, 9), (2, 9), (5, 9),
                             (33, 9), (64, 9), (128, 9), (64, 1), (64, 81), (96, 9)):
                m, k = 7, cg * taps
                for wdt, full in ((U8, False), (I8, False), (U8, True), (I8, True)):
                    if full and esize_of(info) == 1:
                        continue   # the 7-bit form takes 7-bit weights only
                    wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
                    if full:   # every value, the type's extremes included, against differing zero points
                        wz = rand_int(rng, wdt, (m,))
                        w = rand_int(rng, wdt, (m, k))
                        w[0, 0], w[-1, -1], w[m // 2, k // 2] = np.iinfo(wdt).min, np.iinfo(wdt).max, np.iinfo(wdt).max
                        wz[0], wz[-1] = np.iinfo(wdt).max, np.iinfo(wdt).min
                    else:
                        w = _centered_weights(rng, wdt, (m, k), wz, 64)
                    z32 = wz.astype(np.int32)
                    out = np.empty(C.conv_w_bytes(isa, which, m, k, taps), np.uint8)
                    C.conv_pack_w(isa, which, w, _native.DTYPE_CODES[w.dtype], m, k, taps, z32, out)
                    esize = 2 if info["form"] == "i16" else 1
                    cb = -(-cg // kpk)
                    rows = out.size - (0 if esize == 2 else 8 * m)
                    # conv.c's ql_conv_grouped for kernels with an implicit variant (every one
                    # tested here: avx2-i16, avx2-s8u8, scalar-i16)
                    grouped = taps > 1 and (cg % kpk == 0 or 3 * cb * kpk <= 4 * cg)
                    centered = w.astype(np.int32) - z32[:, None]
                    # a kernel with chunks (amx-s8u8: 16 blocks) packs the channel counts its
                    # chunk divides, k' = ((c / (kpack ch) * taps + t) * ch + c / kpack % ch) *
                    # kpack + c % kpack; the others are its fallback's (qlinear.h, kchunk)
                    ch = info["kchunk"]
                    if ch > 1 and cg % (ch * kpk):
                        assert C.conv_kernel_name(isa, which, k, taps) != info["name"]
                        ch = 1
                    if grouped:
                        src = np.zeros((m, cb * kpk, taps), np.int32)
                        src[:, :cg] = centered.reshape(m, cg, taps)
                        perm = src.reshape(m, cb // ch, ch, kpk, taps).transpose(0, 1, 4, 2, 3).reshape(m, -1)
                    else:
                        perm = centered
                    kp = rows // m // esize
                    want = np.zeros((m, kp), np.int32)
                    want[:, :perm.shape[1]] = perm
                    if esize == 2:
                        assert_exact(out.view(np.int16).reshape(m, kp), want.astype(np.int16))
                    else:
                        assert_exact(out[:rows].view(np.int8).reshape(m, kp), want.astype(np.int8))
                        tail = out[rows:].view(np.int32)
                        assert_exact(tail[:m], centered.sum(axis=1).astype(np.int32))
                        assert_exact(tail[m:], np.zeros(m, np.int32))


def test_conv_grouped_pack_table_packers_match_portable():
    """Each level's SIMD grouped-order packers (ql_gemm_kernel.grouped_*_t9, set where the
    level's tables are defined) write the same bytes as conv.c's portable loops (the kernel's
    table with those entries NULL), for every conv kernel of every level this CPU runs (the
    VNNI levels' byte forms included in the emulated build), full-range weights where the form
    takes them, channel counts around the pairs and blocks of 4 (the SIMD body's tails). The
    AVX2-based levels must have one: a table that lost its packer would pass the bytes check
    and quietly fall back to the slower loops."""
    from qlinear import _native
    if not _native.available():
        pytest.skip("the native engine is not built")
    C = _native._C
    rng = np.random.default_rng(33)
    checked = 0
    for isa in qlinear.engine_info()["isas"]:
        for which in (0, 2):
            info = C.kernel_info(isa, which)
            if info is None:
                continue
            assert info["grouped_t9"] == (isa != "scalar"), (isa, which, info)
            for cg in (1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64, 130):
                m, k, taps = 9, cg * 9, 9
                for wdt in (U8, I8):
                    if which == 2:   # the 7-bit form: w - zw within [-64, 64]
                        wz = rand_int(rng, wdt, (m,), -60 if wdt == I8 else 70, 60 if wdt == I8 else 185)
                        w = _centered_weights(rng, wdt, (m, k), wz, 64)
                    else:
                        wz = rand_int(rng, wdt, (m,))
                        w = rand_int(rng, wdt, (m, k))
                        w[0, 0], w[-1, -1] = np.iinfo(wdt).min, np.iinfo(wdt).max
                        wz[0], wz[-1] = np.iinfo(wdt).max, np.iinfo(wdt).min
                    z32 = wz.astype(np.int32)
                    n = C.conv_w_bytes(isa, which, m, k, taps)
                    got, want = np.full(n, 0xA5, np.uint8), np.full(n, 0x5A, np.uint8)
                    code = _native.DTYPE_CODES[w.dtype]
                    C.conv_pack_w(isa, which, w, code, m, k, taps, z32, got)
                    C.conv_pack_w(isa, which, w, code, m, k, taps, z32, want, True)
                    assert_exact(got, want)
                    checked += 1
    assert checked > 0


def test_conv_huge_dilation_of_a_one_tap_axis():
    """A dilation far beyond the native engine's int64 bounds on an axis with one tap adds nothing
    to the window: plain and prepared calls give the oracle's answer (found by test_hostile's
    fuzz: the native engine used to get the call and refuse the dilation with its own error)."""
    rng = np.random.default_rng(32)
    x, w = rand_int(rng, U8, (1, 2, 3, 4)), rand_int(rng, I8, (3, 2, 1, 2))
    attrs = dict(dilations=[1 << 62, 2])
    want = oracle.conv_integer(x, w, np.uint8(5), None, **attrs)
    for _ in range(2):
        assert_exact(qlinear.conv_integer(x, w, np.uint8(5), **attrs), want)
    assert_exact(qlinear.prepare_conv_integer(w, **attrs).run(x, np.uint8(5)), want)

def test_quantize_dequantize_repeat_calls():
    """Per-tensor Quantize/Dequantize calls repeating the last call's parameter objects go
    straight to the kernel: new x values, a 0-d array parameter changed in place, another x
    dtype or layout, a lowered size limit and bad inputs all still give the contract's answer."""
    rng = np.random.default_rng(24)
    s, z = np.float32(0.05), np.uint8(117)
    for _ in range(3):
        xf = rng.standard_normal((2, 3, 9, 7), dtype=np.float32) * 4
        assert_exact(qlinear.quantize_linear(xf, s, z), oracle.quantize_linear(xf, s, z))
        xq = rand_int(rng, U8, (2, 3, 9, 7))
        assert_exact(qlinear.dequantize_linear(xq, s, z), oracle.dequantize_linear(xq, s, z))
        assert_exact(qlinear.quantize_linear(xf, 0.25), oracle.quantize_linear(xf, 0.25))
        assert_exact(qlinear.dequantize_linear(xq, 0.25), oracle.dequantize_linear(xq, 0.25))
    za = np.array(5, dtype=np.uint8)
    for value in (5, 250):
        za[...] = value
        assert_exact(qlinear.quantize_linear(xf, s, za), oracle.quantize_linear(xf, s, za))
        assert_exact(qlinear.dequantize_linear(xq, s, za), oracle.dequantize_linear(xq, s, za))
    qlinear.dequantize_linear(xq, 0.25), qlinear.quantize_linear(xf, 0.25)
    xi = rand_int(rng, np.int32, (5, 4), -(1 << 30), 1 << 30)
    assert_exact(qlinear.dequantize_linear(xi, 0.25), oracle.dequantize_linear(xi, 0.25))
    assert_exact(qlinear.quantize_linear(xi, 0.25), oracle.quantize_linear(xi, 0.25))
    xt = xf.transpose(0, 1, 3, 2)
    qlinear.quantize_linear(xf, s, z)
    assert_exact(qlinear.quantize_linear(xt, s, z), oracle.quantize_linear(xt, s, z))
    qlinear.dequantize_linear(xq, s, z)
    with pytest.raises(TypeError, match="dequantize_linear: x_zero_point must have the dtype of x"):
        qlinear.dequantize_linear(xq.view(I8), s, z)
    with pytest.raises(TypeError, match="dequantize_linear: x must not be a masked array"):
        qlinear.dequantize_linear(np.ma.masked_array(xq), s, z)
    with pytest.raises(TypeError, match="quantize_linear: x must have type float32, float16, bfloat16, int32; got dtype float64"):
        qlinear.quantize_linear(xf.astype(np.float64), s, z)
    saved = qlinear.max_output_bytes()
    try:
        qlinear.set_max_output_bytes(64)
        with pytest.raises(ValueError, match="above the limit"):
            qlinear.dequantize_linear(xq, s, z)
        with pytest.raises(ValueError, match="above the limit"):
            qlinear.quantize_linear(xf, s, z)
    finally:
        qlinear.set_max_output_bytes(saved)


def _error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


def test_plain_conv_lean_path_same_answers_and_errors():
    """Repeated plain calls of one layer take the lean path (shape-derived plan remembered by
    value); every parameter is still checked per call: a bad one raises exactly the error the
    first (full-path) call raises, and good ones of every accepted form give the oracle's bits."""
    from qlinear import _prepared
    rng = np.random.default_rng(25)
    m = 6
    x = rand_int(rng, U8, (1, 4, 7, 7))
    w = rand_int(rng, I8, (m, 4, 3, 3))
    good = dict(x=x, x_scale=np.float32(0.05), x_zero_point=np.uint8(7), w=w, w_scale=rand_scale(rng, (m,)),
                w_zero_point=rand_int(rng, I8, (m,)), y_scale=np.float32(0.3), y_zero_point=np.int8(2),
                B=rand_int(rng, np.int32, (m,), -900, 900))
    attrs = dict(pads=[1, 1, 0, 2], strides=[1, 2])

    def run(**changes):
        a = {**good, **changes}
        return qlinear.qlinear_conv(a["x"], a["x_scale"], a["x_zero_point"], a["w"], a["w_scale"], a["w_zero_point"],
                                    a["y_scale"], a["y_zero_point"], a["B"], **attrs)

    def want(**changes):
        a = {**good, **changes}
        return oracle.qlinear_conv(a["x"], a["x_scale"], a["x_zero_point"], a["w"], a["w_scale"], a["w_zero_point"],
                                   a["y_scale"], a["y_zero_point"], a["B"], **attrs)

    fine = [dict(), dict(B=None), dict(x_zero_point=np.array(200, dtype=U8)), dict(x_scale=np.array([0.01], np.float32)),
            dict(w_scale=np.float32(0.02), w_zero_point=np.int8(-3)), dict(w_scale=np.array([0.02], np.float32),
                                                                           w_zero_point=np.array([5], np.int8)),
            dict(y_zero_point=np.uint8(130)), dict(y_zero_point=np.array([[4]], np.int8)),
            dict(w=_centered_weights(rng, I8, (m, 4, 3, 3), 0, 64), w_zero_point=np.zeros(m, np.int8)),
            dict(x=rand_int(rng, U8, (1, 4, 7, 7))), dict(x_scale=0.05), dict(x_zero_point=7),
            dict(B=rand_int(rng, np.int32, (2 * m,))[::2])]
    for changes in fine:
        for _ in range(2):      # the second call takes the lean path
            assert_exact(run(**changes), want(**changes))
    bad = [dict(x_scale=np.float32(np.inf)), dict(x_scale=np.float32(np.nan)), dict(y_scale=np.float32(0)),
           dict(y_scale=np.float32(-np.inf)), dict(x_scale=np.float32(3e38), y_scale=np.float32(1e-30)),
           dict(w_scale=np.full(m, np.inf, np.float32)), dict(w_scale=rand_scale(rng, (m + 1,))),
           dict(w_scale=rand_scale(rng, (m,)), w_zero_point=np.int8(0)),
           dict(w_scale=np.float32(0.1), w_zero_point=rand_int(rng, I8, (m,))),
           dict(w_zero_point=rand_int(rng, U8, (m,))), dict(w_zero_point=None), dict(x_zero_point=np.int8(1)),
           dict(x_zero_point=None), dict(x_zero_point=np.array([1, 2], U8)), dict(y_zero_point=5),
           dict(y_zero_point=np.int32(5)), dict(y_zero_point=np.array([1, 2], np.int8)),
           dict(x_scale=np.float64(0.05)), dict(x_scale=np.array([0.1, 0.2], np.float32)),
           dict(B=rand_int(rng, np.int64, (m,), -9, 9)), dict(B=rand_int(rng, np.int32, (m + 1,))),
           dict(B=[1] * m), dict(x=x.astype(I8)), dict(x=np.ma.masked_array(x)), dict(w=w.astype(U8)),
           dict(x_scale=np.ma.masked_array(np.float32(0.05)))]
    for changes in bad:
        run()                                   # the layer's plan is remembered
        warm = _error_of(lambda: run(**changes))
        _prepared.PLAIN.clear()
        cold = _error_of(lambda: run(**changes))
        if cold is None:   # accepted (another valid form): the same bits either way
            assert warm is None
            assert_exact(run(**changes), want(**changes))
        else:
            assert warm == cold, changes
    # ConvInteger: absent zero points, per-channel, a 0-d array changed in place
    z = np.array(3, dtype=U8)
    for value in (3, 250):
        z[...] = value
        for _ in range(2):
            assert_exact(qlinear.conv_integer(x, w, z, **attrs), oracle.conv_integer(x, w, z, **attrs))
            assert_exact(qlinear.conv_integer(x, w, None, good["w_zero_point"], **attrs),
                         oracle.conv_integer(x, w, None, good["w_zero_point"], **attrs))
    qlinear.conv_integer(x, w, z, **attrs)
    warm = _error_of(lambda: qlinear.conv_integer(x, w, np.int8(3), **attrs))
    _prepared.PLAIN.clear()
    assert warm == _error_of(lambda: qlinear.conv_integer(x, w, np.int8(3), **attrs)) is not None
    # depthwise through the lean path
    xd, wd = rand_int(rng, U8, (1, 5, 6, 6)), rand_int(rng, U8, (5, 1, 3, 3))
    for _ in range(2):
        assert_exact(qlinear.conv_integer(xd, wd, np.uint8(4), np.uint8(120), group=5),
                     oracle.conv_integer(xd, wd, np.uint8(4), np.uint8(120), group=5))


def test_plain_matmul_lean_path_same_answers_and_errors():
    """Repeated plain products of one shape take the lean path; every parameter is still
    checked per call (the same errors as the full path's) and every accepted form gives the
    oracle's bits, 1-D and batched operands included."""
    from qlinear import _prepared
    rng = np.random.default_rng(26)
    for a_shape, b_shape in [((9, 40), (40, 13)), ((40,), (40, 13)), ((9, 40), (40,)), ((2, 3, 5, 40), (3, 40, 6))]:
        a, b = rand_int(rng, U8, a_shape), rand_int(rng, I8, b_shape)
        good = dict(a=a, a_scale=np.float32(0.05), a_zero_point=np.uint8(7), b=b, b_scale=np.float32(0.02),
                    b_zero_point=np.int8(-2), y_scale=np.float32(0.3), y_zero_point=np.int8(2))
        names = list(good)

        def run(**changes):
            g = {**good, **changes}
            return qlinear.qlinear_matmul(*(g[k] for k in names))

        def want(**changes):
            g = {**good, **changes}
            return oracle.qlinear_matmul(*(g[k] for k in names))

        fine = [dict(), dict(a_zero_point=np.array(200, dtype=U8)), dict(b_scale=np.array([0.5], np.float32)),
                dict(y_zero_point=np.uint8(130)), dict(b=_seven_bit(rng, I8, b_shape)),
                dict(a=rand_int(rng, U8, a_shape)), dict(a_scale=0.05), dict(b_zero_point=-2),
                dict(a=rand_int(rng, U8, a_shape[:-1] + (80,))[..., ::2])]
        for changes in fine:
            for _ in range(2):
                assert_exact(run(**changes), want(**changes))
            for _ in range(2):
                g = {**good, **changes}
                assert_exact(qlinear.matmul_integer(g["a"], g["b"], g["a_zero_point"], g["b_zero_point"]),
                             oracle.matmul_integer(g["a"], g["b"], g["a_zero_point"], g["b_zero_point"]))
        bad = [dict(a_scale=np.float32(np.inf)), dict(y_scale=np.float32(0)), dict(b_scale=np.float32(np.nan)),
               dict(a_scale=np.float32(3e38), y_scale=np.float32(1e-30)), dict(a_zero_point=np.int8(1)),
               dict(b_zero_point=np.uint8(1)), dict(a_zero_point=None), dict(b_zero_point=None),
               dict(y_zero_point=5), dict(y_zero_point=np.int32(1)), dict(a_scale=np.float64(0.5)),
               dict(b_scale=np.array([0.1, 0.2], np.float32)), dict(a=a.astype(I8)), dict(b=b.astype(U8)),
               dict(a=np.ma.masked_array(a)), dict(y_zero_point=np.array([1, 2], np.int8))]
        for changes in bad:
            run()
            warm = _error_of(lambda: run(**changes))
            _prepared.PLAIN.clear()
            cold = _error_of(lambda: run(**changes))
            if cold is None:
                assert warm is None
                assert_exact(run(**changes), want(**changes))
            else:
                assert warm == cold, changes
        qlinear.matmul_integer(a, b, np.uint8(1), np.int8(2))
        warm = _error_of(lambda: qlinear.matmul_integer(a, b, np.int8(1), np.int8(2)))
        _prepared.PLAIN.clear()
        assert warm == _error_of(lambda: qlinear.matmul_integer(a, b, np.int8(1), np.int8(2))) is not None
