"""QDQ models of the newer formats (16-bit and 4-bit integers, float8, blocked parameters) run as
onnxruntime 1.32's session runs them, and com.microsoft QuantizeLinear/DequantizeLinear with the
types onnxruntime's contrib kernels take.

For each case the fused graph must have the same QuantizeLinear, DequantizeLinear and fused
operators as the graph onnxruntime's optimizer writes (``optimized_model_filepath``); where the
graph left is exact arithmetic (Q/DQ, data movement, one IEEE operation per element such as Add
or Relu) the outputs must equal onnxruntime's session bit for bit; where onnxruntime's rewrite
fails or changes the model's arithmetic, qlinear refuses the fusion saying why (and the test
shows onnxruntime failing or answering differently from the graph as written).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

pytest.importorskip("onnxruntime")

from qlinear import backend  # noqa: E402
from qlinear.qdq import QDQRefusal, fuse_qdq  # noqa: E402
from qdq_models import Builder, op_counts, ort_optimized, ort_run  # noqa: E402
from test_qdq import quant_ops  # noqa: E402

U8, I8, U16, I16 = np.uint8, np.int8, np.uint16, np.int16
U4, I4 = ml_dtypes.uint4, ml_dtypes.int4
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
MS = "com.microsoft"
NEW_TYPES = [U16, I16, U4, I4, E4M3, E5M2]
_IDS = {U16: "uint16", I16: "int16", U4: "uint4", I4: "int4", E4M3: "e4m3fn", E5M2: "e5m2", U8: "uint8"}


def zp(dt):
    """A zero point inside the type's range, not its minimum."""
    return {U8: 128, I8: 0, U16: 32768, I16: 0, U4: 8, I4: 0}.get(dt, 0.0)


def build(opset: int = 21) -> Builder:
    return Builder(opset)


def model(b: Builder, outs) -> onnx.ModelProto:
    return b.model(list(outs), ir_version=10)


