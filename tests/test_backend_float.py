"""The vectorized float operators of qlinear.backend_float against onnxruntime and onnx.reference.

Every case is one node, run three ways: qlinear's backend, onnxruntime's CPU session and
onnx.reference's ReferenceEvaluator (its own implementation, not qlinear's). Selections
and data movement (nearest Resize, global max, Relu) must be identical; float arithmetic
within float32 rounding of sums of the sizes involved.
"""

from __future__ import annotations


import numpy as np
import pytest

from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import qlinear.backend as backend
from qlinear.graph.kernels import float as bf

ort = pytest.importorskip("onnxruntime")


def _model(op, inputs, attrs, opset, consts=None, n_out=1):
    """A one-node model: ``inputs`` are graph inputs, ``consts`` initializers."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    g = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if v is not None])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _run_all(model, feeds):
    q = backend.prepare(model).run(feeds)[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o = ort.InferenceSession(model.SerializeToString(), so,
                             providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    try:
        # onnx.reference's Sigmoid computes exp(x) of large |x| (overflow warnings, right
        # results: the branch np.where drops divides inf by inf); qlinear's own call above runs
        # with warnings enabled
        with np.errstate(over="ignore", invalid="ignore"):
            r = ReferenceEvaluator(model).run(None, feeds)[0]
    except (ValueError, AssertionError):
        # onnx.reference cannot run some valid cases (AveragePool with auto_pad SAME and a
        # stride larger than the kernel: negative pads); onnxruntime still checks them
        r = None
    return q, o, r


def _close(q, ref, scale, what, rtol=2e-6):
    assert q.shape == ref.shape, (what, q.shape, ref.shape)
    assert q.dtype == ref.dtype, (what, q.dtype, ref.dtype)
    np.testing.assert_allclose(q, ref, rtol=rtol, atol=rtol * scale, err_msg=what)


# --------------------------------------------------------------------------- Conv


def _conv_cases():
    rng = np.random.default_rng(10)
    cases = []
    for rank in (1, 2, 3):
        for kind in ("dense", "group", "depthwise", "multiplier", "pointwise"):
            for _ in range(5 if rank == 2 else 2):
                n = int(rng.integers(1, 3))
                g = {"dense": 1, "pointwise": int(rng.choice([1, 2])), "group": int(rng.choice([2, 3])),
                     "depthwise": int(rng.integers(2, 6)), "multiplier": int(rng.integers(2, 4))}[kind]
                cg = 1 if kind in ("depthwise", "multiplier") else int(rng.integers(1, 5))
                mg = int(rng.integers(2, 4)) if kind == "multiplier" else (
                    1 if kind == "depthwise" else int(rng.integers(1, 4)))
                k = [1] * rank if kind == "pointwise" else [int(v) for v in rng.integers(1, 4, rank)]
                spatial = [int(v) for v in rng.integers(4, 9 if rank < 3 else 6, rank)]
                attrs = {"group": g}
                auto = rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
                if rng.random() < 0.7 and kind != "pointwise":
                    attrs["strides"] = [int(v) for v in rng.integers(1, 3, rank)]
                if rng.random() < 0.4 and auto == "NOTSET" and kind != "pointwise":
                    attrs["dilations"] = [int(v) for v in rng.integers(1, 3, rank)]
                if auto == "NOTSET":
                    if kind != "pointwise" or rng.random() < 0.5:
                        attrs["pads"] = [int(v) for v in rng.integers(0, 3, 2 * rank)]
                else:
                    attrs["auto_pad"] = str(auto)
                if rng.random() < 0.5:
                    attrs["kernel_shape"] = k
                x = rng.standard_normal((n, cg * g, *spatial)).astype(np.float32)
                w = rng.standard_normal((mg * g, cg, *k)).astype(np.float32)
                b = rng.standard_normal(mg * g).astype(np.float32) if rng.random() < 0.6 else None
                cases.append((x, w, b, attrs))
    return cases


@pytest.mark.parametrize("case", range(len(_conv_cases())))
def test_conv_matches_onnxruntime_and_reference(case):
    x, w, b, attrs = _conv_cases()[case]
    model = _model("Conv", {"x": x}, attrs, 13, {"w": w, **({"b": b} if b is not None else {})})
    q, o, r = _run_all(model, {"x": x})
    # each output sums C/group * prod(kernel) products of N(0,1) values
    scale = float(np.sqrt(w[0].size)) + 1
    _close(q, o, scale, f"onnxruntime {attrs}")
    _close(q, r, scale, f"onnx.reference {attrs}")


def test_conv_batch_and_float64_and_float16():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 9, 7))
    w = rng.standard_normal((6, 2, 3, 2))
    attrs = dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])
    y = bf.conv(x, w, None, **attrs)
    ref = ReferenceEvaluator(_model("Conv", {"x": x}, attrs, 13, {"w": w})).run(None, {"x": x})[0]
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    y16 = bf.conv(x.astype(np.float16), w.astype(np.float16), None, **attrs)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float64), ref, rtol=1e-2, atol=5e-2)


def test_conv_bad_shapes_raise():
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ValueError, match="group"):
        bf.conv(x, np.zeros((3, 4, 3, 3), np.float32), group=2)
    with pytest.raises(ValueError, match="kernel_shape"):
        bf.conv(x, np.zeros((2, 4, 3, 3), np.float32), kernel_shape=[2, 2])


# --------------------------------------------------------------------------- pools


def _pool_cases():
    rng = np.random.default_rng(20)
    cases = []
    for rank in (1, 2, 3):
        for _ in range(14 if rank == 2 else 6):
            k = [int(v) for v in rng.integers(1, 4, rank)]
            spatial = [int(rng.integers(k[i] + 1, 10 if rank < 3 else 7)) for i in range(rank)]
            attrs = {"kernel_shape": k}
            auto = rng.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
            if rng.random() < 0.7:
                attrs["strides"] = [int(v) for v in rng.integers(1, 4, rank)]
            if auto == "NOTSET":
                if rng.random() < 0.7:
                    # ONNX: pads smaller than the kernel
                    attrs["pads"] = [int(rng.integers(0, k[i % rank])) for i in range(2 * rank)]
                if rng.random() < 0.4:
                    attrs["dilations"] = [int(v) for v in rng.integers(1, 3, rank)]
            else:
                attrs["auto_pad"] = str(auto)
            # onnx.reference refuses ceil_mode with auto_pad (onnxruntime ignores it)
            attrs["ceil_mode"] = int(rng.integers(0, 2)) if auto == "NOTSET" else 0
            attrs["count_include_pad"] = int(rng.integers(0, 2))
            x = rng.standard_normal((int(rng.integers(1, 3)), 3, *spatial)).astype(np.float32)
            cases.append((x, attrs))
    return cases


@pytest.mark.parametrize("case", range(len(_pool_cases())))
def test_average_pool_matches_onnxruntime_and_reference(case):
    x, attrs = _pool_cases()[case]
    model = _model("AveragePool", {"x": x}, attrs, 19)
    q, o, r = _run_all(model, {"x": x})
    _close(q, o, 1.0, f"onnxruntime {attrs}")
    if r is not None or attrs.get("auto_pad", "NOTSET") == "NOTSET":
        _close(q, r, 1.0, f"onnx.reference {attrs}")


def test_average_pool_divisors_exactly():
    """Ones in, so every output is (taps summed) / divisor: pins the divisor exactly."""
    x = np.ones((1, 1, 5, 5), np.float32)
    kw = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert np.array_equal(bf.average_pool(x, **kw, count_include_pad=0), np.ones((1, 1, 3, 3)))
    inc = bf.average_pool(x, **kw, count_include_pad=1)
    assert inc[0, 0, 0, 0] == np.float32(4 / 9) and inc[0, 0, 1, 1] == 1
    # ceil_mode: the last window reaches past the end padding; those taps never count
    y = bf.average_pool(np.ones((1, 1, 6), np.float32), kernel_shape=[3], strides=[2],
                        pads=[1, 1], ceil_mode=1, count_include_pad=1)
    assert y.shape == (1, 1, 4)
    # (last window: input position 5, end pad 6, beyond 7: two counted taps)
    assert np.array_equal(y[0, 0], np.float32([2 / 3, 1, 1, 1 / 2]))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 8, 7, 7), (2, 3, 5), (1, 4, 3, 4, 5), (1, 1000, 1, 1)])
def test_global_pools(op, shape):
    x = np.random.default_rng(21).standard_normal(shape).astype(np.float32)
    q, o, r = _run_all(_model(op, {"x": x}, {}, 13), {"x": x})
    if op == "GlobalMaxPool":
        assert np.array_equal(q, o)
        if len(shape) == 4:  # onnx.reference reduces the wrong axes at other ranks
            assert np.array_equal(q, r)
    else:
        _close(q, o, 1.0, op)
        _close(q, r, 1.0, op)


# --------------------------------------------------------------------------- activations


@pytest.mark.parametrize("shape", [(1, 16, 9, 9), (3, 1000), (7,)])
def test_sigmoid(shape):
    rng = np.random.default_rng(30)
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x.reshape(-1)[:4] = [-100.0, 100.0, 0.0, -87.0]
    q, o, r = _run_all(_model("Sigmoid", {"x": x}, {}, 13), {"x": x})
    # onnxruntime's logistic is a polynomial approximation: a few float32 ulps of 1
    np.testing.assert_allclose(q, o, rtol=0, atol=5e-7)
    np.testing.assert_allclose(q, r, rtol=1e-6, atol=0)
    assert not np.isnan(q).any()


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape,axis", [((2, 3, 4, 5), None), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), -1),
                                        ((1, 16800, 2), -1), ((1, 16800, 2), 2), ((5, 7), 0),
                                        ((3, 6, 4), -2), ((1, 300, 9), -1)])
def test_softmax_both_axis_semantics(opset, shape, axis):
    x = (np.random.default_rng(31).standard_normal(shape) * 4).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    model = _model("Softmax", {"x": x}, attrs, opset)
    q, o, r = _run_all(model, {"x": x})
    _close(q, o, 1.0, f"onnxruntime opset {opset} axis {axis}", rtol=2e-6)
    if opset >= 13 or axis in (-1, len(shape) - 1):
        # onnx.reference applies the opset-13 (one axis) semantics at every opset
        _close(q, r, 1.0, f"onnx.reference axis {axis}", rtol=2e-6)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.2, 1.0, 1.5, 0.0, -0.3])
def test_leaky_relu_and_relu_exact(alpha):
    x = np.random.default_rng(32).standard_normal((2, 8, 11, 11)).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -0.0, 1e-30]
    q, o, _ = _run_all(_model("LeakyRelu", {"x": x}, {"alpha": alpha}, 13), {"x": x})
    assert np.array_equal(q, o)
    q, o, r = _run_all(_model("Relu", {"x": x}, {}, 14), {"x": x})
    assert np.array_equal(q, o) and np.array_equal(q, r)
    xi = np.arange(-5, 5, dtype=np.int8)
    q, o, r = _run_all(_model("Relu", {"x": xi}, {}, 14), {"x": xi})
    assert q.dtype == np.int8 and np.array_equal(q, o) and np.array_equal(q, r)


# --------------------------------------------------------------------------- Resize


_COORD = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]
_NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _resize_targets():
    # (input shape, scales or None, sizes or None)
    return [((1, 3, 5, 7), [1, 1, 2, 2], None), ((1, 2, 6, 6), [1, 1, 0.5, 0.5], None),
            ((1, 2, 5, 4), [1, 1, 3, 1.5], None), ((2, 3, 7, 9), [1, 1, 0.6, 1.7], None),
            ((1, 3, 5, 7), None, [1, 3, 11, 3]), ((1, 2, 13, 10), None, [1, 2, 4, 21]),
            ((1, 2, 9), [1, 1, 2.5], None), ((1, 2, 3, 4, 5), None, [1, 2, 5, 2, 8]),
            ((1, 1, 1, 4), None, [1, 1, 3, 1])]


def _ties(shape, scales, sizes, coord, nearest):
    """Per axis, the output indices whose source coordinate is within float32 rounding of a
    rounding boundary of ``nearest`` (a half-integer for the round modes, an integer for
    floor/ceil): the exact coordinate or onnxruntime's float32 one lies on the boundary, or
    the two lie on different sides. There onnxruntime may pick the other neighbour."""
    from fractions import Fraction as F

    ties = []
    for i, n_in in enumerate(shape):
        if sizes:
            n_out, s = sizes[i], F(sizes[i], n_in)
        else:
            s = F(float(np.float32(scales[i])))
            n_out = int(np.float32(scales[i]) * np.float32(n_in))
        if s == 1 and n_out == n_in:
            ties.append(set())
            continue
        axis = set()
        for y in range(n_out):
            if coord == "asymmetric":
                xo = y / s
            elif coord == "align_corners":
                xo = F(y * (n_in - 1), n_out - 1) if n_out > 1 else F(0)
            elif coord == "pytorch_half_pixel" and n_out == 1:
                xo = F(0)
            else:
                xo = (y + F(1, 2)) / s - F(1, 2)
            # the float32 formula onnxruntime's source shows
            f = np.float32
            s32 = f(n_out) / f(n_in) if sizes else f(scales[i])
            if coord == "asymmetric":
                x32 = f(y) / s32
            elif coord == "align_corners":
                x32 = f(y) * f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
            elif coord == "pytorch_half_pixel" and n_out == 1:
                x32 = f(0)
            else:
                x32 = (f(y) + f(0.5)) / s32 - f(0.5)
            boundary = F(1, 2) if nearest.startswith("round") else F(0)
            lo32, lo = np.floor(float(x32)), xo.numerator // xo.denominator
            frac32, frac = F(float(x32)) - int(lo32), xo - lo
            # near a boundary: the exact value is on it, or the float32 value is, or they
            # sit on different sides of it
            if F(float(x32)) != xo and (frac == boundary or frac32 == boundary or int(lo32) != lo
                                        or (frac32 < boundary) != (frac < boundary)):
                axis.add(y)
        ties.append(axis)
    return ties


@pytest.mark.parametrize("target", range(len(_resize_targets())))
@pytest.mark.parametrize("coord", _COORD)
def test_resize_nearest_exact(target, coord):
    shape, scales, sizes = _resize_targets()[target]
    x = np.random.default_rng(40).standard_normal(shape).astype(np.float32)
    for nearest in _NEAREST:
        consts = {"roi": np.zeros(0, np.float32),
                  "scales": np.float32(scales) if scales else np.zeros(0, np.float32)}
        if sizes:
            consts["sizes"] = np.int64(sizes)
        attrs = dict(mode="nearest", coordinate_transformation_mode=coord, nearest_mode=nearest)
        q, o, r = _run_all(_model("Resize", {"x": x}, attrs, 13, consts), {"x": x})
        what = f"{shape} {scales} {sizes} {coord} {nearest}"
        if coord != "align_corners" or sizes or all(
                float(np.float32(s)) * n == int(float(np.float32(s)) * n)
                for s, n in zip(scales, shape)):
            # (onnx.reference's align_corners divides by scale * n_in - 1, not n_out - 1)
            assert np.array_equal(q, r), "onnx.reference " + what
        # onnxruntime: identical away from exact ties of the source coordinate
        assert q.shape == o.shape, what
        away = np.ones(q.shape, bool)
        for axis, tie in enumerate(_ties(shape, scales, sizes, coord, nearest)):
            sl = [slice(None)] * q.ndim
            sl[axis] = sorted(tie)
            away[tuple(sl)] = False
        assert away.mean() > 0.5, what
        assert np.array_equal(q[away], o[away]), "onnxruntime " + what


@pytest.mark.parametrize("target", range(len(_resize_targets())))
@pytest.mark.parametrize("coord", _COORD)
def test_resize_linear(target, coord):
    shape, scales, sizes = _resize_targets()[target]
    x = np.random.default_rng(41).standard_normal(shape).astype(np.float32)
    consts = {"roi": np.zeros(0, np.float32),
              "scales": np.float32(scales) if scales else np.zeros(0, np.float32)}
    if sizes:
        consts["sizes"] = np.int64(sizes)
    attrs = dict(mode="linear", coordinate_transformation_mode=coord)
    model = _model("Resize", {"x": x}, attrs, 13, consts)
    q, o, r = _run_all(model, {"x": x})
    what = f"{shape} {scales} {sizes} {coord}"
    if coord != "align_corners" or sizes or all(
            float(np.float32(s)) * n == int(float(np.float32(s)) * n)
            for s, n in zip(scales, shape)):
        _close(q, r, 1.0, "onnx.reference " + what, rtol=2e-6)
    if len(shape) == 4 or (len(shape) == 3 and coord != "pytorch_half_pixel"):
        _close(q, o, 1.0, "onnxruntime " + what, rtol=2e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_half_pixel_symmetric_opset19(mode):
    x = np.random.default_rng(42).standard_normal((1, 2, 5, 7)).astype(np.float32)
    for sizes in ([1, 2, 8, 4], [1, 2, 3, 13]):
        consts = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                  "sizes": np.int64(sizes)}
        attrs = dict(mode=mode, coordinate_transformation_mode="half_pixel_symmetric")
        q, o, r = _run_all(_model("Resize", {"x": x}, attrs, 19, consts), {"x": x})
        if mode == "nearest":
            assert np.array_equal(q, o) and np.array_equal(q, r)
        else:
            _close(q, o, 1.0, str(sizes))
            _close(q, r, 1.0, str(sizes))


def test_resize_nearest_uint8_and_delegated_modes():
    rng = np.random.default_rng(43)
    x = rng.integers(0, 256, (1, 3, 4, 5)).astype(np.uint8)
    consts = {"roi": np.zeros(0, np.float32), "scales": np.float32([1, 1, 2, 3])}
    q, o, r = _run_all(_model("Resize", {"x": x}, {"mode": "nearest"}, 13, consts), {"x": x})
    assert q.dtype == np.uint8 and np.array_equal(q, o) and np.array_equal(q, r)
    # cubic is not implemented here: the node runs as onnx.reference runs it
    xf = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    model = _model("Resize", {"x": xf}, {"mode": "cubic"}, 13, consts)
    assert np.array_equal(backend.prepare(model).run({"x": xf})[0],
                          ReferenceEvaluator(model).run(None, {"x": xf})[0])


def test_resize_bad_scales_raise():
    with pytest.raises(ValueError, match="scales"):
        bf.resize(np.zeros((1, 1, 2, 2), np.float32), scales=np.float32([1, 1, 2]))
    with pytest.raises(ValueError, match="positive"):
        bf.resize(np.zeros((1, 1, 2, 2), np.float32), scales=np.float32([1, 1, 0, 2]))


# --------------------------------------------------------------------------- graph loop


def _chain_model():
    """Constant -> Mul, Conv -> Sigmoid -> AveragePool, an If whose branch reads an outer tensor."""
    rng = np.random.default_rng(50)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    then_g = helper.make_graph([helper.make_node("Identity", ["s"], ["branch"])], "then", [],
                               [helper.make_empty_tensor_value_info("branch")])
    else_g = helper.make_graph([helper.make_node("Neg", ["s"], ["branch"])], "else", [],
                               [helper.make_empty_tensor_value_info("branch")])
    nodes = [helper.make_node("Constant", [], ["c2"], value=two),
             helper.make_node("Mul", ["x", "c2"], ["x2"]),
             helper.make_node("Conv", ["x2", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "c2"], ["cond"]),
             helper.make_node("If", ["cond"], ["b"], then_branch=then_g, else_branch=else_g),
             helper.make_node("AveragePool", ["b"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_fast_evaluator_same_results_and_intermediates():
    model = _chain_model()
    rep = backend.prepare(model)
    ref = ReferenceEvaluator(model)
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((1, 3, 8, 8)) * (1 + 2 * seed)).astype(
            np.float32)
        y = rep.run({"x": x})[0]
        with np.errstate(over="ignore", invalid="ignore"):  # onnx.reference's Sigmoid
            want = ref.run(None, {"x": x})[0]
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)
        everything = rep.run_all({"x": x})
        assert {"x", "w", "c2", "x2", "c", "s", "b", "y"} <= set(everything)
        assert everything["c2"] == np.float32(2)


def test_fast_evaluator_releases_intermediates_without_subgraphs():
    model = _model("Sigmoid", {"x": np.zeros((2, 2), np.float32)}, {}, 13)
    model.graph.node.append(helper.make_node("Relu", ["y0"], ["z"]))
    model.graph.output[0].name = "z"
    rep = backend.prepare(model)
    plan = rep.evaluator._fast_plan
    assert plan[1][5] == ["y0"]  # Relu is y0's last consumer: released after it
    assert np.array_equal(rep.run({"x": np.zeros((2, 2), np.float32)})[0],
                          np.full((2, 2), 0.5, np.float32))


def test_fast_evaluator_dispatch_paths_match_reference_exactly():
    """Binary ufuncs, direct ``_run`` calls (Concat, Cast, Transpose, Slice, Size), Div's
    own ``_run``, Constant and a scalar-returning operator: the same arrays as onnx.reference."""
    c = helper.make_tensor("c", TensorProto.INT64, [2], [3, -1])
    nodes = [helper.make_node("Constant", [], ["shape"], value=c),
             helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Sub", ["s", "b"], ["d"]),
             helper.make_node("Div", ["ai", "bi"], ["q"]),
             helper.make_node("Mul", ["ai", "bi"], ["p"]),
             helper.make_node("Reshape", ["d", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["rt"], perm=[1, 0]),
             helper.make_node("Concat", ["rt", "rt"], ["cat"], axis=0),
             helper.make_node("Cast", ["cat"], ["ci"], to=TensorProto.INT32),
             helper.make_node("Size", ["ci"], ["n"]),
             helper.make_node("Slice", ["ci", "st", "en"], ["sl"])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes, "paths",
        [vi("a", TensorProto.FLOAT, [3, 4]), vi("b", TensorProto.FLOAT, [4]),
         vi("ai", TensorProto.INT32, [5]), vi("bi", TensorProto.INT32, [5])],
        [vi(n, TensorProto.UNDEFINED, None) for n in ("q", "p", "cat", "ci", "n", "sl")],
        [numpy_helper.from_array(np.int64([1, 0]), "st"), numpy_helper.from_array(np.int64([4, 2]), "en")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    rng = np.random.default_rng(60)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32) * 9,
             "b": rng.standard_normal(4).astype(np.float32),
             "ai": np.int32([7, -7, 9, -9, 0]), "bi": np.int32([2, 2, -4, -4, 3])}
    rep = backend.prepare(m)
    hows = {p[0].op_type: p[1] for p in rep.evaluator._fast_plan}
    assert hows["Add"] == "binary" and hows["Transpose"] == "direct" and hows["Constant"] == "const"
    ref = ReferenceEvaluator(m).run(None, feeds)
    for _ in range(2):
        got = rep.run(feeds)
        for gq, gr in zip(got, ref):
            assert gq.dtype == gr.dtype and gq.shape == gr.shape and np.array_equal(gq, gr)
    assert list(got[0]) == [3, -3, -2, 2, 0]  # Div truncates toward zero


def _guarded_paths_model():
    """Guarded operators of every fast kind: binaries of equal and of broadcast shapes,
    Expand and Tile (direct ``_run``), MatMul (direct) and a float Conv (its own ``run``)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["a", "a"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["p"]),
             helper.make_node("Expand", ["b", "shape"], ["e"]),
             helper.make_node("Sub", ["p", "e"], ["d"]),
             helper.make_node("Tile", ["d", "reps"], ["t"]),
             helper.make_node("MatMul", ["t", "m"], ["mm"]),
             helper.make_node("Reshape", ["mm", "shape4"], ["x4"]),
             helper.make_node("Conv", ["x4", "w"], ["y"])]
    g = helper.make_graph(
        nodes, "guarded", [vi("a", TensorProto.FLOAT, [3, 4]), vi("b", TensorProto.FLOAT, [4])],
        [vi("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.int64([3, 4]), "shape"),
         numpy_helper.from_array(np.int64([2, 1]), "reps"),
         numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "m"),
         numpy_helper.from_array(np.int64([1, 1, 6, 2]), "shape4"),
         numpy_helper.from_array(np.ones((2, 1, 2, 1), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_size_guard_keeps_the_fast_paths(monkeypatch):
    """With a size limit (``qlinear run``'s default 2 GiB) the guarded operators dispatch as
    without one (ufunc, ``_run``): the guard's size check runs, then the fast path, never the
    guard's ``run`` or OpRun's generic ``run`` (the 40+ us path). Results equal the unguarded
    ones, and a limit below a tensor still refuses on the fast path."""
    from onnx.reference.op_run import OpRun

    from qlinear.graph.kernels import sizeguard as _sizeguard

    model = _guarded_paths_model()
    rng = np.random.default_rng(70)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    plain = backend.QLinearRep(model)
    guarded = backend.QLinearRep(model, max_tensor_bytes=2 << 30)
    hows = lambda rep: [(p[0].op_type, p[1]) for p in rep.evaluator._fast_plan]  # noqa: E731
    assert hows(guarded) == hows(plain)
    assert dict(hows(guarded))["Add"] == "binary" and dict(hows(guarded))["Expand"] == "direct"
    # the fast kinds carry the check; MatMul (onnx.reference's own run) and FLOAT_KERNELS'
    # Conv (its own run) keep their guard's run; Reshape is not guarded
    assert [p[6] is not None for p in guarded.evaluator._fast_plan] == [True] * 5 + [False] * 3
    want = plain.run(feeds)[0]
    calls = {"guard.run": 0, "OpRun.run": 0, "check": 0}
    guard_run, oprun_run = _sizeguard._SizeGuard.run, OpRun.run
    check = _sizeguard._SizeGuard.check_size

    def count(key, fn):
        def wrapped(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(_sizeguard._SizeGuard, "run", count("guard.run", guard_run))
    monkeypatch.setattr(OpRun, "run", count("OpRun.run", oprun_run))
    monkeypatch.setattr(_sizeguard._SizeGuard, "check_size", count("check", check))
    guarded = backend.QLinearRep(model, max_tensor_bytes=2 << 30)
    got = guarded.run(feeds)[0]
    assert got.dtype == want.dtype and np.array_equal(got, want)
    # MatMul's and Conv's guards run through run() (which checks); Mul, Expand and Tile are
    # checked on the fast path; Add and Sub have inputs of equal shapes: no check needed
    assert calls == {"guard.run": 2, "OpRun.run": 0, "check": 5}, calls
    tight = backend.QLinearRep(model, max_tensor_bytes=47)  # Mul's (3, 4) float32 is 48 bytes
    with pytest.raises(backend.NodeError, match=r"Mul-13.*48 B.*47 B"):
        tight.run(feeds)


def test_fast_evaluator_binary_of_scalars_gives_arrays():
    """A ufunc of two 0-d arrays returns a NumPy scalar; the graph loop keeps ndarrays (a
    scalar intermediate was left out of compare's exposed outputs and sent the next binary
    down the slow path)."""
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Mul", ["a", "b"], ["c"]),
                           helper.make_node("Add", ["c", "b"], ["d"])], "scalars",
                          [vi("a", TensorProto.FLOAT, []), vi("b", TensorProto.FLOAT, [])],
                          [vi("d", TensorProto.FLOAT, [])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"a": np.array(2, np.float32), "b": np.array(3, np.float32)}
    values = backend.QLinearRep(m).run_all(feeds)
    for name in ("c", "d"):
        assert type(values[name]) is np.ndarray and values[name].dtype == np.float32
    assert values["c"].shape == () and values["d"] == np.float32(9)


def test_fast_evaluator_keeps_type_errors():
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "bad",
                          [vi("a", TensorProto.FLOAT, [2]), vi("b", TensorProto.DOUBLE, [2])],
                          [vi("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    rep = backend.QLinearRep(m)  # (prepare's type check would refuse it before running)
    with pytest.raises(Exception, match="type mismatch"):
        rep.run({"a": np.ones(2, np.float32), "b": np.ones(2, np.float64)})


@pytest.mark.parametrize("opset", [13, 14])
@pytest.mark.parametrize("shape,allowzero", [([3, -1], 0), ([0, 4, -1], 0), ([2, 0, 2], 0),
                                             ([0, 6, 2], 1), ([-1], 0), ([4, 0], 0)])
def test_reshape_exact(opset, shape, allowzero):
    x = np.arange(2 * 6 * 2, dtype=np.float32).reshape(2, 6, 2)
    if allowzero:
        if opset < 14:
            return
        x = np.zeros((0, 6, 2), np.float32)
    attrs = {"allowzero": allowzero} if opset >= 14 else {}
    model = _model("Reshape", {"x": x}, attrs, opset, {"s": np.int64(shape)})
    q, o, r = _run_all(model, {"x": x})
    assert q.shape == o.shape == r.shape and np.array_equal(q, o) and np.array_equal(q, r)


# ---------------------------------------------------------------- float products while running


@pytest.mark.parametrize("m,k,n", [(24, 96, 3136), (512, 64, 196), (3, 2000, 900), (7, 5, 3)])
def test_split_matmul_matches_numpy(m, k, n):
    """Inside a run, large float products are split into blocks over threads (qlinear._blas);
    every block is an ordinary SGEMM, so the product agrees with NumPy's to float rounding,
    and OpenBLAS's thread setting is restored afterwards."""
    from qlinear import _blas

    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    h = _blas._openblas()
    before = h[1]() if h else None
    with _blas.single_threaded():
        if h:
            assert h[1]() == 1
        got = _blas.matmul(a, b)
    if h:
        assert h[1]() == before
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_constant_subgraphs_fold_once_and_inputs_never_fold():
    """Nodes reading only constants (a DequantizeLinear of a weight, the Add after it) run on
    the first run only and their outputs are reused read-only; a graph input's initializer is
    only a default (a feed replaces it), so nothing reading it folds; random operators never
    fold."""
    from onnx import TensorProto, helper, numpy_helper

    import qlinear.backend as backend

    w = numpy_helper.from_array(np.array([1, 2, 3], np.uint8), "w")
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    d = numpy_helper.from_array(np.ones(3, np.float32), "d")  # also a graph input: a default
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
             helper.make_node("Add", ["wf", "wf"], ["w2"]),
             helper.make_node("Add", ["w2", "d"], ["wd"]),
             helper.make_node("RandomUniform", [], ["r"], shape=[3]),
             helper.make_node("Add", ["x", "wd"], ["y0"]),
             helper.make_node("Add", ["y0", "r"], ["y"])]
    g = helper.make_graph(nodes, "fold",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("d", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [w, s, d])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rep = backend.prepare(m, qdq="literal")  # as written (fusion would duplicate the DQ)
    folded = {rt.onnx_node.output[0] for rt, *rest in zip(rep.evaluator.rt_nodes_, rep.evaluator._fast_plan)
              if rest[0][-1]}
    assert folded == {"wf", "w2"}
    x = np.zeros(3, np.float32)
    y0, y = rep.run({"x": x})
    np.testing.assert_array_equal(y0, [2, 3, 4])
    y0b, yb = rep.run({"x": x, "d": np.full(3, 10, np.float32)})
    np.testing.assert_array_equal(y0b, [11, 12, 13])
    assert not np.array_equal(y - y0, yb - y0b)  # a new random draw each run
    cached = rep.run_all({"x": x})["wf"]
    assert not cached.flags.writeable


def test_an_omitted_output_is_not_a_later_omitted_input():
    """A node's omitted ("") output (SkipLayerNormalization's mean) does not become the value of
    a later node's omitted input (Clip's min): that Clip has no lower bound. (The graph loop
    stored the mean under "", and the Clip clamped to it from below.)"""
    from onnx import TensorProto, helper, numpy_helper

    import qlinear.backend as backend

    h = 4
    inits = [numpy_helper.from_array(np.ones(h, np.float32), "gamma"),
             numpy_helper.from_array(np.array(0.5, np.float32), "mx")]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y", ""], domain="com.microsoft"),
             helper.make_node("Clip", ["y", "", "mx"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "skip")],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    x = np.random.default_rng(0).standard_normal((1, 2, h)).astype(np.float32)
    rep = backend.prepare(m)
    for _ in range(2):
        every = rep.run_all({"x": x, "skip": x})
        (z,) = rep.run({"x": x, "skip": x})
        np.testing.assert_array_equal(z, np.minimum(every["y"], np.float32(0.5)))
        assert (z < 0).any()
        assert all(isinstance(k, str) for k in every) and every[""] is None


def test_constant_nodes_leave_the_loop_after_their_first_run():
    """Once every constant node (Constant, folded) has run, later runs put their tensors in at
    once and loop over the other nodes only: the same outputs (a folded tensor as a graph
    output included), a failing node after that still named, and intermediate=True still
    listing every tensor."""
    from onnx import TensorProto, helper, numpy_helper

    import qlinear.backend as backend

    w = numpy_helper.from_array(np.array([1, 2, 3], np.uint8), "w")
    nodes = [helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
             helper.make_node("Add", ["wf", "wf"], ["w2"]),
             helper.make_node("Neg", ["w2"], ["neg"]),
             helper.make_node("Neg", ["w2"], ["unused"]),
             helper.make_node("Add", ["x", "w2"], ["y0"]),
             helper.make_node("Reshape", ["y0", "shape"], ["y"], name="reshape_node")]
    g = helper.make_graph(nodes, "fold",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("neg", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rep = backend.prepare(m, qdq="literal")
    ev = rep.evaluator
    assert ev._fast_compact is None
    ran = []
    dq = ev._fast_plan[1][0]
    real = dq._run
    dq._run = lambda *a, **k: ran.append(1) or real(*a, **k)
    x, shape = np.arange(3, dtype=np.float32), np.array([3, 1], np.int64)
    first = rep.run({"x": x, "shape": shape})
    kept, kept_plan, const_results = ev._fast_compact
    assert [n.onnx_node.op_type for n in kept] == ["Add", "Reshape"]
    assert set(const_results) == {"w2", "neg"}  # read by the Add, a graph output; not 'unused'
    for _ in range(2):
        again = rep.run({"x": x, "shape": shape})
        assert [a.tobytes() for a in again] == [a.tobytes() for a in first]
        assert again[1] is first[1]  # the folded tensor, as made on the first run
    ev._fast_consts.clear()  # not read any more: the folded DequantizeLinear is not visited
    assert [a.tobytes() for a in rep.run({"x": x, "shape": shape})] == [a.tobytes() for a in first]
    assert len(ran) == 1
    np.testing.assert_array_equal(first[0], [[1], [3], [5]])
    with pytest.raises(backend.NodeError, match="reshape_node"):
        rep.run({"x": x, "shape": np.array([4], np.int64)})
    np.testing.assert_array_equal(first[1], [-1, -2, -3])
    assert set(rep.run_all({"x": x, "shape": shape})) >= {"s", "wf", "w2", "neg", "unused", "y0", "y"}


@pytest.mark.parametrize("g,m,k,n", [(8, 16, 72, 6400), (2, 3, 5, 7), (16, 8, 144, 1600)])
def test_split_batched_matmul_matches_numpy(g, m, k, n):
    """A grouped Conv's stacked products, split into blocks of whole groups over threads inside
    a run (qlinear._blas.batched_matmul): each group an ordinary SGEMM."""
    from qlinear import _blas

    rng = np.random.default_rng(g * m + k)
    a = rng.standard_normal((g, m, k)).astype(np.float32)
    b = rng.standard_normal((g, k, n)).astype(np.float32)
    with _blas.single_threaded():
        got = _blas.batched_matmul(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == (g, m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def _native_conv_cases():
    # (x shape, channels per group (0: depthwise), multiplier, kernel, strides, dilations, pads,
    # bias): depthwise cases take fconv.c's depthwise kernel, the others its im2col
    return [((1, 8, 13, 11), 0, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),
            ((2, 5, 17, 9), 0, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),
            ((1, 4, 10, 12), 0, 2, (3, 5), (2, 3), (1, 1), (0, 2, 1, 0), True),
            ((1, 3, 15, 16), 0, 1, (3, 3), (1, 2), (2, 2), (2, 2, 2, 2), True),
            ((1, 6, 9, 9), 0, 3, (2, 2), (3, 1), (2, 1), (0, 0, 0, 0), False),
            ((1, 2, 5, 5), 0, 1, (5, 5), (1, 1), (1, 1), (4, 4, 4, 4), True),
            ((1, 16, 1, 40), 0, 1, (1, 7), (1, 4), (1, 1), (0, 3, 0, 3), True),
            ((1, 3, 4, 4), 0, 1, (3, 3), (5, 5), (1, 1), (1, 1, 1, 1), True),
            ((1, 3, 33, 31), 3, 5, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True),
            ((2, 16, 12, 10), 16, 24, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False),
            ((1, 8, 11, 14), 4, 3, (3, 2), (1, 3), (2, 1), (2, 0, 1, 3), True),
            ((3, 6, 7, 7), 2, 2, (1, 1), (2, 1), (1, 1), (1, 0, 0, 1), True),
            ((1, 4, 3, 3), 4, 2, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), True),
            ((1, 2, 4, 6), 2, 3, (5, 5), (4, 4), (1, 1), (4, 4, 4, 4), False)]


@pytest.mark.parametrize("case", range(len(_native_conv_cases())))
def test_native_float_conv_bit_identical_to_numpy(case):
    """The compiled depthwise kernel (elementwise/fconv.c) gives the NumPy formulation's exact
    bits, signed zeros, infinities and NaNs included (the same float32 operations in the same
    order). The other cases run the compiled matrix product (fconv/fgemm.c), whose order is not
    BLAS's: within float32 rounding of the NumPy formulation here, bit for bit against the
    documented order in tests/test_float_conv.py."""
    from qlinear import _native

    if not _native.available():
        pytest.skip("the native engine is not built")
    shape, cg, mg, kernel, strides, dil, pads, bias = _native_conv_cases()[case]
    rng = np.random.default_rng(case)
    c = shape[1]
    group = c if cg == 0 else c // cg
    m = group * mg
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((m, cg or 1, *kernel)).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 6)] = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38]
    w.reshape(-1)[0] = -0.0  # a negative zero weight: padding taps give -0.0 products
    if case == 0:
        w.reshape(-1)[1] = np.inf  # inf * padding zero: NaN, as the padded NumPy copy gives
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    kw = dict(group=group, strides=list(strides), dilations=list(dil), pads=list(pads))
    with np.errstate(over="ignore", invalid="ignore"):  # inf * 0, 3e38 * w in the products
        got = bf.conv(x, w, b, **kw)
        with _native.use_engine("numpy"):
            want = bf.conv(x, w, b, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    if cg != 0:  # the matrix product: NaN and inf where the formulation has them, else close
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(w[0].size))
        return
    assert got.tobytes() == want.tobytes()
    with np.errstate(over="ignore", invalid="ignore"):  # 3e38 becomes inf in float16
        x16, w16 = x.astype(np.float16), w.astype(np.float16)
        b16 = None if b is None else b.astype(np.float16)
        got16 = bf.conv(x16, w16, b16, **kw)
        with _native.use_engine("numpy"):
            want16 = bf.conv(x16, w16, b16, **kw)
    assert got16.dtype == np.float16 and got16.tobytes() == want16.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1 << 14, (1 << 14) + 4095, 3 * 4096 * 7 + 1, 1000])
def test_relu_blocks_bit_identical_to_scalar_maximum(dtype, size):
    """relu's rows against a block of zeros give np.maximum(x, 0)'s exact bits: NaNs (sign and
    payload), signed zeros, infinities, subnormals, in the blocks and in the tail."""
    rng = np.random.default_rng(size)
    x = rng.standard_normal(size).astype(dtype)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    nan_payload = np.array([0x7FC00123 if dtype == np.float32 else 0x7FF8000000000123,
                            0xFFC00456 if dtype == np.float32 else 0xFFF8000000000456], bits).view(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40 if dtype == np.float32 else 1e-310,
                        -1e-45 if dtype == np.float32 else -5e-324], dtype)
    for vals in (special, nan_payload):
        x[rng.integers(0, size, len(vals))] = vals
        x[size - len(vals):] = vals  # the tail too
    want = np.maximum(x, dtype(0))
    for arr in (x, x.reshape(-1, 1) if size % 2 else x.reshape(2, -1)):
        got = bf.relu(arr)
        assert got.shape == arr.shape and got.dtype == arr.dtype
        assert got.reshape(-1).tobytes() == want.tobytes()
    strided = x[::2]
    assert bf.relu(strided).tobytes() == np.maximum(strided, dtype(0)).tobytes()


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 7

import warnings  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
import qlinear.backend as qb  # noqa: E402


F = np.float32


BIG = F(3e38)


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
    """regression: Inputs at ±3e38, ±inf and NaN: the backend gives onnxruntime's values (inf and NaN where
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


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_small_values_in_every_float_type(dtype):
    """regression: Sigmoid of x in [-17.3, -11.1] was 0 in float16 (exp(-x) overflowed float16's 65504
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
    """regression: float16 AveragePool summed its window in float16: nine taps of 40000 gave inf where
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
