"""DequantizeLinear(2/4/8-bit weight) -> MatMul (or Gemm) into com.microsoft MatMulNBits, as
onnxruntime 1.32's CPU session rewrites it (its ``DQMatMulToMatMulNBits`` rule of the
QDQSelectorActionTransformer; ``qdq_selectors.cc`` ``DQMatMulNodeGroupSelector``,
``ValidateDQForMatMulNBits``, ``qdq_actions.cc`` ``DQMatMulToMatMulNBitsAction``).

The fused node is not the graph's arithmetic: it takes the session's
``session.qdq_matmulnbits_accuracy_level`` (default 4, activations quantized to int8 per block),
so a QDQ weight-only model computes differently fused and as written. qlinear fuses under the
same conditions, at the same level, so that ``qdq="fuse"`` computes what onnxruntime's session
computes (in qlinear's reproducible MatMulNBits arithmetic, docs/contract.md); ``qdq="literal"``
runs DequantizeLinear -> MatMul as written.

Conditions (each checked against onnxruntime 1.32 by ``tests/test_nbits_fusion.py``, which
compares the fused graph with the one onnxruntime writes to ``optimized_model_filepath``):

- the target is a MatMul whose input 1 comes from a DequantizeLinear and whose input 0 does not,
  or a Gemm with alpha = 1, transA = transB = 0 and, when it has a bias C, beta = 1 and C of
  shape [N] (C may come from a DequantizeLinear of its own, which stays); no QuantizeLinear
  consumes the target's output, and no Relu/Clip alone between it and its consumer (onnxruntime's
  node-group selection gives up on such a Relu/Clip unless a QuantizeLinear makes it redundant);
- the weight's DequantizeLinear has that one consumer and is not a graph output; its weight,
  scale and zero point are constant initializers, the weight and the scale read by no other
  node (measured: a weight or scale shared by two DequantizeLinear, as after onnxruntime's
  EnsureUniqueDQForNodeUnit copies a shared one, or read by another operator, leaves every
  such group unfused; a shared zero point does not); the weight is 2-D [K, N] of int2/uint2,
  int4/uint4 or int8/uint8; the scale float32 or float16;
- blocked: ``block_size`` >= 16 a power of two with ``axis`` written and 0, scale (and zero
  point) [ceil(K / block_size), N]; per-channel: no block_size, ``axis`` absent or 1 (-1 is not
  taken), scale (and zero point) [N]; per-tensor: a scalar (rank-0) scale and zero point. The
  per-channel and per-tensor forms become blocks of ``session.qdq_matmulnbits_block_size``
  (0, the default: 32; -1: the power of two in [16, min(K, 256)] that pads K least, the larger
  on a tie; else that power of two in [16, 256]).

The rewrite transposes the weight into MatMulNBits' layout ([N, blocks, block bytes], low bits
first), signed codes and zero points shifted by 2^(bits-1) into unsigned ones (an absent zero
point of a signed type stays absent: MatMulNBits' default 2^(bits-1) is that shift; an absent
one of an unsigned type is written as zeros), the scales transposed to [N · blocks]; the
arithmetic value (q − zp)·s of every weight is unchanged.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

import onnx
from onnx import helper

from ..graph.proto import T, types_and_shapes
from .graph_edit import MS, _Graph, _attr, _is, _is_dq
from .qdq_rules import _select

#: (element type) -> (bits, signed) of the weights the fusion takes
_WEIGHT_TYPES = {T.INT2: (2, True), T.UINT2: (2, False), T.INT4: (4, True), T.UINT4: (4, False),
                 T.INT8: (8, True), T.UINT8: (8, False)}
_SCALE_TYPES = (T.FLOAT, T.FLOAT16)
#: onnxruntime's MatMulNBits CPU kernel computes block sizes 16 to 256
_MIN_BLOCK, _MAX_BLOCK = 16, 256

ACCURACY_LEVELS = (0, 1, 2, 3, 4)
#: ``session.qdq_matmulnbits_accuracy_level``'s default in onnxruntime 1.32
DEFAULT_ACCURACY_LEVEL = 4


def block_size_for(K: int, option: int) -> int:
    """The block size a per-channel / per-tensor weight becomes (onnxruntime's
    ``session.qdq_matmulnbits_block_size``): 0 -> 32; -1 -> the power of two in
    [16, min(K, 256)] that pads K least (the larger on a tie); else ``option`` itself, a power of
    two in [16, 256]."""
    if option == 0:
        return 32
    if option == -1:
        best, best_pad = _MIN_BLOCK, -(-K // _MIN_BLOCK) * _MIN_BLOCK - K
        bs = 2 * _MIN_BLOCK
        while bs <= min(K, _MAX_BLOCK):
            pad = -(-K // bs) * bs - K
            if pad <= best_pad:
                best, best_pad = bs, pad
            bs *= 2
        return best
    if option < _MIN_BLOCK or option > _MAX_BLOCK or option & (option - 1):
        raise ValueError(f"session.qdq_matmulnbits_block_size must be 0, -1 or a power of two in "
                         f"[{_MIN_BLOCK}, {_MAX_BLOCK}]; got {option}")
    return option


def _weight_dq(g: _Graph, node: onnx.NodeProto) -> Optional[onnx.NodeProto]:
    """The DequantizeLinear of ``node``'s weight when the node group qualifies (the selector's
    conditions on the target and its neighbours), else None."""
    grp = _select(g, node)
    if grp is None or grp.qs or grp.clip is not None:
        return None
    gemm = node.op_type == "Gemm"
    if not 1 <= len(grp.dqs) <= (2 if gemm else 1):
        return None
    if len(node.input) < 2 or not node.input[1]:
        return None
    weight = next((dq for dq in grp.dqs if dq.output[0] == node.input[1]), None)
    if weight is None or g.single_consumer(weight) is not node:
        return None
    if gemm and len(grp.dqs) == 2:
        other = grp.dqs[0] if grp.dqs[1] is weight else grp.dqs[1]
        if len(node.input) < 3 or node.input[2] != other.output[0]:
            return None
    return weight


def _gemm_ok(g: _Graph, node: onnx.NodeProto, N: int, shapes: Callable[[], dict]) -> bool:
    """Gemm as a MatMul: alpha = 1, no transposes, and with a bias beta = 1 and C of shape [N]
    (onnxruntime 1.32 compares alpha and beta with 1 exactly: 1.0000001 is not fused)."""
    if _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "transA", 0) != 0 or _attr(node, "transB", 0) != 0:
        return False
    if len(node.input) > 2 and node.input[2]:
        if _attr(node, "beta", 1.0) != 1.0:
            return False
        c = g.const(node.input[2])
        shape = tuple(c.shape) if c is not None else shapes().get(node.input[2])
        if shape != (N,):
            return False
    return True


def _granularity(g: _Graph, dq: onnx.NodeProto, w: np.ndarray, s: np.ndarray,
                 z: Optional[np.ndarray]) -> Optional[tuple[str, int]]:
    """("block", block_size), ("channel", 0) or ("tensor", 0) where onnxruntime fuses, else None."""
    K, N = w.shape
    bs = _attr(dq, "block_size", 0)
    if bs > 0:
        if _attr(dq, "axis", None) != 0 or bs < _MIN_BLOCK or bs & (bs - 1):
            return None
        if s.ndim != 2 or s.shape != (-(-K // bs), N) or (z is not None and z.shape != s.shape):
            return None
        return "block", bs
    if s.ndim == 0:
        return ("tensor", 0) if z is None or z.ndim == 0 else None
    if s.ndim == 1 and s.shape[0] == N:
        if _attr(dq, "axis", 1) != 1:
            return None
        return ("channel", 0) if z is None or z.shape == (N,) else None
    return None


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes along the last axis packed 8 // bits to a byte, low bits first."""
    per = 8 // bits
    if per == 1:
        return codes.astype(np.uint8)
    c = codes.astype(np.uint8).reshape(codes.shape[:-1] + (-1, per))
    out = np.zeros(c.shape[:-1], np.uint8)
    for j in range(per):
        out |= (c[..., j] << np.uint8(j * bits)).astype(np.uint8)
    return out


