"""Convolutions on the native engine: weight packing, the engine's limits for a call, the plan
of a call (csrc/python/bind_conv.c's argument lists) and its run.

``qlinear/conv.py`` validates and caches; this module turns a validated call into the C
module's ``conv``, ``conv_plain``, ``conv_pack_w`` and ``conv_pack_w_auto`` arguments.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ... import _native, dtypes
from ..._geometry import ConvGeometry
from .. import workspace_limit

# Native paths (the engine's conv kinds, conv.h's QL_CONV_*): the exact GEMM, the depthwise
# kernel, the GEMM's fast path (QL_FORM_S8U8: 7-bit weights on AVX2, any int8 centered weight on
# the VNNI levels; the bound on |w - w_zero_point| is the level's kernel's, ``fast_bound``).
# The same codes name the GEMM kernels (`which`: QL_KERNEL_EXACT, QL_KERNEL_CONV_FAST) where
# weights are packed for a path.
GEMM, DEPTHWISE, GEMM_FAST = (_native.LIMITS["conv_kinds"][k] for k in ("gemm", "depthwise", "gemm_fast"))
# conv.h's QL_DWCL_MAX_TAPS: the channels-last depthwise kernel's largest kernel
DW_CL_MAX_TAPS = _native.LIMITS["dw_cl_max_taps"]

# The native engine's limits; beyond them the NumPy engine runs. The rank is the engine's
# (conv.h's QL_CONV_MAXD); K and the extents are this module's own, stricter than the checks of
# qlinear/csrc/python/bind_conv.c (K below INT_MAX / 2, each geometry term at most 2^60).
MAX_RANK = _native.LIMITS["conv_max_rank"]
MAX_K = 1 << 29
MAX_EXTENT = 1 << 59
# The native engine's scratch is per thread and bounded by constants (offset tables, a few
# rows): it is always allowed this much, whatever the workspace limit.
MIN_WORKSPACE = 16 << 20

#: the output types the native kernels store, with their ranges
RANGES = dtypes.NATIVE_INT_RANGE
_CODES = _native.DTYPE_CODES
_NO_MULT = np.ones(1, dtype=np.float32)

# Per level, asked once: (the s8_bound of its convolution fast-path kernel, 0 when it has
# none; the (M, K) from which a 1x1 convolution takes the exact GEMM even where the fast kernel
# would serve, 0 0: never; amx: its exact GEMM on AMX tiles; qlinear.h, exact_1x1_min_m / _k;
# the channels a chunk of the fast kernel holds, 0 for none: amx-s8u8's 64, which takes the 1x1
# convolutions whose channels per group it divides itself, on tiles)
_CONV_FAST: dict[str, tuple[int, int, int, int]] = {}


def _conv_fast_info(isa: str) -> tuple[int, int, int, int]:
    got = _CONV_FAST.get(isa)
    if got is None:
        info = _native._C.kernel_info(isa, GEMM_FAST)
        got = _CONV_FAST[isa] = (0, 0, 0, 0) if info is None else (
            int(info["s8_bound"]), int(info["exact_1x1_min_m"]), int(info["exact_1x1_min_k"]),
            int(info["kchunk"]) * int(info["kpack"]) if int(info["kchunk"]) > 1 else 0)
    return got


def exact_1x1(isa: str, w_shape: tuple) -> bool:
    """Whether level ``isa`` runs a convolution of weights ``w_shape`` (M, C/group, kernel...)
    on its exact GEMM although they fit its fast kernel (csrc/conv/pack_w.c's ql_conv_pack_w_fast, the
    same rule)."""
    _, m_min, k_min, chunk = _conv_fast_info(isa)
    return (bool(m_min) and math.prod(w_shape[2:]) == 1 and w_shape[0] >= m_min and w_shape[1] >= k_min
            and not (chunk and w_shape[1] % chunk == 0))


def fast_bound(isa: str) -> int:
    """The s8_bound of ISA level ``isa``'s convolution fast-path kernel (64 on avx2, 128 on the
    VNNI levels), or 0 when the level has none."""
    return _conv_fast_info(isa)[0]


def workspace() -> int:
    """The scratch bound handed to the engine: the workspace limit, at least MIN_WORKSPACE."""
    return max(workspace_limit(), MIN_WORKSPACE)


def fits(geom: ConvGeometry, k: int) -> bool:
    """Whether the engine's int64/int arithmetic holds this geometry with K = ``k`` taps per
    output (the NumPy engine takes the rest)."""
    if len(geom.kernel) > MAX_RANK:
        return False
    extents = (n + b + e + s + (kk - 1) * d for n, b, e, s, kk, d in zip(
        geom.in_spatial, geom.pads_begin, geom.pads_end, geom.strides, geom.kernel, geom.dilations))
    # a dilation of a 1-tap axis adds nothing to the extent, yet the engine refuses any value
    # above 2^60: bound each one too (the NumPy engine takes the rest)
    return k <= MAX_K and max(extents) <= MAX_EXTENT and max(geom.dilations) <= MAX_EXTENT


def within_fast_bound(w: np.ndarray, w_zero_point: np.ndarray, bound: int) -> bool:
    """Whether every centered weight w - w_zero_point lies in [-bound, min(bound, 127)],
    the fast-path kernel's ``s8_bound`` (the engine's QL_FORM_S8U8 stores w - zw as int8).
    64 on AVX2: vpmaddubsw's int16 pair sums |x'·(w - zw) + x'·(w - zw)| <= 2·255·64 =
    32640 cannot saturate (x' = x in its u8 form, [0, 255]). 128 on the VNNI levels:
    vpdpbusd adds its 4 products (each |x'·(w - zw)| <= 255·128) into the int32
    accumulator exactly, with wraparound and no saturation, so any int8 value is safe."""
    w = w.reshape(w.shape[0], -1)
    if w.size == 0:
        return True
    # per-row extremes (fast reductions on 8-bit data) against the row's zero point
    zp = np.broadcast_to(w_zero_point.astype(np.int32).reshape(-1), (w.shape[0],))
    return bool(np.all(w.max(axis=1).astype(np.int32) - zp <= min(bound, 127))
                and np.all(zp - w.min(axis=1).astype(np.int32) <= bound))


def kind(isa: str, depthwise: bool, w_shape: tuple, within: Callable[[int], bool]) -> int:
    """The native path for a call: depthwise, the GEMM's fast path (a level that has one,
    weights proven within its bound: ``within(bound)``) or the exact GEMM."""
    if depthwise:
        return DEPTHWISE
    bound = fast_bound(isa)
    if bound and not exact_1x1(isa, w_shape) and within(bound):
        return GEMM_FAST
    return GEMM


def pack_weights(isa: str, kind: int, w: np.ndarray, w_zero_point: np.ndarray, group: int,
                 channels_last: bool) -> np.ndarray:
    """The weights in the native engine's form for ISA level ``isa`` and path ``kind``: packed
    GEMM rows (csrc/conv/pack_w.c's ql_conv_pack_w), or centered int16 taps (M, taps) for the
    depthwise kernel, followed, with ``channels_last`` (a prepared form's 2-D depthwise
    weights), by the channels-last kernel's form."""
    m = w.shape[0]
    w2 = np.ascontiguousarray(w.reshape(m, -1))
    zp = np.ascontiguousarray(np.broadcast_to(w_zero_point.astype(np.int32).reshape(-1), (m,)))
    if kind == DEPTHWISE:
        # |w - zp| <= 255: exact in int16
        got = np.subtract(w2, zp[:, None].astype(np.int16), dtype=np.int16)
        taps = got.shape[1]
        if channels_last and w.ndim == 4 and m == group and taps <= DW_CL_MAX_TAPS:
            # the channels-last kernel's form (conv.h), blocks of 16 channels, taps padded to
            # pairs, [block][tap][channel], zeros beyond (a plain call's weights are used once:
            # the engine gathers each block's instead, cheaper than building this)
            cl = np.zeros((-(-m // 16) * 16, taps + taps % 2), dtype=np.int16)
            cl[:m, :taps] = got
            cl = cl.reshape(-1, 16, cl.shape[1]).transpose(0, 2, 1)
            got = np.concatenate([got.ravel(), cl.ravel()])
        return got
    C = _native._C
    taps = int(np.prod(w.shape[2:], dtype=np.int64))   # K = C/group * taps
    got = np.empty(C.conv_w_bytes(isa, kind, m, w2.shape[1], taps), dtype=np.uint8)
    C.conv_pack_w(isa, kind, w2, _CODES[w2.dtype], m, w2.shape[1], taps, zp, got)
    return got


def pack_plain(isa: str, w: np.ndarray, w_zero_point: np.ndarray) -> tuple[int, Any]:
    """A plain call's GEMM weights, packed for this call only (never kept: the caller may
    change w before the next one): (kind, packed). One native pass (csrc/conv/pack_w.c's
    ql_conv_pack_w_auto), on the threads, packs them in the fast path's form while proving the
    same bound as ``within_fast_bound``, and in the exact form from the first row outside it."""
    C = _native._C
    m = w.shape[0]
    w2 = np.ascontiguousarray(w).reshape(m, -1)
    zp = w_zero_point
    zp = np.full(m, int(zp), np.int32) if zp.ndim == 0 else zp.astype(np.int32)
    k, taps = w2.shape[1], math.prod(w.shape[2:])
    need = C.conv_w_bytes(isa, GEMM, m, k, taps)
    if fast_bound(isa):
        need = max(need, C.conv_w_bytes(isa, GEMM_FAST, m, k, taps))
    # from 1 MiB on, a block of the output pool (reused by the next call, without fresh
    # memory's page faults); smaller ones are left to malloc
    args = (isa, w2, _CODES[w2.dtype], m, k, taps, zp)
    if need >= _native._POOL_MIN:
        return C.conv_pack_w_auto(*args, C.empty(need))
    return C.conv_pack_w_auto(*args)


def plan(isa: str, kind: int, w: Any, x: np.ndarray, zp: np.ndarray, geom: ConvGeometry, m: int, group: int,
         mult: np.ndarray | None, y_zero_point: np.ndarray | None) -> tuple:
    """The plan of a call on ``x`` (the packed weights ``w`` for path ``kind``, input zero
    point, geometry, per-channel or per-tensor float32 multiplier and output zero point, or
    ``mult`` None for int32): (isa, kind, w, output shape, output dtype, C.conv's arguments
    between x and w, its arguments between y and the bias). ``run`` takes it with the bias
    appended."""
    n, c = x.shape[:2]
    out_shape = (n, m, *geom.out_spatial)
    if mult is None:
        y_dtype = np.dtype(np.int32)
        tail = (0, 0, 0, 0.0, 0.0, _NO_MULT, 0)
    else:
        y_dtype = y_zero_point.dtype
        qmin, qmax = RANGES[y_dtype]
        yz = int(y_zero_point)
        mm = np.ascontiguousarray(mult, dtype=np.float32).reshape(-1)
        tail = (1, int(qmin < 0), yz, float(qmin - yz), float(qmax - yz), mm, int(mm.size > 1))
    head = (_CODES[x.dtype], int(zp), (n, c, m, group), geom.in_spatial, geom.out_spatial,
            geom.kernel, geom.strides, geom.dilations, geom.pads_begin)
    return isa, kind, w, out_shape, y_dtype, head, tail


def run(call: tuple, x: np.ndarray) -> np.ndarray:
    """The convolution of a C-contiguous x by a plan (``plan`` + (bias,))."""
    isa, kind, w, out_shape, y_dtype, head, tail, bias = call
    y = _native.empty(out_shape, y_dtype)   # 1 MiB and more: from the output pool
    _native._C.conv(isa, kind, x, *head, w, y, *tail, bias, max(workspace_limit(), MIN_WORKSPACE))
    return y


def plain_plan(x_shape: tuple, w_shape: tuple, group: int, geom: ConvGeometry) -> tuple:
    """What a plain call's lean path (``run_plain``) needs of its shapes and geometry."""
    n, c = x_shape[:2]
    m = w_shape[0]
    depthwise = group > 1 and c == group
    return (int(depthwise), (n, c, m, group), geom.in_spatial, geom.out_spatial, geom.kernel, geom.strides,
            geom.dilations, geom.pads_begin, (n, m, *geom.out_spatial))


def run_plain(plan: tuple, x: np.ndarray, zx: int, w: np.ndarray, w_zp: Any,
              quant: tuple | None) -> np.ndarray | None:
    """A plain call in one crossing (csrc/python/bind_conv.c's conv_plain): the multiplier (in
    float32, refusing one that is not finite: None, then the caller's full path raises), the
    weights packed as the full path packs them, and the convolution. x and w C-contiguous;
    ``quant`` None (int32) or (x_scale, w_scale, y_scale as Python numbers or a float32 array,
    output dtype, output zero point, bias or None)."""
    C = _native._C
    depthwise, dims, in_sp, out_sp, kern, strides, dil, pads, out_shape = plan
    if quant is None:
        bias = w_scale = None
        yd, quantized, signed, yz, lo, hi, xs, ys = _I32, 0, 0, 0, 0.0, 0.0, 0.0, 0.0
    else:
        xs, w_scale, ys, yd, yz, bias = quant
        qmin, qmax = RANGES[yd]
        quantized, signed, lo, hi = 1, int(qmin < 0), float(qmin - yz), float(qmax - yz)
    y = _native.empty(out_shape, yd)
    kind = C.conv_plain(C.get_isa(), depthwise, x, _CODES[x.dtype], zx, dims, in_sp, out_sp, kern, strides, dil,
                        pads, w, _CODES[w.dtype], w_zp, y, quantized, signed, yz, lo, hi, xs, w_scale, ys, bias,
                        max(workspace_limit(), MIN_WORKSPACE))
    return None if kind is None else y


_I32 = np.dtype(np.int32)
