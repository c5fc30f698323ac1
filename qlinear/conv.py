"""QLinearConv (10) and ConvInteger (10): validate → geometry → integer accumulation → requantize.

The prepared classes hold the constant weights pre-transformed once (centered, laid out as
the GEMM's right-hand matrix); the plain functions build one and run it, so both share
exactly one code path.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from . import _native
from . import _validate as v
from ._engine import ConvKernel, conv_accumulate
from ._prepared import F32, I32, PLAIN, Memo, RepeatMemo, contiguous, one, one_value, param_key
from .engines import workspace_limit
from .engines.native import conv as nconv
from ._geometry import ConvAttributes, ConvGeometry, check_conv_shapes
from ._elementwise import requantize_channels
from ._requant import multiplier


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
        self.attributes = _conv_attributes(op, w.shape, attributes)
        v.check_size(op, "the float32 copy of w", w.shape, 4)
        # A prepared form keeps its own copies (never views of the caller's arrays); a plain
        # call uses w once, while the caller waits.
        self.w = np.array(w, copy=True) if owned else w
        self.owned = owned
        self._kernel: ConvKernel | None = None
        self._native: dict[tuple[str, bool], np.ndarray] = {}
        # (x shape, x dtype, x_zero_point) → (validated zero point, geometry), for repeated calls.
        self._inputs = Memo()
        # (ISA level, x shape, x dtype) → the native engine's plan (``run_native``).
        self._plans = Memo()
        self._fits: tuple | None = None   # (geometry, native_fits's answer) of the last call
        # The last native call's arguments (``run_native``), and what makes them reusable by
        # the next call without validating again (``remember``, ``repeat``).
        self._last = RepeatMemo(op, "x")
        self.native_geometry: ConvGeometry | None = None

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
            trim = geom.trim_padding()  # None but for pads beyond the kernel's extent
            if trim is None:
                compact.append(geom.compact(self.op, x.shape, self.out_channels))
            else:
                crop = (*x.shape[:2], *(c.stop - c.start for c in trim.x_slices))
                compact.append(None if trim.geom is None else
                               trim.geom.compact(self.op, crop, self.out_channels))
            compact.append(trim)
        packed, trim = compact
        full = geom
        if trim is not None:  # windows reading padding only: computed once, below
            if packed is None:
                return self._padding_only(full, x.shape[0], None, bias, out_dtype), None
            x = x[(slice(None), slice(None), *trim.x_slices)]
        geom, gather = packed
        if gather is not None:  # extreme pads or strides: only the positions the windows read
            x = gather.apply(x, zp)
        values, pending = conv_accumulate(x, zp, self.kernel, geom, bias, out_dtype, bias_bound)
        if trim is None:
            return values, pending
        y = self._padding_only(full, values.shape[0], pending, bias, values.dtype)
        y[(slice(None), slice(None), *trim.out_slices)] = values
        return y, pending

    def _padding_only(self, geom: ConvGeometry, n: int, pending: np.ndarray | None,
                      bias: np.ndarray | None, dtype: Any) -> np.ndarray:
        """The whole output filled with the value of a window reading padding only: its sum is
        0, so the value is wrap32(0 + B) = B in ``dtype`` (float32(B) rounds to nearest, as
        the accumulator's conversion does), or 0 when the bias is absent or still pending."""
        m = self.out_channels
        y = np.empty((n, m, *geom.out_spatial), dtype=dtype)  # the output: checked by check_input
        if bias is None or pending is not None:
            y.fill(0)
        else:
            y[...] = bias.astype(dtype).reshape((m,) + (1,) * len(geom.out_spatial))
        return y

    def check_input(self, x: Any, x_zero_point: Any) -> tuple[np.ndarray, np.ndarray, ConvGeometry, list]:
        """Validate x and its zero point against the weights: (x, zero point, geometry, the
        NumPy engine's compact geometry once derived)."""
        op = self.op
        x = v.integer_tensor(op, "x", x)
        zkey = ("absent",) if x_zero_point is None else param_key(x_zero_point)
        # the size limit in the key: a lowered one checks a shape seen before again
        key = None if zkey is None else (x.shape, x.dtype, zkey, v.max_output_bytes())
        known = self._inputs.get(key)
        if known is None:
            check_conv_shapes(op, x.shape, self.w_shape, self.attributes.group)
            if x_zero_point is None:
                zp = np.zeros((), dtype=x.dtype)
            else:
                zp = v.per_tensor(op, "x_zero_point", v.zero_point(op, "x_zero_point", x_zero_point, "x", x.dtype))
                zp = np.array(zp, copy=True)  # memoized by value: never a view of the caller's array
            geom = _geometry(self.attributes, x.shape[2:])
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
        return nconv.fits(geom, self.w[0].size)

    def native_weights(self, isa: str, kind: int) -> np.ndarray:
        """The weights in the native engine's form for ISA level ``isa`` and path ``kind``
        (``nconv.GEMM``, ``GEMM_FAST``, ``DEPTHWISE``; ``nconv.pack_weights``), built once per
        level and path; a prepared form's depthwise weights with the channels-last form too."""
        key = (isa, kind)
        got = self._native.get(key)
        if got is None:
            got = nconv.pack_weights(isa, kind, self.w, self.w_zero_point, self.attributes.group, self.owned)
            self._native[key] = got
        return got

    def fits_fast_path(self, bound: int = 64) -> bool:
        """Whether every centered weight lies within the fast-path kernel's ``bound``
        (``nconv.within_fast_bound``), computed once per bound."""
        cache = getattr(self, "_fast", None)
        if cache is None:
            cache = self._fast = {}
        flag = cache.get(bound)
        if flag is None:
            flag = cache[bound] = nconv.within_fast_bound(self.w, self.w_zero_point, bound)
        return flag

    def native_kind(self, isa: str, depthwise: bool) -> int:
        """The native path for this call: depthwise, the GEMM's fast path (a level that has
        one, weights proven within its bound) or the exact GEMM."""
        return nconv.kind(isa, depthwise, self.w.shape, self.fits_fast_path)

    def run_native(self, checked: tuple, bias: np.ndarray | None = None, mult: np.ndarray | None = None,
                   y_zero_point: np.ndarray | None = None) -> tuple[np.ndarray, tuple | None]:
        """The convolution on the native engine: int32 wrap32(acc + bias) (``mult`` None), or
        requantized with the per-channel (or per-tensor) float32 multiplier and y_zero_point;
        and, for a prepared form, the call's plan (for ``remember``)."""
        x, zp, geom, _ = checked
        isa = _native._C.get_isa()
        self.native_geometry = geom   # what a plain call's lean path reuses (``_lean_remember``)
        # The call's plan, derived once per (level, input) and reused while the memoized
        # geometry, zero point and requantization parameters are the same objects (``Memo``
        # hands out the same ones for the same values): a repeated call only allocates y and
        # crosses into C.
        key = (isa, x.shape, x.dtype)
        plan = self._plans.get(key)
        if plan is None or plan[0] is not geom or plan[1] is not zp or plan[2] is not mult \
                or plan[3] is not y_zero_point:
            n, c = x.shape[:2]
            group = self.attributes.group
            depthwise = group > 1 and c == group
            if self.owned or depthwise:
                kind = self.native_kind(isa, depthwise)
                w = self.native_weights(isa, kind)
            else:  # a plain call: the path is chosen from this call's weights while packing them
                kind, w = nconv.pack_plain(isa, self.w, self.w_zero_point)
            plan = self._plans.put(key, (geom, zp, mult, y_zero_point, nconv.plan(
                isa, kind, w, x, zp, geom, self.out_channels, group, mult, y_zero_point)))
        if bias is not None:
            bias = np.ascontiguousarray(bias, dtype=np.int32)
        call = plan[4] + (bias,)
        y = nconv.run(call, contiguous(self.op, "x", x))
        return y, (call if self.owned else None)

    def remember(self, x: np.ndarray, params: tuple, call: tuple | None) -> None:
        """After a native call of a prepared form (``run_native``) with input x and call
        parameters ``params``, which returned the plan ``call``: keep it for ``repeat`` (see
        ``_prepared.RepeatMemo``). Passed by the caller, never kept on the object between the
        two: another thread's call on the same prepared form could replace it meanwhile."""
        self._last.remember(x, params, call)

    def repeat(self, x: Any, params: tuple) -> np.ndarray | None:
        """The output of a call that repeats the remembered one (see ``remember``), or None
        (then the call takes the full path)."""
        return self._last.repeat(x, params, nconv.run)

    def bound_repeat(self, params: tuple) -> Callable[[Any], np.ndarray | None] | None:
        """The repeat path (``repeat``) bound once to the remembered call whose parameters are
        these very objects, or None (``_prepared.RepeatMemo.bind``)."""
        return self._last.bind(params, nconv.run)


# Validated attributes and geometries, keyed by values (shapes, attribute values with their
# types: never by an array), so that plain calls of the same layer skip re-deriving them.
_ATTRIBUTES = Memo(64)
_GEOMETRIES = Memo(64)


def _value_key(value: Any) -> tuple | None:
    """A hashable key for an attribute's value and type(s), or None (not memoized): a list or
    tuple of plain values is keyed element by element with their types (1, 1.0, True and
    numpy.int64(1) are different keys: they validate differently)."""
    if value is None or type(value) in (int, str, bytes):
        return (type(value), value)
    if type(value) in (list, tuple) and all(type(e) is int for e in value):
        return (type(value), tuple(value))
    return None


def _conv_attributes(op: str, w_shape: tuple[int, ...], attributes: dict[str, Any]) -> ConvAttributes:
    """ConvAttributes.from_onnx, memoized by value (it depends on nothing else)."""
    keys = tuple((name, _value_key(value)) for name, value in attributes.items())
    key = None if any(k is None for _, k in keys) else (op, w_shape, keys)
    got = _ATTRIBUTES.get(key)
    if got is None:
        got = _ATTRIBUTES.put(key, ConvAttributes.from_onnx(op, w_shape, **attributes))
    return got


def _geometry(attributes: ConvAttributes, in_spatial: tuple[int, ...]) -> ConvGeometry:
    """attributes.geometry(in_spatial), memoized by value (a frozen dataclass and a shape)."""
    key = (attributes, in_spatial)
    got = _GEOMETRIES.get(key)
    if got is None:
        got = _GEOMETRIES.put(key, attributes.geometry(in_spatial))
    return got


class PreparedConvInteger:
    """ConvInteger with constant weights pre-transformed once; call ``run`` per input."""

    def __init__(self, w: np.ndarray, w_zero_point: Any = None, _owned: bool = True, **attributes: Any) -> None:
        self._weights = _ConvWeights("conv_integer", w, w_zero_point, attributes, _owned)

    def run(self, x: np.ndarray, x_zero_point: Any = None) -> np.ndarray:
        """int32 y = wrap32(Σ (x - x_zero_point)(w - w_zero_point)), shape (N, M, O1..On)."""
        y = self._weights.repeat(x, (x_zero_point,))
        if y is not None:
            return y
        checked = self._weights.check_input(x, x_zero_point)
        if self._weights.native_fits(checked):
            y, call = self._weights.run_native(checked)
            self._weights.remember(x, (x_zero_point,), call)
            return y
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
        # owned copies, not views of the caller's arrays (a plain call uses them once, while
        # the caller waits; its max |B| is found only if the NumPy engine needs it)
        self.w_scale = np.array(ws, copy=True) if _owned else ws
        self.bias = None if B is None else np.array(v.int32_bias(op, B, m), copy=_owned)
        self._bias_bound = 0 if B is None else (
            int(np.abs(self.bias.astype(np.int64)).max(initial=0)) if _owned else None)
        # (x_scale, y_scale, y_zero_point) → (multiplier, y_zero_point), for repeated calls.
        self._params = Memo()

    def bound_run(self, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any
                  ) -> Callable[[Any], np.ndarray | None] | None:
        """``run(x, x_scale, x_zero_point, y_scale, y_zero_point)`` bound to these very parameter
        objects, after a call with them that took the native engine: ``f(x)`` gives run's
        output for an x like that call's, None for any other (see
        ``_ConvWeights.bound_repeat``); None when there is no such call."""
        return self._weights.bound_repeat((x_scale, x_zero_point, y_scale, y_zero_point))

    def run(self, x: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any) -> np.ndarray:
        """The quantized convolution of x; output dtype is y_zero_point's, shape (N, M, O1..On)."""
        op = "qlinear_conv"
        y = self._weights.repeat(x, (x_scale, x_zero_point, y_scale, y_zero_point))
        if y is not None:
            return y
        keys = (param_key(x_scale), param_key(y_scale), param_key(y_zero_point))
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
            y, call = self._weights.run_native(checked, self.bias, m, yzp)
            self._weights.remember(x, (x_scale, x_zero_point, y_scale, y_zero_point), call)
            return y
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
    key = _lean_key("conv_integer", x, w, auto_pad, dilations, group, kernel_shape, pads, strides)
    y = _lean_conv(key, x, x_zero_point, w, w_zero_point)
    if y is not None:
        return y
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                      strides=strides)
    p = PreparedConvInteger(w, w_zero_point, _owned=False, **attributes)
    y = p.run(x, x_zero_point)
    _lean_remember(key, p._weights)
    return y


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
    key = _lean_key("qlinear_conv", x, w, auto_pad, dilations, group, kernel_shape, pads, strides)
    y = _lean_conv(key, x, x_zero_point, w, w_zero_point, (x_scale, w_scale, y_scale, y_zero_point, B))
    if y is not None:
        return y
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                      strides=strides)
    p = PreparedQLinearConv(w, w_scale, w_zero_point, B, _owned=False, **attributes)
    y = p.run(x, x_scale, x_zero_point, y_scale, y_zero_point)
    _lean_remember(key, p._weights)
    return y


