"""What the graph runtime can run, decided before anything runs: :func:`check_model` lists every
node qlinear cannot run exactly (operator, version, node name, reason)."""

from __future__ import annotations

import math
from typing import Iterable

import onnx
from onnx import helper
from onnx.reference.op_run import RuntimeContextError
from onnx.reference.ops import load_op

from .. import _fmatmul, _qdq, dtypes
from .._geometry import AUTO_PADS
from ..contrib import schema
from ..contrib.schema import DOMAIN
from .._inline import inline_functions
from .errors import Problem
from .proto import (T, node_attributes, node_label, node_version,
                    types_and_shapes, walk_nodes)


#: The six operators qlinear implements, with the operator versions (``since_version`` of
#: the schema) whose semantics, for 8-bit integers with float32 scales, are the contract of
#: docs/contract.md. Newer versions only add types (float8, int4, 16-bit, float16 scales) or
#: attributes (block_size, output_dtype, saturate, precision); a node using one of those is
#: refused, node by node.
QLINEAR_OPS: dict[str, tuple[int, ...]] = {
    "QuantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),
    "DequantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),
    "QLinearConv": (10,),
    "QLinearMatMul": (10, 21),
    "ConvInteger": (10,),
    "MatMulInteger": (10,),
}


def _unknown_attributes(node: onnx.NodeProto, known: Iterable[str]) -> str | None:
    """Why a node whose attributes its operator does not define cannot run, or None. The
    kernels read only the attributes they know, so a misspelt one (``stride`` for ``strides``)
    would be ignored and the node answered as if it were absent; onnx's checker and
    onnxruntime refuse such a node."""
    names = set(known)
    unknown = sorted({a.name for a in node.attribute} - names)
    if not unknown:
        return None
    return (f"unknown attribute{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(the operator has {', '.join(sorted(names)) if names else 'no attributes'})")


def _check_qlinear_node(node: onnx.NodeProto, version: int, types: dict[str, int],
                        shapes: dict[str, tuple[int, ...]] | None = None) -> str | None:
    """Why a node of one of the six operators falls outside the contract, or None.

    ``shapes`` (tensor name -> shape, where known before running) lets rules on the shape of
    a constant parameter be found here, with the message the kernel gives when it runs."""
    attrs = node_attributes(node)
    op = node.op_type

    def t(i):  # element type of input i, 0 if absent or unknown
        return types.get(node.input[i], 0) if i < len(node.input) and node.input[i] else 0

    def name(elem):
        return helper.tensor_dtype_to_np_dtype(elem).name if elem else "?"

    if op in ("QuantizeLinear", "DequantizeLinear"):
        # the types and attributes of every version: the operator's own rules (qlinear._qdq)
        bad = _qdq.node_problem(op, version, attrs, t(0), t(1), t(2))
        if bad:
            return bad
        if op == "DequantizeLinear" and t(1) == T.FLOAT8E8M0 and not attrs.get("output_dtype"):
            # (the NumPy API answers float32 here, docs/contract.md; a model has to say it)
            return ("a float8e8m0 x_scale needs output_dtype (float32, float16 or bfloat16): "
                    "without it the schema's type inference makes y float8e8m0, which is not a "
                    "DequantizeLinear output type")
        if version == 10:
            bad = _opset10_per_axis(node, shapes or {})
            if bad:
                return bad
        return None
    if op == "QLinearMatMul":
        return _fmatmul.node_problem(version, {i: t(i) for i in range(8)})
    if op in ("QLinearConv", "QLinearMatMul"):
        for i in (1, 4, 6):
            if t(i) and t(i) != T.FLOAT:
                return f"input {i} (a scale) is {name(t(i))}; only float32 is supported"
        for i in (0, 2, 3, 5, 7):
            if t(i) and t(i) not in dtypes.EIGHT_BIT_ONNX:
                return f"input {i} is {name(t(i))}; only uint8 and int8 are supported"
        return None
    if op in ("ConvInteger", "MatMulInteger"):
        for i in range(len(node.input)):
            if t(i) and t(i) not in dtypes.EIGHT_BIT_ONNX:
                return f"input {i} is {name(t(i))}; only uint8 and int8 are supported"
    return None


