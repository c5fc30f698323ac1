"""Seeded synthetic models for tests and benchmarks (no downloads).

- :func:`small_cnn` - float Conv / [BatchNormalization] / Relu / MaxPool / Conv / Relu /
  Reshape / Gemm / Softmax, for onnxruntime's quantizer;
- :func:`mlp_block` - a transformer-style MLP block: MatMul / Add / Relu / MatMul / Add /
  residual Add / Softmax, for onnxruntime's quantizer;
- :func:`resnet50_qoperator` - a QOperator graph with ResNet-50's topology built directly
  (53 QLinearConv; residual additions as DequantizeLinear -> Add -> Relu -> QuantizeLinear,
  since QLinearAdd is not a standard operator), random weights.
"""

from __future__ import annotations

import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper


def _f32(v, name):
    return numpy_helper.from_array(np.asarray(v, dtype=np.float32), name)


def small_cnn(seed: int = 0, *, batch_norm: bool = False, opset: int = 13) -> onnx.ModelProto:
    """Float CNN on [N, 3, 16, 16] -> [N, 10] probabilities."""
    rng = np.random.default_rng(seed)
    inits = [
        _f32(rng.normal(0, 0.3, (8, 3, 3, 3)), "conv1.w"), _f32(rng.normal(0, 0.1, 8), "conv1.b"),
        _f32(rng.normal(0, 0.15, (16, 8, 3, 3)), "conv2.w"), _f32(rng.normal(0, 0.1, 16), "conv2.b"),
        numpy_helper.from_array(np.array([-1, 256], np.int64), "flat_shape"),
        _f32(rng.normal(0, 0.1, (256, 10)), "fc.w"), _f32(rng.normal(0, 0.1, 10), "fc.b"),
    ]
    nodes = [helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4,
                              name="conv1")]
    act = "c1"
    if batch_norm:
        inits += [_f32(rng.uniform(0.5, 1.5, 8), "bn.scale"), _f32(rng.normal(0, 0.2, 8), "bn.bias"),
                  _f32(rng.normal(0, 0.2, 8), "bn.mean"), _f32(rng.uniform(0.5, 2.0, 8), "bn.var")]
        nodes.append(helper.make_node("BatchNormalization",
                                      ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b1"],
                                      epsilon=1e-5, name="bn1"))
        act = "b1"
    nodes += [
        helper.make_node("Relu", [act], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4, strides=[2, 2],
                         name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Reshape", ["r2", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1, name="softmax"),
    ]
    g = helper.make_graph(nodes, "small_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def mlp_block(seed: int = 0, d: int = 32, hidden: int = 64, opset: int = 13) -> onnx.ModelProto:
    """Float transformer-style MLP block on [N, 8, d] -> [N, 8, d]."""
    rng = np.random.default_rng(seed)
    inits = [_f32(rng.normal(0, 1 / np.sqrt(d), (d, hidden)), "w1"), _f32(rng.normal(0, 0.1, hidden), "b1"),
             _f32(rng.normal(0, 1 / np.sqrt(hidden), (hidden, d)), "w2"), _f32(rng.normal(0, 0.1, d), "b2")]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="fc1_bias"),
        helper.make_node("Relu", ["h1b"], ["h1r"], name="relu"),
        helper.make_node("MatMul", ["h1r", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "b2"], ["h2b"], name="fc2_bias"),
        helper.make_node("Add", ["h2b", "x"], ["res"], name="residual"),
        helper.make_node("Softmax", ["res"], ["y"], axis=-1, name="softmax"),
    ]
    g = helper.make_graph(nodes, "mlp_block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


class _Builder:
    def __init__(self, rng, weight_bits):
        self.rng = rng
        self.bits = weight_bits
        self.nodes: list = []
        self.inits: list = []
        self.n = 0
        self.convs = 0

    def const(self, arr, stem):
        self.n += 1
        name = f"{stem}_{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def qconv(self, x, cin, cout, k, stride=1, relu=True):
        """QLinearConv with y_scale picked so outputs keep a spread of ~40 steps."""
        t, s, zp = x
        lim = 2 ** (self.bits - 1)
        w = self.rng.integers(-lim, lim, size=(cout, cin, k, k)).astype(np.int8)
        fan = cin * k * k
        sigma_acc = np.sqrt(fan) * 40.0 * (lim / np.sqrt(3))  # ~40-step inputs, uniform w
        y_scale = np.float32(0.02)  # every activation keeps the same real scale ...
        w_scale = np.float32(40.0 * y_scale / (s * sigma_acc))  # ... outputs spread ~40 steps
        y_zp = np.uint8(0 if relu else 128)
        bias = self.rng.integers(-2000, 2000, size=cout).astype(np.int32)
        self.convs += 1
        out = f"conv{self.convs}"
        pad = k // 2
        self.nodes.append(helper.make_node(
            "QLinearConv",
            [t, self.const(np.float32(s), "xs"), self.const(np.uint8(zp), "xzp"),
             self.const(w, "w"), self.const(w_scale, "ws"), self.const(np.int8(0), "wzp"),
             self.const(y_scale, "ys"), self.const(y_zp, "yzp"), self.const(bias, "b")],
            [out], kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride], name=out))
        return out, float(y_scale), int(y_zp)

    def add_relu(self, a, b):
        self.n += 1
        i = self.n
        da, db = f"add{i}_a", f"add{i}_b"
        self.nodes.append(helper.make_node("DequantizeLinear", [a[0], self.const(np.float32(a[1]), "s"),
                                                                self.const(np.uint8(a[2]), "zp")], [da]))
        self.nodes.append(helper.make_node("DequantizeLinear", [b[0], self.const(np.float32(b[1]), "s"),
                                                                self.const(np.uint8(b[2]), "zp")], [db]))
        self.nodes.append(helper.make_node("Add", [da, db], [f"add{i}"], name=f"add{i}"))
        self.nodes.append(helper.make_node("Relu", [f"add{i}"], [f"add{i}_relu"], name=f"add{i}_relu"))
        s = float(np.float32(max(a[1], b[1]) * 1.5))
        s = 0.02 if s > 0.02 * 1.4 else s  # keep the real scale bounded along the chain
        self.nodes.append(helper.make_node("QuantizeLinear", [f"add{i}_relu", self.const(np.float32(s), "s"),
                                                              self.const(np.uint8(0), "zp")], [f"add{i}_q"]))
        return f"add{i}_q", s, 0


