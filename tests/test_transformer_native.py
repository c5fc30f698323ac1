"""The native float kernels of com.microsoft Gelu, FastGelu and SkipLayerNormalization
(qlinear/csrc/transformer): the same bits as the NumPy engine's float64 formulas (Gelu,
SkipLayerNormalization: NumPy's pairwise row sums included) or within a double's rounding of
them (FastGelu's exp), at every ISA level and thread count; onnxruntime's tolerance is checked
in tests/test_contrib.py, which runs them on the default (native) engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

import qlinear
from qlinear import _native
from qlinear.contrib import transformer as tf

from conftest import engine_level_params

pytestmark = pytest.mark.skipif(not _native.available(), reason="native engine not built")

F32 = np.float32


def _numpy(fn, *args, **kw):
    with _native.use_engine("numpy"):
        return fn(*args, **kw)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


#: hidden sizes around NumPy's pairwise-sum steps (below 8, blocks of 8 up to 128, halves above)
HIDDEN = [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 130, 255, 256, 257, 768, 1023]


def _special(rng, shape):
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)
    flat = x.reshape(-1)
    picks = rng.integers(0, flat.size, max(1, flat.size // 16))
    flat[picks] = rng.choice([0.0, -0.0, 1e-40, -1e-45, 3e38, -3e38], picks.size)
    return x.astype(F32)


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.id != "numpy"], indirect=True)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_skip_layer_norm_native_is_the_numpy_formula_bit_for_bit(engine_level, hidden):
    rng = np.random.default_rng(hidden)
    for rows, extra in ((1, {}), (3, {"beta": True}), (5, {"beta": True, "bias": True})):
        x, skip = _special(rng, (rows, 1, hidden)), _special(rng, (rows, 1, hidden))
        if rows == 3:
            x[0], skip[0] = -0.0, -0.0  # a row of -0.: NumPy's sum is +0.
            x[1, 0, 0] = np.inf  # an infinite sum: its row is NaN
            x[2, 0, -1] = np.nan
        gamma = rng.standard_normal(hidden).astype(F32)
        beta = rng.standard_normal(hidden).astype(F32) if extra.get("beta") else None
        bias = rng.standard_normal(hidden).astype(F32) if extra.get("bias") else None
        with np.errstate(all="ignore"):
            got = tf.skip_layer_normalization(x, skip, gamma, beta, bias, epsilon=1e-5)
            want = _numpy(tf.skip_layer_normalization, x, skip, gamma, beta, bias, epsilon=1e-5)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert np.array_equal(_bits(g), _bits(w))


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.id != "numpy"], indirect=True)
def test_gelu_native_is_the_numpy_formula_bit_for_bit(engine_level):
    rng = np.random.default_rng(5)
    x = _special(rng, (3, 1000))
    x[0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    with np.errstate(all="ignore"):
        assert np.array_equal(_bits(tf.gelu(x)), _bits(_numpy(tf.gelu, x)))


def _fast_gelu_oracle(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """FastGelu's formula in Python floats (IEEE doubles, the C library's exp as math.exp,
    v³ as v·v·v), rounded once: what the native kernel computes, element by element."""
    k = math.sqrt(2.0 / math.pi)
    out = np.empty(x.shape, F32)
    last = x.shape[-1]
    for i, xv in enumerate(x.reshape(-1).tolist()):
        v = xv if bias is None else xv + float(bias[i % last])
        u = k * (v + 0.044715 * (v * v * v))
        try:
            out.reshape(-1)[i] = v / (1.0 + math.exp(-2.0 * u))
        except OverflowError:  # exp(-2u) beyond a double: inf, as the C library's
            out.reshape(-1)[i] = v / math.inf
    return out


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.id != "numpy"], indirect=True)
def test_fast_gelu_native_is_its_double_formula_and_near_numpys(engine_level):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 3, 200)) * 4).astype(F32)
    x[0, 0, :7] = [np.inf, -np.inf, np.nan, -0.0, 0.0, 3e38, -3e38]
    bias = rng.standard_normal(200).astype(F32)
    for b in (None, bias):
        got = tf.fast_gelu(x, b)
        with np.errstate(all="ignore"):
            assert np.array_equal(_bits(got), _bits(_fast_gelu_oracle(x, b)))
            want = _numpy(tf.fast_gelu, x, b)
        # NumPy's vectorized exp differs from the C library's in a double's last bits, which
        # the float32 rounding shows in about 1% of the outputs; bounded as such
        v = x.astype(np.float64) + (0 if b is None else b)
        ok = np.isfinite(want)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.all(np.abs(got[ok].astype(np.float64) - want[ok]) <= np.abs(v[ok]) * 1e-15
                      + np.spacing(np.abs(want[ok])).astype(np.float64))
        assert np.mean(got == want) > 0.95


def test_native_kernels_do_not_depend_on_the_thread_count():
    # large enough for several tasks (16384 elements each) on the pool
    rng = np.random.default_rng(7)
    x, skip = _special(rng, (64, 1, 768)), _special(rng, (64, 1, 768))
    gamma, beta = rng.standard_normal(768).astype(F32), rng.standard_normal(768).astype(F32)
    before = qlinear.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            qlinear.set_num_threads(threads)
            with np.errstate(all="ignore"):
                results.append((tf.skip_layer_normalization(x, skip, gamma, beta), tf.fast_gelu(x, gamma),
                                tf.gelu(x)))
    finally:
        qlinear.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0][0] + results[0][1:], other[0] + other[1:]):
            assert np.array_equal(_bits(a), _bits(b))


def test_native_skip_layer_norm_takes_strided_and_broadcast_inputs():
    # a non-contiguous input is copied; a skip that broadcasts takes the NumPy path
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 64)).astype(F32)[:, ::2, :]
    skip = rng.standard_normal((2, 2, 64)).astype(F32)
    gamma = rng.standard_normal(64).astype(F32)
    for s in (skip, skip[:1]):
        got = tf.skip_layer_normalization(x, s, gamma)
        want = _numpy(tf.skip_layer_normalization, x, s, gamma)
        for g, w in zip(got, want):
            assert np.array_equal(_bits(g), _bits(w))


def _sln_gelu_model():
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.standard_normal(16).astype(F32), n) for n in ("g", "b", "bias", "gb")]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b", "bias"], ["s", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-5, name="sln"),
             helper.make_node("FastGelu", ["s", "gb"], ["y"], domain="com.microsoft", name="gelu")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", T.FLOAT, None), vi("skip", T.FLOAT, None)],
                          [vi("y", T.FLOAT, None), vi("sum", T.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_backend_binds_constant_parameters_once_and_gives_the_full_calls_bits():
    from qlinear import backend

    m = _sln_gelu_model()
    rep = backend.prepare(m)
    with _native.use_engine("numpy"):
        ref = backend.prepare(m)
    rng = np.random.default_rng(10)
    for shape in ((1, 3, 16), (2, 5, 16), (2, 5, 16)):
        feeds = {"x": rng.standard_normal(shape).astype(F32), "skip": rng.standard_normal(shape).astype(F32)}
        got = rep.run(feeds)
        with _native.use_engine("numpy"):
            want = ref.run(feeds)
        for g, w in zip(got, want):
            assert np.array_equal(_bits(g), _bits(w))
    kinds = {type(n).__name__: n._bound for n in rep.evaluator.rt_nodes_}
    assert isinstance(kinds["SkipLayerNormalization"], tuple) and isinstance(kinds["FastGelu"], tuple)
    # inputs the bound path does not take go the full way: a broadcast skip, a wrong hidden size
    x = rng.standard_normal((2, 5, 16)).astype(F32)
    got = rep.run({"x": x, "skip": x[:1]})
    with _native.use_engine("numpy"):
        want = ref.run({"x": x, "skip": x[:1]})
    assert all(np.array_equal(_bits(g), _bits(w)) for g, w in zip(got, want))
    with pytest.raises(backend.NodeError, match="'sln'.*hidden size"):
        rep.run({"x": np.ones((2, 5, 8), F32), "skip": np.ones((2, 5, 8), F32)})
