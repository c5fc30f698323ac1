"""qlinear's own fusion: float Convs of a QDQ model whose float32 result is exact on integers,
rewritten to ConvInteger and a float tail that gives the same bytes."""

from __future__ import annotations

from typing import Optional

import numpy as np

import onnx
from onnx import helper


from .. import dtypes
from ..graph.proto import T
from .graph_edit import _Graph, _attr, _copy, _is, _is_dq, _is_q, _q_output_type, _scalar


# --------------------------------------------------------------------------- exact float Convs

#: ``|sum|`` bound (in units of the terms' common power of two) under which every partial sum
#: of a float32 dot product of such terms is exactly representable: 2^24 (float32's 24-bit
#: significand holds every integer up to 2^24).
_F32_EXACT = 1 << 24


def _power_of_two_exponents(v: np.ndarray) -> Optional[np.ndarray]:
    """The exponents e with v == 2^e for every element of a float32 array (positive normal
    powers of two, 2^-100 .. 2^60 so that no product or sum below under- or overflows), or None."""
    v = np.asarray(v)
    if v.dtype != np.float32 or v.size == 0 or not np.all(np.isfinite(v)) or not np.all(v > 0):
        return None
    m, e = np.frexp(v.astype(np.float64))
    if not np.all(m == 0.5):
        return None
    e = e.astype(np.int64) - 1
    if e.min() < -100 or e.max() > 60:
        return None
    return e


def _dq_plain(g: _Graph, dq: Optional[onnx.NodeProto]) -> bool:
    """A DequantizeLinear of the default domain without block_size and with float32 output,
    whose scale (and zero point, when given) are model constants."""
    if dq is None or not _is_dq(dq) or len(dq.input) < 2 or g.const(dq.input[1]) is None:
        return False
    if _attr(dq, "block_size", 0) or _attr(dq, "output_dtype", 0) not in (0, T.FLOAT):
        return False
    return len(dq.input) < 3 or not dq.input[2] or g.const(dq.input[2]) is not None


