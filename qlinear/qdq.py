"""QDQ fusion: rewrite a QDQ model the way onnxruntime 1.32's CPU session does.

    import onnx, qlinear.qdq
    fused = qlinear.qdq.fuse_qdq(onnx.load("model_qdq.onnx"))

A QDQ model computes ``DequantizeLinear -> float operator -> QuantizeLinear``. onnxruntime's
optimizer (default session, ``ORT_ENABLE_ALL``; the QDQ rules run at ``EXTENDED`` and above)
replaces such node groups by integer kernels, which round differently from the float graph.
:func:`fuse_qdq` applies the same rules, under the same conditions, in the same order, so that
qlinear's integer kernels compute what onnxruntime's normal session computes. It is pure
(ModelProto in, new ModelProto out) and leaves every node it does not match unchanged.

The passes, in onnxruntime's order (docs/qdq.md has each rule, its conditions, its source and
its test):

Level 1 (graph-wide, provider independent)
  1. ``fold_constants``: a node whose inputs are all constants (a Shape of a known shape) is
     folded into an initializer (onnxruntime's ConstantFolding; DequantizeLinear never is).
  2. ``ensure_unique_dq``: a DequantizeLinear with several consumers (or a consumer and a
     graph output) is duplicated so that every consumer has its own (EnsureUniqueDQForNodeUnit).
  3. ``remove_double_qdq``: Q1 -> DQ1 -> Q2 -> DQ2 becomes one Q -> DQ pair whose scale and
     zero point cover the intersection of both ranges (DoubleQDQPairsRemover).

Level 2 (CPU)
  4. ``remove_relu_clip``: a Relu or Clip whose only consumer is a QuantizeLinear that clamps
     at least as tightly is removed (ReluQuantFusion, ClipQuantFusion).
  5. ``s8_to_u8``: every Q -> DQ pair of int8 with one consumer and equal constant scalar zero
     points becomes uint8 with zero point + 128 (QDQS8ToU8Transformer; x86 does not allow int8
     activations in the fused kernels, ``int8_allowed=False``).
  6. node groups (QDQSelectorActionTransformer), visited in graph order:
     Q/DQ pairs dropped around data-movement operators, Split, ArgMax; Conv -> QLinearConv;
     MatMul -> QLinearMatMul or com.microsoft MatMulIntegerToFloat; Gemm -> com.microsoft QGemm;
     Add, Mul -> QLinearAdd, QLinearMul; Sigmoid, LeakyRelu, Softmax, AveragePool,
     GlobalAveragePool -> QLinear*; Concat -> QLinearConcat; Where -> QLinearWhere.

``ops`` restricts which fused operators may be emitted (a node group whose replacement is not
in it stays as written), so that a backend emits only operators it has kernels for.

What is not reproduced: QDQPropagation (not run by onnxruntime 1.32's default session, checked
in tests), 16-bit and 4-bit fusions (MatMulNBits, which changes arithmetic with an
accuracy_level), the com.microsoft NHWC layout of QLinearConv (same arithmetic as the ONNX
operator), and float-only fusions (Conv + activation into FusedConv, NCHWc): those leave the
float graph's arithmetic to within float rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional

import numpy as np

import onnx
from onnx import helper, numpy_helper

__all__ = ["fuse_qdq", "exact_integer_convs", "FUSED_OPS", "DROP_QDQ_OPS"]

_T = onnx.TensorProto
MS = "com.microsoft"

#: The operators the fusion can emit, as (domain, op_type).
FUSED_OPS: frozenset[tuple[str, str]] = frozenset({
    ("", "QLinearConv"), ("", "QLinearMatMul"), (MS, "MatMulIntegerToFloat"), (MS, "QGemm"),
    (MS, "QLinearAdd"), (MS, "QLinearMul"), (MS, "QLinearSigmoid"), (MS, "QLinearLeakyRelu"),
    (MS, "QLinearSoftmax"), (MS, "QLinearAveragePool"), (MS, "QLinearGlobalAveragePool"),
    (MS, "QLinearConcat"), (MS, "QLinearWhere"),
})

#: Data-movement operators whose DQ -> op -> Q group becomes the op on integers
#: (onnxruntime's "drop" rule): op_type -> (16-bit allowed, positive scale required, versions).
DROP_QDQ_OPS: dict[str, tuple[bool, bool, Optional[tuple[int, ...]]]] = {
    **{op: (True, False, None) for op in ("Expand", "Flatten", "Gather", "GatherElements",
                                           "Reshape", "Slice", "Squeeze", "Tile", "Transpose",
                                           "Unsqueeze")},
    "Resize": (False, False, None),
    "MaxPool": (False, True, (12, 22)),
    "ReduceMax": (False, True, None),
    "ReduceMin": (False, True, None),
}

#: A Conv bias DQ scale b fuses when |b - x_scale * w_scale| <= ATOL + RTOL * |x_scale * w_scale|.
BIAS_SCALE_ATOL, BIAS_SCALE_RTOL = 1e-6, 1e-2

#: Quantized operators: the input holding the output zero point (its type is the output's).
_OUTPUT_ZP_INPUT = {"QLinearConv": 7, "QLinearMatMul": 7, "QLinearAdd": 7, "QLinearMul": 7,
                    "QLinearConcat": 1, "QLinearWhere": 8, "QLinearSigmoid": 4,
                    "QLinearLeakyRelu": 4, "QLinearSoftmax": 4, "QLinearAveragePool": 4,
                    "QLinearGlobalAveragePool": 4, "QGemm": 8}

_UNARY = {"AveragePool", "LeakyRelu", "GlobalAveragePool", "Sigmoid", "Softmax"}
_BINARY = {"Add", "Mul"}
_INT16 = {_T.INT16, _T.UINT16}
# the types no fusion takes: 4- and 2-bit integers and the float formats (onnxruntime's QDQ
# selectors fuse 8- and 16-bit integers; these pairs run as written)
_INT4 = {_T.INT4, _T.UINT4, _T.INT2, _T.UINT2, _T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2,
         _T.FLOAT8E5M2FNUZ, _T.FLOAT4E2M1, _T.FLOAT6E2M3, _T.FLOAT6E3M2}
_TYPE_MIN = {_T.UINT8: 0, _T.INT8: -128, _T.UINT16: 0, _T.INT16: -32768}
_TYPE_MAX = {_T.UINT8: 255, _T.INT8: 127, _T.UINT16: 65535, _T.INT16: 32767}


# --------------------------------------------------------------------------- graph view


class QDQRefusal(ValueError):
    """A QDQ group that onnxruntime's optimizer rewrites into something other than the model's
    arithmetic, which qlinear does not reproduce (the message says what and why)."""


def _refuse_attributes_the_fused_node_lacks(node: onnx.NodeProto, fused: str) -> None:
    """QDQRefusal when ``node`` has an attribute the com.microsoft operator ``fused`` does not
    (AveragePool-19's ``dilations`` for QLinearAveragePool). Measured (onnxruntime 1.32):
    onnxruntime fuses the group anyway, copying the attributes, and its session then fails to
    load ('Unrecognized attribute: dilations for operator QLinearAveragePool'); qlinear's fused
    kernel would ignore the attribute and answer an undilated pool."""
    from .backend_contrib import ATTRIBUTES  # (the backend imports this module)

    unknown = sorted({a.name for a in node.attribute} - set(ATTRIBUTES[fused]))
    if unknown:
        raise QDQRefusal(
            f"{node.op_type} {node.name or node.output[0]!r}: onnxruntime fuses the group into "
            f"com.microsoft {fused}, which has no attribute {', '.join(map(repr, unknown))}, and its "
            f"session then fails ('Unrecognized attribute: {unknown[0]} for operator {fused}', measured, "
            "onnxruntime 1.32): qdq='literal' (--qdq literal) runs the graph as written")


class _Graph:
    """A mutable view of a GraphProto: nodes in order, constants, element types, outputs."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.nodes: list[onnx.NodeProto] = [_copy(n) for n in g.node]
        self.opsets = {(d.domain if d.domain != "ai.onnx" else ""): d.version
                       for d in model.opset_import}
        inputs = {i.name for i in g.input}
        # An initializer that is also a graph input can be overridden at run time (IR >= 4),
        # so onnxruntime does not treat it as a constant; with IR < 4 every initializer is
        # listed among the inputs and they are constants.
        overridable = inputs if model.ir_version >= 4 else set()
        self.consts: dict[str, np.ndarray] = {
            i.name: numpy_helper.to_array(i) for i in g.initializer if i.name not in overridable}
        self.new_inits: list[onnx.TensorProto] = []
        self.removed_inits: set[str] = set()
        self.outputs = {o.name for o in g.output}
        # Names read inside subgraphs (If/Loop/Scan bodies) are implicit inputs of their node:
        # such tensors must keep their name and producer, as if they were graph outputs.
        self.pinned = set(self.outputs) | _subgraph_reads(g)
        from .backend import _elem_types  # (the backend imports this module)

        self.types: dict[str, int] = _elem_types(model)
        for n in self.nodes:  # Constant nodes are constants too
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
                try:
                    v = _constant_value(n)
                except Exception:
                    continue
                if v is not None:
                    self.consts[n.output[0]] = v
                    self.types[n.output[0]] = helper.np_dtype_to_tensor_dtype(v.dtype)
        self._counter = 0
        self._index()

    # ---- bookkeeping

    def _index(self) -> None:
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        self._alive: set[int] = set()
        for n in self.nodes:
            self._add_to_index(n)

    def _add_to_index(self, n: onnx.NodeProto) -> None:
        self._alive.add(id(n))
        for o in n.output:
            if o:
                self.producer[o] = n
        for i, x in enumerate(n.input):
            if x:
                self.consumers.setdefault(x, []).append((n, i))

    def _drop_from_index(self, n: onnx.NodeProto) -> None:
        self._alive.discard(id(n))
        for o in n.output:
            if o and self.producer.get(o) is n:
                del self.producer[o]
        for x in set(n.input):
            if x and x in self.consumers:
                kept = [(c, i) for c, i in self.consumers[x] if c is not n]
                if kept:
                    self.consumers[x] = kept
                else:
                    del self.consumers[x]

    def set_input(self, node: onnx.NodeProto, slot: int, name: str) -> None:
        old = node.input[slot]
        if old in self.consumers:
            kept = [(c, i) for c, i in self.consumers[old] if not (c is node and i == slot)]
            if kept:
                self.consumers[old] = kept
            else:
                del self.consumers[old]
        node.input[slot] = name
        if name:
            self.consumers.setdefault(name, []).append((node, slot))

    def set_output(self, node: onnx.NodeProto, k: int, name: str) -> None:
        old = node.output[k]
        if self.producer.get(old) is node:
            del self.producer[old]
        node.output[k] = name
        self.producer[name] = node

    def replace_node(self, old: onnx.NodeProto, new: onnx.NodeProto) -> None:
        """Put ``new`` at ``old``'s position."""
        self.nodes[self.pos(old)] = new
        self._drop_from_index(old)
        self._add_to_index(new)

    def fresh(self, base: str) -> str:
        while True:
            self._counter += 1
            name = f"{base}_qdq{self._counter}"
            if name not in self.producer and name not in self.consts and name not in self.types:
                return name

    def add_const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.consts[name] = value
        self.types[name] = helper.np_dtype_to_tensor_dtype(value.dtype)
        self.new_inits.append(numpy_helper.from_array(value, name))
        return name

    def version(self, node: onnx.NodeProto) -> Optional[int]:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in self.opsets:
            return None
        try:
            return onnx.defs.get_schema(node.op_type, self.opsets[domain], domain).since_version
        except Exception:
            return None

    # ---- queries

    def const(self, name: str) -> Optional[np.ndarray]:
        return self.consts.get(name) if name else None

    def elem_type(self, name: str) -> int:
        p = self.producer.get(name)
        if p is not None and _is_q(p):
            return _q_output_type(self, p)
        if p is not None and (p.op_type in DROP_QDQ_OPS or p.op_type == "Split") and p.input:
            return self.elem_type(p.input[0])  # data movement keeps the element type
        if p is not None and p.op_type in _OUTPUT_ZP_INPUT and not self.types.get(name):
            # quantized operators (com.microsoft ones are unknown to onnx's shape inference):
            # the output has the type of the output zero point
            k = _OUTPUT_ZP_INPUT[p.op_type]
            if k < len(p.input) and p.input[k]:
                return self.elem_type(p.input[k])
        return self.types.get(name, 0)

    def consumer_nodes(self, name: str) -> list[onnx.NodeProto]:
        return [n for n, _ in self.consumers.get(name, [])]

    def edges_out(self, node: onnx.NodeProto) -> list[tuple[int, onnx.NodeProto, int]]:
        """Output edges (output index, consumer, consumer input index) as onnxruntime counts them."""
        return [(k, c, i) for k, o in enumerate(node.output) if o
                for c, i in self.consumers.get(o, [])]

    def produces_graph_output(self, node: onnx.NodeProto) -> bool:
        return any(o in self.pinned for o in node.output if o)

    def single_consumer(self, node: onnx.NodeProto) -> Optional[onnx.NodeProto]:
        """The one consumer of a one-output node with one output edge and no graph output
        (onnxruntime's ``CheckOutputEdges(graph, node, 1)``), else None."""
        edges = self.edges_out(node)
        if len(edges) != 1 or self.produces_graph_output(node):
            return None
        return edges[0][1]

    def pos(self, node: onnx.NodeProto) -> int:
        for i, n in enumerate(self.nodes):
            if n is node:
                return i
        raise KeyError(node.name)

    def has(self, node: onnx.NodeProto) -> bool:
        return id(node) in self._alive

    def remove(self, *nodes: onnx.NodeProto) -> None:
        ids = {id(n) for n in nodes}
        self.nodes = [n for n in self.nodes if id(n) not in ids]
        for n in nodes:
            self._drop_from_index(n)

    def to_model(self) -> onnx.ModelProto:
        used = {x for n in self.nodes for x in n.input} | self.pinned
        for n in self.nodes:
            for a in n.attribute:
                if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    used |= _subgraph_reads_node(n)
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        del g.node[:]
        g.node.extend(_topological(self.nodes, {i.name for i in g.input} |
                                   {i.name for i in g.initializer} |
                                   {t.name for t in self.new_inits}))
        keep = [i for i in g.initializer if i.name in used or i.name in {x.name for x in g.input}]
        keep += [i for i in self.new_inits if i.name in used]
        del g.initializer[:]
        g.initializer.extend(keep)
        if m.ir_version < 4:  # IR 3: every initializer is also a graph input
            listed = {x.name for x in g.input}
            for t in self.new_inits:
                if t.name in used and t.name not in listed:
                    g.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
        # value_info of tensors that changed type or disappeared would mislead; keep only those
        # whose tensor still exists with the recorded type.
        vis = [v for v in g.value_info if v.name in self.producer and
               v.type.tensor_type.elem_type == self.types_now(v.name)]
        del g.value_info[:]
        g.value_info.extend(vis)
        if any(n.domain == MS for n in self.nodes) and \
                not any(d.domain == MS for d in m.opset_import):
            m.opset_import.append(helper.make_opsetid(MS, 1))
        return m

    def types_now(self, name: str) -> int:
        return self.elem_type(name)


def _topological(nodes: list[onnx.NodeProto], known: set[str]) -> list[onnx.NodeProto]:
    """The nodes in an order where each comes after the producers of its inputs, keeping the
    given order wherever it already is one (a fused node takes its target's place, and a
    model may define a Q's scale as a Constant node after the target)."""
    import heapq

    producer_of = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    waits: list[set[int]] = []
    users: dict[int, list[int]] = {}
    for k, n in enumerate(nodes):
        deps = {producer_of[x] for x in set(n.input) | _subgraph_reads_node(n)
                if x and x not in known and x in producer_of and producer_of[x] != k}
        waits.append(deps)
        for d in deps:
            users.setdefault(d, []).append(k)
    ready = [k for k, d in enumerate(waits) if not d]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(nodes[k])
        for u in users.get(k, []):
            waits[u].discard(k)
            if not waits[u]:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):  # a cycle: cannot happen for a valid input; keep the order
        return list(nodes)
    return out


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    n = onnx.NodeProto()
    n.CopyFrom(node)
    return n


