"""Validation shared by every operator.

Each ONNX constraint becomes one sentence of the form
``"<operator>: <input or attribute> <constraint>; got <what was given>"`` raised as
ValueError (a bad value or shape) or TypeError (a bad type). Nothing downstream of this
module re-checks its inputs, so the kernels can assume well-formed arrays.

Arrays are taken as plain native-byte-order ndarrays: a non-native byte order (``'>i4'`` on
a little-endian machine) is converted (a copy), an ndarray subclass is viewed as its base
class, and a masked array is refused (its mask would otherwise be silently ignored).

Sizes are checked before anything is allocated: an operator call refuses to create an array
whose size follows from its inputs' shapes and attributes (its output, the accumulator, the
float32 working copies of its operands) above ``max_output_bytes()``.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from typing import Any, Sequence

import numpy as np

from . import dtypes

EIGHT_BIT = dtypes.EIGHT_BIT
DEQUANTIZABLE = (*dtypes.EIGHT_BIT, dtypes.get("int32").dtype)


INT64_MAX = (1 << 63) - 1
FLOAT32_MAX = str(np.finfo(np.float32).max)  # 3.4028235e+38


def _physical_memory() -> int | None:
    try:
        total = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None
    return total if total > 0 else None  # sysconf says -1 when it does not know


# An array the size of physical memory cannot be computed in it; 16 GiB where it is unknown.
_max_output_bytes = _physical_memory() or (16 << 30)


def byte_count(value: Any, what: str, allowed: str = "an integer >= 1", most: int | None = None) -> int:
    """value as a positive number of bytes (at most `most`); else a ValueError "<what> must be
    <allowed>; got <value>". bool and float are refused: True or 1.5 bytes is a caller's slip."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1 \
            or (most is not None and value > most):
        raise ValueError(f"{what} must be {allowed}; got {value!r}")
    return int(value)


def set_max_output_bytes(nbytes: int) -> None:
    """Bound the size of any one array an operator call allocates whose size follows from
    its inputs' shapes and attributes: the output, its int32/float32 accumulator and the
    float32 working copies of the operands (default: the machine's physical memory)."""
    global _max_output_bytes
    _max_output_bytes = byte_count(nbytes, "set_max_output_bytes: nbytes")


def max_output_bytes() -> int:
    """The current bound of ``set_max_output_bytes`` in bytes."""
    return _max_output_bytes


def _size(nbytes: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} bytes"


def sizes(nbytes: int, limit: int) -> tuple[str, str]:
    """A size and a limit it exceeds, as text: in binary units, or in bytes where the units
    would round them to the same text (131072 against 131071 is not "128 KiB against 128 KiB")."""
    a, b = _size(nbytes), _size(limit)
    return (a, b) if a != b else (f"{nbytes} bytes", f"{limit} bytes")


def check_size(op: str, what: str, shape: tuple[int, ...], itemsize: int) -> None:
    """Refuse, before allocating, an array of ``shape`` (``itemsize`` bytes per element) above
    ``max_output_bytes()``. Shapes are Python ints, so the product never overflows."""
    nbytes = math.prod(shape) * itemsize
    if 0 < nbytes <= _max_output_bytes:  # the usual case, first: this runs on every call
        return
    shape = tuple(int(d) for d in shape)
    if nbytes == 0:
        # Empty, yet NumPy refuses a shape whose other dimensions overflow its indexing.
        if math.prod(d for d in shape if d) * itemsize <= INT64_MAX:
            return
        raise ValueError(
            f"{op}: {what} of shape {shape} is empty, but its dimensions are beyond what NumPy can "
            f"index (their product exceeds 2**63 bytes)"
        )
    raise ValueError(
        f"{op}: {what} of shape {shape} would take {_size(nbytes)}, "
        f"above the limit of {_size(_max_output_bytes)} (qlinear.set_max_output_bytes)"
    )