def _exact_conv_plan(g: _Graph, conv: onnx.NodeProto):
    """For DequantizeLinear(x) -> Conv(DequantizeLinear(w), DequantizeLinear(b)) whose float32
    result is exact, the integer form: (x_q, x_zp, w_q, w_zp, multiplier, bias) with the
    per-output-channel multiplier (x_scale * w_scale, a power of two) and bias (float32, exact),
    else None.

    Exact means: every scale is a power of two, so each dequantized value and each product of
    two is an integer times a power of two, exactly representable; and for each output channel
    the sum of the magnitudes of all its terms (bias included), counted in units of the smallest
    such power of two, is below 2^24. Then every partial sum, in any order and whatever the
    padding (a padded tap adds 0), is an integer multiple of that unit below 2^24 units, hence
    exact in float32: the float Conv's result is the exact value ``acc * multiplier + bias``
    with ``acc`` the integer convolution of (x_q - x_zp) and (w_q - w_zp), which ConvInteger
    computes exactly, float32(acc) is exact (|acc| < 2^24), and so are the product and the sum
    below. Only Convs with a bias qualify: without one, the float Conv may return -0.0 where
    the integer form gives +0.0 (a sum of -0.0 products); with one, both give +0.0.
    """
    if not _is(conv, "Conv") or len(conv.input) != 3 or not conv.input[2]:
        return None
    if g.opsets.get("", 0) < 10:  # ConvInteger exists from opset 10
        return None
    dqx, dqw, dqb = (g.producer.get(n) for n in conv.input)
    if not all(_dq_plain(g, d) for d in (dqx, dqw, dqb)):
        return None
    for d in (dqx, dqw, dqb):  # each DQ feeds this Conv only (its float output goes away)
        if g.produces_graph_output(d) or len(g.consumer_nodes(d.output[0])) != 1:
            return None
    xs, ws, bs = (g.const(d.input[1]) for d in (dqx, dqw, dqb))
    w = g.const(dqw.input[0])
    b = g.const(dqb.input[0])
    if w is None or b is None or w.dtype not in (np.int8, np.uint8) \
            or b.dtype not in (np.int8, np.uint8, np.int32):
        return None
    if w.ndim < 3 or b.ndim != 1 or b.shape[0] != w.shape[0]:
        return None
    m = w.shape[0]
    tx = g.elem_type(dqx.input[0])
    if tx not in dtypes.EIGHT_BIT_ONNX:
        return None
    x_dt = np.uint8 if tx == T.UINT8 else np.int8

    def zp(d, dt):
        v = g.const(d.input[2]) if len(d.input) > 2 and d.input[2] else np.zeros((), dt)
        return v if v.dtype == dt else None

    zx, zw, zb = zp(dqx, x_dt), zp(dqw, w.dtype), zp(dqb, b.dtype)
    if zx is None or zw is None or zb is None or zx.size != 1:
        return None
    ex, ew, eb = (_power_of_two_exponents(s) for s in (xs, ws, bs))
    if ex is None or ew is None or eb is None or ex.size != 1:
        return None

    def per_channel(v, d, rank):
        """v broadcast to one value per output channel (axis 0 of w / b), or None."""
        v = np.asarray(v).reshape(-1) if np.asarray(v).ndim <= 1 else None
        if v is None:
            return None
        if v.size == 1:
            return np.repeat(v, m)
        axis = _attr(d, "axis", 1)
        axis = axis + rank if axis < 0 else axis
        return v if v.size == m and axis == 0 else None

    ew, zw_c = per_channel(ew, dqw, w.ndim), per_channel(zw, dqw, w.ndim)
    eb, zb_c = per_channel(eb, dqb, 1), per_channel(zb, dqb, 1)
    if ew is None or zw_c is None or eb is None or zb_c is None:
        return None
    db = b.astype(np.int64) - zb_c.astype(np.int64)  # the bias as DequantizeLinear reads it
    if zw.size != 1 and zw.ndim != 1:
        return None
    qmin, qmax = dtypes.INT_RANGE[np.dtype(x_dt)]
    mx = max(int(zx.reshape(-1)[0]) - qmin, qmax - int(zx.reshape(-1)[0]))
    dw = np.abs(w.reshape(m, -1).astype(np.int64) - zw_c.astype(np.int64)[:, None]).sum(axis=1)
    e_prod = int(ex.reshape(-1)[0]) + ew  # exponent of x_scale * w_scale per channel
    unit = np.minimum(e_prod, eb)
    # sum of |terms| in units of 2^unit, as Python integers (no overflow)
    for c in range(m):
        total = mx * int(dw[c]) * (1 << int(e_prod[c] - unit[c])) \
            + abs(int(db[c])) * (1 << int(eb[c] - unit[c]))
        # |result| < 2^(24 + e_prod): far from float32's overflow for e_prod <= 60 (the float
        # Conv of larger scales may reach inf, and inf - inf is NaN, which acc cannot give);
        # products and sums stay on the 2^-100 grid, exactly representable, for e_prod >= -100
        if total >= _F32_EXACT or not -100 <= e_prod[c] <= 60:
            return None
    mult = np.ldexp(np.float32(1), e_prod.astype(np.int32)).astype(np.float32)
    bias = (db.astype(np.float64) * np.ldexp(1.0, eb.astype(np.int32))).astype(np.float32)
    zw_out = zw if zw.size == 1 else zw.reshape(m)
    return dqx, dqw, dqb, w, zx.reshape(()), zw_out, mult, bias


