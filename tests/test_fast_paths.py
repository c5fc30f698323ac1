"""The backend's per-run short paths give the bits of its full, validating paths.

A prepared model takes short paths once it has run: model-constant per-tensor scales and zero
points reach the quantized kernels as NumPy scalars (their prepared forms' repeat path),
MatMulInteger reads a 0-d zero point's value without re-validating it, QAttention's constant
operands are checked once (``transformer.PreparedQAttention``), SkipLayerNormalization's and
FastGelu's constant parameters are widened once, the graph loop calls qlinear's kernels
without their attributes and Cast as ``astype``. Each test here runs the same inputs through
a model prepared as usual (several runs, so that the later ones take the short paths) and
through one whose nodes know of no constant inputs (``constant_inputs = None``: every call
takes the full path), and asserts identical bytes -- on every model of ``shared/models``, and
on small models that reach the other branches. It also asserts that the short paths were
taken, so that the comparison can fail.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qlinear  # noqa: E402
import qlinear.backend as backend  # noqa: E402
from qlinear.graph.kernels import contrib as backend_contrib  # noqa: E402
from qlinear.graph.kernels import standard  # noqa: E402
from qlinear import contrib as qc  # noqa: E402
from qlinear.contrib import transformer  # noqa: E402
from qlinear.tools.model import random_inputs  # noqa: E402

from conftest import shared_models_dir  # noqa: E402

MODELS = shared_models_dir()
#: symbolic dimensions the default of 1 does not fit (as benchmarks/graphs.py's CLI_SHAPES)
SHAPES = {"kaldi_qtdnn_qlinearconv": {"input": [10, 10]}}


def _gpt2_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 1000, (1, 5)).astype(np.int32),
             "position_ids": np.arange(3, 8, dtype=np.int32)[None],
             "attention_mask": (rng.random((1, 8)) < 0.8).astype(np.int32)}
    for i in range(5):
        feeds[f"past_{i}"] = rng.standard_normal((2, 1, 4, 3, 8)).astype(np.float32)
    return feeds


def _slow(rep: backend.QLinearRep) -> backend.QLinearRep:
    """``rep`` with every node told nothing about constant inputs: the full paths, every call."""
    for node in rep.evaluator.rt_nodes_:
        node = getattr(node, "guarded_impl", node)
        if isinstance(node, (standard._QLinearOp, backend_contrib.ContribOp)):
            node.constant_inputs = None
    return rep


def _kernels(rep, cls):
    return [getattr(n, "guarded_impl", n) for n in rep.evaluator.rt_nodes_
            if isinstance(getattr(n, "guarded_impl", n), cls)]


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def _model_names() -> list[str]:
    if MODELS is None:
        return []
    return sorted(p.stem for p in Path(MODELS).glob("*.onnx"))


def _model_and_feeds(name):
    """Shared model ``name`` and two inputs for it (seeds 0 and 1); skips where the models are absent."""
    if MODELS is None:
        pytest.skip("shared/models is absent")
    model = onnx.load(str(Path(MODELS) / f"{name}.onnx"))
    if name.startswith("tiny_gpt2"):
        return model, [_gpt2_inputs(s) for s in (0, 1)]
    return model, [random_inputs(model, seed=s, shapes=SHAPES.get(name)) for s in (0, 1)]


@pytest.mark.parametrize("name", _model_names() or ["(none)"])
def test_real_model_short_paths_bit_identical(name):
    model, feeds = _model_and_feeds(name)
    fast, slow = backend.prepare(model), _slow(backend.prepare(model))
    want = [slow.run(f) for f in feeds]
    for f, w in zip(feeds + feeds, want + want):  # the second round: short paths everywhere
        _same(fast.run(f), w)
    # the short paths were taken
    convs = _kernels(fast, (backend.QLinearConv, backend.QLinearMatMul))  # constant parameters
    if convs:
        assert any(k._scalars is not None for k in convs)
    attention = _kernels(fast, backend_contrib.QAttention)
    if attention:
        assert all(k._whole for k in attention)
    concats = _kernels(fast, backend_contrib.QLinearConcat)  # constant parameters: prepared
    if concats:
        assert all(k._concat is not None for k in concats)


def _qlinear_conv_model(x_scale_shape=(), zp_dtype=np.uint8):
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(np.full(x_scale_shape, 0.02, np.float32), "xs"),
             numpy_helper.from_array(np.full(x_scale_shape, 7, zp_dtype), "xz"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([0.01, 0.02, 0.03, 0.04], np.float32), "ws"),
             numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz"),
             numpy_helper.from_array(rng.integers(-1000, 1000, 4).astype(np.int32), "B")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"], ["y"],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_qlinear_conv_scalars_then_new_inputs():
    """After the short path is set up, inputs of another shape, full-range values and a bad
    dtype behave as on the full path (the error message included)."""
    rng = np.random.default_rng(5)
    fast, slow = backend.prepare(_qlinear_conv_model()), _slow(backend.prepare(_qlinear_conv_model()))
    for shape in [(1, 3, 8, 8), (1, 3, 8, 8), (2, 3, 5, 7), (1, 3, 8, 8)]:
        x = rng.integers(0, 256, shape).astype(np.uint8)
        _same(fast.run([x]), slow.run([x]))
    (k,) = _kernels(fast, backend.QLinearConv)
    assert k._scalars is not None and all(isinstance(s, np.generic) for s in k._scalars[1])
    bad = rng.integers(0, 256, (1, 4, 8, 8)).astype(np.uint8)  # 4 channels, w takes 3
    with pytest.raises(backend.NodeError) as fast_err:
        fast.run([bad])
    with pytest.raises(backend.NodeError) as slow_err:
        slow.run([bad])
    assert str(fast_err.value) == str(slow_err.value)
    assert "QLinearConv" in str(fast_err.value) and "channel count (4)" in str(fast_err.value)


def test_qlinear_conv_one_element_parameters():
    """Scales and zero points of shape (1,) (as in Kaldi's model) take the short path too."""
    rng = np.random.default_rng(6)
    fast, slow = (backend.prepare(_qlinear_conv_model((1,))),
                  _slow(backend.prepare(_qlinear_conv_model((1,)))))
    for _ in range(3):
        x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
        _same(fast.run([x]), slow.run([x]))
    (k,) = _kernels(fast, backend.QLinearConv)
    assert k._scalars is not None


def test_matmul_integer_zero_point_read_by_value():
    """PreparedMatMulInteger's repeat path for a 0-d zero point array: a new value (or the
    same array written) on every call gives that value's exact product."""
    rng = np.random.default_rng(7)
    b = rng.integers(-128, 128, (16, 9)).astype(np.int8)
    bz = np.int8(3)
    p = qlinear.prepare_matmul_integer(b, bz)
    zp = np.zeros((), np.uint8)
    for i in range(6):
        a = rng.integers(0, 256, (2, 5, 16)).astype(np.uint8)
        zp[...] = rng.integers(0, 256)  # the same array, a new value
        got = p.run(a, zp if i % 2 else np.array(zp))
        want = qlinear.matmul_integer(a, b, np.array(zp), bz)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        ref = (a.astype(np.int64) - int(zp)) @ (b.astype(np.int64) - 3)
        assert np.array_equal(got, ref)
    if qlinear.engine_info()["engine"] == "native":  # the short path calls the native engine
        assert p._zp_call is not None
    # another dtype or shape leaves the short path (and is checked as before)
    with pytest.raises(TypeError, match="a_zero_point"):
        p.run(rng.integers(0, 256, (2, 5, 16)).astype(np.uint8), np.zeros((), np.int8))
    a = rng.integers(-128, 128, (3, 16)).astype(np.int8)
    assert np.array_equal(p.run(a, np.array(-5, np.int8)), qlinear.matmul_integer(a, b, np.int8(-5), bz))


def _reference_dql(x: np.ndarray):
    """dynamic_quantize_linear's scale and zero point, always computed under np.errstate."""
    F32 = np.float32
    lo, hi = (x.min(), x.max()) if x.size else (F32(0), F32(0))
    if lo != lo or hi != hi:
        lo, hi = F32(np.fmin.reduce(x.ravel())), F32(np.fmax.reduce(x.ravel()))
        if lo != lo:
            lo = hi = F32(0)
    mn, mx = min(F32(0), lo), max(F32(0), hi)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale = F32(1) if mx == mn else F32(F32(mx - mn) / F32(255))
        initial = F32(F32(0) - F32(mn / scale))
    return scale, initial


@pytest.mark.parametrize("values", [
    [0.0, 1.0], [-1e37, 1e37], [-9.9e36, 9.9e36], [1e-30, 0.0], [1.5e-30, -1e-31], [-1e-45, 0.0],
    [3e38, -3e38], [np.inf, 1.0], [np.nan, 2.0], [-2.5, 7.25, 0.0], [1e36, -1e-38], [5.0, 5.0]])
def test_dynamic_quantize_linear_without_errstate_same_bits(values):
    """The usual path skips np.errstate only where no operation can overflow or divide by zero:
    around its bounds the scale and zero point are those of the always-guarded formula, and no
    warning escapes."""
    x = np.array(values, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, s, z = qc.dynamic_quantize_linear(x)
    scale, initial = _reference_dql(x)
    assert s.tobytes() == np.asarray(scale, np.float32).tobytes()
    if 0 <= initial <= 255:
        assert int(z) == round(float(initial))


def _attention_case(rng, per_column: bool, past: bool, mask: str):
    hidden_in, heads, head, seq, batch = 12, 3, 4, 5, 2
    cols = 3 * heads * head
    x = rng.integers(0, 256, (batch, seq, hidden_in)).astype(np.uint8)
    w = rng.integers(-128, 128, (hidden_in, cols)).astype(np.int8)
    bias = rng.standard_normal(cols).astype(np.float32)
    ws = (rng.random(cols) * 0.01 + 1e-3).astype(np.float32) if per_column else np.float32(0.004)
    wz = rng.integers(-3, 4, cols).astype(np.int8) if per_column else np.int8(1)
    pa = rng.standard_normal((2, batch, heads, 3, head)).astype(np.float32) if past else None
    total = seq + (3 if past else 0)
    m = {"none": None, "2d": (rng.random((batch, total)) < 0.8).astype(np.int32),
         "1d": np.array([total - 1, total], np.int32)}[mask]
    return x, w, bias, np.float32(0.05), ws, m, np.uint8(100), wz, pa, heads


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("mask", ["none", "2d", "1d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_prepared_qattention_bit_identical(per_column, past, mask, unidirectional):
    rng = np.random.default_rng([per_column, past, len(mask), unidirectional])
    x, w, bias, xs, ws, m, xz, wz, pa, heads = _attention_case(rng, per_column, past, mask)
    kw = dict(num_heads=heads, unidirectional=unidirectional, mask_filter_value=-10000.0)
    want = qc.qattention(x, w, bias, xs, ws, m, xz, wz, pa, **kw)
    prepared = transformer.PreparedQAttention(w, bias, ws, wz, **kw)
    for _ in range(2):
        got = prepared.run(x, xs, m, xz, pa)
        _same(got, want)
    # an input that does not fit the weight: the message qattention gives
    bad = x[..., :-1]
    with pytest.raises(ValueError) as e1:
        prepared.run(bad, xs, m, xz, pa)
    with pytest.raises(ValueError) as e2:
        qc.qattention(bad, w, bias, xs, ws, m, xz, wz, pa, **kw)
    assert str(e1.value) == str(e2.value)


def test_skip_layer_norm_and_fast_gelu_constants_once():
    """A model of SkipLayerNormalization (constant gamma, beta, bias) and FastGelu (constant
    bias): the short paths give the full paths' bits, and a bias that does not fit X is
    reported as before, also after the constant has been checked for another X."""
    rng = np.random.default_rng(9)
    hidden = 8
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), n)
             for n in ("gamma", "beta", "bias", "gbias")]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["s"],
                              domain="com.microsoft", epsilon=1e-5),
             helper.make_node("FastGelu", ["s", "gbias"], ["y"], domain="com.microsoft")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                       helper.make_tensor_value_info("skip", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    fast, slow = backend.prepare(m), _slow(backend.prepare(m))
    for _ in range(3):
        x = rng.standard_normal((2, 3, hidden)).astype(np.float32)
        s = rng.standard_normal((2, 3, hidden)).astype(np.float32)
        _same(fast.run([x, s]), slow.run([x, s]))
    (sln,) = _kernels(fast, backend_contrib.SkipLayerNormalization)
    assert isinstance(sln._const_params, backend_contrib._ConstantParams) and sln._const_params._memo
    x = rng.standard_normal((2, 3, hidden + 1)).astype(np.float32)
    with pytest.raises(backend.NodeError) as e1:
        fast.run([x, x])
    with pytest.raises(backend.NodeError) as e2:
        slow.run([x, x])
    assert str(e1.value) == str(e2.value) and "must be 1-D with the hidden size (9,)" in str(e1.value)


def test_cast_short_path_matches_reference():
    """Cast to each standard numeric type: the graph loop's astype gives onnx.reference's bits."""
    from onnx.reference import ReferenceEvaluator

    x = np.array([-3.7, -0.5, 0.0, 0.5, 2.5, 300.0, 1e10], np.float32)
    for to in (TensorProto.INT32, TensorProto.UINT8, TensorProto.FLOAT16, TensorProto.DOUBLE,
               TensorProto.BOOL, TensorProto.INT64):
        node = helper.make_node("Cast", ["x"], ["y"], to=to)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", to, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
        rep = backend.prepare(m)
        assert rep.evaluator._fast_plan[0][1] == "cast"
        with np.errstate(all="ignore"):
            _same(rep.run([x]), ReferenceEvaluator(m).run(None, {"x": x}))


@pytest.mark.parametrize("opset", [11, 13, 21])
def test_unsqueeze_squeeze_views_match_reference(opset):
    """Unsqueeze / Squeeze as a reshape with the shape onnx.reference computes: the same array
    for every axes form (attribute before opset 13, input after; negative; none for Squeeze),
    and onnx.reference's error for bad axes, also after a good call."""
    from onnx.reference import ReferenceEvaluator

    x = np.arange(24, dtype=np.float32).reshape(2, 1, 3, 4)
    for op, axes, shape in [("Unsqueeze", [0], None), ("Unsqueeze", [-1, 1], None), ("Squeeze", [1], None),
                            ("Squeeze", [-3], None), ("Squeeze", None, None)]:
        inits = []
        ins = ["x"]
        kw = {}
        if axes is not None and opset < 13:
            kw["axes"] = axes
        elif axes is not None:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            ins.append("axes")
        node = helper.make_node(op, ins, ["y"], **kw)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        rep, ref = backend.prepare(m), ReferenceEvaluator(m)
        for _ in range(2):
            _same(rep.run([x]), ref.run(None, {"x": x}))
        y = np.zeros((3, 2), np.float32)  # Squeeze of axis 1 (size 2) / axis -3: refused
        if op == "Squeeze" and axes is not None:
            with pytest.raises(Exception) as e:
                ref.run(None, {"x": y})
            with pytest.raises(backend.NodeError, match=type(e.value).__name__):
                rep.run([y])


def test_fed_default_initializer_is_not_a_constant():
    """An initializer that is also a graph input is only a default: a caller may feed its own
    array and write into it between runs. The backend copies such a fed value on every run, so
    what the nodes keep by identity (prepared weights, scalars of scales) is never derived from
    the caller's array, and every run sees the values fed."""
    rng = np.random.default_rng(11)
    m = _qlinear_conv_model()
    m.graph.input.extend([helper.make_tensor_value_info("ys", TensorProto.FLOAT, []),
                          helper.make_tensor_value_info("w", TensorProto.INT8, [4, 3, 3, 3])])
    rep = backend.prepare(m)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    ys = np.array(0.5, np.float32)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    for _ in range(3):
        got = rep.run({"x": x, "ys": ys, "w": w})
        fresh = backend.prepare(m).run({"x": x, "ys": ys.copy(), "w": w.copy()})
        _same(got, fresh)
        ys[...] = ys * 1.5  # the caller's arrays, written in place
        w[0, 0, 0, 0] ^= 5


def test_fed_default_broadcast_view_is_bounded():
    """The copy of a fed default is bounded like the operators' inputs: a broadcast view that
    would take more than the size limit as an array is refused by name, not allocated."""
    m = _qlinear_conv_model()
    m.graph.input.extend([helper.make_tensor_value_info("B", TensorProto.INT32, [4])])
    rep = backend.prepare(m)
    x = np.zeros((1, 3, 4, 4), np.uint8)
    huge = np.broadcast_to(np.zeros(1, np.int32), (1 << 40,))
    with pytest.raises(ValueError, match="input 'B' is a view .* repeats its memory"):
        rep.run({"x": x, "B": huge})
    _same(rep.run({"x": x, "B": np.broadcast_to(np.int32(7), (4,))}),
          backend.prepare(m).run({"x": x, "B": np.full(4, 7, np.int32)}))


def _softmax_literal(x, sx, sy, zy, opset, axis):
    """QLinearSoftmax as it was written before its short paths (rows moved last, cumsum,
    one expression in double): what the short paths must reproduce bit for bit."""
    from qlinear.contrib import pool

    ax = axis % x.ndim
    if opset < 13:
        rows = x.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
    else:
        rows = np.moveaxis(x, ax, -1).reshape(-1, x.shape[ax])
    table = pool.softmax_table(np.float32(sx), rows.shape[1])
    r = rows.astype(np.int32)
    e = table[r - r.max(axis=1, keepdims=True) + 255]
    total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1:]
    big_y = np.floor(np.float32(1) / np.float32(sy))
    q = np.rint((e.astype(np.float64) * float(big_y)) / total.astype(np.float64))
    hi = int(np.iinfo(x.dtype).max)
    y = (np.minimum(q, float(hi - zy)) + zy).astype(x.dtype)
    if opset < 13:
        return y.reshape(x.shape)
    return np.moveaxis(y.reshape(np.moveaxis(x, ax, -1).shape), -1, ax)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax_short_paths_bit_identical(dtype, monkeypatch):
    """QLinearSoftmax's rows of two through the 511-row table (from _PAIR_ROWS rows on, the
    axis last or not), its term-by-term sums (rows up to _COLUMN_SUM_MAX) and its rows kept in
    place: the bits of the literal formula (``_softmax_literal``), on full-range values, both
    8-bit types and random parameters; and the pair table was used."""
    from qlinear.contrib import pool

    calls = []
    real = pool._softmax_pairs
    monkeypatch.setattr(pool, "_softmax_pairs", lambda *a: calls.append(a[0].shape) or real(*a))
    info = np.iinfo(dtype)
    rng = np.random.default_rng([int(info.max), 5])
    cases = [((1, 4420, 2), 2, 11), ((1, 300, 2), -1, 13), ((2, 2, 300), 1, 13), ((1, 2, 20, 20), 1, 13),
             ((255, 2), 1, 13), ((600, 1, 2), 1, 12), ((3, 40, 5), 1, 13), ((1, 16, 4, 50), 1, 13),
             ((70, 33), -1, 13), ((4, 3, 2, 2), 0, 13), ((500, 1), -1, 13), ((9, 2, 2), 1, 10)]
    for shape, axis, opset in cases:
        for t in range(3):
            x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
            if t == 2:  # extremes: the largest differences of a row, equal values
                x.reshape(-1)[::3] = info.max
                x.reshape(-1)[1::3] = info.min
            sx = np.float32(rng.choice([0.1, rng.uniform(1e-3, 0.5), 1.0 / 16]))
            sy = np.float32(rng.choice([1 / 256, rng.uniform(1e-3, 0.05), 1 / 1000]))
            zy = int(rng.integers(info.min, info.max + 1)) if t else 0
            got = qc.qlinear_softmax(x, sx, dtype(0), sy, dtype(zy), opset=opset, axis=axis)
            want = _softmax_literal(x, sx, sy, zy, opset, axis)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tobytes() == want.tobytes(), (shape, axis, opset, t)
    assert set(calls) >= {(4420, 2, 1), (300, 2, 1), (2, 2, 300), (1, 2, 400), (600, 2, 1)}
    assert (255, 2, 1) not in calls  # below _PAIR_ROWS: the general path


