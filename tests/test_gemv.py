"""The matrix-vector products (qlinear/csrc/gemm/gemv.c, include/gemv.h): a one-row a times a
prepared b narrow enough to keep a gemv form after its GEMM panels, against the oracle on every
engine and ISA level, and proof (the native gemv_count) that the cases took that path."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import ALL_8BIT_COMBOS, I8, U8, assert_exact, num_threads, rand_extreme, rand_int, rand_scale

#: include/gemv.h's QL_GEMV_MAX_N
MAX_N = 256


def _native_level(engine_level):
    from qlinear import _native
    if engine_level in (None, "numpy") or _native.native() is None:
        return None
    return _native._C.get_isa()


def _has_form(level: str, n: int) -> bool:
    """gemv.h's rule (ql_gemv_has_form): at most MAX_N columns, and the exact kernel's panels
    (nr columns each) at least an eighth padding. Every prepared b here takes the exact kernel
    (full-range b; a level's fast kernel, where it has one, has the same nr)."""
    from qlinear.engines.native import matmul as nmm
    nr = nmm.kernel_info(level, 0)["nr"]
    npad = -(-n // nr) * nr
    return 0 < n <= MAX_N and (npad - n) * 8 >= npad


def _gemv_count() -> int:
    from qlinear import _native
    return _native._C.gemv_count() if _native.native() is not None else 0


def _y_scale(rng, a_s, b_s, k):
    """an output scale that spreads the results over roughly +-120 steps"""
    return np.float32(float(np.max(a_s)) * float(np.max(b_s)) * 120 * np.sqrt(k) * rng.uniform(0.3, 3))


# (K, N): K within one 64-byte block, at and around its multiples (the kernels' whole blocks,
# the driver's tail of K % 64), several blocks; N from one column to past a 32-column panel,
# narrow and wide enough to have no gemv form on some levels
_CASES = [(1, 1), (3, 6), (63, 2), (64, 7), (65, 5), (100, 9), (127, 13), (128, 16), (200, 17),
          (259, 31), (300, 33), (513, 40), (1000, 6), (77, 100), (130, 3)]


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_one_row_times_narrow_b(case, engine_level):
    """QLinearMatMul and MatMulInteger, prepared forms, a of one row (2-D, and 1-D), all 8 type
    combinations with full-range operands (a and b at their types' ends every 3rd element),
    per-tensor and per-column b zero points and scales, a one-element per-row a parameter; and
    that every product with a gemv form took it (on a native level)."""
    k, n = _CASES[case]
    level = _native_level(engine_level)
    rng = np.random.default_rng([case, 71])
    for r, (adt, bdt, ydt) in enumerate(ALL_8BIT_COMBOS):
        a = rand_int(rng, adt, (1, k))
        a.flat[::3] = rand_extreme(rng, adt, a.flat[::3].shape)
        b = rand_int(rng, bdt, (k, n))
        b.flat[1::3] = rand_extreme(rng, bdt, b.flat[1::3].shape)
        per_col = r % 2 == 0
        a_s = rand_scale(rng, (1, 1) if r % 4 == 1 else ())
        a_z = rand_int(rng, adt, (1, 1) if r % 4 == 1 else ())
        b_s = rand_scale(rng, (n,) if per_col else ())
        b_z = rand_int(rng, bdt, (n,) if per_col else ())
        ys, yz = _y_scale(rng, a_s, b_s, k), rand_int(rng, ydt, ())
        before = _gemv_count()
        qmm = qlinear.prepare_qlinear_matmul(b, b_s, b_z)
        mmi = qlinear.prepare_matmul_integer(b, b_z)
        assert_exact(qmm.run(a, a_s, a_z, ys, yz), oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, ys, yz))
        assert_exact(mmi.run(a, a_z), oracle.matmul_integer(a, b, a_z, b_z))
        a1, a1_z = a[0], a_z.reshape(())   # a 1-D a: one row too
        assert_exact(mmi.run(a1, a1_z), oracle.matmul_integer(a1, b, a1_z, b_z))
        assert_exact(qmm.run(a1, a_s.reshape(()), a1_z, ys, yz),
                     oracle.qlinear_matmul(a1, a_s.reshape(()), a1_z, b, b_s, b_z, ys, yz))
        if level is not None:
            assert _gemv_count() - before == (4 if _has_form(level, n) else 0), (level, k, n)


@pytest.mark.parametrize("shapes", [((3, 1, 70), (3, 70, 5)), ((1, 70), (4, 70, 6)), ((2, 1, 1, 65), (1, 3, 65, 2))],
                         ids=["batched", "a-broadcast", "both-broadcast"])
def test_batched_b_one_row_each(shapes, engine_level):
    """A prepared batched b (one packed entry, and gemv form, per matrix) times an a of one row
    per batch entry: each output entry reads its own b entry's form (a broadcast against the
    batch too); per-column zero points and scales."""
    sa, sb = shapes
    level = _native_level(engine_level)
    rng = np.random.default_rng([len(sa), sb[-1], 73])
    for adt, bdt, ydt in ALL_8BIT_COMBOS[:4]:
        a = rand_int(rng, adt, sa)
        b = rand_int(rng, bdt, sb)
        n = sb[-1]
        a_s, a_z = rand_scale(rng, ()), rand_int(rng, adt, ())
        b_s, b_z = rand_scale(rng, (n,)), rand_int(rng, bdt, (n,))
        ys, yz = _y_scale(rng, a_s, b_s, sb[-2]), rand_int(rng, ydt, ())
        before = _gemv_count()
        assert_exact(qlinear.prepare_qlinear_matmul(b, b_s, b_z).run(a, a_s, a_z, ys, yz),
                     oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, ys, yz))
        assert_exact(qlinear.prepare_matmul_integer(b, b_z).run(a, a_z), oracle.matmul_integer(a, b, a_z, b_z))
        if level is not None:
            assert _gemv_count() - before == (2 if _has_form(level, n) else 0), level


