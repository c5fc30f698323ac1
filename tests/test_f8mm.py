"""QLinearMatMul-21 with float8 operands or output (qlinear/_fmatmul.py, csrc/f8mm/): bit for bit
against tests/oracle.py's exact rational oracle on every engine and ISA level (the
``engine_level`` fixture), through each of the exact product's paths -- one float64 GEMM under
the bound, the split halves assembled in 128-bit integers, Python integers -- plus the prepared
form and the graph node with a constant b."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oracle
import qlinear
from qlinear import _fmatmul

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

F32, F16, BF16 = np.float32, np.float16, ml_dtypes.bfloat16
FLOAT8 = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"]
TYPES = ["int8", "uint8", *FLOAT8]
PAIRS = [(a, b) for a in TYPES for b in TYPES if "float8" in a or "float8" in b]
OUTS = ["uint8", "int8", *FLOAT8]
SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])


def bits_equal(got, want):
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    g, w = np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    assert bad.size == 0, f"{bad.size} of {g.size} differ, first at {bad[0]}: {got.reshape(-1)[bad[0]]} != {want.reshape(-1)[bad[0]]}"


def finite_codes(name, codes):
    """NaN/inf codes of a float8 format replaced by finite ones."""
    x = oracle.as_format(codes, name)
    return np.where(np.isfinite(x.astype(np.float32)), codes, codes & 0x3F).astype(np.uint8)


def operand(rng, name, shape, specials=False, style="full"):
    """Every code (style "full"), or magnitudes near the format's top / subnormals."""
    if name in ("int8", "uint8"):
        lo, hi, storage = oracle.INT_TYPES[name]
        if style == "extreme":
            return rng.choice([lo, hi, lo + 1, hi - 1, 0], size=shape).astype(storage)
        return rng.integers(lo, hi + 1, size=shape).astype(storage)
    codes = rng.integers(0, 256, size=shape).astype(np.uint8)
    if style == "extreme":  # the largest finite codes and the subnormals, both signs
        top = int(finite_codes(name, np.array([0x7F], np.uint8))[0])
        top = max(c for c in range(0x80) if np.isfinite(float(oracle.as_format(np.uint8(c), name).astype(np.float32))))
        codes = rng.choice([top, top - 1, 1, 2, 3, 0], size=shape).astype(np.uint8) | (
            rng.integers(0, 2, size=shape).astype(np.uint8) << 7)
        if name.endswith("fnuz"):
            codes[codes == 0x80] = 0
    if not specials:
        codes = finite_codes(name, codes)
    return oracle.as_format(codes, name)


def zero_point(rng, name, shape, style="small"):
    if name in ("int8", "uint8"):
        lo, hi, storage = oracle.INT_TYPES[name]
        return rng.integers(lo, hi + 1, size=shape).astype(storage)
    if style == "zero":
        return oracle.as_format(np.zeros(shape, np.uint8), name)
    if style == "negzero" and not name.endswith("fnuz"):
        return oracle.as_format(np.full(shape, 0x80, np.uint8), name)
    codes = finite_codes(name, rng.integers(0, 256, size=shape).astype(np.uint8))
    if name.endswith("fnuz"):
        codes[codes == 0x80] = 0
    return oracle.as_format(codes, name)


def scale(rng, shape, dtype, lo, hi):
    s = rng.uniform(lo, hi, size=shape) * rng.choice([-1, 1], size=shape)
    return np.asarray(s).astype(dtype)


_ORACLE: dict = {}


def expected(*args):
    """The oracle's result, computed once per distinct inputs (every engine level repeats them)."""
    key = tuple((np.asarray(x).dtype.name, np.asarray(x).shape, np.asarray(x).tobytes()) for x in args)
    if key not in _ORACLE:
        _ORACLE[key] = oracle.qlinear_matmul_v21(*args)
    return _ORACLE[key]


def check(a, sa, za, b, sb, zb, ys, zy):
    got = qlinear.qlinear_matmul(a, sa, za, b, sb, zb, ys, zy)
    want = expected(a, sa, za, b, sb, zb, ys, zy)
    bits_equal(got, want)
    return got


