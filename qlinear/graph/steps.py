"""The compiled plan's steps for the small standard operators (:mod:`qlinear.graph.plan`).

A step reads its input slots, writes its output slot. Here are the steps of the nodes whose
call the plan can make in one NumPy call, their constant inputs (the same objects on every
run, see :func:`qlinear.graph.plan.compile_plan`) checked and converted once:

- an elementwise binary with one constant operand: the ufunc, only the other operand's kind
  and dtype checked per call;
- ``Relu`` (qlinear's float kernel, :func:`qlinear.graph.kernels.float.relu`): its call for a
  small float tensor, ``np.maximum`` against a zero of the dtype;
- ``Reshape`` with a constant shape (qlinear's float kernel), ``Squeeze`` / ``Unsqueeze``
  (qlinear's, the output shape remembered per input shape), ``Transpose`` and ``Identity``
  (onnx.reference's): the view or copy those kernels return.

Each does exactly what the node's own call does for the inputs it takes, and hands anything
else (another kind, dtype or size, an input the call rejects) to ``fallback(s)``, the node's
general call, which gives the other results and raises the node's own errors.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from onnx.reference.ops.op_identity import Identity as _RefIdentity
from onnx.reference.ops.op_transpose import Transpose as _RefTranspose

from .kernels import float as _float

_ND = np.ndarray
Step = Callable[[list], None]

#: what ``float.relu`` takes the plain ``np.maximum(x, 0)`` for (its size threshold)
_RELU_PLAIN = 1 << 14
#: zeros of the float dtypes as 0-d arrays: the same ufunc loop as against ``x.dtype.type(0)``
#: (a scalar operand is made a 0-d array inside the call), without that conversion
_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float16, np.float32, np.float64)}
for _z in _ZEROS.values():
    _z.flags.writeable = False


def binary_with_constant(fct: Callable, a: int, o: int, const: Any, const_first: bool,
                         fallback: Step) -> Step | None:
    """An OpRunBinaryNumpy node (its ufunc ``fct``) whose other operand is the constant
    ``const``: the variable operand (slot ``a``) checked for its kind and dtype, the ufunc
    called, the result's dtype checked (the general loop's checks, the constant's done once)."""
    if type(const) is not _ND:
        return None
    cdt = const.dtype

    if const_first:
        def binary_c(s: list) -> None:
            x = s[a]
            if type(x) is _ND and (x.dtype is cdt or x.dtype == cdt):
                r = fct(const, x)
                if type(r) is not _ND:  # a ufunc of two 0-d arrays returns a scalar
                    r = np.asarray(r)
                if r.dtype is cdt or r.dtype == cdt:
                    s[o] = r
                    return
            fallback(s)
        return binary_c

    def binary_c(s: list) -> None:
        x = s[a]
        if type(x) is _ND and (x.dtype is cdt or x.dtype == cdt):
            r = fct(x, const)
            if type(r) is not _ND:
                r = np.asarray(r)
            if r.dtype is cdt or r.dtype == cdt:
                s[o] = r
                return
        fallback(s)
    return binary_c


def unary_kernel(pnode: Any, ins: tuple[int, ...], consts: dict[int, Any], o: int,
                 fallback: Step, defaults: dict[int, Any] | None = None) -> Step | None:
    """The step of a one-output node of these kinds (see the module docstring) reading slots
    ``ins`` (``consts``: position -> value of its constant inputs; ``defaults``: position ->
    the initializer of a graph input read there, which a run may feed instead), else None."""
    kind = type(pnode)
    if kind is _float.Reshape and len(ins) == 2 and 1 in (defaults or {}) and 0 not in consts:
        # a shape given as a graph input's default (IR < 4 lists every initializer as an
        # input): its dims while that very object is in the slot, else the kernel's call
        shape, b = defaults[1], ins[1]
        step = unary_kernel(pnode, ins, {1: shape}, o, fallback)
        if step is None:
            return None

        def reshape_default(s: list) -> None:
            if s[b] is shape:
                step(s)
            else:
                fallback(s)
        return reshape_default
    var = [j for j in range(len(ins)) if j not in consts]
    if len(var) != 1 or var[0] != 0:
        return None
    a = ins[0]
    if kind is _float.Relu and pnode._static_ok and len(ins) == 1:
        zeros = _ZEROS

        def relu(s: list) -> None:
            x = s[a]
            if type(x) is _ND and x.size < _RELU_PLAIN:
                z = zeros.get(x.dtype)
                if z is not None:
                    s[o] = np.maximum(x, z)
                    return
            fallback(s)
        return relu
    if kind is _float.Reshape and pnode._static_ok and len(ins) == 2:
        shape = consts[1]
        if type(shape) is not _ND or shape.dtype != np.int64 or shape.ndim != 1:
            return None
        dims = tuple(shape.tolist())
        if 0 in dims and not pnode.given.get("allowzero", 0):
            return None  # the output shape depends on the input's

        def reshape(s: list) -> None:
            x = s[a]
            if type(x) is _ND:
                try:
                    s[o] = x.reshape(dims)
                    return
                except ValueError:
                    pass  # the kernel's own call raises its error
            fallback(s)
        return reshape
    if isinstance(pnode, _float._AxesView) and kind in (_float.Squeeze, _float.Unsqueeze) \
            and pnode._static_ok and len(ins) in (1, 2):
        axes = consts.get(1)
        if len(ins) == 2 and axes is not None and not pnode.supported(np.zeros(1), axes):
            return None
        shapes: dict[tuple, tuple] = {}

        def axes_view(s: list) -> None:
            x = s[a]
            if type(x) is _ND:
                shape = shapes.get(x.shape)
                if shape is not None:
                    s[o] = x.reshape(shape)
                    return
            fallback(s)
            y = s[o]
            if type(x) is _ND and type(y) is _ND and len(shapes) < 64:
                shapes[x.shape] = y.shape  # the kernel's shape for this input shape and axes
        return axes_view
    if kind is _RefTranspose and len(ins) == 1 and not pnode.has_linked_attribute:
        perm = getattr(pnode, "perm", None)
        if perm is None or len(perm) == 0:
            def transpose_all(s: list) -> None:
                x = s[a]
                if type(x) is _ND:
                    s[o] = x.transpose()
                    return
                fallback(s)
            return transpose_all
        perm = tuple(int(p) for p in perm)
        rank = len(perm)

        def transpose(s: list) -> None:
            x = s[a]
            if type(x) is _ND and x.ndim == rank:
                try:
                    s[o] = x.transpose(perm)
                    return
                except ValueError:
                    pass
            fallback(s)
        return transpose
    if kind is _RefIdentity and len(ins) == 1:
        def identity(s: list) -> None:
            x = s[a]
            if type(x) is _ND:
                s[o] = x.copy()
                return
            fallback(s)
        return identity
    return None