def _subgraph_reads_node(node: onnx.NodeProto) -> set[str]:
    out: set[str] = set()
    for a in node.attribute:
        subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
            list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
        for sg in subs:
            for n in sg.node:
                out |= set(n.input)
                out |= _subgraph_reads_node(n)
    return out


def _subgraph_reads(g: onnx.GraphProto) -> set[str]:
    out: set[str] = set()
    for n in g.node:
        out |= _subgraph_reads_node(n)
    return out


def _constant_value(node: onnx.NodeProto) -> Optional[np.ndarray]:
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_int":
            return np.array(a.i, np.int64)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
        if a.name == "value_ints":
            return np.array(list(a.ints), np.int64)
    return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def _is(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in ("", "ai.onnx")


def _is_q(node: onnx.NodeProto) -> bool:
    return _is(node, "QuantizeLinear")


def _is_dq(node: onnx.NodeProto) -> bool:
    return _is(node, "DequantizeLinear")


def _q_output_type(g: _Graph, q: onnx.NodeProto) -> int:
    if len(q.input) > 2 and q.input[2]:
        zp = g.const(q.input[2])
        if zp is not None:
            return helper.np_dtype_to_tensor_dtype(zp.dtype)
        return g.types.get(q.input[2], 0)
    odt = _attr(q, "output_dtype", 0)
    return odt or _T.UINT8


def _n_actual(names: Iterable[str]) -> int:
    return sum(1 for x in names if x)


def _scalar(v: Optional[np.ndarray]) -> bool:
    # onnxruntime's IsScalarOr1ElementVector: rank 0, or rank 1 with one element.
    return v is not None and (v.ndim == 0 or (v.ndim == 1 and v.size == 1))


def _const_scalar_params(g: _Graph, node: onnx.NodeProto, need_zp: bool) -> bool:
    """Scale (and zero point, when given) are constant scalars (QOrDQNodeHasConstantScalar...)."""
    if len(node.input) < 2 or not _scalar(g.const(node.input[1])):
        return False
    has_zp = len(node.input) > 2 and bool(node.input[2])
    if need_zp and not has_zp:
        return False
    return not has_zp or _scalar(g.const(node.input[2]))


def _qdq_pair_supported(g: _Graph, q: onnx.NodeProto, dq: onnx.NodeProto) -> bool:
    """onnxruntime's IsQDQPairSupported: both have constant scalar scale and explicit zero
    point, of the same type, with equal values."""
    if not (_const_scalar_params(g, q, True) and _const_scalar_params(g, dq, True)):
        return False
    qs, qz = g.const(q.input[1]), g.const(q.input[2])
    ds, dz = g.const(dq.input[1]), g.const(dq.input[2])
    return (qz.dtype == dz.dtype and qs.dtype == ds.dtype
            and qz.reshape(()) == dz.reshape(()) and qs.reshape(()) == ds.reshape(()))


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
    import qlinear

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
                        (zp is not None and zp.dtype not in (np.uint8, np.int8)):
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
    from onnx.reference import ReferenceEvaluator

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
            g.types[new.output[0]] = g.types.get(out, _T.FLOAT)
            consumer.input[slot] = new.output[0]
            g.nodes.insert(at + 1 + k, new)
        g._index()


def remove_double_qdq(g: _Graph) -> None:
    """Q1 -> DQ1 -> Q2 -> DQ2 becomes Q1' -> DQ2' (DoubleQDQPairsRemover).

    Conditions: DQ1 has one input edge (from Q1) and one output edge (to Q2); Q1 and Q2 have
    one output edge each; none of Q1, DQ1, Q2 produces a graph output; DQ2 is a DQ; both pairs
    satisfy IsQDQPairSupported; the zero points are uint8 or int8 of one type. When the two
    pairs' parameters differ, the outer pair gets the scale and zero point of the intersection
    of both real ranges: s = f((hi - lo) / (qmax - qmin)), zp = round_half_away(qmin - lo / s),
    with lo, hi computed in float32 as in onnxruntime.
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
            if q2 is None or not _is_q(q2):
                continue
            if g.single_consumer(q1) is not dq1:
                continue
            dq2 = g.single_consumer(q2)
            if dq2 is None or not _is_dq(dq2):
                continue
            if not (_qdq_pair_supported(g, q1, dq1) and _qdq_pair_supported(g, q2, dq2)):
                continue
            zt = g.const(dq1.input[2]).dtype
            if zt not in (np.uint8, np.int8):
                continue
            new = _double_qdq_params(g, dq1, q2)
            if new is False:
                continue
            if new is not None:
                s, z = new
                sname = g.add_const("DoubleQDQRemoved_scale", s)
                zname = g.add_const("DoubleQDQRemoved_zp", z)
                for n in (q1, dq2):
                    g.set_input(n, 1, sname)
                    g.set_input(n, 2, zname)
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
    qmin, qmax = int(np.iinfo(zt).min), int(np.iinfo(zt).max)
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
        g.types[pre] = g.types.get(base, _T.FLOAT)
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
        g.types[post] = _T.FLOAT
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
        g.types[out] = _T.FLOAT
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
    if z.dtype == np.int8:
        lo, hi = -128, 127
    elif z.dtype == np.uint8:
        lo, hi = 0, 255
    else:
        return None
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
        return zt in _TYPE_MIN and int(z.reshape(-1)[0]) == _TYPE_MIN[zt]
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
    ClipQuantFusion). The activation must have exactly one output edge, to the Q."""
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
        if not _clip_redundant(g, act, q):
            continue
        g.set_input(q, 0, act.input[0])
        g.remove(act)


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
        g.types[out] = _T.UINT8
        g.set_output(q, 0, out)
        g.set_input(dq, 0, out)
        g.set_input(q, 2, zname)
        g.set_input(dq, 2, zname)


# --------------------------------------------------------------------------- node groups


@dataclasses.dataclass
class _Group:
    target: onnx.NodeProto
    dqs: list[onnx.NodeProto]          # DQ parents in input-slot order
    dq_slots: list[int]                # the target input each DQ feeds
    qs: list[onnx.NodeProto]           # Q children
    clip: Optional[onnx.NodeProto]     # redundant Relu/Clip between target and Q


def _select(g: _Graph, node: onnx.NodeProto) -> Optional[_Group]:
    """onnxruntime's GetQDQSelection: DQ parents, an optional redundant Relu/Clip, Q children."""
    dqs, slots = [], []
    for i, x in enumerate(node.input):
        p = g.producer.get(x) if x else None
        if p is not None and _is_dq(p):
            dqs.append(p)
            slots.append(i)
    clip = None
    edges = g.edges_out(node)
    if len(edges) == 1:
        nxt = edges[0][1]
        if (_is(nxt, "Relu") or _is(nxt, "Clip")) and len(g.edges_out(nxt)) == 1 \
                and not g.produces_graph_output(nxt):
            clip = nxt
    src = clip if clip is not None else node
    qs = [c for _, c, _ in g.edges_out(src) if _is_q(c)]
    if clip is not None and (len(qs) != 1 or not _clip_redundant(g, clip, qs[0])):
        return None
    return _Group(node, dqs, slots, qs, clip)


def _can_create_group(g: _Graph, grp: _Group) -> bool:
    """NodeGroup::CanCreateNodeGroup: each DQ feeds only the target (one edge, no graph
    output); each output of the target (or of the redundant Relu/Clip) goes either only to Q
    nodes or only to other nodes, and one going to Q nodes is not a graph output."""
    for dq in grp.dqs:
        e = g.edges_out(dq)
        if g.produces_graph_output(dq) or len(e) != 1 or e[0][1] is not grp.target:
            return False
    if grp.qs:
        src = grp.clip if grp.clip is not None else grp.target
        for o in src.output:
            if not o:
                continue
            kinds = {_is_q(c) for c in g.consumer_nodes(o)}
            if len(kinds) > 1:
                return False
            if kinds == {True} and o in g.pinned:
                return False
    return True


def _check_qdq_nodes(g: _Graph, grp: _Group, num_dq: int = -1, empty_q_ok: bool = False) -> bool:
    """NodeGroupSelector::CheckQDQNodes."""
    node = grp.target
    if num_dq == -1:
        num_dq = _n_actual(node.input)
    if num_dq != len(grp.dqs):
        return False
    if not _can_create_group(g, grp):
        return False
    if not grp.qs:
        return empty_q_ok
    return (_n_actual(node.output) == len(grp.qs) and len(grp.qs) == len(g.edges_out(node))
            and not g.produces_graph_output(node))


def _params_fit_the_product(g: _Graph, dq: onnx.NodeProto, column_axis: Optional[int]) -> bool:
    """The DequantizeLinear's scale is one element, or (``column_axis`` given) it quantizes a
    2-D constant per column of the product, along ``column_axis``. Measured (onnxruntime 1.32):
    a MatMul with Q fuses into QLinearMatMul, and a Gemm into QGemm, only then; a weight
    quantized along K (per row of B), any per-axis weight of a 3-D B, or a per-axis
    activation leaves the group in float. A scale that is not a constant is left to the
    other checks."""
    scale = g.const(dq.input[1])
    if scale is None or scale.size == 1:
        return True
    data = g.const(dq.input[0])
    if column_axis is None or data is None or data.ndim != 2:
        return False
    return int(_attr(dq, "axis", 1)) % 2 == column_axis


def _per_tensor(g: _Graph, *nodes: onnx.NodeProto) -> bool:
    """Every node's (DequantizeLinear's or QuantizeLinear's) scale is one element, or not a
    constant (left to the other checks). Measured (onnxruntime 1.32): Add, Mul, Concat and
    Softmax groups with a per-axis activation DequantizeLinear, and Add, Mul, MatMul and Gemm
    groups with a per-axis QuantizeLinear, stay in float; the fused kernels take one scale."""
    for n in nodes:
        scale = g.const(n.input[1])
        if scale is not None and scale.size != 1:
            return False
    return True


def _dq_type(g: _Graph, dq: onnx.NodeProto) -> int:
    return g.elem_type(dq.input[0])


def _q_type(g: _Graph, q: onnx.NodeProto) -> int:
    return _q_output_type(g, q)


def _bad_width(t: int, allow_16bit: bool = False) -> bool:
    return t in _INT4 or (t in _INT16 and not allow_16bit)


class _Rules:
    """The selectors (conditions) and actions (rewrites) of QDQSelectorActionTransformer."""

    def __init__(self, g: _Graph, int8_allowed: bool, emit: Callable[[str, str], bool]):
        self.g = g
        self.int8_allowed = int8_allowed
        self.emit = emit

    def apply(self, node: onnx.NodeProto) -> bool:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            return False
        if op in DROP_QDQ_OPS:
            return self.drop_qdq(node)
        if op == "Split":
            return self.split(node)
        if op == "ArgMax":
            return self.drop_dq(node)
        if op in _UNARY:
            return self.unary(node)
        if op in _BINARY:
            return self.binary(node)
        if op == "Concat":
            return self.concat(node)
        if op == "Conv":
            return self.conv(node)
        if op == "MatMul":
            return self.matmul(node)
        if op == "Gemm":
            return self.gemm(node)
        if op == "Where":
            return self.where(node)
        return False

    # ---- rewriting helpers

    def _zp(self, dq_or_q: onnx.NodeProto, data_type: int) -> str:
        """The node's zero point input, or a zero of the right type when it is omitted
        (SetOptionalZeroPoint: int8 for an int8 DQ input, uint8 otherwise)."""
        if len(dq_or_q.input) > 2 and dq_or_q.input[2]:
            return dq_or_q.input[2]
        dt = np.int8 if data_type == _T.INT8 else np.uint8
        return self.g.add_const("optional_zero_point", np.zeros((), dt))

    def _dq_inputs(self, dq: onnx.NodeProto) -> list[str]:
        return [dq.input[0], dq.input[1], self._zp(dq, _dq_type(self.g, dq))]

    def _q_params(self, q: onnx.NodeProto) -> list[str]:
        return [q.input[1], self._zp(q, _q_type(self.g, q))]

    def _replace(self, grp: _Group, new: onnx.NodeProto) -> bool:
        g = self.g
        g.replace_node(grp.target, new)
        drop = list(grp.dqs) + list(grp.qs) + ([grp.clip] if grp.clip is not None else [])
        g.remove(*drop)
        return True

    def _new(self, grp: _Group, op: str, domain: str, inputs: list[str], outputs: list[str],
             attrs: Optional[dict] = None, copy_attrs: bool = True) -> onnx.NodeProto:
        n = helper.make_node(op, inputs, outputs, name=grp.target.name or None, domain=domain)
        if copy_attrs:
            if domain == MS:
                _refuse_attributes_the_fused_node_lacks(grp.target, op)
            n.attribute.extend(_copy(grp.target).attribute)
        for k, v in (attrs or {}).items():
            n.attribute.append(helper.make_attribute(k, v))
        return n

    # ---- drop Q/DQ around data movement

    def drop_qdq(self, node: onnx.NodeProto) -> bool:
        g = self.g
        allow16, positive, versions = DROP_QDQ_OPS[node.op_type]
        if versions is not None and g.version(node) not in versions:
            return False
        grp = _select(g, node)
        if grp is None or grp.clip is not None:
            return False
        if not _check_qdq_nodes(g, grp, num_dq=1) or grp.dq_slots != [0]:
            return False
        dq, q = grp.dqs[0], grp.qs[0]
        t_in, t_out = _dq_type(g, dq), _q_type(g, q)
        if t_in != t_out or t_in in _INT4 or (t_in in _INT16 and not allow16):
            return False
        if positive:
            s = g.const(q.input[1]) if len(q.input) > 1 else None
            if not _scalar(s) or not float(s.reshape(-1)[0]) > 0:
                return False
        if not _qdq_pair_supported(g, q, dq):
            return False
        if node.op_type == "Resize" and _attr(node, "mode", "nearest") != "nearest":
            return False  # measured: onnxruntime 1.32 keeps linear/cubic Resize in float
        new = _copy(node)
        new.input[0] = dq.input[0]
        new.output[0] = q.output[0]
        return self._replace(grp, new)

    def split(self, node: onnx.NodeProto) -> bool:
        g = self.g
        grp = _select(g, node)
        if grp is None or grp.clip is not None:
            return False
        if not _check_qdq_nodes(g, grp, num_dq=1) or grp.dq_slots != [0]:
            return False
        dq = grp.dqs[0]
        t_in = _dq_type(g, dq)
        if t_in in _INT4:
            return False
        for q in grp.qs:
            if _q_type(g, q) != t_in or not _qdq_pair_supported(g, q, dq):
                return False
        # Q nodes in output order.
        by_out = {q.input[0]: q for q in grp.qs}
        new = _copy(node)
        new.input[0] = dq.input[0]
        for k, o in enumerate(node.output):
            if o:
                new.output[k] = by_out[o].output[0]
        return self._replace(grp, new)

    def drop_dq(self, node: onnx.NodeProto) -> bool:
        g = self.g
        grp = _select(g, node)
        if grp is None or grp.clip is not None or len(grp.dqs) != 1 or grp.dq_slots != [0]:
            return False
        if not _can_create_group(g, dataclasses.replace(grp, qs=[])):
            return False
        dq = grp.dqs[0]
        t = _dq_type(g, dq)
        if t in _INT16 or t in _INT4:
            return False
        if not _const_scalar_params(g, dq, False):
            return False
        new = _copy(node)
        new.input[0] = dq.input[0]
        g.replace_node(node, new)
        g.remove(dq)
        return True

    # ---- QLinear replacements

    def unary(self, node: onnx.NodeProto) -> bool:
        g = self.g
        op = "QLinear" + node.op_type
        if not self.emit(MS, op):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp, num_dq=1):
            return False
        dq, q = grp.dqs[0], grp.qs[0]
        t = _dq_type(g, dq)
        if t != _q_type(g, q) or _bad_width(t):
            return False
        if node.op_type == "Softmax" and not _per_tensor(g, dq):
            return False
        if node.op_type == "Softmax":
            self._refuse_per_axis(node, f"com.microsoft {op}", (dq, q), (
                "quantizes with the first scale and zero point only, which is not the model's "
                "arithmetic, and qlinear does not reproduce it"))
        else:
            self._refuse_per_axis(node, f"com.microsoft {op}", (dq, q))
        attrs = {"opset": int(g.version(node))} if node.op_type == "Softmax" else None
        new = self._new(grp, op, MS, self._dq_inputs(dq) + self._q_params(q), [q.output[0]], attrs)
        return self._replace(grp, new)

    def _refuse_per_axis(self, node: onnx.NodeProto, fused: str, qdqs: tuple,
                         what: str = "its session then fails on the fused node") -> None:
        """QDQRefusal when one of ``qdqs`` (the group's activation DequantizeLinear or its
        QuantizeLinear) is per axis. Measured (onnxruntime 1.32): the Softmax, Sigmoid,
        LeakyRelu, AveragePool, GlobalAveragePool, Where and Conv groups are fused whatever the
        activations' parameters, and the fused kernels take one scale; qlinear's fused node would
        fail on a node the model does not have."""
        g = self.g
        for qdq in qdqs:
            if _per_tensor(g, qdq):
                continue
            raise QDQRefusal(
                f"{node.op_type} {node.name or node.output[0]!r}: its {qdq.op_type} "
                f"{qdq.name or qdq.output[0]!r} is per axis ({g.const(qdq.input[1]).size} "
                f"scales); onnxruntime fuses the group into {fused} anyway and {what} "
                "(measured, onnxruntime 1.32): qdq='literal' (--qdq literal) runs the graph as "
                "written")

    def binary(self, node: onnx.NodeProto) -> bool:
        g = self.g
        op = "QLinear" + node.op_type
        if not self.emit(MS, op):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp):
            return False
        a, b, q = grp.dqs[0], grp.dqs[1], grp.qs[0]
        t = _dq_type(g, a)
        if t != _dq_type(g, b) or t != _q_type(g, q) or _bad_width(t):
            return False
        if not _per_tensor(g, a, b, q):
            return False
        inputs = self._dq_inputs(a) + self._dq_inputs(b) + self._q_params(q)
        return self._replace(grp, self._new(grp, op, MS, inputs, [q.output[0]]))

    def concat(self, node: onnx.NodeProto) -> bool:
        g = self.g
        if not self.emit(MS, "QLinearConcat"):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp):
            return False
        t = _dq_type(g, grp.dqs[0])
        if any(_dq_type(g, d) != t for d in grp.dqs) or any(_q_type(g, q) != t for q in grp.qs):
            return False
        if _bad_width(t) or not _per_tensor(g, *grp.dqs):
            return False
        q = grp.qs[0]
        inputs = self._q_params(q)
        for dq in grp.dqs:
            inputs += self._dq_inputs(dq)
        return self._replace(grp, self._new(grp, "QLinearConcat", MS, inputs, [q.output[0]]))

    def where(self, node: onnx.NodeProto) -> bool:
        g = self.g
        if not self.emit(MS, "QLinearWhere"):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp, num_dq=2) or grp.dq_slots != [1, 2]:
            return False
        x, y, q = grp.dqs[0], grp.dqs[1], grp.qs[0]
        t = _dq_type(g, x)
        if t != _dq_type(g, y) or t != _q_type(g, q) or _bad_width(t):
            return False
        self._refuse_per_axis(node, "com.microsoft QLinearWhere", (x, y, q))
        inputs = [node.input[0]] + self._dq_inputs(x) + self._dq_inputs(y) + self._q_params(q)
        return self._replace(grp, self._new(grp, "QLinearWhere", MS, inputs, [q.output[0]]))

    def conv(self, node: onnx.NodeProto) -> bool:
        g = self.g
        if not self.emit("", "QLinearConv"):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp) or not grp.qs:
            return False
        if grp.dq_slots[:2] != [0, 1]:
            return False
        x, w, q = grp.dqs[0], grp.dqs[1], grp.qs[0]
        tx, tw, ty = _dq_type(g, x), _dq_type(g, w), _q_type(g, q)
        if tx != ty or tw in _INT4:
            return False
        if tx == _T.INT8 and (not self.int8_allowed or tw != tx):
            return False
        if tx in _INT16 or tw in _INT16:
            return False
        inputs = self._dq_inputs(x) + self._dq_inputs(w) + self._q_params(q)
        if len(grp.dqs) == 3:
            b = grp.dqs[2]
            if _dq_type(g, b) != _T.INT32 or not self._bias_scale_ok(x, w, b):
                return False
            inputs.append(b.input[0])
        self._refuse_per_axis(node, "QLinearConv", (x, q))  # the weight's DQ may be per channel
        return self._replace(grp, self._new(grp, "QLinearConv", "", inputs, [q.output[0]]))

    def _bias_scale_ok(self, x: onnx.NodeProto, w: onnx.NodeProto, b: onnx.NodeProto) -> bool:
        """onnxruntime 1.32 fuses a Conv with a bias only when the bias DQ scale is close to
        x_scale * w_scale: |b - x*w| <= 1e-6 + 0.01 * |x*w| for every channel (measured by
        bisection at three magnitudes, docs/qdq.md); the fused kernel then ignores the bias
        scale."""
        g = self.g
        sx, sw, sb = g.const(x.input[1]), g.const(w.input[1]), g.const(b.input[1])
        if sx is None or sw is None or sb is None:
            return True  # nothing to compare (non-constant scales); onnxruntime fuses
        expect = np.float32(sx.reshape(-1)[0]) * sw.astype(np.float32).reshape(-1)
        got = sb.astype(np.float32).reshape(-1)
        if got.size not in (1, expect.size):
            return False
        return bool(np.all(np.abs(got - expect) <= BIAS_SCALE_ATOL + BIAS_SCALE_RTOL * np.abs(expect)))

    def matmul(self, node: onnx.NodeProto) -> bool:
        g = self.g
        grp = _select(g, node)
        if grp is None or len(grp.dqs) != 2:
            return False
        a, b = grp.dqs
        ta, tb = _dq_type(g, a), _dq_type(g, b)
        if ta == _T.INT8 and (not self.int8_allowed or tb != ta):
            return False
        if ta in _INT16 or tb in _INT16 or ta in _INT4 or tb in _INT4:
            return False
        if grp.qs:
            if not self.emit("", "QLinearMatMul"):
                return False
            if not _check_qdq_nodes(g, grp) or _q_type(g, grp.qs[0]) != ta:
                return False
            if not (_params_fit_the_product(g, a, None) and _params_fit_the_product(g, b, 1)
                    and _per_tensor(g, grp.qs[0])):
                return False
            q = grp.qs[0]
            inputs = self._dq_inputs(a) + self._dq_inputs(b) + self._q_params(q)
            return self._replace(grp, self._new(grp, "QLinearMatMul", "", inputs, [q.output[0]]))
        if not self.emit(MS, "MatMulIntegerToFloat"):
            return False
        za, zb = self._zp(a, ta), self._zp(b, tb)
        inputs = [a.input[0], b.input[0], a.input[1], b.input[1], za, zb]
        new = self._new(grp, "MatMulIntegerToFloat", MS, inputs, list(node.output),
                        copy_attrs=False)
        return self._replace(grp, new)

    def gemm(self, node: onnx.NodeProto) -> bool:
        g = self.g
        if not self.emit(MS, "QGemm"):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp, empty_q_ok=True):
            return False
        a, b = grp.dqs[0], grp.dqs[1]
        ta, tb = _dq_type(g, a), _dq_type(g, b)
        if ta == _T.INT8 and tb != ta:
            return False
        if grp.qs and _q_type(g, grp.qs[0]) != ta:
            return False
        if _bad_width(ta) or _bad_width(tb):
            return False
        n_axis = 0 if int(_attr(node, "transB", 0)) else 1  # B's axis along the product's columns
        if not (_params_fit_the_product(g, a, None) and _params_fit_the_product(g, b, n_axis)
                and _per_tensor(g, *grp.qs)):
            return False
        inputs = self._dq_inputs(a) + self._dq_inputs(b)
        if len(grp.dqs) == 3:
            c = grp.dqs[2]
            if float(_attr(node, "beta", 1.0)) != 1.0 or _dq_type(g, c) != _T.INT32:
                return False
            # measured: onnxruntime 1.32 fuses a Gemm with a bias only when alpha is 1 (its bias
            # scale is not compared with x_scale * w_scale, unlike Conv's)
            if float(_attr(node, "alpha", 1.0)) != 1.0:
                return False
            inputs.append(c.input[0])
        elif grp.qs:
            inputs.append("")
        if grp.qs:
            q = grp.qs[0]
            inputs += self._q_params(q)
            outputs = [q.output[0]]
        else:
            outputs = list(node.output)
        attrs = {k: _attr(node, k) for k in ("alpha", "transA", "transB")
                 if _attr(node, k) is not None}
        new = self._new(grp, "QGemm", MS, inputs, outputs, attrs, copy_attrs=False)
        return self._replace(grp, new)