@pytest.mark.parametrize("threads", [1, 2])
def test_wraps_and_threads(threads, engine_level):
    """A long K (60000: 2.4 million multiply-adds over 40 columns, past the threaded split of k)
    whose exact sums leave int32 (a and b at the ends that make every product ±255·255, 4·10^9 in
    all): the result is the contract's wrap32 of the exact sum, on one thread and on two (k cut
    into blocks whose partial sums are added), int32 and requantized outputs."""
    level = _native_level(engine_level)
    rng = np.random.default_rng([threads, 79])
    k, n = 60000, 40
    for adt, bdt in ((U8, I8), (I8, U8)):
        lo_a, hi_a = np.iinfo(adt).min, np.iinfo(adt).max
        lo_b, hi_b = np.iinfo(bdt).min, np.iinfo(bdt).max
        a = np.full((1, k), hi_a, adt)
        a[0, ::97] = rand_int(rng, adt, a[0, ::97].shape)   # not one value throughout
        b = np.full((k, n), lo_b, bdt)
        b[:, ::2] = hi_b                                    # columns of either sign
        b[::89] = rand_int(rng, bdt, b[::89].shape)
        a_z = np.array(lo_a, adt)
        b_z = np.where(np.arange(n) % 2 == 0, lo_b, hi_b).astype(bdt)
        want = oracle.matmul_integer(a, b, a_z, b_z)
        exact = (np.asarray(a, np.int64) - int(a_z)) @ (np.asarray(b, np.int64) - b_z.astype(np.int64))
        assert (np.abs(exact) > 2**31).any()               # the case does wrap
        b_s, a_s = rand_scale(rng, (n,)), rand_scale(rng, ())
        ys, yz = _y_scale(rng, a_s, b_s, k), np.uint8(128)
        before = _gemv_count()
        with num_threads(threads):
            assert_exact(qlinear.prepare_matmul_integer(b, b_z).run(a, a_z), want)
            assert_exact(qlinear.prepare_qlinear_matmul(b, b_s, b_z).run(a, a_s, a_z, ys, yz),
                         oracle.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, ys, yz))
        if level is not None:
            assert _gemv_count() - before == (2 if _has_form(level, n) else 0), level


@pytest.mark.parametrize("adt,bdt", [(U8, I8), (U8, U8), (I8, I8)], ids=["u8s8", "u8u8", "s8s8"])
def test_qgemm_one_row_narrow(adt, bdt, engine_level):
    """com.microsoft QGemm as a classifier head runs it (ece_cnn96's: one row, six columns,
    transB, an int32 bias C): its product is the gemv's, then C (wrap32) and the requantization,
    through prepare_qgemm's run and its bound run (a graph's planned node, whose epilogue is
    the lean ufunc form), per-tensor and per-column b scales, outputs that saturate at both ends
    of the output type and ones that do not."""
    from qlinear import contrib
    level = _native_level(engine_level)
    rng = np.random.default_rng([np.dtype(adt).num, np.dtype(bdt).num, 83])
    k, n = 2304, 6
    for r in range(4):
        a = rand_int(rng, adt, (1, k))
        b = rand_int(rng, bdt, (n, k))
        cc = rng.integers(-300000, 300000, (n,)).astype(np.int32)
        a_s = np.float32(0.004)
        b_s = rand_scale(rng, (n,) if r % 2 else ())
        az, bz = rand_int(rng, adt, ()), rand_int(rng, bdt, ())
        ydt = (U8, I8)[r % 2]
        yz = rand_int(rng, ydt, ())
        mult_want = np.float32(np.float32(np.float32(1.0) * a_s) * b_s)
        acc = oracle.wrap32(oracle.matmul_integer(a, b.T, az, bz).astype(np.int64) + cc)
        spread = float(np.abs(acc.astype(np.float64) * mult_want).max())
        ys = np.float32(spread / (400 if r < 2 else 60))   # most saturate / few saturate
        want = oracle.requantize(acc, np.float32(mult_want / ys), np.int64(yz), ydt)
        assert (want == np.iinfo(ydt).min).any() or (want == np.iinfo(ydt).max).any() or r >= 2
        prepared = contrib.prepare_qgemm(b, b_s, bz, transB=1)
        before = _gemv_count()
        assert_exact(prepared.run(a, a_s, az, cc, ys, yz), want)
        bound = prepared.bound_run(a, a_s, az, cc, ys, yz)
        assert bound is not None
        assert_exact(bound(a), want)
        if level is not None:
            assert _gemv_count() - before == (2 if _has_form(level, n) else 0)
