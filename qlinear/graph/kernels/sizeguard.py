"""Run-time size guards for the backend (``QLinearRep(model, max_tensor_bytes=N)``,
``qlinear run --max-tensor-bytes N``).

A model can compute a shape and then ask for a tensor of that shape (Expand, ConstantOfShape,
Tile, Pad, Resize, Range, OneHot, a broadcasting Add, ...): the declared sizes checked at load
time say nothing about it, and NumPy would try to allocate 93 GiB and fail with MemoryError
(or succeed and swap). With ``max_tensor_bytes`` set, these operators compute their output's
size from their inputs first and refuse, naming the node, when it is above the limit; so do
the com.microsoft operators of qlinear.graph.kernels.contrib whose output follows from broadcasting
or shapes (CONTRIB_SIZE_GUARDS: QLinearAdd, QLinearMul, QLinearWhere, QLinearConcat, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul, QLinearConv, QLinearAveragePool) or whose
largest tensor outgrows their inputs (DequantizeLinear, QLinearSoftmax,
QLinearGlobalAveragePool, Gelu, FastGelu, SkipLayerNormalization, EmbedLayerNormalization,
QAttention, Attention).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import onnx
from onnx import helper
from onnx.reference.op_run import OpRun
from onnx.reference.ops import load_op

from ..._geometry import AUTO_PADS, explicit_pads
from ...contrib.pool import _pool_geometry
from ...contrib.schema import DOMAIN
from ..errors import NodeError
from ..proto import node_version
from . import control


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= max(int(d), 0)
    return n


def _ints(v) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _broadcast(*shapes) -> list[int]:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dims = [int(s[len(s) - nd + i]) for s in shapes if len(s) - nd + i >= 0]
        big = [d for d in dims if d != 1]
        out.append(max(big) if big else 1)
    return out


def _itemsize(x) -> int:
    return np.asarray(x).dtype.itemsize if x is not None else 8


def _out_expand(args, attrs, version):
    x, shape = args[0], args[1]
    return _broadcast(np.shape(x), _ints(shape)), _itemsize(x)


def _out_constant_of_shape(args, attrs, version):
    value = attrs.get("value")
    itemsize = 4
    if value is not None:
        itemsize = helper.tensor_dtype_to_np_dtype(value.data_type).itemsize
    return _ints(args[0]), itemsize


def _out_tile(args, attrs, version):
    x, repeats = args[0], _ints(args[1])
    return [d * r for d, r in zip(np.shape(x), repeats)], _itemsize(x)


def _out_pad(args, attrs, version):
    x = args[0]
    dims = list(np.shape(x))
    pads = _ints(attrs.get("pads", [])) if version < 11 else _ints(args[1])
    axes = list(range(len(dims)))
    if version >= 18 and len(args) > 3 and args[3] is not None and np.size(args[3]):
        axes = [a % len(dims) for a in _ints(args[3])]
    k = len(pads) // 2
    for i, ax in enumerate(axes[:k]):
        dims[ax] += pads[i] + pads[i + k]
    return dims, _itemsize(x)


def _out_resize(args, attrs, version):
    x = args[0]
    dims = list(np.shape(x))
    if version < 11 or attrs.get("_upsample"):
        scales = args[1] if len(args) > 1 and args[1] is not None else attrs.get("scales")
        sizes = None
    else:
        scales = args[2] if len(args) > 2 else None
        sizes = args[3] if len(args) > 3 else None
    axes = [a % len(dims) for a in attrs.get("axes", range(len(dims)))] if dims else []
    if sizes is not None and np.size(sizes):
        new = _ints(sizes)
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch" and all(dims[a] for a in axes):
            ratios = [n / dims[a] for n, a in zip(new, axes)]
            r = max(ratios) if policy == "not_smaller" else min(ratios)
            new = [int(dims[a] * r + 0.5) for a in axes]
        for a, n in zip(axes, new):
            dims[a] = n
    elif scales is not None and np.size(scales):
        for a, sc in zip(axes, np.asarray(scales, dtype=np.float64).reshape(-1)):
            dims[a] = int(np.floor(dims[a] * sc)) if np.isfinite(sc) else 2**62
    return dims, _itemsize(x)


def _out_upsample(args, attrs, version):
    return _out_resize(args, dict(attrs, _upsample=True), version)


def _out_range(args, attrs, version):
    start, limit, delta = (np.asarray(a).item() for a in args[:3])
    if delta == 0:
        return None
    n = float(np.ceil((limit - start) / delta)) if np.isfinite((limit - start) / delta) else 2**62
    return [max(int(n), 0)], _itemsize(args[0])


def _out_one_hot(args, attrs, version):
    indices, depth, values = args[0], np.asarray(args[1]).item(), args[2]
    return list(np.shape(indices)) + [int(depth)], _itemsize(values)


def _out_broadcast(args, attrs, version):
    arrays = [a for a in args if a is not None]
    shapes = [getattr(a, "shape", None) for a in arrays]
    if shapes and shapes[0] is not None and shapes.count(shapes[0]) == len(shapes):
        return None  # no broadcasting: the output is no larger than an input (the usual case)
    itemsize = max((_itemsize(a) for a in arrays), default=8)
    return _broadcast(*(np.shape(a) for a in arrays)), itemsize


def _out_matmul(args, attrs, version):
    a, b = np.shape(args[0]), np.shape(args[1])
    if len(a) < 1 or len(b) < 1:
        return None
    m = [a[-2]] if len(a) >= 2 else []
    n = [b[-1]] if len(b) >= 2 else []
    batch = _broadcast(a[:-2], b[:-2])
    return batch + m + n, max(_itemsize(args[0]), _itemsize(args[1]), 4)


def _window_geometry(spatial, kernel, attrs):
    """The padded input's and the output's spatial shapes of a sliding window (Conv, the
    pools): explicit pads, or for SAME_* auto_pad the most it can pad; ceil_mode adds at most
    one position per axis."""
    nd = len(kernel)
    strides = list(attrs.get("strides") or [1] * nd)
    dilations = list(attrs.get("dilations") or [1] * nd)
    # ONNX's split: it pads at least as much as onnxruntime's pooling split (which reads the
    # undilated kernel and may crop), so the sizes below bound both
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad if auto_pad in AUTO_PADS else "NOTSET"  # the kernel itself reports a bad one
    begin, end = explicit_pads(spatial, kernel, strides, dilations, auto_pad, attrs.get("pads"))
    padded = [spatial[i] + max(0, begin[i]) + max(0, end[i]) for i in range(nd)]
    ceil = 1 if attrs.get("ceil_mode", 0) else 0
    out = [max((p - (k - 1) * d - 1) // s + 1 + ceil, 0)
           for p, k, d, s in zip(padded, kernel, dilations, strides)]
    return padded, out


def _out_window(args, attrs, version):
    """Conv and the pools: the larger of the output and the padded input (onnx.reference, and
    the backend's MaxPool, pad the input before sliding the window)."""
    x = args[0]
    shape = list(np.shape(x))
    nd = len(shape) - 2
    if nd < 1:
        return None
    kernel = list(attrs.get("kernel_shape") or (np.shape(args[1])[2:] if len(args) > 1 and
                                                 args[1] is not None else []))
    if len(kernel) != nd:
        return None
    padded, out = _window_geometry(shape[2:], kernel, attrs)
    channels = np.shape(args[1])[0] if attrs.get("_conv") and len(args) > 1 else shape[1]
    a = shape[:2] + padded
    b = [shape[0], channels] + out
    return (a if _prod(a) >= _prod(b) else b), _itemsize(x)


def _out_conv(args, attrs, version):
    return _out_window(args, dict(attrs, _conv=True), version)


def _out_quantized_conv(w_index):
    """QLinearConv (w is input 3) and ConvInteger (input 1): qlinear's kernels never pad a
    copy of x (they read only the positions the windows read), so the largest tensor is the
    output's int32 accumulator, 4 bytes an element (as the operator itself sizes it)."""
    def predict(args, attrs, version):
        if len(args) <= w_index or args[w_index] is None:
            return None
        x, w = np.shape(args[0]), np.shape(args[w_index])
        nd = len(x) - 2
        kernel = list(attrs.get("kernel_shape") or w[2:])
        if nd < 1 or len(w) < 1 or len(kernel) != nd:
            return None
        _, out = _window_geometry(list(x[2:]), kernel, attrs)
        return [x[0], w[0]] + out, 4
    return predict


def _out_qlinear_matmul(args, attrs, version):
    """QLinearMatMul (b is input 3): the broadcast product's int32 accumulator."""
    if len(args) < 4:
        return None
    shape, _ = _out_matmul([args[0], args[3]], attrs, version) or (None, None)
    return None if shape is None else (shape, 4)


# com.microsoft operators (qlinear.graph.kernels.contrib): the output of the 8-bit elementwise ones
# and of QLinearConcat (qlinear's kernels write it directly, 1 byte an element), the int32
# accumulator or float32 output of the matmul-like ones and of QLinearConv (4 bytes).


def _out_contrib_binary(args, attrs, version):
    """QLinearAdd / QLinearMul (A is input 0, B input 3): the broadcast 8-bit output."""
    if len(args) < 4:
        return None
    a, b = np.shape(args[0]), np.shape(args[3])
    if a == b:
        return None  # no broadcasting: no larger than an input
    return _broadcast(a, b), _itemsize(args[0])


def _out_qlinear_where(args, attrs, version):
    """QLinearWhere (condition, X, ..., Y at input 4, ...): the broadcast 8-bit output."""
    if len(args) < 5:
        return None
    shapes = [np.shape(args[i]) for i in (0, 1, 4)]
    if shapes.count(shapes[0]) == 3:
        return None
    return _broadcast(*shapes), _itemsize(args[1])


def _out_qlinear_concat(args, attrs, version):
    """QLinearConcat(Y_scale, Y_zero_point, X0, X0_scale, X0_zero_point, X1, ...)."""
    tensors = [np.shape(x) or (1,) for x in args[2::3]]
    if not tensors:
        return None
    shape = list(tensors[0])
    ax = int(attrs.get("axis", 0))
    if not -len(shape) <= ax < len(shape):
        return None  # the operator reports the bad axis
    ax %= len(shape)
    shape[ax] = sum(t[ax] if len(t) == len(shape) else 0 for t in tensors)
    return shape, _itemsize(args[2])


def _out_qgemm(args, attrs, version):
    """QGemm (A input 0, B input 3, optional transA / transB): the (M, N) int32 accumulator."""
    if len(args) < 4:
        return None
    a, b = np.shape(args[0]), np.shape(args[3])
    if len(a) != 2 or len(b) != 2:
        return None
    m = a[1] if attrs.get("transA", 0) else a[0]
    n = b[0] if attrs.get("transB", 0) else b[1]
    return [m, n], 4


def _out_contrib_matmul(args, attrs, version):
    """MatMulIntegerToFloat, DynamicQuantizeMatMul (A input 0, B input 1): numpy.matmul's
    shape, an int32 accumulator and a float32 output (4 bytes an element)."""
    if len(args) < 2:
        return None
    shape, _ = _out_matmul(args[:2], attrs, version) or (None, None)
    return None if shape is None else (shape, 4)


def _out_contrib_conv(args, attrs, version):
    """com.microsoft QLinearConv: as the standard one, x channels-last when channels_last=1
    (its output is moved back to channels-last: the same size)."""
    if attrs.get("channels_last", 0) and np.ndim(args[0]) >= 3:
        shape = np.shape(args[0])
        # a zero-stride view with the channels-first shape: no allocation
        args = [np.broadcast_to(np.zeros((), np.uint8), (shape[0], shape[-1]) + shape[1:-1]),
                *args[1:]]
    return _out_quantized_conv(3)(args, attrs, version)


def _out_qlinear_average_pool(args, attrs, version):
    """com.microsoft QLinearAveragePool: the larger of its padded float32 copy of X and its
    int64 window sums, sized as qlinear.contrib.pool computes them (pads are below the kernel,
    but a large kernel still pads a small input to kernel-size windows)."""
    shape = list(np.shape(args[0]))
    if len(shape) < 3:
        return None
    if attrs.get("channels_last", 0):
        shape = [shape[0], shape[-1]] + shape[1:-1]
    nd = len(shape) - 2
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides") or [1] * nd)
    pads = attrs.get("pads")
    spatial = shape[2:]
    begin, end, out = _pool_geometry("qlinear_average_pool", spatial, kernel, strides,
                                     None if pads is None else list(pads),
                                     attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0))
    if tuple(kernel) == tuple(spatial) and not any(begin) and not any(end):
        return None  # the global average: no copy, a smaller output
    begin = list(begin)
    for i in range(nd):
        if begin[i] < 0:  # the operator drops what no window reads
            spatial[i] = max(spatial[i] + begin[i], 0)
            begin[i] = 0
    extra = [max(0, (out[i] - 1) * strides[i] + kernel[i] - (spatial[i] + begin[i])) for i in range(nd)]
    padded = shape[:2] + [spatial[i] + begin[i] + extra[i] for i in range(nd)]
    sums = shape[:2] + list(out)
    return (padded, 4) if _prod(padded) * 4 >= _prod(sums) * 8 else (sums, 8)


