"""The compiled plan's steps for small standard operators (qlinear.graph.steps) and its quantized
short paths with their constant inputs checked once: every result bit for bit the general
loop's (and onnx.reference's where qlinear's kernel keeps its arithmetic), inputs the pre-checked
step does not take handed to the node's own call (its error, naming the node), and nothing
kept from one run's input arrays for the next."""

from __future__ import annotations

import numpy as np
import pytest

import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qlinear import backend


def _vi(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _one(op, inputs, inits, attrs=None, elem=T.FLOAT, out_elem=None, opset=17, domain=""):
    """A model of one node ``op`` reading graph input x (no declared shape: the node sees
    whatever is fed) and the constants ``inits`` (name -> array)."""
    node = helper.make_node(op, inputs, ["y"], name="the_node", domain=domain, **(attrs or {}))
    # x declares no type either: a node's step sees other dtypes than it was bound to
    g = helper.make_graph([node], "g", [_vi("x", T.UNDEFINED)], [_vi("y", out_elem or elem)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _general(rep, feeds):
    """The general loop's outputs (an intermediate run never takes the compiled plan)."""
    res = rep.evaluator.run(None, feeds, intermediate=True)
    return [res[n] for n in rep.evaluator.output_names]


def _step_name(rep):
    (node, step, _), = rep.evaluator._compiled.steps
    return step.__name__


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


_SPECIAL = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e38, -3e38,
                     2.0 ** -126, 7.0, -7.0, 0.1, -0.1], np.float32)


def _values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        v = (rng.standard_normal(shape) * 4).astype(dtype)
        flat = v.reshape(-1)
        k = min(flat.size, _SPECIAL.size)
        flat[:k] = _SPECIAL[:k].astype(dtype)
        return v
    return rng.integers(-50, 50, shape).astype(dtype)


_ELEM = {np.float32: T.FLOAT, np.float64: T.DOUBLE, np.float16: T.FLOAT16, np.int32: T.INT32,
         np.int64: T.INT64}


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("const_first", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_binary_with_a_constant_operand(op, const_first, dtype):
    if op == "Div" and np.dtype(dtype).kind == "i":
        pytest.skip("integer Div: onnx.reference's own _run (not the ufunc step)")
    c = _values(dtype, (3, 4), 7)
    if np.dtype(dtype).kind == "i":
        c[c == 0] = 3
    m = _one(op, ["c", "x"] if const_first else ["x", "c"], {"c": c}, elem=_ELEM[dtype])
    rep, ref = backend.prepare(m), ReferenceEvaluator(m)
    shapes = [(3, 4), (3, 4), (1, 4), (2, 3, 4), ()]
    for i, shape in enumerate(shapes):
        x = _values(dtype, shape, i)
        got = rep.run({"x": x})[0]
        _same(got, _general(rep, {"x": x})[0])
        _same(got, ref.run(None, {"x": x})[0])
    if op != "Div":  # onnx.reference's Div has a _run of its own: its general call
        assert _step_name(rep) == "binary_c"
    # another dtype than the constant's: the node's own call (onnx.reference refuses it)
    other = np.float64 if dtype != np.float64 else np.float32
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _values(other, (3, 4), 1)})
    # a shape that does not broadcast: the node's error, not a result
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _values(dtype, (5, 4), 1)})
    x = _values(dtype, (3, 4), 3)
    _same(rep.run({"x": x})[0], ref.run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
def test_relu_step_is_the_kernels_call(dtype):
    m = _one("Relu", ["x"], {}, elem=_ELEM[dtype])
    rep = backend.prepare(m)
    for i, shape in enumerate([(4, 8), (4, 8), (1,), (), (3, 1, 5), (130, 130), (2, 0)]):
        x = _values(dtype, shape, i)
        if x.ndim == 2 and x.shape[0] == 130:
            x = x[:, ::2]  # a strided view too
        got = rep.run({"x": x})[0]
        want = _general(rep, {"x": x})[0]
        _same(got, want)
        assert got is not x and not np.shares_memory(got, x)
    assert _step_name(rep) == "relu"


def test_relu_step_keeps_negative_zero_and_nan_as_the_kernel_does():
    rep = backend.prepare(_one("Relu", ["x"], {}))
    x = np.tile(_SPECIAL, 5)
    rep.run({"x": x})
    got = rep.run({"x": x})[0]
    want = rep.evaluator.rt_nodes_[0].run(x)[0]  # the kernel's own call
    _same(got, want)


@pytest.mark.parametrize("shape,allowzero,opset", [
    ([4, 4], 0, 17), ([-1], 0, 17), ([2, -1, 2], 0, 17), ([0, -1], 0, 17), ([16], 0, 5)])
def test_reshape_with_a_constant_shape(shape, allowzero, opset):
    attrs = {"allowzero": allowzero} if opset >= 14 else {}
    m = _one("Reshape", ["x", "s"], {"s": np.array(shape, np.int64)}, attrs=attrs, opset=opset)
    rep, ref = backend.prepare(m), ReferenceEvaluator(m)
    x = _values(np.float32, (2, 8), 0)
    for i in range(3):
        x = _values(np.float32, (2, 8), i)
        got = rep.run({"x": x})[0]
        _same(got, _general(rep, {"x": x})[0])
        _same(got, ref.run(None, {"x": x})[0])
    if -1 in shape:
        return  # any number of elements fits (a (3, 5) x: (15,), (0 -> 3, 5))
    # another number of elements: one clear error naming the node, then right results again
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _values(np.float32, (3, 5), 1)})
    _same(rep.run({"x": x})[0], ref.run(None, {"x": x})[0])


