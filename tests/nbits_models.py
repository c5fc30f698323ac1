"""Weight-only int4 models for the tests and benchmarks/nbits_distances.py: float models made
with onnx.helper (a transformer block, a tiny GPT-2-style language model), quantized by
onnxruntime's own MatMulNBitsQuantizer into MatMulNBits (and GatherBlockQuantized) or into
its QDQ form (DequantizeLinear(int4, axis=0, block_size) -> MatMul)."""

from __future__ import annotations

import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = np.float32
OPSET = 21  # blocked DequantizeLinear needs 21


def transformer_block(d: int, ff: int, seed: int = 0) -> onnx.ModelProto:
    """x [S, d] -> single-head self-attention (q, k, v, o projections) + residual -> MLP
    (d -> ff -> d, ReLU) + residual. Every weight is a MatMul initializer [K, N]."""
    rng = np.random.default_rng(seed)
    inits = []

    def weight(name, k, n):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(F32), name))

    for name in ("Wq", "Wk", "Wv", "Wo"):
        weight(name, d, d)
    weight("W1", d, ff)
    weight("W2", ff, d)
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), F32), "scale"))
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"]),
        helper.make_node("MatMul", ["x", "Wk"], ["k"]),
        helper.make_node("MatMul", ["x", "Wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["att"]),
        helper.make_node("MatMul", ["att", "Wo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["h"]),
        helper.make_node("MatMul", ["h", "W1"], ["f1"]),
        helper.make_node("Relu", ["f1"], ["f1r"]),
        helper.make_node("MatMul", ["f1r", "W2"], ["f2"]),
        helper.make_node("Add", ["h", "f2"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["S", d])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def tiny_gpt2(vocab: int = 256, d: int = 128, heads: int = 2, layers: int = 2, ff: int = 256,
              seq: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A GPT-2-style language model: token and position embeddings (Gather), ``layers`` blocks
    of pre-LayerNorm causal multi-head attention (fused qkv projection with bias, Gemm-free
    MatMul + Add) and a GELU MLP, a final LayerNorm and a vocabulary head. ids int64 [1, seq]
    -> logits [1, seq, vocab]."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(name, k, n, scale=None):
        return const(name, (rng.standard_normal((k, n)) * (scale or 1 / np.sqrt(k))).astype(F32))

    def node(op, ins, outs, **kw):
        nodes.append(helper.make_node(op, ins, outs, **kw))
        return outs[0]

    def layer_norm(x, name):
        g = const(name + "_g", (1 + 0.1 * rng.standard_normal(d)).astype(F32))
        b = const(name + "_b", (0.1 * rng.standard_normal(d)).astype(F32))
        return node("LayerNormalization", [x, g, b], [name], axis=-1, epsilon=1e-5)

    weight("wte", vocab, d, scale=0.5)
    weight("wpe", seq, d, scale=0.1)
    const("pos", np.arange(seq, dtype=np.int64)[None, :])
    const("mask", np.triu(np.full((seq, seq), -1e4, F32), 1))
    const("qkv_shape", np.array([1, seq, 3, heads, hd], np.int64))
    const("out_shape", np.array([1, seq, d], np.int64))
    const("att_scale", np.array(1 / np.sqrt(hd), F32))
    const("half", np.array(0.5, F32))
    const("one", np.array(1.0, F32))
    const("rsqrt2", np.array(1 / np.sqrt(2), F32))
    h = node("Add", [node("Gather", ["wte", "ids"], ["tok"]), node("Gather", ["wpe", "pos"], ["pe"])], ["h0"])
    for i in range(layers):
        p = f"l{i}_"
        x = layer_norm(h, p + "ln1")
        qkv = node("Add", [node("MatMul", [x, weight(p + "Wqkv", d, 3 * d)], [p + "qkv0"]),
                           const(p + "bqkv", (0.02 * rng.standard_normal(3 * d)).astype(F32))], [p + "qkv"])
        qkv = node("Transpose", [node("Reshape", [qkv, "qkv_shape"], [p + "qkv5"])], [p + "qkvT"],
                   perm=[2, 0, 3, 1, 4])  # [3, 1, heads, seq, hd]
        q, k, v = (node("Gather", [qkv, const(f"{p}i{j}", np.array(j, np.int64))], [f"{p}{n}"], axis=0)
                   for j, n in enumerate("qkv"))
        s = node("MatMul", [q, node("Transpose", [k], [p + "kT"], perm=[0, 1, 3, 2])], [p + "s0"])
        s = node("Add", [node("Mul", [s, "att_scale"], [p + "s1"]), "mask"], [p + "s2"])
        a = node("MatMul", [node("Softmax", [s], [p + "p"], axis=-1), v], [p + "a0"])
        a = node("Reshape", [node("Transpose", [a], [p + "aT"], perm=[0, 2, 1, 3]), "out_shape"], [p + "a1"])
        o = node("MatMul", [a, weight(p + "Wo", d, d)], [p + "o"])
        h = node("Add", [h, o], [p + "h1"])
        x = layer_norm(h, p + "ln2")
        f = node("MatMul", [x, weight(p + "W1", d, ff)], [p + "f1"])
        # GELU, erf form: 0.5 x (1 + erf(x / sqrt 2))
        e = node("Erf", [node("Mul", [f, "rsqrt2"], [p + "fs"])], [p + "fe"])
        f = node("Mul", [node("Mul", [f, "half"], [p + "fh"]), node("Add", [e, "one"], [p + "fe1"])], [p + "fg"])
        h = node("Add", [h, node("MatMul", [f, weight(p + "W2", ff, d)], [p + "f2"])], [p + "h2"])
    x = layer_norm(h, "lnf")
    node("MatMul", [x, weight("Whead", d, vocab)], ["logits"])
    graph = helper.make_graph(nodes, "tiny_gpt2", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def quantize(model: onnx.ModelProto, block_size: int, symmetric: bool, qdq: bool = False,
             gather: bool = False) -> onnx.ModelProto:
    """``model`` quantized to int4 by onnxruntime's MatMulNBitsQuantizer (RTN, its default
    algorithm): MatMul -> MatMulNBits (``qdq=False``) or DequantizeLinear(int4, axis=0,
    block_size) -> MatMul (``qdq=True``); with ``gather`` the embeddings' Gather too
    (GatherBlockQuantized, quantized along the hidden axis)."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    kw = {}
    if gather:
        kw = dict(op_types_to_quantize=("MatMul", "Gather"), quant_axes=(("MatMul", 0), ("Gather", 1)))
    cfg = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric,
                                       quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator, **kw)
    q = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()), algo_config=cfg)
    q.process()
    return q.model.model


def set_accuracy_level(model: onnx.ModelProto, level: int) -> onnx.ModelProto:
    """A copy of ``model`` whose MatMulNBits nodes have ``accuracy_level`` = ``level``."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            kept = [a for a in n.attribute if a.name != "accuracy_level"]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute("accuracy_level", level)])
    return m


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| over max |b| (float64)."""
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b.astype(np.float64)).max())
