"""The newer quantization formats in the model tools: what a model's QuantizeLinear and
DequantizeLinear nodes use (``qlinear inspect``), what onnxruntime 1.32 cannot run, and the
known divergences of onnxruntime and onnx.reference from qlinear's contract that ``qlinear
compare`` names per node (the facts: ../shared/FORMATS.md part B, docs/contract.md).

Layer: tools (imports onnx, NumPy and qlinear's type registry; never onnxruntime).
"""

from __future__ import annotations

import collections
from typing import Any, Optional

import numpy as np
import onnx
from onnx import helper

from qlinear import dtypes
from qlinear.graph.proto import types_and_shapes, walk_nodes

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_T = onnx.TensorProto
#: Types onnxruntime 1.32 has no QuantizeLinear/DequantizeLinear kernel for, at any version.
_ORT_NEVER = {_T.BFLOAT16: "bfloat16", _T.FLOAT4E2M1: "float4e2m1", _T.FLOAT6E2M3: "float6e2m3",
              _T.FLOAT6E3M2: "float6e3m2", _T.FLOAT8E8M0: "float8e8m0"}
_F8 = {_T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2, _T.FLOAT8E5M2FNUZ}


def _name(elem: int) -> str:
    if not elem:
        return "?"
    try:
        return dtypes.from_onnx(elem).name
    except (KeyError, ValueError):
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem)))


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _version(node: onnx.NodeProto, opsets: dict[str, int]) -> Optional[int]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if domain == "com.microsoft":
        return 1
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 0), domain).since_version
    except Exception:
        return None


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if d.domain == "ai.onnx" else d.domain): d.version for d in model.opset_import}


def _types_and_shapes(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, tuple]]:
    """Element types and fixed shapes, from onnx's shape inference for a model without
    model-local functions; with functions (which shape inference expands, exponentially for
    a fan-out of calls: the hostile-model tests), only what the model declares: initializers,
    inputs, outputs, value_info, and each QuantizeLinear's output type."""
    if not model.functions:
        return types_and_shapes(model)
    types: dict[str, int] = {}
    shapes: dict[str, tuple] = {}
    for g in (model.graph,):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name], shapes[t.name] = t.data_type, tuple(t.dims)
    for node, _ in walk_nodes(model.graph):
        if node.op_type == "QuantizeLinear" and node.output:
            types.setdefault(node.output[0], _quantized_type(node, types))
    return types, shapes


def _has_quantization(model: onnx.ModelProto) -> bool:
    return any(n.op_type in _QDQ + ("QLinearMatMul",) for n, _ in walk_nodes(model.graph))


def _quantized_type(node: onnx.NodeProto, types: dict[str, int]) -> int:
    """The quantized (integer or narrow float) type of a Q's output or a DQ's input."""
    if node.op_type == "DequantizeLinear":
        return types.get(node.input[0], 0)
    odt = _attr(node, "output_dtype", 0)
    if odt:
        return odt
    if len(node.input) > 2 and node.input[2]:
        return types.get(node.input[2], 0)
    return _T.UINT8


def _granularity(node: onnx.NodeProto, shapes: dict[str, tuple]) -> str:
    block = int(_attr(node, "block_size", 0) or 0)
    shape = shapes.get(node.input[1]) if len(node.input) > 1 else None
    axis = int(_attr(node, "axis", 1))
    if block:
        return f"blocked, axis {axis}, block {block}" + (f", scale {list(shape)}" if shape is not None else "")
    if shape is None:
        return "unknown (scale not constant)"
    if int(np.prod(shape)) == 1:
        return "per tensor"
    return f"per axis {axis} ({int(np.prod(shape))} scales)"