def test_reshape_of_an_empty_tensor_with_allowzero():
    m = _one("Reshape", ["x", "s"], {"s": np.array([0, 16], np.int64)}, attrs={"allowzero": 1})
    rep, ref = backend.prepare(m), ReferenceEvaluator(m)
    x = np.zeros((4, 0), np.float32)
    for _ in range(2):
        _same(rep.run({"x": x})[0], ref.run(None, {"x": x})[0])
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _values(np.float32, (2, 8), 1)})


@pytest.mark.parametrize("perm", [None, [1, 0, 2], [2, 0, 1], [0, 1, 2]])
def test_transpose_step(perm):
    attrs = {} if perm is None else {"perm": perm}
    m = _one("Transpose", ["x"], {}, attrs=attrs)
    rep, ref = backend.prepare(m), ReferenceEvaluator(m)
    for i in range(3):
        x = _values(np.float32, (2, 3, 4), i)
        got = rep.run({"x": x})[0]
        _same(got, ref.run(None, {"x": x})[0])
        assert got.strides == ref.run(None, {"x": x})[0].strides
    assert _step_name(rep) in ("transpose", "transpose_all")
    if perm is not None:
        # another rank: the node's own error
        with pytest.raises(backend.NodeError, match="the_node"):
            rep.run({"x": _values(np.float32, (2, 3), 1)})
    else:
        x = _values(np.float32, (5, 2), 1)
        _same(rep.run({"x": x})[0], ref.run(None, {"x": x})[0])


@pytest.mark.parametrize("op,axes,opset,shapes", [
    ("Squeeze", [0], 11, [(1, 3, 4), (1, 5, 1), (1,)]),
    ("Squeeze", [0, 2], 17, [(1, 3, 1), (1, 5, 1)]),
    ("Squeeze", None, 17, [(1, 3, 1), (2, 1, 4), (1, 1)]),
    ("Unsqueeze", [0], 11, [(3, 4), (5,), ()]),
    ("Unsqueeze", [-1, 0], 17, [(3, 4), (5,)]),
])
def test_squeeze_unsqueeze_steps(op, axes, opset, shapes):
    if opset >= 13 and axes is not None:
        m = _one(op, ["x", "axes"], {"axes": np.array(axes, np.int64)}, opset=opset)
    else:
        m = _one(op, ["x"], {}, attrs={} if axes is None else {"axes": axes}, opset=opset)
    rep, ref = backend.prepare(m), ReferenceEvaluator(m)
    for rnd in range(2):  # the output shape of each input shape, remembered, then reused
        for i, shape in enumerate(shapes):
            x = _values(np.float32, shape, i + rnd)
            got = rep.run({"x": x})[0]
            _same(got, ref.run(None, {"x": x})[0])
    assert _step_name(rep) == "axes_view"
    bad = (3, 4, 5) if op == "Squeeze" else (1,) * 9
    if op == "Squeeze" and axes is not None:
        with pytest.raises(backend.NodeError, match="the_node"):
            rep.run({"x": _values(np.float32, bad, 1)})


def test_identity_step_copies():
    rep = backend.prepare(_one("Identity", ["x"], {}))
    x = _values(np.float32, (3, 4), 0)
    for _ in range(3):
        got = rep.run({"x": x})[0]
        _same(got, x)
        assert not np.shares_memory(got, x)
    assert _step_name(rep) == "identity"


