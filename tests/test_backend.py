"""qlinear.backend: the ONNX backend interface, the kernels it substitutes, the operators
where onnx.reference is wrong or missing (detected here, corrected there), and every float
operator of the test models checked against onnxruntime."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import oracle  # noqa: E402
import qlinear  # noqa: E402
from qlinear import backend  # noqa: E402
from qlinear.graph.kernels import standard  # noqa: E402
from conftest import I8, U8, assert_exact, rand_int, rand_scale  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _init(name, v):
    return numpy_helper.from_array(np.asarray(v), name)


# --------------------------------------------------------------------------- interface


def test_backend_interface():
    assert issubclass(backend.QLinearBackend, onnx.backend.base.Backend)
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    rng = np.random.default_rng(0)
    a = rand_int(rng, np.uint8, (3, 5))
    b = rand_int(rng, np.int8, (5, 4))
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    (y,) = backend.run_node(node, [a, b])
    assert_exact(y, oracle.matmul_integer(a, b))
    m = _model([node], [helper.make_tensor_value_info("a", T.UINT8, [3, 5])],
               [helper.make_tensor_value_info("y", T.INT32, None)], [_init("b", b)], opset=10)
    assert backend.is_compatible(m)
    (y2,) = backend.run_model(m, [a])
    assert_exact(y2, oracle.matmul_integer(a, b))
    rep = backend.prepare(m)
    assert_exact(rep.run({"a": a})[0], y2)


def _qconv_model(w, w_scale, w_zp, B=None, **attrs):
    names = ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"] + (["B"] if B is not None else [])
    node = helper.make_node("QLinearConv", names, ["y"], **attrs)
    inits = [_init("w", w), _init("ws", w_scale), _init("wzp", w_zp)] + ([_init("B", B)] if B is not None else [])
    ins = [helper.make_tensor_value_info("x", T.UINT8, None),
           helper.make_tensor_value_info("xs", T.FLOAT, []),
           helper.make_tensor_value_info("xzp", T.UINT8, []),
           helper.make_tensor_value_info("ys", T.FLOAT, []),
           helper.make_tensor_value_info("yzp", T.UINT8, [])]
    return _model([node], ins, [helper.make_tensor_value_info("y", T.UINT8, None)], inits, opset=10)


def test_qlinear_conv_uses_prepared_weights_once(monkeypatch):
    """Constant weights are pretransformed once per model, not on every run."""
    rng = np.random.default_rng(1)
    w = rand_int(rng, np.int8, (4, 3, 3, 3))
    ws = rand_scale(rng, (4,))
    wzp = np.zeros(4, np.int8)
    B = rng.integers(-500, 500, 4).astype(np.int32)
    m = _qconv_model(w, ws, wzp, B, pads=[1, 1, 1, 1], strides=[2, 1])
    calls = []
    real = qlinear.prepare_qlinear_conv

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(qlinear, "prepare_qlinear_conv", counting)
    rep = backend.prepare(m)
    for seed in range(3):
        r = np.random.default_rng(seed)
        x = rand_int(r, np.uint8, (2, 3, 7, 6))
        xs, ys = rand_scale(r), np.float32(0.5)
        feeds = {"x": x, "xs": xs, "xzp": np.uint8(100), "ys": ys, "yzp": np.uint8(7)}
        y = rep.run(feeds)[0]
        want = oracle.qlinear_conv(x, xs, np.uint8(100), w, ws, wzp, ys, np.uint8(7), B,
                                   pads=[1, 1, 1, 1], strides=[2, 1])
        assert_exact(y, want)
    assert len(calls) == 1
    assert calls[0]["pads"] == [1, 1, 1, 1] and calls[0]["strides"] == [2, 1]


def test_all_six_kernels_match_oracle():
    rng = np.random.default_rng(2)
    x = rand_int(rng, np.uint8, (1, 2, 5, 5))
    w = rand_int(rng, np.int8, (3, 2, 2, 2))
    a = rand_int(rng, np.int8, (2, 4, 6))
    b = rand_int(rng, np.uint8, (6, 3))
    f = rng.normal(0, 3, (2, 3, 4)).astype(np.float32)
    s = rand_scale(rng)
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "xzp"], ["ci"], pads=[0, 1, 1, 0]),
        helper.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["mi"]),
        helper.make_node("QLinearMatMul", ["a", "s", "azp", "b", "s", "bzp", "s", "yzp8"], ["qm"]),
        helper.make_node("QLinearConv", ["x", "s", "xzp", "w", "s", "wzp", "s", "yzp8"], ["qc"]),
        helper.make_node("QuantizeLinear", ["f", "s", "yzp8"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "yzp8"], ["dq"]),
    ]
    inits = [_init("w", w), _init("b", b), _init("s", s), _init("xzp", np.uint8(9)),
             _init("azp", np.int8(-3)), _init("bzp", np.uint8(200)), _init("wzp", np.int8(0)),
             _init("yzp8", np.int8(5))]
    outs = ["ci", "mi", "qm", "qc", "q", "dq"]
    m = _model(nodes, [helper.make_tensor_value_info("x", T.UINT8, x.shape),
                       helper.make_tensor_value_info("a", T.INT8, a.shape),
                       helper.make_tensor_value_info("f", T.FLOAT, f.shape)],
               [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    got = dict(zip(outs, backend.prepare(m).run({"x": x, "a": a, "f": f})))
    assert_exact(got["ci"], oracle.conv_integer(x, w, np.uint8(9), pads=[0, 1, 1, 0]))
    assert_exact(got["mi"], oracle.matmul_integer(a, b, np.int8(-3), np.uint8(200)))
    assert_exact(got["qm"], oracle.qlinear_matmul(a, s, np.int8(-3), b, s, np.uint8(200), s, np.int8(5)))
    assert_exact(got["qc"], oracle.qlinear_conv(x, s, np.uint8(9), w, s, np.int8(0), s, np.int8(5)))
    assert_exact(got["q"], oracle.quantize_linear(f, s, np.int8(5)))
    assert_exact(got["dq"], oracle.dequantize_linear(got["q"], s, np.int8(5)))


# --------------------------------------------------------------------------- onnx.reference fixes


def _bn_model(opset, C=6, seed=0):
    rng = np.random.default_rng(seed)
    inits = [_init(n, v.astype(np.float32)) for n, v in
             [("s", rng.normal(size=C)), ("b", rng.normal(size=C)), ("mean", rng.normal(size=C)),
              ("var", rng.uniform(0.1, 2, size=C))]]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y"], epsilon=1e-3)
    return _model([node], [helper.make_tensor_value_info("x", T.FLOAT, [2, C, 5, 5])],
                  [helper.make_tensor_value_info("y", T.FLOAT, [2, C, 5, 5])], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 13, 15])
def test_batch_normalization_inference_matches_onnxruntime(opset):
    m = _bn_model(opset)
    x = np.random.default_rng(opset).normal(size=(2, 6, 5, 5)).astype(np.float32)
    want = _ort(m, {"x": x})[0]
    assert_exact(backend.prepare(m).run([x])[0], want)


@pytest.mark.parametrize("opset", [9, 13])
def test_detect_reference_batch_normalization_is_wrong(opset):
    """The reason for the override: onnx.reference computes batch statistics for 9-13."""
    m = _bn_model(opset)
    x = np.random.default_rng(0).normal(size=(2, 6, 5, 5)).astype(np.float32)
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert np.abs(ref - _ort(m, {"x": x})[0]).max() > 0.1


def test_dequantize_linear_13_missing_in_reference_runs_here():
    x = np.arange(-128, 128, dtype=np.int8).reshape(2, 4, 32)
    scale = np.array([0.5, 0.25, 2.0, 1.0], np.float32)
    zp = np.array([0, 3, -2, 127], np.int8)
    node = helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], axis=1)
    m = _model([node], [helper.make_tensor_value_info("x", T.INT8, x.shape)],
               [helper.make_tensor_value_info("y", T.FLOAT, x.shape)], [_init("s", scale), _init("zp", zp)])
    with pytest.raises(Exception, match="DequantizeLinear"):
        ReferenceEvaluator(m).run(None, {"x": x})
    got = backend.prepare(m).run([x])[0]
    assert_exact(got, _ort(m, {"x": x})[0])
    assert_exact(got, oracle.dequantize_linear(x, scale, zp, axis=1))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32])
def test_max_pool_with_padding(dtype):
    """onnx.reference pads integer MaxPool with NaN (error or garbage); qlinear's vectorized
    MaxPool (integers and floats) equals onnxruntime bit for bit."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng(3)
    if dtype == np.float32:
        x = (rng.normal(size=(2, 3, 7, 6)) - 5).astype(np.float32)  # all negative: a 0 pad would win
    else:
        hi = -1 if dtype == np.int8 else 255
        x = rand_int(rng, dtype, (2, 3, 7, 6), hi=hi)  # int8: all negative, so a 0 pad would win
    for attrs in [dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
                  dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], ceil_mode=1, strides=[2, 2]),
                  dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER"),
                  dict(kernel_shape=[3, 3], dilations=[2, 1], pads=[2, 1, 2, 1])]:
        m = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
                   [helper.make_tensor_value_info("x", elem, x.shape)],
                   [helper.make_tensor_value_info("y", elem, None)])
        assert_exact(backend.prepare(m).run([x])[0], _ort(m, {"x": x})[0])


