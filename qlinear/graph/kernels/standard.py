"""The graph runtime's kernels for the six operators (QuantizeLinear, DequantizeLinear,
QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger), with constant weights prepared once,
and the standard operators onnx.reference runs wrongly or slowly: BatchNormalization
(inference, in onnxruntime's float32 order) and MaxPool (integers, and a vectorized float form).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import numpy as np

import onnx
from onnx import helper
from onnx.reference.op_run import OpRun
from onnx.reference.ops import load_op

import qlinear as _q
from ... import _native
from ... import dtypes as _dtypes
from ..._geometry import explicit_pads, window_output_sizes
from ...quantize import PreparedDequantize, PreparedDequantizeLinear, PreparedQuantize, PreparedQuantizeLinear
from ..errors import NodeError
from ..proto import T, node_attributes, node_version
from ..support import _opset10_not_scalar
from .base import KernelOp, constants_at, data_path

class _QLinearOp(KernelOp):
    """Base of the six operators' kernels (``base.KernelOp``), with their ONNX version."""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version(onnx_node.op_type, "", opset)

    def _check_opset10_scalar(self, what: str, value: Any) -> None:
        """QuantizeLinear-10 / DequantizeLinear-10: ``what`` must have one element (per-axis
        parameters came with opset 13); the rule ``check_model`` applies to constant ones."""
        bad = None if value is None else _opset10_not_scalar(self.onnx_node.op_type, what, np.shape(value))
        if bad:
            raise self._fail(bad)

    def _prepared_for(self, factory_name: str, weights: tuple, positions: tuple[int, ...], **kwargs):
        """``KernelOp._prepared_for`` of the package face's ``factory_name`` (looked up per call:
        the face is what a test or a user replaces), None when the face has none."""
        factory = getattr(_q, factory_name, None)
        if factory is None:
            return None
        return super()._prepared_for(factory, weights, positions, **kwargs)

    def _prepared_params(self, cls, scale, zero_point, axis):
        """``cls(scale, zero_point, axis=axis)`` built once when both are constants of the model
        (the same array objects on every run), else None (the caller validates per call)."""
        if constants_at(self, (1, 2)) is not True:
            return None
        key = (id(scale), id(zero_point))
        if self._cache_key != key or self._prepared is None:
            self._prepared = self._call(cls, scale, zero_point, axis=axis)
            self._cache_key = key
            self._weights_ref = (scale, zero_point)  # keep the arrays alive so ids stay unique
        return self._prepared

    # The repeat path of a node whose weights and per-tensor call parameters (scales, zero
    # points) are all constants of the model: after one call with them validated and run, the
    # node passes its prepared form NumPy scalars of the same values and dtypes (immutable,
    # so the prepared form's repeat path -- ``_prepared.RepeatMemo`` -- may trust them by identity)
    # instead of the model's 0-d or 1-element arrays, which a prepared form must re-validate
    # on every call. The prepared form still checks x on every call.
    _scalars: tuple | None = None  # (the model's parameter arrays, the scalars, the prepared form)
    _no_scalars = False  # some parameter is not a model constant

    def _scalar_params(self, params: tuple, positions: tuple[int, ...], prep) -> tuple | None:
        """The NumPy scalars standing for ``params`` (the node's inputs at ``positions``), when
        ``_remember_scalars`` kept them for these very objects and this prepared form."""
        known = self._scalars
        if known is None or known[2] is not prep:
            return None
        for a, b in zip(params, known[0]):
            if a is not b:
                return None
        return known[1]

    def _remember_scalars(self, params: tuple, positions: tuple[int, ...], prep) -> None:
        """After a successful call of ``prep`` with ``params``: keep their scalar forms when
        every one is a model constant of one element (None stays None)."""
        if self._no_scalars:
            return
        constant = constants_at(self, positions)
        if constant is False:
            self._no_scalars = True  # a parameter computed or fed at run time: never (decided once)
            return
        inputs = self.onnx_node.input
        names = [inputs[i] if i < len(inputs) else "" for i in positions]
        if (constant is None or len(names) != len(params)
                or any((p is not None) if not n else False for n, p in zip(names, params))
                or any(p is not None and (type(p) is not np.ndarray or p.size != 1) for p in params)):
            self._scalars = None
            return
        scalars = tuple(None if p is None else p.reshape(-1)[0] for p in params)
        self._scalars = (params, scalars, prep)

    def _check_float32(self, what: str, v) -> None:
        if v is not None and np.asarray(v).dtype != np.float32:
            raise self._fail(f"{what} is {np.asarray(v).dtype}; qlinear implements the float32 "
                             "contract only")

    def _check_8bit(self, what: str, v) -> None:
        if v is not None and np.asarray(v).dtype not in _dtypes.EIGHT_BIT:
            raise self._fail(f"{what} is {np.asarray(v).dtype}; only uint8 and int8 are supported")

    def _conv_attrs(self) -> dict[str, Any]:
        g = self.given
        out: dict[str, Any] = {"auto_pad": g.get("auto_pad", "NOTSET"), "group": g.get("group", 1)}
        for k in ("dilations", "kernel_shape", "pads", "strides"):
            if k in g:
                out[k] = list(g[k])
        return out


