"""The float operators of onnxruntime's quantized transformer models (com.microsoft): QAttention,
Attention, EmbedLayerNormalization, SkipLayerNormalization, FastGelu, Gelu.

onnxruntime runs these on MLAS float kernels (SGEMM blocking, vectorized exp/tanh/erf) whose
rounding depends on the instruction set, so no bit pattern is promised: qlinear evaluates the
formulas in float64 and rounds the result to float32 once, which is within float32 tolerance of
onnxruntime (tests/test_contrib.py measures it). On the native engine each runs the same double
operations in C (qlinear/csrc/transformer): Gelu, SkipLayerNormalization and
EmbedLayerNormalization give these very bits; FastGelu may differ in the last bit of a double
before the rounding to float32 (the C library's exp against NumPy's); the attention sums its
products in a fixed ascending order where NumPy's BLAS has its own, within one float32 rounding
(docs/contract.md states the tolerance). QAttention's Q/K/V projection is the exception where
it can be exact: its integer product runs on qlinear's exact integer GEMM and is scaled as
onnxruntime scales it, f(acc) · f(weight_scale · input_scale) + bias.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import _blas, _native
from .. import _validate as v
from ..matmul import matmul_integer
from . import _params as p

F32 = np.float32
F64 = np.float64

_erf = np.vectorize(math.erf, otypes=[F64])


def gelu(X: np.ndarray) -> np.ndarray:
    """com.microsoft Gelu: x · Φ(x) = 0.5 · x · (1 + erf(x / √2))."""
    x = p.float_tensor("gelu", "X", X)
    v.check_size("gelu", "the float64 copy of X", x.shape, 8)
    C = _native.native()
    if C is not None and x.size:
        # the same double operations in C (the C library's erf is math.erf): the same bits
        y = np.empty(x.shape, F32)
        C.gelu(np.ascontiguousarray(x), x.size, y)
        return y
    x = x.astype(F64)
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(F32)


def fast_gelu(X: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """com.microsoft FastGelu: the tanh approximation 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
    of x = X + bias (bias broadcast along the last axis), evaluated as x / (1 + exp(-2u)) for
    u = √(2/π) · (x + 0.044715 · x³): the same function, without the cancellation of 1 + tanh(u)
    where tanh(u) nears -1."""
    return _fast_gelu_op(X, bias)


def _fast_gelu_bias(op: str, name: str, bias: Any, last: int) -> np.ndarray:
    """FastGelu's bias, checked against X's last dimension ``last`` (-1: X is 0-d), as float64
    (x + bias adds it in float64 either way)."""
    b = p.float_tensor(op, name, bias)
    if b.ndim != 1 or (last >= 0 and b.shape[0] != last):
        raise ValueError(f"{op}: bias must be 1-D with X's last dimension ({(last,) if last >= 0 else ()}); "
                         f"got shape {b.shape}")
    return b.astype(F64)


def _fast_gelu_op(X: np.ndarray, bias: np.ndarray | None = None, bias_param=_fast_gelu_bias) -> np.ndarray:
    """``fast_gelu`` with the bias checked (and widened) by ``bias_param(op, "bias", bias, last)``:
    the backend passes one that does it once for a constant bias."""
    op = "fast_gelu"
    x = p.float_tensor(op, "X", X)
    v.check_size(op, "the float64 copy of X", x.shape, 8)
    b = None if bias is None else bias_param(op, "bias", bias, x.shape[-1] if x.ndim else -1)
    C = _native.native()
    if C is not None and x.ndim and x.size:
        # the formula's double operations in C (transformer/transformer.c: its exp and v·v·v
        # may differ from NumPy's in a double's last bit, below float32's rounding)
        y = np.empty(x.shape, F32)
        C.fast_gelu(np.ascontiguousarray(x), None if b is None else np.ascontiguousarray(b, F64),
                    x.size // x.shape[-1], x.shape[-1], y)
        return y
    x = x.astype(F64)
    if b is not None:
        x = x + b
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return (x / (1.0 + np.exp(-2.0 * u))).astype(F32)


def _hidden_param(op: str, name: str, value: Any, hidden: int) -> np.ndarray:
    arr = p.float_tensor(op, name, value)
    if arr.shape != (hidden,):
        raise ValueError(f"{op}: {name} must be 1-D with the hidden size ({hidden},); got shape {arr.shape}")
    return arr.astype(F64)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, epsilon: float):
    # the operations of x.mean and ((x - mean) ** 2).mean (a pairwise sum by add.reduce, then a
    # division by the count), without their per-call Python overhead
    n = x.shape[-1]
    mean = np.add.reduce(x, axis=-1, keepdims=True) / n
    d = x - mean
    var = np.add.reduce(np.square(d), axis=-1, keepdims=True) / n
    inv_std = 1.0 / np.sqrt(var + epsilon)
    y = d * inv_std
    y *= gamma
    if beta is not None:
        y += beta
    return y, mean, inv_std


def skip_layer_normalization(input: np.ndarray, skip: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None = None,
                             bias: np.ndarray | None = None, *, epsilon: float = 1e-12
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """com.microsoft SkipLayerNormalization: s = input + skip (+ bias); LayerNorm of s over the
    last axis with gamma (and beta). Returns (output, mean, inv_std_var, s); mean and
    inv_std_var keep a trailing axis of 1."""
    return _skip_layer_normalization_op(input, skip, gamma, beta, bias, epsilon=epsilon)


def _skip_layer_normalization_op(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12,
                                 hidden_param=_hidden_param):
    """``skip_layer_normalization`` with gamma, beta and bias checked (and widened) by
    ``hidden_param``: the backend passes one that does it once for constant inputs."""
    op = "skip_layer_normalization"
    x = p.float_tensor(op, "input", input)
    sk = p.float_tensor(op, "skip", skip)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have rank >= 2 (..., hidden); got shape {x.shape}")
    if sk.shape != x.shape:  # (the usual case, equal shapes, needs no check)
        try:
            np.broadcast_to(sk, x.shape)
        except ValueError:
            raise ValueError(f"{op}: skip must broadcast to input's shape {x.shape}; got shape {sk.shape}") from None
    hidden = x.shape[-1]
    if hidden == 0:  # layer normalization divides by it
        raise ValueError(f"{op}: input's hidden size (last dimension) must be >= 1; got shape {x.shape}")
    v.check_size(op, "the float64 sum of input and skip", x.shape, 8)
    bias64 = None if bias is None else hidden_param(op, "bias", bias, hidden)
    C = _native.native()
    if C is not None and sk.shape == x.shape and x.size:
        # the same double operations in C, NumPy's pairwise row sums included: the same bits
        g = hidden_param(op, "gamma", gamma, hidden)
        b = None if beta is None else hidden_param(op, "beta", beta, hidden)
        eps = p.float_attribute(op, "epsilon", epsilon)
        rows = x.size // hidden
        y, s32 = np.empty(x.shape, F32), np.empty(x.shape, F32)
        mean, inv_std = np.empty((*x.shape[:-1], 1), F32), np.empty((*x.shape[:-1], 1), F32)
        C.skip_layer_norm(np.ascontiguousarray(x), np.ascontiguousarray(sk), np.ascontiguousarray(g, F64),
                          None if b is None else np.ascontiguousarray(b, F64),
                          None if bias64 is None else np.ascontiguousarray(bias64, F64),
                          rows, hidden, eps, y, mean, inv_std, s32)
        return y, mean, inv_std, s32
    s = np.add(x, sk, dtype=F64)  # x.astype(F64) + sk: both widened exactly, one float64 add
    if bias64 is not None:
        s += bias64
    # onnxruntime normalizes the float32 sum (its fourth output): the float64 sum rounded once
    # to float32, widened back exactly. Where that sum overflows float32, its row is inf and
    # normalizes to NaN, as onnxruntime's does.
    s32 = s.astype(F32)
    s = s32.astype(F64)
    g = hidden_param(op, "gamma", gamma, hidden)
    b = None if beta is None else hidden_param(op, "beta", beta, hidden)
    y, mean, inv_std = _layer_norm(s, g, b, p.float_attribute(op, "epsilon", epsilon))
    return y.astype(F32), mean.astype(F32), inv_std.astype(F32), s32


def embed_layer_normalization(input_ids: np.ndarray, segment_ids: np.ndarray | None, word_embedding: np.ndarray,
                              position_embedding: np.ndarray, segment_embedding: np.ndarray | None,
                              gamma: np.ndarray, beta: np.ndarray, mask: np.ndarray | None = None,
                              position_ids: np.ndarray | None = None, *, epsilon: float = 1e-12,
                              mask_index_type: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """com.microsoft EmbedLayerNormalization: e = word[input_ids] + position[position_ids or
    0..S-1] (+ segment[segment_ids]); output = LayerNorm(e); mask_index = the number of
    non-zero mask entries per batch row (int32, zeros without a mask). Returns
    (output, mask_index, e)."""
    op = "embed_layer_normalization"
    ids = v.integer_tensor(op, "input_ids", input_ids, (np.dtype(np.int32),))
    if ids.ndim != 2:
        raise ValueError(f"{op}: input_ids must be 2-D (batch, sequence); got shape {ids.shape}")
    batch, seq = ids.shape

    def table(name: str, value: Any) -> np.ndarray:  # (rows, hidden), hidden as word_embedding's
        t = p.float_tensor(op, name, value)
        if t.ndim != 2:
            raise ValueError(f"{op}: {name} must be 2-D (rows, hidden); got shape {t.shape}")
        if name != "word_embedding" and t.shape[1] != hidden:
            raise ValueError(f"{op}: {name} must have word_embedding's hidden size {hidden} "
                             f"(shape (rows, {hidden})); got shape {t.shape}")
        return t

    hidden = -1
    words = table("word_embedding", word_embedding)
    hidden = words.shape[1]
    if hidden == 0:  # layer normalization divides by it
        raise ValueError(f"{op}: word_embedding's hidden size (its second dimension) must be >= 1; "
                         f"got shape {words.shape}")
    positions = table("position_embedding", position_embedding)
    v.check_size(op, "the float64 embeddings", (batch, seq, hidden), 8)

    got = _embed_native(op, ids, words, positions, position_ids, segment_ids, segment_embedding, gamma, beta,
                        epsilon, table)
    if got is not None:
        y32, e32 = got
    else:
        y32, e32 = _embed_numpy(op, ids, words, positions, position_ids, segment_ids, segment_embedding, gamma,
                                beta, epsilon, table)
    if mask is None:
        mask_index = np.zeros(batch, np.int32)
    else:
        m = v.integer_tensor(op, "mask", mask, (np.dtype(np.int32),))
        if m.shape != ids.shape:
            raise ValueError(f"{op}: mask must have input_ids' shape {ids.shape}; got shape {m.shape}")
        mask_index = np.count_nonzero(m, axis=-1).astype(np.int32)
    return y32, mask_index, e32


def _embed_numpy(op, ids, words, positions, position_ids, segment_ids, segment_embedding, gamma, beta, epsilon,
                 table):
    """EmbedLayerNormalization's output and sum in NumPy (the NumPy engine's path, the native
    one's reference): the tables' rows widened and added in float64, normalized in float64."""
    batch, seq = ids.shape
    hidden = words.shape[1]

    def gather(table: np.ndarray, index: np.ndarray, name: str) -> np.ndarray:
        if index.size and (index.min() < 0 or index.max() >= table.shape[0]):
            raise ValueError(f"{op}: {name} must index the {table.shape[0]} rows of its embedding; "
                             f"got values in [{index.min()}, {index.max()}]")
        return table[index].astype(F64)

    e = gather(words, ids, "input_ids")
    pos = _position_ids(op, position_ids, batch, seq)
    e = e + gather(positions, np.broadcast_to(np.arange(seq), (batch, seq)) if pos is None else pos, "position_ids")
    if segment_embedding is not None and segment_ids is not None:
        seg = _segment_ids(op, segment_ids, ids.shape)
        e = e + gather(table("segment_embedding", segment_embedding), seg, "segment_ids")
    y, _, _ = _layer_norm(e, _hidden_param(op, "gamma", gamma, hidden), _hidden_param(op, "beta", beta, hidden),
                          p.float_attribute(op, "epsilon", epsilon))
    return y.astype(F32), e.astype(F32)


def _position_ids(op: str, position_ids: Any, batch: int, seq: int) -> np.ndarray | None:
    """position_ids (int32 or int64) broadcast to (batch, seq), or None (0..seq-1)."""
    if position_ids is None:
        return None
    given = v.integer_tensor(op, "position_ids", position_ids, (np.dtype(np.int32), np.dtype(np.int64)))
    try:
        return np.broadcast_to(given, (batch, seq))
    except ValueError:
        raise ValueError(f"{op}: position_ids must broadcast to input_ids' shape {(batch, seq)}; "
                         f"got shape {given.shape}") from None


def _segment_ids(op: str, segment_ids: Any, shape: tuple) -> np.ndarray:
    seg = v.integer_tensor(op, "segment_ids", segment_ids, (np.dtype(np.int32),))
    if seg.shape != shape:
        raise ValueError(f"{op}: segment_ids must have input_ids' shape {shape}; got shape {seg.shape}")
    return seg


def _embed_native(op, ids, words, positions, position_ids, segment_ids, segment_embedding, gamma, beta, epsilon,
                  table):
    """EmbedLayerNormalization's output and sum on the native engine (transformer/embed.c: the
    NumPy path's float64 operations in its order, hence its bits), or None where the NumPy path
    runs: the NumPy engine, an empty batch, or any input that path refuses (it then reports
    it, in its order)."""
    C = _native.native()
    batch, seq = ids.shape
    if C is None or not batch or not seq:
        return None
    hidden = words.shape[1]
    try:
        pos = _position_ids(op, position_ids, batch, seq)
        seg = segs = None
        if segment_embedding is not None and segment_ids is not None:
            seg = np.ascontiguousarray(_segment_ids(op, segment_ids, ids.shape))
            segs = np.ascontiguousarray(table("segment_embedding", segment_embedding))
        g = np.ascontiguousarray(_hidden_param(op, "gamma", gamma, hidden))
        b = np.ascontiguousarray(_hidden_param(op, "beta", beta, hidden))
        eps = p.float_attribute(op, "epsilon", epsilon)
    except (ValueError, TypeError):
        return None
    pos = None if pos is None else np.ascontiguousarray(pos)
    y, e = np.empty((batch, seq, hidden), F32), np.empty((batch, seq, hidden), F32)
    got = C.embed_layer_norm(np.ascontiguousarray(ids), pos, pos is not None and pos.dtype == np.int64, seg,
                             batch, seq, np.ascontiguousarray(words), words.shape[0], np.ascontiguousarray(positions),
                             positions.shape[0], segs, 0 if segs is None else segs.shape[0], hidden, g, b, eps, y, e)
    return (y, e) if got == 1 else None


def _attention_checks(op: str, batch: int, seq: int, three_h: int, num_heads: int, mask_index: Any, past: Any):
    """The attention's geometry, past and mask checked (in the order the errors are reported):
    (head size, past as float32 or None, its length, the int32 mask or None, its form: one of
    _MASK_*)."""
    hidden = three_h // 3
    if hidden % num_heads:
        raise ValueError(f"{op}: the hidden size {hidden} must be divisible by num_heads ({num_heads})")
    head = hidden // num_heads
    pa, past_len = None, 0
    if past is not None:
        pa = p.float_tensor(op, "past", past)
        if pa.ndim != 5 or pa.shape[0] != 2 or pa.shape[1] != batch or pa.shape[2] != num_heads or pa.shape[4] != head:
            raise ValueError(f"{op}: past must have shape (2, {batch}, {num_heads}, past_sequence, {head}); "
                             f"got {pa.shape}")
        past_len = pa.shape[3]
    total = past_len + seq
    v.check_size(op, "the float64 attention scores", (batch, num_heads, seq, total), 8)
    m, kind = None, _MASK_NONE
    if mask_index is not None:
        # int32, as onnxruntime's schema (M: tensor(int32)): a float mask's values were compared
        # and took as lengths, which onnxruntime refuses
        m = v.integer_tensor(op, "mask_index", mask_index, (np.dtype(np.int32),))
        if m.ndim == 2 and m.shape == (batch, total):
            kind = _MASK_2D
        elif m.ndim == 3 and m.shape == (batch, seq, total):
            kind = _MASK_3D
        elif m.ndim == 1 and m.shape[0] in (batch, 2 * batch):
            kind = _MASK_END if m.shape[0] == batch else _MASK_END_START
        else:
            raise ValueError(f"{op}: mask_index must have shape ({batch},), ({2 * batch},), ({batch}, {total}) "
                             f"or ({batch}, {seq}, {total}); got {m.shape}")
    return head, pa, past_len, m, kind


#: Multiply-adds of q·kᵀ and probs·v (2 · B · N · S · total · head) up to which the native
#: kernel runs the attention: its sums are scalar, in a fixed order, so above this a BLAS
#: product (the NumPy path: float64 dgemm) is faster (at 2^15 the native kernel takes ~20 us, the
#: NumPy path's ~40 NumPy calls about as long; a BERT-base layer's 25 M it would take 30x).
NATIVE_ATTENTION_MACS = 1 << 15

# the mask forms (as qlinear/csrc/include/transformer.h numbers them): none, raw (B, total),
# raw (B, S, total), end positions (B), end and start positions (2B)
_MASK_NONE, _MASK_2D, _MASK_3D, _MASK_END, _MASK_END_START = range(5)


def _attention_native(op: str, qkv: Any, num_heads: int, mask_index: Any, past: Any, unidirectional: int,
                      scale: float, mask_filter_value: float, *, projection: tuple | None = None):
    """The attention on the native engine (qlinear/csrc/transformer/attention.c: the same float64
    formula, its sums in a fixed order), or None where the NumPy path runs it (the NumPy
    engine, a batch, sequence or head count of 0, more than NATIVE_ATTENTION_MACS). ``qkv`` is the float64 projection (B, S,
    3H), or with ``projection`` = (acc int32 (B, S, 3H), weight scale float32 (1 or 3H values),
    input scale float32, bias float32 (3H)) QAttention's accumulators, scaled in C."""
    C = _native.native()
    batch, seq, three_h = qkv.shape if projection is None else projection[0].shape
    if C is None or not batch or not seq or not three_h:
        return None
    head, pa, past_len, m, kind = _attention_checks(op, batch, seq, three_h, num_heads, mask_index, past)
    total = past_len + seq
    if 2 * batch * num_heads * seq * total * head > NATIVE_ATTENTION_MACS:
        return None
    v.check_size(op, "present", (2, batch, num_heads, total, head), 4)
    out = np.empty((batch, seq, three_h // 3), F32)
    present = np.empty((2, batch, num_heads, total, head), F32)
    s = scale if scale else 1.0 / math.sqrt(head)
    pa = None if pa is None else np.ascontiguousarray(pa)
    m = None if m is None else np.ascontiguousarray(m)
    if projection is None:
        C.attention(np.ascontiguousarray(qkv, F64), batch, seq, num_heads, head, pa, past_len, m, kind,
                    unidirectional, s, mask_filter_value, out, present)
    else:
        acc, ws, sx, bias32 = projection
        C.qattention(np.ascontiguousarray(acc), ws, ws.size > 1, float(sx), bias32, batch, seq, num_heads, head,
                     pa, past_len, m, kind, unidirectional, s, mask_filter_value, out, present)
    return out, present


def _attention_core(op: str, qkv: np.ndarray, num_heads: int, mask_index: Any, past: Any, unidirectional: int,
                    scale: float, mask_filter_value: float) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head self-attention of a fused projection qkv (batch, seq, 3 · hidden), float64."""
    got = _attention_native(op, qkv, num_heads, mask_index, past, unidirectional, scale, mask_filter_value)
    if got is not None:
        return got
    # its products on OpenBLAS, single-threaded as the backend runs BLAS (qlinear.graph.rep
    # counts QAttention among the nodes that need no switch of their own: this is its one)
    with _blas.single_threaded():
        return _attention_numpy(op, qkv, num_heads, mask_index, past, unidirectional, scale, mask_filter_value)


def _attention_numpy(op: str, qkv: np.ndarray, num_heads: int, mask_index: Any, past: Any, unidirectional: int,
                     scale: float, mask_filter_value: float) -> tuple[np.ndarray, np.ndarray]:
    """``_attention_core`` in NumPy (the NumPy engine's path and the native one's reference)."""
    batch, seq, three_h = qkv.shape
    hidden = three_h // 3
    head, pa, past_len, m, kind = _attention_checks(op, batch, seq, three_h, num_heads, mask_index, past)

    def heads(t: np.ndarray) -> np.ndarray:  # (B, S, H) → (B, N, S, h)
        return t.reshape(batch, seq, num_heads, head).transpose(0, 2, 1, 3)

    q, k, vv = heads(qkv[..., :hidden]), heads(qkv[..., hidden:2 * hidden]), heads(qkv[..., 2 * hidden:])
    if pa is not None:
        k = np.concatenate([pa[0].astype(F64), k], axis=2)
        vv = np.concatenate([pa[1].astype(F64), vv], axis=2)
    total = past_len + seq
    present = np.empty((2, *k.shape), F32)  # np.stack([k, vv]).astype(F32): the same casts
    present[0] = k
    present[1] = vv
    s = scale if scale else 1.0 / math.sqrt(head)
    scores = np.matmul(q, k.swapaxes(-1, -2))
    scores *= s
    if kind == _MASK_2D:
        scores += np.where(m > 0, 0.0, mask_filter_value)[:, None, None, :]
    elif kind == _MASK_3D:
        scores += np.where(m > 0, 0.0, mask_filter_value)[:, None, :, :]
    elif kind != _MASK_NONE:
        cols = np.arange(total)
        end = m[:batch].reshape(batch, 1)
        start = m[batch:].reshape(batch, 1) if kind == _MASK_END_START else np.zeros((batch, 1), m.dtype)
        keep = (cols[None, :] < end) & (cols[None, :] >= start)
        scores += np.where(keep, 0.0, mask_filter_value)[:, None, None, :]
    if unidirectional:
        scores += _causal_mask(seq, total, past_len, mask_filter_value)
    if total == 0:  # no keys (an empty sequence, no past): an empty output, nothing to normalize
        probs = scores
    else:
        # scores.max and probs.sum are these reductions, without their Python wrappers
        scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
        probs = np.exp(scores, out=scores)
        probs /= np.add.reduce(probs, axis=-1, keepdims=True)
    out = np.matmul(probs, vv).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return out.astype(F32), present


@functools.lru_cache(maxsize=64)
def _causal_mask(seq: int, total: int, past_len: int, mask_filter_value: float) -> np.ndarray:
    """(seq, total) float64: mask_filter_value where key j lies after query i (j > past_len + i),
    0.0 elsewhere; built once per geometry (read-only: it is shared)."""
    future = np.arange(total)[None, :] > (past_len + np.arange(seq))[:, None]
    out = np.where(future, mask_filter_value, 0.0)
    out.flags.writeable = False
    return out


def _attention_attrs(op: str, num_heads: Any, unidirectional: Any) -> tuple[int, int]:
    n = v.int_attribute(op, "num_heads", num_heads, 1)
    return n, p.flag(op, "unidirectional", unidirectional)


def attention(input: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None, mask_index: Any = None,
              past: np.ndarray | None = None, attention_bias: np.ndarray | None = None,
              past_sequence_length: Any = None, *, num_heads: int, unidirectional: int = 0, scale: float = 0.0,
              mask_filter_value: float = -10000.0) -> tuple[np.ndarray, np.ndarray]:
    """com.microsoft Attention (self-attention with a fused Q/K/V weight (hidden_in, 3 · hidden)):
    qkv = input · weights + bias; per head softmax(q·kᵀ · scale + masks) · v, where scale defaults
    to 1/√head_size, masked keys get mask_filter_value, unidirectional hides future keys and
    past (2, B, N, P, h) is prepended to k and v. Returns (output, present)."""
    op = "attention"
    x = p.float_tensor(op, "input", input)
    w = p.float_tensor(op, "weights", weights)
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2] or w.shape[1] % 3:
        raise ValueError(f"{op}: input must be (batch, sequence, hidden_in) and weights (hidden_in, 3 · hidden); "
                         f"got {x.shape} and {w.shape}")
    if attention_bias is not None:
        raise ValueError(f"{op}: attention_bias is not supported")
    n, uni = _attention_attrs(op, num_heads, unidirectional)
    qkv = x.astype(F64) @ w.astype(F64)
    if bias is not None:
        qkv = qkv + _hidden_param(op, "bias", bias, w.shape[1])
    return _attention_core(op, qkv, n, mask_index, past, uni, p.float_attribute(op, "scale", scale),
                           p.float_attribute(op, "mask_filter_value", mask_filter_value))


def qattention(input: np.ndarray, weight: np.ndarray, bias: np.ndarray, input_scale: Any, weight_scale: Any,
               mask_index: Any = None, input_zero_point: Any = None, weight_zero_point: Any = None,
               past: np.ndarray | None = None, *, num_heads: int, unidirectional: int = 0, scale: float = 0.0,
               mask_filter_value: float = -10000.0) -> tuple[np.ndarray, np.ndarray]:
    """com.microsoft QAttention: qkv = f(f(acc) · f(weight_scale · input_scale)) + bias with
    acc = Σ (input - input_zp)(weight - weight_zp) exact (weight scale and zero point per tensor
    or per column), then the float attention of ``attention``. Returns (output, present)."""
    return _qattention_op(input, weight, bias, input_scale, weight_scale, mask_index, input_zero_point,
                          weight_zero_point, past, num_heads=num_heads, unidirectional=unidirectional,
                          scale=scale, mask_filter_value=mask_filter_value)


def _weight_qparams(op: str, w: np.ndarray, weight_scale, weight_zero_point) -> tuple[np.ndarray, np.ndarray]:
    """QAttention's weight_scale and weight_zero_point, checked: one element, or one per
    column of ``w`` (hidden_in, 3 · hidden); an absent zero point is 0 of w's type."""
    cols = w.shape[1]
    ws = v.scale(op, "weight_scale", weight_scale)
    if ws.size not in (1, cols):
        raise ValueError(f"{op}: weight_scale must have one element or {cols}; got shape {ws.shape}")
    wz = np.zeros((), w.dtype) if weight_zero_point is None else v.zero_point(
        op, "weight_zero_point", weight_zero_point, "weight", w.dtype)
    if wz.size not in (1, cols):
        raise ValueError(f"{op}: weight_zero_point must have one element or {cols}; got shape {wz.shape}")
    return ws, wz


class PreparedQAttention:
    """QAttention's weight, bias, weight_scale and weight_zero_point (constants of the model)
    and its attributes checked once; ``run`` takes the other inputs and computes what
    ``_qattention_op`` computes, in the same operations. The constructor raises what
    ``qattention`` would raise about them (the backend then keeps the full path, so that a
    call reports its errors in the usual order)."""

    def __init__(self, weight, bias, weight_scale, weight_zero_point, *, num_heads, unidirectional=0, scale=0.0,
                 mask_filter_value=-10000.0, product=matmul_integer):
        op = "qattention"
        w = p.tensor(op, "weight", weight)
        if w.ndim != 2 or w.shape[1] % 3:
            raise ValueError(f"{op}: weight must be (hidden_in, 3 · hidden); got {w.shape}")
        self.n, self.uni = _attention_attrs(op, num_heads, unidirectional)
        cols = w.shape[1]
        ws, wz = _weight_qparams(op, w, weight_scale, weight_zero_point)
        self.w, self.cols = w, cols
        self.wz = wz.reshape(()) if wz.size == 1 else wz.reshape(cols)
        self.ws_cols = ws.reshape(-1) if ws.size > 1 else None
        self.ws = ws.reshape(()) if ws.size == 1 else None
        self.bias32 = _hidden_param(op, "bias", bias, cols).astype(F32)
        self.ws_flat = np.ascontiguousarray(ws.reshape(-1), F32)  # the native path's weight scale
        # bounds for skipping np.errstate (microseconds a call) where nothing can overflow:
        # |acc| < 2**31 (int32), so |acc · m| <= 2**31 · 1e28 < 3e37 for |m| <= 1e28, and adding
        # a bias below 3e38 stays finite
        self._ws_max = float(np.abs(ws).max()) if ws.size else 0.0
        self._bias_small = bool(self.bias32.size == 0 or float(np.abs(self.bias32).max()) < 3e38)
        self.scale = p.float_attribute(op, "scale", scale)
        self.mask_filter_value = p.float_attribute(op, "mask_filter_value", mask_filter_value)
        self.product = product

    def run(self, input, input_scale, mask_index=None, input_zero_point=None, past=None):
        got = self._lean(input, input_scale, mask_index, input_zero_point, past)
        if got is not None:
            return got
        op = "qattention"
        x = p.tensor(op, "input", input)
        w = self.w
        if x.ndim != 3 or w.shape[0] != x.shape[2]:
            raise ValueError(f"{op}: input must be (batch, sequence, hidden_in) and weight (hidden_in, 3 · hidden); "
                             f"got {x.shape} and {w.shape}")
        sx, zx = p.qparams(op, "input_scale", input_scale, "input_zero_point", input_zero_point, "input", x.dtype)
        acc = self.product(x, w, np.asarray(zx, x.dtype), self.wz)
        got = _attention_native(op, None, self.n, mask_index, past, self.uni, self.scale, self.mask_filter_value,
                                projection=(acc, self.ws_flat, sx, self.bias32))
        if got is not None:
            return got
        qkv = _qkv(acc, sx, self.ws_cols, self.ws, self.bias32,
                   guarded=not (self._bias_small and self._ws_max * abs(float(sx)) <= 1e28))
        return _attention_core(op, qkv.astype(F64), self.n, mask_index, past, self.uni, self.scale,
                               self.mask_filter_value)


    def _lean(self, x, sx, mask, zx, past):
        """``run``'s result without its general checks for the inputs a model's run repeats,
        or None (``run`` then takes them): the attention's size within NATIVE_ATTENTION_MACS, x a C-contiguous 8-bit ndarray of the shape of the
        last native product (whose plan ``PreparedMatMulInteger`` keeps for a 0-d zero point),
        input_scale a finite 0-d float32 ndarray, input_zero_point a 0-d ndarray of x's dtype,
        mask_index None or a C-contiguous int32 ndarray of one of the four shapes, past None
        or a C-contiguous float32 ndarray of the expected shape. Each passes the checks ``run``
        makes (their other outcomes are not taken here), and the computation is the same
        native call."""
        C = _native.native()
        geometry = self._lean_geometry(C, x, sx, mask, zx, past)
        if geometry is None:
            return None
        batch, seq, heads, head, past_len, total, kind, prepared = geometry
        s = float(sx)
        acc = prepared._repeat_zero_point(x, zx)  # None unless its plan fits x
        if acc is None:
            return None
        op = "qattention"
        v.check_size(op, "the float64 attention scores", (batch, heads, seq, total), 8)
        v.check_size(op, "present", (2, batch, heads, total, head), 4)
        out = np.empty((batch, seq, self.cols // 3), F32)
        present = np.empty((2, batch, heads, total, head), F32)
        C.qattention(acc, self.ws_flat, self.ws_flat.size > 1, s, self.bias32, batch, seq, heads, head, past,
                     past_len, mask, kind, self.uni, self.scale if self.scale else 1.0 / math.sqrt(head),
                     self.mask_filter_value, out, present)
        return out, present

    def _lean_geometry(self, C, x, sx, mask, zx, past):
        """The checks of ``_lean`` (see there): (batch, seq, heads, head, past_len, total, mask
        kind, the product's PreparedMatMulInteger) where its path applies, else None."""
        prepared = getattr(self.product, "prepared", None)
        if (C is None or prepared is None or type(x) is not np.ndarray or x.ndim != 3 or not x.flags.c_contiguous
                or type(sx) is not np.ndarray or sx.dtype != F32 or sx.ndim != 0 or type(zx) is not np.ndarray
                or zx.dtype != x.dtype or zx.ndim != 0 or self.cols % (3 * self.n)):
            return None
        if not math.isfinite(float(sx)):
            return None
        batch, seq, _ = x.shape
        heads, head = self.n, self.cols // (3 * self.n)
        if past is None:
            past_len = 0
        elif (type(past) is np.ndarray and past.dtype == F32 and past.ndim == 5 and past.flags.c_contiguous
              and past.shape[0] == 2 and past.shape[1] == batch and past.shape[2] == heads and past.shape[4] == head):
            past_len = past.shape[3]
        else:
            return None
        total = past_len + seq
        if mask is None:
            kind = _MASK_NONE
        elif type(mask) is not np.ndarray or mask.dtype != np.int32 or not mask.flags.c_contiguous:
            return None
        elif mask.shape == (batch, total):
            kind = _MASK_2D
        elif mask.shape == (batch, seq, total):
            kind = _MASK_3D
        elif mask.shape == (batch,):
            kind = _MASK_END
        elif mask.shape == (2 * batch,):
            kind = _MASK_END_START
        else:
            return None
        if not batch or not seq or 2 * batch * heads * seq * total * head > NATIVE_ATTENTION_MACS:
            return None
        return batch, seq, heads, head, past_len, total, kind, prepared

    def bound_run(self, x, sx, mask, zx, past):
        """``run`` bound to inputs like these, after a call of ``run`` with them that took its
        lean path: ``f(x, sx, mask, zx, past)`` gives run's outputs for inputs of these shapes
        and dtypes (each checked as ``_lean`` checks it) in one native call
        (``qattention_run``, csrc/transformer/bound.c: the same product, projection and
        attention), None for any other; None when there is no such path (the NumPy engine,
        a product not on one packed matrix)."""
        C = _native.native()
        geometry = self._lean_geometry(C, x, sx, mask, zx, past)
        if geometry is None or getattr(C, "qattention_bind", None) is None:
            return None
        batch, seq, heads, head, past_len, total, kind, prepared = geometry
        last = prepared._zp_call
        if last is None or last[0] != x.shape or last[1] != x.dtype:
            return None
        call, limit = last[2], last[3]
        isa, (_, which, rows, cols, k, batches), mid, tail = call[0], call[1], call[2], call[3]
        a_code, ba, _, _, zpa_bs, zpa_rs, packed, colsums, zcol, bb, _ = mid
        if (isa != C.get_isa() or limit != v.max_output_bytes() or call[6] is not None or batches != 1 or ba != 1
                or bb != 1 or zpa_bs or zpa_rs or tail[0] or rows != batch * seq or cols != self.cols):
            return None
        op = "qattention"
        v.check_size(op, "the float64 attention scores", (batch, heads, seq, total), 8)
        v.check_size(op, "present", (2, batch, heads, total, head), 4)
        one = C.qattention_bind(isa, which, k, cols, a_code, packed, colsums, zcol, self.ws_flat,
                                int(self.ws_flat.size > 1), self.bias32, batch, seq, heads, head, past_len, kind,
                                int(self.uni), self.scale if self.scale else 1.0 / math.sqrt(head),
                                self.mask_filter_value)
        run, max_bytes, nd, f32, i32 = C.qattention_run, v.max_output_bytes, np.ndarray, F32, np.int32
        xshape, xdt, mshape = x.shape, x.dtype, None if mask is None else mask.shape
        pshape = None if past is None else past.shape
        oshape, prshape, empty = (batch, seq, self.cols // 3), (2, batch, heads, total, head), np.empty

        def bound(x, sx, mask, zx, past):
            if (type(x) is not nd or x.dtype != xdt or x.shape != xshape or not x.flags.c_contiguous
                    or type(sx) is not nd or sx.dtype != f32 or sx.shape != () or type(zx) is not nd
                    or zx.dtype != xdt or zx.shape != () or max_bytes() != limit):
                return None
            if mask is None:
                if mshape is not None:
                    return None
            elif (type(mask) is not nd or mask.dtype != i32 or mask.shape != mshape
                  or not mask.flags.c_contiguous):
                return None
            if past is None:
                if pshape is not None:
                    return None
            elif (type(past) is not nd or past.dtype != f32 or past.shape != pshape
                  or not past.flags.c_contiguous):
                return None
            out, present = empty(oshape, f32), empty(prshape, f32)
            if run(one, x, float(sx), int(zx), mask, past if past_len else None, out, present):
                return out, present
            return None
        return bound


def _qkv(acc: np.ndarray, sx: np.float32, ws_cols: np.ndarray | None, ws: np.ndarray | None,
         bias32: np.ndarray, *, guarded: bool = True) -> np.ndarray:
    """QAttention's projection f(f(acc) · f(weight_scale · input_scale)) + bias in float32,
    with the weight scale per column (``ws_cols``) or per tensor (0-d ``ws``); ``guarded``
    False skips np.errstate where the caller has bounded the product (microseconds a call)."""
    if not guarded:
        qkv = acc.astype(F32) * (ws_cols * sx if ws_cols is not None else F32(ws * sx))
        return qkv + bias32
    with np.errstate(over="ignore"):
        qkv = acc.astype(F32) * (ws_cols * sx if ws_cols is not None else F32(ws * sx))
        return qkv + bias32


def _qattention_op(input, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
                   weight_zero_point=None, past=None, *, num_heads, unidirectional=0, scale=0.0,
                   mask_filter_value=-10000.0, product=matmul_integer):
    """``qattention`` with the integer product computed by ``product``."""
    op = "qattention"
    x = p.tensor(op, "input", input)
    w = p.tensor(op, "weight", weight)
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2] or w.shape[1] % 3:
        raise ValueError(f"{op}: input must be (batch, sequence, hidden_in) and weight (hidden_in, 3 · hidden); "
                         f"got {x.shape} and {w.shape}")
    n, uni = _attention_attrs(op, num_heads, unidirectional)
    sx, zx = p.qparams(op, "input_scale", input_scale, "input_zero_point", input_zero_point, "input", x.dtype)
    cols = w.shape[1]
    ws, wz = _weight_qparams(op, w, weight_scale, weight_zero_point)
    acc = product(x, w, np.asarray(zx, x.dtype), wz.reshape(()) if wz.size == 1 else wz.reshape(cols))
    bias32 = _hidden_param(op, "bias", bias, cols).astype(F32)
    scale_, filter_ = p.float_attribute(op, "scale", scale), p.float_attribute(op, "mask_filter_value", mask_filter_value)
    got = _attention_native(op, None, n, mask_index, past, uni, scale_, filter_,
                            projection=(acc, np.ascontiguousarray(ws.reshape(-1), F32), sx, bias32))
    if got is not None:
        return got
    qkv = _qkv(acc, sx, ws.reshape(-1) if ws.size > 1 else None, None if ws.size > 1 else ws.reshape(()), bias32)
    return _attention_core(op, qkv.astype(F64), n, mask_index, past, uni, p.float_attribute(op, "scale", scale),
                           p.float_attribute(op, "mask_filter_value", mask_filter_value))
