"""QLinearConv (10) and ConvInteger (10): validate → geometry → integer accumulation → requantize.

The prepared classes hold the constant weights pre-transformed once (centered, laid out as
the GEMM's right-hand matrix); the plain functions build one and run it, so both share
exactly one code path.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _validate as v
from ._engine import ConvKernel, conv_accumulate
from ._geometry import ConvAttributes, check_conv_shapes
from ._requant import multiplier, requantize_channels


class _ConvWeights:
    """Validated weights, attributes and the centered float32 GEMM matrix of one convolution."""

    def __init__(self, op: str, w: Any, w_zero_point: Any, attributes: dict[str, Any]) -> None:
        self.op = op
        w = v.integer_tensor(op, "w", w)
        if w.ndim < 3:
            raise ValueError(f"{op}: w must have rank >= 3 (M, C/group, k1, ...); got shape {w.shape}")
        self.w_shape = w.shape
        self.out_channels = w.shape[0]
        if w_zero_point is None:
            zp = np.zeros((), dtype=w.dtype)
        else:
            zp = v.zero_point(op, "w_zero_point", w_zero_point, "w", w.dtype)
            zp = v.per_channel(op, "w_zero_point", zp, self.out_channels, "output channel of w")
        # Copies: a prepared operator owns what it keeps (the caller may change its arrays).
        self.w_zero_point = np.array(zp, copy=True)
        self.attributes = ConvAttributes.from_onnx(op, w.shape, **attributes)
        v.check_size(op, "the float32 copy of w", w.shape, 4)
        centered = np.subtract(w, zp.reshape((-1,) + (1,) * (w.ndim - 1)), dtype=np.float32)
        self.kernel = ConvKernel(centered, self.attributes.group)
        # (x shape, x dtype, x_zero_point) → (validated zero point, geometry), for repeated calls.
        self._inputs = _Memo()

    def accumulate(self, x: Any, x_zero_point: Any, bias: np.ndarray | None = None,
                   out_dtype: type = np.int32,
                   bias_bound: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate x and its zero point; return ``conv_accumulate``'s (values, pending_bias):
        wrap32(acc + bias) of shape (N, M, O1..On), int32, or converted to float32 (rounding
        to nearest) for requantization, possibly with the bias still to add."""
        op = self.op
        x = v.integer_tensor(op, "x", x)
        zkey = ("absent",) if x_zero_point is None else v.param_key(x_zero_point)
        key = None if zkey is None else (x.shape, x.dtype, zkey)
        known = self._inputs.get(key)
        if known is None:
            check_conv_shapes(op, x.shape, self.w_shape, self.attributes.group)
            if x_zero_point is None:
                zp = np.zeros((), dtype=x.dtype)
            else:
                zp = v.per_tensor(op, "x_zero_point", v.zero_point(op, "x_zero_point", x_zero_point, "x", x.dtype))
                zp = np.array(zp, copy=True)  # memoized by value: never a view of the caller's array
            geom = self.attributes.geometry(x.shape[2:])
            v.check_size(op, "the output's int32 accumulator",
                         (x.shape[0], self.out_channels, *geom.out_spatial), 4)
            known = self._inputs.put(key, (zp, *geom.compact(op, x.shape)))
        zp, geom, gather = known
        if gather is not None:  # extreme pads or strides: only the positions the windows read
            x = gather.apply(x, zp)
        return conv_accumulate(x, zp, self.kernel, geom, bias, out_dtype, bias_bound)


class _Memo:
    """What a prepared operator derived from validated call parameters, keyed by their values
    (``_validate.param_key``), so that repeated calls with the same ones skip the work."""

    _SIZE = 16

    def __init__(self) -> None:
        self._items: dict[tuple, Any] = {}

    def get(self, key: tuple | None) -> Any:
        return None if key is None else self._items.get(key)

    def put(self, key: tuple | None, value: Any) -> Any:
        if key is not None:
            if len(self._items) >= self._SIZE:
                self._items.clear()
            self._items[key] = value
        return value


class PreparedConvInteger:
    """ConvInteger with constant weights pre-transformed once; call ``run`` per input."""

    def __init__(self, w: np.ndarray, w_zero_point: Any = None, **attributes: Any) -> None:
        self._weights = _ConvWeights("conv_integer", w, w_zero_point, attributes)

    def run(self, x: np.ndarray, x_zero_point: Any = None) -> np.ndarray:
        """int32 y = wrap32(Σ (x - x_zero_point)(w - w_zero_point)), shape (N, M, O1..On)."""
        return self._weights.accumulate(x, x_zero_point)[0]


