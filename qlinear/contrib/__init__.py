"""onnxruntime's quantized operators (domain ``com.microsoft``) in NumPy, bit for bit as
onnxruntime 1.32's x86-64 CPU kernels compute them, and the float operators quantized
transformer models carry (within float tolerance).

One function per operator; inputs in onnxruntime's schema order, attributes keyword-only with
the schema's names and defaults. The arithmetic is pinned in docs/contract.md ("onnxruntime's
com.microsoft operators").
"""

from .elementwise import (
    PreparedBinary,
    prepare_qlinear_binary,
    qlinear_add,
    qlinear_concat,
    qlinear_leaky_relu,
    qlinear_mul,
    qlinear_sigmoid,
    qlinear_where,
)
from .gemm import (
    dequantize_linear,
    dynamic_quantize_linear,
    dynamic_quantize_matmul,
    PreparedQGemm,
    matmul_integer_to_float,
    prepare_qgemm,
    qgemm,
    qlinear_conv,
    quantize_linear,
)
from .pool import qlinear_average_pool, qlinear_global_average_pool, qlinear_softmax
from .transformer import (
    attention,
    embed_layer_normalization,
    fast_gelu,
    gelu,
    qattention,
    skip_layer_normalization,
)

__all__ = [
    "qlinear_add",
    "qlinear_mul",
    "prepare_qlinear_binary",
    "PreparedBinary",
    "qlinear_sigmoid",
    "qlinear_leaky_relu",
    "qlinear_concat",
    "qlinear_where",
    "qlinear_global_average_pool",
    "qlinear_average_pool",
    "qlinear_softmax",
    "qgemm",
    "prepare_qgemm",
    "PreparedQGemm",
    "qlinear_conv",
    "matmul_integer_to_float",
    "dynamic_quantize_matmul",
    "dynamic_quantize_linear",
    "quantize_linear",
    "dequantize_linear",
    "qattention",
    "attention",
    "embed_layer_normalization",
    "skip_layer_normalization",
    "fast_gelu",
    "gelu",
]