def resnet50_qoperator(seed: int = 0, *, image: int = 224, weight_bits: int = 7,
                       classes: int = 1000) -> onnx.ModelProto:
    """ResNet-50 topology in QOperator form (53 QLinearConv), random ``weight_bits`` weights.

    With 7-bit weights onnxruntime's u8s8 kernels cannot saturate, so its results are exact
    and must match qlinear bit for bit.
    """
    rng = np.random.default_rng(seed)
    b = _Builder(rng, weight_bits)
    b.nodes.append(helper.make_node("QuantizeLinear", ["image", b.const(np.float32(0.02), "s"),
                                                       b.const(np.uint8(128), "zp")], ["image_q"]))
    x = ("image_q", 0.02, 128)
    x = b.qconv(x, 3, 64, 7, stride=2)
    b.nodes.append(helper.make_node("MaxPool", [x[0]], ["pool0"], kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1], name="pool0"))
    x = ("pool0", x[1], x[2])
    cin = 64
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for blk in range(blocks):
            stride = 2 if (blk == 0 and stage > 0) else 1
            cout = width * 4
            h = b.qconv(x, cin, width, 1)
            h = b.qconv(h, width, width, 3, stride=stride)
            h = b.qconv(h, width, cout, 1, relu=False)
            short = b.qconv(x, cin, cout, 1, stride=stride, relu=False) if blk == 0 else x
            x = b.add_relu(h, short)
            cin = cout
    side = image // 32
    b.nodes.append(helper.make_node("MaxPool", [x[0]], ["gpool"], kernel_shape=[side, side], name="gpool"))
    b.nodes.append(helper.make_node("Reshape", ["gpool", b.const(np.array([-1, cin], np.int64), "shape")],
                                    ["feat"], name="flatten"))
    wfc = rng.integers(-(2 ** (weight_bits - 1)), 2 ** (weight_bits - 1), size=(cin, classes)).astype(np.int8)
    ys = np.float32(0.05)
    fc_ws = np.float32(40.0 * ys / (x[1] * np.sqrt(cin) * 40.0 * 37.0))
    b.nodes.append(helper.make_node(
        "QLinearMatMul", ["feat", b.const(np.float32(x[1]), "s"), b.const(np.uint8(x[2]), "zp"),
                          b.const(wfc, "wfc"), b.const(fc_ws, "s"), b.const(np.int8(0), "zp"),
                          b.const(ys, "s"), b.const(np.uint8(128), "zp")], ["logits_q"], name="fc"))
    b.nodes.append(helper.make_node("DequantizeLinear", ["logits_q", b.const(ys, "s"),
                                                         b.const(np.uint8(128), "zp")], ["logits"]))
    g = helper.make_graph(b.nodes, "resnet50_qoperator",
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, image, image])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
                          b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m
