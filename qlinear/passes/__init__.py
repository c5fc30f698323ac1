"""The graph passes (ModelProto in, ModelProto out): QDQ fusion, the way onnxruntime 1.32's CPU
session rewrites a QDQ model, and qlinear's exact float Convs. Public face: :mod:`qlinear.qdq`.

    import onnx, qlinear.qdq
    fused = qlinear.qdq.fuse_qdq(onnx.load("model_qdq.onnx"))

A QDQ model computes ``DequantizeLinear -> float operator -> QuantizeLinear``. onnxruntime's
optimizer (default session, ``ORT_ENABLE_ALL``; the QDQ rules run at ``EXTENDED`` and above)
replaces such node groups by integer kernels, which round differently from the float graph.
:func:`fuse_qdq` applies the same rules, under the same conditions, in the same order, so that
qlinear's integer kernels compute what onnxruntime's normal session computes. It is pure
(ModelProto in, new ModelProto out) and leaves every node it does not match unchanged.

Files: ``graph_edit`` (the graph view the passes edit), ``cleanup`` (level-1 cleanups),
``qdq_pairs`` (the passes over Q/DQ pairs), ``qdq_rules`` (the node groups), ``matmul_nbits``
(weight-only DequantizeLinear -> MatMul into MatMulNBits), ``exact_convs`` and ``islands``
(qlinear's own fusions, which change no byte); :func:`fuse_qdq` here is the order.

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
     GlobalAveragePool -> QLinear*; Concat -> QLinearConcat; Where -> QLinearWhere;
     weight-only DequantizeLinear (2/4/8-bit, blocked, per-channel or per-tensor) -> MatMul
     or Gemm -> com.microsoft MatMulNBits at the session's accuracy level (``matmul_nbits``).
  7. ``remove_dq_q``: a DQ -> Q pair with equal parameters left in the graph disappears
     (QDQFinalCleanupTransformer).

``ops`` restricts which fused operators may be emitted (a node group whose replacement is not
in it stays as written), so that a backend emits only operators it has kernels for.

What is not reproduced: QDQPropagation (not run by onnxruntime 1.32's default session, checked
in tests), the com.microsoft NHWC layout of QLinearConv (same arithmetic as the ONNX
operator), and float-only fusions (Conv + activation into FusedConv, NCHWc): those leave the
float graph's arithmetic to within float rounding.
"""


from __future__ import annotations

from typing import Iterable, Optional

import onnx

from .cleanup import fold_constants, fuse_consecutive_reshapes, fuse_reshape_shape, remove_dead_nodes
from .exact_convs import exact_integer_convs
from .islands import integer_islands
from .graph_edit import DROP_QDQ_OPS, QDQRefusal, _Graph
from .qdq_pairs import (ensure_unique_dq, propagate_qdq, quantize_bias, remove_double_qdq, remove_dq_q,
                        remove_relu_clip, s8_to_u8)
from .matmul_nbits import fuse_matmul_nbits
from .qdq_rules import FUSED_OPS as _GROUP_OPS
from .qdq_rules import node_groups

#: The operators the fusion can emit, as (domain, op_type).
FUSED_OPS: frozenset[tuple[str, str]] = _GROUP_OPS | {("com.microsoft", "MatMulNBits")}

__all__ = ["fuse_qdq", "exact_integer_convs", "integer_islands", "FUSED_OPS", "DROP_QDQ_OPS", "QDQRefusal",
           "fold_constants", "fuse_reshape_shape", "fuse_consecutive_reshapes", "remove_dead_nodes",
           "ensure_unique_dq", "remove_double_qdq", "remove_dq_q", "propagate_qdq", "quantize_bias",
           "remove_relu_clip", "s8_to_u8", "node_groups", "fuse_matmul_nbits"]


# --------------------------------------------------------------------------- entry point


def fuse_qdq(model: onnx.ModelProto, *, int8_allowed: bool = False,
             ops: Optional[Iterable[tuple[str, str]]] = None,
             double_qdq: bool = True, nbits_accuracy_level: int = 4,
             nbits_block_size: int = 0) -> onnx.ModelProto:
    """The model as onnxruntime 1.32's CPU session runs it: QDQ node groups fused.

    ``int8_allowed`` is onnxruntime's ``QDQIsInt8Allowed()`` (False on x86, True on ARM).
    ``ops`` is the set of (domain, op_type) the result may contain among :data:`FUSED_OPS`
    (default: all). ``double_qdq`` runs DoubleQDQPairsRemover (onnxruntime's default; the
    session option ``session.disable_double_qdq_remover=1`` turns it off).
    ``nbits_accuracy_level`` is the accuracy_level of the MatMulNBits nodes that weight-only
    DequantizeLinear -> MatMul / Gemm groups become (``session.qdq_matmulnbits_accuracy_level``,
    default 4: int8 activations), ``nbits_block_size`` the block size of their per-channel and
    per-tensor forms (``session.qdq_matmulnbits_block_size``: 0 is 32).
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"fuse_qdq: model must be an onnx.ModelProto, got {type(model).__name__}")
    allowed = FUSED_OPS if ops is None else frozenset((d if d != "ai.onnx" else "", o)
                                                      for d, o in ops)
    emit = lambda domain, op: (domain, op) in allowed  # noqa: E731
    g = _Graph(model)
    ensure_unique_dq(g)  # onnxruntime runs it once before the level-1 optimizers
    fold_constants(g)
    fuse_reshape_shape(g)
    fuse_consecutive_reshapes(g)
    remove_dead_nodes(g)
    if double_qdq:
        remove_double_qdq(g)
    propagate_qdq(g)
    quantize_bias(g)
    fold_constants(g)  # Q/DQ pairs inserted on initializers
    remove_dead_nodes(g)
    ensure_unique_dq(g)
    remove_relu_clip(g)
    if not int8_allowed:
        s8_to_u8(g)
    node_groups(g, int8_allowed, emit)
    # onnxruntime's DQ -> MatMulNBits rule is the last of the same selector-action pass; its
    # groups (one DequantizeLinear, on the weight, no QuantizeLinear) are disjoint from every
    # group above, so running it after them rewrites the same nodes
    fuse_matmul_nbits(g, emit, nbits_accuracy_level, nbits_block_size)
    # then onnxruntime's QDQFinalCleanupTransformer (its DQ -> Q half)
    remove_dq_q(g)
    return g.to_model()
