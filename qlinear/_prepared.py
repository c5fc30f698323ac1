"""The operators' call-path caches, in one place: look up a plan, run a plan.

Three paths skip work a call already did, each keyed so that it can never hand out a stale or
foreign answer:

- ``Memo``: what a prepared operator (or a plain call's shape-derived plan, ``PLAIN``) derived
  from validated values, keyed by those values (``param_key``: a parameter's bits and type;
  shapes, dtypes, attribute values; never a caller's array object). Bounded.
- ``RepeatMemo``: a prepared form's last native call, reused by the next call that passes the
  very same (or equal, immutable) parameters and an input of the same shape and dtype
  (``repeat``), or bound once for a caller that passes the same parameter objects on every
  call (``bind``: a graph's planned node).
- ``PLAIN``: the plain functions' lean path, the shape-derived part of a plain call's plan by
  shapes, dtypes and attribute values; the operator then checks only its parameters per call.

The plans themselves are the engine's (``qlinear.engines.native``): this module never knows a
C argument list; it keeps and guards what the engine planned and hands it back to the engine's
``run``. Thread rule: a prepared form's calls may overlap (the engine releases the GIL), so a
call passes what it remembers to ``remember`` itself, never through the object in between.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from . import _native
from ._validate import check_size, is_masked, max_output_bytes

F32, I32 = np.dtype(np.float32), np.dtype(np.int32)


def param_key(value: Any) -> tuple | None:
    """A hashable key for a one-element parameter's type and value (None for anything else),
    so that prepared operators can reuse what they derived from the same scales and zero points."""
    if type(value) is np.ndarray or isinstance(value, np.generic):   # the common cases, first
        if value.size != 1:
            return None
        return value.dtype, value.shape, value.tobytes()  # the bits: -0.0 is not 0.0
    if isinstance(value, np.ndarray):   # subclasses
        if value.size != 1 or is_masked(value):  # refused when validated
            return None
        return value.dtype, value.shape, value.tobytes()
    if isinstance(value, float):
        return float, math.copysign(1.0, value), value
    if isinstance(value, int):
        return type(value), value
    return None


class Memo:
    """What was derived from validated values, keyed by those values (``param_key``, shapes,
    dtypes, attribute values), so that repeated calls with the same ones skip the work.
    Bounded: at ``size`` entries the oldest one goes (not all of them: calls that alternate, a
    plain QLinearConv and a ConvInteger of one layer, keep their entries across the bound). A
    None key (something not keyable, such as a parameter of several elements) is never stored."""

    __slots__ = ("_items", "_size")

    def __init__(self, size: int = 16) -> None:
        self._items: dict[tuple, Any] = {}
        self._size = size

    def get(self, key: tuple | None) -> Any:
        return None if key is None else self._items.get(key)

    def put(self, key: tuple | None, value: Any) -> Any:
        if key is not None:
            items = self._items
            if len(items) >= self._size and key not in items:
                del items[next(iter(items))]
            items[key] = value
        return value

    def clear(self) -> None:
        self._items.clear()


#: The plain functions' shape-derived plans (the lean path), keyed by operator name first, then
#: shapes, dtypes, attribute values with their types and the output size limit; the value is
#: the engine's plan for such a call (``qlinear.engines.native.conv.run_plain`` and
#: ``matmul.run_plain`` take it).
PLAIN = Memo(128)


def one(p: Any, dtype: np.dtype) -> bool:
    """A one-element parameter of exactly ``dtype``: a NumPy scalar or a plain ndarray."""
    return (type(p) is dtype.type or (type(p) is np.ndarray and p.size == 1)) and p.dtype is dtype


def one_value(p: Any) -> int | float:
    """The Python number of a one-element NumPy parameter (a NumPy scalar or an ndarray), exactly
    as ``p.item()`` gives it, in fewer operations for a NumPy scalar (int() / float() of one:
    about 0.05 us against 0.4 us for ``item()``; a lean plain call reads four of them)."""
    if type(p) is np.ndarray:
        return p.item()
    return float(p) if p.dtype.kind == "f" else int(p)


#: unsigned integers of 2, 4 and 8 bytes, by size: a short contiguous last axis copied as one
_WIDE = {2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def copy_contiguous(x: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(x)``, the same bytes. A view whose last axis is contiguous but
    short (a Slice of the first 2 of 4 values per row: 2 or 4 int8, 2 float32 ...) is copied with
    each row as one unsigned integer of its size: NumPy's copy loops per row otherwise, taking
    ten times as long on such rows. Copying moves bits, whatever the dtype."""
    if x.ndim and x.shape[-1] > 1 and x.strides[-1] == x.itemsize and not x.flags.c_contiguous:
        wide = _WIDE.get(x.shape[-1] * x.itemsize)
        if wide is not None:
            y = np.empty(x.shape, x.dtype)
            y.view(wide)[...] = x.view(wide)
            return y
    return np.ascontiguousarray(x)