def check_total(op: str, parts: Sequence[tuple[str, tuple[int, ...], int]]) -> None:
    """Refuse, before allocating any, arrays of one call that together take more than
    ``max_output_bytes()`` (``parts``: (what, shape, itemsize) of each, alive at once): each
    alone may be under the limit while all of them are not."""
    sizes_ = [(what, math.prod(shape) * itemsize) for what, shape, itemsize in parts]
    total = sum(n for _, n in sizes_)
    if total <= _max_output_bytes:
        return
    listed = ", ".join(f"{what} {_size(n)}" for what, n in sorted(sizes_, key=lambda p: -p[1]))
    raise ValueError(f"{op}: the arrays of this call would take {_size(total)} together "
                     f"({listed}), above the limit of {_size(_max_output_bytes)} "
                     "(qlinear.set_max_output_bytes)")


def is_masked(value: Any) -> bool:
    """True for a NumPy masked array, without importing numpy.ma.

    ``np.ma`` is imported lazily by NumPy, under importlib's module lock, on first access: a
    process forked while another thread held that lock (its first qlinear call) would wait for
    it forever in the child. No masked array exists before numpy.ma was imported (or while
    its class is not yet defined), so sys.modules answers without importing.
    """
    ma = sys.modules.get("numpy.ma")
    cls = getattr(ma, "MaskedArray", None) if ma is not None else None
    return cls is not None and isinstance(value, cls)


