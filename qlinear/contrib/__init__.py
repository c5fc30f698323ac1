"""onnxruntime's quantized operators (domain ``com.microsoft``) in NumPy, bit for bit as
onnxruntime 1.32's x86-64 CPU kernels compute them, and the float operators quantized
transformer models carry (within float tolerance).

One function per operator; inputs in onnxruntime's schema order, attributes keyword-only with
the schema's names and defaults. The arithmetic is pinned in docs/contract.md ("onnxruntime's
com.microsoft operators").
"""

import functools
from types import SimpleNamespace

import numpy as np

from . import elementwise, gemm, nbits, pool, transformer
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
from .nbits import PreparedMatMulNBits, gather_block_quantized, matmul_nbits, prepare_matmul_nbits
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
    "matmul_nbits",
    "prepare_matmul_nbits",
    "PreparedMatMulNBits",
    "gather_block_quantized",
]


def _public_under_ieee_errstate() -> SimpleNamespace:
    """Rebind every public function of this package to a wrapper that computes under
    np.errstate(all="ignore"): underflow to denormals or 0 and overflow to ±inf in the float32
    multipliers and quotients, and inf/NaN in the float operators, are the IEEE arithmetic
    onnxruntime does (docs/contract.md), so the results are the same, and nothing is raised or
    warned, under a caller's np.errstate(all="raise"). Returns the unwrapped functions (and
    the submodules) for qlinear.graph.kernels.contrib, whose graph run is under that state already
    (an errstate costs microseconds a call)."""
    def ieee(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with np.errstate(all="ignore"):
                return fn(*args, **kwargs)

        return wrapper

    g = globals()
    raw = SimpleNamespace(elementwise=elementwise, gemm=gemm, nbits=nbits, pool=pool, transformer=transformer)
    for name in __all__:
        obj = g[name]
        setattr(raw, name, obj)
        if callable(obj) and not isinstance(obj, type):
            g[name] = ieee(obj)
    return raw


_raw = _public_under_ieee_errstate()