def contiguous(op: str, name: str, arr: np.ndarray) -> np.ndarray:
    """arr in C order for the native engine: a copy when it is not (a slice, a broadcast view
    that takes no memory), whose size is checked first like every array a call derives."""
    if arr.flags.c_contiguous:
        return arr
    check_size(op, f"a contiguous copy of {name}", arr.shape, arr.itemsize)
    return copy_contiguous(arr)


def immutable(p: Any) -> bool:
    """A parameter nobody can change after the call: None, a Python number, a NumPy scalar
    (a 0-d array is not: it can be written in place)."""
    return p is None or type(p) in (int, float) or isinstance(p, np.generic)


class RepeatMemo:
    """The last validated native call of a prepared form (or of a plain function whose
    parameters alone determine the call), for the repeat-call short path.

    ``remember(x, params, call)`` after a call whose input x and call parameters ``params``
    (scales, zero points) were validated, and which the engine ran as ``call`` (a tuple whose
    first item is the ISA level it was planned for): kept only if every parameter is immutable
    (``immutable``). ``recall(x, params)`` gives ``call`` back when a new call passes, parameter
    by parameter, the very same object or an equal one of the same type (immutable values:
    ``np.float32(0.02)`` written in the call is a new object every time, and the same type and
    value validate to the same arguments; a NaN equals nothing, so it always takes the full
    path; -0.0 and 0.0 are told apart) and an ndarray x of the same dtype object and shape, under an unchanged output size
    limit; otherwise None, and the caller takes its full, validating path. Never keyed on a
    caller's mutable array: 0-d arrays are not immutable, so they always take the full path.

    ``op`` and ``name`` name the input in the size error of its contiguous copy; with
    ``copies=False`` an x that is not C-contiguous takes the full path instead (an operator
    whose full path runs a broadcast view block by block, without a copy)."""

    __slots__ = ("_last", "_op", "_name", "_copies")

    def __init__(self, op: str = "", name: str = "x", copies: bool = True) -> None:
        self._last: tuple | None = None
        self._op, self._name, self._copies = op, name, copies

    def remember(self, x: np.ndarray, params: tuple, call: Any) -> None:
        if call is not None and all(immutable(p) for p in params):
            self._last = (x.shape, x.dtype, params, call, max_output_bytes())
        else:
            self._last = None

    def memo_for(self, params: tuple) -> tuple | None:
        """(x's shape, x's dtype, the remembered call, the output size limit then) when the
        remembered call's parameters are these very objects, else None."""
        last = self._last
        if last is None or len(last[2]) != len(params) or any(a is not b for a, b in zip(params, last[2])):
            return None
        return last[0], last[1], last[3], last[4]

    def recall(self, x: Any, params: tuple) -> Any:
        last = self._last
        if (last is None or type(x) is not np.ndarray or x.dtype is not last[1] or x.shape != last[0]
                or last[4] != max_output_bytes()):   # a lowered size limit: checked again
            return None
        for given, known in zip(params, last[2]):
            if given is not known and (known is None or type(given) is not type(known) or not given == known
                                       or (known == 0 and math.copysign(1, given) != math.copysign(1, known))):
                return None   # -0.0 == 0.0, yet a scale's sign reaches a float output
        return last[3]

    def repeat(self, x: Any, params: tuple, run: Callable[[Any, np.ndarray], Any]) -> Any:
        """``run(call, x)`` for the remembered call (``recall``) on the same engine and ISA
        level, x made C-contiguous (a checked copy; or None when the memo does not copy);
        None when the call is not a repeat (the caller takes its full path)."""
        call = self.recall(x, params)
        if call is None:
            return None
        C = _native.native()
        if C is None or C.get_isa() != call[0]:
            return None
        if not x.flags.c_contiguous:
            if not self._copies:
                return None
            x = contiguous(self._op, self._name, x)
        return run(call, x)

    def bind(self, params: tuple, run: Callable[[Any, np.ndarray], Any]) -> Callable[[Any], Any] | None:
        """The repeat path bound once to the remembered call whose parameters are these very
        objects, or None: ``f(x)`` is ``run(call, x)`` for an x of the remembered shape and
        dtype, C-contiguous, on the same engine, ISA level and output size limit (what
        ``repeat`` checks per call), else None (the caller then takes its full path). For a
        caller that passes the same parameter objects on every call (a graph's planned node,
        ``qlinear.graph.evaluator``): one Python frame, the engine's run and the native call."""
        memo = self.memo_for(params)
        C = _native.native()
        if memo is None or C is None:
            return None
        shape, dtype, call, limit = memo
        isa, native = call[0], _native.native

        def bound(x: Any) -> Any:
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or native() is not C or C.get_isa() != isa or max_output_bytes() != limit):
                return None
            return run(call, x)

        return bound


