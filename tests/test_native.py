"""Matmul and (de)quantize edge cases aimed at the native engine's blocking, tails, forms and
threads, checked bit for bit against the oracle. Like test_matmul/test_quantize, every test
runs on the NumPy engine and on the native engine at each ISA level this CPU runs (conftest)."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear
from qlinear import _native

import oracle
from conftest import ALL_8BIT_COMBOS, DTYPES_8, I8, U8, assert_exact, num_threads, rand_int, rand_scale

# K lengths around every packing group (2, 4) and a few multiples of the tile widths
K_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 513]
M_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17]
N_SIZES = [1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 65]


def _zp(rng, dtype, shape=()):
    return rand_int(rng, dtype, shape)


@pytest.mark.parametrize("adt,bdt,ydt", ALL_8BIT_COMBOS)
def test_qlinear_matmul_tails_all_types(adt, bdt, ydt):
    rng = np.random.default_rng([1, adt is U8, bdt is U8, ydt is U8])
    for k in K_LENGTHS:
        m, n = int(rng.choice(M_SIZES)), int(rng.choice(N_SIZES))
        a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, n))
        args = (a, rand_scale(rng, (m, 1)), _zp(rng, adt, (m, 1)), b, rand_scale(rng, (n,)),
                _zp(rng, bdt, (n,)), np.float32(rng.uniform(0.5, 2.0)), _zp(rng, ydt))
        assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


@pytest.mark.parametrize("adt", DTYPES_8)
@pytest.mark.parametrize("bdt", DTYPES_8)
def test_matmul_integer_tails_per_row_and_column(adt, bdt):
    rng = np.random.default_rng([2, adt is U8, bdt is U8])
    for k in K_LENGTHS:
        m, n = int(rng.choice(M_SIZES)), int(rng.choice(N_SIZES))
        a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, n))
        for az, bz in [(None, None), (_zp(rng, adt), _zp(rng, bdt)),
                       (_zp(rng, adt, (m,)), _zp(rng, bdt, (n,)))]:
            assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, az, bz))


@pytest.mark.parametrize("adt,bdt", [(U8, I8), (I8, U8), (U8, U8), (I8, I8)])
def test_large_blocks_and_threads(adt, bdt):
    """Several row blocks, many panels, both threads; one and three threads agree."""
    rng = np.random.default_rng(3)
    m, k, n = 301, 700, 99
    a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, n))
    az, bz = _zp(rng, adt, (m,)), _zp(rng, bdt, (n,))
    want = oracle.matmul_integer(a, b, az, bz)
    for threads in (1, 2, 3):
        with num_threads(threads):
            assert_exact(qlinear.matmul_integer(a, b, az, bz), want)
    # K past the driver's K block (2048 int16 or 4096 bytes of a 16-column panel, times 1.5)
    a, b = rand_int(rng, adt, (13, 6200)), rand_int(rng, bdt, (6200, 40))
    az, bz = _zp(rng, adt, (13,)), _zp(rng, bdt, (40,))
    assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, az, bz))


@pytest.mark.parametrize("adt,bdt", [(U8, I8), (I8, U8)])
def test_tall_a_packed_per_row_block(adt, bdt):
    """An a too large for L2 once packed is packed block by block inside the GEMM's tasks."""
    rng = np.random.default_rng(4)
    m, k, n = 1100, 600, 37  # packed a: 1.3 MB (int16), 660 KB (bytes), past 2 x 256 KiB
    a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, n))
    az, bz = _zp(rng, adt, (m, 1)), _zp(rng, bdt, (n,))
    assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, az, bz))
    args = (a, rand_scale(rng, (m, 1)), az, b, rand_scale(rng, (n,)), bz, np.float32(0.3), np.int8(-5))
    assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))
    b7 = rand_int(rng, I8, (k, 48), -64, 64)  # the avx2 fast path, too
    assert_exact(qlinear.matmul_integer(a, b7, az), oracle.matmul_integer(a, b7, az))