_F32_I32 = (np.dtype(np.float32), np.dtype(np.int32))
_NARROW_SCALES = (np.dtype(np.float16), _dtypes.BF16.dtype)


def _dtype(v: Any) -> np.dtype | None:
    """A kernel input's dtype (None for an absent one)."""
    return None if v is None else np.asarray(v).dtype


class _NewerQDQ(_QLinearOp):
    """What QuantizeLinear and DequantizeLinear share for the newer types and attributes
    (versions 19-28): the prepared form (``PreparedQuantizeLinear`` / ``PreparedDequantizeLinear``)
    of the node's constant scale and zero point, built once, and its checks at prepare time."""

    _newer_key: tuple | None = None
    _newer: Any = None
    _newer_ref: tuple = ()

    def _newer_attrs(self) -> dict[str, Any]:
        raise NotImplementedError

    def _newer_path(self, xdt: np.dtype | None, scale: Any, zero_point: Any) -> bool | None:
        """Whether the newer types' path runs: True, False, or None when it depends on x's
        dtype and that is unknown (None)."""
        raise NotImplementedError

    def _newer_prepared(self, scale: Any, zero_point: Any):
        """The prepared form of these constant parameters (built on the first call with them),
        or None when they are not both constants of the model."""
        if constants_at(self, (1, 2)) is not True:
            return None
        key = (id(scale), id(zero_point))
        if self._newer_key != key or self._newer is None:
            cls = PreparedQuantizeLinear if isinstance(self, QuantizeLinear) else PreparedDequantizeLinear
            self._newer = self._call(cls, scale, zero_point, **self._newer_attrs())
            self._newer_key, self._newer_ref = key, (scale, zero_point)
        return self._newer

    def prepare_constants(self, values: dict[str, Any], static: dict[str, tuple]) -> None:
        """At ``backend.prepare``: with the scale (and zero point) initializers of the model
        (``values``, the arrays the runs will pass), build the prepared form once, and when the
        model declares x's element type and whole shape (``static``: name -> (dtype, shape)),
        validate every parameter against it now: a bad scale shape, block size or zero-point
        type is a NodeError naming this node before any run."""
        names = list(self.onnx_node.input) + ["", ""]
        if constants_at(self, (1, 2)) is not True or names[1] not in values:
            return
        scale = values[names[1]]
        zero_point = values.get(names[2]) if names[2] else None
        if names[2] and zero_point is None:
            return  # a Constant node's output: known at the first run only
        xinfo = static.get(names[0])
        newer = self._newer_path(xinfo[0] if xinfo else None, scale, zero_point)
        if newer is not True:
            return
        prep = self._newer_prepared(scale, zero_point)
        if prep is not None and xinfo is not None and xinfo[1] is not None:
            self._call(prep.plan, *xinfo)