def feeds(m: onnx.ModelProto, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in m.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == T.BOOL:
            out[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[vi.name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return out


def same_graph_as_onnxruntime(m: onnx.ModelProto) -> onnx.ModelProto:
    fused = fuse_qdq(m)
    ours, theirs = quant_ops(fused), quant_ops(ort_optimized(m))
    assert ours == theirs, f"qlinear {dict(ours)} != onnxruntime {dict(theirs)}"
    return fused


def bit_identical(m: onnx.ModelProto, f: dict) -> None:
    got = backend.prepare(m).run(f)
    want = ort_run(m, f)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


# --------------------------------------------------------------------------- groups that stay


def _group(op: str, dt):
    """x -> Q -> DQ -> op -> Q -> DQ with parameters of type ``dt`` (weights constant)."""
    b = build()
    shape = [3, 32] if op in ("MatMul", "MatMulNoQ", "Gemm") else [1, 4, 6, 6]
    x = b.input("x", shape)
    xd = b.qdq(x, 0.01, zp(dt), dt)
    rng = np.random.default_rng(1)
    if op == "Conv":
        w = b.dq(b.const(rng.integers(-4, 4, (6, 4, 3, 3)).astype(dt) if dt not in (U4, U16) else
                         rng.integers(0, 8, (6, 4, 3, 3)).astype(dt), "w"), 0.02, zp(dt), dt)
        y = b.node("Conv", [xd, w], kernel_shape=[3, 3])
    elif op in ("MatMul", "MatMulNoQ", "Gemm"):
        wv = rng.integers(0, 8, (32, 8)).astype(dt)
        w = b.dq(b.const(wv, "w"), 0.02, zp(dt), dt)
        y = b.node("Gemm" if op == "Gemm" else "MatMul", [xd, w])
        if op == "MatMulNoQ":
            return model(b, [y])
    elif op in ("Add", "Mul", "Concat"):
        x2 = b.input("x2", shape)
        y = b.node(op, [xd, b.qdq(x2, 0.02, zp(dt), dt)], **({"axis": 1} if op == "Concat" else {}))
    elif op == "Reshape":
        y = b.node("Reshape", [xd, b.const(np.array([1, -1], np.int64))])
    elif op in ("AveragePool", "MaxPool"):
        y = b.node(op, [xd], kernel_shape=[2, 2])
    else:
        y = b.node(op, [xd])
    return model(b, [b.qdq(y, 0.01 if op in ("Reshape", "Transpose") else 0.03, zp(dt), dt)])


_EXACT_OPS = {"Add", "Mul", "Concat", "Reshape", "Transpose", "Relu"}


@pytest.mark.parametrize("dt", NEW_TYPES, ids=_IDS.get)
@pytest.mark.parametrize("op", ["Conv", "MatMul", "MatMulNoQ", "Gemm", "Add", "Mul", "Concat", "Sigmoid",
                                "Softmax", "AveragePool", "GlobalAveragePool", "Reshape", "Transpose"])
def test_groups_of_the_newer_types_fuse_as_onnxruntime_fuses_them(op, dt):
    """Measured (onnxruntime 1.32): no integer operator takes 16-bit, 4-bit or float8 groups,
    so they run as DQ -> float operator -> Q; 16-bit pairs around data movement are dropped.
    (A 16-bit activation with an 8-bit constant MatMul weight becomes MatMulNBits: issue #30.)
    Where the operators left are exact, the outputs are onnxruntime's bit for bit."""
    m = _group(op, dt)
    fused = same_graph_as_onnxruntime(m)
    if op in ("Reshape", "Transpose") and dt in (U16, I16):
        assert op_counts(fused)["DequantizeLinear"] == 1  # the pair around it dropped
    if op in _EXACT_OPS:
        bit_identical(m, feeds(m))


# --------------------------------------------------------------------------- level-1 and cleanup passes


@pytest.mark.parametrize("dt,z1,z2", [(U16, 30000, 32768), (I16, -5, 7), (U8, 120, 128)], ids=["uint16", "int16", "uint8"])
def test_double_qdq_pairs_of_16_bits_collapse_with_onnxruntimes_parameters(dt, z1, z2):
    """DoubleQDQPairsRemover takes 16-bit pairs in 1.32 (qlinear kept them: 2 pairs where
    onnxruntime has 1); the recomputed scale and zero point give its outputs bit for bit."""
    b = build()
    x = b.input("x", [1, 3, 4, 4])
    d = b.qdq(b.qdq(x, 1e-4, z1, dt), 1.3e-4, z2, dt)
    m = model(b, [b.node("Relu", [d])])
    fused = same_graph_as_onnxruntime(m)
    assert op_counts(fused)["QuantizeLinear"] == 1
    bit_identical(m, feeds(m))


def test_double_qdq_with_two_dequantize_readers_collapses():
    """1.32's DoubleQDQPairsRemover takes a Q2 read by several DQs (every one is rewired)."""
    b = build()
    x = b.input("x", [1, 3, 4, 4])
    q2 = b.q(b.qdq(x, 0.01, 128, U8), 0.02, 120, U8)
    m = model(b, [b.node("Relu", [b.dq(q2, 0.02, 120, U8)]), b.node("Neg", [b.dq(q2, 0.02, 120, U8)])])
    fused = same_graph_as_onnxruntime(m)
    assert op_counts(fused)["QuantizeLinear"] == 1 and op_counts(fused)["DequantizeLinear"] == 2
    bit_identical(m, feeds(m))


@pytest.mark.parametrize("dt,z", [(U16, 0), (I16, -32768), (U8, 0), (U4, 0), (I4, -8)],
                         ids=["uint16", "int16", "uint8", "uint4", "int4"])
def test_relu_before_a_q_at_the_type_minimum_goes_and_the_dq_q_pair_left_is_cleaned_up(dt, z):
    """ReluQuantFusion removes the Relu (16-bit too), then QDQFinalCleanup removes the DQ -> Q
    pair with equal parameters that is left (qlinear kept it: 2 pairs where onnxruntime has 1)."""
    b = build()
    x = b.input("x", [1, 3, 4, 4])
    y = b.node("Relu", [b.qdq(x, 0.01, z, dt)])
    m = model(b, [b.qdq(y, 0.01, z, dt)])
    fused = same_graph_as_onnxruntime(m)
    assert op_counts(fused)["Relu"] == 0 and op_counts(fused)["QuantizeLinear"] == 1
    bit_identical(m, feeds(m))


@pytest.mark.parametrize("dt", [U16, I16], ids=_IDS.get)
@pytest.mark.parametrize("hi,removed", [(1e6, True), (0.5, False)])
def test_clip_before_a_16_bit_q_goes_when_it_covers_the_range(dt, hi, removed):
    b = build()
    x = b.input("x", [1, 3, 4, 4])
    y = b.node("Clip", [b.qdq(x, 0.01, 0, dt), b.const(np.float32(-1e6 if dt == I16 else 0)),
                        b.const(np.float32(hi))])
    m = model(b, [b.qdq(y, 0.01, 0, dt)])
    fused = same_graph_as_onnxruntime(m)
    assert (op_counts(fused)["Clip"] == 0) == removed
    bit_identical(m, feeds(m))


# --------------------------------------------------------------------------- refused, saying why


def _relu_or_clip(op, dt, z):
    b = build()
    x = b.input("x", [1, 3, 4, 4])
    xd = b.qdq(x, 0.01, z, dt)
    y = b.node("Relu", [xd]) if op == "Relu" else \
        b.node("Clip", [xd, b.const(np.float32(0)), b.const(np.float32(1))])
    return model(b, [b.qdq(y, 0.01, z, dt)])


@pytest.mark.parametrize("dt,z", [(U4, 8), (I4, 0), (E4M3, 0.0), (E5M2, 0.0)], ids=["uint4", "int4", "e4m3fn", "e5m2"])
def test_relu_before_a_narrow_q_is_refused_as_onnxruntime_removes_it_wrongly(dt, z):
    """Measured: onnxruntime 1.32 removes a Relu before a Q of any type but 8- and 16-bit
    integers whatever the zero point, so negative inputs come out negative; qlinear refuses
    the fusion (used to keep the Relu: another graph than onnxruntime's, silently)."""
    m = _relu_or_clip("Relu", dt, z)
    f = {"x": np.linspace(-0.05, 0.05, 48, dtype=np.float32).reshape(1, 3, 4, 4)}
    fused, literal = ort_run(m, f)[0], ort_run(m, f, level="none")[0]
    assert fused.min() < 0 <= literal.min()  # onnxruntime's rewrite changes the answer
    with pytest.raises(QDQRefusal, match=r"^Relu .* feeds QuantizeLinear .* with zero point .*: onnxruntime "
                                         r"1\.32 removes such a Relu .* qdq='literal'"):
        fuse_qdq(m)
    got = backend.prepare(m, qdq="literal").run(f)[0]
    np.testing.assert_array_equal(got, literal)


@pytest.mark.parametrize("dt,z", [(U4, 0), (E4M3, 0.0)], ids=["uint4", "e4m3fn"])
def test_clip_before_a_narrow_q_is_refused_as_onnxruntime_fails(dt, z):
    m = _relu_or_clip("Clip", dt, z)
    with pytest.raises(Exception, match="Unexpected data type for QuantizeLinear input y_zero_point"):
        ort_run(m, feeds(m))
    with pytest.raises(QDQRefusal, match=r"^Clip .* ClipQuantFusion takes 8- and 16-bit integers only"):
        fuse_qdq(m)


@pytest.mark.parametrize("op", ["MaxPool", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dt", [U4, I4], ids=_IDS.get)
def test_sub_byte_pairs_around_max_pool_and_reduce_are_refused_as_onnxruntime_fails(op, dt):
    """Measured: onnxruntime drops a 4-bit (or 2-bit) pair around MaxPool, ReduceMax and
    ReduceMin with a positive scale, and its session then fails to load (those operators do
    not take 4-bit data); with a negative scale it keeps the pair, and so does qlinear."""
    for scale, refused in ((0.01, True), (-0.01, False)):
        b = build()
        x = b.input("x", [1, 3, 4, 4])
        y = b.node(op, [b.qdq(x, scale, zp(dt), dt)], **({"kernel_shape": [2, 2]} if op == "MaxPool" else {}))
        m = model(b, [b.qdq(y, scale, zp(dt), dt)])
        if refused:
            with pytest.raises(Exception, match="Type Error"):
                ort_run(m, feeds(m))
            with pytest.raises(QDQRefusal, match=rf"^{op} .* drops the {_IDS[dt]} QuantizeLinear/DequantizeLinear"):
                fuse_qdq(m)
        else:
            same_graph_as_onnxruntime(m)
            bit_identical(m, feeds(m))


def _conv_with_weight_dq(scale_shape, axis, block_size=0):
    b = build()
    x = b.input("x", [1, 4, 6, 6])
    xd = b.qdq(x, 0.01, 128, U8)
    w = np.random.default_rng(1).integers(-64, 64, (6, 4, 3, 3)).astype(I8)
    kw = {"axis": axis, **({"block_size": block_size} if block_size else {})}
    wd = b.node("DequantizeLinear", [b.const(w, "w"), b.const(np.full(scale_shape, 0.02, np.float32)),
                                     b.const(np.zeros(scale_shape, I8))], **kw)
    y = b.node("Conv", [xd, wd], kernel_shape=[3, 3])
    return model(b, [b.qdq(y, 0.05, 128, U8)])


@pytest.mark.parametrize("case", ["per axis 1", "blocked"])
def test_conv_weights_not_per_output_channel_are_refused_as_onnxruntime_fails(case):
    """Measured: onnxruntime fuses a Conv whose weight DQ is per axis 1 or blocked into
    QLinearConv, which then fails ('filter scale shape invalid'); qlinear's fused node failed
    too, naming a node the model does not have. Refused up front; per axis 0 fuses."""
    m = _conv_with_weight_dq((4,), 1) if case == "per axis 1" else _conv_with_weight_dq((6, 2, 3, 3), 1, 2)
    with pytest.raises(Exception, match="filter scale shape invalid"):
        ort_run(m, feeds(m))
    with pytest.raises(QDQRefusal, match=r"^Conv .* its weight's DequantizeLinear .* is (per axis \(4 scales\)|"
                                         r"blocked \(block_size 2, scale shape \[6, 2, 3, 3\]\)); onnxruntime fuses"):
        fuse_qdq(m)
    ok = _conv_with_weight_dq((6,), 0)
    assert op_counts(same_graph_as_onnxruntime(ok))["QLinearConv"] == 1


def _matmul_with_weight_dq(shape, scale_shape, axis, block_size=0, out_q=False):
    b = build()
    x = b.input("x", [3, shape[0]])
    xd = b.qdq(x, 0.01, 128, U8)
    w = np.random.default_rng(1).integers(-64, 64, shape).astype(I8)
    kw = {"axis": axis, **({"block_size": block_size} if block_size else {})}
    wd = b.node("DequantizeLinear", [b.const(w, "w"), b.const(np.linspace(0.01, 0.03, int(np.prod(scale_shape)))
                                                             .astype(np.float32).reshape(scale_shape)),
                                     b.const(np.zeros(scale_shape, I8))], **kw)
    y = b.node("MatMul", [xd, wd])
    return model(b, [b.qdq(y, 0.05, 128, U8) if out_q else y])


def test_matmul_integer_to_float_weights_along_k_or_blocked_are_refused():
    """Measured: a MatMul without Q whose weight DQ is along K (axis 0) or blocked becomes
    MatMulIntegerToFloat anyway; onnxruntime then fails, or, with K = N, applies the row scales
    to the columns (a wrong answer); qlinear refuses it saying which."""
    for m, what in ((_matmul_with_weight_dq((32, 8), (32,), 0), "its session then fails"),
                    (_matmul_with_weight_dq((32, 8), (2, 8), 0, 16), "its session then fails"),
                    (_matmul_with_weight_dq((8, 8), (8,), 0), "applied to its columns")):
        with pytest.raises(QDQRefusal, match=rf"^MatMul .* onnxruntime fuses the group into com.microsoft "
                                             rf"MatMulIntegerToFloat anyway, .*{what}"):
            fuse_qdq(m)
    square = _matmul_with_weight_dq((8, 8), (8,), 0)
    f = feeds(square)
    assert not np.array_equal(ort_run(square, f)[0], ort_run(square, f, level="none")[0])
    np.testing.assert_allclose(backend.prepare(square, qdq="literal").run(f)[0], ort_run(square, f, level="none")[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis,block", [(0, 16), (1, 8)])
def test_blocked_weights_with_a_q_stay_in_float(axis, block):
    """A blocked weight is never "per column" (qlinear took a blocked (32, 1) scale along axis
    1 for per-column parameters and fused a QLinearMatMul onnxruntime does not)."""
    shape = (32 // block, 8) if axis == 0 else (32, 8 // block)
    m = _matmul_with_weight_dq((32, 8), shape, axis, block, out_q=True)
    fused = same_graph_as_onnxruntime(m)
    assert op_counts(fused)["QLinearMatMul"] == 0


# --------------------------------------------------------------------------- com.microsoft Q/DQ


def _ms_qdq(x, scale, zero_point, axis):
    kw = {} if axis is None else {"axis": axis}
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, **kw),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, **kw)]
    outs = [helper.make_tensor_value_info("y", elem, None)]
    if zero_point.dtype.itemsize == 2 or zero_point.dtype == U8:  # the Python binding returns these
        outs.append(helper.make_tensor_value_info("q", helper.np_dtype_to_tensor_dtype(zero_point.dtype), None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(x.shape))], outs,
                          [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero_point, "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("dt", [U4, I4, U16, I16, U8], ids=_IDS.get)
@pytest.mark.parametrize("ft", [np.float32, np.float16])
@pytest.mark.parametrize("axis", [None, 0])
def test_contrib_quantize_dequantize_take_onnxruntimes_types_bit_for_bit(dt, ft, axis):
    """onnxruntime 1.32's com.microsoft QuantizeLinear/DequantizeLinear take uint4/int4 and
    float16 data and scales (measured; qlinear refused them); they compute as the ONNX
    kernels do: Q divides in float32 (NaN to the minimum), DQ multiplies in float32 and
    rounds once to the output type. Ties, NaN, infinities and saturation included."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 700)) * rng.choice([0.1, 3.0, 300.0], (3, 700))).astype(ft)
    x[0, :9] = [np.nan, np.inf, -np.inf, 0.5, -0.5, 1.5, 2.5, -0.0, 1e4]
    if axis is None:
        s, z = np.array(0.37, ft), np.array(1, dt)
    else:
        s, z = np.array([0.37, 0.011, 2.5], ft), np.array([1, 2, 3], dt)
    m = _ms_qdq(x, s, z, axis)
    got = backend.prepare(m).run({"x": x})
    want = ort_run(m, {"x": x}, level="none")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def test_contrib_quantize_linear_still_refuses_what_onnxruntime_refuses():
    """float8 and 2-bit are not among onnxruntime's contrib types: check_model names them."""
    m = _ms_qdq(np.zeros((2, 3), np.float32), np.array(0.5, np.float32), np.array(0, E4M3), None)
    problems = {p.node: p.reason for p in backend.check_model(m)}
    assert any("float8" in r for r in problems.values()), problems
