"""Convolution geometry, once for every rank: attributes → explicit pads → output shape.

Everything downstream (the engine) sees only explicit begin/end pads, strides, dilations
and the output's spatial shape; auto_pad is resolved here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

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
            auto_pad = auto_pad.decode()
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
        nsp = len(self.kernel)
        span = tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for n, s, e in zip(in_spatial, self.strides, span):
                out = -(-n // s)
                total = max(0, (out - 1) * s + e - n)
                small, large = total // 2, total - total // 2
                # The odd pixel of padding goes at the end for SAME_UPPER, at the beginning for SAME_LOWER.
                begin.append(small if self.auto_pad == "SAME_UPPER" else large)
                end.append(large if self.auto_pad == "SAME_UPPER" else small)
            pads_begin, pads_end = tuple(begin), tuple(end)
        elif self.pads is None or self.auto_pad == "VALID":
            pads_begin = pads_end = (0,) * nsp
        else:
            pads_begin, pads_end = self.pads[:nsp], self.pads[nsp:]
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