def exact_integer_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float Conv whose float32 result is provably exact
    (:func:`_exact_conv_plan`: power-of-two scales, each output channel's terms below 2^24
    units) computed on integers: DequantizeLinear(x) -> Conv(DequantizeLinear(w),
    DequantizeLinear(b)) becomes ConvInteger(x_q, w_q) and then

    - with a QuantizeLinear after it (directly, or after a Relu or a LeakyRelu with
      0 <= alpha <= 1): qlinear.internal QDQConvTail, the float tail (scale, bias, activation,
      quantization) in one pass, to the QuantizeLinear's output;
    - with such branches feeding a Concat whose only consumer is a QuantizeLinear: each
      branch's QDQConvTail with that QuantizeLinear's parameters, and the Concat on the 8-bit
      results (QuantizeLinear is element-wise with one scale, so it commutes with Concat);
    - otherwise Cast(float) -> Mul(x_scale * w_scale) -> Add(bias), under the Conv's name.

    Every tensor that remains has the same bytes as in the float graph (+0.0 included, as the
    plan's docstring says): this is not one of onnxruntime's rewrites, but since both runtimes
    compute such a Conv in float32 (onnxruntime as FusedConv) and the float result is exact,
    the integer form gives the same bits. Vitis AI's power-of-two QDQ models (retinaface) are
    made of such Convs.
    """
    g = _Graph(model)
    plans = {}
    for conv in g.nodes:
        plan = _exact_conv_plan(g, conv)
        if plan is not None:
            plans[id(conv)] = plan
    if not plans:
        return model
    # branches of a Concat -> QuantizeLinear: conv id -> (activation, act, alpha, q, concat, slot)
    via_concat: dict[int, tuple] = {}
    for cat in g.nodes:
        if not _is(cat, "Concat") or not cat.input:
            continue
        q = g.single_consumer(cat)
        if q is None or not _q_ok(g, q):
            continue
        heads = [_branch(g, name, plans) for name in cat.input]
        if all(h is not None for h in heads) and len(set(id(h[0]) for h in heads)) == len(heads):
            for slot, (conv, act_node, act, alpha) in enumerate(heads):
                via_concat[id(conv)] = (act_node, act, alpha, q, cat, slot)
    done_concats: dict[int, tuple] = {}
    for conv in list(g.nodes):
        plan = plans.get(id(conv))
        if plan is None or not g.has(conv):
            continue
        dqx, dqw, dqb, w, zx, zw, mult, bias = plan
        m = w.shape[0]
        shape = (1, m) + (1,) * (w.ndim - 2)
        base = conv.name or conv.output[0]
        acc = g.fresh(base + "_acc")
        zx_name = g.add_const(base + "_x_zero_point", zx)
        zw_name = g.add_const(base + "_w_zero_point", np.asarray(zw))
        ci = helper.make_node("ConvInteger", [dqx.input[0], dqw.input[0], zx_name, zw_name], [acc],
                              name=(conv.name + "_integer") if conv.name else None)
        ci.attribute.extend(_copy(conv).attribute)
        drop = [dqx, dqw, dqb]
        tail = via_concat.get(id(conv))
        if tail is None:
            t = _quantized_tail(g, conv)
            if t is not None:
                act_node, q, act, alpha = t
                tail = (act_node, act, alpha, q, None, None)
        if tail is not None:
            # one pass from the accumulators to the 8-bit output, the float graph's operations
            # on the same (exact) values
            act_node, act, alpha, q, cat, slot = tail
            out = q.output[0] if cat is None else g.fresh(base + "_quantized")
            rest = [helper.make_node(
                "QDQConvTail", [acc, g.add_const(base + "_multiplier", mult),
                                g.add_const(base + "_bias", bias), q.input[1], _q_zero_point(g, q)],
                [out], domain=INTERNAL_DOMAIN, act=act, alpha=alpha,
                name=(q.name or q.output[0]) + "_qdqconv" + ("" if cat is None else str(slot)))]
            drop += [act_node] if act_node is not None else []
            if cat is None:
                drop.append(q)
            else:
                g.types[out] = _q_output_type(g, q)
                done_concats[id(cat)] = (cat, q)
        else:
            accf, scaled = g.fresh(base + "_accf"), g.fresh(base + "_scaled")
            mult_name = g.add_const(base + "_multiplier", mult.reshape(shape))
            bias_name = g.add_const(base + "_bias", bias.reshape(shape))
            rest = [helper.make_node("Cast", [acc], [accf], to=T.FLOAT),
                    helper.make_node("Mul", [accf, mult_name], [scaled]),
                    helper.make_node("Add", [scaled, bias_name], [conv.output[0]])]
            g.types[accf] = g.types[scaled] = T.FLOAT
        g.types[acc] = T.INT32
        g.remove(*drop)
        g.replace_node(conv, ci)
        i = g.pos(ci)
        g.nodes[i + 1:i + 1] = rest
        for n in rest:
            g._add_to_index(n)
        if tail is not None and tail[4] is not None:
            g.set_input(tail[4], tail[5], out)
    for cat, q in done_concats.values():
        g.remove(q)
        g.set_output(cat, 0, q.output[0])
    out_model = g.to_model()
    if any(n.domain == INTERNAL_DOMAIN for n in out_model.graph.node):
        out_model.opset_import.append(helper.make_opsetid(INTERNAL_DOMAIN, 1))
    return out_model


def _activation(g: _Graph, node: Optional[onnx.NodeProto]) -> Optional[tuple[int, float]]:
    """(1, 0.0) for a Relu, (2, alpha) for a LeakyRelu with 0 <= alpha <= 1, else None."""
    if node is None or len(node.input) != 1:
        return None
    if _is(node, "Relu"):
        return 1, 0.0
    if _is(node, "LeakyRelu"):
        alpha = float(np.float32(_attr(node, "alpha", 0.01)))
        return (2, alpha) if 0.0 <= alpha <= 1.0 else None
    return None


def _branch(g: _Graph, name: str, plans: dict):
    """(conv, activation node or None, act, alpha) when ``name`` is an exact Conv's output, or
    a Relu / LeakyRelu's of one, each intermediate read only there; else None."""
    p = g.producer.get(name)
    if p is None or g.single_consumer(p) is None:
        return None
    if id(p) in plans:
        return p, None, 0, 0.0
    a = _activation(g, p)
    conv = g.producer.get(p.input[0]) if a is not None else None
    if conv is None or id(conv) not in plans or g.single_consumer(conv) is not p:
        return None
    return conv, p, a[0], a[1]


#: The domain of qlinear's own internal operators (QDQConvTail), which only
#: :func:`exact_integer_convs` emits and only qlinear's backend runs.
INTERNAL_DOMAIN = "qlinear.internal"


def _q_zero_point(g: _Graph, q: onnx.NodeProto) -> str:
    if len(q.input) > 2 and q.input[2]:
        return q.input[2]
    return g.add_const("optional_zero_point", np.zeros((), np.uint8))


def _q_ok(g: _Graph, q: onnx.NodeProto) -> bool:
    """A QuantizeLinear QDQConvTail can compute: a constant per-tensor float32 scale (positive,
    finite), a constant 8-bit zero point (or none: uint8 0), no block_size."""
    if not _is_q(q) or len(q.input) < 2:
        return False
    if _attr(q, "block_size", 0) or _attr(q, "output_dtype", 0) not in (0, *dtypes.EIGHT_BIT_ONNX):
        return False
    s = g.const(q.input[1])
    if not _scalar(s) or s.dtype != np.float32 or not (np.isfinite(s).all() and (s > 0).all()):
        return False
    if len(q.input) > 2 and q.input[2]:
        z = g.const(q.input[2])
        if not _scalar(z) or z.dtype not in dtypes.EIGHT_BIT:
            return False
        odt = _attr(q, "output_dtype", 0)
        return not odt or odt == helper.np_dtype_to_tensor_dtype(z.dtype)
    return _attr(q, "output_dtype", 0) != T.INT8  # an int8 zero point would be needed (rare)


def _quantized_tail(g: _Graph, conv: onnx.NodeProto):
    """(activation node or None, QuantizeLinear, act code, alpha) when the Conv's only
    consumer is a QuantizeLinear :func:`_q_ok` accepts, or a Relu / LeakyRelu (0 <= alpha <= 1)
    whose only consumer is one, no intermediate tensor being a graph output; else None."""
    nxt = g.single_consumer(conv)
    act_node, act, alpha = None, 0, 0.0
    a = _activation(g, nxt)
    if a is not None:
        act, alpha = a
        act_node, nxt = nxt, g.single_consumer(nxt)
    if nxt is None or not _q_ok(g, nxt):
        return None
    return act_node, nxt, act, alpha
