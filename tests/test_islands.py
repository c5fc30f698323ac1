"""Integer islands (qlinear.passes.integer_islands, qlinear.internal QDQIsland / QDQTableIsland,
the native ``island`` / ``island_lut`` kernels): onnxruntime's float glue between quantized nodes
computed on the 8-bit tensors in one pass must give onnxruntime's session's bytes, on every
engine and ISA level, over the full range of the 8-bit inputs and random parameters; and each
test checks that the rewrite did happen (an island that silently stayed float would pass)."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qlinear import _native, backend
from qlinear.graph.modes import model_as_run

ort = pytest.importorskip("onnxruntime")


def _levels():
    """Context managers for every engine and ISA level this machine runs."""
    out = [("numpy", lambda: _native.use_engine("numpy"))]
    if _native.available():
        out += [(isa, lambda isa=isa: _native.use_isa(isa)) for isa in _native.engine_info()["isas"]]
    return out


def _model(nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, "island", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ort(m, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _check(m, feeds, want_ops: dict[str, int]):
    """The rewrite emits ``want_ops`` (op_type -> count), and every engine and level gives
    onnxruntime's outputs bit for bit (NaN where it has NaN, -0.0 where it has -0.0)."""
    ops = collections.Counter(n.op_type for n in model_as_run(m).graph.node)
    for op, k in want_ops.items():
        assert ops[op] == k, (op, dict(ops))
    want = _ort(m, feeds)
    rep = backend.prepare(m)
    for name, ctx in _levels():
        with ctx():
            got = rep.run(feeds)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert g.tobytes() == w.tobytes(), (name, int(np.sum(g.view(np.uint8) != w.view(np.uint8))))


def _params(rng, dt):
    """A random scale (1e-4 .. 1, log-uniform) and a zero point of the full range of dt."""
    info = np.iinfo(dt)
    s = np.float32(10.0 ** rng.uniform(-4, 0))
    return s, dt(rng.integers(info.min, info.max + 1))


def _q_inits(rng, dt, names):
    inits = []
    for n in names:
        s, z = _params(rng, dt)
        inits += [numpy_helper.from_array(np.array(s), n + "_s"), numpy_helper.from_array(np.array(z, dt), n + "_z")]
    return inits


def _full_range(rng, dt, shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dt)


@pytest.mark.parametrize("op,relu", [("Sum", False), ("Sum", True), ("Add", True)])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_add_island_is_onnxruntime_bit_for_bit(op, relu, dt):
    """DequantizeLinear x2 -> Sum -> [Relu] -> QuantizeLinear, and Add -> Relu -> Q with a zero
    point above the type's minimum (onnxruntime fuses Add -> Q into QLinearAdd, and an Add ->
    Relu -> Q too where the Relu is redundant; otherwise its Add and Relu stay float): one
    QDQIsland, the bytes of onnxruntime's DequantizeLinear, Add, Relu and QuantizeLinear nodes."""
    rng = np.random.default_rng(hash((op, relu, dt == np.int8)) % 2**32)
    tt = T.UINT8 if dt == np.uint8 else T.INT8
    shape = [2, 7, 9, 13]  # 1638 elements: the vector loop and the tail
    for trial in range(6):
        nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"]),
                 helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["db"]),
                 helper.make_node(op, ["da", "db"], ["s"])]
        last = "s"
        if relu:
            nodes.append(helper.make_node("Relu", ["s"], ["r"]))
            last = "r"
        nodes.append(helper.make_node("QuantizeLinear", [last, "y_s", "y_z"], ["y"]))
        inits = _q_inits(rng, dt, ["a", "b", "y"])
        inits[-1] = numpy_helper.from_array(np.array(rng.integers(np.iinfo(dt).min + 1, np.iinfo(dt).max + 1), dt), "y_z")
        if trial < 2:  # ties: a and b scales y / 2 and y / 4, so that v / y_scale is often
            # exactly k + 1/2, which must round half to even
            ys = np.float32(3 * 2.0 ** -(7 + trial))
            inits[0] = numpy_helper.from_array(np.array(np.float32(ys / 2)), "a_s")
            inits[2] = numpy_helper.from_array(np.array(np.float32(ys / 4)), "b_s")
            inits[4] = numpy_helper.from_array(np.array(ys), "y_s")
        m = _model(nodes, [helper.make_tensor_value_info(n, tt, shape) for n in "ab"],
                   [helper.make_tensor_value_info("y", tt, shape)], inits)
        feeds = {"a": _full_range(rng, dt, shape), "b": _full_range(rng, dt, shape)}
        _check(m, feeds, {"QDQIsland": 1, "DequantizeLinear": 0, "QuantizeLinear": 0, op: 0})


