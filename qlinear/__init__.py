"""qlinear: ONNX's integer and quantized linear operators, exact to the bit, in NumPy.

Operators (inputs in ONNX order, attributes keyword-only with ONNX names and defaults):
``qlinear_conv``, ``conv_integer``, ``qlinear_matmul``, ``matmul_integer``,
``quantize_linear``, ``dequantize_linear``. The arithmetic contract is docs/contract.md.
``prepare_*`` build reusable forms whose constant weights are pre-transformed once.
onnxruntime's quantized com.microsoft operators (QLinearAdd, QGemm, QLinearSoftmax, ...) are
in ``qlinear.contrib``.
"""

from .engines import set_workspace_limit, workspace_limit
from ._native import engine_info, get_num_threads, set_num_threads
from ._validate import max_output_bytes, set_max_output_bytes
from .conv import (
    PreparedConvInteger,
    PreparedQLinearConv,
    conv_integer,
    prepare_conv_integer,
    prepare_qlinear_conv,
    qlinear_conv,
)
from .matmul import (
    PreparedMatMulInteger,
    PreparedQLinearMatMul,
    matmul_integer,
    prepare_matmul_integer,
    prepare_qlinear_matmul,
    qlinear_matmul,
)
from .quantize import dequantize_linear, quantize_linear

__version__ = "0.1.0"

__all__ = [
    "qlinear_conv",
    "conv_integer",
    "qlinear_matmul",
    "matmul_integer",
    "quantize_linear",
    "dequantize_linear",
    "prepare_qlinear_conv",
    "prepare_conv_integer",
    "prepare_qlinear_matmul",
    "prepare_matmul_integer",
    "PreparedQLinearConv",
    "PreparedConvInteger",
    "PreparedQLinearMatMul",
    "PreparedMatMulInteger",
    "set_workspace_limit",
    "engine_info",
    "set_num_threads",
    "get_num_threads",
    "workspace_limit",
    "set_max_output_bytes",
    "max_output_bytes",
]
