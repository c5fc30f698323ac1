"""The passes over Q/DQ pairs, in onnxruntime's order: unique DequantizeLinear per consumer,
double QDQ pairs, QDQ propagation, bias quantization, Relu/Clip before a Q, int8 to uint8."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

import onnx
from onnx import helper


from .. import dtypes
from ..graph.proto import T
from .graph_edit import QDQRefusal, _Graph, _SUB_BYTE_MIN, _attr, _const_scalar_params, _copy, _is, _is_dq, _is_q, _qdq_pair_supported, _scalar


#: uint16, int16 (measured: onnxruntime 1.32's DoubleQDQPairsRemover and ClipQuantFusion take them)
_SIXTEEN_BIT = tuple(np.dtype(d) for d in (np.uint16, np.int16))

#: A Conv bias DQ scale b fuses when |b - x_scale * w_scale| <= ATOL + RTOL * |x_scale * w_scale|.
BIAS_SCALE_ATOL, BIAS_SCALE_RTOL = 1e-6, 1e-2
def ensure_unique_dq(g: _Graph) -> None:
    """Give each consumer of a DequantizeLinear its own copy (EnsureUniqueDQForNodeUnit).

    The original keeps its first consumer unless it also feeds a graph output or a subgraph;
    every other consumer input gets a new DQ with the same inputs."""
    for dq in list(g.nodes):
        if not _is_dq(dq):
            continue
        out = dq.output[0]
        edges = g.consumers.get(out, [])
        pinned = out in g.pinned
        if not edges or (len(edges) == 1 and not pinned):
            continue
        todo = edges if pinned else edges[1:]
        at = g.pos(dq)
        for k, (consumer, slot) in enumerate(todo):
            new = _copy(dq)
            new.name = g.fresh((dq.name or out) + "/duplicated")
            new.output[0] = g.fresh(out + "/duplicated")
            g.types[new.output[0]] = g.types.get(out, T.FLOAT)
            consumer.input[slot] = new.output[0]
            g.nodes.insert(at + 1 + k, new)
        g._index()


def remove_double_qdq(g: _Graph) -> None:
    """Q1 -> DQ1 -> Q2 -> DQ2 (one or more DQ2) becomes Q1' -> DQ2' (DoubleQDQPairsRemover).

    Conditions (onnxruntime 1.32): Q1 has one output edge, to DQ1; DQ1 has one input edge (from
    Q1) and one output edge (to Q2); none of Q1, DQ1, Q2 produces a graph output; every reader
    of Q2 is a DQ; Q1/DQ1 and Q2/each DQ2 satisfy IsQDQPairSupported; both Qs have one zero
    point type, uint8, int8, uint16 or int16 (measured: 16-bit pairs collapse, 4-bit and float8
    ones do not). When the two pairs' parameters differ, the outer pair gets the scale and zero
    point of the intersection of both real ranges: s = f((hi - lo) / (qmax - qmin)),
    zp = round_half_away(qmin - lo / s), with lo, hi computed in float32 as in onnxruntime.
    """
    changed = True
    while changed:
        changed = False
        for dq1 in list(g.nodes):
            if not _is_dq(dq1) or not dq1.input or g.produces_graph_output(dq1):
                continue
            q1 = g.producer.get(dq1.input[0])
            if q1 is None or not _is_q(q1):
                continue
            # DQ1's input edges: only its data input comes from a node (scale/zp constants).
            if sum(1 for x in dq1.input if x and x in g.producer) != 1:
                continue
            q2 = g.single_consumer(dq1)
            if q2 is None or not _is_q(q2) or g.produces_graph_output(q2):
                continue
            if g.single_consumer(q1) is not dq1:
                continue
            dq2s = [c for _, c, _ in g.edges_out(q2)]
            if not dq2s or not all(_is_dq(d) for d in dq2s):
                continue
            if not (_qdq_pair_supported(g, q1, dq1) and
                    all(_qdq_pair_supported(g, q2, d) for d in dq2s)):
                continue
            zt = g.const(dq1.input[2]).dtype
            if zt not in dtypes.EIGHT_BIT + _SIXTEEN_BIT or g.const(q2.input[2]).dtype != zt:
                continue
            new = _double_qdq_params(g, dq1, q2)
            if new is False:
                continue
            if new is not None:
                s, z = new
                sname = g.add_const("DoubleQDQRemoved_scale", s)
                zname = g.add_const("DoubleQDQRemoved_zp", z)
                for n in [q1] + dq2s:
                    g.set_input(n, 1, sname)
                    g.set_input(n, 2, zname)
            for dq2 in dq2s:
                g.set_input(dq2, 0, q1.output[0])
            g.remove(dq1, q2)
            changed = True
            break


def _double_qdq_params(g: _Graph, n1: onnx.NodeProto, n2: onnx.NodeProto):
    """New (scale, zero point) for the outer pair; None to keep them; False to refuse."""
    if n1.input[1] == n2.input[1] and n1.input[2] == n2.input[2]:
        return None
    s1, s2 = g.const(n1.input[1]), g.const(n2.input[1])
    z1, z2 = g.const(n1.input[2]), g.const(n2.input[2])
    if z1.dtype != z2.dtype or s1.dtype != np.float32 or s2.dtype != np.float32:
        return False
    zt = z1.dtype
    f = np.float32
    zp1, zp2 = int(z1.reshape(-1)[0]), int(z2.reshape(-1)[0])
    sc1, sc2 = f(s1.reshape(-1)[0]), f(s2.reshape(-1)[0])
    if zp1 == zp2 and abs(float(sc1) - float(sc2)) < 1e-20:
        return None
    qmin, qmax = dtypes.INT_RANGE[zt]
    lo = max(f(qmin - zp1) * sc1, f(qmin - zp2) * sc2)
    hi = min(f(qmax - zp1) * sc1, f(qmax - zp2) * sc2)
    s = f(f(hi - lo) / f(qmax - qmin))
    z_f = f(f(qmin) - f(lo / s))
    # std::round (half away from zero), then a narrowing cast to the zero point's type.
    z = int(np.floor(abs(float(z_f)) + 0.5)) * (1 if z_f >= 0 else -1)
    z = np.array(z).astype(np.int64).astype(zt)
    return np.array(s, np.float32).reshape(g.const(n1.input[1]).shape), \
        np.array(z, zt).reshape(g.const(n1.input[2]).shape)


#: Operators QDQPropagation moves Q/DQ across, with the operator versions it accepts.
_PROPAGATE: dict[str, tuple[int, ...]] = {
    "MaxPool": (12, 22),
    "Reshape": (5, 13, 14, 19, 21, 23, 24, 25),
    "Transpose": (1, 13, 21, 23, 24, 25),
    "Squeeze": (1, 11, 13, 21, 23, 24, 25),
    "Unsqueeze": (1, 11, 13, 21, 23, 24, 25),
    "Slice": (1, 10, 11, 13),
}


@dataclasses.dataclass
class _Edge:
    """A tensor flowing from ``src`` (None: graph input or initializer) to input ``slot`` of
    ``dst`` (None: the tensor is a graph output)."""
    name: str
    src: Optional[onnx.NodeProto]
    dst: Optional[onnx.NodeProto]
    slot: int = 0


def _can_propagate(g: _Graph, node: Optional[onnx.NodeProto]) -> bool:
    return node is not None and node.domain in ("", "ai.onnx") and \
        g.version(node) in _PROPAGATE.get(node.op_type, ())


def _next_edges(g: _Graph, node: onnx.NodeProto) -> list[_Edge]:
    """Edges leaving output 0: to each consumer, or to the graph output when it has none."""
    out = node.output[0]
    cons = g.consumers.get(out, [])
    if not cons:
        return [_Edge(out, node, None)] if out in g.outputs else []
    if out in g.pinned:
        return []
    return [_Edge(out, node, c, i) for c, i in cons]


def _previous_edge(g: _Graph, node: onnx.NodeProto) -> Optional[_Edge]:
    """The edge into input 0: from a graph input or initializer, or from a node output that has
    this one consumer and is not a graph output."""
    x = node.input[0] if node.input else ""
    if not x:
        return None
    src = g.producer.get(x)
    if src is None:
        return _Edge(x, None, node, 0)
    if x in g.pinned or len(g.consumers.get(x, [])) != 1:
        return None
    return _Edge(x, src, node, 0)


def _insert_qdq(g: _Graph, edges: list[_Edge], scale: str, zp: str) -> None:
    """src -> Q -> DQ_k -> dst_k on the given edges (all leaving one tensor)."""
    base = edges[0].name
    src = edges[0].src
    params = [scale] + ([zp] if zp else [])
    if src is not None:
        pre = g.fresh(base + "_pre_q")
        src.output[list(src.output).index(base)] = pre
        g.types[pre] = g.types.get(base, T.FLOAT)
        # consumers of the tensor that are not on the edges (Q nodes) read the same value
        for c, i in g.consumers.get(base, []):
            if not any(e.dst is c and e.slot == i for e in edges):
                c.input[i] = pre
    else:
        pre = base
    q_out = g.fresh(base + "_q_to_dq")
    q = helper.make_node("QuantizeLinear", [pre] + params, [q_out], name=g.fresh(base + "_q"))
    new = [q]
    for k, e in enumerate(edges):
        post = base if e.dst is None else g.fresh(base + "_post_dq")
        g.types[post] = T.FLOAT
        new.append(helper.make_node("DequantizeLinear", [q_out] + params, [post],
                                    name=g.fresh(base + "_dq")))
        if e.dst is not None:
            e.dst.input[e.slot] = post
    at = g.pos(src) + 1 if src is not None else 0
    g.nodes[at:at] = new
    g._index()


def propagate_qdq(g: _Graph) -> None:
    """QDQPropagationTransformer: copy a Q backwards and a DQ forwards across MaxPool-12,
    Reshape, Transpose, Squeeze, Unsqueeze and Slice, inserting Q -> DQ pairs (with the same
    constant scalar scale and zero point) so that the data-movement operator later runs on
    integers between them (the "drop" rule) and the neighbouring groups can fuse.

    Backwards, from each Q: through single-consumer edges, across propagating operators, until
    a DQ or a non-propagating producer. Forwards, from each DQ with one consumer: into a
    propagating operator, a pair on each of its output edges, and on through further
    propagating operators; nothing when one of those edges already ends in a Q (measured). A Q -> DQ pair round-trips 8-bit values
    exactly, so the inserted pairs change no value."""
    snapshot = list(g.nodes)
    for q in snapshot:
        if not g.has(q) or not _is_q(q) or not _const_scalar_params(g, q, False):
            continue
        zp = q.input[2] if len(q.input) > 2 else ""
        edge = _previous_edge(g, q)
        while edge is not None and edge.src is not None and _can_propagate(g, edge.src):
            curr = _previous_edge(g, edge.src)
            if curr is None or (curr.src is not None and _is_dq(curr.src)):
                break
            _insert_qdq(g, [curr], q.input[1], zp)
            edge = curr
    for dq in snapshot:
        if not g.has(dq) or not _is_dq(dq) or not _const_scalar_params(g, dq, False):
            continue
        consumer = g.single_consumer(dq)
        if consumer is None:
            continue
        zp = dq.input[2] if len(dq.input) > 2 else ""
        groups = []
        first = _next_propagation_edges(g, _Edge(dq.output[0], dq, consumer))
        if first:
            groups.append(first)
        while groups:
            edges = groups.pop()
            _insert_qdq(g, edges, dq.input[1], zp)
            for e in edges:
                nxt = _next_propagation_edges(g, e)
                if nxt:
                    groups.append(nxt)


def _next_propagation_edges(g: _Graph, edge: _Edge) -> list[_Edge]:
    if edge.dst is None or not _can_propagate(g, edge.dst):
        return []
    edges = _next_edges(g, edge.dst)
    # measured: onnxruntime 1.32 does not propagate at all when one of the operator's readers
    # is already a Q (the stored source only skipped that edge)
    if any(e.dst is not None and _is_q(e.dst) for e in edges):
        return []
    return edges


def _path_to_q(g: _Graph, node: onnx.NodeProto) -> bool:
    """The node's single output reaches a QuantizeLinear through single consumers, with only
    Relu/Clip on the way (IsNoBranchPathToQuantizeLinear)."""
    cur = node
    while True:
        if len(cur.output) != 1:
            return False
        cons = g.consumer_nodes(cur.output[0])
        if len(cons) != 1:
            return False
        if _is_q(cons[0]):
            return True
        if not (_is(cons[0], "Relu") or _is(cons[0], "Clip")):
            return False
        cur = cons[0]


def quantize_bias(g: _Graph) -> None:
    """A float bias of Conv, ConvTranspose or Gemm whose input and weight come from DQ nodes
    becomes int32 behind a DQ (WeightBiasQuantization), so that the group can fuse.

    Conditions: input 0 from a DQ with a scalar scale; the output path reaches a Q through
    single consumers (Relu/Clip allowed); the weight from a DQ; the bias a constant 1-D
    initializer; a per-channel weight scale has the bias's length and the output-channel axis
    (0 for Conv, 1 for Gemm without transB, 0 with it). The bias becomes
    int32(round_half_even(f(b / f(x_scale * w_scale)))) with scale f(x_scale * w_scale), as
    onnxruntime computes it with Mul, Div, Round and Cast nodes that it then folds.
    (onnxruntime also quantizes a float weight initializer here; qlinear does not, see
    docs/qdq.md.)"""
    for node in list(g.nodes):
        if node.domain not in ("", "ai.onnx") or \
                node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3 \
                or not node.input[2]:
            continue
        dq0, dq1 = g.producer.get(node.input[0]), g.producer.get(node.input[1])
        if dq0 is None or not _is_dq(dq0) or dq1 is None or not _is_dq(dq1):
            continue
        xs, ws, b = g.const(dq0.input[1]), g.const(dq1.input[1]), g.const(node.input[2])
        if not _scalar(xs) or ws is None or b is None or b.ndim != 1 or \
                b.dtype != np.float32 or not _path_to_q(g, node):
            continue
        per_channel = not _scalar(ws)
        if per_channel:
            if ws.ndim != 1 or ws.size != b.size or _attr(dq1, "block_size", 0):
                continue
            wshape = g.const(dq1.input[0])
            axis = _attr(dq1, "axis", 1)
            if axis < 0:
                if wshape is None:
                    continue
                axis += wshape.ndim
            expected = 0
            if node.op_type == "Gemm":
                expected = 1 if not _attr(node, "transB", 0) else 0
            if axis != expected:
                continue
        scale = (np.float32(xs.reshape(-1)[0]) * ws.astype(np.float32)).astype(np.float32)
        if not per_channel:
            scale = scale.reshape(ws.shape)
        with np.errstate(all="ignore"):
            q = np.rint((b / scale.reshape(-1) if per_channel else b / scale.reshape(()))
                        .astype(np.float32))
        q = q.astype(np.int32)
        sname = g.add_const((node.name or node.output[0]) + "_bias_scale", scale)
        qname = g.add_const((node.name or node.output[0]) + "_bias_int32", q)
        out = g.fresh((node.name or node.output[0]) + "_bias_dq")
        g.types[out] = T.FLOAT
        kw = {"axis": 0} if per_channel else {}
        dq = helper.make_node("DequantizeLinear", [qname, sname], [out], name=out, **kw)
        g.nodes.insert(g.pos(node), dq)
        g._add_to_index(dq)
        g.set_input(node, 2, out)


# --------------------------------------------------------------------------- level 2


def _q_range(g: _Graph, q: onnx.NodeProto) -> Optional[tuple[np.float32, np.float32]]:
    """The float range a QuantizeLinear can represent: scale * (qmin - zp), scale * (qmax - zp)
    in float32, for a constant rank-0 float scale and constant rank-0 8-bit zero point."""
    if len(q.input) != 3 or not q.input[2]:
        return None
    s, z = g.const(q.input[1]), g.const(q.input[2])
    if s is None or z is None or s.ndim != 0 or z.ndim != 0 or s.dtype != np.float32:
        return None
    if z.dtype not in dtypes.EIGHT_BIT + _SIXTEEN_BIT:
        return None  # (remove_relu_clip refuses the other types: onnxruntime fails on them)
    lo, hi = dtypes.INT_RANGE[z.dtype]
    zp = int(z)
    return np.float32(s * np.float32(lo - zp)), np.float32(s * np.float32(hi - zp))


def _clip_min_max(g: _Graph, clip: onnx.NodeProto) -> Optional[tuple[float, float]]:
    v = g.version(clip)
    if v is not None and v < 11:
        return (_attr(clip, "min", -3.4028234663852886e38), _attr(clip, "max", 3.4028234663852886e38))
    lo, hi = -np.inf, np.inf
    if len(clip.input) > 1 and clip.input[1]:
        c = g.const(clip.input[1])
        if c is None:
            return None
        lo = float(c.reshape(-1)[0])
    if len(clip.input) > 2 and clip.input[2]:
        c = g.const(clip.input[2])
        if c is None:
            return None
        hi = float(c.reshape(-1)[0])
    return lo, hi


def _clip_redundant(g: _Graph, act: onnx.NodeProto, q: onnx.NodeProto) -> bool:
    """Relu/Clip followed by this Q changes nothing the Q would not clamp anyway."""
    if _is(act, "Relu"):
        if len(q.input) != 3 or not q.input[2]:
            return False
        z = g.const(q.input[2])
        if z is None or z.size != 1:
            return False
        zt = helper.np_dtype_to_tensor_dtype(z.dtype)
        # an 8- or 16-bit output whose zero point is its type's minimum
        return (zt in dtypes.EIGHT_BIT_ONNX | dtypes.SIXTEEN_BIT_ONNX
                and int(z.reshape(-1)[0]) == dtypes.ONNX_INT_RANGE[zt][0])
    if _is(act, "Clip"):
        mm = _clip_min_max(g, act)
        rng = _q_range(g, q)
        if mm is None or rng is None:
            return False
        eps = np.float32(np.finfo(np.float32).eps)
        lower, upper = rng
        # onnxruntime: keep the Clip if eps < min - lower or eps < upper - max (float32).
        return not (eps < np.float32(mm[0]) - lower or eps < upper - np.float32(mm[1]))
    return False


def remove_relu_clip(g: _Graph) -> None:
    """Relu -> Q with Q's zero point at the type minimum, and Clip -> Q with the clip range
    covering Q's range (to float32 epsilon), lose the Relu/Clip (ReluQuantFusion,
    ClipQuantFusion). The activation must have exactly one output edge, to the Q.

    Measured (onnxruntime 1.32), for a Q to another type than an 8- or 16-bit integer: it
    removes the Relu whatever the zero point (a 4-bit zero point above the minimum, any float8
    zero point: negative inputs then come out negative), and a Clip with constant bounds makes
    its session fail to load ("Unexpected data type for QuantizeLinear input y_zero_point").
    qlinear removes the Relu where that changes nothing (a sub-byte zero point at the type's
    minimum) and refuses the other cases (:class:`QDQRefusal`)."""
    for act in list(g.nodes):
        if not (_is(act, "Relu") or _is(act, "Clip")):
            continue
        if not g.has(act):
            continue
        q = g.single_consumer(act)
        if q is None or not _is_q(q):
            continue
        if _is(act, "Clip") and g.version(act) not in (1, 6, 11, 12, 13):
            continue
        if _refuse_narrow_relu_clip(g, act, q):
            g.set_input(q, 0, act.input[0])
            g.remove(act)
            continue
        if not _clip_redundant(g, act, q):
            continue
        g.set_input(q, 0, act.input[0])
        g.remove(act)


def _type_name(elem: int) -> str:
    try:
        return dtypes.from_onnx(elem).name
    except (KeyError, ValueError):
        return helper.tensor_dtype_to_string(elem)


def _narrow_zero_point(g: _Graph, q: onnx.NodeProto) -> Optional[np.ndarray]:
    """The Q's constant zero point when it is of another type than an 8- or 16-bit integer
    (the case onnxruntime's ReluQuantFusion and ClipQuantFusion mishandle), else None."""
    if len(q.input) != 3 or not q.input[2]:
        return None
    z = g.const(q.input[2])
    if z is None or z.dtype in dtypes.EIGHT_BIT + _SIXTEEN_BIT:
        return None
    return z


def _refuse_narrow_relu_clip(g: _Graph, act: onnx.NodeProto, q: onnx.NodeProto) -> bool:
    """True when ``act`` (a Relu before ``q``) is removed as onnxruntime removes it and that
    changes nothing; QDQRefusal where onnxruntime's rewrite changes the results or fails."""
    z = _narrow_zero_point(g, q)
    if z is None:
        return False
    zt = helper.np_dtype_to_tensor_dtype(z.dtype)
    name = f"{act.op_type} {act.name or act.output[0]!r}"
    qname = f"QuantizeLinear {q.name or q.output[0]!r}"
    if _is(act, "Relu"):
        if z.size != 1:
            return False
        zv = z.reshape(-1)[0]
        if zt in _SUB_BYTE_MIN and int(zv) == _SUB_BYTE_MIN[zt]:
            return True  # the Q clamps there anyway: removing the Relu changes nothing
        raise QDQRefusal(
            f"{name} feeds {qname} to {_type_name(zt)} with zero point "
            f"{zv}: onnxruntime 1.32 removes such a Relu for every type but 8- and 16-bit "
            "integers whatever the zero point, so its negative inputs come out negative "
            "(measured), which is not the model's arithmetic and qlinear does not reproduce it: "
            "qdq='literal' (--qdq literal) runs the graph as written")
    mm = _clip_min_max(g, act)
    s = g.const(q.input[1])
    if mm is None or s is None or s.ndim != 0 or s.dtype != np.float32 or z.ndim != 0:
        return False  # onnxruntime stops before reading the zero point
    raise QDQRefusal(
        f"{name} feeds {qname} with a {_type_name(zt)} zero point: "
        "onnxruntime 1.32's ClipQuantFusion takes 8- and 16-bit integers only and its session "
        "fails to load ('Unexpected data type for QuantizeLinear input y_zero_point', measured): "
        "qdq='literal' (--qdq literal) runs the graph as written")


def remove_dq_q(g: _Graph) -> None:
    """DQ -> Q with equal parameters disappears: the Q's readers read the DQ's input
    (QDQFinalCleanupTransformer, the last level-2 pass; its DQ -> Q part is always on).

    Conditions: the DQ has one output edge, to the Q, and no graph output; IsQDQPairSupported
    (constant scalar scales and explicit zero points, equal, of one type: any type, measured
    with uint4 and float8 too); a Q that produces a graph output must have no readers. Exact:
    a DQ -> Q round trip with one scale and zero point gives back its input."""
    for dq in list(g.nodes):
        if not g.has(dq) or not _is_dq(dq):
            continue
        q = g.single_consumer(dq)
        if q is None or not _is_q(q) or not _qdq_pair_supported(g, q, dq):
            continue
        out = q.output[0]
        readers = g.consumers.get(out, [])
        if out in g.pinned:
            if readers:
                continue
            ident = helper.make_node("Identity", [dq.input[0]], [out], name=g.fresh("QDQFinalCleanup"))
            g.types[out] = g.elem_type(dq.input[0])
            g.replace_node(q, ident)
            g.remove(dq)
            continue
        for c, i in list(readers):
            g.set_input(c, i, dq.input[0])
        g.remove(dq, q)


def s8_to_u8(g: _Graph) -> None:
    """Q -> DQ pairs of int8 become uint8 (QDQS8ToU8Transformer).

    Conditions: the Q has exactly one output edge, to a DQ, and no graph output; Q and DQ both
    have three inputs with constant one-element int8 zero points of equal value. The pair then
    uses a uint8 zero point zp + 128 (the scale is unchanged), which represents the same real
    values, so the pair computes the same floats; the fused kernels see uint8."""
    for q in list(g.nodes):
        if not _is_q(q):
            continue
        dq = g.single_consumer(q)
        if dq is None or not _is_dq(dq):
            continue
        if len(q.input) != 3 or len(dq.input) != 3:
            continue
        qz, dz = g.const(q.input[2]), g.const(dq.input[2])
        if qz is None or dz is None or qz.size != 1 or dz.size != 1:
            continue
        if qz.dtype != np.int8 or dz.dtype != np.int8 or int(qz.reshape(-1)[0]) != int(dz.reshape(-1)[0]):
            continue
        u = np.array(int(qz.reshape(-1)[0]) + 128, np.uint8)
        zname = g.add_const("qdq_s8_to_u8_zp_conversion", u)
        out = g.fresh("qdq_s8_to_u8_quant")
        g.types[out] = T.UINT8
        g.set_output(q, 0, out)
        g.set_input(dq, 0, out)
        g.set_input(q, 2, zname)
        g.set_input(dq, 2, zname)