def _concat_model(fed_scale: bool = False):
    """QLinearConcat of three uint8 tensors along axis 1: input 0 with Y's parameters (copied),
    the others requantized; ``fed_scale``: input 2's scale is a graph input with a default."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s0"),
             numpy_helper.from_array(np.array(128, np.uint8), "z0"),
             numpy_helper.from_array(np.array(0.0173, np.float32), "s1"),
             numpy_helper.from_array(np.array(3, np.uint8), "z1"),
             numpy_helper.from_array(np.array(0.31, np.float32), "s2"),
             numpy_helper.from_array(np.array(200, np.uint8), "z2")]
    node = helper.make_node("QLinearConcat", ["ys", "yz", "a", "s0", "z0", "b", "s1", "z1", "c", "s2", "z2"],
                            ["y"], domain="com.microsoft", axis=1)
    ins = [helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in "abc"]
    if fed_scale:
        ins.append(helper.make_tensor_value_info("s2", TensorProto.FLOAT, []))
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


def test_qlinear_concat_constant_parameters_once():
    """QLinearConcat with constant parameters: prepared once (tables chosen once), the bits of
    the full path on new inputs of new shapes, the full path's message for a bad tensor; a
    fed scale is never prepared (the caller's array may change between runs)."""
    rng = np.random.default_rng(17)
    m = _concat_model()
    fast, slow = backend.prepare(m), _slow(backend.prepare(m))
    for t in range(4):
        h = int(rng.integers(1, 5))
        feeds = {n: rng.integers(0, 256, (2, int(rng.integers(1, 4)), h)).astype(np.uint8) for n in "abc"}
        _same(fast.run(feeds), slow.run(feeds))
        _same(fast.run(feeds), [qc.qlinear_concat(np.float32(0.05), np.uint8(128), feeds["a"], np.float32(0.05),
                                                  np.uint8(128), feeds["b"], np.float32(0.0173), np.uint8(3),
                                                  feeds["c"], np.float32(0.31), np.uint8(200), axis=1)])
    (k,) = _kernels(fast, backend_contrib.QLinearConcat)
    assert k._concat is not None and k._concat.tables[0] is None and k._concat.tables[1] is not None
    for bad in ({"a": np.zeros((2, 1), np.uint8)}, {"c": np.zeros((2, 1, 4), np.uint8)},
                {"b": np.zeros((), np.uint8)}):
        feeds = {n: np.zeros((2, 1, 3), np.uint8) for n in "abc"} | bad
        with pytest.raises(backend.NodeError) as e1:
            fast.run(feeds)
        with pytest.raises(backend.NodeError) as e2:
            slow.run(feeds)
        assert str(e1.value) == str(e2.value)
    # a fed default: the caller's array, written in place between runs, is read anew each run
    fed = backend.prepare(_concat_model(fed_scale=True))
    feeds = {n: rng.integers(0, 256, (1, 2, 2)).astype(np.uint8) for n in "abc"}
    s2 = np.array(0.31, np.float32)
    for value in (0.31, 0.05, 0.7, 0.31):
        s2[...] = value
        want = qc.qlinear_concat(np.float32(0.05), np.uint8(128), feeds["a"], np.float32(0.05), np.uint8(128),
                                 feeds["b"], np.float32(0.0173), np.uint8(3), feeds["c"], np.float32(value),
                                 np.uint8(200), axis=1)
        _same(fed.run(feeds | {"s2": s2}), [want])
        (k,) = _kernels(fed, backend_contrib.QLinearConcat)
        assert all(p is not s2 for p in k._concat_params)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float32])