def as_array(op: str, name: str, value: Any) -> np.ndarray:
    """A NumPy array or scalar as a plain ndarray in native byte order (see the module notes)."""
    if is_masked(value):
        raise TypeError(
            f"{op}: {name} must not be a masked array (its mask cannot be honoured); "
            f"pass {name}.filled(...) or a plain array; got a {type(value).__name__}"
        )
    try:
        arr = np.asarray(value)
    except Exception as e:  # a broken __array__ or similar: name the input, not NumPy's internals
        raise TypeError(f"{op}: {name} could not be read as a NumPy array: {type(e).__name__}: {e}") from None
    if arr.nbytes > _max_output_bytes:  # rare: one comparison on the usual path
        check_view(op, name, arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def repeats_memory(arr: np.ndarray) -> bool:
    """Whether elements of ``arr`` share memory (a broadcast or overlapping strided view): the
    bytes the array spans are fewer than its elements' bytes exactly then."""
    span = arr.itemsize + sum((d - 1) * abs(s) for d, s in zip(arr.shape, arr.strides))
    return arr.size > 0 and span < arr.nbytes


def check_view(op: str, name: str, arr: np.ndarray) -> None:
    """Refuse a view that repeats its memory (``np.broadcast_to``, an overlapping
    ``as_strided``) and would take more than ``max_output_bytes()`` as an array. Operators
    read every element of their inputs, so such a view costs the time (and, wherever an
    operator copies it, the memory) of the array it stands for: it is bounded as that array
    is. A real array of that size exists already, and is accepted."""
    nbytes = arr.nbytes
    if nbytes <= _max_output_bytes or not repeats_memory(arr):
        return
    raise ValueError(
        f"{op}: {name} is a view of shape {tuple(int(d) for d in arr.shape)} that repeats its memory "
        f"(a broadcast view): as an array it would take {_size(nbytes)}, above the limit of "
        f"{_size(_max_output_bytes)} (qlinear.set_max_output_bytes); the operator reads every "
        "element, so the view is bounded as that array"
    )


def _index(i: int, shape: tuple[int, ...]) -> str:
    """' at index ...' of flat element i of a multi-element parameter ('' for one element)."""
    if math.prod(shape) == 1:
        return ""
    where = tuple(int(j) for j in np.unravel_index(i, shape))
    return f" at index {where[0] if len(where) == 1 else where}"


def _kind(value: Any) -> str:
    """How a value is described in an error message."""
    if isinstance(value, (np.ndarray, np.generic)):
        return f"dtype {value.dtype}"
    return f"a Python {type(value).__name__}"


def _dtype_names(dtypes: tuple[np.dtype, ...]) -> str:
    names = [str(d) for d in dtypes]
    return " or ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " or " + names[-1]


def integer_tensor(op: str, name: str, value: Any, allowed: tuple[np.dtype, ...] = EIGHT_BIT) -> np.ndarray:
    """A quantized tensor input (x, w, a, b): a NumPy array of one of the allowed dtypes."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array of dtype {_dtype_names(allowed)}; got {_kind(value)}")
    arr = as_array(op, name, value)
    if arr.dtype not in allowed:
        raise TypeError(f"{op}: {name} must have dtype {_dtype_names(allowed)}; got dtype {arr.dtype}")
    return arr


def scale(op: str, name: str, value: Any) -> np.ndarray:
    """A scale input: any floating-point value, returned as float32 (ONNX's tensor(float)).

    Wider or narrower floats are rounded to float32 first, because every formula in the
    contract is float32 arithmetic.
    """
    if isinstance(value, float):
        arr = np.asarray(value)
    elif isinstance(value, (np.ndarray, np.generic)):
        arr = as_array(op, name, value)
        if arr.dtype.kind != "f":
            raise TypeError(f"{op}: {name} must be floating point (float32); got dtype {arr.dtype}")
    else:
        raise TypeError(f"{op}: {name} must be a float or a floating-point NumPy array; got {_kind(value)}")
    if arr.dtype == np.float32:
        wide = None
    else:
        wide = arr
        # Rounding to float32 may underflow (to a denormal or 0: float32 arithmetic, intended)
        # or overflow (to inf: reported below as such, not as a RuntimeWarning).
        with np.errstate(over="ignore", under="ignore"):
            arr = arr.astype(np.float32)
    # One element (the usual case) is checked in Python: a NumPy reduction costs more here.
    finite = math.isfinite(arr.item()) if arr.size == 1 else bool(np.isfinite(arr).all())
    if not finite:
        flat = arr.ravel()
        i = int(np.flatnonzero(~np.isfinite(flat))[0])
        where = _index(i, arr.shape)
        if wide is not None and np.isfinite(wide.ravel()[i]):
            raise ValueError(
                f"{op}: {name} must fit float32 (ONNX scales are float32, at most {FLOAT32_MAX}); "
                f"got {wide.ravel()[i]}{where}, which overflows float32"
            )
        raise ValueError(f"{op}: {name} must be finite; got {flat[i]}{where}")
    return arr


def nonzero_scale(op: str, name: str, value: Any) -> np.ndarray:
    """A scale the formula divides by (y_scale): finite and not zero."""
    arr = scale(op, name, value)
    if (arr.item() == 0) if arr.size == 1 else bool((arr == 0).any()):
        i = int(np.flatnonzero(arr.ravel() == 0)[0])
        where = _index(i, arr.shape)
        given = value if isinstance(value, float) else np.asarray(value).ravel()[i]
        rounded = "" if given == 0 else ", which is 0 in float32"
        raise ValueError(f"{op}: {name} must not be zero (the output is divided by it); got {given}{where}{rounded}")
    return arr


def zero_point(op: str, name: str, value: Any, tensor_name: str, tensor_dtype: np.dtype) -> np.ndarray:
    """A zero point that must have its tensor's dtype; a plain Python int takes that dtype."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.generic)):
        lo, hi = dtypes.INT_RANGE[np.dtype(tensor_dtype)]
        if not lo <= value <= hi:
            raise ValueError(
                f"{op}: {name} must fit {tensor_name}'s dtype {tensor_dtype} "
                f"[{lo}, {hi}]; got {value}"
            )
        return np.asarray(value, dtype=tensor_dtype)
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: {name} must be a NumPy array or a Python int; got {_kind(value)}")
    arr = as_array(op, name, value)
    if arr.dtype != tensor_dtype:
        raise TypeError(
            f"{op}: {name} must have the dtype of {tensor_name} ({tensor_dtype}); got dtype {arr.dtype}"
        )
    return arr


def output_zero_point(op: str, name: str, value: Any) -> np.ndarray:
    """y_zero_point: its dtype (uint8 or int8) decides the output type, so it must carry one."""
    if isinstance(value, (numbers.Integral, float)) and not isinstance(value, np.generic):
        raise TypeError(
            f"{op}: {name} decides the output dtype, so it must be a NumPy value such as "
            f"np.uint8({value}) or np.int8({value}); got {_kind(value)}"
        )
    return integer_tensor(op, name, value)


def same_shape(op: str, scale_name: str, scale_arr: np.ndarray, zp_name: str, zp_arr: np.ndarray) -> None:
    """ONNX: a scale and its zero point have the same shape (one element each counts as equal)."""
    if scale_arr.size == 1 and zp_arr.size == 1:
        return
    if scale_arr.shape != zp_arr.shape:
        raise ValueError(
            f"{op}: {scale_name} and {zp_name} must have the same shape; "
            f"got {scale_arr.shape} and {zp_arr.shape}"
        )


def per_tensor(op: str, name: str, arr: np.ndarray) -> np.ndarray:
    """A parameter the spec allows only per tensor: exactly one element, returned 0-d."""
    if arr.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar (one element, per tensor); got shape {arr.shape}")
    return arr.reshape(())


def per_channel(op: str, name: str, arr: np.ndarray, count: int, what: str) -> np.ndarray:
    """A scalar or a 1-D parameter with one element per channel; returned 0-d or 1-D."""
    if arr.size == 1:
        return arr.reshape(())
    if arr.ndim != 1 or arr.shape[0] != count:
        raise ValueError(
            f"{op}: {name} must be a scalar or 1-D with one element per {what} ({count}); "
            f"got shape {arr.shape} ({arr.size} elements)"
        )
    return arr


def int_attribute(op: str, name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{op}: attribute {name} must be an integer; got {_kind(value)}")
    if value < minimum:
        raise ValueError(f"{op}: attribute {name} must be >= {minimum}; got {value}")
    if value > INT64_MAX:
        raise ValueError(f"{op}: attribute {name} must fit int64 (ONNX attributes are int64); got {value}")
    return int(value)


def ints_attribute(op: str, name: str, value: Any, length: int, minimum: int, why: str) -> tuple[int, ...]:
    """A list-of-ints attribute of a fixed length whose entries are at least ``minimum``."""
    try:
        items = [int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else None for v in value]
    except TypeError:
        raise TypeError(f"{op}: attribute {name} must be a sequence of integers; got {_kind(value)}") from None
    if any(v is None for v in items):
        raise TypeError(f"{op}: attribute {name} must contain only integers; got {list(value)}")
    if len(items) != length:
        raise ValueError(f"{op}: attribute {name} must have {length} values ({why}); got {len(items)}: {items}")
    bad = [v for v in items if v < minimum]
    if bad:
        raise ValueError(f"{op}: attribute {name} values must be >= {minimum}; got {items}")
    if max(items, default=0) > INT64_MAX:
        raise ValueError(f"{op}: attribute {name} values must fit int64 (ONNX attributes are int64); got {items}")
    return tuple(items)


def axis_attribute(op: str, axis: Any, rank: int) -> int:
    """Normalize a per-axis ``axis`` into [0, rank)."""
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool):
        raise TypeError(f"{op}: attribute axis must be an integer; got {_kind(axis)}")
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: attribute axis must be in [{-rank}, {rank - 1}] for a rank-{rank} x; got {axis}")
    return int(axis) % rank


def int32_bias(op: str, value: Any, out_channels: int) -> np.ndarray:
    """The optional bias B: int32 of shape [M]."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{op}: B must be a NumPy int32 array of shape ({out_channels},); got {_kind(value)}")
    arr = as_array(op, "B", value)
    if arr.dtype != np.int32:
        raise TypeError(f"{op}: B must have dtype int32; got dtype {arr.dtype}")
    if arr.shape != (out_channels,):
        raise ValueError(
            f"{op}: B must be 1-D with one element per output channel ({out_channels},); got shape {arr.shape}"
        )
    return arr


def finite_multiplier(op: str, multiplier: np.ndarray, names: str) -> np.ndarray:
    """The requantization multiplier must be finite: inf · 0 would make NaN, which has no integer."""
    if not np.all(np.isfinite(multiplier)):
        raise ValueError(
            f"{op}: the requantization multiplier {names} overflows float32 (it is not finite); "
            "the scales are out of range"
        )
    return multiplier
