"""onnxruntime's 16-bit intermediate saturation in its uint8 x int8 kernels, emulated.

On x86 CPUs with AVX2 but without AVX-VNNI / AVX512-VNNI, onnxruntime's MLAS u8s8 GEMM
multiplies uint8 activations by int8 weights with ``vpmaddubsw``: it adds the products of
each adjacent pair of the reduction dimension, ``a[k]*b[k] + a[k+1]*b[k+1]``, into an int16
with signed saturation; the int16 pair sums are then added exactly in int32. The activations
enter *raw* (uint8, zero point not subtracted) and the weights raw (int8); zero points are
corrected afterwards with exact row and column sums. A pair sum can reach 2*255*127 = 64770,
so whenever weights use more than 7 bits the result can saturate at 32767 (or -32768).

The pairs are consecutive elements in the kernel's packed K order, found empirically on
onnxruntime 1.32 (matched bit for bit on random full-range data):

- QLinearMatMul: the natural k order, pairs (0,1), (2,3), ...
- QLinearConv: im2col in NHWC order, K = (kernel positions row-major, then input channels of
  the group), pairs consecutive in that order; padded positions hold the raw ``x_zero_point``.
  Depthwise convolutions (one input and one output channel per group) use another kernel
  that accumulates in int32 and does not saturate.

Everything here is the plain arithmetic of that kernel, for diagnosis; qlinear's own kernels
never saturate.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

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
    acc32 = (((acc.astype(np.int64) + 2**31) % 2**32) - 2**31).astype(np.int32)
    v = (acc32.astype(np.float32) * m.astype(np.float32)).astype(np.float32)
    r = np.rint(v).astype(np.float64) + np.asarray(y_zp, np.float64)
    info = np.iinfo(out_dtype)
    return np.clip(r, info.min, info.max).astype(out_dtype)


def _multiplier(x_scale, w_scale, y_scale):
    xs = np.asarray(x_scale, np.float32)
    ws = np.asarray(w_scale, np.float32)
    return ((xs * ws).astype(np.float32) / np.asarray(y_scale, np.float32)).astype(np.float32)


def applies(x_dtype, w_dtype) -> bool:
    """The saturating path is onnxruntime's uint8-activation x int8-weight kernel."""
    return np.dtype(x_dtype) == np.uint8 and np.dtype(w_dtype) == np.int8


# --------------------------------------------------------------------------- QLinearMatMul


def emulate_qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """onnxruntime's QLinearMatMul result with 16-bit pair saturation; None if not u8s8.

    Handles per-tensor parameters and per-column ``b`` parameters ([N] or [..., 1, N]); ``a``
    of any rank >= 2 with ``b`` 2-D (the quantizer's case), or matching batch dimensions.
    """
    a, b = np.asarray(a), np.asarray(b)
    if not applies(a.dtype, b.dtype) or np.asarray(a_scale).size != 1 or np.asarray(a_zp).size != 1:
        return None
    a2 = a if a.ndim >= 2 else a[None]
    n = b.shape[-1]
    bzp = np.asarray(b_zp, np.int64).reshape(-1)
    bsc = np.asarray(b_scale, np.float32).reshape(-1)
    m = _multiplier(np.asarray(a_scale).reshape(()), bsc, np.asarray(y_scale).reshape(()))
    azp = int(np.asarray(a_zp).reshape(()))
    if b.ndim == 2:
        rows = a2.reshape(-1, a2.shape[-1])
        pairs = pair_saturated_matmul(rows, b)
        acc = _zp_corrected(pairs, rows, b, azp, bzp.reshape(1, -1) if bzp.size > 1 else int(bzp[0]))
        y = requantize(acc, m.reshape(1, -1) if m.size > 1 else m, y_zp, np.asarray(y_zp).dtype)
        out = y.reshape(*a2.shape[:-1], n)
    else:
        batch = np.broadcast_shapes(a2.shape[:-2], b.shape[:-2])
        ab = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
        bb = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
        if bzp.size > 1 and bzp.size != n or bsc.size > 1 and bsc.size != n:
            return None
        outs = []
        for ai, bi in zip(ab, bb):
            pairs = pair_saturated_matmul(ai, bi)
            acc = _zp_corrected(pairs, ai, bi, azp, bzp.reshape(1, -1) if bzp.size > 1 else int(bzp[0]))
            outs.append(requantize(acc, m.reshape(1, -1) if m.size > 1 else m, y_zp,
                                   np.asarray(y_zp).dtype))
        out = np.stack(outs).reshape(batch + (a2.shape[-2], n))
    return out.reshape(a.shape[:-1] + (n,)) if a.ndim == 1 else out


