"""qlinear.contrib (onnxruntime's com.microsoft operators) bit for bit against onnxruntime 1.32.

Every quantized operator is compared with onnxruntime's CPU kernel on seeded random inputs
over the full 8-bit range, every attribute and both 8-bit types; u8 x s8 GEMMs keep the int8
operand within [-64, 64] (onnxruntime saturates beyond on AVX2 CPUs without VNNI). The float
arithmetic helpers (fma, cvt) are checked against exact rational arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import qlinear.contrib as c
from qlinear.contrib import _arith
from conftest import I8, U8, assert_exact, rand_int

ort = pytest.importorskip("onnxruntime")
from ms_ort import run_node  # noqa: E402

F = np.float32
EXACT_S8 = (-64, 64)


def scale(rng, lo=1e-3, hi=0.1, shape=()):
    return rng.uniform(lo, hi, size=shape).astype(F)


def zp(rng, dtype, shape=()):
    return rand_int(rng, dtype, shape)


# ----------------------------------------------------------------------------- float helpers


def _round_f32(q: Fraction) -> np.float32:
    """The float32 nearest to an exact rational (ties to even), found among the neighbours of
    the float64 rounding: independent of the fma emulation under test."""
    guess = F(float(q))
    cands = {guess, np.nextafter(guess, F(np.inf)), np.nextafter(guess, F(-np.inf))}
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - q), int(np.asarray(v).view(np.uint32)) & 1))
    return F(best)


def _fma_cases():
    """Products landing near float32 midpoints with a tail below float64's precision: rounding
    x·y + z to float64 first and then to float32 (double rounding) is wrong on them."""
    out = []
    one_ulp = F(2.0 ** -23)
    for e in range(-20, 21, 5):
        k = F(2.0 ** e)
        # z = 1 + 2^-23 (odd significand), x·y = 2^-24 (1 - 2^-46): exact sum just below the
        # midpoint 1 + 2^-23 + 2^-24; float64 rounds it onto the midpoint, float32 then up.
        x, y, z = F(2.0 ** -24) * (F(1) + one_ulp) * k, F(1) - one_ulp, (F(1) + one_ulp) * k
        out += [(x, y, z), (-x, y, -z), (x, -y, -z)]
        out.append((F(2.0 ** -24) * (F(1) - one_ulp) * k, F(1) + one_ulp, k))  # just above a midpoint
    return out


def test_fma_is_single_rounding_on_adversarial_inputs():
    cases = _fma_cases()
    x, y, z = (np.array(v, F) for v in zip(*cases))
    got = _arith.fma(x, y, z)
    naive = (x.astype(np.float64) * y + z).astype(F)
    for i, (a, b, d) in enumerate(cases):
        want = _round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(d)))
        assert got[i].tobytes() == want.tobytes(), (a, b, d, got[i], want)
    assert (naive != got).sum() >= len(cases) // 2  # the cases do defeat double rounding


def test_fma_random_against_exact_rationals():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F)
    y = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F)
    z = np.where(rng.random(3000) < 0.5, -(x.astype(np.float64) * y).astype(F) * F(1.0000001),
                 rng.standard_normal(3000).astype(F))
    got = _arith.fma(x, y, z)
    for i in range(0, 3000, 7):
        want = _round_f32(Fraction(float(x[i])) * Fraction(float(y[i])) + Fraction(float(z[i])))
        assert got[i].tobytes() == want.tobytes()


def test_fma_property_near_midpoints():
    """Hypothesis: z + x·y where x·y is about half an ulp of z, off by a tail far below
    float64's precision (x = ulp(z)/2 · (1 + a·2^-23), y = 1 - b·2^-23): exactly the sums that
    double rounding gets wrong, against exact rational arithmetic."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=500, deadline=None, derandomize=True)
    @given(st.floats(width=32, min_value=2.0 ** -100, max_value=2.0 ** 100), st.integers(-8, 8),
           st.integers(-8, 8), st.booleans(), st.booleans())
    def check(z, a, b, negative_z, negative_x):
        z = F(-z if negative_z else z)
        half_ulp = F(abs(float(np.spacing(z))) / 2)
        x = F(half_ulp * F(1 + a * 2.0 ** -23))
        x = -x if negative_x else x
        y = F(1 - b * 2.0 ** -23)
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        got = _arith.fma(np.array([x]), np.array([y]), np.array([z]))[0]
        assert got.tobytes() == _round_f32(exact).tobytes()

    check()


def test_cvt_is_x86_cvtps2dq():
    v = np.array([0.5, 1.5, -2.5, 2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 128, np.nan, np.inf, -np.inf], F)
    assert _arith.cvt(v).tolist() == [0, 2, -2, -2 ** 31, -2 ** 31, 2 ** 31 - 128, -2 ** 31, -2 ** 31, -2 ** 31]


# ----------------------------------------------------------------------------- binary ops

BROADCASTS = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (5,)), ((5,), (3, 4, 5)), ((3, 1, 5), (3, 4, 1)),
              ((1,), (3, 4)), ((3, 4), ()), ((), (3, 4)), ((2, 3, 1), (2, 3, 1)), ((3, 1), (1, 1)),
              ((1, 1), (3, 1)), ((4, 1), ()), ((1,), (1,)), ((2, 1, 4), (2, 3, 4)), ((2, 3, 4), (1, 3, 1)),
              ((1, 3, 1, 1), (2, 3, 5, 5)), ((400, 400), (400, 400)), ((400, 400), (1, 400))]


def _binary_inputs(rng, dtype, sa, sb):
    a, b = rand_int(rng, dtype, sa), rand_int(rng, dtype, sb)
    return [("A", a), ("As", scale(rng)), ("Az", zp(rng, dtype)), ("B", b), ("Bs", scale(rng)),
            ("Bz", zp(rng, dtype)), ("Cs", scale(rng)), ("Cz", zp(rng, dtype))]


@pytest.mark.parametrize("op,fn", [("QLinearAdd", c.qlinear_add), ("QLinearMul", c.qlinear_mul)])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_binary_matches_ort(op, fn, dtype):
    rng = np.random.default_rng([dtype == I8, op == "QLinearMul", 3])
    for sa, sb in BROADCASTS:
        for _ in range(2):
            ins = _binary_inputs(rng, dtype, sa, sb)
            want = run_node(op, ins, out_dtypes=(dtype,))[0]
            assert_exact(fn(*[v for _, v in ins]), want)


def test_qlinear_add_scalar_input_swaps_roles():
    """Where onnxruntime hands A over as the per-span scalar, A goes second in the fma chain.
    Both orders are evaluated on every (a, b) pair (A of shape (256, 1) is a span scalar, a full
    A is not) until parameters are found where they differ; onnxruntime must side with the
    swapped order there (and this shows the test can fail)."""
    rng = np.random.default_rng(7)
    grid = np.arange(256, dtype=np.uint8)
    a_col, a_full, b_row = grid[:, None], np.repeat(grid[:, None], 256, 1), grid[None, :]
    for _ in range(300):
        params = [scale(rng, 0.01, 1), zp(rng, U8), scale(rng, 0.01, 1), zp(rng, U8), scale(rng, 0.01, 1), zp(rng, U8)]
        sa, za, sb, zb, sc, zc = params
        swapped = c.qlinear_add(a_col, sa, za, b_row, sb, zb, sc, zc)
        plain = c.qlinear_add(a_full, sa, za, b_row, sb, zb, sc, zc)
        rows = np.flatnonzero((swapped != plain).any(axis=1))
        if rows.size:
            break
    else:
        pytest.fail("no parameters found where the two fma orders differ")
    a0 = a_col[rows[:1]]  # shape (1, 1): a scalar span for onnxruntime
    ins = [("A", a0), ("As", sa), ("Az", za), ("B", b_row), ("Bs", sb), ("Bz", zb), ("Cs", sc), ("Cz", zc)]
    want = run_node("QLinearAdd", ins, out_dtypes=(U8,))[0]
    assert_exact(c.qlinear_add(*[v for _, v in ins]), want)
    assert (want[0] != plain[rows[0]]).any()


@pytest.mark.parametrize("dtype", [U8, I8])
def test_binary_int_min_quirk(dtype):
    """A float reaching 2**31 converts to INT_MIN, so the output is the type's minimum."""
    big = np.array([10, 0], dtype)
    z = np.array(0, dtype)
    ins = [("A", big), ("As", F(1)), ("Az", z), ("B", np.array([0, 0], dtype)), ("Bs", F(1)),
           ("Bz", z), ("Cs", F(1e-9)), ("Cz", z)]
    want = run_node("QLinearAdd", ins, out_dtypes=(dtype,))[0]
    got = c.qlinear_add(*[v for _, v in ins])
    assert_exact(got, want)
    assert got[0] == np.iinfo(dtype).min
    a = np.array([np.iinfo(dtype).max], dtype)
    ins = [("A", a), ("As", F(1)), ("Az", z), ("B", a), ("Bs", F(1)), ("Bz", z), ("Cs", F(1e-6)), ("Cz", z)]
    want = run_node("QLinearMul", ins, out_dtypes=(dtype,))[0]
    assert_exact(c.qlinear_mul(*[v for _, v in ins]), want)
    assert want[0] == np.iinfo(dtype).min



def _engines():
    """Every way qlinear computes the element-wise operators here: the NumPy engine and each
    ISA level of the compiled one (scalar = the portable C code, avx2 = its AVX2+FMA kernels)."""
    from qlinear import _native

    out = [("numpy", lambda: _native.use_engine("numpy"))]
    if _native.available():
        out += [(f"native-{isa}", lambda isa=isa: _native.use_isa(isa))
                for isa in _native.engine_info()["isas"]]
    return out


# sizes around the AVX2 kernels' 32-element steps, their tails, and the threaded chunks (64 Ki)
NATIVE_SIZES = [1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 255, 257, 65535, 65537,
                3 * 65536 + 5]