@pytest.mark.parametrize("at,bt", PAIRS)
def test_every_type_pair_granularity_and_scale_type(engine_level, at, bt):
    rng = np.random.default_rng(abs(hash((at, bt, "f8mm"))) % 2**32)
    M, K, N = 5, 13, 6
    for trial, yt in enumerate(OUTS):
        style = ("full", "extreme")[trial % 2]
        a = operand(rng, at, (M, K), specials=trial == 2, style=style)
        b = operand(rng, bt, (K, N), specials=trial == 3, style=style)
        gran = ("tensor", "row-col", "row", "col")[trial % 4]
        shp_a = (M,) if gran in ("row-col", "row") else ()
        shp_b = (N,) if gran in ("row-col", "col") else ()
        stype = (F32, F16, BF16)[trial % 3]
        sa, sb = scale(rng, shp_a, stype, 1e-3, 0.5), scale(rng, shp_b, (BF16, F32, F16)[trial % 3], 1e-3, 0.5)
        ys = scale(rng, (), (F16, BF16, F32)[trial % 3], 0.5, 4.0)
        zs = ("small", "zero", "negzero")[trial % 3]
        za, zb, zy = zero_point(rng, at, shp_a, zs), zero_point(rng, bt, shp_b, zs), zero_point(rng, yt, (), zs)
        check(a, sa, za, b, sb, zb, ys, zy)


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_hypothesis_cases(engine_level, data):
    at, bt = data.draw(st.sampled_from(PAIRS))
    yt = data.draw(st.sampled_from(OUTS))
    M, K, N = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 4))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    style = data.draw(st.sampled_from(["full", "extreme"]))
    specials = data.draw(st.booleans())
    a, b = operand(rng, at, (M, K), specials, style), operand(rng, bt, (K, N), specials, style)
    per_a, per_b = data.draw(st.booleans()), data.draw(st.booleans())
    shp_a, shp_b = ((M,) if per_a else ()), ((N,) if per_b else ())
    stypes = st.sampled_from([F32, F16, BF16])
    sa = scale(rng, shp_a, data.draw(stypes), 1e-4, 2.0)
    sb = scale(rng, shp_b, data.draw(stypes), 1e-4, 2.0)
    ys = scale(rng, (), data.draw(stypes), 1e-3, 8.0)
    zs = data.draw(st.sampled_from(["small", "zero", "negzero"]))
    check(a, sa, zero_point(rng, at, shp_a, zs), b, sb, zero_point(rng, bt, shp_b, zs), ys,
          zero_point(rng, yt, (), zs))


def _paths(monkeypatch):
    """Which exact path each call took: 'gemm', 'split' or 'python'."""
    seen = []
    real_combine, real_python = _fmatmul._nf8.combine, _fmatmul._python_sums

    def combine(*args):
        seen.append("split")
        return real_combine(*args)

    def python_sums(*args):
        seen.append("python")
        return real_python(*args)

    real_gemm = _fmatmul._gemm

    def gemm(x, y):  # every float64 GEMM taken is provably exact on its actual operands
        kx = np.abs(x).max(axis=tuple(range(x.ndim - 1)), initial=0.0)
        ky = np.abs(y).max(axis=tuple(i for i in range(y.ndim) if i != y.ndim - 2), initial=0.0)
        bound = sum(int(p) * int(q) for p, q in zip(kx, ky))  # Python integers: no overflow
        assert bound < 2**53, bound
        return real_gemm(x, y)

    monkeypatch.setattr(_fmatmul._nf8, "combine", combine)
    monkeypatch.setattr(_fmatmul, "_python_sums", python_sums)
    monkeypatch.setattr(_fmatmul, "_gemm", gemm)
    return seen


def test_wide_e5m2_span_takes_the_split_path(engine_level, monkeypatch):
    """e5m2 operands spanning the whole format (57344 and the subnormal 2^-16, both signs): one
    product spans 2^63.6 units, beyond float64; the four half products assembled exactly."""
    seen = _paths(monkeypatch)
    rng = np.random.default_rng(5)
    for at, bt in (("float8e5m2", "float8e5m2"), ("float8e5m2fnuz", "float8e5m2fnuz"), ("float8e5m2", "float8e4m3fn"),
                   ("float8e4m3fnuz", "float8e5m2fnuz")):
        for yt in ("int8", "float8e4m3fn", "float8e5m2"):
            seen.clear()
            a = operand(rng, at, (4, 37), style="extreme")
            b = operand(rng, bt, (37, 5), style="extreme")
            zy = zero_point(rng, yt, (), "zero")
            for ys in (F32(1e3), F32(1e8), F32(1e-3)):
                check(a, F32(1.5), zero_point(rng, at, (), "zero"), b, F32(0.75), zero_point(rng, bt, (), "zero"), ys, zy)
            assert seen and seen[0] == "split", seen