def test_strided_views_copied_row_by_row_same_bits(dtype):
    """A view whose last axis is contiguous but short (a Slice of 2 of 4 values per row) is
    copied with each row as one integer (``_prepared.copy_contiguous``) before the native
    QuantizeLinear / DequantizeLinear: the bytes of np.ascontiguousarray, and the outputs of
    the operators on a contiguous copy, for rows of 2, 4 and 8 bytes and others (3 bytes,
    the last axis strided, one element) that keep NumPy's copy."""
    from qlinear import _prepared, quantize

    rng = np.random.default_rng(23)
    full = rng.integers(0, 256, (3, 50, 12), dtype=np.uint8).view(np.int8 if dtype == np.int8 else np.uint8)
    if dtype == np.float32:
        full = (rng.standard_normal((3, 50, 12)) * 40).astype(np.float32)
        full.reshape(-1)[:4] = [np.nan, np.inf, -0.0, 1e-45]
    views = [full[..., :2], full[..., 3:5], full[..., :4], full[..., 1:9], full[..., :3], full[..., ::2],
             full[..., :1], full[:, ::2, :2], full.transpose(0, 2, 1)[..., :2], full[1:2, 5:6, 4:6]]
    for view in views:
        got = _prepared.copy_contiguous(view)
        assert got.flags.c_contiguous and got.dtype == view.dtype and got.shape == view.shape
        assert got.tobytes() == np.ascontiguousarray(view).tobytes()
        if dtype == np.float32:
            prepared = quantize.PreparedQuantize(np.float32(0.37), np.uint8(7))
        else:
            prepared = quantize.PreparedDequantize(np.float32(0.37), np.array(7, dtype))
        _same([prepared.run(view)], [prepared.run(np.ascontiguousarray(view))])