def _out_like_input(itemsize: int):
    """An operator whose largest tensor has its first input's shape at ``itemsize`` bytes an
    element: com.microsoft DequantizeLinear's float32 output, the float64 working copy of
    QLinearSoftmax, Gelu, FastGelu and SkipLayerNormalization (as qlinear.contrib sizes them).
    (QLinearSigmoid, QLinearLeakyRelu and QuantizeLinear write no more bytes than they read:
    an input within the limit keeps them within it.)"""
    def predict(args, attrs, version):
        return (list(np.shape(args[0])), itemsize) if args else None
    return predict


def _out_qlinear_global_average_pool(args, attrs, version):
    """QLinearGlobalAveragePool: its (N, C) int64 sums (8 bytes for each 8-bit element of an
    input with one spatial position)."""
    shape = list(np.shape(args[0]))
    if len(shape) < 3:
        return None
    return [shape[0], shape[-1] if attrs.get("channels_last", 0) else shape[1]], 8


def _out_embed_layer_normalization(args, attrs, version):
    """EmbedLayerNormalization (input_ids (B, S), word_embedding (V, H) at input 2): the
    float64 embeddings (B, S, H)."""
    if len(args) < 3 or args[2] is None:
        return None
    ids, words = np.shape(args[0]), np.shape(args[2])
    if len(ids) != 2 or len(words) < 1:
        return None
    return [ids[0], ids[1], words[-1]], 8