def test_quantize_dequantize_fast_path_checks_x_and_never_goes_stale():
    """QuantizeLinear / DequantizeLinear with constant parameters take a short path after the
    first run; it still refuses an x of another dtype (same message as the first run), and a
    scale fed as a graph input (the same buffer refilled) is read anew on every run. qlinear
    runs the model with x's element type undeclared, so that run's declared-type check lets
    a float64 x reach the node (onnxruntime, the reference, takes only the declared model)."""
    x_info = helper.make_tensor_value_info("x", T.FLOAT, None)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    out = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    inits = [_init("s", np.float32(0.05)), _init("z", np.uint8(100))]
    m = _model(nodes, [x_info], out, inits)
    rep = backend.prepare(_model(nodes, [helper.make_tensor_value_info("x", T.UNDEFINED, None)], out, inits),
                          qdq="literal")
    rng = np.random.default_rng(31)
    for _ in range(3):
        x = rng.normal(size=(3, 17)).astype(np.float32)
        assert_exact(rep.run([x])[0], _ort(m, {"x": x})[0])
    with pytest.raises(backend.NodeError, match="'q'.*x must have type .*got dtype float64"):
        rep.run([x.astype(np.float64)])
    assert_exact(rep.run([x])[0], _ort(m, {"x": x})[0])
    s = np.array(0.05, np.float32)
    m2 = _model(nodes, [x_info, helper.make_tensor_value_info("s", T.FLOAT, [])], out, [_init("z", np.uint8(100))])
    rep2 = backend.prepare(m2, qdq="literal")
    got = []
    for scale in (0.05, 0.2, 0.01):
        s[...] = scale
        y = rep2.run({"x": x, "s": s})[0]
        assert_exact(y, _ort(m2, {"x": x, "s": s})[0])
        got.append(y)
    assert not np.array_equal(got[0], got[1])


