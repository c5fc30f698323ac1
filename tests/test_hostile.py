"""Hostile and huge inputs to the six operators (issue 11, API): sizes are checked before
anything is allocated, valid but extreme attributes compute without materializing anything
huge, NumPy's own errors never leak, float32 under/overflow is arithmetic and not an error,
messages say what is wrong, byte order is handled one way and masked arrays are refused.
Ends with a bounded fuzz test: every call returns the oracle's answer or raises
ValueError/TypeError naming the operator."""

from __future__ import annotations

import os
import re
import signal
import tracemalloc
import warnings
from contextlib import contextmanager

import numpy as np
import pytest

import oracle
import qlinear
from qlinear import _native
from conftest import I8, I32, U8, assert_exact, rand_int

F32 = np.float32


@contextmanager
def time_limit(seconds: float):
    """Fail (TimeoutError) instead of hanging: SIGALRM in the main thread."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def output_limit():
    """Restore the output-size limit a test changes."""
    before = qlinear.max_output_bytes()
    yield
    qlinear.set_max_output_bytes(before)


def huge(dtype, shape):
    """A read-only array of any shape that takes no memory (every element the same)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def raises(exc, op, *names):
    """pytest.raises for a message that starts with the operator and names all of ``names``."""
    pattern = rf"^{op}: " + "".join(rf"(?=(.|\n)*{re.escape(n)})" for n in names)
    return pytest.raises(exc, match=pattern)


X44 = np.arange(16, dtype=U8).reshape(1, 1, 4, 4) * 13
W11 = np.array([3, -2], I8).reshape(2, 1, 1, 1)


def convint(x, w, **attrs):
    return qlinear.conv_integer(x, w, U8(7), I8(1), **attrs)


def oracle_convint(x, w, **attrs):
    return oracle.conv_integer(x, w, U8(7), I8(1), **attrs)


# ----------------------------------------------------------------------------- sizes checked before allocating


@pytest.mark.parametrize("attrs, shape", [
    (dict(pads=[2**62] * 4), "(1, 2, 9223372036854775812, 9223372036854775812)"),
    (dict(pads=[2**40, 0, 2**40, 0]), "(1, 2, 2199023255556, 4)"),
])
def test_conv_output_above_limit_is_named_before_allocating(attrs, shape):
    with raises(ValueError, "conv_integer", "output", shape, "set_max_output_bytes"):
        convint(X44, W11, **attrs)
    with raises(ValueError, "qlinear_conv", "output", shape):
        qlinear.qlinear_conv(X44, F32(1), U8(0), W11, F32(1), I8(0), F32(1), U8(0), **attrs)


@pytest.mark.parametrize("engine_level", [None, "numpy"], indirect=True)
def test_lowered_limit_applies_to_shapes_seen_before(output_limit, engine_level):
    """A prepared form that has run an input shape (its validation remembered, its repeat path
    armed) checks that shape again after the limit is lowered below the output's size: the
    prepared QLinearConv / ConvInteger once kept answering (found by the whole-model work,
    24 November), the matmuls already refused."""
    w = rand_int(np.random.default_rng(1), I8, (8, 4, 3, 3))
    x = np.ones((1, 4, 16, 16), U8)
    a, b = np.ones((16, 64), U8), np.ones((64, 64), I8)
    forms = [
        ("qlinear_conv", qlinear.prepare_qlinear_conv(w, F32(0.1), I8(0), None, pads=[1] * 4),
         lambda p: p.run(x, F32(0.1), U8(0), F32(1), U8(0))),
        ("conv_integer", qlinear.prepare_conv_integer(w, I8(0), pads=[1] * 4), lambda p: p.run(x, U8(0))),
        ("qlinear_matmul", qlinear.prepare_qlinear_matmul(b, F32(0.1), I8(0)),
         lambda p: p.run(a, F32(0.1), U8(0), F32(1), U8(0))),
        ("matmul_integer", qlinear.prepare_matmul_integer(b, I8(0)), lambda p: p.run(a, U8(0))),
    ]
    for op, p, call in forms:
        qlinear.set_max_output_bytes(1 << 30)
        call(p)
        call(p)
        qlinear.set_max_output_bytes(1500)   # above the weights' copies, below every output
        with raises(ValueError, op, "output", "set_max_output_bytes"):
            call(p)


def test_conv_huge_strides_have_one_output():
    w = rand_int(np.random.default_rng(0), I8, (2, 1, 3, 3))
    for attrs in (dict(strides=[2**62] * 2), dict(strides=[2**63 - 1] * 2, pads=[1] * 4)):
        with time_limit(5):
            got = convint(X44, w, **attrs)
        assert_exact(got, oracle_convint(X44, w, **attrs))


def test_attributes_beyond_int64_are_refused():
    with raises(ValueError, "conv_integer", "pads", "int64"):
        convint(X44, W11, pads=[2**63] * 4)
    with raises(ValueError, "conv_integer", "strides", "int64"):
        convint(X44, W11, strides=[2**64, 1])
    with raises(ValueError, "conv_integer", "group", "int64"):
        convint(X44, W11, group=2**70)


def test_matmul_outputs_above_limit_are_named():
    a, b = huge(U8, (2**20, 1)), huge(U8, (1, 2**20))
    with raises(ValueError, "matmul_integer", "output", "(1048576, 1048576)", "set_max_output_bytes"):
        qlinear.matmul_integer(a, b)
    with raises(ValueError, "qlinear_matmul", "output", "(1048576, 1048576)"):
        qlinear.qlinear_matmul(a, F32(1), U8(0), b, F32(1), U8(0), F32(1), U8(0))
    # broadcast batch dimensions
    with raises(ValueError, "matmul_integer", "output", "(1048576, 1, 1048576)"):
        qlinear.matmul_integer(huge(U8, (2**20, 1, 1)), huge(U8, (1, 1, 2**20)))
    # per-row and per-column scales: their 2^20 x 2^20 multiplier is refused, not allocated
    with raises(ValueError, "qlinear_matmul", "multiplier", "(1048576, 1048576)"):
        qlinear.qlinear_matmul(a, np.ones(2**20, F32), np.zeros(2**20, U8), b,
                               np.ones(2**20, F32), np.zeros(2**20, U8), F32(1), U8(0))


def test_matmul_huge_reduction_is_named():
    """(Terabyte broadcast views are refused as the arrays they stand for: see
    test_broadcast_views_are_bounded_as_the_arrays_they_stand_for.)"""
    a, b = huge(U8, (1, 2**40)), huge(I8, (2**40, 1))
    with raises(ValueError, "matmul_integer", "b is a view of shape (1099511627776, 1)", "1 TiB"):
        qlinear.matmul_integer(a, b)
    with raises(ValueError, "matmul_integer", "a is a view of shape (1048576, 1048576)", "1 TiB"):
        qlinear.prepare_matmul_integer(np.zeros((2**20, 1), I8)).run(huge(U8, (2**20, 2**20)))


def test_huge_weights_and_elementwise_inputs_are_named():
    with raises(ValueError, "conv_integer", "w is a view of shape (1048576, 1, 1024, 1024)"):
        qlinear.conv_integer(X44, huge(I8, (2**20, 1, 2**10, 2**10)))
    with raises(ValueError, "quantize_linear", "x is a view of shape (1099511627776,)"):
        qlinear.quantize_linear(huge(F32, (2**40,)), F32(1))
    with raises(ValueError, "dequantize_linear", "x is a view of shape (1099511627776,)"):
        qlinear.dequantize_linear(huge(U8, (2**40,)), F32(1))


