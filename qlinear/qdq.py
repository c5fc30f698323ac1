"""QDQ fusion: rewrite a QDQ model the way onnxruntime 1.32's CPU session does.

    import onnx, qlinear.qdq
    fused = qlinear.qdq.fuse_qdq(onnx.load("model_qdq.onnx"))

A QDQ model computes ``DequantizeLinear -> float operator -> QuantizeLinear``. onnxruntime's
optimizer (default session, ``ORT_ENABLE_ALL``; the QDQ rules run at ``EXTENDED`` and above)
replaces such node groups by integer kernels, which round differently from the float graph.
:func:`fuse_qdq` applies the same rules, under the same conditions, in the same order, so that
qlinear's integer kernels compute what onnxruntime's normal session computes. It is pure
(ModelProto in, new ModelProto out) and leaves every node it does not match unchanged.

The passes, in onnxruntime's order (docs/qdq.md has each rule, its conditions, its source and
its test):

Level 1 (graph-wide, provider independent)
  1. ``fold_constants``: a node whose inputs are all constants (a Shape of a known shape) is
     folded into an initializer (onnxruntime's ConstantFolding; DequantizeLinear never is).
  2. ``ensure_unique_dq``: a DequantizeLinear with several consumers (or a consumer and a
     graph output) is duplicated so that every consumer has its own (EnsureUniqueDQForNodeUnit).
  3. ``remove_double_qdq``: Q1 -> DQ1 -> Q2 -> DQ2 becomes one Q -> DQ pair whose scale and
     zero point cover the intersection of both ranges (DoubleQDQPairsRemover).

Level 2 (CPU)
  4. ``remove_relu_clip``: a Relu or Clip whose only consumer is a QuantizeLinear that clamps
     at least as tightly is removed (ReluQuantFusion, ClipQuantFusion).
  5. ``s8_to_u8``: every Q -> DQ pair of int8 with one consumer and equal constant scalar zero
     points becomes uint8 with zero point + 128 (QDQS8ToU8Transformer; x86 does not allow int8
     activations in the fused kernels, ``int8_allowed=False``).
  6. node groups (QDQSelectorActionTransformer), visited in graph order:
     Q/DQ pairs dropped around data-movement operators, Split, ArgMax; Conv -> QLinearConv;
     MatMul -> QLinearMatMul or com.microsoft MatMulIntegerToFloat; Gemm -> com.microsoft QGemm;
     Add, Mul -> QLinearAdd, QLinearMul; Sigmoid, LeakyRelu, Softmax, AveragePool,
     GlobalAveragePool -> QLinear*; Concat -> QLinearConcat; Where -> QLinearWhere.

``ops`` restricts which fused operators may be emitted (a node group whose replacement is not
in it stays as written), so that a backend emits only operators it has kernels for.

What is not reproduced: QDQPropagation (not run by onnxruntime 1.32's default session, checked
in tests), 16-bit and 4-bit fusions (MatMulNBits, which changes arithmetic with an
accuracy_level), the com.microsoft NHWC layout of QLinearConv (same arithmetic as the ONNX
operator), and float-only fusions (Conv + activation into FusedConv, NCHWc): those leave the
float graph's arithmetic to within float rounding.
"""

from __future__ import annotations

# The passes live in qlinear/passes/ (graph_edit, cleanup, qdq_pairs, qdq_rules, exact_convs;
# fuse_qdq, the order, in its __init__); this module is their public face.
from qlinear.passes import (DROP_QDQ_OPS, FUSED_OPS, QDQRefusal, ensure_unique_dq, exact_integer_convs,
                            fold_constants, fuse_consecutive_reshapes, fuse_qdq, fuse_reshape_shape,
                            node_groups, propagate_qdq, quantize_bias, remove_dead_nodes, remove_double_qdq,
                            remove_relu_clip, s8_to_u8)

__all__ = ["fuse_qdq", "exact_integer_convs", "FUSED_OPS", "DROP_QDQ_OPS", "QDQRefusal",
           "fold_constants", "fuse_reshape_shape", "fuse_consecutive_reshapes", "remove_dead_nodes",
           "ensure_unique_dq", "remove_double_qdq", "propagate_qdq", "quantize_bias", "remove_relu_clip",
           "s8_to_u8", "node_groups"]