def test_double_rounding_would_show(engine_level):
    """Sums whose rounding through a 53-bit value first (round to nearest at 53, then at 24)
    lands on a tie: S = 2^64 + 2^40 + 1 units (e5m2 x e5m2, the split path) and 2^60 + 2^36 + 1
    units (e4m3fn x e5m2); the contract's one rounding gives 101, a double rounding 100."""
    f8 = lambda n, v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), n, 1), n)  # noqa: E731
    z4, z5 = f8("float8e4m3fn", 0.0).reshape(()), f8("float8e5m2", 0.0).reshape(())
    a = f8("float8e5m2", [[32768.0] * 4 + [256.0, 2.0 ** -16]])
    b = f8("float8e5m2", [[32768.0]] * 4 + [[1.0], [2.0 ** -16]])
    got = check(a, F32(100.5), z5, b, F32(2.0 ** -32), z5, F32(1), np.int8(0))
    assert int(got[0, 0]) == 101
    a = f8("float8e4m3fn", [[256.0] * 4097 + [2.0 ** -9]])
    b = f8("float8e5m2", [[32768.0]] * 4096 + [[8.0], [2.0 ** -16]])
    got = check(a, F32(100.5), z4, b, F32(2.0 ** -35), z5, F32(1), np.int8(0))
    assert int(got[0, 0]) == 101


def test_bound_edges(engine_level, monkeypatch):
    """The float64 bound at its edge: e5m2 operands whose per-k product reaches 2^47 units
    (256 and 128 with the subnormal 2^-16 beside them) take one GEMM for K = 31 (31 · 2^47 <
    2^52) and the split path for K = 33; a last tiny term decides the rounding. e4m3fn with the
    zero point at the opposite extreme (centered 896 = 458752 units) stays on one GEMM at
    K = 20,000, int8 x e4m3fn at K = 40,000."""
    seen = _paths(monkeypatch)
    f8 = lambda n, v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), n, 1), n)  # noqa: E731
    z5 = f8("float8e5m2", 0.0).reshape(())
    for k, path in ((31, None), (33, "split")):
        seen.clear()
        a = f8("float8e5m2", [[256.0] * (k - 1) + [2.0 ** -16], [-256.0] * (k - 1) + [256.0]])
        b = f8("float8e5m2", [[128.0, -128.0]] * (k - 2) + [[-128.0, 128.0], [2.0 ** -16, 128.0]])
        for ys, zy in ((F32(2.0 ** 14), f8("float8e4m3fn", 0.0).reshape(())), (F32(3.0), np.int8(3))):
            check(a, F32(1), z5, b, F32(2.0 ** -10), z5, ys, zy)
        assert (seen[:1] or [None])[0] == path, seen
    seen.clear()
    k = 20000
    f4 = lambda v: f8("float8e4m3fn", v)  # noqa: E731
    a = f4([[448.0] * (k - 1) + [2.0 ** -9]])
    b = f4([[448.0]] * (k - 1) + [[2.0 ** -9]])
    check(a, F32(1), f4(-448.0).reshape(()), b, F32(2.0 ** -20), f4(-448.0).reshape(()), F32(3.0), np.int8(3))
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (1, 40000)).astype(np.int8)
    b = operand(rng, "float8e4m3fn", (40000, 1), style="extreme")
    check(a, F32(0.5), np.int8(-128), b, F32(2.0 ** -10), f4(-448.0).reshape(()), F32(1e4), np.uint8(9))
    assert not seen


def test_python_integer_path(engine_level, monkeypatch):
    """The last resort (Python integers), forced by a lowered bound limit, gives the same bits."""
    seen = _paths(monkeypatch)
    monkeypatch.setattr(_fmatmul, "_EXACT", 1.0)
    rng = np.random.default_rng(8)
    for at, bt in (("float8e5m2", "float8e5m2"), ("float8e4m3fn", "int8"), ("uint8", "float8e5m2fnuz")):
        a, b = operand(rng, at, (3, 11), style="extreme"), operand(rng, bt, (11, 4), style="extreme")
        check(a, F32(0.3), zero_point(rng, at, ()), b, F32(0.2), zero_point(rng, bt, ()), F32(0.01), np.int8(1))
    assert seen and set(seen) == {"python"}