@pytest.mark.parametrize("op,fn", [("QLinearAdd", c.qlinear_add), ("QLinearMul", c.qlinear_mul)])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_binary_sizes_and_engines_match_ort(op, fn, dtype):
    """Full-range operands of every size class, a vector against a vector, a one-element
    operand on either side, and a broadcast that is materialized; tiny and huge output scales
    (values past 2**31 convert to INT_MIN, hence the type's minimum) inside the vector body."""
    rng = np.random.default_rng([dtype == I8, op == "QLinearMul", 5])
    cases = []
    for n in NATIVE_SIZES:
        cases += [((n,), (n,)), ((1,), (n,)), ((n,), ())]
    cases += [((3, 1, 40), (3, 33, 40)), ((2, 17, 1), (1, 17, 9)), ((1,), ()), ((), (1, 1))]
    for i, (sa, sb) in enumerate(cases):
        ins = _binary_inputs(rng, dtype, sa, sb)
        if i % 5 == 3:
            ins[6] = ("Cs", F(1e-9))  # products far beyond 2**31
        elif i % 5 == 4:
            ins[6] = ("Cs", F(50.0))  # everything near the zero point
        want = run_node(op, ins, out_dtypes=(dtype,))[0]
        for name, use in _engines():
            with use():
                got = fn(*[v for _, v in ins])
            assert got.dtype == want.dtype and got.shape == want.shape, (name, sa, sb)
            assert_exact(got, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mul", [0, 1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_native_binary_forms_match_portable_kernel(threads, mul, dtype):
    """The AVX2 kernels, one loop per operand form (two runs, a broadcast first operand, a
    broadcast second operand, both broadcast) and signedness, against the portable C kernel
    (itself checked against onnxruntime above) through the raw entry point: every form at
    sizes around the 32-element step and the 64 Ki threaded chunks, on 1 and 2 threads, with
    output scales that saturate, round near the zero point and overflow int32."""
    from qlinear import _native

    if not _native.available() or "avx2" not in _native.engine_info()["isas"]:
        pytest.skip("needs the native engine with the AVX2 level")
    C = _native._C
    rng = np.random.default_rng([threads, mul, dtype == I8, 21])
    saved = _native.get_num_threads()
    _native.set_num_threads(threads)
    try:
        for n in [1, 31, 32, 33, 64, 95, 97, 65535, 65536 + 33, 2 * 65536 + 7]:
            for ps, qs in [(False, False), (True, False), (False, True), (True, True)]:
                p = rand_int(rng, dtype, (1 if ps else n,)).view(np.uint8)
                q = rand_int(rng, dtype, (1 if qs else n,)).view(np.uint8)
                for f0, f1, f2 in [(0.37, 1.3, -17.25), (1e9, 3e9, 0.5), (0.01, 0.02, 3.0)]:
                    z0, z1 = (int(rng.integers(-128, 128)), int(rng.integers(-128, 128))) if dtype == I8 \
                        else (int(rng.integers(0, 256)), int(rng.integers(0, 256)))
                    outs = {}
                    for isa in ("scalar", "avx2"):
                        out = np.full(n, 77, np.uint8)
                        C.qbinary(isa, mul, p, ps, q, qs, n, f0, f1, f2, z0, z1, dtype == I8, out)
                        outs[isa] = out
                    assert_exact(outs["avx2"], outs["scalar"])
    finally:
        _native.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_table_ops_sizes_and_engines_match_ort(dtype):
    """The 256-entry tables applied by every engine at sizes around the native loop's 4-byte
    steps and the threaded chunks (QLinearSigmoid, QLinearLeakyRelu, QLinearConcat's
    requantization), every input byte present."""
    rng = np.random.default_rng([dtype == I8, 12])
    for n in [63, 64, 65, 67, 256, 1 << 19, (1 << 19) + 3]:
        x = rand_int(rng, dtype, (n,))
        x[:256] = np.arange(256, dtype=np.uint8).view(dtype)[:min(n, 256)] if n >= 256 else x[:256]
        ins = [("X", x), ("Xs", scale(rng, 1e-3, 0.4)), ("Xz", zp(rng, dtype)), ("Ys", scale(rng, 1e-3, 0.05)),
               ("Yz", zp(rng, dtype))]
        want_s = run_node("QLinearSigmoid", ins, out_dtypes=(dtype,))[0]
        want_l = run_node("QLinearLeakyRelu", ins, {"alpha": 0.1}, out_dtypes=(dtype,))[0]
        y_scale, y_zp = scale(rng), zp(rng, dtype)
        cat = [("Ys", y_scale), ("Yz", y_zp), ("X0", x), ("S0", ins[1][1]), ("Z0", ins[2][1]),
               ("X1", x[:5].copy()), ("S1", y_scale), ("Z1", y_zp)]
        want_c = run_node("QLinearConcat", cat, {"axis": 0}, out_dtypes=(dtype,))[0]
        for name, use in _engines():
            with use():
                assert_exact(c.qlinear_sigmoid(*[v for _, v in ins]), want_s)
                assert_exact(c.qlinear_leaky_relu(*[v for _, v in ins], alpha=0.1), want_l)
                assert_exact(c.qlinear_concat(*[v for _, v in cat], axis=0), want_c)

# ----------------------------------------------------------------------------- table ops


@pytest.mark.parametrize("dtype", [U8, I8])
def test_sigmoid_and_leaky_relu_match_ort(dtype):
    rng = np.random.default_rng([dtype == I8, 11])
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(4, 64)  # every input value
    for trial in range(40):
        xs = scale(rng, 1e-3, 0.4)
        ys = F(1 / 256) if trial % 4 == 0 else scale(rng, 1e-3, 0.05)
        ins = [("X", x), ("Xs", xs), ("Xz", zp(rng, dtype)), ("Ys", ys), ("Yz", zp(rng, dtype))]
        assert_exact(c.qlinear_sigmoid(*[v for _, v in ins]), run_node("QLinearSigmoid", ins, out_dtypes=(dtype,))[0])
        alpha = float(rng.choice([0.01, 0.1, rng.uniform(0, 1)]))
        want = run_node("QLinearLeakyRelu", ins, {"alpha": alpha}, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_leaky_relu(*[v for _, v in ins], alpha=alpha), want)


@pytest.mark.parametrize("alpha", [float("inf"), float("-inf"), 1e38, -1e38])
def test_leaky_relu_extreme_alpha_matches_ort_without_floating_point_errors(alpha):
    """An infinite alpha gave the right values but raised FloatingPointError under
    np.errstate(all="raise") (a RuntimeWarning otherwise): the table multiplied alpha by the
    v = 0 entry too (0 · inf), which np.where then discards."""
    dtype = U8
    x = np.arange(256, dtype=np.uint8).reshape(4, 64)
    ins = [("X", x), ("Xs", F(0.05)), ("Xz", U8(128)), ("Ys", F(0.03)), ("Yz", U8(100))]
    want = run_node("QLinearLeakyRelu", ins, {"alpha": alpha}, out_dtypes=(dtype,))[0]
    for name, use in _engines():
        with use(), np.errstate(all="raise"):
            assert_exact(c.qlinear_leaky_relu(*[v for _, v in ins], alpha=alpha), want)


def test_logistic_uses_fma_polynomial():
    """mlas_logistic must match onnxruntime's float Sigmoid (same MLAS kernel) on inputs where
    a correctly rounded or non-FMA sigmoid does not."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-20, 20, 20000), rng.uniform(-1, 1, 20000)]).astype(F)
    want = run_node("Sigmoid", [("x", x)], domain="", out_dtypes=(F,))[0]
    assert_exact(c.elementwise.mlas_logistic(x), want)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_concat_and_where_match_ort(dtype):
    rng = np.random.default_rng([dtype == I8, 13])
    for _ in range(15):
        shape = (2, 3, 4, 5)
        ax = int(rng.integers(-4, 4))
        ys, yz = scale(rng), zp(rng, dtype)
        named, flat = [], []
        for k in range(3):
            s = list(shape)
            s[ax] = int(rng.integers(1, 4))
            xi = rand_int(rng, dtype, tuple(s))
            si, zi = (ys, yz) if k == 1 else (scale(rng), zp(rng, dtype))  # input 1 is copied
            named += [(f"x{k}", xi), (f"s{k}", si), (f"z{k}", zi)]
            flat += [xi, si, zi]
        want = run_node("QLinearConcat", [("Ys", ys), ("Yz", yz)] + named, {"axis": ax}, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_concat(ys, yz, *flat, axis=ax), want)
        cond = rng.integers(0, 2, (3, 1, 5)).astype(bool)
        X, Y = rand_int(rng, dtype, (2, 1, 1, 5)), rand_int(rng, dtype, (4, 5))
        ins = [("c", cond), ("X", X), ("xs", scale(rng)), ("xz", zp(rng, dtype)), ("Y", Y),
               ("ys", ys), ("yz", yz), ("zs", ys), ("zz", yz)]
        want = run_node("QLinearWhere", ins, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_where(*[v for _, v in ins]), want)


# ----------------------------------------------------------------------------- pools


@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool_matches_ort(dtype, channels_last):
    rng = np.random.default_rng([dtype == I8, channels_last, 17])
    for shape in [(1, 3, 7, 7), (2, 5, 4), (1, 4, 2, 3, 5), (1, 8, 33, 33)]:
        x = rand_int(rng, dtype, shape)
        xs = scale(rng, 1e-3, 0.3)
        ins = [("X", x), ("Xs", xs), ("Xz", zp(rng, dtype)), ("Ys", F(xs * rng.uniform(0.3, 2))), ("Yz", zp(rng, dtype))]
        want = run_node("QLinearGlobalAveragePool", ins, {"channels_last": channels_last}, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_global_average_pool(*[v for _, v in ins], channels_last=channels_last), want)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_average_pool_matches_ort(dtype):
    rng = np.random.default_rng([dtype == I8, 19])
    for t in range(120):
        nd = int(rng.integers(1, 4))
        size = [int(s) for s in rng.integers(3, 8, nd)]
        k = [int(min(s, kk)) for s, kk in zip(size, rng.integers(1, 4, nd))]
        auto_pad = str(rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
        attrs = dict(kernel_shape=k, strides=[int(s) for s in rng.integers(1, 3, nd, endpoint=True)],
                     auto_pad=auto_pad, count_include_pad=int(rng.integers(2)), channels_last=int(rng.integers(2)),
                     ceil_mode=int(rng.integers(2)) if auto_pad == "NOTSET" else 0)
        if auto_pad == "NOTSET":
            attrs["pads"] = [int(min(p, kk - 1)) for p, kk in zip(rng.integers(0, 3, 2 * nd), k + k)]
        if t % 8 == 0:  # the whole extent, no padding: onnxruntime's integer global path
            attrs = dict(kernel_shape=size, channels_last=attrs["channels_last"])
        shape = (2, *size, 3) if attrs["channels_last"] else (2, 3, *size)
        xs = scale(rng, 1e-3, 0.3)
        ins = [("X", rand_int(rng, dtype, shape)), ("Xs", xs), ("Xz", zp(rng, dtype)),
               ("Ys", F(xs * rng.uniform(0.3, 2))), ("Yz", zp(rng, dtype))]
        want = run_node("QLinearAveragePool", ins, attrs, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_average_pool(*[v for _, v in ins], **attrs), want)


# ----------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("opset", [12, 13])
def test_softmax_matches_ort(dtype, opset):
    rng = np.random.default_rng([dtype == I8, opset, 23])
    for t in range(40):
        shape = tuple(int(s) for s in rng.integers(1, 6, int(rng.integers(1, 5))))
        if t < 4:
            shape = [(3, 1001), (7, 1), (2, 40, 3), (1,)][t]
        x = rand_int(rng, dtype, shape)
        ys = F(rng.choice([1 / 256, 1 / 255, 0.003, rng.uniform(1e-3, 0.05), rng.uniform(1e-5, 1e-3)]))
        attrs = {"opset": opset}
        if rng.integers(2):
            attrs["axis"] = int(rng.integers(-len(shape), len(shape)))
        ins = [("X", x), ("Xs", scale(rng, 1e-3, 0.5)), ("Xz", zp(rng, dtype)), ("Ys", ys), ("Yz", zp(rng, dtype))]
        want = run_node("QLinearSoftmax", ins, attrs, out_dtypes=(dtype,))[0]
        assert_exact(c.qlinear_softmax(*[v for _, v in ins], **attrs), want)


def test_softmax_rounding_regime_matches_ort():
    """Rows with a few near-maximal entries and small output scales put many e_j · Y / S just
    next to a rounding boundary: float32 instead of double arithmetic there (1283 of 600k
    outputs), or a double instead of a float logarithm in the table (13 of 600k), differ."""
    rng = np.random.default_rng(61)
    for _ in range(60):
        d = int(rng.integers(2, 12))
        x = rand_int(rng, U8, (4000, d))
        x[:, 0] = np.minimum(x[:, 0], x.max(axis=1) - rng.integers(0, 4, 4000))
        ins = [("X", x), ("Xs", scale(rng, 1e-2, 0.5)), ("Xz", zp(rng, U8)),
               ("Ys", scale(rng, 1 / 1000, 1 / 100)), ("Yz", np.uint8(0))]
        want = run_node("QLinearSoftmax", ins, {"opset": 13}, out_dtypes=(U8,))[0]
        assert_exact(c.qlinear_softmax(*[v for _, v in ins], opset=13), want)


# ----------------------------------------------------------------------------- GEMMs

GEMM_TYPES = [(U8, U8), (U8, I8), (I8, I8)]


def _operand(rng, dtype, shape, mixed):
    return rand_int(rng, dtype, shape, *EXACT_S8) if dtype == I8 and mixed else rand_int(rng, dtype, shape)


@pytest.mark.parametrize("adt,bdt", GEMM_TYPES, ids=["u8u8", "u8s8", "s8s8"])
def test_qgemm_matches_ort(adt, bdt):
    rng = np.random.default_rng([GEMM_TYPES.index((adt, bdt)), 29])
    mixed = adt != bdt
    for t in range(40):
        m, k, n = (int(s) for s in rng.integers(1, 20, 3))
        ta, tb = t % 2, (t // 2) % 2
        per_column = (t // 4) % 2 == 1
        quantized = (t // 8) % 2 == 1
        a = rand_int(rng, adt, (k, m) if ta else (m, k))
        b = _operand(rng, bdt, (n, k) if tb else (k, n), mixed)
        bz = _operand(rng, bdt, (n,) if per_column else (), mixed)
        bs = scale(rng, shape=(n,) if per_column else ())
        cshape = [None, (n,), (1, n), (m, n), (m, 1)][t % 5]
        cc = None if cshape is None else rng.integers(-5000, 5000, cshape).astype(np.int32)
        ys, yz = (scale(rng, 0.01, 0.5), zp(rng, adt)) if quantized else (None, None)
        attrs = dict(alpha=float(rng.choice([1.0, 0.5, rng.uniform(0.1, 3)])), transA=ta, transB=tb)
        ins = [("A", a), ("as", scale(rng)), ("az", zp(rng, adt)), ("B", b), ("bs", bs), ("bz", bz),
               ("C", cc), ("ys", ys), ("yz", yz)]
        want = run_node("QGemm", ins, attrs, out_dtypes=(adt if quantized else F,),
                        initializers={"B", "bs", "bz"} if t % 3 == 0 else ())[0]
        assert_exact(c.qgemm(*[v for _, v in ins], **attrs), want)


@pytest.mark.parametrize("adt,bdt", GEMM_TYPES, ids=["u8u8", "u8s8", "s8s8"])
def test_matmul_integer_to_float_and_dynamic_matches_ort(adt, bdt):
    rng = np.random.default_rng([GEMM_TYPES.index((adt, bdt)), 31])
    mixed = adt != bdt
    for t in range(24):
        m, k, n = (int(s) for s in rng.integers(1, 20, 3))
        ashape = (2, m, k) if t % 3 == 0 else (m, k)
        a = rand_int(rng, adt, ashape)
        b = _operand(rng, bdt, (k, n), mixed)
        per_column = t % 2 == 1
        bz = _operand(rng, bdt, (n,) if per_column else (), mixed)
        bs = scale(rng, shape=(n,) if per_column else ())
        bias = rng.standard_normal(n).astype(F) if t % 4 < 2 else None
        ins = [("A", a), ("B", b), ("as", scale(rng)), ("bs", bs), ("az", zp(rng, adt)), ("bz", bz), ("bias", bias)]
        want = run_node("MatMulIntegerToFloat", ins, out_dtypes=(F,), initializers={"B"} if t % 2 else ())[0]
        assert_exact(c.matmul_integer_to_float(*[v for _, v in ins]), want)
        if adt == U8:
            af = (rng.standard_normal(ashape) * rng.uniform(0.1, 10)).astype(F)
            if t % 5 == 0:
                af[...] = 0
            ins = [("A", af), ("B", b), ("bs", bs), ("bz", bz), ("bias", bias)]
            want = run_node("DynamicQuantizeMatMul", ins, out_dtypes=(F,))[0]
            assert_exact(c.dynamic_quantize_matmul(*[v for _, v in ins]), want)


def test_matmul_integer_to_float_per_row_a_scale_matches_ort():
    rng = np.random.default_rng(59)
    a, b = rand_int(rng, U8, (2, 3, 5)), rand_int(rng, U8, (5, 4))
    for a_shape in [(3, 1), (2, 3, 1), (1, 3, 1)]:
        ins = [("A", a), ("B", b), ("as", scale(rng, shape=a_shape)), ("bs", scale(rng, shape=(4,))),
               ("az", zp(rng, U8)), ("bz", zp(rng, U8)), ("bias", rng.standard_normal(4).astype(F))]
        want = run_node("MatMulIntegerToFloat", ins, out_dtypes=(F,))[0]
        assert_exact(c.matmul_integer_to_float(*[v for _, v in ins]), want)
    with pytest.raises(ValueError, match="one per row of A"):
        c.matmul_integer_to_float(a, b, scale(rng, shape=(4,)), F(1))


def test_dynamic_quantize_linear_matches_ort():
    rng = np.random.default_rng(37)
    cases = [np.zeros(5, F), np.full(4, 3.0, F), np.full(4, -2.0, F), np.array([np.nan, 1, -1], F),
             np.array([1e-30, -1e-30], F)]
    cases += [(rng.standard_normal((3, 7)) * rng.uniform(1e-3, 100) + rng.uniform(-5, 5)).astype(F) for _ in range(60)]
    # sizes around the native kernel's vector steps, infinities and NaN inside, 3-D views
    cases += [(rng.standard_normal(n) * 10).astype(F) for n in (1, 15, 16, 17, 33, 1000)]
    cases += [np.array([np.inf, 1, -3, 0.5] * 5, F), np.array([-np.inf, 2, np.nan] * 7, F),
              (rng.standard_normal((2, 6, 5)) * 4).astype(F)[:, ::2]]
    for x in cases:
        want = run_node("DynamicQuantizeLinear", [("x", np.ascontiguousarray(x))], domain="", out_dtypes=(U8, F, U8))
        for _, use in _engines():
            with use():
                got = c.dynamic_quantize_linear(x)
            for g, w in zip(got, want):
                assert_exact(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("dtype", [U8, I8, np.uint16, np.int16])
def test_ms_quantize_dequantize_match_ort(dtype):
    rng = np.random.default_rng([np.dtype(dtype).num, 41])
    wide = np.dtype(dtype).itemsize == 2
    for t in range(12):
        shape = (2, 3, 4, 5)
        ax = int(rng.integers(-4, 4))
        per_axis = t % 2 == 1
        s = scale(rng, 1e-3, 1, (shape[ax],) if per_axis else ())
        z = zp(rng, dtype, (shape[ax],) if per_axis else ())
        x = (rng.standard_normal(shape) * (2e4 if wide else 200)).astype(F)
        x.flat[:4] = [np.nan, np.inf, -np.inf, 0]
        want = run_node("QuantizeLinear", [("x", x), ("s", s), ("z", z)], {"axis": ax}, out_dtypes=(dtype,))[0]
        assert_exact(c.quantize_linear(x, s, z, axis=ax), want)
        xi = rand_int(rng, dtype, shape)
        want = run_node("DequantizeLinear", [("x", xi), ("s", s), ("z", z)], {"axis": ax}, out_dtypes=(F,))[0]
        assert_exact(c.dequantize_linear(xi, s, z, axis=ax), want)


@pytest.mark.parametrize("xdt,wdt", GEMM_TYPES, ids=["u8u8", "u8s8", "s8s8"])
def test_qlinear_conv_channels_last_matches_ort(xdt, wdt):
    rng = np.random.default_rng([GEMM_TYPES.index((xdt, wdt)), 43])
    mixed = xdt != wdt
    for t in range(6):
        group = [1, 2, 4][t % 3]
        cin, m = 4, 4 * (1 + t % 2)
        x = rand_int(rng, xdt, (1, 7, 6, cin))
        w = _operand(rng, wdt, (m, cin // group, 3, 2), mixed)
        wz = np.zeros(m, wdt) if wdt == I8 else zp(rng, wdt, (m,))
        attrs = dict(channels_last=1, group=group, pads=[1, 0, 1, 1], strides=[1, 2], kernel_shape=[3, 2])
        ins = [("x", x), ("xs", F(0.02)), ("xz", zp(rng, xdt)), ("w", w), ("ws", scale(rng, 1e-3, 0.02, (m,))),
               ("wz", wz), ("ys", F(0.3)), ("yz", zp(rng, xdt)), ("B", rng.integers(-1000, 1000, m).astype(np.int32))]
        want = run_node("QLinearConv", ins, attrs, out_dtypes=(xdt,), initializers={"w", "ws", "wz", "B"})[0]
        assert_exact(c.qlinear_conv(*[v for _, v in ins], **attrs), want)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call,err,words", [
    (lambda: c.qlinear_add(np.zeros(3, U8), F(1), None, np.zeros(3, I8), F(1), None, F(1)), TypeError, "B must have the dtype of A"),
    (lambda: c.qlinear_add(np.zeros(3, U8), F(1), None, np.zeros(4, U8), F(1), None, F(1)), ValueError, "broadcast"),
    (lambda: c.qlinear_mul(np.zeros(3, U8), F(1), None, np.zeros(3, U8), F(1), None, F(0)), ValueError, "C_scale must not be zero"),
    (lambda: c.qlinear_sigmoid(np.zeros(3, np.int16), F(1), None, F(1)), TypeError, "X must have dtype"),
    (lambda: c.qlinear_sigmoid(np.zeros(3, U8), np.ones(2, F), None, F(1)), ValueError, "X_scale must be a scalar"),
    (lambda: c.qlinear_concat(F(1), np.uint8(0), np.zeros(3, U8), F(1), axis=0), ValueError, "triples"),
    (lambda: c.qlinear_concat(F(1), np.uint8(0), np.zeros((2, 3), U8), F(1), np.uint8(0),
                              np.zeros((3, 3), U8), F(1), np.uint8(0), axis=1), ValueError, "except along axis"),
    # onnxruntime: "Cannot concatenate scalars" (a 0-d input used to be taken as one element)
    (lambda: c.qlinear_concat(F(1), np.uint8(0), np.uint8(1), F(1), np.uint8(0), np.uint8(2), F(1), np.uint8(0),
                              axis=0), ValueError, "input 0 must have rank >= 1 (onnxruntime cannot concatenate scalars); got a 0-d array"),
    (lambda: c.qlinear_concat(F(1), np.uint8(0), np.zeros(1, U8), F(1), np.uint8(0), np.array(2, U8), F(1), np.uint8(0),
                              axis=0), ValueError, "input 1 must have rank >= 1"),
    (lambda: c.qlinear_where(np.zeros(3, U8), np.zeros(3, U8), F(1), np.uint8(0), np.zeros(3, U8), F(1),
                             np.uint8(0), F(1), np.uint8(0)), TypeError, "condition must be a NumPy bool"),
    (lambda: c.qlinear_global_average_pool(np.zeros((2, 3), U8), F(1), np.uint8(0), F(1), np.uint8(0)), ValueError, "rank >= 3"),
    (lambda: c.qlinear_global_average_pool(np.zeros((1, 1, 2, 2), U8), F(1), np.uint8(0), F(1e-12), np.uint8(0)), ValueError, "outside [2**-32, 256)"),
    (lambda: c.qlinear_average_pool(np.zeros((1, 1, 4, 4), U8), F(1), None, F(1), kernel_shape=[2]), ValueError, "kernel_shape must have 2 values"),
    (lambda: c.qlinear_average_pool(np.zeros((1, 1, 4, 4), U8), F(1), None, F(1), kernel_shape=[2, 2], pads=[2, 0, 0, 0]), ValueError, "smaller than kernel_shape"),
    (lambda: c.qlinear_softmax(np.zeros((2, 3), U8), F(1), None, F(1), None, opset=13), TypeError, "y_zero_point is required"),
    (lambda: c.qlinear_softmax(np.zeros((2, 3), U8), F(1), None, F(1), np.uint8(0), opset=13, axis=2), ValueError, "axis must be in"),
    (lambda: c.qgemm(np.zeros((2, 3), U8), F(1), np.uint8(0), np.zeros((4, 2), U8), F(1), np.uint8(0)), ValueError, "K differs"),
    (lambda: c.qgemm(np.zeros((2, 3), U8), F(1), np.uint8(0), np.zeros((3, 2), U8), np.ones(3, F), np.uint8(0)), ValueError, "one per column of B"),
    (lambda: c.qgemm(np.zeros((2, 3), U8), F(1), np.uint8(0), np.zeros((3, 2), U8), F(1), np.uint8(0), None, F(1)), TypeError, "y_zero_point is required"),
    (lambda: c.qgemm(np.zeros((2, 3), U8), F(1), np.uint8(0), np.zeros((3, 2), U8), F(1), np.uint8(0), np.zeros(3, np.int32)), ValueError, "C must broadcast"),
    (lambda: c.matmul_integer_to_float(np.zeros((2, 3), U8), np.zeros((3, 2), U8), F(1), F(1), None, None, np.zeros(3, F)), ValueError, "bias must be 1-D"),
    (lambda: c.dynamic_quantize_linear(np.zeros(3, np.float64)), TypeError, "x must have dtype float32"),
])
def test_bad_input_names_operator_and_constraint(call, err, words):
    with pytest.raises(err) as info:
        call()
    assert words in str(info.value)
    assert str(info.value).split(":")[0] in {
        "qlinear_add", "qlinear_mul", "qlinear_sigmoid", "qlinear_concat", "qlinear_where",
        "qlinear_global_average_pool", "qlinear_average_pool", "qlinear_softmax", "qgemm",
        "matmul_integer_to_float", "dynamic_quantize_linear"}


def _float_attribute_calls(value):
    x8, x4 = np.zeros((1, 4), U8), np.ones((1, 2, 4), F)
    return {
        "qlinear_leaky_relu alpha": lambda: c.qlinear_leaky_relu(x8, F(0.1), np.uint8(0), F(0.1), np.uint8(0),
                                                                 alpha=value),
        "qgemm alpha": lambda: c.qgemm(x8, F(0.1), np.uint8(0), np.zeros((4, 2), I8), F(0.1), np.int8(0),
                                       alpha=value),
        "skip_layer_normalization epsilon": lambda: c.skip_layer_normalization(x4, x4, np.ones(4, F),
                                                                               epsilon=value),
        "attention scale": lambda: c.attention(x4, np.ones((4, 12), F), num_heads=2, scale=value),
        "attention mask_filter_value": lambda: c.attention(x4, np.ones((4, 12), F), num_heads=2,
                                                           mask_filter_value=value),
    }


@pytest.mark.parametrize("value", ["0.5", None, [0.5], True, 1 + 2j])
@pytest.mark.parametrize("case", list(_float_attribute_calls(0.5)))
def test_float_attributes_must_be_numbers(case, value):
    """A float attribute that is not a real number is a TypeError naming the operator and the
    attribute (a string gave "could not convert string to float: 'x'"; None became NaN and,
    for qgemm, a silent all-NaN output)."""
    op, name = case.split()
    with pytest.raises(TypeError, match=rf"^{op}: attribute {name} must be a real number; got "):
        _float_attribute_calls(value)[case]()
    _float_attribute_calls(np.float32(0.5))[case]()  # a NumPy float is fine
    _float_attribute_calls(1)[case]()                 # and a Python int


@pytest.mark.parametrize("op,call", [
    ("qgemm", lambda a, b: c.qgemm(a, F(0.1), np.uint8(0), b, F(0.1), np.int8(0))),
    ("qgemm", lambda a, b: c.prepare_qgemm(b, F(0.1), np.int8(0)).run(a, F(0.1), np.uint8(0))),
    ("matmul_integer_to_float", lambda a, b: c.matmul_integer_to_float(a, b, F(0.1), F(0.1))),
    ("dynamic_quantize_matmul", lambda a, b: c.dynamic_quantize_matmul(
        np.broadcast_to(F(0), a.shape), b, F(0.1))),
])
def test_product_errors_name_the_contrib_operator(op, call):
    """Errors of the integer product inside QGemm, MatMulIntegerToFloat and
    DynamicQuantizeMatMul name that operator, not the matmul_integer it calls."""
    big_a, big_b = np.broadcast_to(np.uint8(0), (2**20, 1)), np.broadcast_to(np.int8(0), (1, 2**20))
    with pytest.raises(ValueError, match=rf"^{op}: the output's int32 accumulator of shape \(1048576, 1048576\)"):
        call(big_a, big_b)
    with pytest.raises(ValueError, match=rf"^{op}: .*(cannot be multiplied|K differs)"):
        call(np.zeros((2, 3), np.uint8), np.zeros((4, 2), np.int8))


# ----------------------------------------------------------------------------- float operators


def _rel(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(float(np.max(np.abs(want))), 1e-30))


FLOAT_TOL = 2e-6  # relative to the largest output; measured 1e-7 .. 4e-7


def test_float_transformer_operators_within_tolerance():
    rng = np.random.default_rng(47)
    x = (rng.standard_normal((2, 5, 16)) * 3).astype(F)
    bias, gamma, beta = (rng.standard_normal(16).astype(F) for _ in range(3))
    assert _rel(c.gelu(x), run_node("Gelu", [("X", x)])[0]) < FLOAT_TOL
    assert _rel(c.fast_gelu(x, bias), run_node("FastGelu", [("X", x), ("b", bias)])[0]) < FLOAT_TOL
    skip = rng.standard_normal((2, 5, 16)).astype(F)
    want = run_node("SkipLayerNormalization", [("i", x), ("s", skip), ("g", gamma), ("b", beta), ("bias", bias)],
                    {"epsilon": 1e-5}, out_dtypes=(F, F, F, F))
    for g, w in zip(c.skip_layer_normalization(x, skip, gamma, beta, bias, epsilon=1e-5), want):
        assert g.shape == w.shape and _rel(g, w) < FLOAT_TOL
    ids = rng.integers(0, 50, (2, 5)).astype(np.int32)
    words, positions = rng.standard_normal((50, 16)).astype(F), rng.standard_normal((20, 16)).astype(F)
    segments, seg_ids = rng.standard_normal((2, 16)).astype(F), rng.integers(0, 2, (2, 5)).astype(np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    pos = np.tile(np.arange(3, 8, dtype=np.int32), (2, 1))
    for inputs in ([ids, None, words, positions, None, gamma, beta, None, pos],
                   [ids, seg_ids, words, positions, segments, gamma, beta, mask, None]):
        names = ["ids", "seg", "we", "pe", "se", "g", "b", "m", "pid"]
        want = run_node("EmbedLayerNormalization", list(zip(names, inputs)), {"epsilon": 1e-5}, out_dtypes=(F, np.int32, F))
        got = c.embed_layer_normalization(*inputs, epsilon=1e-5)
        assert _rel(got[0], want[0]) < FLOAT_TOL and _rel(got[2], want[2]) < FLOAT_TOL
        assert_exact(got[1], want[1])


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_and_qattention_within_tolerance(unidirectional):
    rng = np.random.default_rng([unidirectional, 53])
    b, s, h, n, past_len = 2, 3, 16, 4, 2
    x = rng.standard_normal((b, s, h)).astype(F)
    w = (rng.standard_normal((h, 3 * h)) * 0.3).astype(F)
    bias = rng.standard_normal(3 * h).astype(F)
    past = rng.standard_normal((2, b, n, past_len, h // n)).astype(F)
    raw_mask = np.ones((b, past_len + s), np.int32)
    raw_mask[1, 0] = 0
    for mask in (None, raw_mask, np.array([4, 5], np.int32), np.array([4, 5, 1, 0], np.int32)):
        for filt in (-10000.0, -3.4028234663852886e38):
            attrs = {"num_heads": n, "unidirectional": unidirectional, "mask_filter_value": filt}
            want = run_node("Attention", [("x", x), ("w", w), ("b", bias), ("m", mask), ("p", past)], attrs, out_dtypes=(F, F))
            for g, wv in zip(c.attention(x, w, bias, mask, past, **attrs), want):
                assert g.shape == wv.shape and _rel(g, wv) < FLOAT_TOL
    xq = rand_int(rng, U8, (b, s, h))
    for wdt in (U8, I8):
        wq = rand_int(rng, wdt, (h, 3 * h), *(EXACT_S8 if wdt == I8 else (None, None)))
        wz = np.zeros((), wdt) if wdt == I8 else zp(rng, wdt)
        attrs = {"num_heads": n, "unidirectional": unidirectional, "mask_filter_value": -3.4028234663852886e38}
        ins = [("x", xq), ("w", wq), ("b", bias), ("xs", F(0.02)), ("ws", F(0.01)), ("m", raw_mask),
               ("xz", zp(rng, U8)), ("wz", wz), ("p", past)]
        want = run_node("QAttention", ins, attrs, out_dtypes=(F, F))
        for g, wv in zip(c.qattention(*[v for _, v in ins], **attrs), want):
            assert g.shape == wv.shape and _rel(g, wv) < FLOAT_TOL


# ----------------------------------------------------------------------------- real models

import os  # noqa: E402
from pathlib import Path  # noqa: E402

import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import qlinear.backend as backend  # noqa: E402
from qlinear.tools import ortsat  # noqa: E402
from conftest import shared_models_dir  # noqa: E402

MODELS = Path(shared_models_dir() or os.environ.get("QLINEAR_MODELS", "shared/models"))


def _model(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"{path} not available (set QLINEAR_MODELS)")
    return path


def _ort_session(model: onnx.ModelProto, all_outputs: bool = False):
    """onnxruntime's normal session (default optimization level), optionally with every node
    output added as a graph output (onnxruntime's own intermediate values)."""
    if all_outputs:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        names = [o for n in model.graph.node for o in n.output if o]
        del model.graph.output[:]
        model.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in names)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _image(model: onnx.ModelProto, seed: int = 0):
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    return {inp.name: np.random.default_rng(seed).random(shape).astype(F)}


@pytest.mark.parametrize("name", ["yolov8n_qoperator_contrib.onnx", "tf_mobilenetv2_ortstatic_qoperator.onnx"])
def test_qoperator_contrib_model_identical_to_onnxruntime(name):
    """QLinearConv (u8 x u8 or in-range weights), QLinearAdd/Mul/Sigmoid/Concat/
    GlobalAveragePool/Softmax: every output bit-identical to onnxruntime's normal session."""
    model = onnx.load(_model(name))
    feeds = _image(model)
    got = backend.prepare(model).run(feeds)
    want = _ort_session(model).run(None, feeds)
    for g, w in zip(got, want):
        assert_exact(g, w)


def _emulated_qgemm(a, a_scale, a_zp, b, b_scale, b_zp, cc, y_scale, y_zp, transB=0, **_):
    """onnxruntime's u8 x s8 QGemm on AVX2 without VNNI: 16-bit saturated pair sums."""
    bt = b.T if transB else b
    pairs = ortsat.pair_saturated_matmul(a, bt)
    acc = ortsat._zp_corrected(pairs, a, bt, np.int64(a_zp), np.int64(b_zp)) + cc
    mult = F(F(F(1) * a_scale) * b_scale) / y_scale
    return _arith.requantize_multiply(acc.astype(F), F(mult), int(y_zp), y_zp.dtype)


def test_qgemm_model_against_onnxruntime():
    """ece_cnn96: QLinearConv and QGemm with full-range int8 weights. Where onnxruntime's u8 x s8
    kernels are exact (VNNI) the outputs are identical; where they saturate (AVX2 without VNNI,
    measured), every quantized node is checked on onnxruntime's own inputs: qlinear's kernel
    equals onnxruntime on the exact ones, and the saturation emulation equals it on the rest."""
    model = onnx.load(_model("ece_cnn96_qoperator_qgemm.onnx"))
    feeds = _image(model)
    rep = backend.prepare(model)
    if not ortsat.onnxruntime_saturates():
        for g, w in zip(rep.run(feeds), _ort_session(model).run(None, feeds)):
            assert_exact(g, w)
        return
    sess = _ort_session(model, all_outputs=True)
    ort_values = {**feeds, **dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))}
    ort_values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    checked = 0
    for node in model.graph.node:
        ins = [ort_values[i] if i else None for i in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        want = ort_values[node.output[0]]
        if node.op_type == "QGemm":
            assert_exact(_emulated_qgemm(*ins, **attrs), want)
            exact = c.qgemm(*ins, alpha=attrs.get("alpha", 1.0), transA=attrs.get("transA", 0),
                            transB=attrs.get("transB", 0))
            assert (exact != want).any()  # the saturation does show here
            checked += 1
        elif node.op_type == "QLinearConv":
            attrs = {k: (val.decode() if isinstance(val, bytes) else val) for k, val in attrs.items()}
            assert_exact(ortsat.emulate_node("QLinearConv", ins, attrs), want)
            checked += 1
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            fn = c.quantize_linear if node.op_type == "QuantizeLinear" else c.dequantize_linear
            assert_exact(fn(*ins), want)
            checked += 1
    assert checked == 5


def _emulated_qattention(x, w, bias, xs, ws, mask, xz, wz, past, *, num_heads, unidirectional=0,
                         mask_filter_value=-10000.0):
    """QAttention with onnxruntime's saturating u8 x s8 Q/K/V product (AVX2 without VNNI)."""
    flat = x.reshape(-1, x.shape[-1])
    acc = ortsat._zp_corrected(ortsat.pair_saturated_matmul(flat, w), flat, w, np.int64(xz), np.int64(wz))
    qkv = acc.astype(F) * F(ws * xs) + bias
    return c.transformer._attention_core("qattention", qkv.reshape(*x.shape[:2], -1).astype(np.float64), num_heads,
                                         mask, past, unidirectional, 0.0, mask_filter_value)


def _gpt2_feeds(batch=2, seq=4, past=3, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int32),
             "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int32), (batch, 1)),
             "attention_mask": np.ones((batch, past + seq), np.int32)}
    feeds["attention_mask"][-1, 0] = 0  # the last row does not attend to the first key
    for i in range(5):
        feeds[f"past_{i}"] = rng.standard_normal((2, batch, 4, past, 8)).astype(F)
    return feeds


