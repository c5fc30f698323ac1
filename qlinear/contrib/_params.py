"""Validation shared by the com.microsoft operators (on top of qlinear._validate)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import _validate as v

F32 = np.float32


def tensor(op: str, name: str, value: Any, allowed=v.EIGHT_BIT) -> np.ndarray:
    return v.integer_tensor(op, name, value, allowed)


def qparams(op: str, scale_name: str, scale: Any, zp_name: str, zp: Any, tensor_name: str,
            dtype: np.dtype, *, divides: bool = False, required_zp: bool = False) -> tuple[np.float32, int]:
    """A per-tensor (one element) scale and zero point: (float32 scale, int zero point).

    onnxruntime reads one element of each; anything larger is refused rather than silently
    truncated. An absent zero point is 0 of the tensor's type.
    """
    s = v.nonzero_scale(op, scale_name, scale) if divides else v.scale(op, scale_name, scale)
    s = v.per_tensor(op, scale_name, s)
    if zp is None:
        if required_zp:
            raise TypeError(f"{op}: {zp_name} is required")
        return F32(s), 0
    z = v.per_tensor(op, zp_name, v.zero_point(op, zp_name, zp, tensor_name, np.dtype(dtype)))
    return F32(s), int(z)


def same_dtype(op: str, name: str, arr: np.ndarray, ref_name: str, ref: np.ndarray) -> None:
    if arr.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} must have the dtype of {ref_name} ({ref.dtype}); got dtype {arr.dtype}")


def broadcast_shape(op: str, names: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{op}: {names} must broadcast together; got shapes "
                         + ", ".join(str(s) for s in shapes)) from None


def float_tensor(op: str, name: str, value: Any) -> np.ndarray:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy float32 array; got a Python {type(value).__name__}")
    arr = v.as_array(op, name, value)  # native byte order; a repeating view bounded as an array
    if arr.dtype != np.float32:
        raise TypeError(f"{op}: {name} must have dtype float32; got dtype {arr.dtype}")
    return arr


def float_attribute(op: str, name: str, value: Any) -> float:
    """A float attribute (alpha, epsilon, scale, ...): a real number, as a Python float."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: attribute {name} must be a real number; got "
                        f"{type(value).__name__} {value!r}")
    return float(value)


def flag(op: str, name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"{op}: attribute {name} must be 0 or 1; got {value!r}")
    return int(value)


def axis(op: str, value: Any, rank: int) -> int:
    return v.axis_attribute(op, value, rank)
