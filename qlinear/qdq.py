"""QDQ fusion: rewrite a QDQ model the way onnxruntime 1.32's CPU session does.

    import onnx, qlinear.qdq
    fused = qlinear.qdq.fuse_qdq(onnx.load("model_qdq.onnx"))

A QDQ model computes ``DequantizeLinear -> float operator -> QuantizeLinear``. onnxruntime's
optimizer (default session, ``ORT_ENABLE_ALL``; the QDQ rules run at ``EXTENDED`` and above)
replaces such node groups by integer kernels, which round differently from the float graph.
:func:`fuse_qdq` applies the same rules, under the same conditions, in the same order, so that
qlinear's integer kernels compute what onnxruntime's normal session computes. It is pure
(ModelProto in, new ModelProto out) and leaves every node it does not match unchanged.

The passes, their order (onnxruntime's), what each reproduces and what is not reproduced are
described in :mod:`qlinear.passes` (and docs/qdq.md, rule by rule); this module is their
public face.
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
