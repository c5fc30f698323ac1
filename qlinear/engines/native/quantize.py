"""QuantizeLinear and DequantizeLinear (the 8-bit contract's float32 path) on the native engine:
csrc/python/bind_elementwise.c's ``quantize`` and ``dequantize`` argument lists.

``qlinear/quantize.py`` validates and caches; x is seen as (pre, C, post) with one scale and
zero point per tensor or per C.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _native

_CODES = _native.DTYPE_CODES


def elementwise(quantize: bool, x: np.ndarray, shape3: tuple[int, int, int], per_axis: bool,
                scale: np.ndarray, zp: np.ndarray, out: np.ndarray) -> tuple | None:
    """Quantize (or dequantize) x, seen as (pre, C, post), into out. A per-tensor call returns
    its plan, which ``run`` repeats on another x of the same dtype (None per axis)."""
    C = _native._C
    isa = C.get_isa()
    x = np.ascontiguousarray(x)
    s = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    z = np.ascontiguousarray(zp, dtype=np.int32).reshape(-1)
    if quantize:
        C.quantize(isa, x, _CODES[x.dtype], *shape3, int(per_axis), s, z, out, _CODES[out.dtype])
    else:
        C.dequantize(isa, x, _CODES[x.dtype], *shape3, int(per_axis), s, z, out)
    return None if per_axis else (isa, quantize, s, z, out.dtype)


def run(call: tuple, x: np.ndarray) -> np.ndarray:
    """A per-tensor plan of ``elementwise`` on a C-contiguous x of the dtype it was made for."""
    _, quantize, s, z, out_dtype = call
    C = _native._C
    out = _native.empty(x.shape, out_dtype)
    if quantize:
        C.quantize(C.get_isa(), x, _CODES[x.dtype], 1, 1, x.size, 0, s, z, out, _CODES[out_dtype])
    else:
        C.dequantize(C.get_isa(), x, _CODES[x.dtype], 1, 1, x.size, 0, s, z, out)
    return out


def per_tensor(scale: Any, zp: Any) -> tuple[np.ndarray, np.ndarray]:
    """A validated one-element scale and zero point as the kernels take them."""
    return (np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)[:1],
            np.ascontiguousarray(zp, dtype=np.int32).reshape(-1)[:1])


def quantize_tensor(C: Any, x: np.ndarray, scale: np.ndarray, zp: np.ndarray, out: np.ndarray) -> None:
    """Per-tensor quantization of a C-contiguous x into out (``per_tensor``'s parameters)."""
    C.quantize(C.get_isa(), x, _CODES[x.dtype], 1, 1, x.size, 0, scale, zp, out, _CODES[out.dtype])


def dequantize_tensor(C: Any, x: np.ndarray, scale: np.ndarray, zp: np.ndarray, out: np.ndarray) -> None:
    """Per-tensor dequantization of a C-contiguous x into out (``per_tensor``'s parameters)."""
    C.dequantize(C.get_isa(), x, _CODES[x.dtype], 1, 1, x.size, 0, scale, zp, out)