def test_specials_reach_their_outputs(engine_level):
    """NaN, ±inf (e5m2) and inf · 0, inf - inf in chosen rows and columns; finite outputs beside
    them exact."""
    f8 = lambda n, v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), n, 1), n)  # noqa: E731
    a = f8("float8e5m2", [[np.inf, 1.0, 2.0], [1.0, 2.0, 3.0], [-np.inf, 0.0, 1.0], [np.nan, 1.0, 1.0]])
    b = f8("float8e5m2", [[1.0, 0.0, -1.0, 2.0], [np.inf, 1.0, 1.0, 2.0], [-np.inf, 2.0, 3.0, 57344.0]])
    z = f8("float8e5m2", 0.0).reshape(())
    for yt in ("uint8", "int8", "float8e4m3fn", "float8e5m2", "float8e4m3fnuz"):
        zy = zero_point(np.random.default_rng(1), yt, (), "zero")
        check(a, F32(1), z, b, F32(1), z, F32(1), zy)
    b2 = operand(np.random.default_rng(2), "int8", (3, 4))
    check(a, F32(1), z, b2, F32(0.5), np.int8(-1), F32(2), np.uint8(3))
    a3 = f8("float8e4m3fn", [[np.nan, 1.0, 2.0]])
    check(a3, F32(1), f8("float8e4m3fn", 0.0).reshape(()), b, F32(1), z, F32(1), np.int8(0))


def test_batches_and_one_dimensional_operands(engine_level):
    """numpy.matmul's shapes: a stack against one b, a stack against a stack, 1-D a and b, per
    row/column parameters with batch axes."""
    rng = np.random.default_rng(11)
    a = operand(rng, "float8e4m3fn", (2, 3, 5))
    b = operand(rng, "float8e5m2", (5, 4))
    za, zb = zero_point(rng, "float8e4m3fn", ()), zero_point(rng, "float8e5m2", (4,))
    sb = scale(rng, (4,), F32, 0.1, 1)
    got = qlinear.qlinear_matmul(a, F16(0.2), za, b, sb, zb, F32(0.05), np.int8(2))
    for i in range(2):
        bits_equal(got[i], expected(a[i], F16(0.2), za, b, sb, zb, F32(0.05), np.int8(2)))
    bb = operand(rng, "int8", (2, 5, 4))
    sa = scale(rng, (3,), F32, 0.1, 1)
    za3 = zero_point(rng, "float8e4m3fn", (3,))
    zy = zero_point(rng, "float8e5m2fnuz", ())
    got = qlinear.qlinear_matmul(a, sa, za3, bb, F32(0.3), np.int8(1), F32(0.05), zy)
    for i in range(2):
        bits_equal(got[i], expected(a[i], sa, za3, bb[i], F32(0.3), np.int8(1), F32(0.05), zy))
    sa4 = scale(rng, (2, 3, 1), F32, 0.1, 1)
    za4 = zero_point(rng, "float8e4m3fn", (2, 3, 1))
    got = qlinear.qlinear_matmul(a, sa4, za4, b, sb, zb, F32(0.05), np.uint8(7))
    for i in range(2):
        bits_equal(got[i], expected(a[i], sa4[i].reshape(3), za4[i].reshape(3), b, sb, zb, F32(0.05),
                                                     np.uint8(7)))
    v = qlinear.qlinear_matmul(a[0, 0], F32(0.2), za, b[:, 0], F32(0.5), zb[0], F32(0.05), np.int8(0))
    assert v.shape == ()
    bits_equal(v, expected(a[0, :1], F32(0.2), za, b[:, :1], F32(0.5), zb[:1], F32(0.05),
                                            np.int8(0)).reshape(()))


def test_prepared_forms_match_the_function(engine_level):
    """prepare_qlinear_matmul with a float8 b, and prepare_qlinear_matmul_float8 with an 8-bit b
    (a float8 a), decode b once and give the function's bits on every call."""
    rng = np.random.default_rng(12)
    for at, bt in (("float8e4m3fn", "float8e4m3fn"), ("int8", "float8e5m2"), ("float8e4m3fnuz", "uint8"),
                   ("float8e5m2", "float8e5m2")):
        b = operand(rng, bt, (9, 7), style="extreme" if at == bt == "float8e5m2" else "full")
        sb, zb = scale(rng, (7,), BF16, 0.01, 1), zero_point(rng, bt, (7,))
        if bt.startswith("float8"):
            p = qlinear.prepare_qlinear_matmul(b, sb, zb)
        else:
            p = qlinear.matmul.prepare_qlinear_matmul_float8(b, sb, zb)
        assert isinstance(p, _fmatmul.PreparedQLinearMatMulF8)
        for trial in range(3):
            a = operand(rng, at, (4, 9), specials=trial == 1)
            sa, za = scale(rng, (4,), F32, 0.01, 1), zero_point(rng, at, (4,))
            zy = zero_point(rng, ("float8e4m3fn", "int8", "uint8")[trial], ())
            want = expected(a, sa, za, b, sb, zb, F16(0.25), zy)
            bits_equal(p.run(a, sa, za, F16(0.25), zy), want)
            bits_equal(qlinear.qlinear_matmul(a, sa, za, b, sb, zb, F16(0.25), zy), want)