@pytest.mark.parametrize("k", [33000, 34000])
def test_accumulators_near_and_past_the_int32_wrap(k):
    """(255 - 0) * (-128 - 127) * 33000 = -2,145,825,000 (just inside int32); 34000 wraps."""
    a = np.full((3, k), 255, dtype=U8)
    a[1, ::7] = 0
    b = np.full((k, 5), -128, dtype=I8)
    b[::5, 2] = 127
    for bz in (np.int8(127), np.array([127, 127, -128, 0, 5], dtype=I8)):
        want = oracle.matmul_integer(a, b, np.uint8(0), bz)
        assert_exact(qlinear.matmul_integer(a, b, np.uint8(0), bz), want)
    # requantized: float32(acc) rounds above 2**24 and the multiplier is tiny
    args = (a, np.float32(1e-4), np.uint8(0), b, np.float32(1e-4), np.int8(127), np.float32(2.0), np.int8(3))
    assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


def test_accumulators_above_2_24_requantize_exactly():
    rng = np.random.default_rng(5)
    k = 2048
    a = rand_int(rng, U8, (7, k), 200, 255)
    b = rand_int(rng, I8, (k, 19), -128, -100)
    args = (a, np.float32(0.013), np.uint8(3), b, np.float32(0.007), np.int8(5), np.float32(731.0), np.uint8(128))
    assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


@pytest.mark.parametrize("bdt,lo,hi", [(I8, -64, 64), (U8, 64, 192)])
def test_seven_bit_weights_fast_path(bdt, lo, hi):
    """Weights whose s8 form is within [-64, 64] take avx2's vpmaddubsw kernel; one value
    outside that range sends the same product to the exact kernel. Both exact."""
    rng = np.random.default_rng(6)
    for adt in DTYPES_8:
        a = rand_int(rng, adt, (37, 300))
        b = rand_int(rng, bdt, (300, 45), lo, hi)
        b[0, 0], b[1, 1] = lo, hi  # the extremes, where saturation would first show
        az, bz = _zp(rng, adt, (37, 1)), _zp(rng, bdt, (1, 45))
        prepared = qlinear.prepare_matmul_integer(b, bz)
        assert_exact(prepared.run(a, az), oracle.matmul_integer(a, b, az, bz))
        assert prepared._b._fits_fast_path()
        b2 = b.copy()
        b2[5, 5] = lo - 1
        assert not qlinear.prepare_matmul_integer(b2, bz)._b._fits_fast_path()
        assert_exact(qlinear.matmul_integer(a, b2, az, bz), oracle.matmul_integer(a, b2, az, bz))
        # the largest pair sums vpmaddubsw could form: 255 * 64 * 2 and 255 * -64 * 2
        a_max = np.full((4, 8), 255 if adt is U8 else 127, dtype=adt)
        b_ext = np.full((8, 16), hi, dtype=bdt)
        b_ext[:, 8:] = lo
        assert_exact(qlinear.matmul_integer(a_max, b_ext), oracle.matmul_integer(a_max, b_ext))


def test_batched_broadcast_per_row_and_column():
    rng = np.random.default_rng(7)
    for a_shape, b_shape, az_shape, bz_shape in [
        ((2, 3, 5, 20), (3, 20, 17), (2, 1, 5, 1), (3, 1, 17)),
        ((4, 6, 33), (33, 9), (4, 6, 1), (9,)),
        ((6, 33), (5, 33, 9), (6, 1), (5, 1, 9)),
        ((33,), (2, 33, 9), (), (2, 1, 9)),
        ((3, 1, 6, 12), (1, 4, 12, 18), (3, 1, 6, 1), (1, 4, 1, 18)),
        ((7, 12), (12,), (7, 1), ()),
    ]:
        a, b = rand_int(rng, U8, a_shape), rand_int(rng, I8, b_shape)
        az, bz = _zp(rng, U8, az_shape), _zp(rng, I8, bz_shape)
        assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, az, bz))
        sa = rand_scale(rng, az_shape)
        sb = rand_scale(rng, bz_shape)
        args = (a, sa, az, b, sb, bz, np.float32(0.05), np.uint8(100))
        assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