class QuantizeLinear(_NewerQDQ):
    def _newer_attrs(self) -> dict[str, Any]:
        g = self.given
        return dict(axis=g.get("axis", 1), block_size=g.get("block_size", 0), saturate=g.get("saturate", 1),
                    output_dtype=g.get("output_dtype", 0) or None, precision=g.get("precision", 0) or None,
                    version=self.version)

    def _newer_path(self, xdt, y_scale, y_zero_point):
        g = self.given
        if (g.get("block_size", 0) or g.get("precision", 0) or g.get("output_dtype", 0) not in (0, T.UINT8)
                or _dtype(y_scale) != np.float32
                or (y_zero_point is not None and _dtype(y_zero_point) not in _dtypes.EIGHT_BIT)):
            return True
        if xdt is None:
            return None
        return xdt not in _F32_I32 or (self.version >= 19 and xdt == np.int32)

    def _run(self, x, y_scale, y_zero_point=None, **_):
        prepared = self._prepared
        if prepared is not None and type(x) is np.ndarray and x.dtype == np.float32 \
                and y_scale is self._weights_ref[0] and y_zero_point is self._weights_ref[1]:
            # the same constant parameters as when ``prepared`` was built: every check below
            # passed then and depends only on them and the attributes (x checked here)
            return (self._call(prepared.run, x),)
        g = self.given
        if self._newer_path(_dtype(x), y_scale, y_zero_point):
            # the newer types and attributes (versions 19-28): the prepared form of constant
            # parameters, else the function, which takes them all
            prep = self._newer_prepared(y_scale, y_zero_point)
            if prep is not None:
                return (self._call(prep.run, x),)
            return (self._call(_q.quantize_linear, x, y_scale, y_zero_point, **self._newer_attrs()),)
        if not (self.version < 19 and np.asarray(x).dtype == np.int32):  # T1 of opsets 10-18: float, int32
            self._check_float32("input x", x)
        self._check_float32("y_scale", y_scale)
        odt = g.get("output_dtype", 0)
        if y_zero_point is None:
            if odt == T.INT8:
                y_zero_point = np.zeros((), np.int8)
            elif odt not in (0, T.UINT8):
                raise self._fail("output_dtype must be uint8 or int8")
        else:
            self._check_8bit("y_zero_point", y_zero_point)
            if odt and helper.tensor_dtype_to_np_dtype(odt) != y_zero_point.dtype:
                raise self._fail(f"output_dtype {helper.tensor_dtype_to_np_dtype(odt).name} differs from "
                                 f"y_zero_point's type {y_zero_point.dtype}")
        if self.version == 10:
            self._check_opset10_scalar("y_scale", y_scale)
            self._check_opset10_scalar("y_zero_point", y_zero_point)
        prepared = self._prepared_params(PreparedQuantize, y_scale, y_zero_point, g.get("axis", 1))
        if prepared is not None:
            return (self._call(prepared.run, x),)
        return (self._call(_q.quantize_linear, x, y_scale, y_zero_point, axis=g.get("axis", 1)),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_prepared_io(self, QuantizeLinear, inputs, fixed)


class DequantizeLinear(_NewerQDQ):
    def _newer_attrs(self) -> dict[str, Any]:
        g = self.given
        return dict(axis=g.get("axis", 1), block_size=g.get("block_size", 0),
                    output_dtype=g.get("output_dtype", 0) or None, version=self.version)

    def _newer_path(self, xdt, x_scale, x_zero_point):
        g = self.given
        if (g.get("block_size", 0) or g.get("output_dtype", 0) not in (0, T.FLOAT)
                or _dtype(x_scale) != np.float32):
            return True
        if xdt is None:
            return None
        return xdt not in (*_dtypes.EIGHT_BIT, np.dtype(np.int32))

    def _run(self, x, x_scale, x_zero_point=None, **_):
        prepared = self._prepared
        if prepared is not None and type(x) is np.ndarray and x.dtype in _dtypes.EIGHT_BIT \
                and x_scale is self._weights_ref[0] and x_zero_point is self._weights_ref[1]:
            return (self._call(prepared.run, x),)  # as in QuantizeLinear._run
        g = self.given
        if self._newer_path(_dtype(x), x_scale, x_zero_point):
            # the newer types and attributes (versions 19-28): the prepared form of constant
            # parameters, else the function, which takes them all
            prep = self._newer_prepared(x_scale, x_zero_point)
            if prep is not None:
                return (self._call(prep.run, x),)
            return (self._call(_q.dequantize_linear, x, x_scale, x_zero_point, **self._newer_attrs()),)
        if np.asarray(x).dtype not in (*_dtypes.EIGHT_BIT, np.dtype(np.int32)):
            raise self._fail(f"input x is {np.asarray(x).dtype}; only uint8, int8 and int32 "
                             "are supported")
        self._check_float32("x_scale", x_scale)
        if self.version == 10:
            self._check_opset10_scalar("x_scale", x_scale)
            self._check_opset10_scalar("x_zero_point", x_zero_point)
        prepared = self._prepared_params(PreparedDequantize, x_scale, x_zero_point, g.get("axis", 1))
        if prepared is not None:
            return (self._call(prepared.run, x),)
        return (self._call(_q.dequantize_linear, x, x_scale, x_zero_point, axis=g.get("axis", 1)),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_prepared_io(self, DequantizeLinear, inputs, fixed)


def _bound_prepared_io(node: _QLinearOp, cls: type, inputs: list, fixed: frozenset[int]):
    """QuantizeLinear's / DequantizeLinear's ``fast_path``: the repeat path of their ``_run``
    (the prepared form of these very constant parameters) bound to the input's shape."""
    prepared = node._prepared
    if (type(node) is not cls or prepared is None or len(inputs) not in (2, 3)
            or not node._bound(inputs, fixed, (1, 2))
            or inputs[1] is not node._weights_ref[0] or _arg(inputs, 2) is not node._weights_ref[1]):
        return None
    run = prepared.bound_run(inputs[0])
    return None if run is None else data_path(run)


def _arg(args: list | tuple, i: int) -> Any:
    return args[i] if len(args) > i else None


class QLinearConv(_QLinearOp):
    def _run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
             B=None, **_):
        params = (x_scale, x_zero_point, y_scale, y_zero_point)
        prep = self._prepared
        if prep is not None and w is self._weights_ref[0] and w_scale is self._weights_ref[1] \
                and w_zero_point is self._weights_ref[2] and B is self._weights_ref[3]:
            scalars = self._scalar_params(params, (1, 2, 6, 7), prep)
            if scalars is not None:  # every check below passed for these very objects
                return (self._call(prep.run, x, *scalars),)
        for what, v in (("x_scale", x_scale), ("w_scale", w_scale), ("y_scale", y_scale)):
            self._check_float32(what, v)
        attrs = self._conv_attrs()
        prep = self._prepared_for("prepare_qlinear_conv", (w, w_scale, w_zero_point, B), (3, 4, 5, 8),
                                  **attrs)
        if prep is not None:
            y = self._call(prep.run, x, *params)
            if prep is self._prepared:
                self._remember_scalars(params, (1, 2, 6, 7), prep)
            return (y,)
        return (self._call(_q.qlinear_conv, x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                           y_scale, y_zero_point, B, **attrs),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_weighted(self, QLinearConv, inputs, fixed, (3, 4, 5, 8))


class QLinearMatMul(_QLinearOp):
    def _run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
             **_):
        params = (a_scale, a_zero_point, y_scale, y_zero_point)
        prep = self._prepared
        if prep is not None and b is self._weights_ref[0] and b_scale is self._weights_ref[1] \
                and b_zero_point is self._weights_ref[2]:
            scalars = self._scalar_params(params, (1, 2, 6, 7), prep)
            if scalars is not None:  # as in QLinearConv._run
                return (self._call(prep.run, a, *scalars),)
        if any(_dtype(v) not in _dtypes.EIGHT_BIT for v in (a, b, y_zero_point)) or \
                any(_dtype(v) in _NARROW_SCALES for v in (a_scale, b_scale, y_scale)):
            # version 21: float8 operands or float16/bfloat16 scales, by the function; with a
            # float8 operand or output, a constant b is decoded once (its prepared form)
            if any(_is_float8(v) for v in (a, b, y_zero_point)):
                prep = KernelOp._prepared_for(self, _q.matmul.prepare_qlinear_matmul_float8,
                                              (b, b_scale, b_zero_point), (3, 4, 5))
                y = self._call(prep.run, a, *params)
                if prep is self._prepared:
                    self._remember_scalars(params, (1, 2, 6, 7), prep)
                return (y,)
            if any(_dtype(v) not in _dtypes.EIGHT_BIT for v in (a, b, y_zero_point)):
                return (self._call(_q.qlinear_matmul, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                                   y_scale, y_zero_point),)
            # 8-bit operands with float16/bfloat16 scales: the 8-bit prepared form, which widens
            # them to float32 exactly (the function's arithmetic)
        else:
            for what, v in (("a_scale", a_scale), ("b_scale", b_scale), ("y_scale", y_scale)):
                self._check_float32(what, v)
        prep = self._prepared_for("prepare_qlinear_matmul", (b, b_scale, b_zero_point), (3, 4, 5))
        if prep is not None:
            y = self._call(prep.run, a, *params)
            if prep is self._prepared:
                self._remember_scalars(params, (1, 2, 6, 7), prep)
            return (y,)
        return (self._call(_q.qlinear_matmul, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                           y_scale, y_zero_point),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_weighted(self, QLinearMatMul, inputs, fixed, (3, 4, 5))


def _is_float8(v: Any) -> bool:
    t = _dtypes.lookup(_dtype(v))
    return t is not None and t.is_float and t.bits == 8


def _bound_weighted(node: _QLinearOp, cls: type, inputs: list, fixed: frozenset[int],
                    weights: tuple[int, ...]):
    """QLinearConv's / QLinearMatMul's ``fast_path``: their repeat path (the prepared form of
    these very constant weights, called with the scalars of these very constant parameters)
    bound to the data input's shape."""
    prep = node._prepared
    params = (1, 2, 6, 7)
    if (type(node) is not cls or prep is None or len(inputs) < 8
            or not node._bound(inputs, fixed, params + weights)
            or any(_arg(inputs, i) is not r for i, r in zip(weights, node._weights_ref))):
        return None
    scalars = node._scalar_params(tuple(inputs[i] for i in params), params, prep)
    run = None if scalars is None else prep.bound_run(*scalars)
    return None if run is None else data_path(run)


class _IntegerOp(_QLinearOp):
    """ConvInteger and MatMulInteger: the data input, constant weights, two optional zero
    points; the repeat path of QLinearConv._run, plus a zero point computed at run time
    (DynamicQuantizeLinear's) handed straight to the prepared form."""

    def _integer(self, factory: str, plain, x, w, x_zero_point, w_zero_point, attrs=dict):
        prep = self._prepared
        if prep is not None and w is self._weights_ref[0] and w_zero_point is self._weights_ref[1]:
            scalars = self._scalar_params((x_zero_point,), (2,), prep)
            if scalars is not None:  # as in QLinearConv._run
                return (self._call(prep.run, x, *scalars),)
            if self._no_scalars:  # a zero point computed at run time
                return (self._call(prep.run, x, x_zero_point),)
        kw = attrs()  # the attributes: only off the repeat path
        prep = self._prepared_for(factory, (w, w_zero_point), (1, 3), **kw)
        if prep is not None:
            y = self._call(prep.run, x, x_zero_point)
            if prep is self._prepared:
                self._remember_scalars((x_zero_point,), (2,), prep)
            return (y,)
        return (self._call(plain, x, w, x_zero_point, w_zero_point, **kw),)


class ConvInteger(_IntegerOp):
    def _run(self, x, w, x_zero_point=None, w_zero_point=None, **_):
        return self._integer("prepare_conv_integer", _q.conv_integer, x, w, x_zero_point, w_zero_point,
                             self._conv_attrs)


class MatMulInteger(_IntegerOp):
    def _run(self, a, b, a_zero_point=None, b_zero_point=None, **_):
        return self._integer("prepare_matmul_integer", _q.matmul_integer, a, b, a_zero_point, b_zero_point)


def batch_normalization_inference(x, scale, bias, mean, var, epsilon=1e-5):
    """Inference BatchNormalization in onnxruntime's order of float32 operations.

    onnxruntime folds the statistics first (``inv_std = 1 / sqrt(var + eps)``,
    ``new_scale = inv_std * scale``, ``new_bias = bias - mean * new_scale``) and then
    computes ``y = x * new_scale + new_bias``; each step here is one float32 operation.
    """
    dt = x.dtype
    eps = dt.type(epsilon)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv_std = dt.type(1) / np.sqrt((var.astype(dt) + eps))
    new_scale = inv_std * scale.astype(dt)
    new_bias = bias.astype(dt) - mean.astype(dt) * new_scale
    return (x * new_scale.reshape(shape) + new_bias.reshape(shape)).astype(dt)


class BatchNormalization(OpRun):
    """BatchNormalization inference for versions 9-15 in onnxruntime's float32 order.

    Versions 9-13 are wrong in onnx.reference (batch statistics instead of the running ones);
    for 14-15 its formula is right but rounds differently from onnxruntime (ulps), so the same
    onnxruntime-order formula is used. Training mode (14-15) and versions 6-7 run as
    onnx.reference runs them.
    """

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version("BatchNormalization", "", opset)
        self._delegate = None
        training = node_attributes(onnx_node).get("training_mode", 0) or len(
            [o for o in onnx_node.output if o]) > 1
        if self.version < 9 or (self.version >= 14 and training):
            self._delegate = load_op("", "BatchNormalization", self.version)(onnx_node, run_params)

    def run(self, *args, **kwargs):  # noqa: D102 - bypass attribute plumbing when delegating
        if self._delegate is not None:
            return self._delegate.run(*args, **kwargs)
        return super().run(*args, **kwargs)

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None):
        eps = 1e-5 if epsilon is None else epsilon
        return (batch_normalization_inference(x, scale, bias, mean, var, eps),)


def max_pool(x, *, kernel_shape, strides=None, pads=None, dilations=None,
             auto_pad="NOTSET", ceil_mode=0):
    """MaxPool as a running maximum over kernel taps of strided views.

    Padded positions hold the type's minimum (-inf for floats), so they never win. A maximum
    is exact, so this is bit-identical to onnxruntime for integers and for NaN-free floats
    (a NaN in a window propagates to that output). The geometry is computed once per input
    shape and attributes (``_max_pool_plan``).
    """
    tup = lambda v: tuple(int(i) for i in v) if v is not None else None  # noqa: E731
    return _max_pool(x, (tup(kernel_shape), tup(strides), tup(pads), tup(dilations), str(auto_pad),
                         int(ceil_mode)))


def _max_pool(x: np.ndarray, attrs: tuple) -> np.ndarray:
    """max_pool with the attributes as a tuple (kernel, strides, pads, dilations, auto_pad,
    ceil_mode), each a tuple of ints or None: the compiled byte kernel for 8-bit NCHW input,
    the NumPy formulation otherwise."""
    key = (x.shape, *attrs)
    if x.ndim == 4 and x.dtype in _dtypes.EIGHT_BIT:
        C = _native.native()
        plan = _max_pool_native_plan(*key) if C is not None else None
        if plan is not None:
            # the compiled byte kernel (qlinear/csrc/elementwise/pool.c): same windows, same maximum
            out, geometry = plan
            y = _native.empty(out, x.dtype)
            C.maxpool2d(C.get_isa(), x if x.flags.c_contiguous else np.ascontiguousarray(x), y, *geometry,
                        x.dtype == np.int8)
            return y
    return _max_pool_numpy(x, key)


@functools.lru_cache(maxsize=256)
def _max_pool_native_plan(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(output shape, the native kernel's geometry arguments) of an NCHW MaxPool, or None when
    the attributes are malformed (the NumPy formulation then reports them as before)."""
    kernel, strides2, dilations2, pb, out = _max_pool_geometry(shape, kernel_shape, strides, pads,
                                                               dilations, auto_pad, ceil_mode)
    if not (len(kernel) == len(strides2) == len(dilations2) == len(pb) == 2
            and min(kernel + strides2 + dilations2) >= 1 and min(pb) >= 0):
        return None
    n, c, h, w = shape
    return out, (n * c, h, w, out[2], out[3], kernel[0], kernel[1], strides2[0], strides2[1],
                 dilations2[0], dilations2[1], pb[0], pb[1])


def _max_pool_numpy(x: np.ndarray, key: tuple) -> np.ndarray:
    """max_pool in NumPy: a running maximum over the taps' strided views of the padded input."""
    pad_width, taps, out = _max_pool_plan(*key)
    lo = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    if 0 in out:
        return np.full(out, lo, dtype=x.dtype)
    xp = np.pad(x, pad_width, constant_values=lo) if pad_width is not None else x
    y = np.array(xp[taps[0]], dtype=x.dtype)  # the first tap (a copy: y is written below)
    for sl in taps[1:]:
        np.maximum(y, xp[sl], out=y)
    return y


@functools.lru_cache(maxsize=256)
def _max_pool_geometry(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(kernel, strides, dilations, begin pads, output shape) of a MaxPool, every value explicit."""
    nd = len(shape) - 2
    spatial = list(shape[2:])
    kernel = list(kernel_shape)
    if len(kernel) != nd:  # check_model refuses it where the input's shape is known beforehand
        raise ValueError(f"MaxPool: kernel_shape {kernel} has {len(kernel)} values; x {tuple(shape)} has "
                         f"{nd} spatial axes")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    pb, pe = explicit_pads(spatial, kernel, strides, dilations, auto_pad,
                           list(pads) if pads is not None else None)
    out = window_output_sizes(spatial, kernel, strides, dilations, pb, pe, ceil_mode, "MaxPool")
    return tuple(kernel), tuple(strides), tuple(dilations), tuple(pb), tuple(shape[:2]) + tuple(out)


@functools.lru_cache(maxsize=256)
def _max_pool_plan(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(np.pad widths or None when every window lies inside x, the taps' index tuples, the
    output shape) of a MaxPool."""
    kernel, strides, dilations, pb, out_shape = _max_pool_geometry(
        shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    nd = len(shape) - 2
    spatial = list(shape[2:])
    out = list(out_shape[2:])
    pe = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i] - pb[i])
          for i in range(nd)]
    extra = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 - (spatial[i] + pb[i] + pe[i])) for i in range(nd)]
    pad_width = None
    if any(pb) or any(pe) or any(extra):
        pad_width = [(0, 0), (0, 0)] + [(pb[i], pe[i] + extra[i]) for i in range(nd)]
    taps = [(slice(None), slice(None)) + tuple(
                slice(off[i] * dilations[i], off[i] * dilations[i] + (out[i] - 1) * strides[i] + 1,
                      strides[i]) for i in range(nd))
            for off in itertools.product(*[range(k) for k in kernel])]
    return pad_width, taps, tuple(shape[:2]) + tuple(out)


