"""An ONNX backend: onnx's ReferenceEvaluator runs the graph, qlinear runs the six operators.

    import onnx, qlinear.backend as backend
    rep = backend.prepare(onnx.load("model.onnx"))
    outputs = rep.run([x])

The graph engine is ``onnx.reference.ReferenceEvaluator``. Its implementations of
QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger
are replaced (``new_ops``) by qlinear's kernels; constant weights go through the prepared,
weight-pretransformed forms (``qlinear.prepare_*``) once and are reused on every run.

Every other standard operator runs as ReferenceEvaluator runs it, except where it is wrong
or missing (measured with onnx 1.23):

- BatchNormalization 9-13: ReferenceEvaluator fills the default ``momentum`` and then
  computes batch statistics, so every inference output is wrong. Replaced by the inference
  formula, written in onnxruntime's order of float32 operations (bit-identical to
  onnxruntime; also used for inference with versions 14-15, where ReferenceEvaluator is
  right but differs from onnxruntime by float32 ulps).
- DequantizeLinear 13: missing in ReferenceEvaluator; qlinear's kernel runs it.
- MaxPool on uint8/int8 (what onnxruntime's quantizer leaves between quantized layers) with
  padding: ReferenceEvaluator pads with NaN, which raises or casts to an arbitrary integer.
  MaxPool is implemented here for integers and floats as a running maximum over kernel taps
  (padding never wins; a maximum is exact, so it equals onnxruntime), which also replaces
  ReferenceEvaluator's per-window Python loop for floats. Float MaxPool with the Indices
  output runs as ReferenceEvaluator runs it.

Before anything runs, :func:`check_model` lists *every* node qlinear cannot run exactly
(operator, version, node name, reason); :func:`prepare` raises
:class:`UnsupportedModelError` with that whole list. There is no silent fallback to other
semantics: a node whose input types turn out, at run time, to fall outside the float32 /
8-bit contract raises :class:`NodeError` naming node, operator and version.
"""

from __future__ import annotations

import onnx  # noqa: F401 - an attribute of this module before the split (backend.onnx), kept

# The runtime lives in qlinear/graph/ (errors, proto, support, kernels/, registry, modes,
# evaluator, load, rep, api: docs/layout.md); this module is its public face.
from qlinear.graph.api import (QLinearBackend, is_compatible, prepare, run_model, run_node,
                               supports_device)
from qlinear.graph.errors import NodeError, Problem, UnsupportedModelError, format_problems
from qlinear.graph.kernels.standard import (BatchNormalization, ConvInteger, DequantizeLinear, MatMulInteger,
                                            MaxPool, QLinearConv, QLinearMatMul, QuantizeLinear,
                                            batch_normalization_inference, max_pool)
from qlinear.graph.modes import (EMULATIONS, QDQ_MODES, QDQ_OPTIONS, apply_qdq, fusable_ops, kernels_for, model_as_run,
                                 qdq_options)
from qlinear._inline import inline_functions
from qlinear.graph.proto import node_version, topologically_sorted
from qlinear.modelfile import missing_external_data  # the one model-file loader
from qlinear.graph.registry import KERNELS
from qlinear.graph.rep import QLinearRep
from qlinear.graph.support import QLINEAR_OPS, check_model

__all__ = [
    "QLinearBackend",
    "QLinearRep",
    "UnsupportedModelError",
    "NodeError",
    "Problem",
    "check_model",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
    "is_compatible",
    "node_version",
    "QLINEAR_OPS",
    "QDQ_MODES",
    "apply_qdq",
    "QDQ_OPTIONS",
    "qdq_options",
    "model_as_run",
    "fusable_ops",
    "EMULATIONS",
    # also part of the face (used by the tools and documented)
    "format_problems",
    "kernels_for",
    "KERNELS",
    "max_pool",
    "batch_normalization_inference",
    "inline_functions",
    "topologically_sorted",
    "missing_external_data",
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "BatchNormalization",
    "MaxPool",
]