def _opset10_per_axis(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """QuantizeLinear-10 / DequantizeLinear-10 take a scalar scale and zero point (one
    element); per-axis parameters came with opset 13. The message run gives, or None (also
    when a shape is unknown before running)."""
    x = "y" if node.op_type == "QuantizeLinear" else "x"
    for i, what in ((1, f"{x}_scale"), (2, f"{x}_zero_point")):
        if i < len(node.input) and node.input[i]:
            shape = shapes.get(node.input[i])
            bad = None if shape is None else _opset10_not_scalar(node.op_type, what, shape)
            if bad:
                return bad
    return None


def _opset10_not_scalar(op_type: str, what: str, shape: tuple[int, ...]) -> str | None:
    """The opset-10 rule on one parameter of ``shape``, for check_model and for run."""
    if math.prod(shape) != 1:
        return f"{op_type}-10 takes a scalar {what} (per-axis needs opset 13); got shape {shape}"
    return None


def _reference_has(op_type: str, domain: str, version: int) -> bool:
    try:
        load_op(domain, op_type, version)
    except RuntimeContextError:
        return True  # implementation chosen from input types at run time
    except Exception:
        return False
    return True


def _reference_gap(node: onnx.NodeProto, version: int) -> str | None:
    """Why onnx.reference, which has an implementation of this operator, still cannot run this
    node (attributes or versions it does not implement), or None. Found here, before anything
    runs, rather than as a RuntimeError halfway through a model."""
    op = node.op_type
    if op == "Scan":
        if version < 9:
            return ("Scan-8 (batched, with sequence_lens) is not implemented in onnx.reference "
                    "(it runs Scan-9 and later)")
        # scan axes and directions: qlinear's own Scan (qlinear.graph.kernels.control)
    if op in ("LayerNormalization", "RMSNormalization"):
        stash = next((a.i for a in node.attribute if a.name == "stash_type"), 1)
        if stash != 1:
            return f"onnx.reference implements {op} only with stash_type 1 (float32)"
    if op in ("AveragePool", "LpPool"):
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        pad = next((a.s for a in node.attribute if a.name == "auto_pad"), b"NOTSET")
        if ints.get("ceil_mode", 0) and pad in (b"SAME_UPPER", b"SAME_LOWER", b"VALID"):
            return f"onnx.reference does not implement ceil_mode with auto_pad {pad.decode()}"
    if op == "Resize":
        ints = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
        if ints.get("antialias", 0) and mode == b"nearest":
            return "onnx.reference does not implement antialias with mode nearest"
    return None


#: Operators with a sliding window whose geometry attributes ``_window_problem`` checks before
#: anything runs (QLinearConv and ConvInteger are checked by their kernels' own validation).
_WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"})
_AUTO_PADS = AUTO_PADS


def _window_problem(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Why the window attributes of a Conv / ConvTranspose / MaxPool / AveragePool / LpPool node
    are malformed, or None: onnxruntime refuses each of these when it loads the model
    ('Attribute strides must only contain positive values', '... has incorrect size', 'Unknown
    AutoPadType String', 'Pad should be smaller than kernel'), while the float kernels and
    onnx.reference failed halfway through a run with an IndexError or ZeroDivisionError, or
    answered: a stride of -1, a dilation of 0 or an auto_pad of 'FOO' ran, and a 3-value
    kernel_shape pooled a 4-D input over its last two axes."""
    op = node.op_type
    attrs = node_attributes(node)
    pool = op in ("MaxPool", "AveragePool", "LpPool")
    kernel = attrs.get("kernel_shape")
    if pool and kernel is None:
        return "attribute kernel_shape is required"
    x_shape = shapes.get(node.input[0]) if node.input else None
    w_shape = shapes.get(node.input[1]) if not pool and len(node.input) > 1 else None
    nd = len(kernel) if kernel is not None else (
        len(x_shape) - 2 if x_shape is not None else len(w_shape) - 2 if w_shape is not None else None)
    for name, least in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 0)):
        values = attrs.get(name)
        if values is None:
            continue
        if any(v < least for v in values):
            return f"attribute {name} values must be >= {least}; got {list(values)}"
        want = None if nd is None else 2 * nd if name == "pads" else nd
        if want is not None and len(values) != want:
            return (f"attribute {name} must have {want} values "
                    f"({'two ' if name == 'pads' else 'one '}per spatial axis); got {len(values)}: {list(values)}")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        return f"attribute auto_pad must be one of {', '.join(_AUTO_PADS)}; got {auto_pad!r}"
    if nd is not None and x_shape is not None and len(x_shape) != nd + 2:
        return (f"input {node.input[0]!r} has shape {list(x_shape)}: {len(x_shape) - 2} spatial axes, "
                f"while the window has {nd}")
    pads = attrs.get("pads")
    if pool and pads is not None and auto_pad == "NOTSET" and kernel is not None \
            and any(p >= kernel[i % len(kernel)] for i, p in enumerate(pads)):
        # a window wholly in the padding: onnxruntime refuses it ('Pad should be smaller than
        # kernel'); AveragePool would divide by a count of 0
        return f"attribute pads {list(pads)} must be smaller than kernel_shape {list(kernel)} (each value)"
    return None


def _non_utf8_attribute(node: onnx.NodeProto) -> str | None:
    for a in node.attribute:
        texts = [a.s] if a.type == onnx.AttributeProto.STRING else \
            list(a.strings) if a.type == onnx.AttributeProto.STRINGS else []
        for text in texts:
            try:
                text.decode("utf-8")
            except UnicodeDecodeError:
                return f"attribute {a.name!r} is not valid UTF-8 text ({text[:20]!r})"
    return None


def check_model(model: onnx.ModelProto) -> list[Problem]:
    """Every node qlinear cannot run exactly, with the reason; empty when it can run all.

    Model-local functions are inlined first (as :class:`QLinearRep` runs them), so the
    nodes inside them are checked like any other node.
    """
    try:
        model = inline_functions(model)
    except Exception as e:  # a malformed function: report it instead of running its body blind
        return [Problem("(model)", "FunctionProto", "", None,
                        "the model-local functions cannot be inlined: "
                        + " ".join(str(e).split()).removeprefix(
                            "the model-local functions cannot be inlined: "))]
    opsets = {d.domain if d.domain != "ai.onnx" else "": d.version for d in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    types, shapes = types_and_shapes(model)
    problems: list[Problem] = []
    newest = onnx.defs.onnx_opset_version()
    if opsets.get("", 0) > newest:
        problems.append(Problem("(model)", "opset_import", "", opsets[""],
                                f"the model imports ai.onnx opset {opsets['']}; the installed "
                                f"onnx knows opsets up to {newest}"))
    for node, i in walk_nodes(model.graph):
        label = node_label(node, i)
        domain = "" if node.domain == "ai.onnx" else node.domain
        bad_text = _non_utf8_attribute(node)
        if bad_text:
            problems.append(Problem(label, node.op_type, domain, None, bad_text))
            continue
        if (domain, node.op_type) in functions:
            continue
        if domain not in opsets:
            problems.append(Problem(label, node.op_type, domain, None,
                                    f"domain {domain or 'ai.onnx'!r} is not imported by the model"))
            continue
        if domain == DOMAIN:  # onnxruntime's operators: qlinear/contrib/schema.py
            reason = schema.check_node(node, types)
            if reason:
                problems.append(Problem(label, node.op_type, domain, schema.version(node), reason))
            continue
        if domain not in ("", "ai.onnx.ml"):
            problems.append(Problem(label, node.op_type, domain, None,
                                    "operator outside the standard ONNX domains"))
            continue
        version = node_version(node.op_type, domain, opsets[domain])
        if version is None:
            problems.append(Problem(label, node.op_type, domain, None,
                                    f"no such operator in opset {opsets[domain]}"))
            continue
        unknown = _unknown_attributes(node, onnx.defs.get_schema(node.op_type, opsets[domain], domain).attributes)
        if unknown:
            problems.append(Problem(label, node.op_type, domain, version, unknown))
            continue
        if domain == "" and node.op_type in QLINEAR_OPS:
            if version not in QLINEAR_OPS[node.op_type]:
                problems.append(Problem(label, node.op_type, domain, version,
                                        "operator version not supported by qlinear"))
                continue
            reason = _check_qlinear_node(node, version, types, shapes)
            if reason:
                problems.append(Problem(label, node.op_type, domain, version, reason))
            continue
        if domain == "" and node.op_type == "BatchNormalization" and 9 <= version <= 13:
            if len([o for o in node.output if o]) > 1:
                problems.append(Problem(label, node.op_type, domain, version,
                                        "training outputs (mean, var, saved_*) are not supported"))
            continue
        if domain == "" and node.op_type == "MaxPool" and len([o for o in node.output if o]) > 1 \
                and types.get(node.input[0]) in dtypes.EIGHT_BIT_ONNX:
            problems.append(Problem(label, node.op_type, domain, version,
                                    "the Indices output is not supported for integer inputs"))
            continue
        if not _reference_has(node.op_type, domain, version):
            problems.append(Problem(label, node.op_type, domain, version,
                                    "no implementation in onnx.reference"))
            continue
        gap = (_window_problem(node, shapes) if domain == "" and node.op_type in _WINDOW_OPS else None) \
            or (_reference_gap(node, version) if domain == "" else None)
        if gap:
            problems.append(Problem(label, node.op_type, domain, version, gap))
    return problems
