"""onnxruntime's fusions for dynamically quantized products (what ``quantize_dynamic`` writes):

    DynamicQuantizeLinear(x) -> (xq, xs, xz)
    MatMulInteger(xq, W, xz, Wz) -> Cast(to=float) -> Mul(., Mul(xs, Ws))     -> y

becomes com.microsoft ``DynamicQuantizeMatMul(x, W, Ws, Wz)`` (onnxruntime's
MatMulIntegerToFloatFusion, then DynamicQuantizeMatMulFusion; a tiny GPT-2 from
quantize_dynamic: 108 nodes -> 42, checked with ``optimized_model_filepath``).

The arithmetic is the same: the written graph computes f(f(acc) · f(xs · Ws_j)) with the
exact integer accumulator acc, and onnxruntime's DynamicQuantizeMatMul kernel (and qlinear's,
qlinear.contrib.gemm) computes y = f(f(acc) · s_j), s_j = f(xs · Ws_j), after the same
DynamicQuantizeLinear (../shared/ORT-KERNELS.md: 0 mismatches); the fusion saves five node
calls and four intermediate tensors per product.

Matched (a subset of onnxruntime's conditions, all of which it checks too): W, Ws and the
optional Wz are constant initializers; the DynamicQuantizeLinear's xq and xz feed only this
MatMulInteger and its xs only the scale Mul, whose other input is Ws; the MatMulInteger, the
Cast (to float) and the scale Mul each have one consumer; none of the intermediates is a graph
output or read by a subgraph. A DynamicQuantizeLinear whose outputs feed other nodes (a
QAttention's) stays as written.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .graph_edit import _Graph, _attr

MS = "com.microsoft"


def _plain(node: onnx.NodeProto | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _only_consumer(g: _Graph, name: str, node: onnx.NodeProto) -> bool:
    """``name`` is read by ``node`` alone (once) and is no graph output nor subgraph read."""
    users = g.consumers.get(name, [])
    return len(users) == 1 and users[0][0] is node and name not in g.pinned


def fuse_dynamic_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul group fused
    into com.microsoft DynamicQuantizeMatMul (see the module docstring); the model itself when
    there is none."""
    if not any(n.op_type == "MatMulInteger" for n in model.graph.node):
        return model
    g = _Graph(model)
    fused = 0
    for mm in list(g.nodes):
        if not g.has(mm) or not _plain(mm, "MatMulInteger") or len(mm.input) < 3:
            continue
        group = _group(g, mm)
        if group is None:
            continue
        dql, cast, scale_mul, out_mul, w, ws, wz = group
        x = dql.input[0]
        node = helper.make_node("DynamicQuantizeMatMul", [x, w, ws] + ([wz] if wz else []),
                                [out_mul.output[0]], name=out_mul.name or mm.name, domain=MS)
        g.replace_node(out_mul, node)
        g.remove(dql, mm, cast, scale_mul)
        fused += 1
    return g.to_model() if fused else model


def _group(g: _Graph, mm: onnx.NodeProto):
    """(DynamicQuantizeLinear, Cast, scale Mul, output Mul, W, Ws, Wz or "") of the group
    around MatMulInteger ``mm``, or None where it does not match."""
    xq, w = mm.input[0], mm.input[1]
    xz = mm.input[2]
    wz = mm.input[3] if len(mm.input) > 3 else ""
    dql = g.producer.get(xq)
    if not _plain(dql, "DynamicQuantizeLinear") or len(dql.output) != 3:
        return None
    if dql.output[0] != xq or dql.output[2] != xz or not xz:
        return None
    if g.const(w) is None or (wz and g.const(wz) is None):
        return None
    cast = g.single_consumer(mm)
    if not _plain(cast, "Cast") or _attr(cast, "to") != onnx.TensorProto.FLOAT \
            or not _only_consumer(g, mm.output[0], cast):
        return None
    out_mul = g.single_consumer(cast)
    if not _plain(out_mul, "Mul") or len(out_mul.input) != 2 \
            or not _only_consumer(g, cast.output[0], out_mul):
        return None
    other = out_mul.input[1] if out_mul.input[0] == cast.output[0] else out_mul.input[0]
    scale_mul = g.producer.get(other)
    if not _plain(scale_mul, "Mul") or len(scale_mul.input) != 2 or g.single_consumer(scale_mul) is not out_mul \
            or not _only_consumer(g, other, out_mul):
        return None
    xs = dql.output[1]
    if xs not in scale_mul.input:
        return None
    ws = scale_mul.input[1] if scale_mul.input[0] == xs else scale_mul.input[0]
    if ws == xs or g.const(ws) is None:
        return None
    # DynamicQuantizeLinear's three outputs feed this group only
    if not (_only_consumer(g, xq, mm) and _only_consumer(g, xz, mm) and _only_consumer(g, xs, scale_mul)):
        return None
    if g.produces_graph_output(dql) or g.produces_graph_output(mm) or g.produces_graph_output(cast) \
            or g.produces_graph_output(scale_mul):
        return None
    return dql, cast, scale_mul, out_mul, w, ws, wz