def _max_pool_oracle(x, kernel, strides, dilations, pb, out_hw):
    """MaxPool by its definition, window by window in int64: the maximum of the taps inside
    the plane, the type's minimum for a window with none (independent of both kernels)."""
    lo = np.iinfo(x.dtype).min
    n, c, h, w = x.shape
    y = np.full((n, c) + tuple(out_hw), lo, np.int64)
    xi = x.astype(np.int64)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            for ky in range(kernel[0]):
                iy = oy * strides[0] - pb[0] + ky * dilations[0]
                for kx in range(kernel[1]):
                    ix = ox * strides[1] - pb[1] + kx * dilations[1]
                    if 0 <= iy < h and 0 <= ix < w:
                        y[:, :, oy, ox] = np.maximum(y[:, :, oy, ox], xi[:, :, iy, ix])
    return y.astype(x.dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_native_max_pool_matches_oracle_and_numpy(dtype, threads):
    """The compiled byte MaxPool (qlinear/csrc/elementwise/pool.c) against the definition and against the
    NumPy formulation it replaces, on random geometries: kernels 1-4 per axis, strides 1-4
    (the stride-2 SSE2 split and the generic one), dilations, pads up to the kernel, ceil_mode,
    auto_pad, planes narrower and wider than a vector, full-range values, 1 and 2 threads."""
    from qlinear import _native

    if not _native.available():
        pytest.skip("needs the native engine")
    rng = np.random.default_rng([np.dtype(dtype).itemsize, dtype == np.int8, threads, 8])
    saved = _native.get_num_threads()
    _native.set_num_threads(threads)
    try:
        for i in range(60):
            k = [int(v) for v in rng.integers(1, 5, 2)]
            st = [int(v) for v in rng.integers(1, 5, 2)]
            dl = [int(v) for v in rng.integers(1, 3, 2)]
            hw = [int(v) for v in rng.integers(1, 40 if i % 3 else 150, 2)]
            pads = [int(rng.integers(0, k[j % 2])) for j in range(4)]
            attrs = dict(kernel_shape=k, strides=st, dilations=dl, pads=pads, ceil_mode=int(i % 2))
            if i % 7 == 6:
                attrs = dict(kernel_shape=k, strides=st, auto_pad=["SAME_UPPER", "SAME_LOWER", "VALID"][i % 3])
            x = rand_int(rng, dtype, (int(rng.integers(1, 3)), int(rng.integers(1, 6)), *hw))
            key = (x.shape, tuple(k), tuple(st), tuple(attrs.get("pads", ())) or None,
                   tuple(attrs.get("dilations", ())) or None, attrs.get("auto_pad", "NOTSET"),
                   attrs.get("ceil_mode", 0))
            kernel, strides, dilations, pb, out = standard._max_pool_geometry(*key)
            want = _max_pool_oracle(x, kernel, strides, dilations, pb, out[2:])
            assert_exact(standard._max_pool_numpy(x, key), want)
            for isa in _native.engine_info()["isas"]:  # the row step of every level
                with _native.use_isa(isa):
                    assert_exact(backend.max_pool(x, **attrs), want)
        # ResNet-50's two MaxPools (3x3 stride 2 pad 1 on 112x112, a 7x7 window over 7x7)
        for shape, attrs in [((1, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
                             ((1, 2048, 7, 7), dict(kernel_shape=[7, 7]))]:
            x = rand_int(rng, dtype, shape)
            key = (shape, tuple(attrs["kernel_shape"]), tuple(attrs.get("strides", ())) or None,
                   tuple(attrs.get("pads", ())) or None, None, "NOTSET", 0)
            for isa in _native.engine_info()["isas"]:
                with _native.use_isa(isa):
                    assert_exact(backend.max_pool(x, **attrs), standard._max_pool_numpy(x, key))
    finally:
        _native.set_num_threads(saved)


def test_native_max_pool_refuses_bad_geometry():
    """The raw entry point checks every geometry value and buffer size itself."""
    from qlinear import _native

    if not _native.available():
        pytest.skip("needs the native engine")
    C = _native._C
    x, y = np.zeros(16, np.uint8), np.zeros(4, np.uint8)
    good = [1, 4, 4, 2, 2, 2, 2, 2, 2, 1, 1, 0, 0]
    C.maxpool2d("scalar", x, y, *good, False)
    for i, bad in [(5, 0), (7, 0), (9, 0), (11, -1), (1, -1), (0, 1 << 50)]:
        args = list(good)
        args[i] = bad
        with pytest.raises(ValueError, match="maxpool2d"):
            C.maxpool2d("scalar", x, y, *args, False)
    with pytest.raises(ValueError, match="buffer x"):
        C.maxpool2d("scalar", x, y, 1, 5, 4, 2, 2, 2, 2, 2, 2, 1, 1, 0, 0, False)
    with pytest.raises(ValueError, match="buffer y"):
        C.maxpool2d("scalar", x, y, 1, 4, 4, 3, 2, 2, 2, 2, 2, 1, 1, 0, 0, False)


# --------------------------------------------------------------------------- float operators


def _float_op_cases():
    """Every float operator of the test models (tests/test_models.py, the bundled example,
    the synthetic ResNet-50), with the exactness onnxruntime allows: 0 ulp where both sides
    do one correctly rounded float32 operation per element, a few ulp for Softmax (exp), and
    the float32 error bound of a dot product for Gemm (summation order)."""
    rng = np.random.default_rng(4)
    x4 = rng.normal(size=(2, 8, 6, 6)).astype(np.float32)
    x3 = rng.normal(size=(2, 8, 32)).astype(np.float32)
    return [
        ("Relu", [helper.make_node("Relu", ["x"], ["y"])], {"x": x4}, [], 0),
        ("MaxPool", [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
         {"x": x4}, [], 0),
        ("MaxPool padded", [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1] * 4,
                                             strides=[2, 2])], {"x": x4}, [], 0),
        ("Add", [helper.make_node("Add", ["x", "c"], ["y"])], {"x": x3},
         [_init("c", rng.normal(size=32).astype(np.float32))], 0),
        ("Add residual", [helper.make_node("Add", ["x", "x2"], ["y"])],
         {"x": x3, "x2": rng.normal(size=x3.shape).astype(np.float32)}, [], 0),
        ("Reshape", [helper.make_node("Reshape", ["x", "shape"], ["y"])], {"x": x4},
         [_init("shape", np.array([-1, 288], np.int64))], 0),
        ("BatchNormalization", _bn_model(13).graph.node, {"x": rng.normal(size=(2, 6, 5, 5)).astype(np.float32)},
         list(_bn_model(13).graph.initializer), 0),
        ("Softmax", [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x3 * 4}, [], 8),
        ("Gemm", [helper.make_node("Gemm", ["x", "w", "b"], ["y"])],
         {"x": rng.normal(size=(5, 256)).astype(np.float32)},
         [_init("w", rng.normal(size=(256, 10)).astype(np.float32)),
          _init("b", rng.normal(size=10).astype(np.float32))], None),
    ]


def _ulp_distance(a, b):
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max())


@pytest.mark.parametrize("case", _float_op_cases(), ids=lambda c: c[0])
def test_float_operator_against_onnxruntime(case):
    name, nodes, feeds, inits, max_ulp = case
    ins = [helper.make_tensor_value_info(k, T.FLOAT, v.shape) for k, v in feeds.items()]
    m = _model(list(nodes), ins, [helper.make_tensor_value_info("y", T.FLOAT, None)], inits)
    got = backend.prepare(m).run(feeds)[0]
    want = _ort(m, feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    if name == "Gemm":
        # summation order differs: bound by the float32 error of a K-term dot product
        x, w = feeds["x"].astype(np.float64), numpy_helper.to_array(inits[0]).astype(np.float64)
        bound = 2 * x.shape[1] * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w) + 1)
        assert (np.abs(got.astype(np.float64) - want) <= bound).all()
    else:
        assert _ulp_distance(got, want) <= max_ulp


# --------------------------------------------------------------------------- refusals


def test_unsupported_nodes_are_all_listed():
    nodes = [
        helper.make_node("QLinearReduceMean", ["a", "s", "z", "s", "z"], ["b"],  # a schema, no kernel
                         domain="com.microsoft", name="qadd"),
        # version 21: x and y_scale share one type (float16 with float32 is invalid)
        helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q_half"),
        # output_dtype came to DequantizeLinear with version 23
        helper.make_node("DequantizeLinear", ["a", "s", "z"], ["d"], name="dq_odt", output_dtype=T.FLOAT16),
        helper.make_node("NoSuchOp", ["d"], ["e"], name="bogus"),
        helper.make_node("Relu", ["d"], ["r"], name="fine"),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", T.FLOAT16, [4]),
                                       helper.make_tensor_value_info("a", T.UINT8, [4])],
                          [helper.make_tensor_value_info(o, T.FLOAT, None) for o in ("b", "q", "e", "r")],
                          [_init("s", np.float32(0.1)), _init("z", np.uint8(3)), _init("sh", np.float16(0.1))]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(backend.UnsupportedModelError) as e:
        backend.prepare(m)
    problems = {p.node: p for p in e.value.problems}
    assert set(problems) == {"qadd", "q_half", "dq_odt", "bogus"}
    assert problems["q_half"].version == 21 and "float16" in problems["q_half"].reason
    msg = str(e.value)
    assert msg.startswith("prepare: 4 unsupported nodes")
    assert "QuantizeLinear-21 ×1 (QuantizeLinear-21 takes x and y_scale of one type; got float16 and float32" in msg
    assert "'q_half'" in msg and "'output_dtype'" in msg and "'dq_odt'" in msg
    assert "com.microsoft.QLinearReduceMean ×1" in msg
    assert not backend.is_compatible(m)