@pytest.mark.parametrize("adt,bdt,ydt", ALL_8BIT_COMBOS)
def test_fused_epilogue_every_tile_shape(adt, bdt, ydt):
    """The GEMM's fused epilogue (kernel and requantization in one call, 6-, 4- and 2-row
    bodies for the last rows of M; the 7-bit kernel's with its U8S8 corrections) on every row
    count of a tile, full 16-column tiles and narrower ones, per-tensor and per-column b
    scales and zero points, per-row a ones, outputs clamped at both ends and int32 outputs;
    prepared and plain, one and two threads."""
    rng = np.random.default_rng([12, adt is U8, bdt is U8, ydt is U8])
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 128):
        k = int(rng.choice([2, 3, 64, 130]))
        n = int(rng.choice([16, 32, 40, 17]))
        a = rand_int(rng, adt, (m, k))
        # half of the cases with b in the 7-bit range of avx2's vpmaddubsw kernel (its
        # fused epilogue applies the U8S8 corrections), the others full range
        seven = m % 4 in (1, 2)
        lo, hi = ((-64, 64) if bdt is I8 else (64, 192)) if seven else (None, None)
        b = rand_int(rng, bdt, (k, n), lo, hi)
        per_col, per_row = m % 2 == 1, m % 3 == 0
        bz = _zp(rng, bdt, (n,)) if per_col else _zp(rng, bdt)
        az = _zp(rng, adt, (m, 1)) if per_row else _zp(rng, adt)
        b_scale = rand_scale(rng, (n,)) if per_col else rand_scale(rng)
        a_scale = rand_scale(rng, (m, 1)) if per_row else rand_scale(rng)
        # a y_scale that puts one standard deviation of the accumulator (about 74^2 sqrt(k)
        # for full-range operands) at about 100 steps: some outputs clamp at each end
        y_scale = np.float32(float(np.median(a_scale) * np.median(b_scale)) * 74.0 ** 2 * np.sqrt(k) / 100)
        args = (a, a_scale, az, b, b_scale, bz, y_scale, _zp(rng, ydt))
        want = oracle.qlinear_matmul(*args)
        want_i = oracle.matmul_integer(a, b, az, bz)
        for threads in (1, 2):
            with num_threads(threads):
                assert_exact(qlinear.qlinear_matmul(*args), want)
                assert_exact(qlinear.prepare_qlinear_matmul(b, b_scale, bz).run(a, a_scale, az, y_scale, args[7]), want)
                assert_exact(qlinear.matmul_integer(a, b, az, bz), want_i)
                assert_exact(qlinear.prepare_matmul_integer(b, bz).run(a, az), want_i)
        assert (want == np.iinfo(ydt).min).any() or (want == np.iinfo(ydt).max).any() or m * n < 40


@pytest.mark.parametrize("adt,bdt", [(U8, I8), (I8, U8)])
def test_tall_packed_a_split_by_rows_and_columns(adt, bdt):
    """An a packed per row block inside the GEMM (128 x 3072: past 2 x 256 KiB as int16) whose
    row blocks are also split by columns over two threads: each column block packs its rows."""
    rng = np.random.default_rng(13)
    m, k, n = 128, 3072, 100
    a, b = rand_int(rng, adt, (m, k)), rand_int(rng, bdt, (k, n))
    az, bz = _zp(rng, adt, (m,)), _zp(rng, bdt, (n,))
    want = oracle.matmul_integer(a, b, az, bz)
    for threads in (2, 1):
        with num_threads(threads):
            assert_exact(qlinear.prepare_matmul_integer(b, bz).run(a, az), want)


def test_prepared_forms_own_their_weights():
    rng = np.random.default_rng(8)
    a, b = rand_int(rng, U8, (9, 40)), rand_int(rng, I8, (40, 21))
    bz, bs = _zp(rng, I8, (21,)), rand_scale(rng, (21,))
    want_i = oracle.matmul_integer(a, b, np.uint8(3), bz)
    want_q = oracle.qlinear_matmul(a, np.float32(0.02), np.uint8(3), b, bs, bz, np.float32(0.1), np.int8(0))
    pi = qlinear.prepare_matmul_integer(b, bz)
    pq = qlinear.prepare_qlinear_matmul(b, bs, bz)
    b[:] = 0
    bz[:] = 0
    bs[:] = 1.0
    assert_exact(pi.run(a, np.uint8(3)), want_i)
    assert_exact(pq.run(a, np.float32(0.02), np.uint8(3), np.float32(0.1), np.int8(0)), want_q)


