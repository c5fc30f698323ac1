"""Level-1 cleanups (onnxruntime's graph-wide, provider-independent optimizers): constant
folding, the Reshape fusions, dead nodes."""

from __future__ import annotations


import numpy as np

import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import qlinear
from qlinear import dtypes

from .graph_edit import _Graph, _attr, _is, _is_dq, _is_q


# --------------------------------------------------------------------------- level 1


_NOT_FOLDED = {"DequantizeLinear", "RandomNormal", "RandomUniform", "RandomNormalLike",
               "RandomUniformLike", "Multinomial", "Bernoulli", "Constant", "If", "Loop", "Scan"}


def fold_constants(g: _Graph) -> None:
    """Nodes whose inputs are all constants become constants (onnxruntime's ConstantFolding).

    onnxruntime folds every deterministic node whose inputs are constant initializers, and a
    Shape whose input shape is fully known, but never a DequantizeLinear (so that the QDQ rules
    still see it). QuantizeLinear is computed by qlinear's kernel (bit-identical to
    onnxruntime's); other operators by onnx.reference (they are shape arithmetic and data
    movement in practice). A node that cannot be evaluated is left in place."""
    model = g.to_model()
    while _fold_pass(g, _static_shapes(model)):
        model = g.to_model()  # shapes known only now (e.g. after a Resize got constant sizes)


def _fold_pass(g: _Graph, shapes: dict[str, tuple[int, ...]]) -> bool:
    folded = False
    for n in list(g.nodes):
        if n.domain not in ("", "ai.onnx") or n.op_type in _NOT_FOLDED or not n.output \
                or g.produces_graph_output(n) or \
                any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                    for a in n.attribute):
            continue
        ins = [x for x in n.input if x]
        try:
            if n.op_type == "Shape" and ins and g.const(ins[0]) is None:
                shp = shapes.get(ins[0])
                if shp is None:
                    continue
                full = np.array(shp, np.int64)
                start, end = _attr(n, "start", 0), _attr(n, "end", None)
                outs = [full[start:end] if end is not None else full[start:]]
            elif not ins or any(g.const(x) is None for x in ins):
                continue
            elif _is_q(n):
                if _attr(n, "block_size", 0) or _attr(n, "precision", 0):
                    continue
                vals = [g.const(x) if x else None for x in n.input] + [None] * 3
                zp = vals[2]
                if vals[0].dtype != np.float32 or vals[1].dtype != np.float32 or \
                        (zp is not None and zp.dtype not in dtypes.EIGHT_BIT):
                    continue
                outs = [qlinear.quantize_linear(vals[0], vals[1], zp, axis=_attr(n, "axis", 1))]
            else:
                outs = _evaluate(g, n)
        except Exception:
            continue
        g.remove(n)
        folded = True
        for name, v in zip(n.output, outs):
            if not name:
                continue
            v = np.asarray(v)
            g.consts[name] = v
            g.types[name] = helper.np_dtype_to_tensor_dtype(v.dtype)
            g.new_inits.append(numpy_helper.from_array(v, name))
    return folded


def _evaluate(g: _Graph, n: onnx.NodeProto) -> list[np.ndarray]:
    ins = [x for x in n.input if x]
    feeds = {x: g.const(x) for x in ins}
    graph = helper.make_graph(
        [n], "fold",
        [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for x, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in n.output if o])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                for d, v in g.opsets.items() if d in ("", "ai.onnx.ml")])
    m.ir_version = g.model.ir_version if g.model.ir_version >= 4 else 8
    outs = ReferenceEvaluator(m).run(None, feeds)
    return [np.asarray(o) for o in outs]


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return {}
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape") and \
                all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return out