def test_dynamic_transformer_model_against_onnxruntime():
    """tiny_gpt2 (onnxruntime's dynamic quantization: EmbedLayerNormalization, QAttention,
    DynamicQuantizeLinear, MatMulInteger, SkipLayerNormalization, FastGelu). The dynamic ranges
    come from float operators, so whole-model outputs may differ by quantization steps; every
    node is checked on onnxruntime's own inputs instead: the integer nodes bit for bit (u8 x s8
    MatMulInteger against the saturation emulation where onnxruntime saturates), the float
    nodes within tolerance. The whole-model outputs are also compared loosely."""
    model = onnx.load(_model("tiny_gpt2_ortdynamic.onnx"))
    feeds = _gpt2_feeds()
    got = backend.prepare(model).run(feeds)
    sess = _ort_session(model, all_outputs=True)
    names = [o.name for o in sess.get_outputs()]
    ort_values = {**feeds, **dict(zip(names, sess.run(None, feeds)))}
    for out, g in zip(model.graph.output, got):
        w = ort_values[out.name]
        assert g.shape == w.shape and _rel(g, w) < 0.1  # a few quantization steps, not a different model
    ort_values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    saturates = ortsat.onnxruntime_saturates()
    counts = {}
    for node in model.graph.node:
        ins = [ort_values[i] if i else None for i in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        outs = [o for o in node.output]
        op = node.op_type
        if op == "DynamicQuantizeLinear":
            for g, o in zip(c.dynamic_quantize_linear(*ins), outs):
                assert_exact(np.asarray(g), np.asarray(ort_values[o]))
        elif op == "MatMulInteger":
            a, b, az, bz = ins
            if saturates and a.dtype == U8 and b.dtype == I8:
                pairs = ortsat.pair_saturated_matmul(a.reshape(-1, a.shape[-1]), b)
                want = ortsat._zp_corrected(pairs, a.reshape(-1, a.shape[-1]), b, np.int64(az), np.int64(bz))
                want = want.astype(np.int32).reshape(ort_values[outs[0]].shape)
                assert_exact(want, ort_values[outs[0]])
            else:
                import qlinear
                assert_exact(qlinear.matmul_integer(a, b, az, bz), ort_values[outs[0]])
        elif op == "QAttention":
            kw = {k: attrs[k] for k in ("num_heads", "unidirectional", "mask_filter_value") if k in attrs}
            x, w = ins[0], ins[1]
            if saturates and x.dtype == U8 and w.dtype == I8:  # the Q/K/V GEMM saturates
                got = _emulated_qattention(*ins, **kw)
            else:
                got = c.qattention(*ins, **kw)
            for g, o in zip(got, outs):
                assert _rel(g, ort_values[o]) < FLOAT_TOL
        elif op in ("EmbedLayerNormalization", "SkipLayerNormalization"):
            fn = c.embed_layer_normalization if op == "EmbedLayerNormalization" else c.skip_layer_normalization
            for g, o in zip(fn(*ins, epsilon=attrs["epsilon"]), outs):
                if o:
                    assert _rel(g, ort_values[o]) < FLOAT_TOL
        elif op == "FastGelu":
            assert _rel(c.fast_gelu(*ins), ort_values[outs[0]]) < FLOAT_TOL
        else:
            continue
        counts[op] = counts.get(op, 0) + 1
    assert counts == {"DynamicQuantizeLinear": 21, "MatMulInteger": 16, "QAttention": 5,
                      "EmbedLayerNormalization": 1, "SkipLayerNormalization": 10, "FastGelu": 5}


# ----------------------------------------------------------------------------- backend


def _ms_model(node, inputs, outputs, initializers=()):
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_backend_weight_fed_as_input_is_not_cached_stale():
    """A QGemm weight given as a graph input and reused with new values gives the new result;
    a constant weight is prepared once and reused."""
    T = onnx.TensorProto
    node = helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz"], ["y"], domain="com.microsoft", transB=1)
    consts = [numpy_helper.from_array(np.asarray(v), n) for v, n in
              [(F(0.1), "as"), (np.uint8(3), "az"), (F(0.2), "bs"), (np.uint8(5), "bz")]]
    m = _ms_model(node, [helper.make_tensor_value_info("a", T.UINT8, [2, 4]), helper.make_tensor_value_info("b", T.UINT8, [3, 4])],
                  [helper.make_tensor_value_info("y", T.FLOAT, None)], consts)
    rep = backend.prepare(m)
    rng = np.random.default_rng(67)
    a, b = rand_int(rng, U8, (2, 4)), rand_int(rng, U8, (3, 4))
    first = rep.run({"a": a, "b": b})[0]
    b[...] = rand_int(rng, U8, (3, 4))  # the same buffer, new values
    assert_exact(rep.run({"a": a, "b": b})[0], c.qgemm(a, F(0.1), np.uint8(3), b, F(0.2), np.uint8(5), transB=1))
    assert not np.array_equal(first, rep.run({"a": a, "b": b})[0])
    consts.append(numpy_helper.from_array(b.copy(), "b"))
    m = _ms_model(node, [helper.make_tensor_value_info("a", T.UINT8, [2, 4])], [helper.make_tensor_value_info("y", T.FLOAT, None)], consts)
    rep = backend.prepare(m)
    rep.run({"a": a})
    node_rt = [n for n in rep.evaluator.rt_nodes_ if n.onnx_node.op_type == "QGemm"][0]
    prepared = node_rt._prepared
    assert prepared is not None
    assert_exact(rep.run({"a": a})[0], c.qgemm(a, F(0.1), np.uint8(3), b, F(0.2), np.uint8(5), transB=1))
    assert node_rt._prepared is prepared


def _ort_model_run(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_backend_binary_params_prepared_once_and_never_stale(op, dtype):
    """QLinearAdd / QLinearMul in the backend: constant scales and zero points are validated and
    folded once per node (the prepared object is reused run after run), while a scale or zero
    point fed as a graph input is read anew on every run, including the same buffer refilled
    with other values; every run equals onnxruntime. Shapes change between runs (each pair
    remembered separately), a one-element operand on either side, a non-contiguous operand."""
    T = onnx.TensorProto
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng([dtype == I8, op == "QLinearMul", 71])
    node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain="com.microsoft")
    params = {"as": F(0.03), "az": zp(rng, dtype), "bs": F(0.05), "bz": zp(rng, dtype), "cs": F(0.07),
              "cz": zp(rng, dtype)}
    x_info = [helper.make_tensor_value_info(n, elem, None) for n in ("a", "b")]
    consts = [numpy_helper.from_array(np.asarray(v), n) for n, v in params.items()]
    m = _ms_model(node, x_info, [helper.make_tensor_value_info("y", elem, None)], consts)
    rep = backend.prepare(m)
    rt = [n for n in rep.evaluator.rt_nodes_ if n.onnx_node.op_type == op][0]
    prepared = None
    for sa, sb in [((2, 3, 33), (2, 3, 33)), ((1,), (5, 40)), ((7, 9), ()), ((2, 3, 33), (1, 3, 1)),
                   ((2, 3, 33), (2, 3, 33)), ((6, 70), (6, 70))]:
        a, b = rand_int(rng, dtype, sa), rand_int(rng, dtype, sb)
        if sa == (6, 70):
            a = rand_int(rng, dtype, (70, 6)).T  # a transposed view
        got = rep.run({"a": a, "b": b})[0]
        want = _ort_model_run(m, {"a": np.ascontiguousarray(a), "b": b})[0]
        assert_exact(got, want)
        assert rt._bin is not None and (prepared is None or rt._bin is prepared)
        prepared = rt._bin
    # every parameter fed as a graph input, the same buffers refilled between runs
    fed = {n: np.array(v) for n, v in params.items()}
    infos = x_info + [helper.make_tensor_value_info(n, T.FLOAT if n.endswith("s") else elem, [])
                      for n in fed]
    m2 = _ms_model(node, infos, [helper.make_tensor_value_info("y", elem, None)])
    rep2 = backend.prepare(m2)
    a, b = rand_int(rng, dtype, (4, 50)), rand_int(rng, dtype, (4, 50))
    outs = []
    for scale_c in (0.07, 0.011, 0.3):
        fed["cs"][...] = F(scale_c)
        fed["az"][...] = zp(rng, dtype)
        got = rep2.run({"a": a, "b": b, **fed})[0]
        assert_exact(got, _ort_model_run(m2, {"a": a, "b": b, **fed})[0])
        outs.append(got)
    assert not np.array_equal(outs[0], outs[1])
    rt2 = [n for n in rep2.evaluator.rt_nodes_ if n.onnx_node.op_type == op][0]
    assert rt2._bin is None  # nothing cached for fed parameters


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_backend_table_ops_prepared_once_and_never_stale(op):
    """QLinearSigmoid / QLinearLeakyRelu in the backend: with constant parameters the node keeps
    its table (the same one run after run, every run equal to onnxruntime); a model whose
    scale and zero point are graph inputs, refilled in place between runs, follows the new
    values; an X of another dtype than the zero points' is refused by name."""
    T = onnx.TensorProto
    attrs = {"alpha": 0.3} if op == "QLinearLeakyRelu" else {}
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", name="t1", **attrs)
    rng = np.random.default_rng(73)
    for dtype in (U8, I8):
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        params = {"xs": F(0.04), "xz": zp(rng, dtype), "ys": F(0.02), "yz": zp(rng, dtype)}
        consts = [numpy_helper.from_array(np.asarray(v), n) for n, v in params.items()]
        m = _ms_model(node, [helper.make_tensor_value_info("x", elem, None)],
                      [helper.make_tensor_value_info("y", elem, None)], consts)
        # qlinear runs x undeclared, so that an x of the other dtype reaches the node (run's
        # declared-type check would refuse it first); onnxruntime runs the declared model
        rep = backend.prepare(_ms_model(node, [helper.make_tensor_value_info("x", T.UNDEFINED, None)],
                                        [helper.make_tensor_value_info("y", elem, None)], consts))
        rt = [n for n in rep.evaluator.rt_nodes_ if n.onnx_node.op_type == op][0]
        table = None
        for shape in [(3, 50), (7,), (2, 3, 40)]:
            x = rand_int(rng, dtype, shape)
            assert_exact(rep.run({"x": x})[0], _ort_model_run(m, {"x": x})[0])
            assert rt._table is not None and (table is None or rt._table is table)
            table = rt._table
        other = x.view(I8 if dtype == U8 else U8)
        with pytest.raises(backend.NodeError, match="t1.*X_zero_point must have the dtype of X"):
            rep.run({"x": other})
        fed = {n: np.array(v) for n, v in params.items()}
        infos = [helper.make_tensor_value_info("x", elem, None)] + [
            helper.make_tensor_value_info(n, T.FLOAT if n.endswith("s") else elem, []) for n in fed]
        m2 = _ms_model(node, infos, [helper.make_tensor_value_info("y", elem, None)])
        rep2 = backend.prepare(m2)
        x = rand_int(rng, dtype, (4, 64))
        outs = []
        for ys in (0.02, 0.005):
            fed["ys"][...] = F(ys)
            outs.append(rep2.run({"x": x, **fed})[0])
            assert_exact(outs[-1], _ort_model_run(m2, {"x": x, **fed})[0])
        assert not np.array_equal(outs[0], outs[1])


def test_backend_binary_prepared_path_reports_bad_inputs():
    """The prepared path hands anything it does not take to the public function: a dtype other
    than the zero points', mixed dtypes, a float tensor, all named errors."""
    T = onnx.TensorProto
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"],
                            domain="com.microsoft", name="add1")
    consts = [numpy_helper.from_array(np.asarray(v), n) for n, v in
              [("as", F(0.1)), ("az", np.uint8(3)), ("bs", F(0.2)), ("bz", np.uint8(5)), ("cs", F(0.3)),
               ("cz", np.uint8(7))]]
    # a and b declare no element type: run's declared-type check would refuse the bad dtypes
    # before they reach the node's prepared path
    m = _ms_model(node, [helper.make_tensor_value_info(n, T.UNDEFINED, None) for n in "ab"],
                  [helper.make_tensor_value_info("y", T.UINT8, None)], consts)
    rep = backend.prepare(m)
    good = np.arange(6, dtype=np.uint8)
    rep.run({"a": good, "b": good})
    for a, b, words in [(good.view(np.int8), good.view(np.int8), "A_zero_point must have the dtype of A"),
                        (good, good.view(np.int8), "B must have the dtype of A"),
                        (good.astype(F), good, "A must have dtype")]:
        with pytest.raises(backend.NodeError, match=f"add1.*{words}"):
            rep.run({"a": a, "b": b})
    assert_exact(rep.run({"a": good, "b": good})[0],
                 c.qlinear_add(good, F(0.1), np.uint8(3), good, F(0.2), np.uint8(5), F(0.3), np.uint8(7)))


