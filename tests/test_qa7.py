"""New-user QA, round 7: one test per bug found (see the commit that fixes each)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import qlinear.backend as qb
import qlinear.contrib as c

F = np.float32
BIG = F(3e38)

# ----------------------------------------------------------------------------- float ops near FLT_MAX


def _float_model(op, names, attrs=None, domain="", opset=17, outputs=("y",), inits=()):
    ins = [h.make_tensor_value_info(n, T.FLOAT, None) for n in names]
    node = h.make_node(op, list(names) + [i.name for i in inits], list(outputs), domain=domain, **(attrs or {}))
    g = h.make_graph([node], "g", ins, [h.make_tensor_value_info(o, T.FLOAT, None) for o in outputs],
                     initializer=list(inits))
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid(domain, 1)] if domain else [])
    return h.make_model(g, opset_imports=ops, ir_version=8)


_X = np.array([[-BIG, -1e30, -100, -90, 0, 1, 1e30, BIG, np.inf, -np.inf, np.nan, 1e-45]], F)
_XP = np.full((1, 1, 4, 4), BIG, F)
_XG = np.array([[-BIG, -1e20, -10, 0, 1], [1e20, BIG, np.inf, -np.inf, np.nan]], F)
_XL = np.array([[[BIG, BIG, -BIG, 1], [1e20, -1e20, 3, 1]]], F)
_ONES4, _ZEROS4 = np.ones(4, F), np.zeros(4, F)

FLOAT_CASES = {
    "Sigmoid": (_float_model("Sigmoid", "x"), {"x": _X}),
    "Softmax": (_float_model("Softmax", "x"), {"x": np.array([[BIG, BIG, 0, -BIG]], F)}),
    "Softmax-12": (_float_model("Softmax", "x"), {"x": np.array([[BIG, -BIG] + [0] * 10], F)}),
    "Softmax-opset11": (_float_model("Softmax", "x", opset=11), {"x": np.array([[BIG, -BIG, 0]], F)}),
    "LeakyRelu-10": (_float_model("LeakyRelu", "x", {"alpha": 10.0}), {"x": _X}),
    "LeakyRelu-0.1": (_float_model("LeakyRelu", "x", {"alpha": 0.1}), {"x": _X}),
    "LeakyRelu--2": (_float_model("LeakyRelu", "x", {"alpha": -2.0}), {"x": _X}),
    "AveragePool": (_float_model("AveragePool", "x", {"kernel_shape": [2, 2]}), {"x": _XP}),
    "AveragePool-pads": (_float_model("AveragePool", "x", {"kernel_shape": [3, 3], "pads": [1] * 4}), {"x": _XP}),
    "AveragePool-cip": (_float_model("AveragePool", "x", {"kernel_shape": [3, 3], "pads": [1] * 4,
                                                          "count_include_pad": 1}), {"x": _XP}),
    "GlobalAveragePool": (_float_model("GlobalAveragePool", "x"), {"x": _XP}),
    "Gelu-ms": (_float_model("Gelu", "x", domain="com.microsoft"), {"x": _XG}),
    "FastGelu": (_float_model("FastGelu", "x", domain="com.microsoft"), {"x": _XG}),
    "FastGelu-bias": (_float_model("FastGelu", "xb", domain="com.microsoft"),
                      {"x": _XG, "b": np.full(5, BIG, F)}),
    "SkipLayerNormalization": (_float_model("SkipLayerNormalization", "xsgb", domain="com.microsoft",
                                            outputs=("y", "mean", "inv_std", "sum")),
                               {"x": _XL[:, :1], "s": _XL[:, :1], "g": _ONES4, "b": _ZEROS4}),
    "LayerNormalization": (_float_model("LayerNormalization", "xgb"), {"x": _XL[:, :1], "g": _ONES4, "b": _ZEROS4}),
    "Gelu-20": (_float_model("Gelu", "x", opset=20), {"x": _XG}),
    "Gelu-20-tanh": (_float_model("Gelu", "x", {"approximate": "tanh"}, opset=20), {"x": _XG}),
}


@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_float_ops_near_float32_max_match_onnxruntime_without_floating_point_errors(case):
    """Inputs at ±3e38, ±inf and NaN: the backend gives onnxruntime's values (inf and NaN where
    it gives them) under np.errstate(all="raise") and with warnings as errors. Intermediates
    such as x - max(x) in Softmax, the window sums of AveragePool, alpha · x of LeakyRelu or
    x³ of FastGelu overflowed and raised FloatingPointError (or warned)."""
    ort = pytest.importorskip("onnxruntime")
    model, feeds = FLOAT_CASES[case]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    rep = qb.prepare(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            got = rep.run(feeds)
            got_all = rep.run_all(feeds)
    for g, w, name in zip(got, want, [o.name for o in model.graph.output]):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{case} {name}")
        np.testing.assert_array_equal(got_all[name], g)
    if case == "SkipLayerNormalization":  # the float32 sum overflows: NaN, as onnxruntime
        assert np.isnan(got[0][0, 0]).all() and np.isinf(got[3][0, 0, :3]).all()


def test_contrib_float_functions_under_errstate_raise():
    """The public com.microsoft float functions return IEEE results (inf, NaN) without
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


