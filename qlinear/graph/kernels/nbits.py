"""onnxruntime's weight-only low-bit operators for the graph runtime: com.microsoft MatMulNBits
and GatherBlockQuantized (``qlinear.contrib.nbits``; arithmetic in docs/contract.md).

MatMulNBits' constant inputs (packed weights, scales, zero points, g_idx, bias) are validated
and unpacked once per session (``PreparedMatMulNBits``), as the other kernels prepare their
weights; each run then computes only A's product. What ``check_model`` refuses before anything
runs (``weight_prepacked``, attribute values) is ``qlinear.contrib.schema.check_node``.
"""

from __future__ import annotations

from typing import Any

from ...contrib import _raw as _c  # the functions without their errstate wrapper: a graph run has it
from .contrib import ContribOp

#: MatMulNBits' inputs after A: B, scales, zero_points, g_idx, bias (positions 1-5)
_WEIGHTS = (1, 2, 3, 4, 5)


def _opt(args: tuple, i: int) -> Any:
    """Optional input ``i`` (None where omitted)."""
    return args[i] if i < len(args) else None


class MatMulNBits(ContribOp):
    """com.microsoft MatMulNBits: constant weights prepared once (``prepare_matmul_nbits``).
    ``mode``: the contract's arithmetic; a subclass with ``mode = "exact"`` computes the exact
    sum rounded once (how benchmarks/nbits_distances.py measures a model's distance to it)."""

    mode = "contract"

    def _run(self, A, B, scales, *rest, **_):
        given = self.given
        prepacked = given.get("weight_prepacked", 0)
        if prepacked:
            # check_model refuses it too; a node built by hand reaches here
            self._call(_refuse, f"attribute weight_prepacked={prepacked} (weights pre-packed for another "
                                "execution provider) is not supported; only 0")
        weights = (B, scales, _opt(rest, 0), _opt(rest, 1), _opt(rest, 2))
        prepared = self._prepared_for(
            _c.prepare_matmul_nbits, weights, _WEIGHTS, K=given.get("K"), N=given.get("N"),
            bits=given.get("bits", 4), block_size=given.get("block_size"),
            accuracy_level=given.get("accuracy_level", 0), mode=self.mode)
        return (self._call(prepared.run, A),)


class GatherBlockQuantized(ContribOp):
    """com.microsoft GatherBlockQuantized (``qlinear.contrib.gather_block_quantized``)."""

    def _run(self, data, indices, scales, zero_points=None, **_):
        return (self._call(_c.gather_block_quantized, data, indices, scales, zero_points,
                           **self._kw("bits", "block_size", "gather_axis", "quantize_axis")),)


def _refuse(message: str) -> None:
    raise ValueError(message)


KERNELS = [MatMulNBits, GatherBlockQuantized]

__all__ = ["KERNELS", "MatMulNBits", "GatherBlockQuantized"]
