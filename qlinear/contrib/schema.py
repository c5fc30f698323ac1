"""The com.microsoft operators qlinear's graph runtime runs: their input types, attributes and
version, and ``check_node``, what ``check_model`` asks about such a node before anything runs.

A leaf of facts about onnxruntime's schemas (onnx has none for them). It needs onnx (the
tools extra); ``qlinear.contrib`` itself does not import it.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .. import dtypes


DOMAIN = "com.microsoft"
_T = onnx.TensorProto
_EIGHT_BIT = dtypes.EIGHT_BIT_ONNX
_FLOAT = {_T.FLOAT}

# Operator → {input index: allowed element types}, checked where shape inference knows them.
_INPUT_TYPES: dict[str, dict[int, set[int]]] = {
    "QLinearAdd": {0: _EIGHT_BIT, 1: _FLOAT, 3: _EIGHT_BIT, 4: _FLOAT, 6: _FLOAT},
    "QLinearMul": {0: _EIGHT_BIT, 1: _FLOAT, 3: _EIGHT_BIT, 4: _FLOAT, 6: _FLOAT},
    "QLinearSigmoid": {0: _EIGHT_BIT, 1: _FLOAT, 3: _FLOAT},
    "QLinearLeakyRelu": {0: _EIGHT_BIT, 1: _FLOAT, 3: _FLOAT},
    "QLinearConcat": {0: _FLOAT, 1: _EIGHT_BIT},
    "QLinearWhere": {1: _EIGHT_BIT, 2: _FLOAT, 4: _EIGHT_BIT, 5: _FLOAT, 7: _FLOAT},
    "QLinearGlobalAveragePool": {0: _EIGHT_BIT, 1: _FLOAT, 3: _FLOAT},
    "QLinearAveragePool": {0: _EIGHT_BIT, 1: _FLOAT, 3: _FLOAT},
    "QLinearSoftmax": {0: _EIGHT_BIT, 1: _FLOAT, 3: _FLOAT},
    "QGemm": {0: _EIGHT_BIT, 1: _FLOAT, 3: _EIGHT_BIT, 4: _FLOAT, 6: {_T.INT32}, 7: _FLOAT},
    "QLinearConv": {0: _EIGHT_BIT, 1: _FLOAT, 3: _EIGHT_BIT, 4: _FLOAT, 6: _FLOAT, 8: {_T.INT32}},
    "MatMulIntegerToFloat": {0: _EIGHT_BIT, 1: _EIGHT_BIT, 2: _FLOAT, 3: _FLOAT, 6: _FLOAT},
    "DynamicQuantizeMatMul": {0: _FLOAT, 1: _EIGHT_BIT, 2: _FLOAT},
    # (onnxruntime 1.32's contrib kernels take these, float16 and 4-bit included, with the ONNX
    # kernels' arithmetic; float8, 2-bit and int32 outputs are refused, as onnxruntime does)
    "QuantizeLinear": {0: _FLOAT | {_T.FLOAT16}, 1: _FLOAT | {_T.FLOAT16},
                       2: _EIGHT_BIT | {_T.UINT16, _T.INT16, _T.UINT4, _T.INT4}},
    "DequantizeLinear": {0: _EIGHT_BIT | {_T.UINT16, _T.INT16, _T.INT32, _T.UINT4, _T.INT4},
                         1: _FLOAT | {_T.FLOAT16}},
    # The float operators of quantized transformers (within float tolerance, not bit-exact).
    "QAttention": {0: _EIGHT_BIT, 1: _EIGHT_BIT, 2: _FLOAT, 3: _FLOAT, 4: _FLOAT},
    "Attention": {0: _FLOAT, 1: _FLOAT},
    "EmbedLayerNormalization": {0: {_T.INT32}, 2: _FLOAT},
    "SkipLayerNormalization": {0: _FLOAT, 1: _FLOAT},
    "FastGelu": {0: _FLOAT},
    "Gelu": {0: _FLOAT},
    # Weight-only low-bit operators (qlinear.contrib.nbits; onnxruntime's CPU kernel runs A in
    # float32 or float16, not the bfloat16 its schema lists)
    "MatMulNBits": {0: _FLOAT | {_T.FLOAT16}, 1: {_T.UINT8}, 2: _FLOAT | {_T.FLOAT16},
                    3: {_T.UINT8, _T.FLOAT, _T.FLOAT16}, 4: {_T.INT32}, 5: _FLOAT | {_T.FLOAT16}},
    "GatherBlockQuantized": {0: {_T.INT4, _T.UINT4, _T.UINT8, _T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2,
                                 _T.FLOAT8E5M2FNUZ, _T.FLOAT4E2M1},
                             1: {_T.INT32, _T.INT64}, 2: _FLOAT | {_T.FLOAT16, _T.BFLOAT16}},
}

#: The com.microsoft operators (opset 1) the backend runs.
OPS: set[str] = set(_INPUT_TYPES)

#: Each operator's attributes in onnxruntime 1.32's com.microsoft schemas (onnx has no schema
#: for them, so its checker cannot tell): onnxruntime refuses a node with any other, and the
#: kernels would ignore it (QLinearAveragePool's ``dilations``, which it does not have, would
#: be answered as an undilated pool).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "QLinearAdd": (), "QLinearMul": (), "QLinearSigmoid": (), "QLinearWhere": (),
    "QLinearLeakyRelu": ("alpha",), "QLinearConcat": ("axis",),
    "QLinearGlobalAveragePool": ("channels_last",),
    "QLinearAveragePool": ("auto_pad", "ceil_mode", "channels_last", "count_include_pad", "kernel_shape", "pads",
                           "strides"),
    "QLinearSoftmax": ("axis", "opset"), "QGemm": ("alpha", "transA", "transB"),
    "QLinearConv": ("auto_pad", "channels_last", "dilations", "group", "kernel_shape", "pads", "strides"),
    "MatMulIntegerToFloat": (), "DynamicQuantizeMatMul": (),
    "QuantizeLinear": ("axis",), "DequantizeLinear": ("axis",),
    "QAttention": ("do_rotary", "mask_filter_value", "num_heads", "past_present_share_buffer", "scale",
                   "unidirectional"),
    "Attention": ("do_rotary", "mask_filter_value", "num_heads", "past_present_share_buffer", "qkv_hidden_sizes",
                  "rotary_embedding_dim", "scale", "unidirectional"),
    "EmbedLayerNormalization": ("epsilon", "mask_index_type"), "SkipLayerNormalization": ("epsilon",),
    "FastGelu": (), "Gelu": (),
    "MatMulNBits": ("K", "N", "accuracy_level", "bits", "block_size", "weight_prepacked"),
    "GatherBlockQuantized": ("bits", "block_size", "gather_axis", "quantize_axis"),
}


def version(node: onnx.NodeProto) -> int | None:
    """The com.microsoft opset version of an operator qlinear runs (1), None for the others."""
    return 1 if node.op_type in OPS else None


def check_node(node: onnx.NodeProto, types: dict[str, int]) -> str | None:
    """Why a com.microsoft node cannot run, or None."""
    if node.op_type not in OPS:
        return "com.microsoft operator not implemented by qlinear"
    for i, allowed in _INPUT_TYPES[node.op_type].items():
        if i < len(node.input) and node.input[i]:
            t = types.get(node.input[i], 0)
            if t and t not in allowed:
                names = sorted(helper.tensor_dtype_to_np_dtype(a).name for a in allowed)
                return (f"input {i} is {helper.tensor_dtype_to_np_dtype(t).name}; "
                        f"supported: {', '.join(names)}")
    known = ATTRIBUTES[node.op_type]
    unknown = sorted({a.name for a in node.attribute} - set(known))
    if unknown:
        return (f"unknown attribute{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                f"(the operator has {', '.join(known) if known else 'no attributes'})")
    # presence and truth of a few attributes: no text is read, so nothing is decoded
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "QLinearSoftmax" and "opset" not in attrs:
        return "the opset attribute is required"
    if node.op_type == "QLinearConcat" and "axis" not in attrs:
        return "the axis attribute is required"
    if node.op_type == "QLinearAveragePool" and "kernel_shape" not in attrs:
        return "the kernel_shape attribute is required"
    if node.op_type == "MatMulNBits":
        return _matmul_nbits_problem(attrs)
    if node.op_type in ("QAttention", "Attention"):
        if "num_heads" not in attrs:
            return "the num_heads attribute is required"
        unsupported = [a for a in ("do_rotary", "past_present_share_buffer", "qkv_hidden_sizes", "rotary_embedding_dim")
                       if attrs.get(a)]
        extra_inputs = [i for i in node.input[5:] if i] if node.op_type == "Attention" else []
        if unsupported or extra_inputs:
            return f"not supported: {', '.join(unsupported + ['attention_bias/past_sequence_length'] * bool(extra_inputs))}"
    return None



def _matmul_nbits_problem(attrs: dict) -> str | None:
    """Why a MatMulNBits node's attributes cannot run (the values ``qlinear.contrib.matmul_nbits``
    refuses, said before anything runs), or None."""
    missing = [a for a in ("K", "N", "block_size") if a not in attrs]
    if missing:
        return f"the {', '.join(missing)} attribute{'s are' if len(missing) > 1 else ' is'} required"
    if attrs.get("weight_prepacked", 0):
        return (f"weight_prepacked={attrs['weight_prepacked']} (weights pre-packed for another execution "
                "provider) is not supported; only 0")
    ints = {a: attrs[a] for a in ("K", "N", "block_size", "bits", "accuracy_level") if a in attrs}
    bad = [a for a, v in ints.items() if not isinstance(v, int)]
    if bad:
        return f"attribute {bad[0]} must be an integer"
    if ints["K"] < 1 or ints["N"] < 1:
        return f"attributes K and N must be >= 1; got K={ints['K']}, N={ints['N']}"
    if ints.get("bits", 4) not in (2, 4, 8):
        return f"attribute bits must be 2, 4 or 8; got {ints['bits']}"
    bs = ints["block_size"]
    if bs < 16 or bs & (bs - 1):
        return f"attribute block_size must be a power of two >= 16; got {bs}"
    if not 0 <= ints.get("accuracy_level", 0) <= 4:
        return f"attribute accuracy_level must be 0, 1, 2, 3 or 4; got {ints['accuracy_level']}"
    return None