class PreparedQLinearConv:
    """QLinearConv with constant weights, their scale/zero point and bias validated and pre-transformed."""

    def __init__(self, w: np.ndarray, w_scale: Any, w_zero_point: Any, B: Any = None, **attributes: Any) -> None:
        op = "qlinear_conv"
        if w_zero_point is None:
            raise TypeError(f"{op}: w_zero_point is required")
        self._weights = _ConvWeights(op, w, w_zero_point, attributes)
        m = self._weights.out_channels
        ws = v.per_channel(op, "w_scale", v.scale(op, "w_scale", w_scale), m, "output channel of w")
        v.same_shape(op, "w_scale", ws, "w_zero_point", self._weights.w_zero_point)
        self.w_scale = np.array(ws, copy=True)  # owned copies, not views of the caller's arrays
        self.bias = None if B is None else np.array(v.int32_bias(op, B, m), copy=True)
        self._bias_bound = 0 if B is None else int(np.abs(self.bias.astype(np.int64)).max(initial=0))
        # (x_scale, y_scale, y_zero_point) → (multiplier, y_zero_point), for repeated calls.
        self._params = _Memo()

    def run(self, x: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The quantized convolution of x; output dtype is y_zero_point's, shape (N, M, O1..On)."""
        op = "qlinear_conv"
        keys = (v.param_key(x_scale), v.param_key(y_scale), v.param_key(y_zero_point))
        known = self._params.get(None if None in keys else keys)
        if known is None:
            xs = v.per_tensor(op, "x_scale", v.scale(op, "x_scale", x_scale))
            ys = v.per_tensor(op, "y_scale", v.nonzero_scale(op, "y_scale", y_scale))
            yzp = v.per_tensor(op, "y_zero_point", v.output_zero_point(op, "y_zero_point", y_zero_point))
            yzp = np.array(yzp, copy=True)  # memoized by value: never a view of the caller's array
            m = v.finite_multiplier(op, multiplier(xs, self.w_scale, ys), "x_scale * w_scale / y_scale")
            known = self._params.put(None if None in keys else keys, (m, yzp))
        m, yzp = known
        if x_zero_point is None:
            raise TypeError(f"{op}: x_zero_point is required")
        # float32(wrap32(acc + B)), computed in place from here on: requantize.
        values, bias = self._weights.accumulate(x, x_zero_point, self.bias, np.float32, self._bias_bound)
        return requantize_channels(values, m, yzp, bias)


def prepare_conv_integer(
    w: np.ndarray,
    w_zero_point: Any = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> PreparedConvInteger:
    """Pre-transform ConvInteger's constant weights once for repeated ``run(x, x_zero_point)`` calls."""
    return PreparedConvInteger(w, w_zero_point, auto_pad=auto_pad, dilations=dilations, group=group,
                               kernel_shape=kernel_shape, pads=pads, strides=strides)


def prepare_qlinear_conv(
    w: np.ndarray,
    w_scale: Any,
    w_zero_point: Any,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> PreparedQLinearConv:
    """Pre-transform QLinearConv's constant weights once for repeated
    ``run(x, x_scale, x_zero_point, y_scale, y_zero_point)`` calls."""
    return PreparedQLinearConv(w, w_scale, w_zero_point, B, auto_pad=auto_pad, dilations=dilations, group=group,
                               kernel_shape=kernel_shape, pads=pads, strides=strides)


def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: Any = None,
    w_zero_point: Any = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    """ONNX ConvInteger-10: int32 convolution of (x - x_zero_point) with (w - w_zero_point).

    x is uint8/int8 (N, C, D1..Dn); w is uint8/int8 (M, C/group, k1..kn); x_zero_point is per
    tensor, w_zero_point per tensor or per output channel ([M]). Padded positions contribute 0.
    The sum is exact and wraps to int32 only at the end.
    """
    return prepare_conv_integer(w, w_zero_point, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides).run(x, x_zero_point)


def qlinear_conv(
    x: np.ndarray,
    x_scale: Any,
    x_zero_point: Any,
    w: np.ndarray,
    w_scale: Any,
    w_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    """ONNX QLinearConv-10, exact per docs/contract.md.

    acc = wrap32(Σ (x - x_zp)(w - w_zp) + B); m = float32(float32(x_scale · w_scale) / y_scale);
    y = sat(rne(float32(float32(acc) · m)) + y_zero_point), dtype of y_zero_point.
    w_scale / w_zero_point may be per output channel ([M]); zero points may differ per channel.
    """
    return prepare_qlinear_conv(w, w_scale, w_zero_point, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides).run(
        x, x_scale, x_zero_point, y_scale, y_zero_point)