# ---------------------------------------------------------------------------------------------
# The lean path of plain calls
#
# A plain call validates and plans everything, like a prepared form's first call. What depends
# only on shapes, dtypes and attribute values (the geometry, the shape checks, the size limit's
# verdict) is then remembered by those values (``_lean_remember``, in ``_prepared.PLAIN``),
# never by an array; a later plain call with equal ones checks only what may differ (its
# parameters' types, shapes and values: finite scales, a nonzero y_scale, a finite multiplier,
# the bias) in a few operations and goes to the native engine. Anything unusual (Python numbers
# as parameters, subclasses, another engine, a parameter that fails a check) takes the full
# path, which raises the usual errors. Why: the full path's Python costs 0.2-0.4 ms per call
# right after a large convolution (cold caches), a third of what packing the weights costs.
# ---------------------------------------------------------------------------------------------


def _ints_key(value: Any) -> tuple | None:
    """_value_key of a list-of-ints attribute (or None), in fewer operations: it runs per call."""
    if value is None:
        return _NONE_KEY
    t = type(value)
    if t is list or t is tuple:
        for e in value:
            if type(e) is not int:
                return None
        return (t, tuple(value))
    return None


_NONE_KEY = (type(None), None)


def _lean_key(op: str, x: Any, w: Any, auto_pad: Any, dilations: Any, group: Any, kernel_shape: Any, pads: Any,
              strides: Any) -> tuple | None:
    """The key of a plain call's shape-derived plan: op, shapes, dtypes, attribute values with
    their types (as ``_value_key``), the size limit; None when something is not keyable."""
    if type(x) is not np.ndarray or type(w) is not np.ndarray or type(auto_pad) is not str or type(group) is not int:
        return None
    akey = (auto_pad, group, _ints_key(dilations), _ints_key(kernel_shape), _ints_key(pads), _ints_key(strides))
    if None in akey:
        return None
    return (op, x.shape, x.dtype, w.shape, w.dtype, akey, v.max_output_bytes())