@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_a_broadcast_view_input_is_not_copied_past_the_limit(output_limit, engine):
    """x as a broadcast view (no memory) whose copy would be above max_output_bytes, with a
    small output: refused on both engines before anything is copied. The native engine used
    to copy x to contiguous memory unchecked (a (1024,)*4 view: NumPy's MemoryError for 1 TiB),
    also on the lean path of a repeated plain call after a first call on a real array."""
    from qlinear import _native

    if engine == "native" and not _native.available():
        pytest.skip("native engine not built")
    shape = (1, 256, 128, 128)                       # 4 MiB as uint8
    w = np.ones((1, 256, 1, 1), I8)                  # output (1, 1, 128, 128): 64 KiB as int32
    q = (F32(0.5), U8(3), w, F32(0.25), I8(0), F32(2), U8(7))
    with _native.use_engine(engine):
        qlinear.set_max_output_bytes(1 << 20)
        real = np.zeros((1, 256, 4, 4), U8)          # a first call on a real array: plans cached
        qlinear.conv_integer(real, w)
        qlinear.qlinear_conv(real, q[0], q[1], *q[2:])
        view = huge(U8, shape)
        with raises(ValueError, "conv_integer", "x", str(shape), "set_max_output_bytes"):
            qlinear.conv_integer(view, w)
        with raises(ValueError, "conv_integer", "x", str(shape), "set_max_output_bytes"):
            qlinear.prepare_conv_integer(w).run(view)
        with raises(ValueError, "qlinear_conv", "x", str(shape), "set_max_output_bytes"):
            qlinear.qlinear_conv(view, q[0], q[1], *q[2:])
        # the lean path of a repeated plain call with the same shapes
        small = np.broadcast_to(U8(9), (1, 256, 4, 4))
        with raises(ValueError, "qlinear_conv", "x", "(1, 256, 4, 4)", "set_max_output_bytes"):
            qlinear.set_max_output_bytes(4000)           # the 4 KiB copy of x is above it
            qlinear.qlinear_conv(small, q[0], q[1], *q[2:])
        qlinear.set_max_output_bytes(1 << 20)
        assert_exact(qlinear.conv_integer(small, w), oracle.conv_integer(np.ascontiguousarray(small), w))


def _contrib_huge_cases():
    import qlinear.contrib as qc

    big, bigf = huge(U8, (2**20, 2**20)), huge(F32, (2**20, 2**20))
    col, row = huge(U8, (2**20, 1)), huge(U8, (1, 2**20))
    p = (F32(0.1), U8(3))
    return {
        "qlinear_add": lambda: qc.qlinear_add(col, *p, row, *p, *p),
        "qlinear_mul": lambda: qc.qlinear_mul(col, *p, row, *p, *p),
        "prepared qlinear_add": lambda: qc.prepare_qlinear_binary("add", U8, *p, *p, *p).run(col, row),
        "qlinear_where": lambda: qc.qlinear_where(huge(np.bool_, (2**20, 2**20)), np.zeros(1, U8), *p,
                                                  np.zeros(1, U8), *p, *p),
        "qlinear_sigmoid": lambda: qc.qlinear_sigmoid(big, *p, *p),
        "qlinear_leaky_relu": lambda: qc.qlinear_leaky_relu(big, *p, *p),
        "qlinear_concat": lambda: qc.qlinear_concat(*p, big, *p, axis=0),
        "qlinear_global_average_pool": lambda: qc.qlinear_global_average_pool(
            huge(U8, (2**20, 2**20, 1, 1)), *p, *p),
        "qlinear_average_pool": lambda: qc.qlinear_average_pool(huge(U8, (2**10,) * 4), *p, *p,
                                                                kernel_shape=[1, 1]),
        "qlinear_softmax": lambda: qc.qlinear_softmax(big, F32(0.05), None, F32(1 / 256), U8(0), opset=13),
        # the output (N, 3, H, W) of a channels-last x (N, H, W, 1): 12 TiB of int32
        "qlinear_conv": lambda: qc.qlinear_conv(huge(U8, (2**10, 2**15, 2**15, 1)), F32(1), U8(0),
                                                np.zeros((3, 1, 1, 1), I8), F32(1), I8(0), F32(1), U8(0),
                                                channels_last=1),
        # a 3 GiB output, but the native engine's contiguous copy of the moved-axis x is 1 TiB
        "x-copy qlinear_conv": lambda: qc.qlinear_conv(huge(U8, (2**10,) * 4), F32(1), U8(0),
                                                       np.zeros((3, 2**10, 1, 1), I8), F32(1), I8(0), F32(1),
                                                       U8(0), channels_last=1),
        "dynamic_quantize_linear": lambda: qc.dynamic_quantize_linear(bigf),
        "gelu": lambda: qc.gelu(bigf),
        "fast_gelu": lambda: qc.fast_gelu(bigf),
        "skip_layer_normalization": lambda: qc.skip_layer_normalization(
            huge(F32, (2**20, 2**20, 2)), huge(F32, (2**20, 2**20, 2)), np.ones(2, F32)),
    }


@pytest.mark.parametrize("case", list(_contrib_huge_cases()))
def test_contrib_operators_check_sizes_before_allocating(case):
    """qlinear.contrib's operators on broadcast views (no memory) whose outputs or working
    copies would take terabytes: one ValueError naming the operator and the limit, at once.
    They used to raise NumPy's MemoryError (or, dynamic_quantize_linear, to reduce over 2**40
    elements for minutes before it)."""
    if case.startswith("x-copy") and qlinear.engine_info()["engine"] != "native":
        pytest.skip("the NumPy engine copies x one image at a time (4 GiB here, within the "
                    "default limit): there is no whole-x copy to refuse, and the 3 GiB output is allowed")
    op = case.split()[-1]
    with time_limit(10), raises(ValueError, op, "set_max_output_bytes"):
        _contrib_huge_cases()[case]()


def _view_cases():
    """Calls whose one or two inputs are broadcast views of 2 MiB or more as arrays, with
    outputs (and, on some engine, working copies) within 1 MiB: (input name, shape, call)."""
    import qlinear.contrib as qc

    row, col = huge(U8, (1, 2**21)), huge(I8, (2**21, 1))
    f = huge(F32, (2**19,))
    p = (F32(0.1), U8(3))
    return {
        "quantize_linear": ("x", f.shape, lambda: qlinear.quantize_linear(f, F32(0.5), U8(3))),
        "dequantize_linear": ("x", (2**21,), lambda: qlinear.dequantize_linear(
            huge(U8, (2**21,)), F32(0.5), U8(3)) and None),
        "matmul_integer": ("b", col.shape, lambda: qlinear.matmul_integer(row, col)),
        "qlinear_matmul": ("b", col.shape, lambda: qlinear.qlinear_matmul(
            row, *p, col, F32(0.1), I8(0), *p)),
        "prepared matmul_integer": ("b", col.shape, lambda: qlinear.prepare_matmul_integer(col)),
        "conv_integer": ("x", (1, 1, 2**11, 2**10), lambda: qlinear.conv_integer(
            huge(U8, (1, 1, 2**11, 2**10)), np.ones((1, 1, 1, 1), I8), strides=[2**11, 2**10])),
        "qlinear_conv": ("x", (1, 1, 2**11, 2**10), lambda: qlinear.qlinear_conv(
            huge(U8, (1, 1, 2**11, 2**10)), *p, np.ones((1, 1, 1, 1), I8), F32(0.1), I8(0), *p,
            strides=[2**11, 2**10])),
        "dynamic_quantize_linear": ("x", f.shape, lambda: qc.dynamic_quantize_linear(f)),
        "qlinear_global_average_pool": ("X", (1, 1, 2**11, 2**10), lambda: qc.qlinear_global_average_pool(
            huge(U8, (1, 1, 2**11, 2**10)), *p, *p)),
        "qgemm": ("A", row.shape, lambda: qc.qgemm(row, *p, col, F32(0.1), I8(0))),
        "matmul_integer_to_float": ("A", row.shape, lambda: qc.matmul_integer_to_float(
            row, col, F32(0.1), F32(0.1))),
        "qlinear_sigmoid": ("X", (2**21,), lambda: qc.qlinear_sigmoid(huge(U8, (2**21,)), *p, *p)),
        "gelu": ("X", f.shape, lambda: qc.gelu(f)),
    }


