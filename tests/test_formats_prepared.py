"""The graph's QuantizeLinear / DequantizeLinear of the newer types (versions 19-28) with constant
scale and zero point: the prepared form (``PreparedQuantizeLinear`` / ``PreparedDequantizeLinear``)
is built once, at ``backend.prepare``, gives the plain call's bits on every type, granularity and
engine level, and a bad parameter is refused at prepare time with one sentence naming the node.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper

import oracle
import qlinear
from qlinear import backend
from qlinear.graph.errors import NodeError

E8M0 = ml_dtypes.float8_e8m0fnu
TYPES = {**{n: v[2] for n, v in oracle.INT_TYPES.items()}, **{n: v[4] for n, v in oracle.FLOAT_FORMATS.items()}}
# (x shape, scale shape, axis, block_size); 7 along the blocked axis: a partial last block
GRANS = [((3, 7, 4), (), 1, 0), ((3, 7, 4), (7,), 1, 0), ((3, 7, 4), (3, 3, 4), 1, 3), ((6, 7), (6, 2), -1, 4)]


def _model(op, x, s, z, attrs, opset=28, declare_shape=True, name="n0"):
    inits = [numpy_helper.from_array(s, "s")]
    ins = ["x", "s"]
    if z is not None:
        inits.append(numpy_helper.from_array(z, "z"))
        ins.append("z")
    node = helper.make_node(op, ins, ["y"], name=name, **attrs)
    xt = helper.np_dtype_to_tensor_dtype(x.dtype)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", xt, x.shape if declare_shape else None)],
                          [helper.make_tensor_value_info("y", 0, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 11
    return m


def _node(rep):
    return next(getattr(rt, "guarded_impl", rt) for rt in rep.evaluator.rt_nodes_
                if getattr(rt, "onnx_node", None) is not None and rt.onnx_node.op_type.endswith("antizeLinear"))


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8 if a.dtype.itemsize == 1 else np.uint16 if a.dtype.itemsize == 2
                                        else np.uint32)


@pytest.mark.parametrize("gran", GRANS, ids=lambda g: f"{g[0]}-{g[1]}-b{g[3]}")
@pytest.mark.parametrize("name", list(TYPES))
def test_engine_graph_prepared_matches_plain(name, gran, engine_level):
    """Every type: the backend's node (prepared at backend.prepare, reused on the next run)
    gives the plain call's bits, for QuantizeLinear (float32 and bfloat16 x) and
    DequantizeLinear."""
    t = np.dtype(TYPES[name])
    xs, ss, axis, block = gran
    rng = np.random.default_rng(len(name) * 31 + len(ss))
    attrs = {"axis": axis, "block_size": block} if ss else {}
    for xdt in (np.float32, ml_dtypes.bfloat16):
        x = (rng.normal(0, 40, xs)).astype(np.float32)
        x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -0.0]
        x = x.astype(xdt)
        s = rng.uniform(0.05, 2, ss).astype(np.float32).astype(xdt)
        z = None
        if name.startswith(("int", "uint")):
            lo, hi = oracle.INT_TYPES[name][:2]
            z = rng.integers(lo, hi + 1, ss).astype(np.int64).astype(t)
        sat = {"saturate": 0} if name.startswith("float8") else {}  # (overflow gives inf/NaN)
        a = dict(attrs, output_dtype=helper.np_dtype_to_tensor_dtype(t), **sat)
        rep = backend.prepare(_model("QuantizeLinear", x, s, z, a), qdq="literal")
        node = _node(rep)
        prep = node._newer
        # the 8-bit contract's own case (float32 x and scale, 8-bit output, not blocked) keeps its
        # own prepared form (PreparedQuantize, built at the first run); every other is prepared
        eight = xdt is np.float32 and t == np.uint8 and not block  # (output_dtype int8: the newer path)
        assert (prep is None) == eight
        if not eight:
            assert len(prep._plans) == 1  # built and checked at prepare
        want = qlinear.quantize_linear(x, s, z, output_dtype=t, version=28, **attrs, **sat)
        for _ in range(2):
            got = rep.run({"x": x})[0]
            assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want)), (name, xdt)
        if eight:
            assert node._prepared is not None
        else:  # the same prepared form, no new plan
            assert node._newer is prep and len(prep._plans) == 1
    # DequantizeLinear: every code of the type
    n = int(np.prod(xs))
    if name.startswith(("int", "uint")):
        lo, hi = oracle.INT_TYPES[name][:2]
        codes = (np.arange(n) % (hi - lo + 1) + lo).astype(np.int64).astype(t).reshape(xs)
    else:
        width = {"float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6}.get(t.name, 8)
        codes = (np.arange(n) % (1 << width)).astype(np.uint8).view(t).reshape(xs)
    for sdt, odt in ((np.float32, None), (ml_dtypes.bfloat16, None), (np.float32, np.float16)):
        s = rng.uniform(0.05, 2, ss).astype(np.float32).astype(sdt)
        z = None
        if name.startswith(("int", "uint")):
            lo, hi = oracle.INT_TYPES[name][:2]
            z = rng.integers(lo, hi + 1, ss).astype(np.int64).astype(t)
        a = dict(attrs)
        if odt is not None:
            a["output_dtype"] = helper.np_dtype_to_tensor_dtype(np.dtype(odt))
        rep = backend.prepare(_model("DequantizeLinear", codes, s, z, a), qdq="literal")
        node = _node(rep)
        want = qlinear.dequantize_linear(codes, s, z, output_dtype=odt, version=28, **attrs)
        prep = node._newer
        eight = sdt is np.float32 and odt is None and t in (np.uint8, np.int8) and not block
        assert (prep is None) == eight
        if not eight:
            assert len(prep._plans) == 1
        for _ in range(2):
            got = rep.run({"x": codes})[0]
            assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want)), (name, sdt, odt)
        if eight:
            assert node._prepared is not None
        else:
            assert node._newer is prep and len(prep._plans) == 1


BAD = {
    # name: (op, x, scale, zero point, attributes, words the message must contain)
    "block size that does not match": ("QuantizeLinear", np.zeros((8, 4), np.float32), np.ones((3, 4), np.float32),
                                       None, {"axis": 0, "block_size": 2, "output_dtype": 22}, ["y_scale", "block"]),
    "scale shape of no granularity": ("DequantizeLinear", np.zeros((8, 4), ml_dtypes.int4),
                                      np.ones((5,), np.float32), None, {"axis": 0, "output_dtype": 1}, ["x_scale"]),
    "zero scale": ("QuantizeLinear", np.zeros((8, 4), ml_dtypes.bfloat16), np.zeros((), ml_dtypes.bfloat16),
                   None, {"output_dtype": 17}, ["y_scale", "zero"]),
    "zero point shape": ("DequantizeLinear", np.zeros((8, 4), ml_dtypes.float8_e4m3fn), np.ones((4,), np.float32),
                         np.zeros((2,), ml_dtypes.float8_e4m3fn), {"axis": 1}, ["x_zero_point", "shape"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_parameters_refused_at_prepare(case):
    """A bad constant parameter of a node whose x type and shape the model declares is a
    NodeError from backend.prepare, one sentence naming the node, the input and the
    constraint; without x's declared shape the same error comes at the first run."""
    op, x, s, z, attrs, words = BAD[case]
    with pytest.raises(NodeError) as e:
        backend.prepare(_model(op, x, s, z, attrs, name="bad_node"), qdq="literal")
    msg = str(e.value)
    assert "bad_node" in msg and op in msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    rep = backend.prepare(_model(op, x, s, z, attrs, declare_shape=False, name="bad_node"), qdq="literal")
    with pytest.raises(NodeError) as e2:
        rep.run({"x": x})
    assert str(e2.value) == msg


def test_prepared_only_for_constant_parameters():
    """A scale fed as a graph input is validated on every run (nothing prepared)."""
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(8, 4)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=22)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape),
                                        helper.make_tensor_value_info("s", 1, ())],
                          [helper.make_tensor_value_info("y", 0, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 28)])
    m.ir_version = 11
    rep = backend.prepare(m, qdq="literal")
    for sv in (0.5, 0.25):
        got = rep.run({"x": x, "s": np.array(sv, np.float32)})[0]
        assert np.array_equal(got.view(np.uint8), qlinear.quantize_linear(x, np.float32(sv), output_dtype=ml_dtypes.int4,
                                                                          version=28).view(np.uint8))
    assert _node(rep)._newer is None