# ----------------------------------------------------------------------------- opset-10 Q/DQ per-axis


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
    """Opset 10's QuantizeLinear/DequantizeLinear take a scalar scale and zero point: inspect
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
    """A 1-element 1-D scale and zero point are scalars for opset 10 (onnxruntime agrees)."""
    model = _qdq10(op, (1,), (1,))
    assert qb.check_model(model) == []
    x = np.ones((1, 3, 2), F if op == "QuantizeLinear" else np.uint8)
    y = qb.prepare(model).run({"x": x})[0]
    assert y.shape == (1, 3, 2)


# ----------------------------------------------------------------------------- missing external data


def _external_model(folder, location="weights/w.bin"):
    w = nh.from_array(np.arange(16, dtype=F).reshape(4, 4), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(m, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


@pytest.mark.parametrize("missing", ["folder", "file"])
def test_missing_external_data_names_the_expected_path(capsys, tmp_path, monkeypatch, missing):
    """A model whose external data folder (or file) is missing: the CLI said only "external
    data file 'weights/w.bin' not found" and prepare(path) passed on onnx's ValidationError;
    both now name the absolute path the model expects, the model's folder it is read from
    (whatever the current directory) and what to do."""
    import shutil

    from qlinear.cli import main

    _external_model(tmp_path / "m")
    if missing == "folder":
        shutil.rmtree(tmp_path / "m" / "weights")
    else:
        (tmp_path / "m" / "weights" / "w.bin").unlink()
    want = str(tmp_path / "m" / "weights" / "w.bin")
    monkeypatch.chdir(tmp_path)  # a relative path from elsewhere: the data is still the model folder's
    for cmd in ("run", "inspect", "compare"):
        assert main([cmd, "m/model.onnx"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("qlinear: error: "), err
        assert "tensor 'w'" in err and "'weights/w.bin'" in err and want in err, err
        assert str(tmp_path / "m") in err and "model's folder" in err, err
        if missing == "folder":
            assert f"folder {tmp_path / 'm' / 'weights'} does not exist" in err, err
    with pytest.raises(ValueError) as e:
        qb.prepare("m/model.onnx")
    msg = str(e.value)
    assert msg.startswith("prepare: ") and "tensor 'w'" in msg and want in msg, msg


def test_external_data_read_relative_to_the_model_from_any_directory(tmp_path, monkeypatch):
    path = _external_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    x = np.ones((1, 4), F)
    want = x @ np.arange(16, dtype=F).reshape(4, 4)
    np.testing.assert_array_equal(qb.prepare("m/model.onnx").run({"x": x})[0], want)
    np.testing.assert_array_equal(qb.prepare(path).run({"x": x})[0], want)


# ----------------------------------------------------------------------------- QuantizeLinear of int32


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
    """QuantizeLinear-10 to -18 quantize an int32 x with a float32 scale (T1 is float or
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
    """From opset 19, x and y_scale share the type T1: an int32 x with a float32 scale is
    outside the schema (onnxruntime refuses the model)."""
    problems = qb.check_model(_quantize_int32_model(19))
    assert len(problems) == 1
    assert "int32" in problems[0].reason and "y_scale" in problems[0].reason and "19" in problems[0].reason


# ----------------------------------------------------------------------------- float16 Sigmoid


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_small_values_in_every_float_type(dtype):
    """Sigmoid of x in [-17.3, -11.1] was 0 in float16 (exp(-x) overflowed float16's 65504
    below the float32 cutoff of -80 where exp(x) takes over), where onnx.reference and
    onnxruntime give 6e-6 ... 6e-8."""
    from onnx.reference import ReferenceEvaluator

    tt = h.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = h.make_graph([h.make_node("Sigmoid", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", tt, None)],
                     [h.make_tensor_value_info("y", tt, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    x = np.concatenate([np.linspace(-30, 30, 601), [-80, -90, -103, -750, np.inf, -np.inf, np.nan]]).astype(dtype)
    got = qb.prepare(m).run({"x": x})[0]
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert got.dtype == dtype
    tiny = float(np.finfo(dtype).smallest_subnormal)
    np.testing.assert_allclose(got, want, rtol=2 * float(np.finfo(dtype).eps), atol=2 * tiny, equal_nan=True)
    assert ((got == 0) == (want == 0)).all()


@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
                                   {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}])
def test_float16_average_pool_sums_without_overflow(attrs):
    """float16 AveragePool summed its window in float16: nine taps of 40000 gave inf where
    onnx.reference and onnxruntime give 40000 (GlobalAveragePool already summed in float32)."""
    from onnx.reference import ReferenceEvaluator

    g = h.make_graph([h.make_node("AveragePool", ["x"], ["y"], **attrs)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT16, None)], [h.make_tensor_value_info("y", T.FLOAT16, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    rng = np.random.default_rng(7)
    for x in (np.full((1, 2, 5, 5), 40000, np.float16),
              (rng.standard_normal((2, 3, 7, 6)) * 3e4).clip(-65504, 65504).astype(np.float16)):
        got = qb.prepare(m).run({"x": x})[0]
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        assert got.dtype == np.float16 and np.isfinite(got).all()
        np.testing.assert_allclose(got.astype(F), want.astype(F), rtol=1e-3)


# ----------------------------------------------------------------------------- contrib under errstate


def test_contrib_quantized_functions_with_extreme_scales_under_errstate_raise():
    """qlinear.contrib's quantized functions with scales whose products or quotients
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