def test_graph_node_decodes_a_constant_b_once(monkeypatch):
    """QLinearMatMul-21 in a model, b an initializer: the backend's result is the function's,
    and b is decoded once over several runs."""
    from onnx import TensorProto as T, helper, numpy_helper
    from qlinear import backend

    rng = np.random.default_rng(13)
    b = operand(rng, "float8e4m3fn", (16, 8))
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (
        ("a_scale", F32(0.05)), ("b_scale", scale(rng, (8,), F32, 0.01, 0.1)), ("y_scale", F32(0.5)))]
    fp8 = lambda n, v: helper.make_tensor(n, T.FLOAT8E4M3FN, v.shape, v.view(np.uint8).reshape(-1).tobytes(), raw=True)  # noqa: E731
    zero = oracle.as_format(np.zeros((), np.uint8), "float8e4m3fn")
    inits += [fp8("b", b), fp8("a_zp", zero), fp8("b_zp", oracle.as_format(np.zeros(8, np.uint8), "float8e4m3fn")),
              fp8("y_zp", zero)]
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", T.FLOAT8E4M3FN, [5, 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT8E4M3FN, [5, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    decodes = []
    real = _fmatmul._Decoded.__init__

    def counting(self, codes, t, zp, left):
        decodes.append(left)
        real(self, codes, t, zp, left)

    monkeypatch.setattr(_fmatmul._Decoded, "__init__", counting)
    rep = backend.prepare(m)
    bsc = numpy_helper.to_array(inits[1])
    bz = oracle.as_format(np.zeros(8, np.uint8), "float8e4m3fn")
    for _ in range(3):
        a = operand(rng, "float8e4m3fn", (5, 16))
        (y,) = rep.run({"a": a})
        bits_equal(np.asarray(y), expected(a, F32(0.05), zero, b, bsc, bz, F32(0.5), zero))
    assert decodes.count(False) == 1, decodes  # a is decoded per run (natively on the one-call path)


def test_accumulator_rounds_before_the_multiplier(engine_level):
    """acc = float32(S) first, then float32(acc · m): S = 2^24 + 1 units of 2^-9 (a tie: acc =
    2^15), m = 100.5 · 2^-15, y = 100.5 -> 100 (ties to even). Multiplying the exact sum by m
    with one rounding would give 100.5 · (1 + 2^-24) -> 101."""
    f4 = lambda v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), "float8e4m3fn", 1), "float8e4m3fn")  # noqa: E731
    a = f4([[256.0, 2.0 ** -9]])
    b = np.array([[128], [1]], np.uint8)
    got = check(a, F32(100.5 * 2.0 ** -15), f4(0.0).reshape(()), b, F32(1), np.uint8(0), F32(1), np.int8(0))
    assert int(got[0, 0]) == 100


# ---------------------------------------------------------------------------------------------
# The one-call product (decode of a, dgemm per thread on its columns, output step in one native
# job) and the plain calls' cache of the decoded b.
# ---------------------------------------------------------------------------------------------


def _one_calls(monkeypatch):
    """The one-call products attempted, each checked exact on its actual operands (the bound
    that a's type proved is never below the actual one); 'done' or 'bad' (a NaN in a)."""
    seen = []
    real = _fmatmul._nf8.product

    def product(gemm, a, table, bad, zp, b_units, *rest):
        units = table[a.view(np.uint8)] - zp.reshape(-1, 1)
        kx = np.abs(units).max(axis=0, initial=0.0)
        ky = np.abs(b_units).max(axis=1, initial=0.0)
        assert sum(int(p) * int(q) for p, q in zip(kx, ky)) < 2**53
        y = real(gemm, a, table, bad, zp, b_units, *rest)
        seen.append("bad" if y is None else "done")
        return y

    monkeypatch.setattr(_fmatmul._nf8, "product", product)
    return seen