def test_backend_refuses_unsupported_contrib_nodes_up_front():
    T = onnx.TensorProto
    nodes = [helper.make_node("QLinearAdd", ["x", "s", "z", "x", "s", "z", "s", "z"], ["y"], domain="com.microsoft", name="add16"),
             helper.make_node("QLinearSoftmax", ["a", "s", "za", "s", "za"], ["w"], domain="com.microsoft", name="sm"),
             helper.make_node("QLinearReduceMean", ["a", "s", "za", "s", "za"], ["r"], domain="com.microsoft", name="rm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.UINT16, [4]),
                                           helper.make_tensor_value_info("a", T.UINT8, [4])],
                              [helper.make_tensor_value_info(o, T.UINT8, None) for o in "ywr"],
                              [numpy_helper.from_array(F(0.1), "s"), numpy_helper.from_array(np.uint16(3), "z"),
                               numpy_helper.from_array(np.uint8(3), "za")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    problems = {p.node: p.reason for p in backend.check_model(m)}
    assert set(problems) == {"add16", "sm", "rm"}
    assert "uint16" in problems["add16"] and "opset attribute" in problems["sm"] and "not implemented" in problems["rm"]


def test_backend_refuses_float16_scales_of_contrib_matmul_integer_to_float():
    """com.microsoft MatMulIntegerToFloat with a float16 scale gives float16 in onnxruntime;
    qlinear's kernel returned float32 values where the model declares float16. Refused up
    front, naming the input and type. (com.microsoft QuantizeLinear/DequantizeLinear with
    float16 run: onnxruntime 1.32 computes them as its ONNX kernels do, measured over every
    uint8 and uint16 value, tests/test_formats_graph.py.)"""
    T = onnx.TensorProto
    nodes = [helper.make_node("DequantizeLinear", ["x", "s16", "z"], ["y"], domain="com.microsoft", name="dq"),
             helper.make_node("QuantizeLinear", ["f", "s16", "z"], ["q"], domain="com.microsoft", name="q"),
             # (MatMulIntegerToFloat too: float16 output in onnxruntime, float32 in qlinear)
             helper.make_node("MatMulIntegerToFloat", ["x2", "w", "s", "s16"], ["mm"], domain="com.microsoft",
                              name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.UINT8, [4]),
                                           helper.make_tensor_value_info("f", T.FLOAT, [4]),
                                           helper.make_tensor_value_info("x2", T.UINT8, [1, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT16, None),
                               helper.make_tensor_value_info("q", T.UINT8, None),
                               helper.make_tensor_value_info("mm", T.FLOAT16, None)],
                              [numpy_helper.from_array(np.float16(0.1), "s16"), numpy_helper.from_array(np.uint8(3), "z"),
                               numpy_helper.from_array(F(0.1), "s"), numpy_helper.from_array(np.ones((4, 2), np.int8), "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    problems = {p.node: p.reason for p in backend.check_model(m)}
    assert problems == {"mm": "input 3 is float16; supported: float32"}
    with pytest.raises(backend.UnsupportedModelError, match="float16"):
        backend.prepare(m)


def test_backend_node_error_names_contrib_node():
    T = onnx.TensorProto
    node = helper.make_node("QLinearSigmoid", ["x", "s", "z", "ys"], ["y"], domain="com.microsoft", name="sig")
    m = _ms_model(node, [helper.make_tensor_value_info("x", T.UINT8, [4]), helper.make_tensor_value_info("ys", T.FLOAT, [2])],
                  [helper.make_tensor_value_info("y", T.UINT8, None)],
                  [numpy_helper.from_array(F(0.1), "s"), numpy_helper.from_array(np.uint8(3), "z")])
    with pytest.raises(backend.NodeError, match=r"node 'sig' \(com.microsoft.QLinearSigmoid-1\): qlinear_sigmoid: Y_scale must be a scalar"):
        backend.prepare(m).run({"x": np.zeros(4, U8), "ys": np.ones(2, F)})


@pytest.mark.parametrize("name", ["ece_cnn96_qoperator_qgemm.onnx", "tiny_gpt2_ortdynamic.onnx"])
def test_emulated_contrib_models_match_saturating_onnxruntime(name):
    """``emulate="onnxruntime-avx2"`` swaps in onnxruntime's saturating u8 x s8 products for
    QGemm, com.microsoft QLinearConv, QAttention, MatMulIntegerToFloat and DynamicQuantizeMatMul
    (with main's QLinearConv and MatMulInteger): on a CPU where onnxruntime saturates, the
    QGemm model is then identical and the transformer's quantization steps line up (its
    float operators still differ by float32 ulps). Where onnxruntime is exact (VNNI, AMX), the
    exact kernels are the ones that match it."""
    saturates = ortsat.onnxruntime_saturates()
    if saturates is None:
        pytest.skip("cannot tell whether onnxruntime's u8 x s8 kernels saturate on this CPU")
    model = onnx.load(_model(name))
    feeds = _gpt2_feeds() if "gpt2" in name else _image(model)
    got = backend.prepare(model, emulate="onnxruntime-avx2" if saturates else None).run(feeds)
    want = _ort_session(model).run(None, feeds)
    for g, w in zip(got, want):
        if "gpt2" in name:
            assert g.shape == w.shape and _rel(g, w) < FLOAT_TOL
        else:
            assert_exact(g, w)


def test_emulated_contrib_operators_match_onnxruntime_nodes():
    """Each emulating kernel on full-range u8 x s8 data against onnxruntime, one node at a time:
    where onnxruntime saturates the emulation equals it and the exact kernel does not; where it
    is exact (VNNI, AMX) the exact kernel equals it and the emulation does not."""
    saturates = ortsat.onnxruntime_saturates()
    if saturates is None:
        pytest.skip("cannot tell whether onnxruntime's u8 x s8 kernels saturate on this CPU")
    rng = np.random.default_rng(71)
    a, b = rand_int(rng, U8, (6, 64)), rand_int(rng, I8, (64, 5))
    cases = [
        ("QGemm", [("A", a), ("as", F(0.02)), ("az", np.uint8(7)), ("B", b), ("bs", scale(rng, shape=(5,))),
                   ("bz", np.zeros(5, I8)), ("C", None), ("ys", F(0.5)), ("yz", np.uint8(3))], {"alpha": 0.5}, U8),
        ("MatMulIntegerToFloat", [("A", a), ("B", b), ("as", F(0.02)), ("bs", F(0.01)), ("az", np.uint8(7)),
                                  ("bz", np.int8(2)), ("bias", rng.standard_normal(5).astype(F))], {}, F),
        ("DynamicQuantizeMatMul", [("A", rng.standard_normal((6, 64)).astype(F)), ("B", b), ("bs", F(0.01)),
                                   ("bz", np.int8(0)), ("bias", None)], {}, F),
        ("QLinearConv", [("x", rand_int(rng, U8, (1, 5, 5, 8))), ("xs", F(0.02)), ("xz", np.uint8(100)),
                         ("w", rand_int(rng, I8, (4, 8, 3, 3))), ("ws", F(0.01)), ("wz", np.int8(0)),
                         ("ys", F(0.7)), ("yz", np.uint8(5))], {"channels_last": 1, "pads": [1, 1, 1, 1]}, U8),
    ]
    for op, ins, attrs, out in cases:
        present = [(n, v) for n, v in ins if v is not None]
        names = [n if v is not None else "" for n, v in ins]
        while names and not names[-1]:
            names.pop()
        weights = {"B", "bs", "bz", "w", "ws", "wz"}
        node = helper.make_node(op, names, ["y"], domain="com.microsoft", **attrs)
        inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in present if n in weights]
        infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
                 for n, v in present if n not in weights]
        m = _ms_model(node, infos, [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out)), None)], inits)
        feeds = {n: np.asarray(v) for n, v in present if n not in weights}
        want = _ort_session(m).run(None, feeds)[0]
        emulated = backend.prepare(m, emulate="onnxruntime-avx2").run(feeds)[0]
        exact = backend.prepare(m).run(feeds)[0]
        matching, other = (emulated, exact) if saturates else (exact, emulated)
        assert_exact(matching, want)
        assert not np.array_equal(other, want), op  # the saturation shows


