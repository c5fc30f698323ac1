"""The node groups (onnxruntime's QDQSelectorActionTransformer): each DQ -> op -> Q group
selected and rewritten into its integer operator, or its Q/DQ pairs dropped."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

import onnx
from onnx import helper


from .. import dtypes
from ..graph.proto import T
from .graph_edit import DROP_QDQ_OPS, MS, QDQRefusal, _Graph, _INT16, _INT4, _SUB_BYTE_MIN, _attr, _const_scalar_params, _copy, _is, _is_dq, _is_q, _n_actual, _q_output_type, _qdq_pair_supported, _refuse_attributes_the_fused_node_lacks, _scalar, _granularity, _granularity_words
from .qdq_pairs import BIAS_SCALE_ATOL, BIAS_SCALE_RTOL, _clip_redundant


#: The operators the fusion can emit, as (domain, op_type).
FUSED_OPS: frozenset[tuple[str, str]] = frozenset({
    ("", "QLinearConv"), ("", "QLinearMatMul"), (MS, "MatMulIntegerToFloat"), (MS, "QGemm"),
    (MS, "QLinearAdd"), (MS, "QLinearMul"), (MS, "QLinearSigmoid"), (MS, "QLinearLeakyRelu"),
    (MS, "QLinearSoftmax"), (MS, "QLinearAveragePool"), (MS, "QLinearGlobalAveragePool"),
    (MS, "QLinearConcat"), (MS, "QLinearWhere"),
})
_SUB_BYTE = frozenset(_SUB_BYTE_MIN)  # 4- and 2-bit integers
_UNARY = {"AveragePool", "LeakyRelu", "GlobalAveragePool", "Sigmoid", "Softmax"}
_BINARY = {"Add", "Mul"}


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
    if scale is None or (scale.size == 1 and not _attr(dq, "block_size", 0)):
        return True
    data = g.const(dq.input[0])
    if column_axis is None or data is None or data.ndim != 2 or _attr(dq, "block_size", 0):
        return False  # measured: a blocked weight (any axis) leaves the group in float
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
        dt = np.int8 if data_type == T.INT8 else np.uint8
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
        if t_in != t_out or (t_in in _INT4 and not (positive and t_in in _SUB_BYTE)) or \
                (t_in in _INT16 and not allow16):
            return False
        if positive:
            s = g.const(q.input[1]) if len(q.input) > 1 else None
            if not _scalar(s) or not float(s.reshape(-1)[0]) > 0:
                return False
        if not _qdq_pair_supported(g, q, dq):
            return False
        if positive and t_in in _SUB_BYTE:
            raise QDQRefusal(
                f"{node.op_type} {node.name or node.output[0]!r}: onnxruntime 1.32 drops the "
                f"{dtypes.from_onnx(t_in).name} QuantizeLinear/DequantizeLinear pair around it, which "
                f"leaves a {node.op_type} on {dtypes.from_onnx(t_in).name} data that the operator does not "
                "take, and its session then fails to load ('Type Error', measured): qdq='literal' "
                "(--qdq literal) runs the graph as written")
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
                f"{qdq.name or qdq.output[0]!r} is {_granularity_words(g, qdq)}; onnxruntime fuses the group into {fused} anyway and {what} "
                "(measured, onnxruntime 1.32): qdq='literal' (--qdq literal) runs the graph as "
                "written")

    def _refuse_weight_not_per_channel(self, node: onnx.NodeProto, w: onnx.NodeProto) -> None:
        """QDQRefusal when a Conv's weight DequantizeLinear is blocked, or per axis along
        another axis than the output channels (0). Measured (onnxruntime 1.32): such a group
        is fused into QLinearConv anyway, which then fails when it runs ('filter scale shape
        invalid'); qlinear's fused node would fail on a node the model does not have."""
        g = self.g
        kind = _granularity(g, w)
        axis = int(_attr(w, "axis", 1))
        data = g.const(w.input[0])
        if kind == "axis" and data is not None and axis % data.ndim == 0:
            return
        if kind in ("blocked", "axis"):
            raise QDQRefusal(
                f"{node.op_type} {node.name or node.output[0]!r}: its weight's DequantizeLinear "
                f"{w.name or w.output[0]!r} is {_granularity_words(g, w)}; onnxruntime fuses the group "
                "into QLinearConv anyway, which takes one scale per output channel, and its session "
                "then fails when it runs ('filter scale shape invalid', measured, onnxruntime 1.32): "
                "qdq='literal' (--qdq literal) runs the graph as written")

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
        if tx == T.INT8 and (not self.int8_allowed or tw != tx):
            return False
        if tx in _INT16 or tw in _INT16:
            return False
        inputs = self._dq_inputs(x) + self._dq_inputs(w) + self._q_params(q)
        if len(grp.dqs) == 3:
            b = grp.dqs[2]
            if _dq_type(g, b) != T.INT32 or not self._bias_scale_ok(x, w, b):
                return False
            inputs.append(b.input[0])
        self._refuse_per_axis(node, "QLinearConv", (x, q))  # the weight's DQ may be per channel
        self._refuse_weight_not_per_channel(node, w)
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
        if ta == T.INT8 and (not self.int8_allowed or tb != ta):
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
        self._refuse_weight_not_per_column(node, b)
        za, zb = self._zp(a, ta), self._zp(b, tb)
        inputs = [a.input[0], b.input[0], a.input[1], b.input[1], za, zb]
        new = self._new(grp, "MatMulIntegerToFloat", MS, inputs, list(node.output),
                        copy_attrs=False)
        return self._replace(grp, new)

    def _refuse_weight_not_per_column(self, node: onnx.NodeProto, b: onnx.NodeProto) -> None:
        """QDQRefusal when the constant 2-D weight of a MatMul without Q is quantized blocked or
        along K (axis 0). Measured (onnxruntime 1.32): the group becomes MatMulIntegerToFloat
        anyway, which reads a non-scalar weight scale as one per column: the session fails
        when it runs ('Per-column quantization parameter ...'), or, when K equals N, answers
        with the row scales applied to the columns."""
        g = self.g
        data = g.const(b.input[0])
        kind = _granularity(g, b)
        if data is None or data.ndim != 2 or kind not in ("axis", "blocked"):
            return
        if kind == "axis" and int(_attr(b, "axis", 1)) % 2 == 1:
            return
        what = ("answers with those scales applied to its columns, which is not the model's arithmetic"
                if kind == "axis" and data.shape[0] == data.shape[1] else "its session then fails when it runs")
        raise QDQRefusal(
            f"{node.op_type} {node.name or node.output[0]!r}: its weight's DequantizeLinear "
            f"{b.name or b.output[0]!r} is {_granularity_words(g, b)}; onnxruntime fuses the group into "
            f"com.microsoft MatMulIntegerToFloat anyway, which takes one scale per column, and {what} "
            "(measured, onnxruntime 1.32): qdq='literal' (--qdq literal) runs the graph as written")

    def gemm(self, node: onnx.NodeProto) -> bool:
        g = self.g
        if not self.emit(MS, "QGemm"):
            return False
        grp = _select(g, node)
        if grp is None or not _check_qdq_nodes(g, grp, empty_q_ok=True):
            return False
        a, b = grp.dqs[0], grp.dqs[1]
        ta, tb = _dq_type(g, a), _dq_type(g, b)
        if ta == T.INT8 and tb != ta:
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
            if float(_attr(node, "beta", 1.0)) != 1.0 or _dq_type(g, c) != T.INT32:
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
