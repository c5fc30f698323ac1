"""The passes' view of a graph being rewritten (``_Graph``: producers, consumers, constants,
element types; nodes removed and inserted) and the node tests every pass shares."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

import onnx
from onnx import helper, numpy_helper


from .. import dtypes
from ..contrib.schema import ATTRIBUTES
from ..graph.proto import T, elem_types, subgraph_reads, topological_order


MS = "com.microsoft"
#: Quantized operators: the input holding the output zero point (its type is the output's).
_OUTPUT_ZP_INPUT = {"QLinearConv": 7, "QLinearMatMul": 7, "QLinearAdd": 7, "QLinearMul": 7,
                    "QLinearConcat": 1, "QLinearWhere": 8, "QLinearSigmoid": 4,
                    "QLinearLeakyRelu": 4, "QLinearSoftmax": 4, "QLinearAveragePool": 4,
                    "QLinearGlobalAveragePool": 4, "QGemm": 8}

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
# the type facts, by ONNX element type (qlinear.dtypes)
_INT16 = dtypes.SIXTEEN_BIT_ONNX
# the types no fusion takes: 4- and 2-bit integers and the float formats (onnxruntime's QDQ
# selectors fuse 8- and 16-bit integers; these pairs run as written)
_INT4 = dtypes.NARROW_ONNX
#: The sub-byte integers' minimum (a Relu before a Q whose zero point is it changes nothing).
_SUB_BYTE_MIN = {elem: lo for elem, (lo, _) in dtypes.ONNX_INT_RANGE.items()
                 if elem in dtypes.NARROW_ONNX}


class QDQRefusal(ValueError):
    """A QDQ group that onnxruntime's optimizer rewrites into something other than the model's
    arithmetic, which qlinear does not reproduce (the message says what and why)."""


def _refuse_attributes_the_fused_node_lacks(node: onnx.NodeProto, fused: str) -> None:
    """QDQRefusal when ``node`` has an attribute the com.microsoft operator ``fused`` does not
    (AveragePool-19's ``dilations`` for QLinearAveragePool). Measured (onnxruntime 1.32):
    onnxruntime fuses the group anyway, copying the attributes, and its session then fails to
    load ('Unrecognized attribute: dilations for operator QLinearAveragePool'); qlinear's fused
    kernel would ignore the attribute and answer an undilated pool."""
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
        self.pinned = set(self.outputs).union(*(subgraph_reads(n) for n in g.node))
        self.types: dict[str, int] = elem_types(model)
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
                    used |= subgraph_reads(n)
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
    try:
        order = topological_order(nodes, known)
    except ValueError:  # a cycle: cannot happen for a valid input; keep the order
        return list(nodes)
    return list(nodes) if order is None else [nodes[k] for k in order]


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    n = onnx.NodeProto()
    n.CopyFrom(node)
    return n


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
    return odt or T.UINT8


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


def _granularity(g: _Graph, node: onnx.NodeProto) -> str:
    """How a QuantizeLinear's or DequantizeLinear's parameters apply: "tensor" (one scale),
    "blocked" (``block_size`` > 0), "axis" (a 1-D scale along ``axis``), or "unknown" (the
    scale is not a constant)."""
    scale = g.const(node.input[1]) if len(node.input) > 1 else None
    if scale is None:
        return "unknown"
    if scale.size == 1 and not _attr(node, "block_size", 0):
        return "tensor"
    return "blocked" if _attr(node, "block_size", 0) else "axis"


def _granularity_words(g: _Graph, node: onnx.NodeProto) -> str:
    """The granularity in a sentence: "per axis (6 scales)", "blocked (block_size 16)"."""
    kind = _granularity(g, node)
    if kind == "blocked":
        return f"blocked (block_size {_attr(node, 'block_size', 0)}, scale shape {list(g.const(node.input[1]).shape)})"
    if kind == "axis":
        return f"per axis ({g.const(node.input[1]).size} scales)"
    return "per tensor" if kind == "tensor" else "of non-constant parameters"