def test_quantize_output_dtype_differing_from_zero_point_type_names_both():
    """QuantizeLinear-21's output_dtype must be y_zero_point's type (the schema; onnxruntime
    refuses the model at load). It was accepted by check_model (`qlinear inspect`: 'runs') and
    failed at run time with 'output_dtype and y_zero_point's type differ', naming neither; a
    zero point only typed at run time gets the same words."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", T.INT8, None)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q", output_dtype=T.INT8)
    m = _model([node], [x], [y], [_init("s", np.float32(0.1)), _init("z", np.uint8(1))], opset=21)
    with pytest.raises(backend.UnsupportedModelError,
                       match=r"QuantizeLinear-21 ×1 \(output_dtype int8 differs from y_zero_point's type uint8"):
        backend.prepare(m)
    m = _model([node], [x, helper.make_tensor_value_info("z", T.UNDEFINED, None)], [y],
               [_init("s", np.float32(0.1))], opset=21)
    with pytest.raises(backend.NodeError, match=r"'q' \(QuantizeLinear-21\).*output_dtype int8 differs from "
                                                 r"y_zero_point's type uint8"):
        backend.prepare(m).run([np.ones((2, 3), np.float32), np.uint8(1)])


@pytest.mark.parametrize("op,domain,attrs", [
    ("ConvInteger", "", {"stride": [2, 2]}),                      # a misspelt 'strides'
    ("MaxPool", "", {"kernel_shape": [2, 2], "stride": [2, 2]}),
    ("QLinearAveragePool", "com.microsoft", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("QLinearAdd", "com.microsoft", {"foo": 1}),
])
def test_attributes_the_operator_does_not_have_are_refused(op, domain, attrs):
    """An attribute the operator does not define was ignored: ConvInteger with 'stride' ran
    with stride 1, QLinearAveragePool with 'dilations' (which it does not have) as an
    undilated pool; onnxruntime refuses such nodes (onnx's checker too, for ai.onnx, but the
    Python backend does not run it)."""
    x = helper.make_tensor_value_info("x", T.UINT8, [1, 1, 5, 5])
    inits = [_init("w", np.ones((1, 1, 3, 3), np.uint8)), _init("s", np.float32(0.1)), _init("z", np.uint8(0))]
    inputs = {"ConvInteger": ["x", "w"], "MaxPool": ["x"], "QLinearAveragePool": ["x", "s", "z", "s", "z"],
              "QLinearAdd": ["x", "s", "z", "x", "s", "z", "s", "z"]}[op]
    node = helper.make_node(op, inputs, ["y"], name="n", domain=domain, **attrs)
    g = helper.make_graph([node], "t", [x], [helper.make_empty_tensor_value_info("y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    with pytest.raises(backend.UnsupportedModelError) as e:
        backend.prepare(m)
    bad = sorted(a for a in attrs if a not in ("kernel_shape",))
    assert f"unknown attribute {bad[0]!r} (the operator has " in str(e.value)
    session = ort.SessionOptions()
    with pytest.raises(Exception, match="(?i)unrecognized attribute"):
        ort.InferenceSession(m.SerializeToString(), session, providers=["CPUExecutionProvider"])
    kept = m.graph.node[0].attribute
    del kept[:]
    kept.extend(helper.make_attribute(k, v) for k, v in attrs.items() if k not in bad)
    assert not backend.check_model(m)  # the same node without the unknown attribute runs


def test_external_data_that_was_not_loaded_is_named(tmp_path):
    """A model whose weights live in an external file that was not read (loaded with
    load_external_data=False, or given as bytes) failed in onnx.reference with 'An instance of
    LargeContainer should be created before using ReferenceEvaluator' (RuntimeError); it is a
    ValueError naming the tensor, the file and what to do. From its path it runs."""
    w = np.arange(-6, 6, dtype=np.int8).reshape(4, 3)
    m = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
               [helper.make_tensor_value_info("a", T.UINT8, [2, 4])],
               [helper.make_tensor_value_info("y", T.INT32, [2, 3])], [_init("w", w)])
    path = tmp_path / "m.onnx"
    onnx.save(m, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    a = np.arange(8, dtype=np.uint8).reshape(2, 4)
    assert_exact(backend.prepare(str(path)).run([a])[0], oracle.matmul_integer(a, w))
    assert_exact(backend.prepare(onnx.load(path)).run([a])[0], oracle.matmul_integer(a, w))
    with pytest.raises(ValueError, match=r"prepare: tensor 'w' keeps its data in the external file 'w\.bin', "
                                         r"which was not loaded; pass the model's path"):
        backend.prepare(onnx.load(path, load_external_data=False))
    with pytest.raises(ValueError, match=r"'w\.bin', which was not loaded; a model given as bytes cannot read it"):
        backend.prepare(path.read_bytes())


def test_prepared_model_pickles_and_copies():
    """A QLinearRep could be neither pickled (multiprocessing) nor deep-copied: "cannot pickle
    'google._upb._message.RepeatedCompositeContainer' object". It is rebuilt from its model
    and options, giving the same outputs (emulation and size limit kept)."""
    import copy
    import pickle

    path = os.path.join(os.path.dirname(qlinear.__file__), "examples", "digits_cnn_qoperator.onnx")
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    for kw in ({}, {"emulate": "onnxruntime-avx2", "max_tensor_bytes": 1 << 20}):
        rep = backend.prepare(path, **kw)
        want = rep.run([x])[0]
        for again in (pickle.loads(pickle.dumps(rep)), copy.deepcopy(rep)):
            assert again is not rep and again.emulate == rep.emulate
            assert again.max_tensor_bytes == rep.max_tensor_bytes
            assert_exact(again.run([x])[0], want)


def test_run_time_type_error_names_node_operator_version():
    """A type only known at run time (no declared input type) is a NodeError, not a fallback."""
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="quant")
    m = _model([node], [helper.make_tensor_value_info("x", T.UNDEFINED, None)],
               [helper.make_tensor_value_info("y", T.UINT8, None)], [_init("s", np.float32(0.1))])
    rep = backend.prepare(m)
    with pytest.raises(backend.NodeError, match=r"'quant' \(QuantizeLinear-13\).*float64"):
        rep.run([np.zeros(3, np.float64)])


def test_kernel_value_error_is_wrapped_with_node():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="quant")
    m = _model([node], [helper.make_tensor_value_info("x", T.FLOAT, [3])],
               [helper.make_tensor_value_info("y", T.UINT8, None)], [_init("s", np.float32(0.0))])
    with pytest.raises(backend.NodeError, match=r"^node 'quant' \(QuantizeLinear-13\): quantize_linear"):
        backend.prepare(m).run([np.zeros(3, np.float32)])


def test_old_opset_per_axis_refused():
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="dq")
    m = _model([node], [helper.make_tensor_value_info("x", T.UINT8, [2, 3])],
               [helper.make_tensor_value_info("y", T.FLOAT, None)],
               [_init("s", np.ones(3, np.float32))], opset=10)
    # a constant per-axis scale is found before running (as qlinear inspect reports it)
    with pytest.raises(backend.UnsupportedModelError,
                       match=r"DequantizeLinear-10 takes a scalar x_scale \(per-axis needs opset 13\); got shape \(3,\)"):
        backend.prepare(m)


def _loop_model(slice_shape, trips, with_cond=True, carried=True):
    """Loop: carries v (v + 1 per trip) and stacks a scan output of ``slice_shape`` (v
    broadcast onto it plus the iteration number), ``trips`` trips (None: M omitted, the
    condition turns false when i reaches 2)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["v", "one"], ["v2"]),
             helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
             helper.make_node("Add", ["v2", "fi"], ["s0"]),
             helper.make_node("Expand", ["s0", "shape"], ["slice"]),
             helper.make_node("Less", ["i", "two"], ["c2"])]
    inits = [_init("one", np.float32(1)), _init("shape", np.array(slice_shape, np.int64)),
             _init("two", np.int64(2))]
    body = helper.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("c", T.BOOL, []),
                                             vi("v", T.FLOAT, [])],
                             [vi("c2", T.BOOL, []), vi("v2", T.FLOAT, []),
                              vi("slice", T.FLOAT, list(slice_shape))], inits)
    outer = [_init("cond", np.array(True))]
    m_in = ""
    if trips is not None:
        outer.append(_init("M", np.int64(trips)))
        m_in = "M"
    loop = helper.make_node("Loop", [m_in, "cond" if with_cond else "", "x"], ["vf", "ys"],
                            body=body)
    return _model([loop], [vi("x", T.FLOAT, [])],
                  [vi("vf", T.FLOAT, []), vi("ys", T.FLOAT, None)], outer, opset=16)