def content_key(value: Any) -> tuple | None:
    """A hashable key for a parameter's type, shape and bits, of up to 65,536 elements (a
    per-column scale or zero point as well as one element); None for anything else (a masked
    array, an ndarray subclass, a larger array)."""
    if type(value) is np.ndarray or isinstance(value, np.generic):
        if value.size > 65536:
            return None
        return type(value), value.dtype, value.shape, value.tobytes()
    return param_key(value) if not isinstance(value, np.ndarray) else None


def same_bytes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two C-contiguous arrays of equal size in bytes hold the same bytes (compared eight
    at a time: a byte-wise comparison takes several times as long)."""
    bx, by = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    if bx.size != by.size:
        return False
    n = bx.size // 8 * 8
    return bool(np.array_equal(bx[:n].view(np.uint64), by[:n].view(np.uint64)) and np.array_equal(bx[n:], by[n:]))


class ContentMemo:
    """What a plain call derived from a constant operand (a weight decoded once), for later
    plain calls that pass the same contents: keyed by ``key`` (the operand's dtype and shape,
    its parameters' ``content_key``, the output size limit), then the operand's bytes compared
    with a private copy kept with the entry. A hit is the same contents whatever the array
    object (a weight changed in place since, or another array of equal shape, never hits
    unless its bytes are equal). The derived value must be built from that private copy (and
    copies of the parameters), never from the caller's arrays, which may change after the
    call. Bounded: ``size`` entries and ``budget`` bytes of copies and derived arrays
    (``nbytes`` per entry), the oldest going first; an entry above the budget is not kept."""

    __slots__ = ("_items", "_size", "_budget", "_lock")

    def __init__(self, size: int = 4, budget: int = 128 << 20) -> None:
        self._items: dict[tuple, tuple[np.ndarray, Any, int]] = {}
        self._size, self._budget = size, budget
        self._lock = threading.Lock()  # put's eviction walks the entries

    def get(self, key: tuple | None, x: np.ndarray) -> Any:
        entry = None if key is None else self._items.get(key)
        if entry is None or not same_bytes(entry[0], x):
            return None
        return entry[1]

    def put(self, key: tuple | None, copy: np.ndarray, value: Any, nbytes: int) -> None:
        if key is None or nbytes > self._budget:
            return
        with self._lock:
            items = self._items
            items.pop(key, None)
            while items and (len(items) >= self._size or sum(e[2] for e in items.values()) + nbytes > self._budget):
                items.pop(next(iter(items)), None)
            items[key] = (copy, value, nbytes)

    def clear(self) -> None:
        self._items.clear()
