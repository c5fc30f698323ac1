"""Integer islands: the float glue onnxruntime runs between its quantized kernels, computed on the
8-bit tensors in one node with onnxruntime's float32 operations (the same bytes).

After onnxruntime's QDQ fusion (:func:`qlinear.passes.fuse_qdq`) some float nodes stay between
DequantizeLinear and QuantizeLinear: a residual ``Sum`` (onnxruntime has no quantized Sum), a
``BatchNormalization`` that was not folded, a ``Relu`` whose QuantizeLinear does not absorb it.
onnxruntime runs each of them as a float node over a float tensor. The result is nevertheless a
fixed function of the 8-bit inputs, computed with correctly rounded float32 operations, so it can
be computed in one pass over the bytes with the same operations in the same order:

- **element-wise island**: an ``Add`` / ``Sum`` of two inputs, each a float tensor or a
  ``DequantizeLinear`` output, either through a ``BatchNormalization``, or one
  ``BatchNormalization`` alone, then an optional ``Relu``; its result goes to a
  ``QuantizeLinear`` (absorbed: the 8-bit output) and / or elsewhere (the float32 output,
  under the same name). It becomes qlinear.internal ``QDQIsland``: per element
  ``Q(R(f(A + B)))`` with each operand ``f(float(x - z) * s)`` for a DequantizeLinear and
  ``f(f(v * s') + b')`` through a BatchNormalization (docs/qdq.md has the arithmetic,
  qlinear/csrc/island/ the kernel). onnxruntime's QOperator ResNet-50 from its quantizer has
  its residual joins so: ``Sum(DequantizeLinear(a), previous) -> Relu -> {QuantizeLinear,
  the next Sum}``;
- **table island** ``DequantizeLinear(x) -> (BatchNormalization | Relu | LeakyRelu | Clip)* ->
  QuantizeLinear`` becomes qlinear.internal ``QDQTableIsland(x, tables)``: each output byte is
  a function of the input byte and, with a BatchNormalization, of the channel, so the rewrite
  evaluates the float graph's operations (NumPy float32, one rounding each, as onnxruntime's
  kernels: its BatchNormalization computes ``x * s' + b'`` with ``s' = scale / sqrt(var + eps)``
  and ``b' = B - mean * s'``, measured bit-identical) on the 256 codes of each channel once.

Conditions: every DequantizeLinear and the QuantizeLinear have constant scalar float32 scales
(positive, finite, the DequantizeLinear's below 2^100 so that no product overflows) and constant
scalar 8-bit zero points (a table maps each input byte to a code of the QuantizeLinear's type,
which may differ from the DequantizeLinear's), and every intermediate tensor has one reader and
is not a graph output. Not one of onnxruntime's rewrites:
qlinear's own, like :func:`qlinear.passes.exact_integer_convs`, which changes no byte.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import onnx
from onnx import helper

from ..contrib._arith import mlas_quantize
from ..graph.proto import T
from .exact_convs import INTERNAL_DOMAIN
from .graph_edit import _Graph, _attr, _is, _is_dq, _is_q, _scalar

__all__ = ["integer_islands", "dequantize_like_onnxruntime"]

_8BIT = {T.UINT8: np.dtype(np.uint8), T.INT8: np.dtype(np.int8)}
#: a DequantizeLinear scale below this keeps |(v - z) * s| <= 255 * s and a sum of two far
#: from float32's overflow (3.4e38)
_MAX_DQ_SCALE = float(2.0 ** 100)


def dequantize_like_onnxruntime(v: np.ndarray, scale: np.float32, zero_point: int) -> np.ndarray:
    """onnxruntime's DequantizeLinear on 8-bit codes: f(float(v - z) * s); the difference is
    an exact small integer."""
    return (v.astype(np.int32) - int(zero_point)).astype(np.float32) * np.float32(scale)


def _params(g: _Graph, node: onnx.NodeProto, quantize: bool) -> Optional[tuple[np.float32, int, np.dtype]]:
    """(scale, zero point, 8-bit dtype) of a DequantizeLinear / QuantizeLinear with constant
    scalar parameters the island kernels take, else None."""
    if len(node.input) < 2 or _attr(node, "block_size", 0):
        return None
    s = g.const(node.input[1])
    if not _scalar(s) or s.dtype != np.float32:
        return None
    sv = np.float32(s.reshape(()))
    limit = np.finfo(np.float32).max if quantize else _MAX_DQ_SCALE
    if not (np.isfinite(sv) and np.finfo(np.float32).tiny <= sv < limit):
        return None
    if len(node.input) > 2 and node.input[2]:
        z = g.const(node.input[2])
        if not _scalar(z) or z.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
            return None
        dt, zv = z.dtype, int(z.reshape(()))
    else:
        dt, zv = np.dtype(np.uint8), 0
    if quantize:
        odt = _attr(node, "output_dtype", 0)
        if odt and _8BIT.get(odt) != dt:
            return None
    else:
        if _attr(node, "output_dtype", 0) not in (0, T.FLOAT) or g.elem_type(node.input[0]) not in _8BIT \
                or _8BIT[g.elem_type(node.input[0])] != dt:
            return None
    return sv, zv, dt


def _reader(g: _Graph, node: onnx.NodeProto) -> Optional[onnx.NodeProto]:
    """The one reader of a one-output node whose output is not a graph output, else None."""
    if len(node.output) != 1:
        return None
    return g.single_consumer(node)


# --------------------------------------------------------------------------- table islands


#: The first version of each operator with today's semantics: Add, Sub, Mul 7 (multidirectional
#: broadcasting; before, a broadcast attribute), Sum 6, BatchNormalization 7 (no is_test /
#: consumed_inputs), Relu 6 (no consumed_inputs)
_MIN_VERSION = {"Add": 7, "Sub": 7, "Mul": 7, "Sum": 6, "BatchNormalization": 7, "Relu": 6}


def _versions_ok(g: _Graph, node: onnx.NodeProto) -> bool:
    v = g.version(node)
    return v is not None and v >= _MIN_VERSION.get(node.op_type, 1)


def _bn_fold(g: _Graph, bn: onnx.NodeProto) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """onnxruntime's inference BatchNormalization as y = f(f(x * s') + b') per channel:
    s' = f(scale * f(1 / f(sqrt(f(var + eps))))), b' = f(B - f(mean * s'))."""
    if len(bn.input) != 5 or len(bn.output) != 1 or _attr(bn, "training_mode", 0) or not _attr(bn, "spatial", 1) \
            or not _versions_ok(g, bn):
        return None
    vals = [g.const(n) for n in bn.input[1:]]
    if any(v is None or v.dtype != np.float32 or v.ndim != 1 for v in vals) or len({v.size for v in vals}) != 1:
        return None
    scale, b, mean, var = vals
    eps = np.float32(_attr(bn, "epsilon", 1e-5))
    with np.errstate(all="ignore"):
        inv = np.float32(1) / np.sqrt(var + eps)
        s = scale * inv
        return s, b - mean * s


def _unary_step(g: _Graph, node: onnx.NodeProto):
    """f(values (C or 1, 256) float32) -> float32 for a node a table island takes, the
    channel count it needs (None: any), or None."""
    if len(node.input) < 1 or len(node.output) != 1:
        return None
    if _is(node, "Relu") and len(node.input) == 1 and _versions_ok(g, node):
        return (lambda v: np.where(v < 0, np.float32(0), v)), None  # onnxruntime's: -0, NaN kept
    if _is(node, "LeakyRelu") and len(node.input) == 1:
        alpha = np.float32(_attr(node, "alpha", 0.01))
        return (lambda v: np.where(v >= 0, v, v * alpha)), None
    if _is(node, "Clip"):
        if g.version(node) is None or g.version(node) < 11:
            lo, hi = _attr(node, "min", None), _attr(node, "max", None)
            lo = None if lo is None else np.float32(lo)
            hi = None if hi is None else np.float32(hi)
        else:
            bounds = []
            for k in (1, 2):
                if len(node.input) > k and node.input[k]:
                    c = g.const(node.input[k])
                    if not _scalar(c) or c.dtype != np.float32:
                        return None
                    bounds.append(np.float32(c.reshape(())))
                else:
                    bounds.append(None)
            lo, hi = bounds
        # onnxruntime's Clip: min(max(x, lo), hi) (NaN stays NaN; the quantization maps it low)

        def clip(v, lo=lo, hi=hi):
            if lo is not None:
                v = np.where(v < lo, lo, v)
            if hi is not None:
                v = np.where(v > hi, hi, v)
            return v.astype(np.float32)
        return clip, None
    if _is(node, "BatchNormalization"):
        folded = _bn_fold(g, node)
        if folded is None:
            return None
        s, b = folded

        def bn(v, s=s, b=b):
            with np.errstate(all="ignore"):
                return v * s[:, None] + b[:, None]
        return bn, s.size
    return None


#: Data movement a table island takes between its nodes (an element-wise table commutes with
#: it): its other inputs, if any, must be constants
_MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _move(g: _Graph, node: onnx.NodeProto, first: bool) -> bool:
    """Whether ``node`` moves the codes in a table island: data movement, or a MaxPool right
    after the DequantizeLinear (``first``: no element-wise step yet). A max of dequantized
    codes is the dequantized max code: f((x - z) * s) with s > 0 never decreases as x grows,
    and a window always holds one real element, so MaxPool(DQ(x)) == DQ(MaxPool(x))."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return False
    if node.op_type == "MaxPool":
        return first and len(node.input) == 1
    return node.op_type in _MOVES and all(g.const(n) is not None for n in node.input[1:] if n)


def _conv_rank(g: _Graph, name: str) -> Optional[int]:
    """The rank of ``name`` when a QLinearConv (NCHW) with constant weights produces it."""
    p = g.producer.get(name)
    if p is None or p.op_type != "QLinearConv" or len(p.input) < 4 or _attr(p, "channels_last", 0):
        return None
    w = g.const(p.input[3])
    return None if w is None else w.ndim


def _float_const(g: _Graph, name: str) -> tuple[Optional[np.ndarray], list]:
    """A float32 constant operand (an initializer, or a DequantizeLinear of one with scalar
    parameters, dequantized as onnxruntime and qlinear compute it) and that DequantizeLinear."""
    v = g.const(name)
    if v is not None:
        return (v if v.dtype == np.float32 else None), []
    p = g.producer.get(name)
    if p is None or not _is_dq(p) or _attr(p, "block_size", 0):
        return None, []
    codes, params = g.const(p.input[0]), _params(g, p, False)
    if codes is None or params is None or codes.dtype != params[2]:
        return None, []
    return dequantize_like_onnxruntime(codes, params[0], params[1]), [p]


def _binary_step(g: _Graph, node: onnx.NodeProto, prev: str, rank: Optional[int]):
    """An Add / Sub / Mul of the island's tensor ``prev`` and a float32 constant that is one
    value, or one value per channel (axis 1 of a tensor of rank ``rank``): (f, channels or None,
    nodes absorbed) as ``_unary_step``, else None. f is the node's one float32 operation, in
    its operand order."""
    if node.op_type not in ("Add", "Sub", "Mul") or node.domain not in ("", "ai.onnx") \
            or len(node.input) != 2 or not _versions_ok(g, node) or list(node.input).count(prev) != 1:
        return None
    j = 1 - list(node.input).index(prev)
    c, absorbed = _float_const(g, node.input[j])
    if c is None:
        return None
    absorbed = [p for p in absorbed if _reader(g, p) is node]
    if c.size == 1 and (c.ndim == 0 or (rank is not None and c.ndim <= rank)):
        # (a one-element constant of more axes than the tensor would add axes to the result)
        col, channels = np.float32(c.reshape(())), None
    else:
        if rank is None or c.ndim > rank or rank < 2:
            return None
        shape = (1,) * (rank - c.ndim) + c.shape
        if shape[1] != c.size:
            return None
        col, channels = c.reshape(-1, 1), c.size
    op = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[node.op_type]
    fn = (lambda v: op(v, col)) if j == 1 else (lambda v: op(col, v))
    return fn, channels, absorbed


def _table_island(g: _Graph, dq: onnx.NodeProto):
    """(nodes to remove, q, tables (C, 256), data movement nodes kept) for DequantizeLinear ->
    steps -> QuantizeLinear (no step: a requantization), else None. The data movement nodes
    (``_MOVES``) among the steps move the 8-bit codes instead, before the table (one table
    for the tensor only: a movement may move the channel axis)."""
    pin = _params(g, dq, False)
    if pin is None:
        return None
    steps, chain, channels, moves, absorbed = [], [dq], None, [], []
    rank = _conv_rank(g, dq.input[0])
    node = _reader(g, dq)
    while node is not None and not _is_q(node):
        if node.input and _move(g, node, not steps) and node.input[0] == chain[-1].output[0]:
            moves.append(node)
            chain.append(node)
            node = _reader(g, node)
            continue
        step = _unary_step(g, node)
        if step is not None and node.input[0] != chain[-1].output[0]:
            return None
        if step is None:
            if any(m.op_type != "MaxPool" for m in moves):
                return None  # (rank and channel axis known only as the convolution gives them)
            found = _binary_step(g, node, chain[-1].output[0], rank)
            if found is None:
                return None
            step, absorbed = found[:2], absorbed + found[2]
        fn, c = step
        if c is not None:
            if channels is not None and channels != c:
                return None
            channels = c
        steps.append(fn)
        chain.append(node)
        node = _reader(g, node)
    if node is None or (channels is not None and any(m.op_type != "MaxPool" for m in moves)):
        return None  # a movement may move the channel axis (MaxPool keeps it)
    pout = _params(g, node, True)
    if pout is None:
        return None
    s, z, dt = pin
    codes = np.arange(256, dtype=np.uint8).view(dt)
    v = np.broadcast_to(dequantize_like_onnxruntime(codes, s, z), (channels or 1, 256)).copy()
    with np.errstate(all="ignore"):
        for fn in steps:
            v = np.asarray(fn(v), np.float32)
    tables = mlas_quantize(v, pout[0], pout[1], pout[2])  # onnxruntime's QuantizeLinear
    # index by the byte: entry i is the code whose byte is i
    return chain + absorbed, node, np.ascontiguousarray(tables.reshape(channels or 1, 256)), moves


# --------------------------------------------------------------------------- element-wise islands


def _operand(g: _Graph, name: str, reader: onnx.NodeProto):
    """How the island reads input ``name`` of ``reader``: (nodes absorbed, tensor, params or
    None (float32), BatchNormalization's (mul, add) or None). A DequantizeLinear or a
    BatchNormalization producing it is absorbed when ``reader`` is its only reader."""
    absorbed, affine = [], None
    p = g.producer.get(name)
    if p is not None and _is(p, "BatchNormalization") and _reader(g, p) is reader:
        folded = _bn_fold(g, p)
        if folded is not None:
            absorbed.append(p)
            affine = folded
            reader, name = p, p.input[0]
            p = g.producer.get(name)
    if p is not None and _is_dq(p) and _reader(g, p) is reader:
        params = _params(g, p, False)
        if params is not None:
            return [p, *absorbed], p.input[0], params, affine
    return absorbed, name, None, affine


def _elementwise_island(g: _Graph, root: onnx.NodeProto):
    """(nodes to remove, the new node's inputs, outputs, attributes) for an island rooted at
    an Add / Sum of two inputs or a BatchNormalization (module docstring), else None."""
    if not _versions_ok(g, root):
        return None
    if (_is(root, "Add") or _is(root, "Sum")) and len(root.input) == 2 and len(root.output) == 1:
        ops = [_operand(g, n, root) for n in root.input]
    elif _is(root, "BatchNormalization") and len(root.output) == 1 and _bn_fold(g, root) is not None:
        nxt = _reader(g, root)
        if nxt is not None and (_is(nxt, "Add") or _is(nxt, "Sum")):
            return None  # that Add's island absorbs it
        absorbed, name, params, _ = _operand(g, root.input[0], root)
        ops = [([*absorbed, root], name, params, _bn_fold(g, root))]
    else:
        return None
    if any(g.const(o[1]) is not None for o in ops):
        return None  # a constant operand is a broadcast bias as a rule: the island's NumPy form
        # would run, no faster than the float nodes
    chain = [n for o in ops for n in o[0]] + ([root] if not _is(root, "BatchNormalization") else [])
    relu, tail = 0, root
    nxt = _reader(g, root)
    if nxt is not None and _is(nxt, "Relu") and len(nxt.input) == 1 and _versions_ok(g, nxt):
        chain.append(nxt)
        relu, tail = 1, nxt
    t = tail.output[0]
    qs = [c for c in g.consumer_nodes(t) if _is_q(c) and c.input[0] == t and _params(g, c, True) is not None]
    q = qs[0] if qs else None
    if not any(o[2] is not None for o in ops) and q is None and not any(o[3] is not None for o in ops):
        return None  # float operands only (of a type the kernel may not take): left as written
    need_f = g.produces_graph_output(tail) or any(c is not q for c in g.consumer_nodes(t))
    attrs = dict(relu=relu, signed=int(q is not None and _params(g, q, True)[2] == np.dtype(np.int8)))
    inputs = []
    for k, (_, name, params, affine) in zip("ab", ops):
        mul = add = ""
        if affine is not None:
            mul = g.add_const((root.name or root.output[0]) + f"_{k}_mul", np.ascontiguousarray(affine[0], np.float32))
            add = g.add_const((root.name or root.output[0]) + f"_{k}_add", np.ascontiguousarray(affine[1], np.float32))
        inputs += [name, mul, add]
        # 1 uint8 codes, 3 int8 codes (each operand its own type), 2 float32
        attrs[f"{k}_kind"] = 2 if params is None else (3 if params[2] == np.dtype(np.int8) else 1)
        if params is not None:
            attrs[f"{k}_scale"], attrs[f"{k}_zero_point"] = float(params[0]), params[1]
    if q is not None:
        pq = _params(g, q, True)
        attrs["y_scale"], attrs["y_zero_point"] = float(pq[0]), pq[1]
        chain.append(q)
    outputs = [t if need_f else "", q.output[0] if q is not None else ""]
    return chain, inputs, outputs, attrs


# --------------------------------------------------------------------------- the pass


def g_dtype(g: _Graph, dq: onnx.NodeProto) -> Optional[np.dtype]:
    """The 8-bit dtype of a DequantizeLinear's input (its parameters' type)."""
    params = _params(g, dq, False)
    return None if params is None else params[2]


def integer_islands(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its table islands and element-wise islands (module docstring) each one
    qlinear.internal node; every tensor that remains has the bytes it had."""
    g = _Graph(model)
    changed = False
    for node in list(g.nodes):
        if not g.has(node):
            continue
        if _is_dq(node):
            found = _table_island(g, node)
            if found is None:
                continue
            chain, q, tables, moves = found
            codes = node.input[0]
            for m in moves:  # each moves the codes now, in its order
                g.set_input(m, 0, codes)
                codes = g.fresh(m.output[0] + "_codes")
                g.set_output(m, 0, codes)
                g.types[codes] = g.elem_type(node.input[0])
            chain = [n for n in chain if all(n is not m for m in moves)]
            if moves and tables.shape[0] == 1 and tables.dtype == g_dtype(g, node) \
                    and np.array_equal(tables.view(np.uint8)[0], np.arange(256, dtype=np.uint8)):
                # the identity (DequantizeLinear and QuantizeLinear of the same parameters,
                # movement between): the last movement gives the output
                g.remove(*chain, q)
                g.set_output(moves[-1], 0, q.output[0])
                changed = True
                continue
            tname = g.add_const((q.name or q.output[0]) + "_tables", tables)
            new = helper.make_node("QDQTableIsland", [codes, tname], [q.output[0]],
                                   domain=INTERNAL_DOMAIN, name=(q.name or q.output[0]) + "_island")
            last = q
        else:
            found = _elementwise_island(g, node)
            if found is None:
                continue
            chain, inputs, outputs, attrs = found
            new = helper.make_node("QDQIsland", inputs, outputs, domain=INTERNAL_DOMAIN,
                                   name=(node.name or node.output[0]) + "_island", **attrs)
            last = chain[-1]
        # the new node takes the place of the chain's last node (after every input's producer)
        g.remove(*[n for n in chain if n is not last])
        g.replace_node(last, new)
        changed = True
    if not changed:
        return model
    out = g.to_model()
    if not any(d.domain == INTERNAL_DOMAIN for d in out.opset_import):
        out.opset_import.append(helper.make_opsetid(INTERNAL_DOMAIN, 1))
    return out