def test_add_island_broadcast_runs_the_numpy_form():
    """Operands of different shapes (broadcasting): the island's NumPy form, same bytes."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"]),
             helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["db"]),
             helper.make_node("Sum", ["da", "db"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "y_s", "y_z"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("a", T.UINT8, [1, 8, 5, 5]),
                       helper.make_tensor_value_info("b", T.UINT8, [1, 8, 1, 1])],
               [helper.make_tensor_value_info("y", T.UINT8, None)], _q_inits(rng, np.uint8, ["a", "b", "y"]))
    feeds = {"a": _full_range(rng, np.uint8, (1, 8, 5, 5)), "b": _full_range(rng, np.uint8, (1, 8, 1, 1))}
    _check(m, feeds, {"QDQIsland": 1})


def _bn_inits(rng, c, name="bn"):
    return [numpy_helper.from_array(rng.uniform(0.2, 2.0, c).astype(np.float32), name + "_scale"),
            numpy_helper.from_array(rng.normal(0, 1, c).astype(np.float32), name + "_b"),
            numpy_helper.from_array(rng.normal(0, 1, c).astype(np.float32), name + "_mean"),
            numpy_helper.from_array(rng.uniform(0.05, 3.0, c).astype(np.float32), name + "_var")]


def _bn(x, y, name="bn", eps=1e-5):
    return helper.make_node("BatchNormalization", [x, name + "_scale", name + "_b", name + "_mean", name + "_var"],
                            [y], epsilon=eps)


@pytest.mark.parametrize("chain", ["bn", "bn_relu", "relu", "leaky_clip", "clip", "bn_leaky_clip"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_table_island_is_onnxruntime_bit_for_bit(chain, dt):
    """DequantizeLinear -> (BatchNormalization | Relu | LeakyRelu | Clip)* -> QuantizeLinear: one
    QDQTableIsland (a table per channel with a BatchNormalization), onnxruntime's bytes. The
    Q's zero point is not the type's minimum, so onnxruntime keeps its Relu."""
    rng = np.random.default_rng(hash((chain, dt == np.int8)) % 2**32)
    tt = T.UINT8 if dt == np.uint8 else T.INT8
    c, shape = 6, [2, 6, 11, 7]
    for trial in range(4):
        nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["d0"])]
        inits = _q_inits(rng, dt, ["x"])
        last, k = "d0", 0
        for step in chain.split("_"):
            k += 1
            out = f"d{k}"
            if step == "bn":
                nodes.append(_bn(last, out, eps=float(rng.choice([1e-5, 1e-3]))))
                inits += _bn_inits(rng, c)
            elif step == "relu":
                nodes.append(helper.make_node("Relu", [last], [out]))
            elif step == "leaky":
                nodes.append(helper.make_node("LeakyRelu", [last], [out], alpha=float(rng.uniform(0.01, 0.3))))
            else:
                nodes.append(helper.make_node("Clip", [last, "lo", "hi"], [out]))
                lo = np.float32(rng.uniform(-2, 0))
                inits += [numpy_helper.from_array(np.array(lo), "lo"),
                          numpy_helper.from_array(np.array(np.float32(lo + rng.uniform(0.5, 4))), "hi")]
            last = out
        s, _ = _params(rng, dt)
        if "clip" in chain:  # a Q range wider than the Clip's, which onnxruntime then keeps
            s = np.float32(10.0 ** rng.uniform(-1.3, 0))
        z = dt(rng.integers(np.iinfo(dt).min + 20, np.iinfo(dt).max - 20))
        inits += [numpy_helper.from_array(np.array(s), "y_s"), numpy_helper.from_array(np.array(z, dt), "y_z")]
        nodes.append(helper.make_node("QuantizeLinear", [last, "y_s", "y_z"], ["y"]))
        m = _model(nodes, [helper.make_tensor_value_info("x", tt, shape)],
                   [helper.make_tensor_value_info("y", tt, shape)], inits)
        _check(m, {"x": _full_range(rng, dt, shape)}, {"QDQTableIsland": 1, "DequantizeLinear": 0,
                                                      "BatchNormalization": 0})


def _residual_model(rng, *, bn_a: bool, bn_b: bool, b_quantized: bool, dt=np.uint8, shape=(1, 16, 12, 12)):
    """Sum(DQ(a) [-> BN], x [-> BN] or DQ(b)) -> Relu -> {QuantizeLinear, a float output}: the
    residual join of onnxruntime's QOperator ResNet-50 (its Relu output feeds the next Sum)."""
    tt = T.UINT8 if dt == np.uint8 else T.INT8
    c = shape[1]
    nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"])]
    inits = _q_inits(rng, dt, ["a", "y"])
    left = "da"
    if bn_a:
        nodes.append(_bn("da", "bna", "bna"))
        inits += _bn_inits(rng, c, "bna")
        left = "bna"
    ins = [helper.make_tensor_value_info("a", tt, shape)]
    if b_quantized:
        nodes.append(helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["db"]))
        inits += _q_inits(rng, dt, ["b"])
        ins.append(helper.make_tensor_value_info("b", tt, shape))
        right = "db"
    else:
        ins.append(helper.make_tensor_value_info("b", T.FLOAT, shape))
        right = "b"
    if bn_b:
        nodes.append(_bn(right, "bnb", "bnb"))
        inits += _bn_inits(rng, c, "bnb")
        right = "bnb"
    nodes += [helper.make_node("Sum", [left, right], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
              helper.make_node("QuantizeLinear", ["r", "y_s", "y_z"], ["y"]),
              helper.make_node("Identity", ["r"], ["r_next"])]
    return _model(nodes, ins, [helper.make_tensor_value_info("y", tt, shape),
                               helper.make_tensor_value_info("r_next", T.FLOAT, shape)], inits)


@pytest.mark.parametrize("bn_a,bn_b,b_quantized", [(False, False, False), (False, False, True), (True, False, False),
                                                   (True, True, True), (True, True, False)])
def test_residual_island_float_and_quantized_outputs(bn_a, bn_b, b_quantized):
    """The float output (read by the next join) and the quantized one, both onnxruntime's bytes;
    the float operand has NaN, +-inf, -0.0 and subnormals, which the Relu keeps as
    onnxruntime's does (-0 and NaN through)."""
    rng = np.random.default_rng(int(bn_a) * 4 + int(bn_b) * 2 + int(b_quantized))
    shape = (1, 16, 12, 12)
    for trial in range(4):
        m = _residual_model(rng, bn_a=bn_a, bn_b=bn_b, b_quantized=b_quantized, shape=shape)
        feeds = {"a": _full_range(rng, np.uint8, shape)}
        if b_quantized:
            feeds["b"] = _full_range(rng, np.uint8, shape)
        else:
            b = (rng.standard_normal(shape) * 3).astype(np.float32)
            flat = b.reshape(-1)
            flat[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-42, -1e-42, 3e38]
            feeds["b"] = b
        _check(m, feeds, {"QDQIsland": 1, "Sum": 0, "Relu": 0, "QuantizeLinear": 0, "BatchNormalization": 0})


def test_float_output_only_island():
    """DequantizeLinear(a) + x -> Relu, no QuantizeLinear: the float island alone."""
    rng = np.random.default_rng(11)
    shape = (2, 5, 33)
    nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"]),
             helper.make_node("Add", ["x", "da"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("a", T.INT8, shape),
                       helper.make_tensor_value_info("x", T.FLOAT, shape)],
               [helper.make_tensor_value_info("y", T.FLOAT, shape)], _q_inits(rng, np.int8, ["a"]))
    feeds = {"a": _full_range(rng, np.int8, shape), "x": rng.standard_normal(shape).astype(np.float32)}
    _check(m, feeds, {"QDQIsland": 1, "Add": 0, "Relu": 0})


def test_requantization_island():
    """DequantizeLinear -> QuantizeLinear with other parameters (what is left of a Clip that
    onnxruntime's ClipQuantFusion removed): a table, onnxruntime's bytes."""
    rng = np.random.default_rng(4)
    shape = [3, 50]
    for dt, tt in ((np.uint8, T.UINT8), (np.int8, T.INT8)):
        nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["d"]),
                 helper.make_node("QuantizeLinear", ["d", "y_s", "y_z"], ["y"])]
        m = _model(nodes, [helper.make_tensor_value_info("x", tt, shape)], [helper.make_tensor_value_info("y", tt, shape)],
                   _q_inits(rng, dt, ["x", "y"]))
        _check(m, {"x": _full_range(rng, dt, shape)}, {"QDQTableIsland": 1, "QuantizeLinear": 0})