def _dql_cases():
    """Inputs for the one-call native DynamicQuantizeLinear: random ranges and offsets, the
    guarded branch's bounds (1e37, 1e-30, NaN, infinities: the native call must decline
    them), signed zeros, one value, zero points on .5 ties, sizes around the kernel's vector
    steps and its threaded chunks."""
    rng = np.random.default_rng(2026)
    F = np.float32
    cases = [np.array(v, F) for v in (
        [0.0], [-0.0], [0.0, -0.0], [-0.0, 3.0], [5.0], [-5.0], [5.0, 5.0], [1e-30, 0.0], [1.5e-30, -1e-31],
        [-1e-45, 0.0], [1e-38, -1e-38], [-9.9e36, 9.9e36], [-1e37, 1.0], [1.0, 1e37], [-1.00001e37, 2.0],
        [3e38, -3e38], [np.inf, 1.0], [-np.inf, 1.0], [np.nan, 2.0], [1.0, np.nan], [np.nan],
        [-1.0, 1.0], [-2.5, 7.25, 0.0], [-127.5, 127.5], [-0.5, 254.5], [-1.5, 253.5])]
    # zero points exactly on a .5 tie: mn = -(k + 0.5) · scale with mx - mn = 255 · scale
    for k in (0, 1, 2, 100, 127, 253, 254):
        s = F(0.25)
        cases.append(np.array([-(k + 0.5) * s, (254.5 - k) * s], F))
    for n in (1, 2, 15, 16, 17, 31, 32, 33, 64, 65, 1000, 16383, 16385, (1 << 18) + 7):
        cases.append((rng.standard_normal(n) * rng.uniform(1e-3, 1e3) + rng.uniform(-5, 5)).astype(F))
    for _ in range(200):
        n = int(rng.integers(1, 300))
        x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 36)).astype(F)
        if rng.random() < 0.3:
            x = (np.abs(x) * F(rng.choice([-1, 1]))).astype(F)  # one-signed: mn or mx is the 0 bound
        cases.append(x)
    cases.append((rng.standard_normal((2, 6, 5)) * 4).astype(F)[:, ::2])  # a strided view
    # one special value at each position of the vector lanes and of the scalar tail
    for special in (np.nan, np.inf, -np.inf, 1e37, -1e37, 9.9e36, -0.0):
        for at in (0, 3, 4, 7, 8, 15, 16, 36):
            x = (rng.standard_normal(37) * 3).astype(F)
            x[at] = special
            cases.append(x)
    return cases