# sizes past the native engine's threading threshold (2**18 values) too, per tensor and per axis
@pytest.mark.parametrize("shape,axis", [((3, 1000), 1), ((70000,), 0), ((5, 7, 2051), 2), ((2, 9, 4099), 1),
                                        ((300001,), None), ((2, 140001), 0), ((70001, 4), 1)])
@pytest.mark.parametrize("ydt", DTYPES_8)
def test_quantize_dequantize_sizes_axes_specials(shape, axis, ydt):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(shape) * 60).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97] = np.nan
    flat[1::89] = np.inf
    flat[2::83] = -np.inf
    flat[3::79] = 0.5  # ties
    flat[4::73] = -2.5
    c = 1 if axis is None else shape[axis]
    scale = rand_scale(rng, (c,), 0.1, 2.0) if axis is not None else np.float32(0.75)
    zp = _zp(rng, ydt, (c,)) if axis is not None else ydt(7)
    kw = {} if axis is None else {"axis": axis}
    q = qlinear.quantize_linear(x, scale, zp, **kw)
    assert_exact(q, oracle.quantize_linear(x, scale, zp, **kw))
    assert_exact(qlinear.dequantize_linear(q, scale, zp, **kw), oracle.dequantize_linear(q, scale, zp, **kw))
    xi = rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32)
    assert_exact(qlinear.quantize_linear(xi, scale, zp, **kw), oracle.quantize_linear(xi, scale, zp, **kw))
    zeros = np.zeros_like(np.asarray(zp), dtype=np.int32)
    assert_exact(qlinear.dequantize_linear(xi, scale, zeros, **kw), oracle.dequantize_linear(xi, scale, zeros, **kw))


def test_engine_level_is_selected(engine_level):
    if engine_level is None:
        pytest.skip("no engine level")
    info = qlinear.engine_info()
    if engine_level == "numpy":
        assert info["engine"] == "numpy"
    else:
        assert info["engine"] == "native" and info["isa"] == engine_level.split("-", 1)[1]
        assert _native.native() is not None


# Outputs of 16 MiB or more are written with non-temporal stores (a 32-byte aligned body after a
# scalar head): per tensor, and per axis with runs that start at unaligned addresses.
@pytest.mark.parametrize("xdt", [np.uint8, np.int8, np.int32])
@pytest.mark.parametrize("shape,axis", [((4 * 2**20 + 13,), None), ((3, 1398107), 0)])
def test_dequantize_streamed_outputs(xdt, shape, axis):
    rng = np.random.default_rng(11)
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max, size=shape, dtype=np.int64).astype(xdt)
    c = 1 if axis is None else shape[axis]
    scale = rand_scale(rng, (c,), 0.01, 3.0) if axis is not None else np.float32(0.37)
    if xdt == np.int32:
        zp = np.zeros(c, np.int32) if axis is not None else np.int32(0)
    else:
        zp = _zp(rng, xdt, (c,)) if axis is not None else xdt(-3 if xdt == np.int8 else 200)
    kw = {} if axis is None else {"axis": axis}
    assert_exact(qlinear.dequantize_linear(x, scale, zp, **kw), oracle.dequantize_linear(x, scale, zp, **kw))


