"""ONNX proto helpers shared by the graph runtime and the passes: operator versions, node
attributes, element types, the one subgraph walker and the one topological sort."""

from __future__ import annotations

import heapq
from typing import Any, Iterable, Iterator

import onnx
from onnx import helper

T = onnx.TensorProto

# --------------------------------------------------------------------------- nodes


def node_version(op_type: str, domain: str, opset: int) -> int | None:
    """The ``since_version`` of the schema that an ``opset`` import selects, or None."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except Exception:  # SchemaError: no such operator at that opset
        return None


def node_label(node: onnx.NodeProto, index: int) -> str:
    name = node.name or f"#{index} {node.op_type}"
    return name if isinstance(name, str) else repr(name)  # bytes: a name that is not UTF-8


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name, text decoded; a text that is not UTF-8 is a ValueError
    naming node and attribute (check_model refuses such a node before anything runs)."""
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            try:
                v = v.decode()
            except UnicodeDecodeError:
                raise ValueError(f"node {node.name or node.op_type!r} ({node.op_type}): attribute "
                                 f"{a.name!r} is not valid UTF-8 text ({v[:20]!r})") from None
        out[a.name] = v
    return out


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every tensor shape inference can type (best effort)."""
    return types_and_shapes(model)[0]


def types_and_shapes(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Element types of every tensor shape inference can type, and the shapes it (or an
    initializer) fixes completely (best effort: unknown tensors are absent)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    g = inferred.graph
    types, shapes = {}, {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.elem_type:
            types[vi.name] = t.elem_type
        if vi.type.HasField("tensor_type") and t.HasField("shape") and \
                all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    for init in g.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = tuple(init.dims)
    return types, shapes


# --------------------------------------------------------------------------- subgraphs
# One walker: ``subgraphs`` (a node's If/Loop/Scan bodies) is the only place that reads
# GRAPH/GRAPHS attributes; the walks over nodes, graphs, reads and tensors are built on it.


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds as attributes (If branches, Loop and Scan bodies)."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def walk_nodes(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, int]]:
    """Every node with its index in its own graph, each followed by its subgraphs' nodes."""
    for i, node in enumerate(graph.node):
        yield node, i
        for g in subgraphs(node):
            yield from walk_nodes(g)


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for g in subgraphs(node):
            yield from graphs(g)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name the subgraphs of ``node`` (If, Loop, Scan bodies, nested) read."""
    names: set[str] = set()
    for g in subgraphs(node):
        for inner in g.node:
            names.update(inner.input)
            names |= subgraph_reads(inner)
    return names


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph holds, in subgraphs as well: initializers, the values and indices
    of sparse initializers, and tensor attributes.

    Sparse initializers are included (one of the two walkers this replaces left them out):
    their values and indices are TensorProtos that may keep their data in an external file,
    so every check of external data (where it lives, whether it was read, its declared size)
    must see them too."""
    for g in graphs(graph):
        yield from g.initializer
        for sparse in g.sparse_initializer:
            for part in ("values", "indices"):
                if sparse.HasField(part):  # an absent part is no tensor (not an empty one)
                    yield getattr(sparse, part)
        for node in g.node:
            yield from _attribute_tensors(node)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    """The tensors a node's attributes hold: tensors, and the values and indices of sparse
    tensors (a Constant's ``sparse_value``: they too may keep their data in an external
    file, which onnx would otherwise read relative to the current directory)."""
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        for sparse in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + \
                list(a.sparse_tensors):
            for part in ("values", "indices"):
                if sparse.HasField(part):
                    yield getattr(sparse, part)


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """:func:`graph_tensors` of the main graph, then the tensors of every model-local function
    (its nodes' tensor attributes, e.g. a Constant's, and their subgraphs')."""
    yield from graph_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            yield from _attribute_tensors(node)
            for g in subgraphs(node):
                yield from graph_tensors(g)


# --------------------------------------------------------------------------- order


def topological_order(nodes: Iterable[onnx.NodeProto], known: Iterable[str] = ()) -> list[int] | None:
    """A topological order of ``nodes`` (indices), each after the producers of what it or its
    subgraphs read (names in ``known`` wait for nothing), keeping the given order wherever it
    is one (the earliest listed ready node first); None when the given order is one.
    ValueError naming two nodes of a cycle."""
    nodes = list(nodes)
    known = set(known)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waits = [{producer[name] for name in set(n.input) | subgraph_reads(n)
              if name in producer and name not in known and producer[name] != i}
             for i, n in enumerate(nodes)]
    if all(j < i for i, w in enumerate(waits) for j in w):
        return None
    readers: list[list[int]] = [[] for _ in nodes]
    for i, w in enumerate(waits):
        for j in w:
            readers[j].append(i)
    pending = [len(w) for w in waits]
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers[i]:
            pending[r] -= 1
            if pending[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(nodes):
        stuck = next(i for i, c in enumerate(pending) if c)
        other = next(j for j in sorted(waits[stuck]) if pending[j])
        raise ValueError(f"the nodes form a cycle: node {node_label(nodes[stuck], stuck)!r} "
                         f"waits for node {node_label(nodes[other], other)!r}, which waits for "
                         "it (directly or through others)")
    return order


def _out_of_order(graph: onnx.GraphProto) -> bool:
    return topological_order(graph.node) is not None or any(
        _out_of_order(g) for n in graph.node for g in subgraphs(n))


def _sort_nodes(graph: onnx.GraphProto) -> None:
    for n in graph.node:
        for g in subgraphs(n):
            _sort_nodes(g)
    order = topological_order(graph.node)
    if order is not None:
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes (and its subgraphs') in topological order, as onnxruntime
    sorts them before it runs a graph listed out of order (onnx requires the order, and
    onnx.reference relies on it); ``model`` itself, not a copy, when they already are.
    ValueError naming two nodes of a cycle."""
    if not _out_of_order(model.graph):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _sort_nodes(copy.graph)
    return copy
