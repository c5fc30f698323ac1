"""QDQ fusion (qlinear.qdq): each rule against onnxruntime 1.32's own optimizer and session.

For every case the fused graph must contain the same quantized operators, QuantizeLinear and
DequantizeLinear nodes as the graph onnxruntime's optimizer writes (``optimized_model_filepath``),
positive cases and negative ones (a condition broken: neither fuses). Where qlinear has the
fused operator's kernel, the outputs of ``qlinear.backend.prepare(model)`` must equal
onnxruntime's normal session bit for bit. Weights are 7-bit ([-64, 63]) so that onnxruntime's
uint8 x int8 kernels do not saturate on AVX2 CPUs without VNNI.
"""

from __future__ import annotations

import collections
import glob
import json
import os

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from conftest import shared_models_dir  # noqa: E402
from qlinear import backend  # noqa: E402
from qlinear.qdq import FUSED_OPS, fuse_qdq  # noqa: E402
from qdq_models import I8, U8, Builder, op_counts, ort_optimized, ort_run  # noqa: E402

MS = "com.microsoft"
_QUANT = {"QuantizeLinear", "DequantizeLinear"} | {
    (d + "." if d else "") + o for d, o in FUSED_OPS}


def quant_ops(model: onnx.ModelProto) -> collections.Counter:
    """Counts of the operators the QDQ rules produce or leave: Q, DQ and the fused ones."""
    return collections.Counter({k: v for k, v in op_counts(model).items() if k in _QUANT})


def check(model: onnx.ModelProto, expect: dict[str, int], feeds: dict | None = None,
          options: dict | None = None, **fuse_kw) -> onnx.ModelProto:
    """The fused graph has ``expect``'s operator counts, the same quantized operators as
    onnxruntime's optimized graph, and (when qlinear has the kernels) the same outputs."""
    fused = fuse_qdq(model, **fuse_kw)
    ours = quant_ops(fused)
    for op, n in expect.items():
        assert op_counts(fused)[op] == n, f"{op}: {op_counts(fused)[op]} != {n}\n{ours}"
    theirs = quant_ops(ort_optimized(model, options))
    assert ours == theirs, f"qlinear {dict(ours)} != onnxruntime {dict(theirs)}"
    onnx.checker.check_model(fused)
    if feeds is not None:
        emitted = {(n.domain, n.op_type) for n in fused.graph.node} & FUSED_OPS
        missing = emitted - backend.fusable_ops()
        if missing:
            pytest.skip(f"qlinear has no kernel yet for {sorted(o for _, o in missing)}")
        got = backend.QLinearRep(fused).run(feeds)
        want = ort_run(model, feeds, options=options)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    return fused


def rng(seed=0):
    return np.random.default_rng(seed)


def w7(shape, seed=1):
    """7-bit int8 weights: onnxruntime's u8 x s8 kernels are exact on every x86 with them."""
    return rng(seed).integers(-64, 64, shape).astype(I8)


def image(shape, seed=2, lo=-1.0, hi=1.0):
    return rng(seed).uniform(lo, hi, shape).astype(np.float32)


# --------------------------------------------------------------------------- Conv


def conv_model(*, xdt=U8, wdt=I8, bias=True, bias_factor=1.0, act=None, opset=13,
               x_pair=True, y_consumers=1, out_q=True):
    b = Builder(opset)
    x = b.input("x", [1, 4, 7, 7])
    xs, ws = 0.01, 0.02
    xz = 128 if xdt == U8 else 3
    if x_pair:
        xd = b.qdq(x, xs, xz, xdt)
    else:  # an 8-bit graph input straight into a DQ
        b.inputs[-1] = onnx.helper.make_tensor_value_info(
            "x", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(xdt)), [1, 4, 7, 7])
        xd = b.dq(x, xs, xz, xdt)
    wv = w7((6, 4, 3, 3)) if wdt == I8 else rng(1).integers(0, 256, (6, 4, 3, 3)).astype(U8)
    ins = [xd, b.dq(b.const(wv, "w"), ws, 0 if wdt == I8 else 128, wdt)]
    if bias:
        bq = rng(3).integers(-2000, 2000, 6).astype(np.int32)
        ins.append(b.dq(b.const(bq, "b"), np.float32(np.float32(xs) * np.float32(ws)) * bias_factor,
                        0, np.int32))
    y = b.node("Conv", ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if act == "relu":
        y = b.node("Relu", [y])
    elif act is not None:
        lo, hi = act
        y = b.node("Clip", [y, b.const(np.float32(lo)), b.const(np.float32(hi))])
    outs = []
    if not out_q:
        return b.model([y])
    lowest = 0 if xdt == U8 else -128
    yz = lowest if act is not None else (128 if xdt == U8 else 0)
    ys = 6 / 255 if act is not None else 0.05
    yq = b.q(y, ys, yz, xdt)
    outs.append(b.dq(yq, ys, yz, xdt))
    if y_consumers == 2:
        outs.append(b.node("Sigmoid", [y]))
    return b.model(outs)


def feeds_x(model, lo=-1.0, hi=1.0):
    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    dt = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    if dt == np.float32:
        return {vi.name: image(shape, lo=lo, hi=hi)}
    return {vi.name: rng(4).integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, shape).astype(dt)}


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
def test_conv_fuses_to_qlinearconv_bit_exact(opset):
    m = conv_model(opset=opset)
    check(m, {"QLinearConv": 1, "Conv": 0}, feeds_x(m))


def test_conv_without_bias():
    m = conv_model(bias=False)
    check(m, {"QLinearConv": 1}, feeds_x(m))


def test_conv_int8_activations_become_uint8():
    m = conv_model(xdt=I8)
    fused = check(m, {"QLinearConv": 1}, feeds_x(m))
    conv = [n for n in fused.graph.node if n.op_type == "QLinearConv"][0]
    zp = {i.name: i for i in fused.graph.initializer}[conv.input[2]]
    assert zp.data_type == onnx.TensorProto.UINT8  # QDQS8ToU8: the pair is now uint8


def test_conv_int8_allowed_keeps_int8():
    m = conv_model(xdt=I8)
    fused = fuse_qdq(m, int8_allowed=True)
    conv = [n for n in fused.graph.node if n.op_type == "QLinearConv"][0]
    zp = {i.name: i for i in fused.graph.initializer}[conv.input[2]]
    assert zp.data_type == onnx.TensorProto.INT8


def test_conv_int8_graph_input_not_fused():
    m = conv_model(xdt=I8, x_pair=False)
    check(m, {"QLinearConv": 0, "Conv": 1}, feeds_x(m))


def test_conv_uint8_graph_input_fused():
    m = conv_model(x_pair=False)
    check(m, {"QLinearConv": 1}, feeds_x(m))


def test_conv_uint8_weights():
    m = conv_model(wdt=U8)
    check(m, {"QLinearConv": 1}, feeds_x(m))