def test_dynamic_quantize_linear_native_call_same_bits():
    """The native one-call DynamicQuantizeLinear gives the bits of the NumPy path (float32
    scalars, then the quantize kernel) on every input, and declines (None) exactly where that
    path guards its arithmetic."""
    import qlinear.contrib as qcontrib
    from qlinear import _native

    if not _native.available():
        pytest.skip("the native engine is not built")
    C = _native.native()
    declined = 0
    for x in _dql_cases():
        with _native.use_engine("numpy"):
            want = qcontrib.dynamic_quantize_linear(x)
        got = qcontrib.dynamic_quantize_linear(x)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), x[:4]
        flat = np.ascontiguousarray(x).reshape(-1)
        usual = bool(not np.isnan(x).any() and -1e37 < float(x.min()) and float(x.max()) < 1e37
                     and not 0 < np.float32(max(x.max(), 0) - min(x.min(), 0)) <= np.float32(1e-30))
        got = C.dynamic_quantize(C.get_isa(), flat, flat.size, np.empty(flat.size, np.uint8))
        assert (got is not None) == usual, x
        declined += got is None
    assert declined >= 8  # the guarded inputs above did reach the NumPy path


# --------------------------------------------------------------------------- bound short paths
# The graph loop (qlinear.backend_float.FastEvaluator) asks a node, after a full call, for its
# short path bound to the model's constants (``fast_path``): one Python frame and the native
# call, used while the inputs are like the ones it was bound to.


