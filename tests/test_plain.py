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
from conftest import ALL_8BIT_COMBOS, DTYPES_8, I8, U8, assert_exact, rand_int, rand_scale


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    saved = qlinear.get_num_threads()
    qlinear.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        qlinear.set_num_threads(saved)


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