def _native_only(engine_level):
    if not (engine_level or "").startswith("native") or _fmatmul._blas.dgemm() is None:
        pytest.skip("the one-call product runs on the native engine with an OpenBLAS dgemm")


@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_product(engine_level, monkeypatch, threads):
    """Every a type whose bound its type proves, every output type, per-tensor and per-row a
    parameters, per-column b parameters, widths that split into ragged column blocks, stacks of
    a against one b and 1-D operands: the one-call product is taken and gives the oracle's bits,
    from the prepared form and from the function (its remembered plan on the second call)."""
    _native_only(engine_level)
    seen = _one_calls(monkeypatch)
    saved = qlinear.get_num_threads()
    qlinear.set_num_threads(threads)
    try:
        rng = np.random.default_rng(21)
        for at, bt, yt, (m, k, n) in (("float8e4m3fn", "float8e4m3fn", "float8e4m3fn", (37, 29, 150)),
                                      ("float8e4m3fnuz", "float8e5m2", "int8", (5, 40, 131)),
                                      ("int8", "float8e4m3fn", "uint8", (17, 9, 8)),
                                      ("uint8", "float8e5m2fnuz", "float8e5m2", (3, 64, 200)),
                                      ("float8e5m2", "int8", "float8e4m3fnuz", (20, 33, 70)),
                                      ("float8e4m3fn", "uint8", "float8e5m2fnuz", (1, 7, 1))):
            b = operand(rng, bt, (k, n), style="extreme" if bt == "int8" else "full")
            if bt.startswith("float8e5m2"):  # |b| <= 2 (codes up to 0x40, both signs): a bound e5m2 passes
                codes = rng.integers(0, 0x41, size=(k, n)).astype(np.uint8)
                if bt == "float8e5m2":
                    codes |= rng.integers(0, 2, size=(k, n)).astype(np.uint8) << 7
                b = oracle.as_format(codes, bt)
            sb = scale(rng, (n,), F32, 0.001, 0.01)
            zb = zero_point(rng, bt, (n,), "negzero" if bt.startswith("float8e5m2") else "small")
            p = qlinear.prepare_qlinear_matmul(b, sb, zb) if bt.startswith("float8") else \
                qlinear.matmul.prepare_qlinear_matmul_float8(b, sb, zb)
            for per_row in (False, True):
                a = operand(rng, at, (m, k))
                sa = scale(rng, (m,) if per_row else (), F32, 0.01, 1)
                za = zero_point(rng, at, (m,) if per_row else ())
                zy = zero_point(rng, yt, ())
                want = expected(a, sa, za, b, sb, zb, F32(0.7), zy)
                for _ in range(2):
                    seen.clear()
                    bits_equal(p.run(a, sa, za, F32(0.7), zy), want)
                    bits_equal(qlinear.qlinear_matmul(a, sa, za, b, sb, zb, F32(0.7), zy), want)
                    assert seen == ["done", "done"], (at, bt, seen)
        a = operand(rng, "float8e4m3fn", (2, 3, 29))
        b = operand(rng, "float8e4m3fn", (29, 150))
        za, zb = zero_point(rng, "float8e4m3fn", (3,)), zero_point(rng, "float8e4m3fn", ())
        sa = scale(rng, (3,), F16, 0.1, 1)
        seen.clear()
        got = qlinear.qlinear_matmul(a, sa, za, b, BF16(0.5), zb, F32(3), np.int8(-2))
        for i in range(2):
            bits_equal(got[i], expected(a[i], sa, za, b, BF16(0.5), zb, F32(3), np.int8(-2)))
        v = qlinear.qlinear_matmul(a[0, 0], F32(0.2), za[0], b[:, 7], F32(0.5), zb, F32(0.05), np.uint8(3))
        bits_equal(v, expected(a[0, :1], F32(0.2), za[0], b[:, 7:8], F32(0.5), zb, F32(0.05), np.uint8(3)).reshape(()))
        assert seen == ["done", "done"], seen
    finally:
        qlinear.set_num_threads(saved)