@pytest.mark.parametrize("factor,fused", [(1.0, 1), (1.009, 1), (0.991, 1), (1.02, 0), (0.95, 0)])
def test_conv_bias_scale_must_match(factor, fused):
    m = conv_model(bias_factor=factor)
    check(m, {"QLinearConv": fused}, feeds_x(m))


def test_conv_relu_absorbed():
    m = conv_model(act="relu")
    check(m, {"QLinearConv": 1, "Relu": 0}, feeds_x(m))


def test_conv_clip_0_6_absorbed():
    m = conv_model(act=(0.0, 6.0))
    check(m, {"QLinearConv": 1, "Clip": 0}, feeds_x(m))


def test_conv_clip_0_2_kept():
    m = conv_model(act=(0.0, 2.0))
    check(m, {"QLinearConv": 0, "Clip": 1}, feeds_x(m))


def test_conv_output_with_non_q_consumer_not_fused():
    m = conv_model(y_consumers=2)
    check(m, {"QLinearConv": 0})


def test_conv_without_q_not_fused():
    m = conv_model(out_q=False)
    check(m, {"QLinearConv": 0})


@pytest.mark.parametrize("per_channel", [False, True])
def test_float_bias_is_quantized_and_conv_fuses(per_channel):
    # WeightBiasQuantization: a float bias becomes int32 with scale x_scale * w_scale
    b = Builder()
    x = b.input("x", [1, 4, 7, 7])
    ws = rng(9).uniform(0.01, 0.03, 6).astype(np.float32) if per_channel else 0.02
    wd = b.dq(b.const(w7((6, 4, 3, 3)), "w"), ws, np.zeros(6, I8) if per_channel else 0, I8,
              axis=0 if per_channel else None)
    bias = b.const(np.linspace(-1, 1, 6).astype(np.float32), "b")
    y = b.node("Conv", [b.qdq(x, 0.01, 128), wd, bias], kernel_shape=[3, 3])
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {"QLinearConv": 1}, feeds_x(m))


def test_float_bias_of_gemm_is_quantized():
    b = Builder()
    a = b.input("a", [2, 8])
    bias = b.const(np.linspace(-1, 1, 5).astype(np.float32), "b")
    y = b.node("Gemm", [b.qdq(a, 0.02, 128), b.dq(b.const(w7((5, 8)), "w"), 0.03, 0, I8), bias],
               transB=1)
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {f"{MS}.QGemm": 1}, feeds_x(m))


def test_float_bias_kept_without_q_after():
    b = Builder()
    x = b.input("x", [1, 4, 7, 7])
    wd = b.dq(b.const(w7((6, 4, 3, 3)), "w"), 0.02, 0, I8)
    bias = b.const(np.linspace(-1, 1, 6).astype(np.float32), "b")
    y = b.node("Conv", [b.qdq(x, 0.01, 128), wd, bias], kernel_shape=[3, 3])
    m = b.model([y])
    check(m, {"QLinearConv": 0, "DequantizeLinear": 2})


def test_shared_dq_is_duplicated_and_both_convs_fuse():
    b = Builder()
    x = b.input("x", [1, 2, 5, 5])
    xd = b.qdq(x, 0.01, 128)
    outs = []
    for k in range(2):
        wd = b.dq(b.const(w7((3, 2, 1, 1), seed=k), "w"), 0.03, 0, I8)
        y = b.node("Conv", [xd, wd], kernel_shape=[1, 1])
        outs.append(b.dq(b.q(y, 0.02, 128), 0.02, 128))
    m = b.model(outs)
    check(m, {"QLinearConv": 2}, feeds_x(m))