def test_islands_need_single_readers_and_constant_parameters():
    """A DequantizeLinear with another reader, or a scale fed as a graph input, stays as
    written (the float nodes run), and the outputs are still onnxruntime's."""
    rng = np.random.default_rng(3)
    shape = [1, 4, 6, 6]
    nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"]),
             helper.make_node("Relu", ["da"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "y_s", "y_z"], ["y"]),
             helper.make_node("Identity", ["r"], ["da_out"])]
    m = _model(nodes, [helper.make_tensor_value_info("a", T.UINT8, shape)],
               [helper.make_tensor_value_info("y", T.UINT8, shape),
                helper.make_tensor_value_info("da_out", T.FLOAT, shape)], _q_inits(rng, np.uint8, ["a", "y"]))
    _check(m, {"a": _full_range(rng, np.uint8, shape)}, {"QDQTableIsland": 0, "QDQIsland": 0, "Relu": 1})
    inits = [i for i in _q_inits(rng, np.uint8, ["a", "y"]) if i.name != "y_s"]
    m2 = _model(nodes[:3], [helper.make_tensor_value_info("a", T.UINT8, shape),
                            helper.make_tensor_value_info("y_s", T.FLOAT, [])],
                [helper.make_tensor_value_info("y", T.UINT8, shape)], inits)
    _check(m2, {"a": _full_range(rng, np.uint8, shape), "y_s": np.array(0.05, np.float32)},
           {"QDQTableIsland": 0, "Relu": 1})