def _qmatmul_model():
    rng = np.random.default_rng(0)
    inits = {"w": rng.integers(-20, 20, (16, 8)).astype(np.int8), "xs": np.array(0.05, np.float32),
             "xz": np.array(120, np.uint8), "ws": np.array(0.01, np.float32), "wz": np.array(0, np.int8),
             "ys": np.array(0.04, np.float32), "yz": np.array(128, np.uint8)}
    m = _one("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], inits, elem=T.UINT8)
    return m


def _u8(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


def test_quantized_data_path_rejects_bad_inputs_at_run():
    # the short path is bound to its constants and a (2, 16) uint8 input; a wrong-shaped or
    # wrong-typed input later is one clear error naming the node, then the right results again
    m = _qmatmul_model()
    rep, ref = backend.prepare(m), backend.prepare(m)
    x = _u8((2, 16), 1)
    want = rep.run({"x": x})[0]
    for _ in range(3):
        _same(rep.run({"x": x})[0], want)
    assert _step_name(rep) == "shortcut"
    fast = rep.evaluator._fast_plan[0][7]
    assert getattr(fast[1], "data", None) is not None  # the data-only short path is bound
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _u8((2, 15), 1)})
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": _u8((2, 16), 1).astype(np.int8)})
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": np.zeros((2, 16), np.float32)})
    # a strided input of the right shape: the right answer (the full call copies it)
    wide = _u8((2, 32), 5)
    _same(rep.run({"x": wide[:, ::2]})[0], ref.run({"x": np.ascontiguousarray(wide[:, ::2])})[0])
    for seed in range(3):
        x = _u8((2, 16), seed + 10)
        _same(rep.run({"x": x})[0], ref.run({"x": x})[0])
    # another batch: bound again, right
    x = _u8((5, 16), 3)
    _same(rep.run({"x": x})[0], ref.run({"x": x})[0])


def test_a_mutated_input_array_is_not_cached_between_runs():
    # one array object fed on every run, its values changed in place between runs: each run's
    # outputs are those of its values (nothing is keyed on the array's identity)
    rng = np.random.default_rng(3)
    c = rng.random((2, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(c, "c"), numpy_helper.from_array(np.array([4, 4], np.int64), "s"),
             numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
             numpy_helper.from_array(np.array(10, np.uint8), "qz"),
             numpy_helper.from_array(rng.integers(-9, 9, (4, 4)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["rs"]), helper.make_node("Transpose", ["rs"], ["t"]),
             helper.make_node("QuantizeLinear", ["t", "qs", "qz"], ["q"]),
             helper.make_node("QLinearMatMul", ["q", "qs", "qz", "w", "ws", "wz", "qs", "qz"], ["qm"]),
             helper.make_node("DequantizeLinear", ["qm", "qs", "qz"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", T.FLOAT, [2, 8])], [_vi("y", T.FLOAT, None),
                                                                    _vi("rs", T.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(m)
    x = np.zeros((2, 8), np.float32)
    outs = []
    for seed in range(4):
        x[...] = np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)
        got = rep.run({"x": x})
        fresh = backend.prepare(m).run({"x": x.copy()})
        for a, b in zip(got, fresh):
            _same(a, b)
        outs.append(list(got))  # the arrays handed out, not copies
    # and the outputs handed out before are not changed by later runs
    for seed, kept in enumerate(outs):
        x2 = np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)
        for a, b in zip(kept, backend.prepare(m).run({"x": x2})):
            _same(a, b)


def test_reshape_of_a_shape_a_run_may_feed():
    # the shape is a graph input with an initializer (its default, as IR 3 lists every
    # initializer): the default's dims while it is not fed, the fed shape's otherwise
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="the_node")
    g = helper.make_graph([node], "g", [_vi("x", T.FLOAT), _vi("s", T.INT64, [2])], [_vi("y", T.FLOAT)],
                          [numpy_helper.from_array(np.array([4, 4], np.int64), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(m)
    x = _values(np.float32, (2, 8), 0)
    for feeds, shape in [({"x": x}, (4, 4)), ({"x": x}, (4, 4)), ({"x": x, "s": np.array([8, 2], np.int64)}, (8, 2)),
                         ({"x": x}, (4, 4)), ({"x": x, "s": np.array([1, 16], np.int64)}, (1, 16))]:
        got = rep.run(feeds)[0]
        assert got.shape == shape and got.tobytes() == x.tobytes()
    assert _step_name(rep) == "reshape_default"
    with pytest.raises(backend.NodeError, match="the_node"):
        rep.run({"x": x, "s": np.array([3, 5], np.int64)})
