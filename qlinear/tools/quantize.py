"""Reproducible QOperator quantization with onnxruntime's quantizer.

``quantize_qoperator(float_model, calibration_batches)`` wraps
``onnxruntime.quantization.quantize_static`` (QOperator format, uint8 activations, int8
weights) restricted to Conv and MatMul by default, so that the quantized graph holds only
ONNX-standard quantized operators (QuantizeLinear, QLinearConv, QLinearMatMul,
DequantizeLinear) between float operators. Quantizing Add, Gemm, Softmax, ... would give
onnxruntime's contrib operators (QLinearAdd, QGemm, QLinearSoftmax in com.microsoft).
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Sequence

import numpy as np
import onnx


def quantize_qoperator(
    float_model: onnx.ModelProto,
    calibration: Sequence[dict[str, np.ndarray]],
    *,
    op_types: Iterable[str] = ("Conv", "MatMul"),
    per_channel: bool = False,
    reduce_range: bool = False,
    extra_options: dict | None = None,
) -> onnx.ModelProto:
    """Quantize ``float_model`` to QOperator format; ``calibration`` is a list of feeds."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(list(calibration))

        def get_next(self):
            return next(self._it, None)

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "float.onnx")
        dst = os.path.join(tmp, "quant.onnx")
        onnx.save(float_model, src)
        quantize_static(
            src,
            dst,
            Reader(),
            quant_format=QuantFormat.QOperator,
            op_types_to_quantize=list(op_types),
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options=extra_options or {},
        )
        model = onnx.load(dst)
    return model