def node_groups(g: _Graph, int8_allowed: bool, emit: Callable[[str, str], bool]) -> None:
    """Visit the nodes once in graph (topological) order, as onnxruntime does, and rewrite each
    node group whose selector matches. Nodes removed by an earlier rewrite are skipped."""
    rules = _Rules(g, int8_allowed, emit)
    for node in list(g.nodes):
        if g.has(node):
            rules.apply(node)


# --------------------------------------------------------------------------- entry point


def fuse_qdq(model: onnx.ModelProto, *, int8_allowed: bool = False,
             ops: Optional[Iterable[tuple[str, str]]] = None,
             double_qdq: bool = True) -> onnx.ModelProto:
    """The model as onnxruntime 1.32's CPU session runs it: QDQ node groups fused.

    ``int8_allowed`` is onnxruntime's ``QDQIsInt8Allowed()`` (False on x86, True on ARM).
    ``ops`` is the set of (domain, op_type) the result may contain among :data:`FUSED_OPS`
    (default: all). ``double_qdq`` runs DoubleQDQPairsRemover (onnxruntime's default; the
    session option ``session.disable_double_qdq_remover=1`` turns it off).
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"fuse_qdq: model must be an onnx.ModelProto, got {type(model).__name__}")
    allowed = FUSED_OPS if ops is None else frozenset((d if d != "ai.onnx" else "", o)
                                                      for d, o in ops)
    emit = lambda domain, op: (domain, op) in allowed  # noqa: E731
    g = _Graph(model)
    ensure_unique_dq(g)  # onnxruntime runs it once before the level-1 optimizers
    fold_constants(g)
    fuse_reshape_shape(g)
    fuse_consecutive_reshapes(g)
    remove_dead_nodes(g)
    if double_qdq:
        remove_double_qdq(g)
    propagate_qdq(g)
    quantize_bias(g)
    fold_constants(g)  # Q/DQ pairs inserted on initializers
    remove_dead_nodes(g)
    ensure_unique_dq(g)
    remove_relu_clip(g)
    if not int8_allowed:
        s8_to_u8(g)
    node_groups(g, int8_allowed, emit)
    return g.to_model()


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
    if _attr(dq, "block_size", 0) or _attr(dq, "output_dtype", 0) not in (0, _T.FLOAT):
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
    if tx not in (_T.UINT8, _T.INT8):
        return None
    x_dt = np.uint8 if tx == _T.UINT8 else np.int8

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
    qmin, qmax = (0, 255) if x_dt == np.uint8 else (-128, 127)
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
            rest = [helper.make_node("Cast", [acc], [accf], to=_T.FLOAT),
                    helper.make_node("Mul", [accf, mult_name], [scaled]),
                    helper.make_node("Add", [scaled, bias_name], [conv.output[0]])]
            g.types[accf] = g.types[scaled] = _T.FLOAT
        g.types[acc] = _T.INT32
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
    if _attr(q, "block_size", 0) or _attr(q, "output_dtype", 0) not in (0, _T.UINT8, _T.INT8):
        return False
    s = g.const(q.input[1])
    if not _scalar(s) or s.dtype != np.float32 or not (np.isfinite(s).all() and (s > 0).all()):
        return False
    if len(q.input) > 2 and q.input[2]:
        z = g.const(q.input[2])
        if not _scalar(z) or z.dtype not in (np.uint8, np.int8):
            return False
        odt = _attr(q, "output_dtype", 0)
        return not odt or odt == helper.np_dtype_to_tensor_dtype(z.dtype)
    return _attr(q, "output_dtype", 0) != _T.INT8  # an int8 zero point would be needed (rare)


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