def test_one_call_product_gives_way(engine_level, monkeypatch):
    """A NaN in a (the one call declines after decoding), a NaN or an infinity in b, two 8-bit
    operands, a batched b, per-batch parameters, a bound a's type does not prove (e5m2 x e4m3):
    the general path, with the oracle's bits."""
    _native_only(engine_level)
    seen = _one_calls(monkeypatch)
    rng = np.random.default_rng(22)
    f8 = lambda n, v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), n, 1), n)  # noqa: E731
    z4 = f8("float8e4m3fn", 0.0).reshape(())
    b = operand(rng, "float8e4m3fn", (6, 40))
    a = operand(rng, "float8e4m3fn", (20, 6))
    a[13, 2] = f8("float8e4m3fn", np.nan)[()]
    p = qlinear.prepare_qlinear_matmul(b, F32(0.1), z4)
    for _ in range(2):  # the second run: the remembered plan declines as well
        bits_equal(p.run(a, F32(0.5), z4, F32(0.25), np.int8(0)), expected(a, F32(0.5), z4, b, F32(0.1), z4, F32(0.25),
                                                                           np.int8(0)))
    assert seen == ["bad", "bad"], seen
    seen.clear()
    bn = b.copy()
    bn[1, 3] = f8("float8e4m3fn", np.nan)[()]
    a = operand(rng, "float8e4m3fn", (4, 6))
    check(a, F32(0.5), z4, bn, F32(0.1), z4, F32(0.25), np.int8(0))
    check(operand(rng, "int8", (4, 6)), F32(0.5), np.int8(1), operand(rng, "uint8", (6, 5)), F32(0.1), np.uint8(3),
          F32(0.25), z4)
    bb = operand(rng, "float8e4m3fn", (2, 6, 5))
    got = qlinear.qlinear_matmul(a, F32(0.5), z4, bb, F32(0.1), z4, F32(0.25), np.int8(0))
    for i in range(2):
        bits_equal(got[i], expected(a, F32(0.5), z4, bb[i], F32(0.1), z4, F32(0.25), np.int8(0)))
    a5 = operand(rng, "float8e5m2", (4, 40))  # 57344 · 2^16 units · 40 · 448 · 2^9 > 2^52
    check(a5, F32(0.5), f8("float8e5m2", 0.0).reshape(()), f8("float8e4m3fn", np.full((40, 3), 448.0)), F32(0.1), z4,
          F32(0.25), np.int8(0))
    assert seen == [], seen


def test_one_call_bound_edge(engine_level, monkeypatch):
    """The data-free bound at its edge: an e4m3fn a with zero point -448 (units up to 896 ·
    2^9 = 458,752 whatever its values) against a b of centered 896 on every k: 458752^2 · K is
    below 2^52 for K = 21,399 (the one call) and not for K = 21,400 (the general path, which
    finds this a's actual values small and takes one GEMM): both exact."""
    _native_only(engine_level)
    seen = _one_calls(monkeypatch)
    f8 = lambda v: oracle.as_format(oracle.encode_float(np.asarray(v, np.float64), "float8e4m3fn", 1), "float8e4m3fn")  # noqa: E731
    zneg = f8(-448.0).reshape(())
    rng = np.random.default_rng(23)
    for k, path in ((21399, ["done"]), (21400, [])):
        seen.clear()
        a = f8(rng.choice([-448.0, -440.0, 2.0 ** -9, 0.0], size=(2, k)))
        b = f8(np.full((k, 2), 448.0))
        b[-1, 1] = f8(2.0 ** -9)[()]
        check(a, F32(1), zneg, b, F32(2.0 ** -30), zneg, F32(7.0), np.int8(3))
        assert seen == path, (k, seen)


def test_plain_calls_keep_the_decoded_b_by_its_contents(engine_level, monkeypatch):
    """A plain call decodes a b once for later calls with the same contents (another array with
    equal bytes, a non-contiguous view of them); a b changed in place, another b of equal
    shape, a per-column b_scale or b_zero_point changed in place: decoded anew, never the stale
    result."""
    _fmatmul._PLAIN_B.clear()
    decodes = []
    real = _fmatmul._Decoded.__init__

    def counting(self, codes, t, zp, left):
        if not left:
            decodes.append(codes.shape)
        real(self, codes, t, zp, left)

    monkeypatch.setattr(_fmatmul._Decoded, "__init__", counting)
    rng = np.random.default_rng(24)
    b = operand(rng, "float8e4m3fn", (12, 9))
    sb, zb = scale(rng, (9,), F32, 0.01, 0.1), zero_point(rng, "float8e4m3fn", (9,))
    z4 = zero_point(rng, "float8e4m3fn", (), "zero")

    def call(a, b, sb, zb):
        return check(a, F32(0.5), z4, b, sb, zb, F32(0.3), np.int8(0))

    a = operand(rng, "float8e4m3fn", (4, 12))
    call(a, b, sb, zb)
    call(operand(rng, "float8e4m3fn", (4, 12)), b, sb, zb)
    call(a, b.copy(), sb.copy(), zb.copy())
    bt = np.ascontiguousarray(b.T).T  # the same values, Fortran order
    call(a, bt, sb, zb)
    assert len(decodes) == 1, decodes
    b.view(np.uint8)[3, 4] ^= 0x11  # changed in place
    call(a, b, sb, zb)
    assert len(decodes) == 2, decodes
    other = operand(rng, "float8e4m3fn", (12, 9))
    call(a, other, sb, zb)
    assert len(decodes) == 3, decodes
    sb[2] *= F32(3)
    call(a, b, sb, zb)
    zb.view(np.uint8)[5] ^= 0x01
    call(a, b, sb, zb)
    assert len(decodes) == 5, decodes


