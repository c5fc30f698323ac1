"""onnxruntime's DynamicQuantizeMatMul fusion (qlinear.passes.dynamic_matmul): the groups it
fuses, the ones it leaves, and the same bytes as the graph as written and as onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qlinear import backend
from qlinear.passes.dynamic_matmul import fuse_dynamic_matmul

ort = pytest.importorskip("onnxruntime")

GPT2 = Path("/work/shared/models/tiny_gpt2_ortdynamic.onnx")


def _model(k=24, n=10, per_column=True, extra_use=False, w_input=False):
    """x (3, k) float -> DynamicQuantizeLinear -> MatMulInteger(W int8) -> Cast -> Mul(., xs * ws)."""
    rng = np.random.default_rng(k * n)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    ws = (rng.random(n if per_column else ()) * 0.02 + 0.001).astype(np.float32)
    wz = rng.integers(-5, 5, n if per_column else ()).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"], name="out")]
    outputs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Identity", ["xq"], ["xq2"]))
        outputs.append(helper.make_tensor_value_info("xq2", T.UINT8, None))
    inits = [numpy_helper.from_array(ws, "ws"), numpy_helper.from_array(wz, "wz")]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [3, k])]
    if w_input:
        inputs.append(helper.make_tensor_value_info("w", T.INT8, [k, n]))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w


def _ops(m):
    return sorted((n.domain, n.op_type) for n in m.graph.node)


@pytest.mark.parametrize("per_column", [False, True])
def test_fused_group_gives_the_written_graphs_and_onnxruntimes_bytes(per_column):
    m, _ = _model(per_column=per_column)
    assert _ops(fuse_dynamic_matmul(m)) == [("com.microsoft", "DynamicQuantizeMatMul")]
    fused, literal = backend.prepare(m), backend.prepare(m, qdq="literal")
    assert _ops(fused.model) == [("com.microsoft", "DynamicQuantizeMatMul")]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for i in range(12):
        x = (rng.standard_normal((3, 24)) * 10 ** rng.uniform(-3, 3)).astype(np.float32)
        if i == 0:
            x[:] = 0  # scale 1, zero point 0
        if i == 1:
            x = np.abs(x)  # zero point 0
        for _ in range(2):  # the full call, then the constants' bound path
            y = fused.run({"x": x})[0]
            assert np.array_equal(y, literal.run({"x": x})[0])
            assert np.array_equal(y, sess.run(None, {"x": x})[0])


def test_groups_onnxruntime_leaves_are_left():
    # DynamicQuantizeLinear's quantized output read by another node; W fed at run time
    for kw in ({"extra_use": True}, {"w_input": True}):
        m, _ = _model(**kw)
        assert _ops(fuse_dynamic_matmul(m)) == _ops(m)
        assert ("com.microsoft", "DynamicQuantizeMatMul") not in _ops(backend.prepare(m).model)
    m, _ = _model()
    assert _ops(backend.prepare(m, qdq="literal").model) == _ops(m)


@pytest.mark.skipif(not GPT2.exists(), reason="shared/models' tiny GPT-2 is not here")
def test_tiny_gpt2_fused_as_onnxruntime_fuses_it():
    m = onnx.load(GPT2)
    rep = backend.prepare(m)
    ops = [n.op_type for n in rep.model.graph.node]
    # onnxruntime's optimized model (optimized_model_filepath): 16 DynamicQuantizeMatMul, the
    # 5 DynamicQuantizeLinear feeding QAttention kept, no MatMulInteger, Cast or Mul around them
    assert ops.count("DynamicQuantizeMatMul") == 16 and ops.count("DynamicQuantizeLinear") == 5
    assert ops.count("MatMulInteger") == 0 and ops.count("Mul") == 0
    literal = backend.prepare(m, qdq="literal")
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 1000, (1, 5)).astype(np.int32),
             "position_ids": np.arange(5, dtype=np.int32).reshape(1, 5),
             "attention_mask": np.ones((1, 5), np.int32)}
    for i in range(5):
        feeds[f"past_{i}"] = np.zeros((2, 1, 4, 0, 8), np.float32)
    for _ in range(2):
        for a, b in zip(rep.run(feeds), literal.run(feeds)):
            assert np.array_equal(a, b)