def _lean_remember(key: tuple | None, weights: _ConvWeights) -> None:
    """After a plain call that ran natively (full path): remember its shape-derived plan."""
    geom = weights.native_geometry
    if key is None or geom is None:
        return
    PLAIN.put(key, nconv.plain_plan(key[1], key[3], weights.attributes.group, geom))


def _lean_conv(key: tuple | None, x: np.ndarray, x_zp: Any, w: np.ndarray, w_zp: Any,
               quant: tuple | None = None) -> np.ndarray | None:
    """A plain call by the lean path (see above), or None: the full path takes it. Python checks
    the parameters' types and shapes; the engine (``nconv.run_plain``) does the rest in one
    crossing."""
    plan = PLAIN.get(key)
    if plan is None or _native.native() is None:
        return None
    xd, wd = x.dtype, w.dtype
    m = plan[1][2]
    if x_zp is None:
        if quant is not None:
            return None
        zx = 0
    elif one(x_zp, xd):
        zx = one_value(x_zp)
    else:
        return None
    if w_zp is None:
        if quant is not None:
            return None
    elif not ((type(w_zp) is np.ndarray or type(w_zp) is wd.type) and w_zp.dtype is wd
              and (w_zp.size == 1 or w_zp.shape == (m,))):
        return None
    elif type(w_zp) is np.ndarray and not w_zp.flags.c_contiguous:
        w_zp = np.ascontiguousarray(w_zp)
    if quant is not None:
        x_scale, w_scale, y_scale, y_zp, bias = quant
        if not (one(x_scale, F32) and one(y_scale, F32) and (type(y_zp) is np.ndarray or isinstance(y_zp, np.generic))
                and y_zp.dtype in nconv.RANGES and y_zp.size == 1
                and (type(w_scale) is np.ndarray or type(w_scale) is np.float32) and w_scale.dtype is F32):
            return None
        if not ((w_scale.size == 1 and w_zp.size == 1) or (w_scale.shape == (m,) and w_zp.shape == (m,))):
            return None   # per tensor both, or per channel both, of shape (M,)
        if bias is not None:
            if type(bias) is not np.ndarray or bias.dtype is not I32 or bias.shape != (m,):
                return None
            if not bias.flags.c_contiguous:
                bias = np.ascontiguousarray(bias)
        if type(w_scale) is np.ndarray and not w_scale.flags.c_contiguous:
            w_scale = np.ascontiguousarray(w_scale)
        quant = (one_value(x_scale), w_scale, one_value(y_scale), y_zp.dtype, one_value(y_zp), bias)
    op = "conv_integer" if quant is None else "qlinear_conv"
    return nconv.run_plain(plan, x if x.flags.c_contiguous else contiguous(op, "x", x), zx,
                           w if w.flags.c_contiguous else contiguous(op, "w", w), w_zp, quant)