def _bound(rep) -> list:
    """The graph loop's plan entries whose node has a bound short path."""
    return [e for e in rep.evaluator._fast_plan if e[7] is not None and e[7][1] is not None]


def _counting(rep) -> list[int]:
    """Wrap every bound short path of ``rep`` to count the calls it answered."""
    calls = [0]
    for e in _bound(rep):
        fn = e[7][1]

        def counted(ins, fn=fn):
            y = fn(ins)
            if y is not None:
                calls[0] += 1
            return y
        e[7][1] = counted
    return calls


@pytest.mark.parametrize("name", _model_names() or ["(none)"])
def test_real_model_bound_short_paths_bit_identical(name):
    """Every shared model, three rounds of two inputs: the bound short paths are taken and give
    the full paths' bytes."""
    model, feeds = _model_and_feeds(name)
    fast, slow = backend.prepare(model), _slow(backend.prepare(model))
    want = [slow.run(f) for f in feeds]
    for f, w in zip(feeds * 2, want * 2):
        _same(fast.run(f), w)
    calls = _counting(fast)
    for f, w in zip(feeds, want):
        _same(fast.run(f), w)
    quantized = {"QLinearConv", "QuantizeLinear", "QLinearAdd", "QLinearSigmoid"}
    if quantized & {n.op_type for n in model.graph.node}:
        assert calls[0] > 0