def test_int8_pair_with_two_consumers_stays_int8_and_blocks_fusion():
    # mobilenetv2's residual branches: Q -> DQ feeding Conv and Add; EnsureUniqueDQ gives the Q
    # two DQs, so QDQS8ToU8 leaves that pair int8 and the producing Conv's types differ.
    b = Builder()
    x = b.input("x", [1, 2, 5, 5])
    xd = b.qdq(x, 0.01, 0, I8)
    y = b.node("Conv", [xd, b.dq(b.const(w7((2, 2, 1, 1)), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    yq = b.q(y, 0.02, -3, I8)
    d = b.dq(yq, 0.02, -3, I8)
    z = b.node("Conv", [d, b.dq(b.const(w7((2, 2, 1, 1), 5), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    s = b.node("Add", [z, d])
    m = b.model([s])
    check(m, {"QLinearConv": 0}, feeds_x(m))


# --------------------------------------------------------------------------- MatMul, Gemm


def matmul_model(*, out_q=True, per_column=False, adt=U8, a_pair=True):
    b = Builder()
    a = b.input("a", [3, 8])
    ad = b.qdq(a, 0.02, 100 if adt == U8 else 0, adt) if a_pair else None
    ws = rng(6).uniform(0.01, 0.05, 5).astype(np.float32) if per_column else 0.03
    wz = np.zeros(5, I8) if per_column else 0
    wd = b.dq(b.const(w7((8, 5)), "w"), ws, wz, I8, axis=1 if per_column else None)
    y = b.node("MatMul", [ad, wd])
    if out_q:
        y = b.dq(b.q(y, 0.1, 120), 0.1, 120)
    return b.model([y])


def test_matmul_to_qlinearmatmul_bit_exact():
    m = matmul_model()
    check(m, {"QLinearMatMul": 1}, feeds_x(m))


def test_matmul_per_column_weights():
    m = matmul_model(per_column=True)
    check(m, {"QLinearMatMul": 1}, feeds_x(m))


def test_matmul_without_q_to_matmulintegertofloat():
    m = matmul_model(out_q=False)
    check(m, {f"{MS}.MatMulIntegerToFloat": 1}, feeds_x(m))


def test_matmul_int8_activation_pair_converted():
    m = matmul_model(adt=I8)
    check(m, {"QLinearMatMul": 1}, feeds_x(m))


@pytest.mark.parametrize("case", ["b per row", "b 3-D per column", "b 3-D per batch", "a per row",
                                  "a per column"])
def test_matmul_per_axis_parameters_qlinearmatmul_cannot_take_stay_unfused(case):
    """Measured (onnxruntime 1.32): a MatMul whose weight DequantizeLinear quantizes along K
    (per row of a 2-D B), or any axis of a 3-D B, or whose activation DequantizeLinear is per
    axis, is not fused into QLinearMatMul (a 2-D B per column, and per-tensor parameters, are:
    test_matmul_per_column_weights). qlinear fused them all: a per-row B then failed at run
    time ('b_zero_point must have one element ...'), the others ran in integers where
    onnxruntime rounds in float."""
    b = Builder()
    x = b.input("a", [3, 8])
    if case.startswith("a"):
        axis, n = (0, 3) if case == "a per row" else (1, 8)
        ad = b.dq(b.q(x, 0.02, 100), rng(7).uniform(0.01, 0.03, n).astype(np.float32),
                  np.full(n, 100, U8), U8, axis=axis)
        wd = b.dq(b.const(w7((8, 5)), "w"), 0.03, 0, I8)
    else:
        ad = b.qdq(x, 0.02, 100)
        shape, axis = {"b per row": ((8, 5), 0), "b 3-D per column": ((2, 8, 5), 2),
                       "b 3-D per batch": ((2, 8, 5), 0)}[case]
        n = shape[axis]
        wd = b.dq(b.const(w7(shape), "w"), rng(6).uniform(0.01, 0.05, n).astype(np.float32),
                  np.zeros(n, I8), I8, axis=axis)
    y = b.dq(b.q(b.node("MatMul", [ad, wd]), 0.1, 120), 0.1, 120)
    m = b.model([y])
    check(m, {"QLinearMatMul": 0}, feeds_x(m), ops=backend.fusable_ops())
    backend.prepare(m).run(feeds_x(m))


def _per_axis_dq(b, x, n=3, axis=1):
    return b.dq(b.q(x, 0.02, 128), np.full(n, 0.02, np.float32), np.full(n, 128, U8), U8, axis=axis)


def _per_axis_q(b, y, n):
    q = b.node("QuantizeLinear", [y, b.const(np.full(n, 0.05, np.float32), "s"),
                                  b.const(np.full(n, 128, U8), "z")], axis=1)
    return b.dq(q, np.full(n, 0.05, np.float32), np.full(n, 128, U8), U8, axis=1)


@pytest.mark.parametrize("case", ["Add in", "Add out", "Mul in", "Mul out", "Concat in",
                                  "Softmax in", "MatMul out", "Gemm out"])
def test_groups_with_per_axis_activations_stay_unfused(case):
    """Measured (onnxruntime 1.32): Add, Mul, Concat and Softmax groups whose activation
    DequantizeLinear, and Add, Mul, MatMul and Gemm groups whose QuantizeLinear, quantize per
    axis stay in float there (onnxruntime runs them); qlinear fused them into kernels that take
    one scale and failed at run time ('A_scale must be a scalar'). (Where onnxruntime fuses such a
    group anyway — Sigmoid, LeakyRelu, AveragePool, GlobalAveragePool, Where, Conv — its
    session fails too, at load or at run time, as qlinear's run does; the unary ones qlinear
    refuses at prepare, saying so:
    test_unary_groups_onnxruntime_fuses_and_fails_on_are_refused_saying_why.)"""
    op, where = case.split()
    b = Builder()
    shape = [3, 8] if op in ("MatMul", "Gemm") else [2, 3]
    x = b.input("x", shape)
    if op in ("MatMul", "Gemm"):
        y = b.node(op, [b.qdq(x, 0.02, 100), b.dq(b.const(w7((8, 5)), "w"), 0.03, 0, I8)])
        m = b.model([_per_axis_q(b, y, 5)])
    else:
        xd = _per_axis_dq(b, x) if where == "in" else b.qdq(x, 0.02, 128)
        if op in ("Add", "Mul"):
            ins = [xd, b.dq(b.const(rng(5).integers(0, 256, (2, 3)).astype(U8), "c"), 0.03, 100, U8)]
        elif op == "Concat":
            ins = [xd, b.qdq(x, 0.03, 100)]
        else:
            ins = [xd]
        y = b.node(op, ins, **({"axis": 0} if op == "Concat" else {}))
        m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128) if where == "in" else _per_axis_q(b, y, 3)])
    fused = {"Add": f"{MS}.QLinearAdd", "Mul": f"{MS}.QLinearMul", "Concat": f"{MS}.QLinearConcat",
             "Softmax": f"{MS}.QLinearSoftmax", "MatMul": "QLinearMatMul", "Gemm": f"{MS}.QGemm"}[op]
    check(m, {fused: 0}, feeds_x(m), ops=backend.fusable_ops())


def _check_fused_failure_refused(b, y, op: str, where: str, fused: str) -> None:
    """The group ending in ``y`` (its Q per axis when ``where`` is "out"): onnxruntime's
    session fails on the node it fuses the group into, qlinear's prepare refuses the fusion
    naming the per-axis DQ or Q and why, and --qdq literal runs the graph as onnxruntime's
    unoptimized session does, within one output step (float operators such as AveragePool or
    Conv sum in another order, so a value on a rounding tie may land on the neighbouring
    step; compare reports that as float arithmetic)."""
    m = b.model([_per_axis_q(b, y, 3) if where == "out" else b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    feeds = feeds_x(m)
    with pytest.raises(Exception):  # onnxruntime: fused, then its session fails
        ort_run(m, feeds)
    qdq = "DequantizeLinear" if where == "in" else "QuantizeLinear"
    with pytest.raises(ValueError, match=rf"^prepare: {op} .*: its {qdq} .* is per axis \(3 scales\); "
                                         rf"onnxruntime fuses the group into {fused} anyway and its "
                                         r"session then fails on the fused node"):
        backend.prepare(m)
    literal, want = backend.prepare(m, qdq="literal").run(feeds)[0], ort_run(m, feeds, level="none")[0]
    assert literal.shape == want.shape and np.abs(literal - want).max() <= 0.05 + 1e-6


@pytest.mark.parametrize("op", ["Sigmoid", "LeakyRelu", "AveragePool", "GlobalAveragePool"])
@pytest.mark.parametrize("where", ["in", "out"])
def test_unary_groups_onnxruntime_fuses_and_fails_on_are_refused_saying_why(op, where):
    """Measured (onnxruntime 1.32): a Sigmoid, LeakyRelu, AveragePool or GlobalAveragePool group
    with a per-axis DQ or Q is fused anyway and the session fails on the fused node (at load or
    at run time). qlinear failed too, in its own fused node ("node 'yq'
    (com.microsoft.QLinearSigmoid-1): qlinear_sigmoid: Y_scale must be a scalar"), a node the
    model does not have; it refuses the fusion saying why, and --qdq literal runs the graph."""
    b = Builder()
    x = b.input("x", [2, 3, 4, 4])
    xd = _per_axis_dq(b, x) if where == "in" else b.qdq(x, 0.02, 128)
    attrs = {"LeakyRelu": {"alpha": 0.1}, "AveragePool": {"kernel_shape": [2, 2]}}.get(op, {})
    y = b.node(op, [xd], **attrs)
    _check_fused_failure_refused(b, y, op, where, f"com.microsoft QLinear{op}")


@pytest.mark.parametrize("op", ["Conv", "Where"])
@pytest.mark.parametrize("where", ["in", "out"])
def test_conv_and_where_groups_onnxruntime_fuses_and_fails_on_are_refused_saying_why(op, where):
    """Measured (onnxruntime 1.32): a Conv or Where group with a per-axis activation DQ or a
    per-axis Q is fused anyway (QLinearConv, com.microsoft QLinearWhere), and the session
    then fails (QLinearConv at run time: 'zero point must be a scalar'; QLinearWhere when it
    builds its lookup table). qlinear failed in its own fused node ("node 'Conv15'
    (QLinearConv-10): qlinear_conv: x_scale must be a scalar"); it refuses the fusion at
    prepare saying why, and --qdq literal runs the graph (a per-channel weight DQ of a Conv
    still fuses: test_conv_fuses_to_qlinearconv_bit_exact)."""
    b = Builder()
    x = b.input("x", [2, 3, 4, 4])
    xd = _per_axis_dq(b, x) if where == "in" else b.qdq(x, 0.02, 128)
    if op == "Conv":
        w = b.const(np.random.default_rng(0).integers(-127, 128, (3, 3, 3, 3)).astype(np.int8), "w")
        wd = b.node("DequantizeLinear", [w, b.const(np.float32(0.01), "ws"), b.const(np.int8(0), "wz")])
        y = b.node("Conv", [xd, wd], pads=[1, 1, 1, 1])
        fused = "QLinearConv"
    else:
        c = b.const(np.random.default_rng(1).integers(0, 2, (2, 3, 4, 4)).astype(bool), "c")
        y = b.node("Where", [c, xd, b.qdq(x, 0.02, 128)])
        fused = "com.microsoft QLinearWhere"
    _check_fused_failure_refused(b, y, op, where, fused)


def test_compare_says_which_graph_its_node_rows_are():
    """compare's node rows are the fused graph with --qdq fuse and the graph as written with
    --qdq literal; neither the text nor --json said which (a QDQ model's rows named
    QLinearConv nodes the model does not have). Both say it now, and with --qdq literal an
    output that onnxruntime's fusions change points to --qdq fuse."""
    from qlinear.tools.compare import compare_model, format_report

    m = conv_model()
    feeds = feeds_x(m)
    fused = compare_model(m, feeds, show_progress=False, timing_budget=0.0, timing_runs=1)
    assert (fused["qdq"], fused["qdq_fused"]) == ("fuse", True)
    assert "QLinearConv" in {r["op"] for r in fused["nodes"]}
    assert format_report(fused).splitlines()[0].endswith(
        "both on the graph after onnxruntime's QDQ fusions (--qdq fuse)")
    literal = compare_model(m, feeds, show_progress=False, timing_budget=0.0, timing_runs=1,
                            qdq="literal")
    assert (literal["qdq"], literal["qdq_fused"]) == ("literal", False)
    assert "QLinearConv" not in {r["op"] for r in literal["nodes"]}
    assert format_report(literal).splitlines()[0].endswith("(fusions off)")
    literal["outputs"][0]["instrumented_differs"] = True  # as where onnxruntime's fusion rounds otherwise
    assert "--qdq fuse runs qlinear on the graph as onnxruntime fuses it" in format_report(literal)


def _softmax_per_axis_q(scales, zps, opset=13):
    b = Builder(opset)
    x = b.input("x", [2, 3])
    y = b.node("Softmax", [b.qdq(x, 0.02, 128)], axis=-1)
    q = b.node("QuantizeLinear", [y, b.const(np.asarray(scales, np.float32), "s"),
                                  b.const(np.asarray(zps, U8), "z")], axis=1)
    return b.model([q])


def test_softmax_with_a_per_axis_quantize_is_refused_when_fused_saying_why():
    """Measured (onnxruntime 1.32): DQ -> Softmax -> per-axis Q is fused into QLinearSoftmax,
    which quantizes with the first scale and zero point only (its result is that of the same
    model with those two alone, not the model's arithmetic). qlinear fused it too and then
    failed in its own fused node ("node 'q' (com.microsoft.QLinearSoftmax-1): qlinear_softmax:
    y_scale must be a scalar"), naming a node the model does not have. It refuses the fusion,
    saying why; --qdq literal runs the model as written, as onnxruntime does unoptimized."""
    scales, zps = [1 / 256, 1 / 128, 1 / 64], [0, 10, 20]
    m = _softmax_per_axis_q(scales, zps)
    feeds = {"x": image([2, 3], lo=-3, hi=3)}
    assert op_counts(ort_optimized(m))[f"{MS}.QLinearSoftmax"] == 1  # onnxruntime fuses it
    first = ort_run(_softmax_per_axis_q(scales[0], zps[0]), feeds)[0]
    np.testing.assert_array_equal(ort_run(m, feeds)[0], first)  # ... with the first scale only
    literal = ort_run(m, feeds, level="none")[0]
    assert (literal != first).any()  # which is not the model's arithmetic
    with pytest.raises(ValueError, match=r"Softmax .*QuantizeLinear .* per axis \(3 scales\); "
                                         r"onnxruntime fuses .* first scale and zero point only"
                                         r".*--qdq literal"):
        backend.prepare(m)
    np.testing.assert_array_equal(backend.prepare(m, qdq="literal").run(feeds)[0], literal)


@pytest.mark.parametrize("trans_b,axis,fused", [(1, 0, 1), (1, 1, 0), (0, 1, 1), (0, 0, 0)])
def test_gemm_per_axis_weights_fuse_only_per_column(trans_b, axis, fused):
    """Measured (onnxruntime 1.32): a Gemm whose weight DequantizeLinear is per column of the
    product (N: axis 0 of a transposed B, axis 1 otherwise) becomes QGemm; per K it stays a
    float Gemm. qlinear fused both, and the QGemm per K failed at run time."""
    b = Builder()
    a = b.input("a", [2, 8])
    shape = (5, 8) if trans_b else (8, 5)
    n = shape[axis]
    wd = b.dq(b.const(w7(shape), "w"), rng(6).uniform(0.01, 0.05, n).astype(np.float32),
              np.zeros(n, I8), I8, axis=axis)
    y = b.node("Gemm", [b.qdq(a, 0.02, 128), wd], transB=trans_b)
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {f"{MS}.QGemm": fused}, feeds_x(m), ops=backend.fusable_ops())


def gemm_model(*, out_q=True, beta=1.0, bias=True, trans_b=1, alpha=1.0):
    b = Builder()
    a = b.input("a", [2, 8])
    ad = b.qdq(a, 0.02, 128)
    w = w7((5, 8)) if trans_b else w7((8, 5))
    ins = [ad, b.dq(b.const(w, "w"), 0.03, 0, I8)]
    if bias:
        ins.append(b.dq(b.const(np.arange(5, dtype=np.int32) * 50, "b"),
                        np.float32(0.02) * np.float32(0.03), 0, np.int32))
    y = b.node("Gemm", ins, transB=trans_b, alpha=alpha, beta=beta)
    if out_q:
        y = b.dq(b.q(y, 0.05, 128), 0.05, 128)
    return b.model([y])


def test_gemm_to_qgemm():
    m = gemm_model()
    check(m, {f"{MS}.QGemm": 1}, feeds_x(m))


def test_gemm_float_output_to_qgemm():
    m = gemm_model(out_q=False)
    check(m, {f"{MS}.QGemm": 1}, feeds_x(m))


def test_gemm_beta_not_1_with_bias_not_fused():
    m = gemm_model(beta=0.5)
    check(m, {f"{MS}.QGemm": 0})


def test_gemm_alpha_not_1_with_bias_not_fused():
    m = gemm_model(alpha=0.5)
    check(m, {f"{MS}.QGemm": 0})


def test_gemm_alpha_without_bias_fused():
    m = gemm_model(alpha=0.5, bias=False)
    check(m, {f"{MS}.QGemm": 1}, feeds_x(m))


def test_gemm_no_bias_no_transpose():
    m = gemm_model(bias=False, trans_b=0)
    check(m, {f"{MS}.QGemm": 1}, feeds_x(m))


# --------------------------------------------------------------------------- element-wise


def binary_model(op, *, bdt=U8, same_scale=False):
    b = Builder()
    x = b.input("x", [2, 3, 4])
    y = b.input("y", [2, 3, 4])
    xd = b.qdq(x, 0.01, 128)
    yd = b.qdq(y, 0.01 if same_scale else 0.013, 120 if bdt == U8 else 0, bdt)
    z = b.node(op, [xd, yd])
    return b.model([b.dq(b.q(z, 0.02, 128), 0.02, 128)])


def two_feeds(model):
    return {vi.name: image([d.dim_value for d in vi.type.tensor_type.shape.dim], seed=k)
            for k, vi in enumerate(model.graph.input)}


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_binary(op):
    m = binary_model(op)
    check(m, {f"{MS}.QLinear{op}": 1}, two_feeds(m))


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_binary_mixed_types_not_fused(op):
    # x stays uint8, y is int8 turned uint8 by QDQS8ToU8: both uint8, so it does fuse
    m = binary_model(op, bdt=I8)
    check(m, {f"{MS}.QLinear{op}": 1})


def test_binary_int8_not_converted_not_fused():
    # an int8 graph input straight into DQ stays int8; with a uint8 operand the types differ
    b = Builder()
    x = b.input("x", [4], onnx.TensorProto.INT8)
    y = b.input("y", [4])
    z = b.node("Add", [b.dq(x, 0.01, 0, I8), b.qdq(y, 0.01, 128)])
    m = b.model([b.dq(b.q(z, 0.02, 128), 0.02, 128)])
    check(m, {f"{MS}.QLinearAdd": 0})


def unary_model(op, opset=13, **attrs):
    b = Builder(opset)
    x = b.input("x", [1, 3, 4, 4])
    xd = b.qdq(x, 0.02, 128)
    y = b.node(op, [xd], **attrs)
    ys, yz = (1 / 256, 0) if op in ("Sigmoid", "Softmax") else (0.02, 128)
    return b.model([b.dq(b.q(y, ys, yz), ys, yz)])


@pytest.mark.parametrize("op,attrs", [
    ("Sigmoid", {}), ("LeakyRelu", {"alpha": 0.1}), ("Softmax", {"axis": -1}),
    ("AveragePool", {"kernel_shape": [2, 2]}), ("GlobalAveragePool", {}),
])
def test_unary(op, attrs):
    m = unary_model(op, **attrs)
    fused = check(m, {f"{MS}.QLinear{op}": 1}, feeds_x(m))
    if op == "Softmax":
        node = [n for n in fused.graph.node if n.op_type == "QLinearSoftmax"][0]
        assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["opset"] == 13


@pytest.mark.parametrize("dilations", [[2, 2], [1, 1]])
def test_average_pool_19_with_dilations_is_refused_when_fused_saying_why(dilations):
    """AveragePool-19 has dilations; com.microsoft QLinearAveragePool has not. onnxruntime fuses
    the group anyway, copying the attribute, and its session fails to load (measured, also for
    dilations of 1); qlinear's fused node ignored the attribute and answered an undilated pool
    (a (1, 3, 3, 3) output for the model's (1, 3, 2, 2) with dilations 2). Fused: refused,
    naming the node, the attribute and --qdq literal; literal: the model's arithmetic, as
    onnxruntime computes it without its fusions."""
    from qdq_models import ort_session

    m = unary_model("AveragePool", opset=19, kernel_shape=[2, 2], dilations=dilations)
    feeds = feeds_x(m)
    with pytest.raises(Exception, match="Unrecognized attribute: dilations for operator QLinearAveragePool"):
        ort_session(m)
    with pytest.raises(ValueError, match=r"AveragePool '.*': onnxruntime fuses the group into com.microsoft "
                                         r"QLinearAveragePool, which has no attribute 'dilations'.*--qdq literal"):
        backend.prepare(m)
    got = backend.prepare(m, qdq="literal").run(feeds)[0]
    want = ort_run(m, feeds, level="none")[0]
    assert got.shape == want.shape == ((1, 3, 2, 2) if dilations == [2, 2] else (1, 3, 3, 3))
    np.testing.assert_array_equal(got, want)


def test_concat():
    b = Builder()
    x = b.input("x", [1, 2, 3])
    y = b.input("y", [1, 4, 3])
    z = b.node("Concat", [b.qdq(x, 0.01, 128), b.qdq(y, 0.02, 100)], axis=1)
    m = b.model([b.dq(b.q(z, 0.02, 128), 0.02, 128)])
    check(m, {f"{MS}.QLinearConcat": 1}, two_feeds(m))


def test_concat_with_float_input_not_fused():
    b = Builder()
    x = b.input("x", [1, 2, 3])
    y = b.input("y", [1, 4, 3])
    z = b.node("Concat", [b.qdq(x, 0.01, 128), y], axis=1)
    m = b.model([b.dq(b.q(z, 0.02, 128), 0.02, 128)])
    check(m, {f"{MS}.QLinearConcat": 0})


def test_where():
    b = Builder()
    c = b.input("c", [2, 3], onnx.TensorProto.BOOL)
    x = b.input("x", [2, 3])
    y = b.input("y", [2, 3])
    z = b.node("Where", [c, b.qdq(x, 0.01, 128), b.qdq(y, 0.02, 100)])
    m = b.model([b.dq(b.q(z, 0.02, 128), 0.02, 128)])
    feeds = {"c": rng(7).integers(0, 2, (2, 3)).astype(bool), "x": image([2, 3]),
             "y": image([2, 3], seed=8)}
    check(m, {f"{MS}.QLinearWhere": 1}, feeds)


# --------------------------------------------------------------------------- data movement


def drop_model(op, inputs_after=(), *, s2=0.02, z2=128, opset=13, dt=U8, shape=(1, 2, 4, 4),
               **attrs):
    b = Builder(opset)
    x = b.input("x", list(shape))
    xd = b.qdq(x, 0.02, 128 if dt == U8 else 0, dt)
    extra = [b.const(v) if not isinstance(v, str) else v for v in inputs_after]
    y = b.node(op, [xd] + extra, **attrs)
    return b.model([b.dq(b.q(y, s2, z2 if dt == U8 else 0, dt), s2, z2 if dt == U8 else 0, dt)])


DROP_CASES = {
    "Reshape": ((np.array([1, -1], np.int64),), {}),
    "Transpose": ((), {"perm": [0, 2, 3, 1]}),
    "Squeeze": ((np.array([0], np.int64),), {}),
    "Unsqueeze": ((np.array([0], np.int64),), {}),
    "Flatten": ((), {"axis": 1}),
    "Slice": ((np.array([1], np.int64), np.array([3], np.int64), np.array([2], np.int64)), {}),
    "Gather": ((np.array([1, 0], np.int64),), {"axis": 1}),
    "Expand": ((np.array([2, 2, 4, 4], np.int64),), {}),
    "Tile": ((np.array([1, 2, 1, 1], np.int64),), {}),
    "ReduceMax": ((), {"axes": [1]}),
    "ReduceMin": ((), {"axes": [1]}),
}


@pytest.mark.parametrize("op", sorted(DROP_CASES))
def test_drop_qdq_around_data_movement(op):
    extra, attrs = DROP_CASES[op]
    m = drop_model(op, extra, **attrs)
    check(m, {op: 1, "QuantizeLinear": 1, "DequantizeLinear": 1}, feeds_x(m))


@pytest.mark.parametrize("op", ["Reshape", "Transpose"])
def test_drop_needs_equal_scales(op):
    extra, attrs = DROP_CASES[op]
    m = drop_model(op, extra, s2=0.021, **attrs)
    check(m, {"QuantizeLinear": 2, "DequantizeLinear": 2}, feeds_x(m))


def test_drop_needs_equal_zero_points():
    extra, attrs = DROP_CASES["Transpose"]
    m = drop_model("Transpose", extra, z2=127, **attrs)
    check(m, {"QuantizeLinear": 2, "DequantizeLinear": 2}, feeds_x(m))


def test_maxpool_12_dropped():
    m = drop_model("MaxPool", opset=12, kernel_shape=[2, 2])
    check(m, {"MaxPool": 1, "QuantizeLinear": 1}, feeds_x(m))


def test_maxpool_needs_positive_scale():
    b = Builder(12)
    x = b.input("x", [1, 2, 4, 4])
    xq = b.q(x, 0.02, 128)
    y = b.node("MaxPool", [b.dq(xq, -0.02, 128)], kernel_shape=[2, 2])
    m = b.model([b.dq(b.node("QuantizeLinear", [y, b.const(np.float32(-0.02)),
                                                    b.const(np.array(128, U8))]), 0.02, 128)])
    check(m, {"MaxPool": 1, "QuantizeLinear": 2})


def test_maxpool_other_versions_not_dropped():
    m = drop_model("MaxPool", opset=11, kernel_shape=[2, 2])
    check(m, {"QuantizeLinear": 2}, feeds_x(m))


@pytest.mark.parametrize("mode,dropped", [("nearest", True), ("linear", False)])
def test_resize(mode, dropped):
    m = drop_model("Resize", ("", np.array([1, 1, 2, 2], np.float32)), mode=mode)
    # (linear stays a float Resize: its output is not compared bit for bit)
    check(m, {"QuantizeLinear": 1 if dropped else 2}, feeds_x(m) if dropped else None)


def test_split():
    b = Builder()
    x = b.input("x", [1, 4, 3])
    parts = b.node("Split", [b.qdq(x, 0.02, 128)], n_out=2, axis=1)
    outs = [b.dq(b.q(p, 0.02, 128), 0.02, 128) for p in parts]
    m = b.model(outs)
    check(m, {"Split": 1, "QuantizeLinear": 1, "DequantizeLinear": 2}, feeds_x(m))


def test_split_with_different_output_scale_not_dropped():
    b = Builder()
    x = b.input("x", [1, 4, 3])
    parts = b.node("Split", [b.qdq(x, 0.02, 128)], n_out=2, axis=1)
    outs = [b.dq(b.q(parts[0], 0.02, 128), 0.02, 128), b.dq(b.q(parts[1], 0.03, 128), 0.03, 128)]
    m = b.model(outs)
    check(m, {"QuantizeLinear": 3}, feeds_x(m))


def test_argmax_drops_dq():
    b = Builder()
    x = b.input("x", [2, 5])
    y = b.node("ArgMax", [b.qdq(x, 0.02, 128)], axis=1)
    m = b.model([y])
    check(m, {"DequantizeLinear": 0, "ArgMax": 1}, feeds_x(m))


# --------------------------------------------------------------------------- Q/DQ pairs


def double_model(s1=0.02, z1=128, s2=0.015, z2=100, dt=U8):
    b = Builder()
    x = b.input("x", [64])
    y = b.dq(b.q(b.qdq(x, s1, z1, dt), s2, z2, dt), s2, z2, dt)
    return b.model([b.node("Relu", [y])])  # a float consumer: no group fuses


@pytest.mark.parametrize("params", [(0.02, 128, 0.015, 100, U8), (0.02, 0, 0.03, -7, I8),
                                    (0.02, 128, 0.02, 128, U8)])
def test_double_qdq_pairs_collapse(params):
    m = double_model(*params)
    feeds = {"x": np.linspace(-4, 4, 64, dtype=np.float32)}
    check(m, {"QuantizeLinear": 1, "DequantizeLinear": 1}, feeds)


def test_double_qdq_remover_can_be_disabled():
    m = double_model()
    opts = {"session.disable_double_qdq_remover": "1"}
    check(m, {"QuantizeLinear": 2}, {"x": np.linspace(-4, 4, 64, dtype=np.float32)},
          options=opts, double_qdq=False)


def test_relu_before_q_with_nonzero_zero_point_kept():
    b = Builder()
    x = b.input("x", [8])
    r = b.node("Relu", [b.qdq(x, 0.02, 128)])
    m = b.model([b.dq(b.q(r, 0.02, 5), 0.02, 5)])
    check(m, {"Relu": 1})


def test_dq_propagates_across_reshape():
    # QDQPropagation: DQ -> Reshape -> Conv gets a Q/DQ pair after the Reshape, which then runs
    # on integers, and the Conv fuses.
    b = Builder()
    x = b.input("x", [1, 2, 4, 4])
    r = b.node("Reshape", [b.qdq(x, 0.02, 128), b.const(np.array([1, 2, 16, 1], np.int64))])
    y = b.node("Conv", [r, b.dq(b.const(w7((3, 2, 1, 1)), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {"QLinearConv": 1, "Reshape": 1}, feeds_x(m))


# --------------------------------------------------------------------------- API


def test_ops_restricts_what_is_emitted():
    m = binary_model("Add")
    fused = fuse_qdq(m, ops={("", "QLinearConv")})
    assert op_counts(fused)["Add"] == 1 and op_counts(fused)[f"{MS}.QLinearAdd"] == 0


def test_fuse_is_pure():
    m = conv_model()
    before = m.SerializeToString()
    fuse_qdq(m)
    assert m.SerializeToString() == before


def test_fuse_rejects_non_model():
    with pytest.raises(TypeError, match="fuse_qdq: model must be an onnx.ModelProto"):
        fuse_qdq(b"not a model")


def test_prepare_literal_runs_graph_as_written():
    m = conv_model()
    feeds = feeds_x(m)
    literal = backend.prepare(m, qdq="literal")
    assert any(n.op_type == "Conv" for n in literal.model.graph.node)
    want = ort_run(m, feeds, level="basic")  # onnxruntime without QDQ fusion
    got = literal.run(feeds)
    np.testing.assert_allclose(got[0], want[0], atol=0.05 + 1e-6)


def test_prepare_rejects_bad_qdq_mode():
    with pytest.raises(ValueError, match="qdq must be one of fuse, literal; got 'nope'"):
        backend.prepare(conv_model(), qdq="nope")


# --------------------------------------------------------------------------- real models

MODELS_DIR = shared_models_dir() or os.environ.get("QLINEAR_MODELS", "shared/models")
QDQ_MODELS = ["mnist_cntk_ortstatic_qdq", "mobilenetv2-7_qdq_opset10",
              "ultraface_rfb320_ortstatic_qdq", "retinaface_vitisai_qdq"]


def load_real(name: str) -> onnx.ModelProto:
    path = os.path.join(MODELS_DIR, name + ".onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    return onnx.load(path)


def seven_bit_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every constant int8 tensor read by a DequantizeLinear halved into
    [-64, 63] (scales unchanged): onnxruntime's uint8 x int8 kernels are exact on it on every
    x86 CPU, so its session must equal qlinear bit for bit."""
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    dq_inputs = {n.input[0] for n in m.graph.node if n.op_type == "DequantizeLinear"}
    for t in m.graph.initializer:
        if t.name in dq_inputs and t.data_type == onnx.TensorProto.INT8:
            a = numpy_helper.to_array(t)
            if a.size > 1:
                t.CopyFrom(numpy_helper.from_array((a // 2).astype(np.int8), t.name))
    return m


def model_feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    vi = model.graph.input[0]
    shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
    return {vi.name: rng(seed).random(shape, dtype=np.float32)}


ALL_MODELS = sorted(os.path.basename(p)[:-5] for p in
                    glob.glob(os.path.join(MODELS_DIR, "*.onnx"))) or QDQ_MODELS


@pytest.mark.parametrize("name", ALL_MODELS)
def test_real_model_fuses_as_onnxruntime(name):
    # every model, QOperator ones included (their leftover DQ -> op -> Q groups fuse too,
    # e.g. yolov8n's Softmax)
    m = load_real(name)
    ours, theirs = quant_ops(fuse_qdq(m)), quant_ops(ort_optimized(m))
    assert ours == theirs, f"qlinear {dict(ours)} != onnxruntime {dict(theirs)}"
    if name in QDQ_MODELS:
        assert sum(v for k, v in ours.items() if k not in ("QuantizeLinear", "DequantizeLinear"))


def _require_kernels(model: onnx.ModelProto) -> None:
    emitted = {(n.domain, n.op_type) for n in fuse_qdq(model).graph.node} & FUSED_OPS
    missing = emitted - backend.fusable_ops()
    if missing:
        pytest.skip(f"qlinear has no kernel yet for {sorted(o for _, o in missing)}")


@pytest.mark.parametrize("name", QDQ_MODELS)
def test_real_model_outputs_identical_to_onnxruntime(name):
    m = seven_bit_weights(load_real(name))
    _require_kernels(m)
    feeds = model_feeds(m)
    got = backend.prepare(m).run(feeds)
    want = ort_run(m, feeds)
    for o, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, o.name
        assert np.array_equal(g, w), f"{o.name}: {int((g != w).sum())} of {g.size} differ"


@pytest.mark.parametrize("name", ["mnist_cntk_ortstatic_qdq", "mobilenetv2-7_qdq_opset10"])
def test_real_model_full_range_weights_where_onnxruntime_is_exact(name):
    from qlinear.tools.ortsat import onnxruntime_saturates

    if onnxruntime_saturates() is not False:
        pytest.skip("onnxruntime's uint8 x int8 kernels saturate 16-bit sums on this CPU "
                    "(no VNNI); the 7-bit test above covers the fusion")
    m = load_real(name)
    _require_kernels(m)
    feeds = model_feeds(m)
    for g, w in zip(backend.prepare(m).run(feeds), ort_run(m, feeds)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("opset", [21, 22])
@pytest.mark.parametrize("op", ["Reshape", "Transpose", "Squeeze"])
def test_drop_and_propagation_at_newer_opsets(op, opset):
    extra, attrs = DROP_CASES[op]
    m = drop_model(op, extra, opset=opset, **attrs)
    check(m, {op: 1, "QuantizeLinear": 1}, feeds_x(m))
    # DQ -> op -> Conv: the DQ propagates across the op only for the versions onnxruntime lists
    b = Builder(opset)
    x = b.input("x", [1, 2, 4, 4])
    r = b.node("Reshape", [b.qdq(x, 0.02, 128), b.const(np.array([1, 2, 16, 1], np.int64))])
    y = b.node("Conv", [r, b.dq(b.const(w7((3, 2, 1, 1)), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {}, feeds_x(m))


def test_maxpool_at_opset_22():
    m = drop_model("MaxPool", opset=22, kernel_shape=[2, 2])
    check(m, {}, feeds_x(m))


@pytest.mark.parametrize("opset", [12, 22])
def test_dq_propagates_across_maxpool(opset):
    b = Builder(opset)
    x = b.input("x", [1, 2, 4, 4])
    p = b.node("MaxPool", [b.qdq(x, 0.02, 128)], kernel_shape=[2, 2])
    y = b.node("Conv", [p, b.dq(b.const(w7((3, 2, 1, 1)), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128)])
    check(m, {}, feeds_x(m))


# --------------------------------------------------------------------------- CLI


def _cli(capsys, *argv):
    from qlinear import cli

    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_compare_fused_is_identical_and_literal_is_not(tmp_path, capsys):
    # ultraface's last group is Softmax: fused it equals onnxruntime, literal it does not
    m = seven_bit_weights(load_real("ultraface_rfb320_ortstatic_qdq"))
    path = str(tmp_path / "u.onnx")
    onnx.save(m, path)
    np.save(tmp_path / "x.npy", model_feeds(m)["input"])
    verdicts = {}
    for mode in ("fuse", "literal"):
        rc, out, err = _cli(capsys, "compare", path, "--input", f"input={tmp_path / 'x.npy'}",
                            "--qdq", mode, "--json")
        assert rc in (0, 1), err
        r = json.loads(out)
        verdicts[mode] = {o["name"]: o["mismatches"] for o in r["outputs"]}
        if mode == "fuse":
            assert rc == 0 and r["verdict"] == "identical"
            # every integer tensor identical (its unfused float Convs differ by ulps only)
            ints = [row for row in r["nodes"] if row["op"].startswith(("QLinear", "Quantize"))]
            assert ints and all(row["mismatches"] == 0 for row in ints)
    assert verdicts["literal"]["scores"] > 0 and verdicts["literal"]["boxes"] == 0


def test_cli_run_qdq_flag(tmp_path, capsys):
    m = conv_model()
    path = str(tmp_path / "c.onnx")
    onnx.save(m, path)
    rc, out, err = _cli(capsys, "run", path, "--qdq", "literal", "--json")
    assert rc == 0, err
    rc, out, err = _cli(capsys, "run", path, "--qdq", "bogus")
    assert rc == 2 and err.startswith("qlinear: error: argument --qdq: invalid choice: 'bogus'")


# --------------------------------------------------------------------------- random graphs


def random_qdq_model(seed: int) -> onnx.ModelProto:
    """A seeded chain of quantized layers mixing every rule's conditions: uint8/int8 pairs,
    equal or different parameters around data movement, Relu with and without a zero point
    at the type minimum, extra readers of a tensor, residual Adds, Concat branches."""
    r = np.random.default_rng(seed)
    b = Builder(13)
    x = b.input("x", [1, 4, 6, 6])
    dt = U8 if r.random() < 0.5 else I8
    zp = lambda: int(r.integers(100, 156)) if dt == U8 else int(r.integers(-20, 20))  # noqa: E731
    lo = 0 if dt == U8 else -128
    s, z = 0.02, zp()
    cur = b.qdq(x, s, z, dt)
    extra = []
    transposed = False
    for _ in range(int(r.integers(3, 8))):
        kind = r.choice(["conv", "conv_relu", "add", "mul", "sigmoid", "transpose2", "reshape",
                         "maxpool", "concat", "gap"])
        if kind == "transpose2":
            # one Transpose at most: onnxruntime's TransposeOptimizer (not reproduced, see
            # docs/qdq.md) would cancel a pair across the Q/DQ nodes between them
            if transposed:
                continue
            transposed = True
        if kind in ("conv", "conv_relu"):
            w = b.dq(b.const(w7((4, 4, 1, 1), seed=int(r.integers(1 << 30))), "w"), 0.03, 0, I8)
            y = b.node("Conv", [cur, w], kernel_shape=[1, 1])
            if kind == "conv_relu":
                y = b.node("Relu", [y])
                z_out = lo if r.random() < 0.7 else zp()
            else:
                z_out = zp()
        elif kind in ("add", "mul"):
            y = b.node(kind.capitalize(), [cur, b.qdq(b.node("Relu", [cur]), 0.02, zp(), dt)])
            z_out = zp()
        elif kind == "sigmoid":
            y, z_out = b.node("Sigmoid", [cur]), lo
        elif kind == "transpose2":
            y, z_out = b.node("Transpose", [cur], perm=[0, 1, 3, 2]), (z if r.random() < 0.7 else zp())
        elif kind == "reshape":
            y = b.node("Reshape", [cur, b.const(np.array([1, 4, 36, 1], np.int64))])
            y = b.node("Reshape", [y, b.const(np.array([1, 4, 6, 6], np.int64))])
            z_out = z
        elif kind == "maxpool":
            y, z_out = b.node("MaxPool", [cur], kernel_shape=[1, 1]), z
        elif kind == "gap":
            y = b.node("GlobalAveragePool", [cur])
            y = b.node("Expand", [y, b.const(np.array([1, 4, 6, 6], np.int64))])
            z_out = zp()
        else:
            half = b.node("Slice", [cur, b.const(np.array([0], np.int64)),
                                    b.const(np.array([2], np.int64)), b.const(np.array([1], np.int64))])
            y = b.node("Concat", [half, b.qdq(half, 0.02, zp(), dt)], axis=1)
            z_out = zp()
        s_out = s if kind in ("transpose2", "reshape", "maxpool") and r.random() < 0.8 else \
            float(r.choice([0.01, 0.02, 0.05]))
        q = b.q(y, s_out, z_out, dt)
        cur = b.dq(q, s_out, z_out, dt)
        if r.random() < 0.2:  # a second reader of the layer's float output
            extra.append(b.node("Relu", [cur]))
        s, z = s_out, z_out
    return b.model([cur] + extra)


_FLOAT_ARITHMETIC = {"Conv", "Add", "Mul", "Sigmoid", "GlobalAveragePool", "Softmax"}


@pytest.mark.parametrize("seed", range(100))
def test_random_graph_fuses_as_onnxruntime(seed):
    m = random_qdq_model(seed)
    fused = fuse_qdq(m)
    # outputs bit for bit only when no float arithmetic is left (an unfused float
    # GlobalAveragePool rounds its sum differently in onnx.reference and onnxruntime)
    exact = not any(n.op_type in _FLOAT_ARITHMETIC for n in fused.graph.node)
    check(m, {}, feeds_x(m) if exact else None)


@pytest.mark.parametrize("op", ["Slice", "Reshape"])
def test_no_forward_propagation_when_a_reader_is_a_q(op):
    # measured: DQ -> op -> [Conv, Q]: onnxruntime 1.32 inserts nothing, the Conv stays float
    b = Builder()
    x = b.input("x", [1, 4, 6, 6])
    cur = b.qdq(x, 0.02, 128)
    if op == "Slice":
        h = b.node("Slice", [cur, b.const(np.array([0], np.int64)),
                             b.const(np.array([4], np.int64)), b.const(np.array([1], np.int64))])
    else:
        h = b.node("Reshape", [cur, b.const(np.array([1, 4, 36, 1], np.int64))])
    y = b.node("Conv", [h, b.dq(b.const(w7((4, 4, 1, 1)), "w"), 0.03, 0, I8)], kernel_shape=[1, 1])
    m = b.model([b.dq(b.q(y, 0.05, 128), 0.05, 128), b.dq(b.q(h, 0.02, 120), 0.02, 120)])
    check(m, {"QLinearConv": 0, "Conv": 1})