def quantization_summary(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """One row per distinct (operator, domain, version, quantized type, scale type, output type,
    granularity, attributes) among the model's QuantizeLinear/DequantizeLinear nodes (subgraphs
    included), with the node count: what ``qlinear inspect`` lists."""
    if not _has_quantization(model):
        return []
    types, shapes = _types_and_shapes(model)
    opsets = _opsets(model)
    rows: collections.Counter = collections.Counter()
    for node, _ in walk_nodes(model.graph):
        if node.op_type not in _QDQ or node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        qt = _quantized_type(node, types)
        st = types.get(node.input[1], 0) if len(node.input) > 1 else 0
        if node.op_type == "DequantizeLinear":
            out = _attr(node, "output_dtype", 0) or (_T.FLOAT if st == _T.FLOAT8E8M0 else st)
        else:
            out = qt
        attrs = []
        if node.op_type == "QuantizeLinear" and qt in _F8:
            attrs.append(f"saturate={int(_attr(node, 'saturate', 1))}")
        if _attr(node, "precision", 0):
            attrs.append(f"precision={_name(_attr(node, 'precision'))}")
        if _attr(node, "output_dtype", 0):
            attrs.append(f"output_dtype={_name(_attr(node, 'output_dtype'))}")
        if st == _T.FLOAT8E8M0:
            attrs.append("e8m0 scale")
        key = (node.op_type, "com.microsoft" if node.domain == "com.microsoft" else "ai.onnx",
               _version(node, opsets), _name(qt), _name(st),
               _name(types.get(node.input[0], 0) if node.op_type == "QuantizeLinear" else out),
               _granularity(node, shapes), ", ".join(attrs))
        rows[key] += 1
    keys = ("op_type", "domain", "version", "type", "scale", "float", "granularity", "attributes")
    return [{**dict(zip(keys, k)), "nodes": n}
            for k, n in sorted(rows.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]


# --------------------------------------------------------------------------- onnxruntime 1.32


def onnxruntime_cannot_run(model: onnx.ModelProto) -> list[str]:
    """Why onnxruntime 1.32 cannot run the model's QuantizeLinear/DequantizeLinear and
    QLinearMatMul nodes (measured over 5,016 one-node models, ../shared/FORMATS.md §6), one
    sentence per distinct reason; empty when it has the kernels."""
    if not _has_quantization(model):
        return []
    types, _ = _types_and_shapes(model)
    opsets = _opsets(model)
    reasons: dict[str, None] = {}
    for node, _ in walk_nodes(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        v = _version(node, opsets)
        if node.op_type in _QDQ:
            if v is not None and v >= 28:
                reasons[f"onnxruntime 1.32 has no {node.op_type}-{v} kernel (nothing of opset 28)"] = None
                continue
            used = [types.get(x, 0) for x in node.input if x] + [_quantized_type(node, types)]
            if node.op_type == "DequantizeLinear":
                used.append(_attr(node, "output_dtype", 0))
            for t in used:
                if t in _ORT_NEVER:
                    reasons[f"onnxruntime 1.32 has no {node.op_type} kernel for {_ORT_NEVER[t]}"] = None
            if node.op_type == "QuantizeLinear" and types.get(node.input[0]) == _T.INT32:
                reasons["onnxruntime 1.32 has no QuantizeLinear kernel for an int32 x"] = None
        elif node.op_type == "QLinearMatMul" and v is not None and v >= 21:
            data = [types.get(node.input[i], 0) for i in (0, 3, 7) if i < len(node.input)]
            scales = [types.get(node.input[i], 0) for i in (1, 4, 6) if i < len(node.input)]
            if any(t in _F8 for t in data):
                reasons["onnxruntime 1.32 has no QLinearMatMul-21 kernel for float8 operands"] = None
            if _T.BFLOAT16 in scales:
                reasons["onnxruntime 1.32 has no QLinearMatMul-21 kernel for bfloat16 scales"] = None
    return list(reasons)


def onnxruntime_divergence(node: onnx.NodeProto, values: dict[str, Any]) -> Optional[str]:
    """The documented divergence of onnxruntime 1.32 from the contract that explains this
    node's difference, in one sentence, or None. ``values``: the node's inputs (by name)."""
    if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    x = _value(values, node, 0)
    zp = _value(values, node, 2)
    qt = _elem_of(zp) if zp is not None else _attr(node, "output_dtype", 0)
    if qt not in _F8:
        return None
    if zp is not None and np.any(np.asarray(zp).astype(np.float32) != 0):
        return ("onnxruntime ignores a non-zero float8 zero point (the contract adds it before the "
                "conversion)")
    if int(_attr(node, "saturate", 1)) == 0 and x is not None:
        s = _value(values, node, 1)
        with np.errstate(all="ignore"):
            q = np.abs(np.asarray(x, np.float64) / np.asarray(s, np.float64)) if s is not None else None
        band = {_T.FLOAT8E4M3FN: (480.0, 496.0, "448 instead of NaN"),
                _T.FLOAT8E5M2: (61440.0, 65536.0, "NaN instead of ±inf")}.get(qt)
        if band is not None and q is not None and np.any((q >= band[0]) & (q < band[1])):
            return (f"onnxruntime's saturate=0 {_name(qt)} conversion is wrong for |x / y_scale| in "
                    f"[{band[0]:g}, {band[1]:g}) (gives {band[2]}; its Cast has the same bug)")
    return None


# --------------------------------------------------------------------------- onnx.reference


def reference_divergence(node: onnx.NodeProto, values: dict[str, Any], opsets: dict[str, int]) -> Optional[str]:
    """The documented divergence of onnx.reference from the contract that explains this node's
    difference, in one sentence, or None (../shared/FORMATS.md §3-§5)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    v = _version(node, opsets) or 0
    if node.op_type == "QLinearMatMul":
        if any(_elem_of(_value(values, node, i)) in _F8 for i in (0, 3)):
            return "onnx.reference cannot compute float8 QLinearMatMul (it truncates to int32)"
        return ("onnx.reference multiplies the scales in their own type (float16: two roundings) and "
                "requantizes in float64, where the contract uses float32")
    if node.op_type == "DequantizeLinear":
        x, zp = _value(values, node, 0), _value(values, node, 2)
        if x is not None and zp is not None and np.asarray(x).dtype == np.int32 and np.any(np.asarray(zp) != 0):
            return "onnx.reference subtracts an int32 zero point in float64 (the contract: exactly in integers)"
        if _elem_of(x) == _T.FLOAT4E2M1 and zp is not None:
            return "onnx.reference ignores a float4e2m1 zero point"
        return None
    if node.op_type != "QuantizeLinear":
        return None
    x, s, zp = _value(values, node, 0), _value(values, node, 1), _value(values, node, 2)
    qt = _elem_of(zp) if zp is not None else (_attr(node, "output_dtype", 0) or _T.UINT8)
    reasons = []
    if x is not None and s is not None and qt not in _F8 and qt not in (_T.FLOAT4E2M1, _T.FLOAT6E2M3, _T.FLOAT6E3M2):
        with np.errstate(all="ignore"):
            q = np.asarray(x, np.float64) / np.asarray(s, np.float64)
        if np.any(~np.isfinite(q)) or np.any(np.abs(q) >= 2.0 ** 31):
            reasons.append("onnx.reference casts the quotient to int32 first, so inf, NaN and quotients "
                           "beyond 2^31 wrap to the wrong end (+inf gives the minimum)")
    narrow = {np.dtype(np.float16), np.dtype(dtypes.get("bfloat16").dtype)}
    xs = [np.asarray(a).dtype for a in (x, s) if a is not None]
    if any(d in narrow for d in xs) or _attr(node, "precision", 0):
        reasons.append("onnx.reference divides in NumPy's promoted type (float16 / float16 in float16, "
                       "float32 with float16 in float32), where the contract divides in the precision "
                       f"of version {v} (rounding x and y_scale to it first)")
    if qt in _F8 and zp is not None and np.any(np.asarray(zp).astype(np.float32) != 0):
        reasons.append("onnx.reference ignores a non-zero float8 zero point")
    return "; ".join(reasons) or None


def _value(values: dict[str, Any], node: onnx.NodeProto, i: int):
    if i < len(node.input) and node.input[i]:
        return values.get(node.input[i])
    return None


def _elem_of(a) -> int:
    if a is None:
        return 0
    try:
        return dtypes.get(np.asarray(a).dtype).onnx
    except (KeyError, ValueError, TypeError):
        try:
            return helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype)
        except Exception:
            return 0