@pytest.mark.parametrize("bzp", ["per tensor", "per column", "absent"])
def test_backend_prepared_products_match_functions_and_onnxruntime(bzp):
    """MatMulIntegerToFloat and DynamicQuantizeMatMul with a constant B pack it once in the
    backend; B fed as a graph input is packed per run. Both give the functions' bits (checked
    against onnxruntime above) and onnxruntime's own (7-bit B: exact on every x86)."""
    rng = np.random.default_rng([("per tensor", "per column", "absent").index(bzp), 71])
    k, n = 24, 10
    b = rng.integers(-64, 64, (k, n)).astype(I8)
    zb = {"per tensor": np.array(3, I8), "per column": rng.integers(-5, 5, n).astype(I8), "absent": None}[bzp]
    bs = rng.uniform(0.01, 0.1, n).astype(F)
    bias = rng.standard_normal(n).astype(F)
    a = rng.integers(0, 256, (2, 3, k)).astype(U8)
    af = (rng.standard_normal((2, 3, k)) * 3).astype(F)
    sa, za = np.array(0.05, F), np.array(7, U8)
    for const_b in (True, False):
        inits = [numpy_helper.from_array(v, nm) for nm, v in
                 [("bs", bs), ("bias", bias), ("sa", sa), ("za", za)] + ([("zb", zb)] if zb is not None else [])]
        if const_b:
            inits.append(numpy_helper.from_array(b, "B"))
        zb_name = "zb" if zb is not None else ""
        nodes = [helper.make_node("MatMulIntegerToFloat", ["A", "B", "sa", "bs", "za", zb_name, "bias"], ["Y1"],
                                  domain="com.microsoft"),
                 helper.make_node("DynamicQuantizeMatMul", ["AF", "B", "bs", zb_name, "bias"], ["Y2"],
                                  domain="com.microsoft")]
        ins = [helper.make_tensor_value_info("A", onnx.TensorProto.UINT8, list(a.shape)),
               helper.make_tensor_value_info("AF", onnx.TensorProto.FLOAT, list(af.shape))]
        if not const_b:
            ins.append(helper.make_tensor_value_info("B", onnx.TensorProto.INT8, [k, n]))
        outs = [helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, None) for y in ("Y1", "Y2")]
        m = helper.make_model(helper.make_graph(nodes, "products", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
        m.ir_version = 8
        feeds = {"A": a, "AF": af, **({} if const_b else {"B": b})}
        rep = backend.prepare(m)
        want1 = c.matmul_integer_to_float(a, b, sa, bs, za, zb, bias)
        want2 = c.dynamic_quantize_matmul(af, b, bs, zb, bias)
        ort_out = _ort_session(m).run(None, feeds)
        for _ in range(2):  # the second run reuses the packed B
            y1, y2 = rep.run(feeds)
            assert_exact(y1, want1)
            assert_exact(y2, want2)
            assert_exact(y1, ort_out[0])
            assert_exact(y2, ort_out[1])
        # the constant B was prepared once and kept; a fed B never is
        kept = [rt._prepared is not None for rt in rep.evaluator.rt_nodes_]
        assert kept == [const_b, const_b]


@pytest.mark.parametrize("alpha", ["x", [1.0, 2.0]])
def test_backend_leaky_relu_alpha_must_be_a_number(alpha):
    """A model whose QLinearLeakyRelu carries a non-float alpha: a NodeError naming the node and
    the attribute (it was float()'s "could not convert string to float: 'x'", or for a list
    onnx.reference's "Issues with types ...")."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from qlinear import backend

    inits = [numpy_helper.from_array(np.array(0.1, F), "s"), numpy_helper.from_array(np.array(3, U8), "z")]
    node = helper.make_node("QLinearLeakyRelu", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                            alpha=alpha)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    with pytest.raises(ValueError, match=r"^node 'y' \(com.microsoft.QLinearLeakyRelu-1\): qlinear_leaky_relu: "
                                         r"attribute alpha must be a real number"):
        backend.prepare(m).run([np.arange(4, dtype=U8)])


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 7

import warnings  # noqa: E402


BIG = F(3e38)


_XG = np.array([[-BIG, -1e20, -10, 0, 1], [1e20, BIG, np.inf, -np.inf, np.nan]], F)


_XL = np.array([[[BIG, BIG, -BIG, 1], [1e20, -1e20, 3, 1]]], F)


_ONES4, _ZEROS4 = np.ones(4, F), np.zeros(4, F)


def test_contrib_float_functions_under_errstate_raise():
    """regression: The public com.microsoft float functions return IEEE results (inf, NaN) without
    FloatingPointError under np.errstate(all="raise")."""
    x3 = np.array([[[BIG, -BIG, 1e30, np.inf, -np.inf, 0]]], F)
    w = np.full((6, 6), BIG, F)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            g = c.gelu(_XG)
            fg = c.fast_gelu(_XG, np.full(5, BIG, F))
            y, _, _, s = c.skip_layer_normalization(_XL, _XL, _ONES4, _ZEROS4)
            out, present = c.attention(x3, w, num_heads=1)
    with np.errstate(all="ignore"):
        assert np.array_equal(g, c.gelu(_XG), equal_nan=True)
        assert np.array_equal(fg, c.fast_gelu(_XG, np.full(5, BIG, F)), equal_nan=True)
    assert np.isinf(s[0, 0, :3]).all() and np.isnan(y[0, 0]).all()  # the float32 sum, normalized
    assert out.shape == (1, 1, 2) and present.shape == (2, 1, 1, 1, 2)


def test_contrib_quantized_functions_with_extreme_scales_under_errstate_raise():
    """regression: qlinear.contrib's quantized functions with scales whose products or quotients
    underflow (1e-45, 1e-30) or overflow (3e38): the same results as under NumPy's default
    error state, without FloatingPointError under np.errstate(all="raise") (qlinear_sigmoid,
    qlinear_add/mul, qlinear_global_average_pool, qgemm and dynamic_quantize_linear raised
    'underflow encountered in ...'), as the six ONNX operators promise."""
    u = np.arange(0, 256, 51, dtype=np.uint8)
    calls = {
        "qlinear_sigmoid": lambda s: c.qlinear_sigmoid(u, s, np.uint8(128), F(1 / 256), np.uint8(0)),
        "qlinear_leaky_relu": lambda s: c.qlinear_leaky_relu(u, s, np.uint8(128), F(0.1), np.uint8(0), alpha=0.1),
        "qlinear_add": lambda s: c.qlinear_add(u, s, np.uint8(128), u, s, np.uint8(128), F(0.1), np.uint8(0)),
        "qlinear_mul": lambda s: c.qlinear_mul(u, s, np.uint8(128), u, s, np.uint8(128), F(0.1), np.uint8(0)),
        "prepared_mul": lambda s: c.prepare_qlinear_binary("mul", np.uint8, s, np.uint8(128), s, np.uint8(128),
                                                           F(0.1), np.uint8(0)).run(u, u),
        "qlinear_softmax": lambda s: c.qlinear_softmax(u[None], s, np.uint8(128), F(1 / 256), np.uint8(0), opset=13),
        "qgemm": lambda s: c.qgemm(u.reshape(2, 3), s, np.uint8(128), u.reshape(3, 2).view(np.int8), s, np.int8(0),
                                   None, F(0.1), np.uint8(0)),
        "qgemm_float": lambda s: c.qgemm(u.reshape(2, 3), s, np.uint8(128), u.reshape(3, 2).view(np.int8), s,
                                         np.int8(0)),
        "prepared_qgemm": lambda s: c.prepare_qgemm(u.reshape(3, 2).view(np.int8), s, np.int8(0)).run(
            u.reshape(2, 3), s, np.uint8(128)),
        "dynamic_quantize_linear": lambda s: c.dynamic_quantize_linear(np.array([s, 0], F)),
        "dequantize_linear": lambda s: c.dequantize_linear(u, s, np.uint8(3)),
        "quantize_linear": lambda s: c.quantize_linear(np.array([1.0, -1e-30, 3e38], F), s, np.uint8(3)),
    }
    for name, call in calls.items():
        for s in (F(1e-45), F(1e-30), F(3e38)):
            try:
                with np.errstate(all="ignore"):
                    want = call(s)
            except ValueError:  # scales onnxruntime refuses (e.g. qgemm's multiplier): refused either way
                with np.errstate(all="raise"), pytest.raises(ValueError):
                    call(s)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with np.errstate(all="raise"):
                    got = call(s)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert np.array_equal(g, w, equal_nan=g.dtype.kind == "f"), (name, s)
