"""The kernel lists the graph runtime hands onnx.reference (``new_ops``): above every kernel
module, so that no kernel imports the list it is in."""

from __future__ import annotations

from onnx.reference.op_run import OpRun

from .kernels.contrib import KERNELS as CONTRIB_KERNELS
from .kernels.control import CONTROL_KERNELS
from .kernels.float import FLOAT_KERNELS
from .kernels.islands import ISLAND_KERNELS
from .kernels.nbits import KERNELS as NBITS_KERNELS
from .kernels.standard import (BatchNormalization, ConvInteger, DequantizeLinear, MatMulInteger, MaxPool,
                               QLinearConv, QLinearMatMul, QuantizeLinear)

__all__ = ["KERNELS", "FLOAT_KERNELS", "CONTROL_KERNELS", "CONTRIB_KERNELS"]

#: The replacement kernels of the six operators, BatchNormalization, MaxPool and onnxruntime's
#: com.microsoft operators (the exact ones; ``modes.kernels_for`` swaps in an emulation).
KERNELS: list[type[OpRun]] = [QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul,
                              ConvInteger, MatMulInteger, BatchNormalization, MaxPool, *CONTRIB_KERNELS,
                              *NBITS_KERNELS, *ISLAND_KERNELS]