@pytest.mark.parametrize("slice_shape", [(), (3,), (2, 3), (2, 1, 4)])
@pytest.mark.parametrize("trips,with_cond", [(4, False), (5, True), (None, True), (0, True)])
def test_loop_stacks_scan_outputs_as_onnxruntime(slice_shape, trips, with_cond):
    # onnx.reference concatenates slices of rank >= 2 ((2, 3) x 4 trips -> (8, 3)); the
    # operator stacks them ((4, 2, 3)), as onnxruntime does
    m = _loop_model(slice_shape, trips, with_cond)
    feeds = {"x": np.array(0.5, np.float32)}
    want = _ort(m, feeds)
    got = backend.prepare(m).run(feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape)
        assert np.array_equal(g, w)


def test_onnx_reference_loop_still_concatenates():
    # the reason for qlinear._control.Loop: when onnx.reference stacks like the operator,
    # this test fails and the override can go
    m = _loop_model((2, 3), 4, True)  # 3 trips: the condition stops it
    got = ReferenceEvaluator(m).run(None, {"x": np.array(0.5, np.float32)})[1]
    assert got.shape == (6, 3)
    assert backend.prepare(m).run({"x": np.array(0.5, np.float32)})[1].shape == (3, 2, 3)


# ----------------------------------------------------------------------------- API misuse


def _add_model():
    w = numpy_helper.from_array(np.array([1, 2], np.float32), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", T.FLOAT, [2]),
                   helper.make_tensor_value_info("w", T.FLOAT, [2])],  # w: an input with a default
                  [helper.make_tensor_value_info("y", T.FLOAT, [2])], [w])


def test_prepare_takes_a_model_a_path_or_bytes(tmp_path):
    """prepare accepts a ModelProto, a path (str or os.PathLike) or the serialized bytes;
    anything else is a TypeError saying so (None gave "the model-local functions cannot be
    inlined: 'NoneType' object has no attribute 'functions'", a pathlib.Path the same)."""
    m = _add_model()
    path = tmp_path / "add.onnx"
    onnx.save(m, path)
    x = np.array([10, 20], np.float32)
    for model in (m, str(path), path, m.SerializeToString()):
        np.testing.assert_array_equal(backend.prepare(model).run([x])[0], [11, 22])
    for bad in (None, 3, [m]):
        with pytest.raises(TypeError, match="^prepare: model must be an onnx.ModelProto, a path or bytes; got "):
            backend.prepare(bad)


def test_prepare_takes_max_tensor_bytes_and_refuses_unknown_keywords():
    """prepare(model, max_tensor_bytes=N) sets QLinearRep's size guards (it was accepted and
    silently ignored, as was any misspelt keyword: prepare(m, emulat=...) ran exactly);
    onnx's backend test runner passes rtol/atol, which are accepted (they are its
    comparison's tolerances)."""
    m = _model([helper.make_node("Expand", ["x", "shape"], ["y"])],
               [helper.make_tensor_value_info("x", T.FLOAT, [1])],
               [helper.make_tensor_value_info("y", T.FLOAT, None)],
               [numpy_helper.from_array(np.array([1024], np.int64), "shape")])
    x = np.ones(1, np.float32)
    assert backend.prepare(m).run([x])[0].shape == (1024,)
    rep = backend.prepare(m, max_tensor_bytes=4096)
    assert rep.max_tensor_bytes == 4096
    assert rep.run([x])[0].shape == (1024,)  # 4096 bytes: at the limit
    with pytest.raises(backend.NodeError, match="more than the limit of 2.0 KiB per tensor"):
        backend.prepare(m, max_tensor_bytes=2048).run([x])
    with pytest.raises(backend.NodeError, match="more than the limit"):
        backend.run_model(m, [x], max_tensor_bytes=2048)
    assert backend.prepare(m, rtol=1e-3, atol=1e-7).run([x])[0].shape == (1024,)
    for bad in ({"emulat": "onnxruntime-avx2"}, {"max_tensor_byte": 10}):
        with pytest.raises(TypeError, match=f"^prepare: unknown keyword argument {next(iter(bad))!r}"):
            backend.prepare(m, **bad)


def test_run_node_takes_one_value_per_node_input():
    """run_node with more values than the node has inputs used to drop the extra ones silently
    (MatMulInteger(a, b) given a, b and a zero point computed without it: a wrong answer);
    fewer values, or a dict without one of the names, named nothing useful ("Unable to find
    input 'b' in known results", a bare KeyError)."""
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mm")
    a, b = np.array([[1, 2]], np.uint8), np.array([[1], [1]], np.uint8)
    np.testing.assert_array_equal(backend.run_node(node, [a, b])[0], [[3]])
    np.testing.assert_array_equal(backend.run_node(node, {"a": a, "b": b})[0], [[3]])
    with pytest.raises(ValueError, match=r"^run_node: node 'mm' \(MatMulInteger\) has 2 inputs \('a', 'b'\); got 3 values"):
        backend.run_node(node, [a, b, np.uint8(1)])
    with pytest.raises(ValueError, match=r"^run_node: node 'mm' \(MatMulInteger\) has 2 inputs \('a', 'b'\); got 1 value"):
        backend.run_node(node, [a])
    with pytest.raises(ValueError, match=r"^run_node: no value for input 'b' of node 'mm' \(MatMulInteger\)"):
        backend.run_node(node, {"a": a})
    # an omitted optional input ("") takes no value
    conv = helper.make_node("ConvInteger", ["x", "w", "", "wz"], ["y"])
    y = backend.run_node(conv, [np.full((1, 1, 2, 2), 3, np.uint8), np.ones((1, 1, 2, 2), np.uint8),
                                np.uint8(1)])[0]
    np.testing.assert_array_equal(y, [[[[0]]]])


