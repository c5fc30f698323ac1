"""qlinear.graph.proto: the one subgraph walker, the one topological sort, node attributes, and
the one auto_pad resolver (qlinear._geometry.explicit_pads) in both of its modes."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from qlinear._geometry import explicit_pads  # noqa: E402
from qlinear.graph import proto  # noqa: E402


def _if_model():
    """A graph with an If whose branches read an outer tensor, an initializer, a sparse
    initializer whose values live in an external file, and a Constant node's tensor."""
    deep = helper.make_graph([helper.make_node("Identity", ["deep"], ["d"], name="deep_id")], "deep", [],
                             [helper.make_tensor_value_info("d", T.FLOAT, None)])
    then = helper.make_graph([helper.make_node("Identity", ["outer"], ["t"], name="then_id"),
                              helper.make_node("If", ["c"], ["t2"], name="inner_if", then_branch=deep,
                                               else_branch=deep)], "then", [],
                             [helper.make_tensor_value_info("t", T.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["outer"], ["e"], name="else_neg")], "else", [],
                              [helper.make_tensor_value_info("e", T.FLOAT, None)])
    values = numpy_helper.from_array(np.ones(2, np.float32), "sp")
    values.data_location = T.EXTERNAL
    values.ClearField("raw_data")
    values.external_data.add(key="location", value="../outside.bin")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 3], np.int64), "sp_i"), [4])
    nodes = [
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other),
        helper.make_node("Relu", ["x"], ["outer"], name="relu"),  # listed after its reader
        helper.make_node("Constant", [], ["k"], name="const",
                         value=numpy_helper.from_array(np.zeros(1, np.float32), "k_value")),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2]),
                                           helper.make_tensor_value_info("c", T.BOOL, [])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.zeros(1, np.float32), "init")],
                              sparse_initializer=[sparse])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_one_walker_sees_subgraphs_reads_and_every_tensor():
    m = _if_model()
    # (make_node sorts attributes by name: else_branch comes before then_branch)
    assert [(n.name, i) for n, i in proto.walk_nodes(m.graph)] == [
        ("if", 0), ("else_neg", 0), ("then_id", 0), ("inner_if", 1), ("deep_id", 0), ("deep_id", 0),
        ("relu", 1), ("const", 2)]
    assert [g.name for g in proto.graphs(m.graph)] == ["g", "else", "then", "deep", "deep"]
    assert proto.subgraph_reads(m.graph.node[0]) == {"outer", "c", "deep"}  # nested bodies too
    # sparse initializers' values and indices are tensors that may name an external file:
    # the walker gives them to every external-data check (decided in the walkers' merge)
    names = [t.name for t in proto.graph_tensors(m.graph)]
    assert names == ["init", "sp", "sp_i", "k_value"]


def test_one_topological_sort_keeps_the_given_order_where_it_can():
    m = _if_model()
    # the If reads "outer" through its branches: it waits for the Relu listed after it
    assert proto.topological_order(m.graph.node) == [1, 0, 2]
    assert proto.topological_order(m.graph.node, known={"outer"}) is None  # already in order
    ordered = proto.topologically_sorted(m)
    assert [n.name for n in ordered.graph.node] == ["relu", "if", "const"]
    assert proto.topologically_sorted(ordered) is ordered
    a = helper.make_node("Relu", ["b_out"], ["a_out"], name="a")
    b = helper.make_node("Relu", ["a_out"], ["b_out"], name="b")
    with pytest.raises(ValueError, match="^the nodes form a cycle: node 'a' waits for node 'b'"):
        proto.topological_order([a, b])


def test_node_attributes_decode_text_and_name_what_is_not_utf8():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", auto_pad="SAME_UPPER", strides=[2, 1])
    assert proto.node_attributes(node) == {"auto_pad": "SAME_UPPER", "strides": [2, 1]}
    node.attribute[0].s = b"\xff\xfe"
    with pytest.raises(ValueError, match="^node 'c' \\(Conv\\): attribute 'auto_pad' is not valid UTF-8"):
        proto.node_attributes(node)


@pytest.mark.parametrize("n, k, s, d", [(7, 3, 2, 1), (8, 3, 2, 1), (5, 2, 3, 1), (6, 1, 4, 1), (9, 3, 1, 2),
                                        (1, 5, 1, 1), (4, 4, 4, 1)])
def test_explicit_pads_onnx_and_onnxruntime_pool_splits(n, k, s, d):
    out = -(-n // s)
    for auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # the ONNX pages: the dilated extent, never negative, the odd pixel at the end (UPPER)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        (b,), (e,) = explicit_pads([n], [k], [s], [d], auto_pad)
        assert b + e == total and b >= 0 and e >= 0
        assert (e - b) == (total % 2 if auto_pad == "SAME_UPPER" else -(total % 2))
        # onnxruntime's PoolAttributes: the undilated kernel, not clamped, C's truncating split
        total = (out - 1) * s + k - n
        (b,), (e,) = explicit_pads([n], [k], [s], [d], auto_pad, split="onnxruntime-pool")
        half = total / 2 if auto_pad == "SAME_UPPER" else (total + 1) / 2
        assert b == int(half) and e == total - b  # int() truncates toward zero, as C does
    assert explicit_pads([n], [k], [s], [d], "VALID", [1, 1]) == ([0], [0])
    assert explicit_pads([n], [k], [s], [d], "NOTSET", [1, 2]) == ([1], [2])
    assert explicit_pads([n], [k], [s], [d], "NOTSET", None) == ([0], [0])


def test_explicit_pads_refuses_an_unknown_auto_pad_or_split():
    with pytest.raises(ValueError, match="auto_pad must be one of NOTSET, SAME_UPPER, SAME_LOWER, VALID; got 'SAME'"):
        explicit_pads([4], [3], [1], [1], "SAME")
    with pytest.raises(ValueError, match="split must be"):
        explicit_pads([4], [3], [1], [1], "SAME_UPPER", split="tf")