@pytest.mark.parametrize("case", list(_view_cases()))
def test_broadcast_views_are_bounded_as_the_arrays_they_stand_for(output_limit, case):
    """A broadcast view takes no memory, but an operator reads (and may copy) each of its
    elements: one above max_output_bytes as an array is refused like the array's copy would
    be, naming the operator, the input and its shape, even where the output is small (a
    reduction over 2**34 elements of a view used to run for minutes, or to fail with NumPy's
    MemoryError on a contiguous copy, or with the native engine's OverflowError for K >= 2**31).
    The same view within the limit, and a real array above it, are computed."""
    name, shape, call = _view_cases()[case]
    op = case.split()[-1]
    qlinear.set_max_output_bytes(1 << 20)
    with time_limit(10), raises(ValueError, op, f"{name} is a view of shape {shape}",
                                "(a broadcast view)", "2 MiB", "set_max_output_bytes"):
        call()


def test_views_within_the_limit_and_real_arrays_above_it_are_computed(output_limit):
    import qlinear.contrib as qc

    qlinear.set_max_output_bytes(1 << 20)
    view = np.broadcast_to(np.linspace(-2, 2, 512, dtype=F32), (512, 512))  # 1 MiB as an array
    y, s, z = qc.dynamic_quantize_linear(view)
    want = qc.dynamic_quantize_linear(np.ascontiguousarray(view))
    assert_exact(y, want[0])
    assert (s, z) == (want[1], want[2])
    real = np.zeros(2**19, F32)                    # 2 MiB, a real array: accepted
    assert_exact(qlinear.quantize_linear(real, F32(1), U8(3)), np.full(2**19, 3, U8))
    # an as_strided view that does not repeat memory (every other element) is a real array's
    strided = np.zeros(2**20, F32)[::2]
    assert_exact(qlinear.quantize_linear(strided, F32(1), U8(3)), np.full(2**19, 3, U8))
    # non-native byte order reaches the com.microsoft float operators too (was a TypeError)
    big_endian = np.linspace(-2, 2, 64, dtype=F32).astype(">f4")
    assert_exact(qc.gelu(big_endian), qc.gelu(big_endian.astype(F32)))


@pytest.mark.parametrize("shapes", [((3, 9), (9, 2)), ((3, 2), (2, 9)), ((2, 5, 2), (2, 3)),
                                    ((9, 2), (2, 3))])
def test_matmul_sizes_beyond_the_native_ints_take_the_numpy_engine(monkeypatch, shapes):
    """The native matmul takes M (batch entries folded in), N and K as C ints: a K of 2**31 (a
    broadcast view of 2 GiB, or a real array) raised the argument parser's OverflowError. Sizes
    above the bound go to the NumPy engine, exactly. Checked with the bound lowered to 7 (the
    real one needs arrays of gigabytes): the native engine is not called, the result is the
    oracle's, for plain and prepared MatMulInteger and QLinearMatMul."""
    from qlinear import _native
    from qlinear.engines.native import matmul as native_matmul
    from qlinear import matmul

    if not _native.available():
        pytest.skip("native engine not built")

    def refuse(*_, **__):
        raise AssertionError("the native engine was called")

    monkeypatch.setattr(native_matmul, "MAX_DIM", 7)
    monkeypatch.setattr(matmul, "_native_matmul", refuse)
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, shapes[0], dtype=np.int64).astype(U8)
    b = rng.integers(-128, 128, shapes[1], dtype=np.int64).astype(I8)
    q = (F32(0.02), U8(100), F32(0.01), I8(3), F32(0.5), U8(120))
    with _native.use_engine("native"):
        want = oracle.matmul_integer(a, b, U8(7), I8(-3))
        assert_exact(qlinear.matmul_integer(a, b, U8(7), I8(-3)), want)
        assert_exact(qlinear.prepare_matmul_integer(b, I8(-3)).run(a, U8(7)), want)
        want = oracle.qlinear_matmul(a, q[0], q[1], b, q[2], q[3], q[4], q[5])
        assert_exact(qlinear.qlinear_matmul(a, q[0], q[1], b, q[2], q[3], q[4], q[5]), want)
        assert_exact(qlinear.prepare_qlinear_matmul(b, q[2], q[3]).run(a, q[0], q[1], q[4], q[5]), want)


def test_output_limit_is_settable(output_limit):
    x = np.zeros((1, 1, 40, 40), U8)
    assert convint(x, W11).shape == (1, 2, 40, 40)
    qlinear.set_max_output_bytes(1000)
    assert qlinear.max_output_bytes() == 1000
    with raises(ValueError, "conv_integer", "output", "(1, 2, 40, 40)", "12.5 KiB", "1000 bytes"):
        convint(x, W11)
    with raises(ValueError, "matmul_integer", "output"):
        qlinear.matmul_integer(np.zeros((40, 4), U8), np.zeros((4, 40), U8))
    for bad in (0, -5, 1.5, "1000", True):
        with pytest.raises(ValueError, match="^set_max_output_bytes: nbytes"):
            qlinear.set_max_output_bytes(bad)


def test_workspace_limit_refuses_what_is_not_a_byte_count():
    """set_workspace_limit takes an integer number of bytes the native engine can hold (a C
    ssize_t): a string, a float, a bool or 2**70 used to be accepted (the last one then made
    every convolution fail with OverflowError)."""
    before = qlinear.workspace_limit()
    try:
        for bad in (0, -5, 1.5, 1e9, "1000", True, None, 2**63, 2**70):
            with pytest.raises(ValueError, match="^set_workspace_limit: nbytes must be an integer"):
                qlinear.set_workspace_limit(bad)
            assert qlinear.workspace_limit() == before
        qlinear.set_workspace_limit(np.int64(2**63 - 1))  # the largest, accepted
        assert qlinear.workspace_limit() == 2**63 - 1
        assert convint(np.zeros((1, 1, 4, 4), U8), W11).shape == (1, 2, 4, 4)
    finally:
        qlinear.set_workspace_limit(before)


# ----------------------------------------------------------------------------- extreme attributes, small work


def test_one_by_one_with_pads_and_strides_2_20_computes_3x3():
    attrs = dict(pads=[2**20] * 4, strides=[2**20] * 2)
    with time_limit(5):
        got = convint(X44, W11, **attrs)
    assert got.shape == (1, 2, 3, 3)
    assert_exact(got, oracle_convint(X44, W11, **attrs))
    b = np.array([5, -7], I32)
    args = (X44, F32(0.5), U8(7), W11, np.array([0.25, 2.0], F32), np.array([1, -1], I8), F32(0.75), I8(3), b)
    assert_exact(qlinear.qlinear_conv(*args, **attrs), oracle.qlinear_conv(*args, **attrs))


def test_huge_strides_do_not_loop_over_their_product():
    w = rand_int(np.random.default_rng(1), I8, (3, 1, 3, 3))
    x = rand_int(np.random.default_rng(2), U8, (2, 1, 9, 7))
    for attrs in (dict(pads=[1] * 4, strides=[100000] * 2),
                  dict(pads=[100000, 1, 100000, 1], strides=[100000, 3]),
                  dict(auto_pad="SAME_UPPER", strides=[100000, 100000]),
                  dict(pads=[2**40] * 4, strides=[2**40] * 2, dilations=[2**40] * 2)):
        with time_limit(5):
            got = convint(x, w, **attrs)
        assert_exact(got, oracle_convint(x, w, **attrs))


