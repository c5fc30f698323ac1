"""onnxruntime's 16-bit intermediate saturation in its uint8 x int8 kernels: the emulation.

On x86 CPUs with AVX2 but without AVX-VNNI / AVX512-VNNI, onnxruntime's MLAS u8s8 GEMM
multiplies uint8 values by int8 values with ``vpmaddubsw``: it adds the products of each
adjacent pair of the reduction dimension, ``a[k]*b[k] + a[k+1]*b[k+1]``, into an int16 with
signed saturation; the int16 pair sums are then added exactly in int32. Both operands enter
*raw* (zero points not subtracted); zero points are corrected afterwards with exact row and
column sums. A pair sum can reach 2*255*127 = 64770, so whenever the int8 operand uses more
than 7 bits the result can saturate at 32767 (or -32768). With VNNI (``vpdpbusd``) the
products are added in int32 and onnxruntime is exact.

Which kernels saturate, and the pairs (consecutive elements in the kernel's packed K order),
found empirically on onnxruntime 1.32 (matched bit for bit on random full-range data):

- QLinearMatMul, uint8 a x int8 b: the natural k order, pairs (0,1), (2,3), ...
- MatMulInteger, uint8 a x int8 b: the same (int8 a x uint8 b is exact).
- QLinearConv, uint8 x x int8 w: im2col in NHWC order, K = (kernel positions row-major, then
  input channels of the group); padded positions hold the raw ``x_zero_point``. Depthwise
  convolutions (one input and one output channel per group) use another kernel that
  accumulates in int32 and does not saturate.
- ConvInteger, *int8 x* x uint8 w (its GEMM takes the weights as the left, unsigned,
  operand): im2col in NCHW order, K = (input channels of the group, then kernel positions),
  depthwise included; padded positions hold the raw ``x_zero_point``. uint8 x x int8 w is
  exact.

The ``emulate_*`` functions are the plain arithmetic of the saturating kernels;
``qlinear.backend.prepare(model, emulate="onnxruntime-avx2")`` and the CLI's ``--emulate
onnxruntime-avx2`` run whole models with them, on any CPU. qlinear's own kernels never
saturate. Which kind of CPU this is, by measurement: the probe, :mod:`qlinear.tools.ortsat`.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .. import dtypes
from .._geometry import explicit_pads

INT16_MIN, INT16_MAX = -32768, 32767


def pair_saturated_matmul(a_raw: np.ndarray, b_raw: np.ndarray, chunk_bytes: int = 1 << 26):
    """Σ over pairs of sat16(a[k]b[k] + a[k+1]b[k+1]) for a_raw [R, K], b_raw [K, N] -> int64 [R, N].

    K is padded with a zero to even length (a padded product is 0). Pair sums are at most
    2 * 255 * 128 = 65280 in magnitude, so int32 holds them before the clip.
    """
    a = np.asarray(a_raw, np.int32)
    b = np.asarray(b_raw, np.int32)
    r, k = a.shape
    n = b.shape[1]
    if k % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        b = np.pad(b, ((0, 1), (0, 0)))
    a0, a1 = a[:, 0::2], a[:, 1::2]
    b0, b1 = b[0::2], b[1::2]
    out = np.empty((r, n), np.int64)
    rows = max(1, chunk_bytes // max(1, (a0.shape[1] * n * 4)))
    for s in range(0, r, rows):
        t = a0[s:s + rows, :, None] * b0[None] + a1[s:s + rows, :, None] * b1[None]
        np.clip(t, INT16_MIN, INT16_MAX, out=t)
        out[s:s + rows] = t.sum(axis=1, dtype=np.int64)
    return out


def _zp_corrected(pairs, a_raw, b_raw, a_zp, b_zp):
    """Σ (a - a_zp)(b - b_zp) from Σ a·b (here: the saturated pair sums) and exact sums.

    ``a_zp`` is a scalar or a per-row column [R, 1]; ``b_zp`` scalar or per-column [1, N].
    """
    k = a_raw.shape[1]
    a64 = a_raw.astype(np.int64)
    b64 = b_raw.astype(np.int64)
    return (pairs - a_zp * b64.sum(0)[None, :] - b_zp * a64.sum(1)[:, None] + k * a_zp * b_zp)


def requantize(acc: np.ndarray, m: np.ndarray, y_zp: np.ndarray, out_dtype) -> np.ndarray:
    """sat(rne(float32(float32(acc) * m)) + y_zp), per docs/contract.md (wrap32 first)."""
    acc32 = np.asarray(((np.asarray(acc, np.int64) + 2**31) % 2**32) - 2**31).astype(np.int32)
    v = (acc32.astype(np.float32) * m.astype(np.float32)).astype(np.float32)
    r = np.rint(v).astype(np.float64) + np.asarray(y_zp, np.float64)
    lo, hi = dtypes.INT_RANGE[np.dtype(out_dtype)]
    return np.asarray(np.clip(r, lo, hi)).astype(out_dtype)


def _multiplier(x_scale, w_scale, y_scale):
    xs = np.asarray(x_scale, np.float32)
    ws = np.asarray(w_scale, np.float32)
    return ((xs * ws).astype(np.float32) / np.asarray(y_scale, np.float32)).astype(np.float32)


def applies(x_dtype, w_dtype) -> bool:
    """The saturating path is onnxruntime's uint8-activation x int8-weight kernel."""
    return np.dtype(x_dtype) == np.uint8 and np.dtype(w_dtype) == np.int8