def test_run_names_unknown_and_missing_inputs():
    """Feeds by name: a name the model does not have, or a required input left out, is a
    ValueError naming it and the model's inputs (it was onnx.reference's RuntimeError inside
    the first node: "Unable to find input 'x' in known results [...every initializer...]")."""
    rep = backend.prepare(_add_model())
    x = np.array([10, 20], np.float32)
    with pytest.raises(ValueError, match=r"^run: unknown input 'z'; the model's inputs are 'x'$"):
        rep.run({"x": x, "z": x})
    with pytest.raises(ValueError, match=r"^run: no value for input 'x' \(the model's inputs are 'x'\)$"):
        rep.run({})
    with pytest.raises(ValueError, match=r"^run: no value for input 'x'"):
        rep.run([])
    np.testing.assert_array_equal(rep.run({"x": x, "w": np.zeros(2, np.float32)})[0], x)  # a default


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1000", True])
def test_max_tensor_bytes_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"^QLinearRep: max_tensor_bytes must be None or an integer >= 1; got "):
        backend.QLinearRep(_add_model(), max_tensor_bytes=bad)


def test_max_tensor_bytes_bounds_broadcast_views_fed_to_run():
    """With max_tensor_bytes, a broadcast view fed to run (or run_all) above the limit as an
    array is refused, naming it: the limit's guards leave alone the operators whose output is
    no larger than their input, and a view takes no memory, so a (2**15, 2**14) view ran through
    Relu under a 1 MiB limit and made a 2 GiB output. A real array exists already and is
    accepted, as qlinear's operators accept it; a view within the limit runs."""
    relu = _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", T.FLOAT, ["n"])],
                  [helper.make_tensor_value_info("y", T.FLOAT, ["n"])], [])
    rep = backend.QLinearRep(relu, max_tensor_bytes=4096)
    want = ("run: input 'x' is a view of shape (1025,) that repeats its memory (a broadcast view): "
            "as an array it would take 4100 bytes, more than the limit of 4096 bytes per tensor "
            "(max_tensor_bytes)")
    view = np.broadcast_to(np.float32(-1), (1025,))
    for run in (lambda: rep.run({"x": view}), lambda: rep.run([view]), lambda: rep.run_all({"x": view})):
        with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
            run()
    np.testing.assert_array_equal(rep.run([np.broadcast_to(np.float32(-1), (1024,))])[0], np.zeros(1024))
    np.testing.assert_array_equal(rep.run([np.full(1025, -1, np.float32)])[0], np.zeros(1025))
    assert backend.QLinearRep(relu).run([view])[0].shape == (1025,)  # no limit


def test_run_checks_inputs_against_their_declared_types_and_shapes():
    """run refuses an input whose dtype or fixed dimensions differ from the model's declaration,
    naming it (as onnxruntime does, and the qlinear command): a (2, 1, 9, 9) image fed to the
    bundled example's [N, 1, 8, 8] input ran and gave an answer, a float64 one failed inside
    the first node. Symbolic dimensions take any size; an input in non-native byte order is
    converted (it was refused by the first node as '>f4')."""
    from qlinear.cli import EXAMPLES_DIR  # the bundled example

    rep = backend.prepare(onnx.load(os.path.join(EXAMPLES_DIR, "digits_cnn_qoperator.onnx")))
    x = np.random.default_rng(0).random((2, 1, 8, 8)).astype(np.float32)
    want = rep.run([x])[0]
    with pytest.raises(ValueError, match=re.escape(
            "run: input 'image' has shape (2, 1, 9, 9); the model declares [N, 1, 8, 8]")):
        rep.run([np.zeros((2, 1, 9, 9), np.float32)])
    with pytest.raises(ValueError, match=re.escape(
            "run: input 'image' has shape (1, 8, 8); the model declares [N, 1, 8, 8]")):
        rep.run({"image": x[0]})
    for bad in (x.astype(np.float64), x.astype(np.int32)):
        with pytest.raises(TypeError, match=re.escape(
                f"run: input 'image' has dtype {bad.dtype}; the model declares float32")):
            rep.run([bad])
    np.testing.assert_array_equal(rep.run([x.astype(">f4")])[0], want)
    assert rep.run([np.concatenate([x, x])])[0].shape == (4, 10)  # N is symbolic


