"""qlinear: ONNX's integer and quantized linear operators, exact to the bit, in NumPy.

Operators (inputs in ONNX order, attributes keyword-only with ONNX names and defaults):
``qlinear_conv``, ``conv_integer``, ``qlinear_matmul``, ``matmul_integer``,
``quantize_linear``, ``dequantize_linear``. The arithmetic contract is docs/contract.md.
``prepare_*`` build reusable forms whose constant weights are pre-transformed once.
onnxruntime's quantized com.microsoft operators (QLinearAdd, QGemm, QLinearSoftmax, ...) are
in ``qlinear.contrib``. ``qlinear.InferenceSession`` (with ``SessionOptions``,
``GraphOptimizationLevel``, ...) is onnxruntime's session shape over the ONNX backend
(:mod:`qlinear.session`, imported on first use: ``import qlinear`` does not import onnx).
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

#: Names served by qlinear.session, imported on first use (PEP 562) so that the NumPy API's
#: import stays as it was (the session imports onnx and the backend when one is created).
_SESSION_NAMES = frozenset({
    "InferenceSession", "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode",
    "ExecutionOrder", "NodeArg", "ModelMetadata", "get_available_providers",
})


def __getattr__(name: str):
    if name == "session" or name in _SESSION_NAMES:
        import importlib  # (``from . import session`` would look the name up here again)

        session = importlib.import_module(".session", __name__)
        # "session": the module itself, with its error classes (qlinear.session.InvalidArgument)
        return session if name == "session" else getattr(session, name)
    raise AttributeError(f"module 'qlinear' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SESSION_NAMES)


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
    *sorted(_SESSION_NAMES),
]