def test_no_padded_copy_larger_than_the_windows_read():
    """pads and strides of 1000 around a 4x4 image: the windows read a 3x3 grid of pixels. A
    padded float32 copy of the image would take 2004² x 4 = 16 MB; nothing near that is made."""
    attrs = dict(pads=[1000] * 4, strides=[1000] * 2)
    convint(X44, W11)  # first-call allocations (caches) out of the way
    tracemalloc.start()
    try:
        got = convint(X44, W11, **attrs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.shape == (1, 2, 3, 3)
    assert peak < 1 << 20, f"peak allocation {peak} bytes"
    assert_exact(got, oracle_convint(X44, W11, **attrs))


def conv_geometry_cases():
    """Pads, strides and dilations larger than the kernel, the windows reading sparse
    positions of the input or of its padding: the paths that gather what the windows read."""
    rng = np.random.default_rng(11)
    cases = []
    i = 0
    while len(cases) < 60:
        i += 1
        nsp = 1 + i % 3
        kernel = rng.integers(1, 4, nsp)
        dil = rng.choice([1, 2, 5, 40], nsp)
        strides = rng.choice([1, 2, 4, 7, 33, 1000], nsp)
        pads = rng.choice([0, 1, 3, 9, 50, 2000], 2 * nsp)
        size = [int(max(1, (k - 1) * d + 1 - pads[j] - pads[j + nsp]) + rng.integers(0, 6))
                for j, (k, d) in enumerate(zip(kernel, dil))]
        group = int(rng.choice([1, 2]))
        out = oracle.conv_geometry(size, kernel, pads=pads, strides=strides, dilations=dil)[2]
        if min(out) < 1 or np.prod(out) > 5000:  # invalid, or slow for the oracle
            continue
        cases.append(dict(x_shape=(int(rng.integers(1, 3)), 2 * group if i % 4 else group, *size),
                          w_shape=(2 * group, 2 if i % 4 else 1, *map(int, kernel)), group=group,
                          pads=[int(p) for p in pads], strides=[int(s) for s in strides],
                          dilations=[int(d) for d in dil]))
    return cases


@pytest.mark.parametrize("case", conv_geometry_cases())
def test_extreme_geometry_matches_oracle(case):
    case = dict(case)
    rng = np.random.default_rng(len(str(case)))
    x = rand_int(rng, U8, case.pop("x_shape"))
    w = rand_int(rng, I8, case.pop("w_shape"))
    m = w.shape[0]
    ws, wzp = (rng.uniform(0.001, 0.05, m).astype(F32), rand_int(rng, I8, (m,)))
    b = rand_int(rng, I32, (m,), -5000, 5000)
    args = (x, F32(0.02), U8(131), w, ws, wzp, F32(0.3), U8(128), b)
    with time_limit(10):
        got = qlinear.qlinear_conv(*args, **case)
        got_int = qlinear.conv_integer(x, w, U8(131), wzp, **case)
    assert_exact(got, oracle.qlinear_conv(*args, **case))
    assert_exact(got_int, oracle.conv_integer(x, w, U8(131), wzp, **case))


@pytest.mark.parametrize("engine_level", ["numpy", None], indirect=True)
@pytest.mark.parametrize("op", ["conv_integer", "qlinear_conv"])
def test_pads_of_2_31_compute_only_the_windows_reading_input(output_limit, engine_level, op):
    """Issue 28, 7: a pad of 2**31 on a small input made the NumPy engine index and copy
    every padded position the windows read (here 64 Mi positions: a 512 MiB index, 256 MiB
    float copy, each under the limit alone), or refuse. Windows reading padding only sum
    nothing: now they are filled with their one value (the bias alone), and only the window
    reading x is computed: well under the limit, in well under a second."""
    qlinear.set_max_output_bytes(768 << 20)
    rng = np.random.default_rng(28)
    x = rng.integers(0, 256, (1, 1, 4), dtype=U8)
    w = rng.integers(-128, 128, (2, 1, 1024), dtype=I8)
    pads, stride = [2**31, 2**31], 2**16
    outputs = (2**32 + 4 - 1024) // stride + 1
    hit = 2**31 // stride  # the one window whose taps 0..3 read x[0..3]
    xzp, wzp = np.uint8(7), np.zeros(2, I8)
    dot = (x[0, 0].astype(np.int64) - 7) @ (w[:, 0, :4].astype(np.int64) - wzp[:, None]).T
    tracemalloc.start()
    try:
        with time_limit(20):
            if op == "conv_integer":
                y = qlinear.conv_integer(x, w, xzp, wzp, pads=pads, strides=[stride])
                want = np.zeros((1, 2, outputs), np.int32)
                want[0, :, hit] = dot
            else:
                bias = np.array([1000, -77777], np.int32)
                args = (F32(0.05), xzp, w, np.array([0.01, 0.02], F32), wzp, F32(0.5), np.uint8(128))
                y = qlinear.qlinear_conv(x, *args[:2], w, *args[3:], B=bias, pads=pads, strides=[stride])
                window = np.full((1, 1, 1024), 7, U8)  # the window reading x, then padding
                window[0, 0, :4] = x[0, 0]
                one = oracle.qlinear_conv(window, *args[:2], w, *args[3:], B=bias)
                pad = oracle.qlinear_conv(np.full((1, 1, 1024), 7, U8), *args[:2], w, *args[3:], B=bias)
                want = np.broadcast_to(pad, (1, 2, outputs)).copy()
                want[0, :, hit] = one[0, :, 0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_exact(y, want)
    assert peak < 16 << 20, peak  # the output is 512 KiB


@pytest.mark.parametrize("engine_level", ["numpy", None], indirect=True)
def test_windows_reading_padding_only_match_the_oracle(engine_level):
    """Pads beyond the kernel's extent, with strides and dilations, on 1-D and 2-D inputs
    (the windows reading padding only are filled, the rest computed on cropped x): every
    value equals the oracle's, bias included, for ConvInteger and QLinearConv."""
    rng = np.random.default_rng(2028)
    for _ in range(60):
        nsp = int(rng.integers(1, 3))
        spatial = rng.integers(1, 6, nsp)
        kernel = rng.integers(1, 4, nsp)
        dil = rng.integers(1, 4, nsp)
        strides = [int(s) for s in rng.integers(1, 6, nsp)]
        pads = [int(p) for p in rng.integers(0, 14, 2 * nsp)]
        if any((b + n + e - ((k - 1) * d + 1)) < 0 for b, n, e, k, d in zip(
                pads[:nsp], spatial, pads[nsp:], kernel, dil)):
            continue
        c, m = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        x = rng.integers(0, 256, (2, c, *spatial), dtype=U8)
        w = rng.integers(-128, 128, (m, c, *kernel), dtype=I8)
        kw = dict(pads=pads, strides=strides, dilations=[int(d) for d in dil])
        xzp = np.uint8(rng.integers(0, 256))
        assert_exact(qlinear.conv_integer(x, w, xzp, np.int8(3), **kw),
                     oracle.conv_integer(x, w, xzp, np.int8(3), **kw))
        bias = rng.integers(-2**31, 2**31, m, dtype=np.int64).astype(np.int32) if rng.integers(2) \
            else rng.integers(-300, 300, m).astype(np.int32)
        args = (F32(0.03), xzp, w, F32(0.002), np.int8(0), F32(0.7), np.int8(-5))
        assert_exact(qlinear.qlinear_conv(x, *args, B=bias, **kw),
                     oracle.qlinear_conv(x, *args, B=bias, **kw))


@pytest.mark.parametrize("op", ["matmul_integer", "qlinear_matmul", "conv_integer", "qlinear_conv"])
def test_one_calls_arrays_are_bounded_together(output_limit, op):
    """Issue 28, 7: max_output_bytes bounded each array alone, so the NumPy engine's arrays
    of one call (output, float32 copies of the operands, padded copy of an image) could
    together pass it. Here each is under the limit and their sum is not: refused before
    anything is allocated, naming the total and the parts; the native engine, which makes
    none of those copies, computes the call."""
    rng = np.random.default_rng(7)
    if "matmul" in op:
        a = rng.integers(0, 256, (256, 512), dtype=U8)   # float32 copy 512 KiB
        b = rng.integers(-128, 128, (512, 256), dtype=I8)  # float32 copy 512 KiB
        args = (a, b, None, None) if op == "matmul_integer" else \
            (a, F32(0.1), np.uint8(3), b, F32(0.01), np.int8(0), F32(0.5), np.uint8(9))
        call = getattr(qlinear, op)
        kw = {}
    else:
        x = rng.integers(0, 256, (1, 64, 32, 32), dtype=U8)  # padded float32 copy 296 KiB
        w = rng.integers(-128, 128, (64, 64, 3, 3), dtype=I8)  # output 256 KiB
        args = (x, w, None, None) if op == "conv_integer" else \
            (x, F32(0.1), np.uint8(3), w, F32(0.01), np.int8(0), F32(0.5), np.uint8(9))
        call = getattr(qlinear, op)
        kw = {"pads": [1, 1, 1, 1]}
    want = getattr(oracle, op)(*args, **kw)
    qlinear.set_max_output_bytes(540 << 10 if "conv" in op else 1 << 20)
    with _native.use_engine("numpy"):
        with raises(ValueError, op, "together", "above the limit"):
            call(*args, **kw)
    if _native.available():
        with _native.use_engine("native"):
            assert_exact(call(*args, **kw), want)
    qlinear.set_max_output_bytes(8 << 20)
    with _native.use_engine("numpy"):
        assert_exact(call(*args, **kw), want)


# ----------------------------------------------------------------------------- NumPy's errors never leak


class RaisingArray:
    """An object whose __array__ raises."""

    def __array__(self, *args, **kwargs):
        raise RuntimeError("no array for you")


RAGGED = [[1, 2], [3]]


def op_calls():
    """(operator, input name, call(value)) for every input of every operator."""
    x, w = X44, W11
    a, b = np.ones((2, 3), U8), np.ones((3, 2), I8)
    xf = np.ones((2, 3), F32)
    qconv, qmm = qlinear.qlinear_conv, qlinear.qlinear_matmul
    return [
        ("qlinear_conv", "x", lambda v: qconv(v, F32(1), U8(0), w, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_conv", "x_scale", lambda v: qconv(x, v, U8(0), w, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_conv", "x_zero_point", lambda v: qconv(x, F32(1), v, w, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_conv", "w", lambda v: qconv(x, F32(1), U8(0), v, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_conv", "w_scale", lambda v: qconv(x, F32(1), U8(0), w, v, I8(0), F32(1), U8(0))),
        ("qlinear_conv", "w_zero_point", lambda v: qconv(x, F32(1), U8(0), w, F32(1), v, F32(1), U8(0))),
        ("qlinear_conv", "y_scale", lambda v: qconv(x, F32(1), U8(0), w, F32(1), I8(0), v, U8(0))),
        ("qlinear_conv", "y_zero_point", lambda v: qconv(x, F32(1), U8(0), w, F32(1), I8(0), F32(1), v)),
        ("qlinear_conv", "B", lambda v: qconv(x, F32(1), U8(0), w, F32(1), I8(0), F32(1), U8(0), v)),
        ("conv_integer", "x", lambda v: qlinear.conv_integer(v, w)),
        ("conv_integer", "w", lambda v: qlinear.conv_integer(x, v)),
        ("conv_integer", "x_zero_point", lambda v: qlinear.conv_integer(x, w, v)),
        ("conv_integer", "w_zero_point", lambda v: qlinear.conv_integer(x, w, None, v)),
        ("qlinear_matmul", "a", lambda v: qmm(v, F32(1), U8(0), b, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_matmul", "a_scale", lambda v: qmm(a, v, U8(0), b, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_matmul", "a_zero_point", lambda v: qmm(a, F32(1), v, b, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_matmul", "b", lambda v: qmm(a, F32(1), U8(0), v, F32(1), I8(0), F32(1), U8(0))),
        ("qlinear_matmul", "b_scale", lambda v: qmm(a, F32(1), U8(0), b, v, I8(0), F32(1), U8(0))),
        ("qlinear_matmul", "b_zero_point", lambda v: qmm(a, F32(1), U8(0), b, F32(1), v, F32(1), U8(0))),
        ("qlinear_matmul", "y_scale", lambda v: qmm(a, F32(1), U8(0), b, F32(1), I8(0), v, U8(0))),
        ("qlinear_matmul", "y_zero_point", lambda v: qmm(a, F32(1), U8(0), b, F32(1), I8(0), F32(1), v)),
        ("matmul_integer", "a", lambda v: qlinear.matmul_integer(v, b)),
        ("matmul_integer", "b", lambda v: qlinear.matmul_integer(a, v)),
        ("matmul_integer", "a_zero_point", lambda v: qlinear.matmul_integer(a, b, v)),
        ("matmul_integer", "b_zero_point", lambda v: qlinear.matmul_integer(a, b, None, v)),
        ("quantize_linear", "x", lambda v: qlinear.quantize_linear(v, F32(1))),
        ("quantize_linear", "y_scale", lambda v: qlinear.quantize_linear(xf, v)),
        ("quantize_linear", "y_zero_point", lambda v: qlinear.quantize_linear(xf, F32(1), v)),
        ("dequantize_linear", "x", lambda v: qlinear.dequantize_linear(v, F32(1))),
        ("dequantize_linear", "x_scale", lambda v: qlinear.dequantize_linear(a, v)),
        ("dequantize_linear", "x_zero_point", lambda v: qlinear.dequantize_linear(a, F32(1), v)),
    ]


OP_CALLS = op_calls()
OP_IDS = [f"{op} {name}" for op, name, _ in OP_CALLS]


@pytest.mark.parametrize("op, name, call", OP_CALLS, ids=OP_IDS)
@pytest.mark.parametrize("value", [RAGGED, RaisingArray()], ids=["ragged list", "raising __array__"])
def test_numpy_errors_do_not_leak(op, name, call, value):
    with raises(TypeError, op, name):
        call(value)


def test_auto_pad_that_is_not_text():
    with raises(ValueError, "conv_integer", "auto_pad", r"b'\xff'"):
        convint(X44, W11, auto_pad=b"\xff")
    assert_exact(convint(X44, W11, auto_pad=b"SAME_UPPER"), oracle_convint(X44, W11, auto_pad="SAME_UPPER"))


# ----------------------------------------------------------------------------- float32 under/overflow is arithmetic


# (x_scale, w_scale, y_scale): products underflowing to 0, to denormals, multipliers tiny and huge
EXTREME_SCALES = [
    (1e-30, 1e-30, 1.0),        # product 1e-60 underflows to 0: every output is y_zero_point
    (1e-20, 1e-20, 1e-38),      # product 1e-40 is a denormal; divided by 1e-38: 0.01
    (1e-45, 1.0, 1.0),          # the smallest denormal
    (3e38, 1.0, 1.0),           # multiplier 3e38: every nonzero accumulator saturates
    (1e30, 1e8, 1.0),           # product 1e38, still finite
    (1e-30, 1e-8, 1e-38),       # denormal multiplier
]


def conv_path_cases():
    """One case per engine path: pointwise, strided pointwise, stride-1 flat layout,
    depthwise (flat and strided), im2col, chunked reduction (long K, full-range values)."""
    return {
        "pointwise": (dict(x_shape=(2, 3, 5, 5), w_shape=(4, 3, 1, 1)), {}),
        "pointwise strided": (dict(x_shape=(1, 3, 6, 6), w_shape=(4, 3, 1, 1)), dict(strides=[2, 2])),
        "3x3 stride 1": (dict(x_shape=(1, 3, 6, 20), w_shape=(4, 3, 3, 3)), dict(pads=[1] * 4)),
        "depthwise": (dict(x_shape=(1, 4, 6, 6), w_shape=(4, 1, 3, 3)), dict(group=4, pads=[1] * 4)),
        "depthwise strided": (dict(x_shape=(1, 4, 7, 7), w_shape=(8, 1, 3, 3)), dict(group=4, strides=[2, 2])),
        "im2col": (dict(x_shape=(2, 3, 7, 7), w_shape=(4, 3, 3, 3)), dict(strides=[2, 2], dilations=[1, 2])),
        "gathered": (dict(x_shape=(1, 3, 4, 4), w_shape=(4, 3, 2, 2)), dict(pads=[30] * 4, strides=[30, 30])),
        "chunked": (dict(x_shape=(1, 300, 3, 3), w_shape=(2, 300, 3, 3)), {}),
    }


@pytest.mark.parametrize("scales", EXTREME_SCALES, ids=[str(s) for s in EXTREME_SCALES])
@pytest.mark.parametrize("path", list(conv_path_cases()))
def test_conv_extreme_scales_under_errstate_raise(path, scales):
    shapes, attrs = conv_path_cases()[path]
    rng = np.random.default_rng(5)
    x, w = rand_int(rng, U8, shapes["x_shape"]), rand_int(rng, I8, shapes["w_shape"])
    m = w.shape[0]
    xs, ws, ys = (F32(s) for s in scales)
    b = rand_int(rng, I32, (m,), -1000, 1000)
    for w_scale, w_zp in ((ws, I8(3)), (np.full(m, ws, F32), np.arange(m, dtype=I8))):
        args = (x, xs, U8(120), w, w_scale, w_zp, ys, I8(-5), b)
        want = oracle.qlinear_conv(*args, **attrs)
        with np.errstate(all="raise"):
            got = qlinear.qlinear_conv(*args, **attrs)
            prepared = qlinear.prepare_qlinear_conv(w, w_scale, w_zp, b, **attrs)
            got_prepared = prepared.run(x, xs, U8(120), ys, I8(-5))
        assert_exact(got, want)
        assert_exact(got_prepared, want)


@pytest.mark.parametrize("scales", EXTREME_SCALES, ids=[str(s) for s in EXTREME_SCALES])
def test_matmul_extreme_scales_under_errstate_raise(scales):
    rng = np.random.default_rng(6)
    a, b = rand_int(rng, U8, (2, 3, 300)), rand_int(rng, I8, (300, 4))
    s_a, s_b, s_y = (F32(s) for s in scales)
    for a_scale, b_scale, a_zp, b_zp in ((s_a, s_b, U8(9), I8(-2)),
                                         (np.full(3, s_a, F32), np.full(4, s_b, F32),
                                          np.arange(3, dtype=U8), np.arange(4, dtype=I8))):
        args = (a, a_scale, a_zp, b, b_scale, b_zp, s_y, U8(17))
        want = oracle.qlinear_matmul(*args)
        with np.errstate(all="raise"):
            got = qlinear.qlinear_matmul(*args)
        assert_exact(got, want)


@pytest.mark.parametrize("scale", [1e-45, 1e-38, 1e-30, 1e30, 3e38])
def test_quantize_dequantize_extreme_scales_under_errstate_raise(scale):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 1, 20), [1e-38, -1e-40, 3e38, -3e38, 0.0, np.inf, -np.inf, np.nan]])
    x = x.astype(F32).reshape(4, 7)
    xi = rand_int(rng, I32, (4, 7))
    q = rand_int(rng, I8, (4, 7))
    for s, zp in ((F32(scale), I8(3)), (np.full(7, scale, F32), np.arange(7, dtype=I8))):
        with np.errstate(all="raise"):
            got = [qlinear.quantize_linear(x, s, zp, axis=1), qlinear.quantize_linear(xi, s, zp, axis=1),
                   qlinear.dequantize_linear(q, s, zp, axis=1),
                   qlinear.dequantize_linear(xi, s, axis=1)]
        want = [oracle.quantize_linear(x, s, zp, axis=1), oracle.quantize_linear(xi, s, zp, axis=1),
                oracle.dequantize_linear(q, s, zp, axis=1), oracle.dequantize_linear(xi, s, axis=1)]
        for g, w in zip(got, want):
            assert_exact(g, w)


def test_float64_scale_that_underflows_float32_is_zero():
    """A float64 scale below float32's range rounds to 0 (float32 arithmetic), without an error."""
    with np.errstate(all="raise"):
        y = qlinear.dequantize_linear(np.full(3, 7, U8), np.float64(1e-60))
    assert_exact(y, np.zeros(3, F32))
    with raises(ValueError, "quantize_linear", "y_scale", "1e-60", "0 in float32"):
        qlinear.quantize_linear(np.ones(3, F32), 1e-60)


# ----------------------------------------------------------------------------- messages say what is wrong


def test_zero_among_per_axis_scales_is_named():
    with raises(ValueError, "quantize_linear", "y_scale", "zero", "got 0.0 at index 2"):
        qlinear.quantize_linear(np.ones((2, 4), F32), np.array([1.0, 0.5, 0.0, 2.0], F32), axis=1)
    with raises(ValueError, "qlinear_conv", "w_scale", "finite", "nan at index 1"):
        qlinear.qlinear_conv(X44, F32(1), U8(0), W11, np.array([1, np.nan], F32), I8(0), F32(1), U8(0))


@pytest.mark.parametrize("value", [1e300, np.float64(-1e39), np.array([1.0, 5e38])])
def test_scale_overflowing_float32_is_named_without_a_warning(value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with raises(ValueError, "dequantize_linear", "x_scale", "overflows float32"):
            qlinear.dequantize_linear(np.ones((2, 2), U8), value, axis=0)


# ----------------------------------------------------------------------------- byte order, masked arrays


def swapped(arr):
    """The same values in the non-native byte order."""
    arr = np.asarray(arr)
    return arr.astype(arr.dtype.newbyteorder("S"))


def test_non_native_byte_order_is_accepted_everywhere():
    rng = np.random.default_rng(8)
    x, w = rand_int(rng, U8, (1, 3, 5, 5)), rand_int(rng, I8, (4, 3, 3, 3))
    ws, b = np.full(4, 0.01, F32), rand_int(rng, I32, (4,), -100, 100)
    args = [x, F32(0.02), U8(5), w, ws, np.zeros(4, I8), F32(0.3), U8(9), b]
    want = qlinear.qlinear_conv(*args, pads=[1] * 4)
    assert_exact(qlinear.qlinear_conv(*[swapped(v) for v in args], pads=[1] * 4), want)
    assert_exact(qlinear.conv_integer(*[swapped(v) for v in (x, w, U8(5), I8(2))]),
                 qlinear.conv_integer(x, w, U8(5), I8(2)))
    a, bm = rand_int(rng, I8, (3, 6)), rand_int(rng, U8, (6, 2))
    margs = [a, np.full(3, 0.1, F32), np.arange(3, dtype=I8), bm, F32(0.2), U8(1), F32(0.5), I8(0)]
    assert_exact(qlinear.qlinear_matmul(*[swapped(v) for v in margs]), qlinear.qlinear_matmul(*margs))
    assert_exact(qlinear.matmul_integer(swapped(a), swapped(bm), swapped(I8(1))), qlinear.matmul_integer(a, bm, I8(1)))
    xf = rng.normal(0, 3, (2, 5)).astype(F32)
    xi = rand_int(rng, I32, (2, 5))
    for xq in (xf, xi):
        assert_exact(qlinear.quantize_linear(swapped(xq), swapped(np.full(5, 0.1)), swapped(np.arange(5, dtype=I8))),
                     qlinear.quantize_linear(xq, np.full(5, 0.1), np.arange(5, dtype=I8)))
    assert_exact(qlinear.dequantize_linear(swapped(xi), swapped(F32(0.1)), swapped(I32(0))),
                 qlinear.dequantize_linear(xi, F32(0.1), I32(0)))
    prepared = qlinear.prepare_qlinear_conv(swapped(w), swapped(ws), swapped(np.zeros(4, I8)), swapped(b), pads=[1] * 4)
    assert_exact(prepared.run(swapped(x), swapped(F32(0.02)), swapped(U8(5)), swapped(F32(0.3)), swapped(U8(9))), want)


@pytest.mark.parametrize("op, name, call", OP_CALLS, ids=OP_IDS)
def test_masked_arrays_are_refused(op, name, call):
    valid = {"x": np.ones((1, 1, 4, 4), U8), "w": np.ones((2, 1, 1, 1), I8), "B": np.zeros(2, I32),
             "a": np.ones((2, 3), U8), "b": np.ones((3, 2), I8)}
    if op == "quantize_linear" and name == "x":
        value = np.ones((2, 3), F32)
    elif op.endswith("matmul") or op == "matmul_integer":
        value = {"a": valid["a"], "b": valid["b"]}.get(name)
    else:
        value = valid.get(name)
    if value is None:  # a scale or zero point
        if name.endswith("scale"):
            value = np.ones(1, F32)
        else:
            value = np.zeros(1, I8 if name in ("w_zero_point", "b_zero_point") else U8)
    with raises(TypeError, op, name, "masked"):
        call(np.ma.masked_array(value, mask=np.zeros(value.shape, bool)))


# ----------------------------------------------------------------------------- bounded fuzz of the API

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# QLINEAR_FUZZ_EXAMPLES=n and QLINEAR_FUZZ_RANDOM=1 run a longer, freshly random campaign by hand.
FUZZ_SETTINGS = dict(max_examples=int(os.environ.get("QLINEAR_FUZZ_EXAMPLES", 120)),
                     derandomize=not os.environ.get("QLINEAR_FUZZ_RANDOM"), deadline=None, database=None,
                     print_blob=True, suppress_health_check=list(HealthCheck))

# Values no operator input accepts, or accepts only in some places.
GARBAGE = [
    None, 0, -1, 300, 2**70, 1.5, float("nan"), float("inf"), -0.0, 1e300, "x", b"\xff", [], RAGGED, [1, 2],
    RaisingArray(), object(), np.ma.masked_array([1, 2], mask=[0, 1]).astype(U8), np.array([], U8),
    np.zeros((0, 3), U8), np.array(["a"]), np.array([1 + 2j]), np.float16(1), np.float64(1e300),
    np.float32(0), np.float32(-0.0), np.float32(1e-45), np.float32(3e38), np.int64(3), np.bool_(True),
    np.zeros((2, 2), U8), np.zeros(5, I8), np.full(3, np.nan, F32), np.datetime64("2020"), np.array(2, U8),
    np.array([7], I8), np.zeros(2, I32), swapped(np.ones(2, F32)), huge(U8, (2**40,)), huge(I8, (1, 1, 2**20, 2**20)),
    np.ones((1, 1, 1, 1), I8), np.ones((2, 1, 1), U8), np.array([[1.0]], np.float64),
]
INTS = [0, 1, 2, 3, -1, 2**20, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 + 5, -(2**63)]
ATTR_GARBAGE = [None, "1", 1.0, True, [1.5], RAGGED, b"\xff", object(), np.array([1, 1]), np.int64(2)]


class Maybe:
    """maybe(valid): the valid value; or the same value in another form the operators accept
    (non-native byte order, a Python scalar, shape [1]); or a value drawn from ``garbage``.
    How often garbage comes is drawn once per example, so that some examples have none."""

    def __init__(self, data):
        self.data = data
        self.p_garbage = data.draw(st.sampled_from([0.0, 0.05, 0.3]), label="p_garbage")

    def __call__(self, valid, garbage=GARBAGE):
        draw = self.data.draw
        u = draw(st.floats(0, 1))
        if u < self.p_garbage:
            return draw(st.sampled_from(garbage))
        if u < self.p_garbage + 0.15 and isinstance(valid, (np.ndarray, np.generic)):
            forms = [swapped(valid)]
            if valid.size == 1:
                forms.append(valid.reshape(1))
                if valid.dtype.kind == "f":
                    forms.append(float(valid.reshape(-1)[0]))
            return draw(st.sampled_from(forms))
        return valid


def attr(data, valid_lists, length):
    """An int-list attribute: absent, plausible, extreme, or garbage."""
    kind = data.draw(st.sampled_from(["absent", "valid", "extreme", "garbage"]))
    if kind == "absent":
        return None
    if kind == "valid":
        return data.draw(st.lists(st.sampled_from(valid_lists), min_size=length, max_size=length))
    if kind == "extreme":
        return data.draw(st.lists(st.sampled_from(INTS), min_size=data.draw(st.sampled_from([length, length, 1, 0])),
                                  max_size=length + 1))
    return data.draw(st.sampled_from(ATTR_GARBAGE))


OUTCOMES = []


def check_call(op, call, reference):
    """call() returns reference() (when the oracle can judge) or raises ValueError/TypeError
    whose message starts with the operator's name; never anything else, never a hang."""
    try:
        with time_limit(10), np.errstate(all="raise"):  # float32 under/overflow is not an error
            got = call()
    except (ValueError, TypeError) as e:
        assert str(e).startswith(f"{op}: "), f"{type(e).__name__} without the operator's name: {e}"
        OUTCOMES.append("refused")
        return "refused"
    assert isinstance(got, np.ndarray)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = reference()
        except Exception:  # the oracle does not validate: garbage it cannot judge
            OUTCOMES.append("unjudged")
            return "unjudged"
    assert_exact(got, want)
    OUTCOMES.append("computed")
    return "computed"


@pytest.fixture
def fuzz_limits(output_limit):
    """Small outputs only, so that every accepted call is quick to compute and to check."""
    qlinear.set_max_output_bytes(1 << 22)


@settings(**FUZZ_SETTINGS)
@given(st.data())
def test_fuzz_conv(fuzz_limits, data):
    maybe = Maybe(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    nsp = data.draw(st.integers(1, 2))
    group = data.draw(st.sampled_from([1, 2]))
    x = rand_int(rng, U8, (data.draw(st.integers(1, 2)), 2 * group, *rng.integers(1, 6, nsp)))
    w = rand_int(rng, I8, (2 * group, 2, *rng.integers(1, 4, nsp)))
    m = w.shape[0]
    attrs = dict(
        auto_pad=maybe(data.draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])),
                       ["same_upper", b"VALID", b"\xff", "", 3, None, "NOTSET\x00"]),
        group=maybe(group, [0, -1, 3, 2**62, 2**64, 1.0, "1", None, True]),
        pads=attr(data, [0, 1, 2, 5, 2**20], 2 * nsp),
        strides=attr(data, [1, 2, 3, 100000, 2**20], nsp),
        dilations=attr(data, [1, 2, 3, 2**20], nsp),
        kernel_shape=maybe(None, [list(w.shape[2:]), [1] * nsp, [0] * nsp, [2**63] * nsp]),
    )
    attrs = {k: v for k, v in attrs.items() if v is not None or data.draw(st.booleans())}
    if attrs.get("pads") is not None and attrs.get("auto_pad", "NOTSET") != "NOTSET" and data.draw(st.booleans()):
        del attrs["pads"]
    args = [maybe(x), maybe(F32(0.02)), maybe(U8(128)), maybe(w),
            maybe(np.full(m, 0.01, F32)), maybe(np.zeros(m, I8)), maybe(F32(0.3)),
            maybe(I8(-3)), maybe(rand_int(rng, I32, (m,), -1000, 1000))]
    check_call("qlinear_conv", lambda: qlinear.qlinear_conv(*args, **attrs),
               lambda: oracle.qlinear_conv(*args, **attrs))
    check_call("conv_integer", lambda: qlinear.conv_integer(args[0], args[3], args[2], args[5], **attrs),
               lambda: oracle.conv_integer(args[0], args[3], args[2], args[5], **attrs))

    def prepared_twice():  # the second call reuses what the first derived
        prepared = qlinear.prepare_qlinear_conv(*args[3:6], args[8], **attrs)
        first = prepared.run(*args[:3], *args[6:8])
        assert_exact(prepared.run(*args[:3], *args[6:8]), first)
        return first
    check_call("qlinear_conv", prepared_twice, lambda: oracle.qlinear_conv(*args, **attrs))


@settings(**FUZZ_SETTINGS)
@given(st.data())
def test_fuzz_matmul(fuzz_limits, data):
    maybe = Maybe(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a_shape = data.draw(st.sampled_from([(3, 4), (2, 3, 4), (4,), (1, 3, 4)]))
    b_shape = data.draw(st.sampled_from([(4, 5), (2, 4, 5), (4,), (3, 4, 5)]))
    a, b = rand_int(rng, U8, a_shape), rand_int(rng, I8, b_shape)
    args = [maybe(a), maybe(F32(0.02)), maybe(U8(7)), maybe(b),
            maybe(F32(0.05)), maybe(I8(1)), maybe(F32(0.1)), maybe(U8(128))]
    check_call("qlinear_matmul", lambda: qlinear.qlinear_matmul(*args), lambda: oracle.qlinear_matmul(*args))
    check_call("matmul_integer", lambda: qlinear.matmul_integer(args[0], args[3], args[2], args[5]),
               lambda: oracle.matmul_integer(args[0], args[3], args[2], args[5]))

    def prepared_twice():
        prepared = qlinear.prepare_qlinear_matmul(*args[3:6])
        first = prepared.run(*args[:3], *args[6:])
        assert_exact(prepared.run(*args[:3], *args[6:]), first)
        return first
    check_call("qlinear_matmul", prepared_twice, lambda: oracle.qlinear_matmul(*args))


@settings(**FUZZ_SETTINGS)
@given(st.data())
def test_fuzz_quantize(fuzz_limits, data):
    maybe = Maybe(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    with np.errstate(over="ignore", under="ignore"):
        xf = (rng.normal(0, 100, (2, 3, 4)) * rng.choice([1, 1e-40, 1e38], (2, 3, 4))).astype(F32)
    xq = rand_int(rng, U8, (2, 3, 4))
    axis = maybe(data.draw(st.integers(-3, 2)), [3, -4, 2**63, 1.0, None, "1"])
    per_axis = data.draw(st.booleans())
    n = 3 if per_axis else 1
    scale = rng.choice([1e-45, 1e-30, 0.1, 3.0, 1e30, 3e38], n).astype(F32)
    if per_axis and isinstance(axis, int) and -3 <= axis <= 2:
        n = xf.shape[axis]
        scale = rng.choice([1e-45, 1e-30, 0.1, 3.0, 1e30, 3e38], n).astype(F32)
    args = [maybe(xf), maybe(scale), maybe(rand_int(rng, I8, (n,)))]
    check_call("quantize_linear", lambda: qlinear.quantize_linear(*args, axis=axis),
               lambda: oracle.quantize_linear(*args, axis=axis))
    args = [maybe(xq), maybe(scale), maybe(rand_int(rng, U8, (n,)))]
    check_call("dequantize_linear", lambda: qlinear.dequantize_linear(*args, axis=axis),
               lambda: oracle.dequantize_linear(*args, axis=axis))


def test_embed_layer_normalization_names_inconsistent_inputs():
    """EmbedLayerNormalization's tables, ids and mask must agree in shape (as onnxruntime's
    checks require): each mismatch is a ValueError naming the operator and the input. They
    were NumPy's "operands could not be broadcast together" (naming neither), and a mask of
    another shape, or a string, gave a mask_index of the wrong length or a meaningless one."""
    import qlinear.contrib as qc

    ids, words, positions = np.zeros((1, 2), I32), np.ones((4, 8), F32), np.ones((4, 8), F32)
    gamma, beta = np.ones(8, F32), np.zeros(8, F32)

    def call(**kw):
        args = dict(input_ids=ids, segment_ids=None, word_embedding=words, position_embedding=positions,
                    segment_embedding=None, gamma=gamma, beta=beta)
        args.update(kw)
        return qc.embed_layer_normalization(**args)

    op = "embed_layer_normalization"
    for kw, names in [
        (dict(word_embedding=np.ones(8, F32)), ("word_embedding", "2-D", "(8,)")),
        (dict(position_embedding=np.ones((4, 6), F32)), ("position_embedding", "(4, 6)", "8")),
        (dict(position_embedding=np.ones(8, F32)), ("position_embedding", "(8,)")),
        (dict(segment_ids=np.zeros((1, 3), I32), segment_embedding=np.ones((2, 8), F32)),
         ("segment_ids", "(1, 2)", "(1, 3)")),
        (dict(segment_ids=np.zeros((1, 2), I32), segment_embedding=np.ones((2, 6), F32)),
         ("segment_embedding", "(2, 6)")),
        (dict(position_ids=np.zeros(3, I32)), ("position_ids", "(1, 2)", "(3,)")),
        (dict(mask=np.ones((3, 3), I32)), ("mask", "(1, 2)", "(3, 3)")),
    ]:
        with raises(ValueError, op, *names):
            call(**kw)
    for mask in ("abc", np.ones((1, 2), F32), [[1, 1]]):
        with raises(TypeError, op, "mask"):
            call(mask=mask)
    y, mask_index, e = call(mask=np.array([[1, 0]], I32), position_ids=np.array([[1, 0]], I32))
    assert_exact(mask_index, np.array([1], I32))
    assert_exact(e, (words[[0, 0]] + positions[[1, 0]])[None])


def test_transformer_operators_on_empty_sequences_and_hidden_sizes():
    """QAttention / Attention with an empty sequence and no past compute an empty output (it
    was NumPy's "zero-size array to reduction operation maximum which has no identity");
    SkipLayerNormalization and EmbedLayerNormalization with a hidden size of 0 are refused,
    naming the operator (they divided by 0: RuntimeWarnings and NaN means)."""
    import qlinear.contrib as qc

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, present = qc.qattention(np.zeros((1, 0, 4), U8), np.zeros((4, 6), U8), np.zeros(6, F32),
                                     F32(1), F32(1), num_heads=1)
        assert out.shape == (1, 0, 2) and present.shape == (2, 1, 1, 0, 2)
        out, present = qc.attention(np.zeros((2, 0, 4), F32), np.zeros((4, 6), F32), num_heads=2)
        assert out.shape == (2, 0, 2) and present.shape == (2, 2, 2, 0, 1)
        with raises(ValueError, "skip_layer_normalization", "hidden size", "(1, 2, 0)"):
            qc.skip_layer_normalization(np.zeros((1, 2, 0), F32), np.zeros((1, 2, 0), F32), np.ones(0, F32))
        with raises(ValueError, "embed_layer_normalization", "hidden size", "(4, 0)"):
            qc.embed_layer_normalization(np.zeros((1, 2), I32), None, np.ones((4, 0), F32), np.ones((4, 0), F32),
                                         None, np.ones(0, F32), np.zeros(0, F32))


@pytest.mark.parametrize("mask", [np.array([2.0, 3.0], np.float32), np.array([2, 3], np.int64), [2, 3]])
def test_attention_mask_index_must_be_int32(mask):
    """Attention and QAttention take mask_index as int32 (onnxruntime's schema): a float mask
    was compared as if lengths and gave an answer; an int64 or a list is named too."""
    from qlinear import contrib as c
    x = np.ones((2, 3, 4), np.float32)
    kind = f"dtype {mask.dtype}" if isinstance(mask, np.ndarray) else "list"
    with pytest.raises(TypeError, match=re.escape("attention: mask_index must") + ".*int32.*" + kind):
        c.attention(x, np.ones((4, 12), np.float32), None, mask, num_heads=2)
    xq = np.ones((2, 3, 4), np.uint8)
    with pytest.raises(TypeError, match=re.escape("qattention: mask_index must") + ".*int32.*" + kind):
        c.qattention(xq, np.ones((4, 12), np.int8), np.zeros(12, np.float32), np.float32(0.1), np.float32(0.1),
                     mask, num_heads=2)
    got = c.attention(x, np.ones((4, 12), np.float32), None, np.array([2, 3], np.int32), num_heads=2)
    assert got[0].shape == (2, 3, 4)