def test_bound_short_path_declines_other_inputs():
    """Once bound, inputs of another shape or dtype, a transposed view, and the engine or its
    level switched all take the full path, with the full path's bytes; the bound path itself
    answers None for them."""
    rng = np.random.default_rng(21)
    from qlinear import _native

    fast, slow = backend.prepare(_qlinear_conv_model()), _slow(backend.prepare(_qlinear_conv_model()))
    x = rng.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)
    for _ in range(3):
        _same(fast.run([x]), slow.run([x]))
    (entry,) = _bound(fast)
    fn = entry[7][1]
    assert fn([x] + [None] * 8) is not None
    other = rng.integers(0, 256, (2, 3, 5, 7)).astype(np.uint8)
    view = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # x's values, F order
    for y in (other, view, x.astype(np.int8)):
        assert fn([y] + [None] * 8) is None
    _same(fast.run([other]), slow.run([other]))
    _same(fast.run([view]), slow.run([x]))
    for _ in range(2):
        _same(fast.run([x]), slow.run([x]))  # bound again for x
    fn = _bound(fast)[0][7][1]
    with _native.use_engine("numpy"):
        assert fn([x] + [None] * 8) is None
        _same(fast.run([x]), slow.run([x]))
    others = [i for i in _native.engine_info()["isas"] if i != _native.isa()]
    if others:
        with _native.use_isa(others[0]):
            assert fn([x] + [None] * 8) is None
            _same(fast.run([x]), slow.run([x]))


def test_bound_short_path_follows_the_size_limit():
    """A changed output size limit unbinds: the bound path answers None (the node's full path
    then decides, as it did before the loop bound anything) and the run's bytes are the same."""
    x = np.zeros((1, 3, 8, 8), np.uint8)
    fast = backend.prepare(_qlinear_conv_model())
    want = _slow(backend.prepare(_qlinear_conv_model())).run([x])
    for _ in range(3):
        fast.run([x])
    (entry,) = _bound(fast)
    fn = entry[7][1]
    before = qlinear.max_output_bytes()
    try:
        qlinear.set_max_output_bytes(before - 1)
        assert fn([x] + [None] * 8) is None
        _same(fast.run([x]), want)
    finally:
        qlinear.set_max_output_bytes(before)
    assert fn([x] + [None] * 8) is not None


