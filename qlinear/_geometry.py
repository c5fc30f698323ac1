"""Convolution geometry, once for every rank: attributes → explicit pads → output shape.

Everything downstream (the engine) sees only explicit begin/end pads, strides, dilations
and the output's spatial shape; auto_pad is resolved here and nowhere else.

Valid but extreme attributes (pads or strides of 2**20 on a small image) must not make
anything huge: ``ConvGeometry.compact`` rewrites such a geometry into an equivalent one on
the input positions the output windows actually read (``Gather``), padding included, so
that no padded copy is ever larger than what the windows read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from . import _validate as v

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class ConvGeometry:
    """The explicit geometry of one convolution call."""

    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    kernel: tuple[int, ...]
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]

    @property
    def padded_spatial(self) -> tuple[int, ...]:
        return tuple(b + n + e for b, n, e in zip(self.pads_begin, self.in_spatial, self.pads_end))

    def trim_padding(self) -> "PaddingTrim | None":
        """The outputs whose windows read input, when some read only padding; None when every
        window reads input (every usual convolution: pads below the kernel's extent).

        A window that reads only padding (x_zero_point, centered to 0) sums nothing: its value
        is the bias alone, the same at every such position. Pads of 2**31 on a small image make
        almost every window such a one; the NumPy engine computes only the windows reading
        input (on x cropped to what they read, pads and output shrunk to match) and fills the
        rest, instead of indexing and copying gigabytes of padding.
        """
        span = [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]
        ranges = []
        for b, n, s, sp, out in zip(self.pads_begin, self.in_spatial, self.strides, span,
                                    self.out_spatial):
            # window o covers padded positions [o*s, o*s + sp) = input [o*s - b, o*s - b + sp):
            # it reads input iff o*s - b + sp > 0 and o*s - b < n (Python ints: exact)
            lo = max(0, (b - sp) // s + 1)
            hi = min(out, (b + n - 1) // s + 1)
            ranges.append((lo, max(lo, hi)))
        if all(lo == 0 and hi == out for (lo, hi), out in zip(ranges, self.out_spatial)):
            return None
        out_slices = tuple(slice(lo, hi) for lo, hi in ranges)
        if any(hi == lo for lo, hi in ranges):  # every window reads padding only
            return PaddingTrim(None, (), out_slices)
        begin, end, size, crops = [], [], [], []
        for (lo, hi), b, n, s, sp in zip(ranges, self.pads_begin, self.in_spatial, self.strides, span):
            b2 = b - lo * s  # pads making exactly hi - lo windows, their reads unchanged
            e2 = (hi - lo - 1) * s + sp - b2 - n
            c0, c1 = max(0, -b2), max(0, -e2)  # a negative pad: input no window reads, cropped
            begin.append(max(0, b2))
            end.append(max(0, e2))
            size.append(n - c0 - c1)
            crops.append(slice(c0, n - c1))
        inner = ConvGeometry(tuple(begin), tuple(end), self.strides, self.dilations, self.kernel,
                             tuple(size), tuple(hi - lo for lo, hi in ranges))
        return PaddingTrim(inner, tuple(crops), out_slices)

    def compact(self, op: str, x_shape: tuple[int, ...], out_channels: int = 0
                ) -> tuple["ConvGeometry", "Gather | None"]:
        """An equivalent geometry with nothing larger than what the output windows read.

        A stride along an axis with one output (except in an unpadded 1x1 convolution, which
        the engine reads as x[..., ::stride]), and a dilation along an axis with a one-tap
        kernel, change nothing: they become 1. Along an axis where the windows read fewer
        positions (outputs × taps) than the padded input has, and the convolution is not an
        unpadded 1x1 one (which the engine already reads by striding), the input is replaced
        by the positions the windows read, in order, with x_zero_point where they read
        padding (``Gather``); on it the windows are back to back: stride = taps, dilation 1,
        no pads.

        Refuses (ValueError) what would still be too large for ``max_output_bytes()``: the
        gathered input and the engine's float32 padded copy of one image, each alone and,
        with the int32 output of ``out_channels`` channels and the index arrays, together.
        """
        nsp = len(self.kernel)
        # (Everything below runs on every unprepared call: new objects only when needed.)
        geom = self
        if 1 in self.kernel:
            dilations = tuple(1 if k == 1 else d for k, d in zip(self.kernel, self.dilations))
            if dilations != self.dilations:
                geom = replace(geom, dilations=dilations)
        if math.prod(self.kernel) == 1 and not any(self.pads_begin) and not any(self.pads_end):
            # The engine reads x[..., ::s] directly (its length along an axis is the output's):
            # nothing is padded; its float32 copy of an image has x's channels at the output's
            # spatial size (larger than the output when x has more channels than w outputs).
            v.check_size(op, "the float32 copy of one image of x",
                         (min(1, x_shape[0]), x_shape[1], *self.out_spatial), 4)
            v.check_total(op, [("the output", (x_shape[0], out_channels, *self.out_spatial), 4),
                               ("the float32 copy of one image",
                                (min(1, x_shape[0]), x_shape[1], *self.out_spatial), 4)])
            return geom, None
        if 1 in self.out_spatial:
            strides = tuple(1 if o == 1 else s for o, s in zip(self.out_spatial, self.strides))
            if strides != self.strides:
                geom = replace(geom, strides=strides)
        padded = self.padded_spatial
        axes = [i for i in range(nsp) if self.out_spatial[i] * self.kernel[i] < padded[i]]
        images = min(1, x_shape[0])  # no image (N = 0), no padded copy
        if not axes:
            v.check_size(op, "the float32 padded copy of one image of x", (images, x_shape[1], *padded), 4)
            v.check_total(op, [("the output", (x_shape[0], out_channels, *self.out_spatial), 4),
                               ("the float32 padded copy of one image", (images, x_shape[1], *padded), 4)])
            return geom, None
        strides, dilations = geom.strides, geom.dilations
        lengths = [self.out_spatial[i] * self.kernel[i] if i in axes else None for i in range(nsp)]
        for i in axes:
            v.check_size(op, f"the index of the positions read along spatial axis {i}", (lengths[i],), 8)
        padded = tuple(p if n is None else n for p, n in zip(self.padded_spatial, lengths))
        v.check_size(op, "x's positions read by the windows", (*x_shape[:2], *padded), 1)
        v.check_size(op, "the float32 padded copy of one image of x", (images, x_shape[1], *padded), 4)
        v.check_total(op, [("the output", (x_shape[0], out_channels, *self.out_spatial), 4),
                           ("x's positions read", (*x_shape[:2], *padded), 1),
                           ("the float32 padded copy of one image", (images, x_shape[1], *padded), 4)]
                      + [(f"the index of axis {i}", (lengths[i],), 8) for i in axes])
        indices = []
        begin, end, st, dil, size = (list(t) for t in (geom.pads_begin, geom.pads_end, strides, dilations,
                                                      geom.in_spatial))
        for i in axes:
            indices.append((i, _read_positions(self.in_spatial[i], self.pads_begin[i], strides[i],
                                               dilations[i], self.kernel[i], self.out_spatial[i])))
            begin[i] = end[i] = 0
            st[i], dil[i], size[i] = self.kernel[i], 1, self.out_spatial[i] * self.kernel[i]
        # Shrinking axes first, so that no intermediate gather is larger than x or the result.
        indices.sort(key=lambda item: len(item[1]) - self.in_spatial[item[0]])
        gathered = ConvGeometry(tuple(begin), tuple(end), tuple(st), tuple(dil), self.kernel,
                                tuple(size), self.out_spatial)
        return gathered, Gather(tuple(indices))


@dataclass(frozen=True)
class PaddingTrim:
    """The windows of a convolution that read input (``ConvGeometry.trim_padding``)."""

    geom: ConvGeometry | None  # their geometry on the cropped x; None: no window reads input
    x_slices: tuple[slice, ...]  # x's spatial crop
    out_slices: tuple[slice, ...]  # where their outputs go in the whole output


def _read_positions(n: int, begin: int, stride: int, dilation: int, taps: int, outputs: int) -> np.ndarray:
    """x index read by tap t of output o, at position o * taps + t, or -1 for padding.

    Only positions inside x are computed in int64, so huge pads or strides cannot overflow:
    for tap t, output o reads x index o * stride + t * dilation - begin, inside [0, n) exactly
    for o in [lo, hi); there it is start + (o - lo) * stride with start in [0, n) and
    (hi - lo - 1) * stride < n.
    """
    idx = np.full((outputs, taps), -1, dtype=np.int64)
    for t in range(taps):
        offset = t * dilation - begin  # Python ints: exact at any size
        lo = max(0, -(offset // stride))
        hi = min(outputs, -((offset - n) // stride))
        if hi > lo:
            idx[lo:hi, t] = np.arange(hi - lo, dtype=np.int64) * stride + (lo * stride + offset)
    return idx.reshape(-1)


@dataclass(frozen=True)
class Gather:
    """The input positions a convolution's windows read along some spatial axes."""

    indices: tuple[tuple[int, np.ndarray], ...]  # (spatial axis, x index per position or -1)

    def apply(self, x: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
        """x (N, C, D1..Dn) gathered along the axes, x_zero_point (which centers to 0, as
        padding does) where a window reads padding."""
        for axis, idx in self.indices:
            pad = idx < 0
            x = np.take(x, np.maximum(idx, 0), axis=2 + axis)
            if pad.any():
                x[(slice(None),) * (2 + axis) + (pad,)] = zero_point
        return x


@dataclass(frozen=True)
class ConvAttributes:
    """Validated convolution attributes; the input's spatial shape is still unknown."""

    op: str
    auto_pad: str
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...] | None
    group: int

    @classmethod
    def from_onnx(
        cls,
        op: str,
        w_shape: tuple[int, ...],
        *,
        auto_pad: Any = "NOTSET",
        dilations: Sequence[int] | None = None,
        group: Any = 1,
        kernel_shape: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
    ) -> "ConvAttributes":
        nsp = len(w_shape) - 2
        kernel = tuple(int(k) for k in w_shape[2:])
        if min(kernel) < 1:
            raise ValueError(f"{op}: w's spatial (kernel) dimensions must be >= 1; got w shape {tuple(w_shape)}")
        if isinstance(auto_pad, bytes):
            try:
                auto_pad = auto_pad.decode("ascii")
            except UnicodeDecodeError:
                raise ValueError(
                    f"{op}: attribute auto_pad must be one of {', '.join(AUTO_PADS)}; got {auto_pad!r}"
                ) from None
        if not isinstance(auto_pad, str):
            raise TypeError(f"{op}: attribute auto_pad must be a string; got {type(auto_pad).__name__}")
        if auto_pad not in AUTO_PADS:
            raise ValueError(f"{op}: attribute auto_pad must be one of {', '.join(AUTO_PADS)}; got {auto_pad!r}")
        group = v.int_attribute(op, "group", group, 1)
        if w_shape[0] % group:
            raise ValueError(
                f"{op}: the number of output channels (w.shape[0] = {w_shape[0]}) must be divisible by "
                f"group ({group})"
            )
        if kernel_shape is not None:
            given = v.ints_attribute(op, "kernel_shape", kernel_shape, nsp, 1, f"one per spatial axis of w {w_shape}")
            if given != kernel:
                raise ValueError(f"{op}: attribute kernel_shape must match w's spatial shape {kernel}; got {list(given)}")
        strides_t = (1,) * nsp if strides is None else v.ints_attribute(
            op, "strides", strides, nsp, 1, "one per spatial axis")
        dilations_t = (1,) * nsp if dilations is None else v.ints_attribute(
            op, "dilations", dilations, nsp, 1, "one per spatial axis")
        pads_t = None
        if pads is not None:
            pads_t = v.ints_attribute(op, "pads", pads, 2 * nsp, 0, "begin and end for each spatial axis")
            if auto_pad != "NOTSET":
                raise ValueError(
                    f"{op}: attribute pads cannot be used together with auto_pad={auto_pad!r}; got pads={list(pads_t)}"
                )
        return cls(op, auto_pad, kernel, strides_t, dilations_t, pads_t, group)

    def geometry(self, in_spatial: tuple[int, ...]) -> ConvGeometry:
        """Resolve auto_pad for an input's spatial shape and compute the output's."""
        span = tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))
        pads_begin, pads_end = map(tuple, explicit_pads(in_spatial, self.kernel, self.strides, self.dilations,
                                                        self.auto_pad, self.pads))
        out_spatial = []
        for axis, (n, b, e, s, k) in enumerate(zip(in_spatial, pads_begin, pads_end, self.strides, span)):
            padded = n + b + e
            if n == 0:
                raise ValueError(f"{self.op}: empty output window: x has size 0 on spatial axis {axis}")
            if padded < k:
                raise ValueError(
                    f"{self.op}: empty output window on spatial axis {axis}: x's size {n} padded to {padded} "
                    f"is smaller than w's dilated kernel extent {k} (kernel_shape {self.kernel[axis]}, "
                    f"dilation {self.dilations[axis]})"
                )
            out_spatial.append((padded - k) // s + 1)
        return ConvGeometry(pads_begin, pads_end, self.strides, self.dilations, self.kernel,
                            tuple(in_spatial), tuple(out_spatial))


def check_conv_shapes(op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int) -> None:
    """x is (N, C, D1..Dn) and w is (M, C/group, k1..kn) with n >= 1."""
    if len(x_shape) < 3:
        raise ValueError(f"{op}: x must have rank >= 3 (N, C, D1, ...); got shape {x_shape}")
    if len(w_shape) != len(x_shape):
        raise ValueError(f"{op}: w must have the same rank as x ({len(x_shape)}); got shape {w_shape}")
    if x_shape[1] != group * w_shape[1]:
        raise ValueError(
            f"{op}: x's channel count ({x_shape[1]}) must equal group × w.shape[1] "
            f"({group} × {w_shape[1]} = {group * w_shape[1]})"
        )


#: The values of auto_pad (ONNX's Conv and pooling pages).
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def explicit_pads(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int] | None = None, auto_pad: str = "NOTSET",
                  pads: Sequence[int] | None = None, *, split: str = "onnx") -> tuple[list[int], list[int]]:
    """(begin pads, end pads) of every spatial axis from the window attributes: the one
    auto_pad resolver of the package.

    ``auto_pad`` VALID, or NOTSET without ``pads``: no padding; NOTSET: ``pads`` (begin values,
    then end values). SAME_UPPER / SAME_LOWER pad so that the output has ceil(size / stride)
    positions, by one of two rules:

    - ``split="onnx"`` (the ONNX pages; every operator but the two pools below): the total is
      ``max(0, (ceil(n / s) - 1) * s + (k - 1) * d + 1 - n)`` over the dilated kernel, and its
      odd pixel goes at the end for SAME_UPPER, at the beginning for SAME_LOWER.
    - ``split="onnxruntime-pool"`` (onnxruntime's PoolAttributes, which AveragePool and
      com.microsoft QLinearAveragePool follow for exactness against it): the total is
      ``(ceil(n / s) - 1) * s + k - n`` over the *undilated* kernel and is NOT clamped at 0,
      and it is split with C's truncating division (begin ``total / 2`` for SAME_UPPER,
      ``(total + 1) / 2`` for SAME_LOWER). With a stride larger than the kernel the total is
      negative, and a negative pad crops the input (the windows are centred).
    """
    nd = len(spatial)
    if split not in ("onnx", "onnxruntime-pool"):
        raise ValueError(f"explicit_pads: split must be 'onnx' or 'onnxruntime-pool'; got {split!r}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        dilations = dilations or [1] * nd
        begin, end = [], []
        for i in range(nd):
            n, s = spatial[i], strides[i]
            if split == "onnx":
                total = max(0, (-(-n // s) - 1) * s + (kernel[i] - 1) * dilations[i] + 1 - n)
                head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            else:
                total = (-(-n // s) - 1) * s + kernel[i] - n
                head = int((total if auto_pad == "SAME_UPPER" else total + 1) / 2)  # C's truncation
            begin.append(head)
            end.append(total - head)
        return begin, end
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad must be one of {', '.join(AUTO_PADS)}; got {auto_pad!r}")
    if auto_pad == "VALID" or not pads:
        return [0] * nd, [0] * nd
    return [int(p) for p in pads[:nd]], [int(p) for p in pads[nd:]]


def window_output_sizes(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                        dilations: Sequence[int], pb: Sequence[int], pe: Sequence[int],
                        ceil_mode: int = 0, op: str = "") -> list[int]:
    """The output sizes of a pooling window over explicit pads (ONNX's pooling formula; with
    ``ceil_mode`` a last window that would start in the end padding is dropped). A padded input
    shorter than the window is a ValueError (onnxruntime: 'Calculated output dimension is
    negative'); an empty input gives an empty output. ``op`` prefixes the message."""
    out = []
    for i in range(len(spatial)):
        eff = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + pb[i] + pe[i] - eff
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + pb[i]:
            o -= 1  # the last window would start in the end padding
        if o < 0 and spatial[i] > 0:
            raise ValueError(f"{op + ': ' if op else ''}x's size {spatial[i]} on spatial axis {i}, padded to "
                             f"{spatial[i] + pb[i] + pe[i]}, is smaller than the window's extent {eff} "
                             f"(kernel_shape {kernel[i]}, dilation {dilations[i]}): no output window")
        out.append(max(o, 0))
    return out
