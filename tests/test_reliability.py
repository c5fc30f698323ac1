"""Silent wrong answers found by a reliability campaign (issue 8), each pinned by a test.

- prepared operators own copies of what they keep: changing an array in place after
  prepare_* (or after a call that memoized it) never changes a later result;
- every zero-size dimension gives numpy.matmul's (or the convolution's) result: empty
  arrays of the right shape, or zeros where the reduction axis K is empty.
"""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import I8, U8, assert_exact, rand_int, rand_scale

# --------------------------------------------------------------------------- aliasing


def _conv_case(seed=0):
    rng = np.random.default_rng(seed)
    x = rand_int(rng, U8, (1, 4, 6, 6))
    w = rand_int(rng, I8, (3, 4, 3, 3))
    return rng, x, w


def test_prepared_qlinear_conv_zero_points_are_not_views():
    """x_zero_point / y_zero_point memoized by value must not follow the caller's array."""
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


def test_prepared_matmuls_own_what_they_keep():
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


# --------------------------------------------------------------------------- zero-size dimensions

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
    a = np.zeros((3, 0), U8)
    b = np.zeros((0, 2), I8)
    y = qlinear.matmul_integer(a, b, np.array([1, 2, 3], U8), np.array([4, 5], I8))
    assert_exact(y, np.zeros((3, 2), np.int32))


@pytest.mark.parametrize("xshape,wshape,want_shape", [
    ((0, 4, 5, 5), (3, 4, 3, 3), (0, 3, 3, 3)),   # empty batch
    ((2, 4, 5, 5), (0, 4, 3, 3), (2, 0, 3, 3)),   # no output channels
    ((2, 0, 5, 5), (3, 0, 3, 3), (2, 3, 3, 3)),   # no input channels: a sum over nothing
])
def test_conv_zero_size(xshape, wshape, want_shape):
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


# --------------------------------------------------------------------------- the backend's cache


def test_backend_weights_fed_as_inputs_are_not_cached_across_runs():
    """A weight that is a graph input may be a buffer the caller reuses with new values: the
    backend prepares it on every run (only initializers are prepared once)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from qlinear import backend

    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMulInteger", ["a", "w", "azp", "wzp"], ["y1"]),
             helper.make_node("ConvInteger", ["x", "k"], ["y2"], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearMatMul", ["a", "s", "azp", "w", "s", "wzp", "s", "azp"], ["y3"]),
             helper.make_node("QLinearConv", ["x", "s", "azp", "k", "s", "wzp", "s", "azp"], ["y4"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", T.UINT8, [2, 3]),
                                       helper.make_tensor_value_info("w", T.INT8, [3, 2]),
                                       helper.make_tensor_value_info("x", T.UINT8, [1, 2, 4, 4]),
                                       helper.make_tensor_value_info("k", T.INT8, [3, 2, 3, 3]),
                                       helper.make_tensor_value_info("wzp", T.INT8, [])],
                          [helper.make_tensor_value_info(f"y{i}", T.UNDEFINED, None) for i in range(1, 5)],
                          [numpy_helper.from_array(np.array(4, np.uint8), "azp"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    rep = backend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    feeds = {"a": rand_int(rng, U8, (2, 3)), "w": rand_int(rng, I8, (3, 2)), "x": rand_int(rng, U8, (1, 2, 4, 4)),
             "k": rand_int(rng, I8, (3, 2, 3, 3)), "wzp": np.array(1, I8)}

    def want(f):
        return (oracle.matmul_integer(f["a"], f["w"], U8(4), f["wzp"]),
                oracle.conv_integer(f["x"], f["k"], pads=[1, 1, 1, 1]),
                oracle.qlinear_matmul(f["a"], np.float32(0.5), U8(4), f["w"], np.float32(0.5), f["wzp"],
                                      np.float32(0.5), U8(4)),
                oracle.qlinear_conv(f["x"], np.float32(0.5), U8(4), f["k"], np.float32(0.5), f["wzp"],
                                    np.float32(0.5), U8(4)))

    for got, w in zip(rep.run(feeds), want(feeds)):
        assert_exact(got, w)
    for name in ("w", "k", "wzp"):  # the same buffers, new values
        feeds[name][...] = rand_int(rng, I8, feeds[name].shape)
    for got, w in zip(rep.run(feeds), want(feeds)):
        assert_exact(got, w)
