"""QLinearConv (10) and ConvInteger (10): validate → geometry → integer accumulation → requantize.

The prepared classes hold the constant weights pre-transformed once (centered, laid out as
the GEMM's right-hand matrix); the plain functions build one and run it, so both share
exactly one code path.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import _native
from . import _validate as v
from ._engine import ConvKernel, conv_accumulate, workspace_limit
from ._geometry import ConvAttributes, ConvGeometry, check_conv_shapes
from ._requant import multiplier, requantize_channels


class _ConvWeights:
    """Validated weights and attributes of one convolution, in each engine's form: the
    centered float32 GEMM matrix (NumPy engine) and the packed weights per ISA level (native
    engine), each built on first use."""

    def __init__(self, op: str, w: Any, w_zero_point: Any, attributes: dict[str, Any],
                 owned: bool = True) -> None:
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
        # A prepared form keeps its own copies (never views of the caller's arrays); a plain
        # call uses w once, while the caller waits.
        self.w = np.array(w, copy=True) if owned else w
        self._owned = owned   # a prepared form (kept for many calls), not a plain call
        self._kernel: ConvKernel | None = None
        self._native: dict[tuple[str, bool], np.ndarray] = {}
        # (x shape, x dtype, x_zero_point) → (validated zero point, geometry), for repeated calls.
        self._inputs = _Memo()
        # (ISA level, x shape, x dtype) → the native engine's call arguments (``run_native``).
        self._plans = _Memo()
        self._fits: tuple | None = None   # (geometry, native_fits's answer) of the last call

    @property
    def kernel(self) -> ConvKernel:
        """The NumPy engine's form of the weights (centered float32), built on first use."""
        if self._kernel is None:
            w, zp = self.w, self.w_zero_point
            centered = np.subtract(w, zp.reshape((-1,) + (1,) * (w.ndim - 1)), dtype=np.float32)
            self._kernel = ConvKernel(centered, self.attributes.group)
        return self._kernel

    def accumulate(self, checked: tuple, bias: np.ndarray | None = None, out_dtype: type = np.int32,
                   bias_bound: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """NumPy engine: return ``conv_accumulate``'s (values, pending_bias) for a checked
        input (``check_input``): wrap32(acc + bias) of shape (N, M, O1..On), int32, or
        converted to float32 (rounding to nearest) for requantization, possibly with the
        bias still to add."""
        x, zp, geom, compact = checked
        if not compact:
            compact.append(geom.compact(self.op, x.shape))
        geom, gather = compact[0]
        if gather is not None:  # extreme pads or strides: only the positions the windows read
            x = gather.apply(x, zp)
        return conv_accumulate(x, zp, self.kernel, geom, bias, out_dtype, bias_bound)

    def check_input(self, x: Any, x_zero_point: Any) -> tuple[np.ndarray, np.ndarray, ConvGeometry, list]:
        """Validate x and its zero point against the weights: (x, zero point, geometry, the
        NumPy engine's compact geometry once derived)."""
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
            # the NumPy engine's compact geometry is derived on first use (``accumulate``)
            known = self._inputs.put(key, (zp, geom, []))
        zp, geom, compact = known
        return x, zp, geom, compact

    # -- native engine -----------------------------------------------------------------------
    def native_fits(self, checked: tuple) -> bool:
        """Whether the native engine takes this call (rank and sizes within its int64/int
        arithmetic; the NumPy engine takes the rest)."""
        x, geom = checked[0], checked[2]
        if _native.native() is None:
            return False
        if x.size == 0 or self.w.size == 0:  # empty batch, no channels: the NumPy engine's zeros
            return False
        known = self._fits
        if known is not None and known[0] is geom:   # the memoized geometry of a repeated call
            return known[1]
        fits = self._native_fits(geom)
        self._fits = (geom, fits)
        return fits

    def _native_fits(self, geom: ConvGeometry) -> bool:
        if len(geom.kernel) > _NATIVE_MAX_RANK:
            return False
        k = self.w[0].size
        extents = (n + b + e + s + (kk - 1) * d for n, b, e, s, kk, d in zip(
            geom.in_spatial, geom.pads_begin, geom.pads_end, geom.strides, geom.kernel, geom.dilations))
        return k <= _NATIVE_MAX_K and max(extents) <= _NATIVE_MAX_EXTENT

    def native_weights(self, isa: str, kind: int) -> np.ndarray:
        """The weights in the native engine's form for ISA level ``isa`` and path ``kind``
        (``_GEMM``, ``_GEMM_FAST``, ``_DEPTHWISE``), built once per level and path: packed GEMM
        rows (conv.c's ql_conv_pack_w), or centered int16 taps (M, taps) for the depthwise
        kernel."""
        key = (isa, kind)
        got = self._native.get(key)
        if got is None:
            m = self.out_channels
            w2 = np.ascontiguousarray(self.w.reshape(m, -1))
            zp = np.ascontiguousarray(np.broadcast_to(self.w_zero_point.astype(np.int32).reshape(-1), (m,)))
            if kind == _DEPTHWISE:
                # |w - zp| <= 255: exact in int16
                got = np.subtract(w2, zp[:, None].astype(np.int16), dtype=np.int16)
                taps = got.shape[1]
                if self._owned and self.w.ndim == 4 and m == self.attributes.group and taps <= _DW_CL_MAX_TAPS:
                    # prepared forms: followed by the channels-last kernel's form (conv.h),
                    # blocks of 16 channels, taps padded to pairs, [block][tap][channel],
                    # zeros beyond (a plain call's weights are used once: conv.c gathers
                    # each block's instead, cheaper than building this)
                    cl = np.zeros((-(-m // 16) * 16, taps + taps % 2), dtype=np.int16)
                    cl[:m, :taps] = got
                    cl = cl.reshape(-1, 16, cl.shape[1]).transpose(0, 2, 1)
                    got = np.concatenate([got.ravel(), cl.ravel()])
            else:
                C = _native._C
                got = np.empty(C.conv_w_bytes(isa, kind, m, w2.shape[1]), dtype=np.uint8)
                C.conv_pack_w(isa, kind, w2, _native.TYPE_CODES[w2.dtype.name], m, w2.shape[1], zp, got)
            self._native[key] = got
        return got

    def fits_fast_path(self) -> bool:
        """Whether every centered weight w - w_zero_point lies in [-64, 64]: then the byte
        kernels' int16 pair sums |x'·(w - zw) + x'·(w - zw)| <= 2·255·64 = 32640 cannot
        saturate (x' = x in its u8 form, [0, 255]), which proves the fast path exact."""
        flag = getattr(self, "_fast", None)
        if flag is None:
            w = self.w.reshape(self.out_channels, -1)
            if w.size == 0:
                flag = True
            else:   # per-row extremes (fast reductions on 8-bit data) against the row's zero point
                zp = np.broadcast_to(self.w_zero_point.astype(np.int32).reshape(-1), (w.shape[0],))
                flag = bool(np.all(w.max(axis=1).astype(np.int32) - zp <= _FAST_BOUND)
                            and np.all(zp - w.min(axis=1).astype(np.int32) <= _FAST_BOUND))
            self._fast = flag
        return flag

    def native_kind(self, isa: str, depthwise: bool) -> int:
        """The native path for this call: depthwise, the GEMM's fast path (a level that has
        one, weights proven within its bound) or the exact GEMM."""
        if depthwise:
            return _DEPTHWISE
        if _has_conv_fast(isa) and self.fits_fast_path():
            return _GEMM_FAST
        return _GEMM

    def run_native(self, checked: tuple, bias: np.ndarray | None = None, mult: np.ndarray | None = None,
                   y_zero_point: np.ndarray | None = None) -> np.ndarray:
        """The convolution on the native engine: int32 wrap32(acc + bias) (``mult`` None), or
        requantized with the per-channel (or per-tensor) float32 multiplier and y_zero_point."""
        x, zp, geom, _ = checked
        C = _native._C
        isa = C.get_isa()
        # The call's constant arguments, derived once per (level, input) and reused while the
        # memoized geometry, zero point and requantization parameters are the same objects
        # (``_Memo`` hands out the same ones for the same values): a repeated call only
        # allocates y and crosses into C.
        key = (isa, x.shape, x.dtype)
        plan = self._plans.get(key)
        if plan is None or plan[0] is not geom or plan[1] is not zp or plan[2] is not mult \
                or plan[3] is not y_zero_point:
            plan = self._plans.put(key, (geom, zp, mult, y_zero_point) + self._native_plan(isa, x, zp, geom, mult,
                                                                                           y_zero_point))
        kind, w, out_shape, y_dtype, head, tail = plan[4:]
        y = _native.empty(out_shape, y_dtype)   # 1 MiB and more: from the output pool
        if bias is not None:
            bias = np.ascontiguousarray(bias, dtype=np.int32)
        C.conv(isa, kind, np.ascontiguousarray(x), *head, w, y, *tail, bias,
               max(workspace_limit(), _NATIVE_MIN_WORKSPACE))
        return y

    def _native_plan(self, isa: str, x: np.ndarray, zp: np.ndarray, geom: ConvGeometry,
                     mult: np.ndarray | None, y_zero_point: np.ndarray | None) -> tuple:
        """(kind, packed weights, output shape, output dtype, C.conv's arguments before the
        weights and between y and the bias) for ``run_native``."""
        n, c = x.shape[:2]
        m, group = self.out_channels, self.attributes.group
        kind = self.native_kind(isa, group > 1 and c == group)
        w = self.native_weights(isa, kind)
        out_shape = (n, m, *geom.out_spatial)
        if mult is None:
            y_dtype = np.dtype(np.int32)
            tail = (0, 0, 0, 0.0, 0.0, _NO_MULT, 0)
        else:
            y_dtype = y_zero_point.dtype
            info = np.iinfo(y_dtype)
            yz = int(y_zero_point)
            mm = np.ascontiguousarray(mult, dtype=np.float32).reshape(-1)
            tail = (1, int(info.min < 0), yz, float(info.min - yz), float(info.max - yz), mm, int(mm.size > 1))
        head = (_native.TYPE_CODES[x.dtype.name], int(zp), (n, c, m, group), geom.in_spatial, geom.out_spatial,
                geom.kernel, geom.strides, geom.dilations, geom.pads_begin)
        return kind, w, out_shape, y_dtype, head, tail

# Native paths (module.c's conv kinds): the exact GEMM, the depthwise kernel, the GEMM's
# 7-bit fast path (conv.c's QL_FORM_S8U8), and the fast path's bound on |w - w_zero_point|.
_GEMM, _DEPTHWISE, _GEMM_FAST = 0, 1, 2
_FAST_BOUND = 64
# conv.c's DWCL_MAX_TAPS: the channels-last depthwise kernel's largest kernel
_DW_CL_MAX_TAPS = 64

# The native engine's limits (qlinear/_native/conv.h, module.c); beyond them the NumPy engine runs.
_NATIVE_MAX_RANK = 12
_NATIVE_MAX_K = 1 << 29
_NATIVE_MAX_EXTENT = 1 << 59
# The native engine's scratch is per thread and bounded by constants (offset tables, a few
# rows): it is always allowed this much, whatever the workspace limit.
_NATIVE_MIN_WORKSPACE = 16 << 20
_CONV_FAST: dict[str, bool] = {}


def _has_conv_fast(isa: str) -> bool:
    """Whether ISA level ``isa`` has the convolutions' fast-path kernel (asked once per level)."""
    got = _CONV_FAST.get(isa)
    if got is None:
        got = _CONV_FAST[isa] = _native._C.kernel_info(isa, _GEMM_FAST) is not None
    return got
_NO_MULT = np.ones(1, dtype=np.float32)


def _immutable(value: Any) -> bool:
    """Whether a call parameter cannot change after the call (NumPy scalars, Python numbers):
    the same object again is the same value, so a repeated call may skip its validation.
    Arrays (0-d ones included) may be written in place between calls: never."""
    return isinstance(value, (np.generic, float, int))


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

    def __init__(self, w: np.ndarray, w_zero_point: Any = None, _owned: bool = True, **attributes: Any) -> None:
        self._weights = _ConvWeights("conv_integer", w, w_zero_point, attributes, _owned)
        self._repeat: tuple | None = None   # the last native call's checked parameters (``_immutable``)

    def run(self, x: np.ndarray, x_zero_point: Any = None) -> np.ndarray:
        """int32 y = wrap32(Σ (x - x_zero_point)(w - w_zero_point)), shape (N, M, O1..On)."""
        rep = self._repeat
        if rep is not None and type(x) is np.ndarray and x.dtype is rep[0] and x.shape == rep[1] \
                and x_zero_point is rep[2]:
            checked = (x,) + rep[3]
            if self._weights.native_fits(checked):
                return self._weights.run_native(checked)
        checked = self._weights.check_input(x, x_zero_point)
        if self._weights.native_fits(checked):
            if checked[0] is x and type(x) is np.ndarray and (x_zero_point is None or _immutable(x_zero_point)):
                self._repeat = (x.dtype, x.shape, x_zero_point, checked[1:])
            return self._weights.run_native(checked)
        return self._weights.accumulate(checked)[0]


class PreparedQLinearConv:
    """QLinearConv with constant weights, their scale/zero point and bias validated and pre-transformed."""

    def __init__(self, w: np.ndarray, w_scale: Any, w_zero_point: Any, B: Any = None, _owned: bool = True,
                 **attributes: Any) -> None:
        op = "qlinear_conv"
        if w_zero_point is None:
            raise TypeError(f"{op}: w_zero_point is required")
        self._weights = _ConvWeights(op, w, w_zero_point, attributes, _owned)
        m = self._weights.out_channels
        ws = v.per_channel(op, "w_scale", v.scale(op, "w_scale", w_scale), m, "output channel of w")
        v.same_shape(op, "w_scale", ws, "w_zero_point", self._weights.w_zero_point)
        self.w_scale = np.array(ws, copy=True)  # owned copies, not views of the caller's arrays
        self.bias = None if B is None else np.array(v.int32_bias(op, B, m), copy=True)
        self._bias_bound = 0 if B is None else int(np.abs(self.bias.astype(np.int64)).max(initial=0))
        # (x_scale, y_scale, y_zero_point) → (multiplier, y_zero_point), for repeated calls.
        self._params = _Memo()
        # The last native call: x's dtype and shape, the parameter objects (``_immutable``
        # ones only) and what was derived from them, so that the same call again skips the
        # validation (a few microseconds, a tenth of a small depthwise layer).
        self._repeat: tuple | None = None

    def run(self, x: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The quantized convolution of x; output dtype is y_zero_point's, shape (N, M, O1..On)."""
        rep = self._repeat
        if rep is not None and type(x) is np.ndarray and x.dtype is rep[0] and x.shape == rep[1] \
                and x_scale is rep[2] and x_zero_point is rep[3] and y_scale is rep[4] and y_zero_point is rep[5]:
            checked = (x,) + rep[6]
            if self._weights.native_fits(checked):
                return self._weights.run_native(checked, self.bias, rep[7], rep[8])
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
        checked = self._weights.check_input(x, x_zero_point)
        if self._weights.native_fits(checked):
            if checked[0] is x and type(x) is np.ndarray \
                    and all(map(_immutable, (x_scale, x_zero_point, y_scale, y_zero_point))):
                self._repeat = (x.dtype, x.shape, x_scale, x_zero_point, y_scale, y_zero_point, checked[1:], m, yzp)
            return self._weights.run_native(checked, self.bias, m, yzp)
        # float32(wrap32(acc + B)), computed in place from here on: requantize. The float32
        # accumulator is 4 bytes per output value: images go in groups whose accumulator takes
        # at most half the workspace limit (the other half: the engine's padded copies and
        # column tiles), each requantized into its slice of the output.
        x, zp, geom, compact = checked
        n = x.shape[0]
        per_image = 4 * self._weights.out_channels * math.prod(geom.out_spatial)
        step = max(1, workspace_limit() // max(1, 2 * per_image))
        if n <= step:
            values, bias = self._weights.accumulate(checked, self.bias, np.float32, self._bias_bound)
            return requantize_channels(values, m, yzp, bias)
        y = np.empty((n, self._weights.out_channels, *geom.out_spatial), dtype=yzp.dtype)
        for n0 in range(0, n, step):
            part = (x[n0:n0 + step], zp, geom, compact)
            values, bias = self._weights.accumulate(part, self.bias, np.float32, self._bias_bound)
            requantize_channels(values, m, yzp, bias, out=y[n0:n0 + step])
            del values
        return y


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
    return PreparedConvInteger(w, w_zero_point, _owned=False, auto_pad=auto_pad, dilations=dilations, group=group,
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
    return PreparedQLinearConv(w, w_scale, w_zero_point, B, _owned=False, auto_pad=auto_pad, dilations=dilations,
                               group=group, kernel_shape=kernel_shape, pads=pads, strides=strides).run(
        x, x_scale, x_zero_point, y_scale, y_zero_point)