def fuse_reshape_shape(g: _Graph) -> None:
    """Reshape(X, Concat(pieces)) where every piece is a constant or
    Unsqueeze(Gather(Shape(Y), i)) gets a constant shape (onnxruntime's ReshapeFusion).

    A gathered dimension becomes its value when Y's dimension is known, or 0 ("copy the input
    dimension") when it is the same symbolic dimension as X's at that position; otherwise the
    Reshape is left alone. The Shape -> Gather -> Unsqueeze -> Concat nodes that no longer have
    consumers are removed, so the tensor Y loses a consumer (which changes which QDQ groups
    fuse, as in onnxruntime)."""
    dims = _dims(g.to_model())
    for r in list(g.nodes):
        if not _is(r, "Reshape") or len(r.input) < 2 or g.const(r.input[1]) is not None:
            continue
        cat = g.producer.get(r.input[1])
        if cat is None or not _is(cat, "Concat") or _attr(cat, "axis", 0) != 0:
            continue
        xdims = dims.get(r.input[0])
        shape: list[int] = []
        chain: list[onnx.NodeProto] = [cat]
        for piece in cat.input:
            c = g.const(piece)
            if c is not None:
                if c.dtype != np.int64 or c.ndim != 1:
                    break
                shape += [int(v) for v in c]
                continue
            un = g.producer.get(piece)
            ga = g.producer.get(un.input[0]) if un is not None and _is(un, "Unsqueeze") else None
            sh = g.producer.get(ga.input[0]) if ga is not None and _is(ga, "Gather") else None
            if sh is None or not _is(sh, "Shape") or _attr(sh, "start", 0) or \
                    _attr(sh, "end", None) is not None or _attr(ga, "axis", 0) != 0:
                break
            idx = g.const(ga.input[1])
            ydims = dims.get(sh.input[0])
            if idx is None or idx.size != 1 or ydims is None:
                break
            i = int(idx.reshape(-1)[0])
            if not -len(ydims) <= i < len(ydims):
                break
            d = ydims[i]
            if isinstance(d, int):
                shape.append(d)
            elif xdims is not None and len(shape) < len(xdims) and xdims[len(shape)] == d:
                shape.append(0)
            else:
                break
            chain += [un, ga, sh]
        else:
            r.input[1] = g.add_const("ReshapeFusion_shape", np.array(shape, np.int64))
            g._index()
            _remove_dead(g, chain)
            # a DQ copy that only fed the removed Shape goes too
            _remove_dead(g, [g.producer[x] for n in chain for x in n.input
                             if x in g.producer and _is_dq(g.producer[x])])


def fuse_consecutive_reshapes(g: _Graph) -> None:
    """Reshape(Reshape(X, a), b) becomes Reshape(X, b) (ReshapeFusion, measured): the inner
    Reshape's output has this one reader and is not a graph output, and b is a constant
    without 0 entries (a 0 would copy a dimension of the inner result)."""
    for outer in list(g.nodes):
        if not g.has(outer) or not _is(outer, "Reshape") or len(outer.input) < 2:
            continue
        shape = g.const(outer.input[1])
        inner = g.producer.get(outer.input[0])
        if shape is None or (shape == 0).any() or inner is None or not _is(inner, "Reshape"):
            continue
        if g.single_consumer(inner) is not outer or _attr(outer, "allowzero", 0):
            continue
        g.set_input(outer, 0, inner.input[0])
        g.remove(inner)


def remove_dead_nodes(g: _Graph) -> None:
    """Nodes none of whose outputs is read or is a graph output are removed, repeatedly (as
    onnxruntime's graph resolution does: after constant folding, the DQ copies that only fed
    a folded Shape disappear, and their Q then has a single consumer)."""
    _remove_dead(g, list(g.nodes))


def _remove_dead(g: _Graph, candidates: list[onnx.NodeProto]) -> None:
    changed = True
    while changed:
        changed = False
        for n in candidates:
            if g.has(n) and not any(g.consumers.get(o) or o in g.pinned for o in n.output if o):
                g.remove(n)
                changed = True


def _dims(model: onnx.ModelProto) -> dict[str, list]:
    """Each tensor's dimensions from shape inference: int when known, the symbol otherwise."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + \
            list(inferred.graph.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else
                            (d.dim_param or object()) for d in t.shape.dim]
    return out