def test_output_pool_reuses_released_outputs_only():
    if _native.native() is None:
        pytest.skip("the output pool belongs to the native engine")
    C = _native._C
    C.pool_clear()
    x = np.arange(2**20, dtype=np.int64).astype(np.uint8)  # a 4 MiB float32 output
    want = oracle.dequantize_linear(x, np.float32(0.5), np.uint8(3))
    a = qlinear.dequantize_linear(x, np.float32(0.5), np.uint8(3))
    b = qlinear.dequantize_linear(x, np.float32(0.5), np.uint8(3))
    assert not np.shares_memory(a, b)  # both alive: never one block
    assert_exact(a, want)
    assert_exact(b, want)
    address = a.ctypes.data
    view = a[10:]
    del a
    assert C.pool_stats()[1] == 0  # the view keeps a's block out of the pool
    c = qlinear.dequantize_linear(x, np.float32(0.25), np.uint8(0))
    assert c.ctypes.data != address and not np.shares_memory(c, b)
    assert_exact(view, want[10:])
    del view
    assert C.pool_stats()[:2] == (4 * 2**20, 1)  # released now
    d = qlinear.dequantize_linear(x, np.float32(0.5), np.uint8(3))
    assert d.ctypes.data == address and C.pool_stats()[1] == 0  # reused, and out of the pool
    assert_exact(d, want)
    assert_exact(c, oracle.dequantize_linear(x, np.float32(0.25), np.uint8(0)))
    # bounded: many sizes leave at most 8 blocks and 256 MiB cached
    for n in range(1, 40, 3):
        qlinear.dequantize_linear(np.zeros(n * 2**20 + 7, np.uint8), np.float32(1.0))
    cached, blocks, _, max_mib = C.pool_stats()
    assert 0 < blocks <= 8 and cached <= max_mib * 2**20
    C.pool_clear()
    assert C.pool_stats()[:2] == (0, 0)


def test_kernel_peak_runs_every_kernel(engine_level):
    """The micro-kernel loop behind qlinear bench's peak: every kernel of the level runs on
    its L1-resident operands and reports the multiply-adds done (tasks x reps x mr x nr x 256)."""
    if engine_level in (None, "numpy"):
        pytest.skip("native levels only")
    C = _native._C
    isa = engine_level.split("-", 1)[1]
    for which in (0, 1):
        info = C.kernel_info(isa, which)
        if info is None:
            continue
        assert C.kernel_peak(isa, which, 3, 5, 2) == 5 * 3 * info["mr"] * info["nr"] * 256
    with pytest.raises(ValueError):
        C.kernel_peak(isa, 0, 0, 1, 1)


def test_bench_measures_the_peak():
    if _native.native() is None:
        pytest.skip("needs the native engine")
    from qlinear.tools.bench.machine import measure_peak

    got = measure_peak(2, seconds=0.002, trials=2)
    assert got["isa"] == _native.isa()
    assert got["kernels"]["exact"]["gmacs_1t"] > 0 and got["peak_gmacs"] > 0


def test_limits_and_codes_come_from_the_engine():
    """Python reads the engine's limits and codes (``_qlnative.limits()``: the values of its C
    headers) instead of copies kept by hand: conv.py's rank, channels-last taps and path kinds,
    matmul.py's C int bound and the type codes are the module's values, and the codes mean what
    the module does with them (a kind past them is refused, the kernel codes pick the kernels
    ``kernel_info`` describes)."""
    C = _native._C
    if C is None:
        pytest.skip("needs the native engine")
    from qlinear.engines.native import conv, matmul

    lim = C.limits()
    assert _native.LIMITS == lim
    assert conv.MAX_RANK == lim["conv_max_rank"] >= 3
    assert conv.DW_CL_MAX_TAPS == lim["dw_cl_max_taps"] >= 9
    kinds = lim["conv_kinds"]
    assert (conv.GEMM, conv.DEPTHWISE, conv.GEMM_FAST) == (kinds["gemm"], kinds["depthwise"], kinds["gemm_fast"])
    assert len(set(kinds.values())) == 3
    assert matmul.MAX_DIM == lim["max_dim"] == 2**31 - 1
    assert _native.TYPE_CODES == lim["types"]
    assert {np.dtype(k): v for k, v in lim["types"].items()} == _native.DTYPE_CODES
    isa = _native.isa()
    kern = lim["kernels"]
    assert C.kernel_info(isa, kern["exact"])["form"] in ("i16", "u8s8")
    fast = C.kernel_info(isa, kern["conv_fast"])
    assert fast is None or fast["form"] == "s8u8"
    # a weight packing named by a conv kind packs for that kind's kernel (conv.py relies on it)
    assert C.conv_w_bytes(isa, kinds["gemm"], 8, 9, 9) == C.conv_w_bytes(isa, kern["exact"], 8, 9, 9)
    with pytest.raises(ValueError, match="conv kernel"):
        C.conv_w_bytes(isa, kinds["depthwise"], 8, 9, 9)