def test_run_converts_inputs_in_non_native_byte_order():
    """An input in non-native byte order ('>f4') is converted, as qlinear's operators convert
    their arrays (the first node refused it: "input x is >f4")."""
    from qlinear.cli import EXAMPLES_DIR  # the bundled example

    rep = backend.prepare(onnx.load(os.path.join(EXAMPLES_DIR, "digits_cnn_qoperator.onnx")))
    x = np.random.default_rng(0).random((2, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(rep.run([x.astype(">f4")])[0], rep.run([x])[0])
    np.testing.assert_array_equal(rep.run({"image": x.astype(">f4")})[0], rep.run([x])[0])


# ----------------------------------------------------------------------------- regressions
# found by the reliability campaign of issue 8 (silent wrong answers: aliasing, zero sizes)


def test_backend_weights_fed_as_inputs_are_not_cached_across_runs():
    """regression: A weight that is a graph input may be a buffer the caller reuses with new values: the
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


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 7

from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
import qlinear.backend as qb  # noqa: E402


F = np.float32


def _qdq10(op, scale_shape, zp_shape, as_input=False):
    xt, yt = (T.FLOAT, T.UINT8) if op == "QuantizeLinear" else (T.UINT8, T.FLOAT)
    sc = nh.from_array(np.full(scale_shape, 0.1, F), "sc")
    zp = nh.from_array(np.full(zp_shape, 1, np.uint8), "zp")
    ins = [h.make_tensor_value_info("x", xt, [1, 3, 2])]
    if as_input:  # the scale fed at run time: its shape is unknown before running
        ins.append(h.make_tensor_value_info("sc", T.FLOAT, None))
    g = h.make_graph([h.make_node(op, ["x", "sc", "zp"], ["y"])], "g", ins,
                     [h.make_tensor_value_info("y", yt, [1, 3, 2])], [zp] if as_input else [sc, zp])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 10)], ir_version=6)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((), (3,)), ((1, 3), ())])
def test_opset10_qdq_per_axis_is_refused_by_inspect_as_by_run(op, shapes, tmp_path):
    """regression: Opset 10's QuantizeLinear/DequantizeLinear take a scalar scale and zero point: inspect
    (check_model) said "runs" for a constant 1-D scale that run then refused; both now refuse
    with the same rule, naming the input and its shape (a 3-element zero point with a scalar
    scale was refused by run as a shape mismatch)."""
    from qlinear.cli import main

    model = _qdq10(op, *shapes)
    x = "y" if op == "QuantizeLinear" else "x"
    what = f"{x}_scale" if shapes[0] != () else f"{x}_zero_point"
    bad = shapes[0] if shapes[0] != () else shapes[1]
    rule = f"{op}-10 takes a scalar {what} (per-axis needs opset 13); got shape {bad}"
    problems = qb.check_model(model)
    assert [p.reason for p in problems] == [rule]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path), "--json"]) == 0  # describes; the verdict is in the table
    with pytest.raises(qb.UnsupportedModelError, match=__import__("re").escape(rule)):
        qb.prepare(model)
    # fed at run time (unknown to inspect), the kernel gives the same rule
    fed = _qdq10(op, (), (), as_input=True)
    assert qb.check_model(fed) == []
    with pytest.raises(ValueError, match=__import__("re").escape(f"{op}-10 takes a scalar {x}_scale")):
        qb.prepare(fed).run({"x": np.ones((1, 3, 2), F if op == "QuantizeLinear" else np.uint8),
                             "sc": np.full(3, 0.1, F)})


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_opset10_qdq_one_element_parameters_run(op):
    """regression: A 1-element 1-D scale and zero point are scalars for opset 10 (onnxruntime agrees)."""
    model = _qdq10(op, (1,), (1,))
    assert qb.check_model(model) == []
    x = np.ones((1, 3, 2), F if op == "QuantizeLinear" else np.uint8)
    y = qb.prepare(model).run({"x": x})[0]
    assert y.shape == (1, 3, 2)


def _quantize_int32_model(opset, zp_dtype=np.uint8):
    sc = nh.from_array(np.float32(0.3), "sc")
    zp = nh.from_array(zp_dtype(7), "zp")
    yt = h.np_dtype_to_tensor_dtype(np.dtype(zp_dtype))
    g = h.make_graph([h.make_node("QuantizeLinear", ["x", "sc", "zp"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.INT32, [6])], [h.make_tensor_value_info("y", yt, [6])], [sc, zp])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [10, 13, 18])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_quantize_linear_of_int32_runs_where_onnx_allows_it(opset, zp_dtype):
    """regression: QuantizeLinear-10 to -18 quantize an int32 x with a float32 scale (T1 is float or
    int32, y_scale float); qlinear.quantize_linear computes it, yet the backend refused the
    node ('input x is int32; only float32 is supported'). Checked against onnx.reference
    (onnxruntime has no int32 kernel) and the oracle."""
    from onnx.reference import ReferenceEvaluator
    from oracle import quantize_linear as oracle_quantize

    model = _quantize_int32_model(opset, zp_dtype)
    assert qb.check_model(model) == []
    x = np.array([-2**31, -100, -1, 0, 3, 2**31 - 1], np.int32)
    rep = qb.prepare(model)
    for _ in range(2):  # the second run takes the prepared parameters
        got = rep.run({"x": x})[0]
        assert got.dtype == zp_dtype
        np.testing.assert_array_equal(got, oracle_quantize(x, np.float32(0.3), zp_dtype(7)))
    # onnx.reference away from the int32 ends: at 2**31 - 1 it returns 0 (x / scale ≈ 7e9
    # wraps in its integer conversion before saturating), where the contract saturates
    mid = x[1:-1]
    with np.errstate(all="ignore"):
        ref = ReferenceEvaluator(model.SerializeToString()).run(None, {"x": np.resize(mid, 6)})[0]
    np.testing.assert_array_equal(rep.run({"x": np.resize(mid, 6)})[0], ref)


def test_quantize_linear_19_int32_x_with_float_scale_is_refused_naming_the_rule():
    """regression: From opset 19, x and y_scale share the type T1: an int32 x with a float32 scale is
    outside the schema (onnxruntime refuses the model)."""
    problems = qb.check_model(_quantize_int32_model(19))
    assert len(problems) == 1
    assert "int32" in problems[0].reason and "y_scale" in problems[0].reason and "19" in problems[0].reason


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 8 (Intel Xeon, AVX-512 VNNI and AMX)


def _relu_model(shape=("N", 3)) -> onnx.ModelProto:
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    g = h.make_graph([h.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                      h.make_node("Relu", ["t"], ["y"])], "g", [x], [y])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("blob", [b"garbage\x00\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f"])
def test_prepare_corrupt_bytes_is_a_value_error(blob, tmp_path):
    """regression: prepare(b"...") and prepare(path) of a corrupt protobuf raised protobuf's DecodeError
    ('Error parsing message with type onnx.ModelProto'), which is not a ValueError; the
    qlinear command said 'not an ONNX model, or a corrupt or truncated protobuf'."""
    with pytest.raises(ValueError, match=r"prepare: the bytes are not an ONNX model, or a corrupt"):
        qb.prepare(blob)
    p = tmp_path / "bad.onnx"
    p.write_bytes(blob)
    with pytest.raises(ValueError, match=r"prepare: '.*bad\.onnx' is not an ONNX model, or a corrupt"):
        qb.prepare(str(p))
    with pytest.raises(ValueError, match=r"bad\.onnx' is not an ONNX model"):
        qb.prepare(p)  # a pathlib.Path


@pytest.mark.parametrize("model", [b"", onnx.ModelProto(), "empty-file"], ids=["bytes", "proto", "file"])
def test_prepare_refuses_a_model_without_a_graph(model, tmp_path):
    """regression: Empty bytes (or an empty file, or onnx.ModelProto()) parse as a ModelProto without a
    graph: prepare accepted it and run returned (), where onnxruntime refuses it ('No graph
    was found in the protobuf') and the qlinear command says 'empty file, not an ONNX model'."""
    if model == "empty-file":
        model = tmp_path / "empty.onnx"
        model.write_bytes(b"")
    with pytest.raises(ValueError, match=r"prepare: the model has no graph"):
        qb.prepare(model)


@pytest.mark.parametrize("inputs", [3.0, None, "x", b"x", 7], ids=["float", "None", "str", "bytes", "int"])
def test_run_refuses_inputs_that_are_not_a_list_or_dict(inputs):
    """regression: rep.run(3.0) failed with Python's "'float' object is not iterable" (run(None) likewise);
    run("x") ran the string's characters as inputs."""
    rep = qb.prepare(_relu_model())
    with pytest.raises(TypeError, match=r"run: inputs must be a list or tuple of arrays in the model's "
                                        r"input order, or a dict of input name -> array; got "):
        rep.run(inputs)


def test_run_checks_a_list_value_as_the_dict_form_does():
    """regression: A nested Python list in the list form reached the first node unchecked (float64 refused
    by whatever node came first, or run), while the dict form converted it and named the
    input; now both name the input and the declared dtype."""
    rep = qb.prepare(_relu_model())
    value = [[1.0, 2.0, 3.0]]
    for feeds in ([value], {"x": value}):
        with pytest.raises(TypeError, match=r"run: input 'x' has dtype float64; the model declares float32"):
            rep.run(feeds)
    got = rep.run([np.asarray(value, F)])
    assert got[0].shape == (3, 1)


def test_run_checks_the_shape_of_a_numpy_scalar_input():
    """regression: np.float32(1) for an input declared [N, 3] skipped run's shape check (not an ndarray)
    and failed inside the Transpose ('Inconsistent permutation [1, 0] with shape ()')."""
    rep = qb.prepare(_relu_model())
    for feeds in ([F(1)], {"x": F(1)}):
        with pytest.raises(ValueError, match=r"run: input 'x' has shape \(\); the model declares \[N, 3\]"):
            rep.run(feeds)


def _window_model(op, attrs, shape=(1, 2, 6, 6), dtype=T.FLOAT, w_shape=(3, 2, 2, 2)):
    x = h.make_tensor_value_info("x", dtype, list(shape) if shape is not None else None)
    y = h.make_tensor_value_info("y", dtype, None)
    inputs, inits = ["x"], []
    if op == "Conv":
        inits = [nh.from_array(np.ones(w_shape, F), "w")]
        inputs.append("w")
    g = h.make_graph([h.make_node(op, inputs, ["y"], **attrs)], "g", [x], [y], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


_K = {"kernel_shape": [2, 2]}


WINDOW_CASES = {
    "kernel 0": ({"kernel_shape": [0, 2]}, r"attribute kernel_shape values must be >= 1; got \[0, 2\]"),
    "kernel -1": ({"kernel_shape": [-1, 2]}, r"attribute kernel_shape values must be >= 1"),
    "stride 0": ({**_K, "strides": [0, 1]}, r"attribute strides values must be >= 1; got \[0, 1\]"),
    "stride -1": ({**_K, "strides": [-1, 1]}, r"attribute strides values must be >= 1"),
    "dilation 0": ({**_K, "dilations": [0, 1]}, r"attribute dilations values must be >= 1"),
    "pads -1": ({**_K, "pads": [-1, 0, 0, 0]}, r"attribute pads values must be >= 0"),
    "strides length": ({**_K, "strides": [1]}, r"attribute strides must have 2 values \(one per spatial axis\); got 1"),
    "pads length": ({**_K, "pads": [1, 1]}, r"attribute pads must have 4 values \(two per spatial axis\); got 2"),
    "auto_pad": ({**_K, "auto_pad": "SAME"}, r"attribute auto_pad must be one of NOTSET, SAME_UPPER, SAME_LOWER, "
                                             r"VALID; got 'SAME'"),
    "kernel rank": ({"kernel_shape": [2, 2, 2]}, r"input 'x' has shape \[1, 2, 6, 6\]: 2 spatial axes, while "
                                                  r"the window has 3"),
    "pads >= kernel": ({**_K, "pads": [2, 0, 0, 0]}, r"attribute pads \[2, 0, 0, 0\] must be smaller than "
                                                       r"kernel_shape \[2, 2\]"),
    "no kernel": ({}, r"attribute kernel_shape is required"),
}


_OPS = [("MaxPool", T.FLOAT), ("MaxPool", T.UINT8), ("MaxPool", T.INT8), ("AveragePool", T.FLOAT),
        ("LpPool", T.FLOAT), ("Conv", T.FLOAT)]


@pytest.mark.parametrize("op,dtype", _OPS, ids=[f"{o}-{T.DataType.Name(d)}" for o, d in _OPS])
@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_malformed_window_attributes_are_refused_up_front(op, dtype, case):
    """regression: Malformed kernel_shape / strides / dilations / pads / auto_pad on the pools and the float
    Conv (all of which onnxruntime refuses when it loads the model) failed halfway through a
    run with an IndexError ('list index out of range'), a ZeroDivisionError or 'index can't
    contain negative values', or answered: a stride of -1 gave an empty output, a dilation of 0
    or auto_pad 'SAME' ran, and a 3-value kernel_shape pooled a 4-D input over its last two axes.
    check_model (and so prepare and `qlinear inspect`) now names the attribute and the rule."""
    attrs, message = WINDOW_CASES[case]
    if op == "Conv" and case in ("pads >= kernel", "no kernel"):
        pytest.skip("pools only: a Conv takes its kernel from W, and pads >= kernel is valid for it")
    if op != "MaxPool" and case == "dilation 0" and op != "Conv":
        pytest.skip(f"{op}-17 has no dilations attribute (refused as unknown)")
    model = _window_model(op, attrs, dtype=dtype)
    problems = qb.check_model(model)
    assert len(problems) == 1, problems
    with pytest.raises(ValueError, match=message):
        qb.prepare(model)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("dtype", [F, np.uint8])
def test_kernel_rank_against_an_undeclared_input_shape_at_run_time(op, dtype):
    """regression: Where x's shape is not declared, a kernel_shape of another rank is found when the node
    runs: MaxPool with [2, 2, 2] on a 4-D input pooled its last two axes and answered (1, 2, 5, 5);
    AveragePool with [2] failed with an IndexError."""
    if op == "AveragePool" and dtype is not F:
        pytest.skip("AveragePool is float only")
    t = T.FLOAT if dtype is F else T.UINT8
    for kernel, n in (([2, 2, 2], 3), ([2], 1)):
        model = _window_model(op, {"kernel_shape": kernel}, shape=None, dtype=t)
        assert not qb.check_model(model)
        with pytest.raises(ValueError, match=rf"kernel_shape \[{', '.join(map(str, kernel))}\] has {n} values; "
                                             r"x \(1, 2, 6, 6\) has 2 spatial axes"):
            qb.prepare(model).run([np.ones((1, 2, 6, 6), dtype)])


@pytest.mark.parametrize("op,dtype", [("MaxPool", F), ("MaxPool", np.uint8), ("MaxPool", np.int8),
                                      ("AveragePool", F), ("Conv", F)])
def test_a_window_larger_than_the_padded_input_is_refused(op, dtype):
    """regression: A 9x9 window on a 6x6 input: onnxruntime refuses it ('Calculated output dimension is
    negative'); the pools answered an empty (1, 2, 0, 0) tensor."""
    t = {F: T.FLOAT, np.uint8: T.UINT8, np.int8: T.INT8}[dtype]
    model = _window_model(op, {"kernel_shape": [9, 9]} if op != "Conv" else {}, shape=None, dtype=t,
                          w_shape=(3, 2, 9, 9))
    with pytest.raises(ValueError, match=r"x's size 6 on spatial axis 0, padded to 6, is smaller than the "
                                         r"window's extent 9 \(kernel_shape 9, dilation 1\): no output window"):
        qb.prepare(model).run([np.ones((1, 2, 6, 6), dtype)])
    # an empty input still gives an empty output, as before
    if op != "Conv":
        got = qb.prepare(_window_model(op, {"kernel_shape": [2, 2]}, shape=None, dtype=t)).run(
            [np.ones((1, 2, 0, 0), dtype)])
        assert got[0].shape == (1, 2, 0, 0)


def test_run_names_an_input_given_as_none():
    """regression: rep.run([None]) failed inside the first node that read the input ('node ... : got a
    Python NoneType'), naming the node; run now names the input, in both forms."""
    rep = qb.prepare(_relu_model())
    for feeds in ([None], {"x": None}):
        with pytest.raises(TypeError, match=r"run: input 'x' is None; the model declares a tensor"):
            rep.run(feeds)