def test_bound_short_path_rechecks_a_default_initializer():
    """A graph input with an initializer (its default, as IR < 4 models list every
    initializer) may be bound while the default is used; a run that feeds a value must then
    compute with the value fed, not the default the node was bound to."""
    rng = np.random.default_rng(22)
    m = _qlinear_conv_model()
    m.graph.input.extend([helper.make_tensor_value_info("ys", TensorProto.FLOAT, [])])
    rep = backend.prepare(m)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    for _ in range(3):
        _same(rep.run({"x": x}), backend.prepare(m).run({"x": x}))
    assert _bound(rep)  # bound with the default 0.5
    ys = np.array(0.25, np.float32)
    want = backend.prepare(m).run({"x": x, "ys": ys})
    assert not np.array_equal(want[0], rep.run({"x": x})[0])
    _same(rep.run({"x": x, "ys": ys}), want)
    _same(rep.run({"x": x}), backend.prepare(m).run({"x": x}))


def test_bound_short_path_outputs_are_fresh_arrays():
    """A run's outputs are the caller's: a later run (bound short paths, the output pool for
    large outputs) never writes into arrays an earlier run returned."""
    from qlinear.tools import synthetic

    model = synthetic.resnet50_qoperator(0, image=32, classes=10)  # every node bound: Q, convs, adds, pools
    rep = backend.prepare(model)
    rng = np.random.default_rng(23)
    feeds = [random_inputs(model, seed=s) for s in range(4)]
    kept = [rep.run(f) for f in feeds]
    copies = [[np.array(o, copy=True) for o in k] for k in kept]
    assert _bound(rep)
    for f in feeds:
        rep.run(f)
    for k, c in zip(kept, copies):
        _same(k, c)
    assert len({k[0].__array_interface__["data"][0] for k in kept}) == len(kept)
    big = _qlinear_conv_model()
    rep = backend.prepare(big)
    # outputs of 1.4 MiB: from the native output pool (qlinear._native.empty)
    xs = [rng.integers(0, 256, (1, 3, 600, 600)).astype(np.uint8) for _ in range(4)]
    outs = [rep.run([x])[0] for x in xs]
    assert _bound(rep)
    ref = [np.array(o, copy=True) for o in outs]
    for x in xs:
        rep.run([x])
    for o, r in zip(outs, ref):
        _same([o], [r])
    assert len({o.__array_interface__["data"][0] for o in outs}) == len(outs)


def test_openblas_switched_only_where_a_node_may_call_it(monkeypatch):
    """A run switches OpenBLAS to one thread (and back) only when the graph has a node that may
    call a BLAS on this engine: not for a model of native integer operators, yes for a float
    Conv, and yes for the same integer model on the NumPy engine (float32 BLAS sums)."""
    from qlinear import _blas, _native
    from qlinear.tools import synthetic

    switches = []
    real = _blas.single_threaded
    monkeypatch.setattr(_blas, "single_threaded", lambda: switches.append(1) or real())
    x = np.zeros((1, 3, 8, 8), np.uint8)
    rep = backend.prepare(_qlinear_conv_model())
    want = rep.run([x])
    assert switches == []
    with _native.use_engine("numpy"):
        _same(rep.run([x]), want)
    assert switches == [1]
    cnn = synthetic.small_cnn(0)  # float Conv and Gemm: BLAS products
    backend.prepare(cnn).run([np.zeros((1, 3, 16, 16), np.float32)])
    assert switches == [1, 1]


def test_qlinear_concat_bound_short_path():
    """QLinearConcat's bound path: the full path's bytes (a copied input and two requantized
    ones, small and large), None for other shapes, and a fed scale (a default of a graph
    input) rechecked per run."""
    rng = np.random.default_rng(24)
    for fed in (False, True):
        m = _concat_model(fed)
        fast, slow = backend.prepare(m), _slow(backend.prepare(m))
        for shape in [(2, 3, 40), (2, 3, 40), (2, 3, 40), (2, 3, 1), (2, 3, 40)]:
            feeds = {n: rng.integers(0, 256, (shape[0], k + 1, shape[2])).astype(np.uint8)
                     for k, n in enumerate("abc")}
            _same(fast.run(feeds), slow.run(feeds))
        (entry,) = _bound(fast)
        ins = [None, None, np.zeros((2, 1, 40), np.uint8), None, None, np.zeros((2, 2, 40), np.uint8), None, None,
               np.zeros((2, 3, 1), np.uint8), None, None]
        assert entry[7][1](ins) is None
        if fed:
            feeds["s2"] = np.array(0.5, np.float32)
            _same(fast.run(feeds), slow.run(feeds))