def _out_attention(past_index: int):
    """QAttention (past is input 8) and Attention (input 4): input (B, S, H_in) and a fused
    weight (H_in, 3·H) make float64 q/k/v (B, S, 3·H), scores (B, N, S, P + S) and the float64
    present (2, B, N, P + S, H/N) before its float32 copy, P past positions: the largest."""
    def predict(args, attrs, version):
        if len(args) < 2:
            return None
        x, w = np.shape(args[0]), np.shape(args[1])
        heads = attrs.get("num_heads")
        if len(x) != 3 or len(w) != 2 or not isinstance(heads, int) or heads < 1:
            return None  # the operator reports them
        batch, seq, hidden = x[0], x[1], w[1] // 3
        past = args[past_index] if len(args) > past_index else None
        total = seq + (np.shape(past)[3] if past is not None and np.ndim(past) == 5 else 0)
        shapes = [[batch, seq, 3 * hidden], [batch, heads, seq, total],
                  [2, batch, heads, total, hidden // heads]]
        return max(shapes, key=_prod), 8
    return predict


#: The com.microsoft operators of qlinear.graph.kernels.contrib guarded as OUTPUT_SIZE_GUARDS: those
#: whose output follows from broadcasting, shapes or attributes, and those whose largest tensor
#: is larger than their inputs (a wider dtype, float64 working copies, attention scores).
CONTRIB_SIZE_GUARDS: dict[str, Any] = {
    "QLinearAdd": _out_contrib_binary, "QLinearMul": _out_contrib_binary,
    "QLinearWhere": _out_qlinear_where, "QLinearConcat": _out_qlinear_concat,
    "QGemm": _out_qgemm, "MatMulIntegerToFloat": _out_contrib_matmul,
    "DynamicQuantizeMatMul": _out_contrib_matmul, "QLinearConv": _out_contrib_conv,
    "QLinearAveragePool": _out_qlinear_average_pool,
    "DequantizeLinear": _out_like_input(4), "QLinearSoftmax": _out_like_input(8),
    "Gelu": _out_like_input(8), "FastGelu": _out_like_input(8),
    "SkipLayerNormalization": _out_like_input(8),
    "QLinearGlobalAveragePool": _out_qlinear_global_average_pool,
    "EmbedLayerNormalization": _out_embed_layer_normalization,
    "QAttention": _out_attention(8), "Attention": _out_attention(4),
}


#: Operators whose output size depends on input *values*, broadcasting or padding, with the
#: function that predicts (shape, itemsize) of the largest tensor the operator allocates from
#: its inputs, before it allocates.
OUTPUT_SIZE_GUARDS: dict[str, Any] = {
    "Expand": _out_expand, "ConstantOfShape": _out_constant_of_shape, "Tile": _out_tile,
    "Pad": _out_pad, "Resize": _out_resize, "Upsample": _out_upsample, "Range": _out_range,
    "OneHot": _out_one_hot, "MatMul": _out_matmul, "MatMulInteger": _out_matmul,
    "QLinearMatMul": _out_qlinear_matmul, "QLinearConv": _out_quantized_conv(3),
    "ConvInteger": _out_quantized_conv(1),
    "Conv": _out_conv, "MaxPool": _out_window, "AveragePool": _out_window, "LpPool": _out_window,
    **{op: _out_broadcast for op in ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "And",
                                     "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
                                     "LessOrEqual", "Max", "Min", "Sum", "Mean", "BitShift",
                                     "PRelu")},
}


class _SizeGuard(OpRun):
    """Runs the wrapped implementation after checking its output size against the limit."""

    op_domain = ""
    _limit: int = 0
    _base: type | None = None
    _binary: bool = False
    _guards: dict[str, Any] = OUTPUT_SIZE_GUARDS

    def __init__(self, onnx_node, run_params, schema=None):
        self.onnx_node = onnx_node
        if self.op_domain:  # com.microsoft: qlinear's own kernel, whose version it knows
            self.version = self._base.version
        else:
            opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
            self.version = node_version(onnx_node.op_type, "", opset) or opset
        self.given = {a.name: helper.get_attribute_value(a) for a in onnx_node.attribute}
        for k, v in list(self.given.items()):
            if isinstance(v, bytes):
                self.given[k] = v.decode("utf-8", "replace")
        base = self._base or load_op("", onnx_node.op_type, self.version)
        self._impl = base(onnx_node, run_params)
        self._binary = self._guards.get(onnx_node.op_type) is _out_broadcast

    def need_context(self) -> bool:  # noqa: D102 - as the wrapped operator
        return self._impl.need_context()

    def __getattr__(self, name):  # attributes the evaluator reads (has_linked_attribute, ...)
        if name == "_impl":
            raise AttributeError(name)
        return getattr(self._impl, name)

    @property
    def guarded_impl(self) -> OpRun:
        """The wrapped operator: FastEvaluator calls :meth:`check_size` and then this
        operator's fast path (a ufunc, ``_run``) instead of :meth:`run`."""
        return self._impl

    def check_size(self, args: Sequence[Any]) -> None:
        """Raise NodeError when the largest tensor the operator would allocate from ``args``
        is above the limit; return (None) when it fits or cannot be predicted."""
        if self._binary and len(args) == 2:
            a, b = args
            if type(a) is np.ndarray and type(b) is np.ndarray:
                # a broadcast output has at most a.size * b.size elements: below the limit,
                # no need for the exact shape (the usual case, a bias or a scale)
                if a.size * b.size * max(a.itemsize, b.itemsize) <= self._limit:
                    return
        try:
            predicted = self._guards[self.onnx_node.op_type](args, self.given, self.version)
        except Exception:  # malformed inputs: the operator itself reports them
            predicted = None
        if predicted is not None:
            shape, itemsize = predicted
            nbytes = _prod(shape) * itemsize
            if nbytes > self._limit:
                name = self.onnx_node.name or self.onnx_node.output[0]
                op = f"{self.op_domain}.{self.onnx_node.op_type}" if self.op_domain \
                    else self.onnx_node.op_type
                size, limit = _human_bytes(nbytes), _human_bytes(self._limit)
                if size == limit:  # rounded alike: the exact counts tell them apart
                    size, limit = f"{size} ({nbytes} bytes)", f"{limit} ({self._limit} bytes)"
                raise NodeError(
                    f"node {name!r} ({op}-{self.version}): a tensor of "
                    f"shape {list(shape)} would take {size}, more than the "
                    f"limit of {limit} per tensor (max_tensor_bytes, "
                    "qlinear's --max-tensor-bytes)")

    def run(self, *args, **kwargs):  # noqa: D102
        self.check_size(args)
        return self._impl.run(*args, **kwargs)

    def _run(self, *args, **kwargs):  # run() above does the work
        raise NotImplementedError


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def with_size_guards(kernels: Sequence[type[OpRun]], max_tensor_bytes: int | None
                     ) -> list[type[OpRun]]:
    """``kernels`` plus size-guarded versions of the operators of OUTPUT_SIZE_GUARDS and of the
    com.microsoft ones of CONTRIB_SIZE_GUARDS that ``kernels`` has (a kernel already in
    ``kernels`` for one of them is wrapped, not replaced); ``kernels`` unchanged
    when ``max_tensor_bytes`` is None."""
    if max_tensor_bytes is None:
        return list(kernels)
    existing = {(k.op_domain, k.__name__): k for k in kernels}
    guards = [type(op, (_SizeGuard,), {"_limit": int(max_tensor_bytes),
                                       "_base": existing.get(("", op))})
              for op in OUTPUT_SIZE_GUARDS]
    # the com.microsoft operators: only those with a kernel here (qlinear's, or its emulating one)
    contrib = [op for op in CONTRIB_SIZE_GUARDS if (DOMAIN, op) in existing]
    guards += [type(op, (_SizeGuard,), {"_limit": int(max_tensor_bytes), "op_domain": DOMAIN,
                                        "_base": existing[(DOMAIN, op)],
                                        "_guards": CONTRIB_SIZE_GUARDS})
               for op in contrib]
    # Loop and Scan grow their scan outputs one slice per iteration: counted as they grow
    replaced = ({("", op) for op in OUTPUT_SIZE_GUARDS} | {(DOMAIN, op) for op in contrib}
                | {("", "Loop"), ("", "Scan")})
    return ([k for k in kernels if (k.op_domain, k.__name__) not in replaced] + guards
            + control.limited(max_tensor_bytes))
