"""Scan with non-zero scan axes and reverse directions (qlinear.graph.kernels.control.Scan):
onnx.reference runs only axis 0 forward; qlinear's results are compared with onnxruntime's,
bit for bit, on small models built here (float and a quantized recurrent cell)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qlinear import backend

ort = pytest.importorskip("onnxruntime")


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(body, inputs, outputs, attrs, initializers=(), opset=16):
    node = helper.make_node("Scan", [i.name for i in inputs], [o.name for o in outputs],
                            body=body, name="scan", **attrs)
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _same(model, feeds):
    assert backend.check_model(model) == []
    want = _ort(model, feeds)
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_array_equal(g, w)
    return got


def _cumsum_body(width):
    """state s (width,), scan input e (width,): s2 = s + e; scan outputs s2 and e * 2."""
    return helper.make_graph(
        [helper.make_node("Add", ["s", "e"], ["s2"]),
         helper.make_node("Identity", ["s2"], ["o"]),
         helper.make_node("Add", ["e", "e"], ["o2"])],
        "body", [_vi("s", T.FLOAT, [width]), _vi("e", T.FLOAT, [width])],
        [_vi("s2", T.FLOAT, [width]), _vi("o", T.FLOAT, [width]), _vi("o2", T.FLOAT, [width])])


@pytest.mark.parametrize("in_axis", [0, 1, -1, -2])
@pytest.mark.parametrize("in_dir", [0, 1])
@pytest.mark.parametrize("out_axes,out_dirs", [([0, 0], [0, 0]), ([1, -1], [0, 1]),
                                               ([-2, 1], [1, 0]), ([0, -1], [1, 1])])
def test_scan_axes_and_directions_match_onnxruntime(in_axis, in_dir, out_axes, out_dirs):
    # a (3, 4) scan input: its scan axis is 0 or 1 (negative: counted from the end); the
    # body sees slices of the other axis' length
    steps = 3 if in_axis in (0, -2) else 4
    width = 7 - steps
    xs = np.random.default_rng(10 + in_axis + 5 * in_dir).standard_normal((3, 4)).astype(np.float32)
    m = _model(_cumsum_body(width), [_vi("s0", T.FLOAT, [width]), _vi("xs", T.FLOAT, [3, 4])],
               [_vi("sN", T.FLOAT, None), _vi("os", T.FLOAT, None), _vi("os2", T.FLOAT, None)],
               {"num_scan_inputs": 1, "scan_input_axes": [in_axis], "scan_input_directions": [in_dir],
                "scan_output_axes": out_axes, "scan_output_directions": out_dirs})
    s0 = np.arange(width, dtype=np.float32)
    s, os_, os2 = _same(m, {"s0": s0, "xs": xs})
    # and against the definition written out: slices in scan order, stacked, reversed
    slices = np.moveaxis(xs, in_axis, 0)
    if in_dir:
        slices = slices[::-1]
    acc, steps_ = s0, []
    for e in slices:  # the state carried step by step, as the body adds it
        acc = acc + e
        steps_.append(acc)
    cum = np.stack(steps_)
    np.testing.assert_array_equal(s, cum[-1])
    for got, per_step, ax, d in ((os_, cum, out_axes[0], out_dirs[0]),
                                 (os2, slices * 2, out_axes[1], out_dirs[1])):
        np.testing.assert_array_equal(got, np.moveaxis(per_step[::-1] if d else per_step, 0, ax))


def test_scan_two_inputs_on_different_axes_and_rank3_output_axis():
    # two scan inputs of different layouts, sliced along axis 2 and -3; the scan output of rank
    # 3 (slices of rank 2) stacked along axis 2
    body = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["p"]),
         helper.make_node("Add", ["acc", "p"], ["acc2"]),
         helper.make_node("Identity", ["p"], ["po"])],
        "body", [_vi("acc", T.FLOAT, [2, 2]), _vi("a", T.FLOAT, [2, 3]), _vi("b", T.FLOAT, [3, 2])],
        [_vi("acc2", T.FLOAT, [2, 2]), _vi("po", T.FLOAT, [2, 2])])
    rng = np.random.default_rng(1)
    a = rng.integers(-4, 5, (2, 3, 5)).astype(np.float32)   # scanned along axis 2
    b = rng.integers(-4, 5, (5, 3, 2)).astype(np.float32)   # scanned along axis -3 (= 0)
    m = _model(body, [_vi("acc0", T.FLOAT, [2, 2]), _vi("a", T.FLOAT, [2, 3, 5]), _vi("b", T.FLOAT, [5, 3, 2])],
               [_vi("acc", T.FLOAT, None), _vi("ps", T.FLOAT, None)],
               {"num_scan_inputs": 2, "scan_input_axes": [2, -3], "scan_input_directions": [0, 1],
                "scan_output_axes": [2]})
    acc, ps = _same(m, {"acc0": np.zeros((2, 2), np.float32), "a": a, "b": b})
    assert ps.shape == (2, 2, 5)
    np.testing.assert_array_equal(ps[:, :, 0], a[:, :, 0] @ b[4])


def test_quantized_recurrent_cell_scanned_along_time_axis_1():
    # a recurrent cell over x of layout (batch, time, features), scanned along axis 1 backward:
    # h' = DQ(QLinearMatMul(Q(x_t), W)) + DQ(QLinearMatMul(Q(h), U)), quantized again; the
    # per-step outputs stacked along axis 1 in time order (scan_output_directions 1)
    rng = np.random.default_rng(7)
    f, hdim = 4, 3
    w = numpy_helper.from_array(rng.integers(-128, 128, (f, hdim)).astype(np.int8), "W")
    u = numpy_helper.from_array(rng.integers(-128, 128, (hdim, hdim)).astype(np.int8), "U")
    consts = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in (
        ("xs", 0.05, np.float32), ("xz", 3, np.uint8), ("ws", 0.02, np.float32), ("wz", 0, np.int8),
        ("hs", 0.1, np.float32), ("hz", 128, np.uint8), ("ys", 0.07, np.float32), ("yz", 120, np.uint8))]
    body = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x_t", "xs", "xz"], ["qx"]),
         helper.make_node("QLinearMatMul", ["qx", "xs", "xz", "W", "ws", "wz", "ys", "yz"], ["a"]),
         helper.make_node("QLinearMatMul", ["h", "hs", "hz", "U", "ws", "wz", "ys", "yz"], ["b"]),
         helper.make_node("DequantizeLinear", ["a", "ys", "yz"], ["fa"]),
         helper.make_node("DequantizeLinear", ["b", "ys", "yz"], ["fb"]),
         helper.make_node("Add", ["fa", "fb"], ["sum"]),
         helper.make_node("Tanh", ["sum"], ["t"]),
         helper.make_node("QuantizeLinear", ["t", "hs", "hz"], ["h2"]),
         helper.make_node("Identity", ["h2"], ["hout"])],
        "cell", [_vi("h", T.UINT8, [2, hdim]), _vi("x_t", T.FLOAT, [2, f])],
        [_vi("h2", T.UINT8, [2, hdim]), _vi("hout", T.UINT8, [2, hdim])])
    m = _model(body, [_vi("h0", T.UINT8, [2, hdim]), _vi("x", T.FLOAT, [2, 5, f])],
               [_vi("hN", T.UINT8, None), _vi("hs_all", T.UINT8, None)],
               {"num_scan_inputs": 1, "scan_input_axes": [1], "scan_input_directions": [1],
                "scan_output_axes": [1], "scan_output_directions": [1]},
               initializers=[w, u, *consts])
    x = rng.standard_normal((2, 5, f)).astype(np.float32) * 3
    h, hs_all = _same(m, {"h0": np.full((2, hdim), 128, np.uint8), "x": x})
    assert hs_all.shape == (2, 5, hdim) and np.array_equal(hs_all[:, 0], h)


def _bad(attrs, xs_shape=(3, 2)):
    return _model(_cumsum_body(2), [_vi("s0", T.FLOAT, [2]), _vi("xs", T.FLOAT, list(xs_shape))],
                  [_vi("sN", T.FLOAT, None), _vi("os", T.FLOAT, None), _vi("os2", T.FLOAT, None)],
                  {"num_scan_inputs": 1, **attrs})


@pytest.mark.parametrize("attrs,fragment", [
    ({"scan_input_axes": [2]}, "scan_input_axes[0] is 2, outside [-2, 1]"),
    ({"scan_input_axes": [-3]}, "scan_input_axes[0] is -3, outside [-2, 1]"),
    ({"scan_output_axes": [0, 2]}, "scan_output_axes[1] is 2, outside [-2, 1]"),
    ({"scan_input_directions": [2]}, "scan_input_directions takes 0 (forward) or 1"),
    ({"scan_output_axes": [0, 0, 0]}, "scan_output_axes has 3 values, more than the 2 scan outputs"),
])
def test_scan_bad_axes_are_named(attrs, fragment):
    with pytest.raises((ValueError, backend.NodeError)) as e:
        backend.prepare(_bad(attrs)).run({"s0": np.zeros(2, np.float32),
                                          "xs": np.zeros((3, 2), np.float32)})
    assert fragment in str(e.value) and "'scan'" in str(e.value)


def test_scan_inputs_of_different_lengths_are_refused():
    body = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "body",
                             [_vi("a", T.FLOAT, [2]), _vi("b", T.FLOAT, [2])], [_vi("c", T.FLOAT, [2])])
    m = _model(body, [_vi("a", T.FLOAT, [3, 2]), _vi("b", T.FLOAT, [2, 4])], [_vi("c", T.FLOAT, None)],
               {"num_scan_inputs": 2, "scan_input_axes": [0, 1]})
    with pytest.raises(backend.NodeError, match="differ in length along their scan axes: 3 .input 0, "
                                                "axis 0., 4 .input 1, axis 1."):
        backend.prepare(m).run({"a": np.zeros((3, 2), np.float32), "b": np.zeros((2, 4), np.float32)})