class MaxPool(OpRun):
    """MaxPool with one output: the vectorized ``max_pool`` (onnx.reference pads integer tensors
    with NaN, which fails or casts to an arbitrary value, and loops over windows in Python for
    floats). With the Indices output, float inputs run as onnx.reference runs them."""

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version("MaxPool", "", opset)
        self.given = node_attributes(onnx_node)
        self._float = load_op("", "MaxPool", self.version)(onnx_node, run_params)
        self._with_indices = len([o for o in onnx_node.output if o]) > 1
        self._attr_key: tuple | None = None

    def run(self, *args, **kwargs):  # noqa: D102
        x = args[0]
        if type(x) is not np.ndarray:
            x = np.asarray(x)
        with_indices = self._with_indices
        if with_indices:
            if x.dtype.kind not in "iu":
                return self._float.run(*args, **kwargs)
            name = self.onnx_node.name or self.onnx_node.output[0]
            raise NodeError(f"node {name!r} (MaxPool-{self.version}): the Indices output is not "
                            "supported for integer inputs")
        key = self._attr_key
        if key is None:
            g = self.given
            tup = lambda v: tuple(int(i) for i in v) if v is not None else None  # noqa: E731
            key = (tup(g["kernel_shape"]), tup(g.get("strides")), tup(g.get("pads")), tup(g.get("dilations")),
                   str(g.get("auto_pad", "NOTSET")), int(g.get("ceil_mode", 0)))
            self._attr_key = key  # the attributes as max_pool reads them, converted once
        return (_max_pool(x, key),)

    def _run(self, *args, **kwargs):  # run() above does the work
        raise NotImplementedError

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """The compiled byte kernel's call bound to an 8-bit NCHW input of this shape (see
        ``_QLinearOp.fast_path``): what ``run`` does for it, minus the per-call planning."""
        x = inputs[0] if len(inputs) == 1 else None
        C = _native.native()
        if (type(self) is not MaxPool or self._with_indices or self._attr_key is None or C is None
                or type(x) is not np.ndarray or x.ndim != 4 or x.dtype not in _dtypes.EIGHT_BIT
                or not x.flags.c_contiguous):
            return None
        plan = _max_pool_native_plan(x.shape, *self._attr_key)
        if plan is None:
            return None
        (out, geometry), shape, dtype, signed = plan, x.shape, x.dtype, x.dtype == np.int8
        maxpool2d, empty = C.maxpool2d, _native.empty

        def run(ins: list) -> np.ndarray | None:
            x = ins[0]
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or _native.native() is not C):
                return None
            y = empty(out, dtype)
            maxpool2d(C.get_isa(), x, y, *geometry, signed)
            return y

        return run