# --------------------------------------------------------------------------- QLinearConv


def explicit_pads(in_spatial, kernel, strides, dilations, auto_pad="NOTSET", pads=None):
    """Begin and end pads for every spatial axis, from the ONNX attributes."""
    nd = len(in_spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-in_spatial[i] // strides[i])
            eff = (kernel[i] - 1) * dilations[i] + 1
            total = max(0, (out - 1) * strides[i] + eff - in_spatial[i])
            small, big = total // 2, total - total // 2
            if auto_pad == "SAME_UPPER":
                begin.append(small), end.append(big)
            else:
                begin.append(big), end.append(small)
        return begin, end
    if auto_pad == "VALID" or pads is None:
        return [0] * nd, [0] * nd
    return list(pads[:nd]), list(pads[nd:])


def emulate_qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B=None,
                         *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                         pads=None, strides=None, **_: Any):
    """onnxruntime's QLinearConv result with 16-bit pair saturation; None if not applicable."""
    x, w = np.asarray(x), np.asarray(w)
    if not applies(x.dtype, w.dtype) or np.asarray(x_zp).size != 1:
        return None
    n, c = x.shape[:2]
    m_out = w.shape[0]
    cg = w.shape[1]
    mg = m_out // group
    if cg == 1 and mg == 1:
        return None  # depthwise kernel: int32 accumulation, no saturation
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
    m = np.broadcast_to(_multiplier(np.asarray(x_scale).reshape(()),
                                    np.asarray(w_scale, np.float32).reshape(-1),
                                    np.asarray(y_scale).reshape(())), (m_out,))
    bias = np.zeros(m_out, np.int64) if B is None else np.asarray(B, np.int64).reshape(-1)
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
        perm = [0] + list(range(3, 3 + nd)) + [2, 1]
        rows = patches.transpose(perm).reshape(-1, len(offsets) * cg)  # K order: taps, then c
        wg = w[g * mg:(g + 1) * mg].reshape(mg, cg, -1).transpose(0, 2, 1).reshape(mg, -1).T
        pairs = pair_saturated_matmul(rows, wg)
        zp_g = wzp[g * mg:(g + 1) * mg]
        acc_g = _zp_corrected(pairs, rows, wg, xzp, zp_g.reshape(1, -1))
        acc_g = acc_g + bias[g * mg:(g + 1) * mg][None]
        acc[:, g * mg:(g + 1) * mg] = acc_g.reshape(n, -1, mg).transpose(0, 2, 1)
    y = requantize(acc, m.reshape(1, -1, 1), y_zp, np.asarray(y_zp).dtype)
    return y.reshape(n, m_out, *out_sp)


def emulate_node(op_type: str, inputs: list, attrs: dict) -> np.ndarray | None:
    """Emulate one QLinearConv / QLinearMatMul node; None where the emulation does not apply."""
    try:
        if op_type == "QLinearMatMul":
            return emulate_qlinear_matmul(*inputs[:8])
        if op_type == "QLinearConv":
            return emulate_qlinear_conv(*inputs[:9], **attrs)
    except (ValueError, IndexError, TypeError):
        return None
    return None


def onnxruntime_saturates() -> bool | None:
    """Whether this machine's onnxruntime u8s8 QLinearMatMul shows the 16-bit saturation.

    A probe: activations 255 against weights 127 (pair sums 64770). True on AVX2 machines
    without VNNI, False where onnxruntime's kernel is exact; None without onnxruntime.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from onnx import TensorProto, helper, numpy_helper

    k, n = 64, 16
    inits = [numpy_helper.from_array(np.asarray(v), name) for v, name in [
        (np.float32(1.0), "as"), (np.uint8(0), "azp"), (np.full((k, n), 127, np.int8), "b"),
        (np.float32(1.0), "bs"), (np.int8(0), "bzp"), (np.float32(16384.0), "ys"),
        (np.uint8(0), "yzp")]]
    node = helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"])
    graph = helper.make_graph([node], "probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"a": np.full((4, k), 255, np.uint8)})[0]
    # exact: 64 * 255 * 127 / 16384 = 126.5 -> 126 (ties to even); saturated: 32 * 32767 / 16384 = 64
    return bool((y != 126).any())