def test_island_threads_split_large_tensors_identically():
    """A tensor above the threading threshold (2^17 elements) split over the pool's tasks gives
    the one-thread bytes (and onnxruntime's)."""
    from conftest import num_threads

    rng = np.random.default_rng(8)
    shape = (1, 64, 48, 48)  # 147456 elements, several tasks
    m = _residual_model(rng, bn_a=True, bn_b=False, b_quantized=True, shape=shape)
    feeds = {"a": _full_range(rng, np.uint8, shape), "b": _full_range(rng, np.uint8, shape)}
    rep = backend.prepare(m)
    with num_threads(1):
        one = rep.run(feeds)
    with num_threads(2):
        two = rep.run(feeds)
    want = _ort(m, feeds)
    for a, b, w in zip(one, two, want):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes() == w.tobytes()


@pytest.mark.parametrize("types", [("s8", "u8", "u8"), ("u8", "s8", "s8"), ("s8", "s8", "u8")])
def test_mixed_type_add_island(types):
    """DequantizeLinear of int8 and of uint8 -> Add -> QuantizeLinear (onnxruntime's QLinearAdd
    needs one type, so it runs the float Add: shared/models' mobilenetv2-7 QDQ has ten of
    these): one QDQIsland, each operand read as its own type, onnxruntime's bytes."""
    rng = np.random.default_rng(sum(map(ord, "".join(types))))
    dts = [np.int8 if t == "s8" else np.uint8 for t in types]
    tts = [T.INT8 if t == "s8" else T.UINT8 for t in types]
    shape = [1, 12, 10, 10]
    for trial in range(4):
        nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["da"]),
                 helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["db"]),
                 helper.make_node("Add", ["da", "db"], ["s"]),
                 helper.make_node("QuantizeLinear", ["s", "y_s", "y_z"], ["y"])]
        inits = _q_inits(rng, dts[0], ["a"]) + _q_inits(rng, dts[1], ["b"]) + _q_inits(rng, dts[2], ["y"])
        m = _model(nodes, [helper.make_tensor_value_info("a", tts[0], shape), helper.make_tensor_value_info("b", tts[1], shape)],
                   [helper.make_tensor_value_info("y", tts[2], shape)], inits)
        feeds = {"a": _full_range(rng, dts[0], shape), "b": _full_range(rng, dts[1], shape)}
        _check(m, feeds, {"QDQIsland": 1, "Add": 0, "QuantizeLinear": 0})


