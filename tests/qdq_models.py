"""Small synthetic QDQ models for tests/test_qdq.py, and onnxruntime helpers.

Every builder returns an onnx.ModelProto whose activations enter as float32, are quantized by
a QuantizeLinear (as a quantizer writes them), and go through DQ -> op -> Q groups.
"""

from __future__ import annotations

import collections
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper

U8, I8 = np.uint8, np.int8


class Builder:
    """Collects nodes and initializers; ``q``/``dq`` add quantize/dequantize nodes."""

    def __init__(self, opset: int = 13):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.opset = opset
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, value, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def input(self, name: str, shape, elem=T.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def node(self, op: str, inputs, n_out: int = 1, domain: str = "", **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name(op),
                                           domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def q(self, x: str, scale: float, zp: int, dtype=U8) -> str:
        return self.node("QuantizeLinear", [x, self.const(np.float32(scale), "s"),
                                            self.const(np.array(zp, dtype), "z")])

    def dq(self, x: str, scale, zp, dtype=U8, axis: int | None = None) -> str:
        s = self.const(np.asarray(scale, np.float32), "s")
        z = self.const(np.asarray(zp, dtype), "z")
        kw = {} if axis is None else {"axis": axis}
        return self.node("DequantizeLinear", [x, s, z], **kw)

    def qdq(self, x: str, scale: float, zp: int, dtype=U8) -> str:
        return self.dq(self.q(x, scale, zp, dtype), scale, zp, dtype)

    def model(self, outputs: list[str], ir_version: int = 8) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "qdq", self.inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = ir_version
        # give the outputs their types so that onnxruntime accepts the model
        inferred = onnx.shape_inference.infer_shapes(m)
        types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
        del m.graph.output[:]
        m.graph.output.extend(types[o] if o in types else helper.make_empty_tensor_value_info(o)
                              for o in outputs)
        return m


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    """Operator counts, Constant nodes left out (onnxruntime folds them into initializers)."""
    return collections.Counter((n.domain + "." if n.domain else "") + n.op_type
                               for n in model.graph.node if n.op_type != "Constant")


def ort_session(model: onnx.ModelProto, level: str = "all", options: dict | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    for k, v in (options or {}).items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_run(model: onnx.ModelProto, feeds: dict, level: str = "all", options=None) -> list:
    return ort_session(model, level, options).run(None, feeds)


def ort_optimized(model: onnx.ModelProto, options: dict | None = None) -> onnx.ModelProto:
    """The graph onnxruntime's optimizer produces at EXTENDED (the level where the QDQ rules
    run; ALL adds only layout changes: NHWC QLinearConv, NCHWc float kernels)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = path
        so.log_severity_level = 3
        for k, v in (options or {}).items():
            so.add_session_config_entry(k, v)
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(path)