# --------------------------------------------------------------------------- QLinearMatMul


def _matmul_accumulate(a: np.ndarray, b: np.ndarray, a_zp, b_zp) -> np.ndarray | None:
    """int64 Σ(a - a_zp)(b - b_zp) of the saturating kernel with numpy.matmul shapes (1-D
    operands as in numpy.matmul); ``a_zp`` per tensor, ``b_zp`` per tensor or per column
    ([N] or [..., 1, N]). None for parameter shapes the kernel does not take."""
    if a.ndim < 1 or b.ndim < 1 or np.asarray(a_zp).size != 1:
        return None
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    n = b2.shape[-1]
    bzp = np.asarray(b_zp, np.int64).reshape(-1)
    if bzp.size not in (1, n):
        return None
    bzp_cols = bzp.reshape(1, -1) if bzp.size > 1 else int(bzp[0])
    azp = int(np.asarray(a_zp).reshape(()))
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    if 0 in a2.shape or 0 in b2.shape:  # nothing to multiply: empty, or zeros if only K is 0
        out = np.zeros(batch + (a2.shape[-2], n), np.int64)
    elif b2.ndim == 2:  # one GEMM for every row of every batch entry
        rows = a2.reshape(-1, a2.shape[-1])
        acc = _zp_corrected(pair_saturated_matmul(rows, b2), rows, b2, azp, bzp_cols)
        out = acc.reshape(a2.shape[:-1] + (n,))
    else:
        ab = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
        bb = np.broadcast_to(b2, batch + b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
        outs = [_zp_corrected(pair_saturated_matmul(ai, bi), ai, bi, azp, bzp_cols)
                for ai, bi in zip(ab, bb)]
        out = np.stack(outs).reshape(batch + (a2.shape[-2], n)) if outs else \
            np.zeros(batch + (a2.shape[-2], n), np.int64)
    if b.ndim == 1:
        out = out[..., 0]
    if a.ndim == 1:
        out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
    return out


def emulate_qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """onnxruntime's QLinearMatMul result with 16-bit pair saturation; None if not u8s8.

    Per-tensor ``a`` parameters; ``b`` parameters per tensor or per column ([N] or
    [..., 1, N]); numpy.matmul shapes.
    """
    a, b = np.asarray(a), np.asarray(b)
    if not applies(a.dtype, b.dtype) or np.asarray(a_scale).size != 1:
        return None
    acc = _matmul_accumulate(a, b, a_zp, b_zp)
    if acc is None:
        return None
    bsc = np.asarray(b_scale, np.float32).reshape(-1)
    m = _multiplier(np.asarray(a_scale).reshape(()), bsc, np.asarray(y_scale).reshape(()))
    if m.size > 1 and b.ndim == 1:
        return None
    return requantize(acc, m if m.size > 1 else m.reshape(()), y_zp, np.asarray(y_zp).dtype)


# --------------------------------------------------------------------------- QLinearConv


def _conv_accumulate(x, x_zp, w, w_zp, order, *, auto_pad="NOTSET", dilations=None, group=1,
                     kernel_shape=None, pads=None, strides=None):
    """Σ over pairs of sat16 products of one convolution's im2col GEMM, zero points corrected.

    ``order``: the packed K order, "taps, channels" (QLinearConv: NHWC im2col, kernel
    positions row-major, then the group's input channels) or "channels, taps" (ConvInteger:
    NCHW im2col). Padded positions hold the raw ``x_zp``. Returns int64 [N, M, P] and the
    output's spatial shape.
    """
    n = x.shape[0]
    m_out, cg = w.shape[:2]
    mg = m_out // group
    spatial = list(x.shape[2:])
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    nd = len(spatial)
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    pb, pe = explicit_pads(spatial, kernel, strides, dilations, auto_pad, pads)
    xzp = int(np.asarray(x_zp).reshape(()))
    xp = np.pad(x.astype(np.int32), [(0, 0), (0, 0)] + list(zip(pb, pe)), constant_values=xzp)
    out_sp = [(spatial[i] + pb[i] + pe[i] - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1
              for i in range(nd)]
    wzp = np.broadcast_to(np.asarray(w_zp, np.int64).reshape(-1), (m_out,))
    acc = np.empty((n, m_out, int(np.prod(out_sp))), np.int64)
    offsets = list(itertools.product(*[range(k) for k in kernel]))
    for g in range(group):
        xg = xp[:, g * cg:(g + 1) * cg]
        taps = []
        for off in offsets:
            sl = tuple(slice(off[i] * dilations[i],
                             off[i] * dilations[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i])
                       for i in range(nd))
            taps.append(xg[(slice(None), slice(None)) + sl])  # [N, Cg, out...]
        patches = np.stack(taps, axis=2)  # [N, Cg, taps, out...]
        wg = w[g * mg:(g + 1) * mg].reshape(mg, cg, -1)  # [Mg, Cg, taps]
        if order == "taps, channels":
            perm = [0] + list(range(3, 3 + nd)) + [2, 1]
            wg = wg.transpose(0, 2, 1)
        else:
            perm = [0] + list(range(3, 3 + nd)) + [1, 2]
        rows = patches.transpose(perm).reshape(-1, len(offsets) * cg)
        wg = wg.reshape(mg, -1).T
        pairs = pair_saturated_matmul(rows, wg)
        acc_g = _zp_corrected(pairs, rows, wg, xzp, wzp[g * mg:(g + 1) * mg].reshape(1, -1))
        acc[:, g * mg:(g + 1) * mg] = acc_g.reshape(n, -1, mg).transpose(0, 2, 1)
    return acc, out_sp


def emulate_qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B=None,
                         *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                         pads=None, strides=None, **_: Any):
    """onnxruntime's QLinearConv result with 16-bit pair saturation; None if not applicable."""
    x, w = np.asarray(x), np.asarray(w)
    if not applies(x.dtype, w.dtype) or np.asarray(x_zp).size != 1:
        return None
    m_out = w.shape[0]
    if w.shape[1] == 1 and m_out // group == 1:
        return None  # depthwise kernel: int32 accumulation, no saturation
    acc, out_sp = _conv_accumulate(x, x_zp, w, w_zp, "taps, channels", auto_pad=auto_pad,
                                   dilations=dilations, group=group, kernel_shape=kernel_shape,
                                   pads=pads, strides=strides)
    m = np.broadcast_to(_multiplier(np.asarray(x_scale).reshape(()),
                                    np.asarray(w_scale, np.float32).reshape(-1),
                                    np.asarray(y_scale).reshape(())), (m_out,))
    if B is not None:
        acc = acc + np.asarray(B, np.int64).reshape(1, -1, 1)
    y = requantize(acc, m.reshape(1, -1, 1), y_zp, np.asarray(y_zp).dtype)
    return y.reshape(x.shape[0], m_out, *out_sp)


def _wrap32(acc: np.ndarray) -> np.ndarray:
    return np.asarray(((np.asarray(acc, np.int64) + 2**31) % 2**32) - 2**31).astype(np.int32)


def emulate_conv_integer(x, w, x_zp=None, w_zp=None, *, auto_pad="NOTSET", dilations=None,
                         group=1, kernel_shape=None, pads=None, strides=None, **_: Any):
    """onnxruntime's ConvInteger result with 16-bit pair saturation; None if not applicable.

    Measured on onnxruntime 1.32 (AVX2, no VNNI): ConvInteger runs its GEMM with the weights
    as the left operand, so the saturating pairing is *int8 x* with *uint8 w* (the packed K
    order is NCHW im2col: input channels of the group, then kernel positions), depthwise
    included; uint8 x with int8 w is exact there.
    """
    x, w = np.asarray(x), np.asarray(w)
    if not (x.dtype == np.int8 and w.dtype == np.uint8):
        return None
    x_zp = np.zeros((), x.dtype) if x_zp is None else np.asarray(x_zp)
    w_zp = np.zeros((), w.dtype) if w_zp is None else np.asarray(w_zp)
    if x_zp.size != 1:
        return None
    acc, out_sp = _conv_accumulate(x, x_zp, w, w_zp, "channels, taps", auto_pad=auto_pad,
                                   dilations=dilations, group=group, kernel_shape=kernel_shape,
                                   pads=pads, strides=strides)
    return _wrap32(acc).reshape(x.shape[0], w.shape[0], *out_sp)


def emulate_matmul_integer(a, b, a_zp=None, b_zp=None):
    """onnxruntime's MatMulInteger with 16-bit pair saturation (uint8 a x int8 b, natural k
    pairs, measured as for QLinearMatMul); None if not applicable. int8 a x uint8 b is exact
    in onnxruntime 1.32 on AVX2 (measured)."""
    a, b = np.asarray(a), np.asarray(b)
    if not applies(a.dtype, b.dtype):
        return None
    acc = _matmul_accumulate(a, b, 0 if a_zp is None else a_zp, 0 if b_zp is None else b_zp)
    return None if acc is None else _wrap32(acc)


def emulate(op_type: str, inputs: list, attrs: dict) -> np.ndarray | None:
    """onnxruntime's AVX2 (no VNNI) result of one node of the four GEMM-based operators, or
    None where its kernel is exact (other type pairings, depthwise QLinearConv) and the exact
    result is onnxruntime's. Errors propagate (validate the inputs first)."""
    w_index = 3 if op_type.startswith("QLinear") else 1
    if len(inputs) > w_index and (np.asarray(inputs[0]).size == 0 or np.asarray(inputs[w_index]).size == 0):
        return None  # an empty operand: no pair sum at all, the exact result is the kernel's
    return _emulate_op(op_type, inputs, attrs)


def _emulate_op(op_type: str, inputs: list, attrs: dict) -> np.ndarray | None:
    """The emulation of ``op_type`` on ``inputs`` (None for another operator)."""
    if op_type == "QLinearMatMul":
        return emulate_qlinear_matmul(*inputs[:8])
    if op_type == "QLinearConv":
        return emulate_qlinear_conv(*inputs[:9], **attrs)
    if op_type == "MatMulInteger":
        return emulate_matmul_integer(*inputs[:4])
    if op_type == "ConvInteger":
        return emulate_conv_integer(*inputs[:4], **attrs)
    return None


def emulate_node(op_type: str, inputs: list, attrs: dict) -> np.ndarray | None:
    """Emulate one QLinearConv / QLinearMatMul / ConvInteger / MatMulInteger node; None where
    onnxruntime's kernel does not saturate (other types, depthwise QLinearConv)."""
    try:
        return _emulate_op(op_type, inputs, attrs)
    except (ValueError, IndexError, TypeError):
        return None