@pytest.mark.parametrize("types", [("s8", "u8"), ("u8", "s8")])
@pytest.mark.parametrize("opset", [10, 13])
def test_table_island_across_types(types, opset):
    """DequantizeLinear of one 8-bit type -> Relu -> QuantizeLinear to the other (a QDQ model's
    int8 convolution output requantized to uint8, as in shared/models' Kaldi TDNN): one table
    of the output type, onnxruntime's bytes."""
    rng = np.random.default_rng(11 + opset)
    din, dout = [np.int8 if t == "s8" else np.uint8 for t in types]
    shape = [3, 5, 17]
    for trial in range(3):
        nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["d"]),
                 helper.make_node("Relu", ["d"], ["r"]),
                 helper.make_node("QuantizeLinear", ["r", "y_s", "y_z"], ["y"])]
        inits = _q_inits(rng, din, ["x"]) + _q_inits(rng, dout, ["y"])
        m = _model(nodes, [helper.make_tensor_value_info("x", T.INT8 if din == np.int8 else T.UINT8, shape)],
                   [helper.make_tensor_value_info("y", T.INT8 if dout == np.int8 else T.UINT8, shape)], inits,
                   opset=opset)
        _check(m, {"x": _full_range(rng, din, shape)}, {"QDQTableIsland": 1, "Relu": 0, "QuantizeLinear": 0})