def test_content_memo_bounds():
    """The plain calls' cache holds at most ``size`` entries and ``budget`` bytes, the oldest
    going first, never an entry larger than the budget; a lookup compares the bytes."""
    from qlinear._prepared import ContentMemo

    memo = ContentMemo(size=2, budget=100)
    xs = [np.full(8, i, np.uint8) for i in range(4)]
    for i in range(3):
        memo.put(("k", i), xs[i].copy(), i, 40)
    assert memo.get(("k", 0), xs[0]) is None and memo.get(("k", 1), xs[1]) == 1 and memo.get(("k", 2), xs[2]) == 2
    memo.put(("k", 3), xs[3].copy(), 3, 70)  # 40 + 70 > 100: the older one goes
    assert memo.get(("k", 1), xs[1]) is None and memo.get(("k", 2), xs[2]) is None and memo.get(("k", 3), xs[3]) == 3
    memo.put(("big",), xs[0].copy(), 9, 101)
    assert memo.get(("big",), xs[0]) is None
    y = xs[3].copy()
    y[7] = 200  # the last byte: outside the eight-byte words
    assert memo.get(("k", 3), y) is None
    z = np.zeros(13, np.uint8)
    memo.put(("odd",), z.copy(), 5, 10)
    z2 = z.copy()
    z2[12] = 1
    assert memo.get(("odd",), z) == 5 and memo.get(("odd",), z2) is None


@pytest.mark.parametrize("sdt", ["float16", "bfloat16"])
def test_graph_8bit_with_narrow_scales_is_prepared_once(monkeypatch, sdt):
    """QLinearMatMul-21 with 8-bit operands and float16/bfloat16 scales in a model: the 8-bit
    prepared form (b packed once over several runs), the oracle's bits."""
    from onnx import TensorProto as T, helper, numpy_helper
    from qlinear import backend, matmul

    dt, elem = (F16, T.FLOAT16) if sdt == "float16" else (BF16, T.BFLOAT16)
    rng = np.random.default_rng(25)
    b = operand(rng, "int8", (16, 8))
    sa, sb, sy = dt(0.05), scale(rng, (8,), dt, 0.01, 0.1), dt(0.5)
    zb = operand(rng, "int8", (8,))
    tensor = lambda n, v: helper.make_tensor(n, elem, v.shape, np.ascontiguousarray(v).view(np.uint16).reshape(-1).tobytes(), raw=True)  # noqa: E731
    inits = [tensor("a_scale", np.asarray(sa)), tensor("b_scale", sb), tensor("y_scale", np.asarray(sy)),
             numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.asarray(np.uint8(7)), "a_zp"),
             numpy_helper.from_array(zb, "b_zp"), numpy_helper.from_array(np.asarray(np.int8(-3)), "y_zp")]
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", T.UINT8, [5, 16])],
                          [helper.make_tensor_value_info("y", T.INT8, [5, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    built = []
    real = matmul.PreparedQLinearMatMul.__init__

    def counting(self, *args, **kw):
        built.append(kw.get("_owned", True))
        real(self, *args, **kw)

    monkeypatch.setattr(matmul.PreparedQLinearMatMul, "__init__", counting)
    rep = backend.prepare(m)
    for _ in range(3):
        a = operand(rng, "uint8", (5, 16))
        (y,) = rep.run({"a": a})
        bits_equal(np.asarray(y), expected(a, sa, np.uint8(7), b, sb, zb, sy, np.int8(-3)))
    assert built == [True], built