def nbits_inputs(w: np.ndarray, s: np.ndarray, z: Optional[np.ndarray], bits: int, signed: bool,
                 block_size: int) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """MatMulNBits' B [N, blocks, block_size·bits/8], scales [N·blocks] and packed zero points
    [N·ceil(blocks·bits/8)] (or None) for DequantizeLinear's weight ``w`` [K, N] with scale ``s``
    and zero point ``z`` (blocked [blocks, N], per-channel [N] or per-tensor [])."""
    K, N = w.shape
    nb = -(-K // block_size)
    shift = 1 << (bits - 1) if signed else 0
    q = np.zeros((N, nb * block_size), np.int16)  # padding codes: 0 (they meet no element of A)
    q[:, :K] = w.astype(np.int16).T + shift
    B = _pack(q, bits).reshape(N, nb, block_size * bits // 8)
    scales = np.ascontiguousarray(np.broadcast_to(s.T if s.ndim == 2 else s[..., None] if s.ndim == 1 else s,
                                                  (N, nb))).reshape(-1)
    if z is None:
        if signed:
            return B, scales, None  # MatMulNBits' default zero point 2^(bits-1) is the shifted 0
        zz = np.zeros((N, nb), np.int16)
    else:
        zz = np.broadcast_to((z.T if z.ndim == 2 else z[..., None] if z.ndim == 1 else z).astype(np.int16) + shift,
                             (N, nb))
    per = 8 // bits
    padded = np.zeros((N, -(-nb // per) * per), np.int16)
    padded[:, :nb] = zz
    return B, scales, _pack(padded, bits).reshape(-1)


def fuse_matmul_nbits(g: _Graph, emit: Callable[[str, str], bool], accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
                      block_size: int = 0) -> None:
    """Rewrite every qualifying DequantizeLinear -> MatMul / Gemm of ``g`` (in graph order) into
    com.microsoft MatMulNBits with ``accuracy_level`` (see the module's docstring);
    ``block_size`` is ``session.qdq_matmulnbits_block_size``. Nothing when ``emit`` refuses
    MatMulNBits."""
    if accuracy_level not in ACCURACY_LEVELS:
        raise ValueError(f"session.qdq_matmulnbits_accuracy_level must be 0, 1, 2, 3 or 4; got {accuracy_level}")
    block_size_for(32, block_size)  # a bad option fails before anything is rewritten
    if not emit(MS, "MatMulNBits"):
        return
    cached: dict = {}

    def shapes() -> dict:
        if "s" not in cached:
            cached["s"] = types_and_shapes(g.model)[1]
        return cached["s"]

    for node in list(g.nodes):
        if not g.has(node) or not (_is(node, "MatMul") or _is(node, "Gemm")):
            continue
        dq = _weight_dq(g, node)
        if dq is None or not _is_dq(dq):
            continue
        w = g.const(dq.input[0])
        s = g.const(dq.input[1]) if len(dq.input) > 1 else None
        has_zp = len(dq.input) > 2 and bool(dq.input[2])
        z = g.const(dq.input[2]) if has_zp else None
        if w is None or s is None or (has_zp and z is None) or w.ndim != 2:
            continue
        if any(len(g.consumers.get(name, ())) != 1 or name in g.pinned for name in dq.input[:2]):
            continue  # weight or scale read elsewhere too (measured: onnxruntime 1.32 then keeps both)
        wtype = g.elem_type(dq.input[0]) or helper.np_dtype_to_tensor_dtype(w.dtype)
        stype = g.elem_type(dq.input[1]) or helper.np_dtype_to_tensor_dtype(s.dtype)
        if wtype not in _WEIGHT_TYPES or stype not in _SCALE_TYPES:
            continue
        K, N = w.shape
        if node.op_type == "Gemm" and not _gemm_ok(g, node, N, shapes):
            continue
        gran = _granularity(g, dq, w, s, z)
        if gran is None:
            continue
        bits, signed = _WEIGHT_TYPES[wtype]
        bs = gran[1] if gran[0] == "block" else block_size_for(K, block_size)
        B, scales, zp = nbits_inputs(np.asarray(w), np.asarray(s), None if z is None else np.asarray(z),
                                     bits, signed, bs)
        base = dq.input[0]
        inputs = [node.input[0], g.add_const(base + "_nbits", B), g.add_const(dq.input[1] + "_nbits", scales)]
        if zp is not None:
            inputs.append(g.add_const((dq.input[2] if has_zp else base) + "_nbits_zp", zp))
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            inputs += [""] * (5 - len(inputs)) + [node.input[2]]
        fused = helper.make_node("MatMulNBits", inputs, [node.output[0]], name=(node.name or node.output[0]) + "_nbits",
                                 domain=MS, K=K, N=N, bits=bits, block_size=bs, accuracy_level=accuracy_level)
        g.replace_node(node, fused)
        g.remove(dq)