@pytest.mark.parametrize("moves", ["transpose_relu_reshape", "unsqueeze_transpose", "relu_squeeze_flatten"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_table_island_through_data_movement(moves, dt):
    """DequantizeLinear -> data movement and element-wise steps -> QuantizeLinear: the movement
    nodes move the 8-bit codes, then one table (a table commutes with any movement),
    onnxruntime's bytes; strided views (a Transpose's) into the table's lookup included."""
    rng = np.random.default_rng(hash((moves, dt == np.int8)) % 2**32)
    tt = T.UINT8 if dt == np.uint8 else T.INT8
    shape = [1, 6, 10]
    for trial in range(3):
        nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["d0"])]
        inits = _q_inits(rng, dt, ["x", "y"])
        last, n_moves = "d0", 0
        for k, step in enumerate(moves.split("_")):
            out = f"d{k + 1}"
            if step == "relu":
                nodes.append(helper.make_node("Relu", [last], [out]))
            elif step == "transpose":
                rank = 3 + moves.startswith("unsqueeze")
                nodes.append(helper.make_node("Transpose", [last], [out], perm=[rank - 1, *range(rank - 1)]))
            elif step == "reshape":
                nodes.append(helper.make_node("Reshape", [last, "shape"], [out]))
                inits.append(numpy_helper.from_array(np.array([5, -1], np.int64), "shape"))
            elif step == "unsqueeze":
                nodes.append(helper.make_node("Unsqueeze", [last, "axes"], [out]))
                inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
            elif step == "squeeze":
                nodes.append(helper.make_node("Squeeze", [last, "axes"], [out]))
                inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
            else:
                nodes.append(helper.make_node("Flatten", [last], [out], axis=1))
            n_moves += step != "relu"
            last = out
        nodes.append(helper.make_node("QuantizeLinear", [last, "y_s", "y_z"], ["y"]))
        m = _model(nodes, [helper.make_tensor_value_info("x", tt, shape)],
                   [helper.make_tensor_value_info("y", tt, None)], inits)
        ops = collections.Counter(n.op_type for n in model_as_run(m).graph.node)
        assert sum(ops[k] for k in ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten")) == n_moves
        # (int8: the QDQ fusion's int8 -> uint8 conversion, as onnxruntime's, adds requantizations)
        assert ops["QDQTableIsland"] >= 1, dict(ops)
        _check(m, {"x": _full_range(rng, dt, shape)}, {"DequantizeLinear": 0, "QuantizeLinear": 0, "Relu": 0})


def test_no_table_island_through_movement_with_per_channel_tables():
    """A BatchNormalization's per-channel table and a Transpose that may move the channel axis:
    no table through the Transpose (it stays, moving the float tensor or the codes of a
    requantization after the BatchNormalization's table), onnxruntime's bytes."""
    rng = np.random.default_rng(5)
    shape = [1, 4, 3, 5]
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["d"]), _bn("d", "b"),
             helper.make_node("Transpose", ["b"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("QuantizeLinear", ["t", "y_s", "y_z"], ["y"])]
    inits = _q_inits(rng, np.uint8, ["x", "y"]) + _bn_inits(rng, 4)
    m = _model(nodes, [helper.make_tensor_value_info("x", T.UINT8, shape)],
               [helper.make_tensor_value_info("y", T.UINT8, None)], inits)
    ops = collections.Counter(n.op_type for n in model_as_run(m).graph.node)
    assert ops["BatchNormalization"] + ops["QDQTableIsland"] >= 1 and ops["Transpose"] == 1, dict(ops)
    _check(m, {"x": _full_range(rng, np.uint8, shape)}, {"Transpose": 1})


def _conv_then(rng, dt, tail, shape=(1, 3, 9, 9), m=4):
    """x (of ``dt``) -> QLinearConv (int8 weights within [-64, 64]: no kernel saturates) -> codes
    of ``dt`` -> ``tail`` (nodes reading "y0", writing "y") -> y."""
    tt = T.UINT8 if dt == np.uint8 else T.INT8
    w = rng.integers(-64, 65, (m, shape[1], 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(np.float32(0.02)), "x_s"),
             numpy_helper.from_array(np.array(100 if dt == np.uint8 else -10, dt), "x_z"),
             numpy_helper.from_array(np.array(np.float32(0.01)), "w_s"), numpy_helper.from_array(np.array(0, np.int8), "w_z")]
    inits += _q_inits(rng, dt, ["c"])
    nodes = [helper.make_node("QLinearConv", ["x", "x_s", "x_z", "w", "w_s", "w_z", "c_s", "c_z"], ["y0"],
                              pads=[1, 1, 1, 1])] + tail[0]
    return _model(nodes, [helper.make_tensor_value_info("x", tt, list(shape))],
                  [helper.make_tensor_value_info("y", tt, None)], inits + tail[1])


@pytest.mark.parametrize("op,const_first,bias", [("Add", False, "init"), ("Add", True, "init"), ("Sub", True, "init"),
                                                 ("Sub", False, "dq"), ("Mul", False, "scalar")])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_table_island_with_a_constant_per_channel_operand(op, const_first, bias, dt):
    """QLinearConv -> DequantizeLinear -> Add / Sub / Mul of a per-channel constant (a QDQ
    model's bias: an initializer (C, 1, 1) or the DequantizeLinear of one) -> QuantizeLinear:
    one table per channel, onnxruntime's float32 operation in its operand order, its bytes."""
    rng = np.random.default_rng(hash((op, const_first, bias, dt == np.int8)) % 2**32)
    for trial in range(3):
        inits = _q_inits(rng, dt, ["d", "y"])
        if bias == "scalar":
            inits.append(numpy_helper.from_array(np.array(np.float32(rng.uniform(0.5, 2))), "b"))
        elif bias == "init":
            inits.append(numpy_helper.from_array(rng.normal(0, 1, (4, 1, 1)).astype(np.float32), "b"))
        else:
            inits += [numpy_helper.from_array(rng.integers(-100, 100, (4, 1, 1)).astype(np.int8), "bq"),
                      numpy_helper.from_array(np.array(np.float32(0.02)), "bq_s"),
                      numpy_helper.from_array(np.array(0, np.int8), "bq_z")]
        nodes = [helper.make_node("DequantizeLinear", ["y0", "d_s", "d_z"], ["f"])]
        if bias == "dq":
            nodes.append(helper.make_node("DequantizeLinear", ["bq", "bq_s", "bq_z"], ["b"]))
        nodes += [helper.make_node(op, ["b", "f"] if const_first else ["f", "b"], ["g"]),
                  helper.make_node("QuantizeLinear", ["g", "y_s", "y_z"], ["y"])]
        # the DequantizeLinear reads the convolution's codes: its parameters are the conv's output's
        inits = [i for i in inits if i.name not in ("d_s", "d_z")]
        m = _conv_then(rng, dt, (nodes, inits))
        for n in m.graph.node:
            if n.op_type == "DequantizeLinear" and n.input[0] == "y0":
                n.input[1], n.input[2] = "c_s", "c_z"
        _check(m, {"x": _full_range(rng, dt, (1, 3, 9, 9))},
               {"QDQTableIsland": 1, op: 0, "DequantizeLinear": 0, "QuantizeLinear": 0})


@pytest.mark.parametrize("same", [True, False])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_maxpool_between_dequantize_and_quantize_runs_on_codes(same, dt):
    """DequantizeLinear -> MaxPool -> QuantizeLinear (a QDQ model at opset 11, where onnxruntime
    keeps the float MaxPool): MaxPool on the codes (the dequantization never decreases), then a
    table, or nothing for the same parameters; onnxruntime's bytes, NaN-free by construction."""
    rng = np.random.default_rng(21 + same + 2 * (dt == np.int8))
    for trial in range(3):
        inits = _q_inits(rng, dt, ["y"])
        nodes = [helper.make_node("DequantizeLinear", ["y0", "c_s", "c_z"], ["f"]),
                 helper.make_node("MaxPool", ["f"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
                 helper.make_node("QuantizeLinear", ["p", "c_s" if same else "y_s", "c_z" if same else "y_z"], ["y"])]
        m = _conv_then(rng, dt, (nodes, inits))
        m.opset_import[0].version = 11
        _check(m, {"x": _full_range(rng, dt, (1, 3, 9, 9))},
               {"QDQTableIsland": 0 if same else 1, "MaxPool": 1, "DequantizeLinear": 0, "QuantizeLinear": 0})


def test_no_table_island_for_a_constant_that_adds_axes():
    """A one-element constant of more axes than the tensor: the Add's result has more axes (no
    table, which keeps the input's shape); onnxruntime's shape and bytes."""
    rng = np.random.default_rng(9)
    inits = _q_inits(rng, np.uint8, ["y"]) + [
        numpy_helper.from_array(np.full((1, 1, 1, 1, 1), 0.5, np.float32), "b")]
    nodes = [helper.make_node("DequantizeLinear", ["y0", "c_s", "c_z"], ["f"]),
             helper.make_node("Add", ["f", "b"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "y_s", "y_z"], ["y"])]
    m = _conv_then(rng, np.uint8, (nodes, inits))
    _check(m, {"x": _full_range(rng, np.uint8, (1, 3, 9, 9))}, {"QDQTableIsland": 0})
