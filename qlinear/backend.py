"""An ONNX backend: onnx's ReferenceEvaluator runs the graph, qlinear runs the six operators.

    import onnx, qlinear.backend as backend
    rep = backend.prepare(onnx.load("model.onnx"))
    outputs = rep.run([x])

The graph engine is ``onnx.reference.ReferenceEvaluator``. Its implementations of
QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger
are replaced (``new_ops``) by qlinear's kernels; constant weights go through the prepared,
weight-pretransformed forms (``qlinear.prepare_*``) once and are reused on every run.

Every other standard operator runs as ReferenceEvaluator runs it, except where it is wrong
or missing (measured with onnx 1.23):

- BatchNormalization 9-13: ReferenceEvaluator fills the default ``momentum`` and then
  computes batch statistics, so every inference output is wrong. Replaced by the inference
  formula, written in onnxruntime's order of float32 operations (bit-identical to
  onnxruntime; also used for inference with versions 14-15, where ReferenceEvaluator is
  right but differs from onnxruntime by float32 ulps).
- DequantizeLinear 13: missing in ReferenceEvaluator; qlinear's kernel runs it.
- MaxPool on uint8/int8 (what onnxruntime's quantizer leaves between quantized layers) with
  padding: ReferenceEvaluator pads with NaN, which raises or casts to an arbitrary integer.
  MaxPool is implemented here for integers and floats as a running maximum over kernel taps
  (padding never wins; a maximum is exact, so it equals onnxruntime), which also replaces
  ReferenceEvaluator's per-window Python loop for floats. Float MaxPool with the Indices
  output runs as ReferenceEvaluator runs it.

Before anything runs, :func:`check_model` lists *every* node qlinear cannot run exactly
(operator, version, node name, reason); :func:`prepare` raises
:class:`UnsupportedModelError` with that whole list. There is no silent fallback to other
semantics: a node whose input types turn out, at run time, to fall outside the float32 /
8-bit contract raises :class:`NodeError` naming node, operator and version.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np

import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType
from onnx.reference.op_run import OpRun

import qlinear as _q
from qlinear import _blas, _fmatmul, _native, _qdq, modelfile
from qlinear._validate import byte_count, check_view, repeats_memory, sizes
from qlinear.quantize import PreparedDequantize, PreparedQuantize
from qlinear import backend_contrib as _contrib
from qlinear.backend_float import FLOAT_KERNELS, FastEvaluator  # float glue ops, lean graph loop

__all__ = [
    "QLinearBackend",
    "QLinearRep",
    "UnsupportedModelError",
    "NodeError",
    "Problem",
    "check_model",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
    "is_compatible",
    "node_version",
    "QLINEAR_OPS",
    "QDQ_MODES",
    "apply_qdq",
    "model_as_run",
    "fusable_ops",
    "EMULATIONS",
]

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

_T = onnx.TensorProto
#: NumPy's error state while a graph runs. ONNX's float operators are IEEE 754 arithmetic: an
#: overflow to ±inf, an underflow to a denormal or 0, or a NaN from inf - inf is a value of the
#: result (what onnxruntime returns), not an error. The float kernels (Softmax's x - max(x),
#: AveragePool's window sums, LeakyRelu's alpha · x, FastGelu's x³, onnx.reference's own
#: operators...) would otherwise warn, or raise FloatingPointError under a caller's
#: np.errstate(all="raise"), on values whose ONNX result is well defined.
_IEEE = {"all": "ignore"}
_EIGHT_BIT = {_T.UINT8, _T.INT8}
_NP_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
_F32_I32 = (np.dtype(np.float32), np.dtype(np.int32))
_NARROW_SCALES = (np.dtype(np.float16), _q.dtypes.BF16.dtype)


def _dtype(v: Any) -> np.dtype | None:
    """A kernel input's dtype (None for an absent one)."""
    return None if v is None else np.asarray(v).dtype


class UnsupportedModelError(ValueError):
    """The model has nodes qlinear cannot run exactly; ``problems`` lists all of them."""

    def __init__(self, problems: Sequence["Problem"]):
        self.problems = list(problems)
        super().__init__("prepare: " + format_problems(self.problems))


class NodeError(ValueError):
    """A node failed at run time; the message names node, operator and version."""


@dataclasses.dataclass(frozen=True)
class Problem:
    node: str
    op_type: str
    domain: str
    version: int | None
    reason: str

    def __str__(self) -> str:
        if self.node == "(model)":
            return self.reason
        op = self.op_type if not self.domain else f"{self.domain}.{self.op_type}"
        ver = f"-{self.version}" if self.version is not None else ""
        return f"node {self.node!r} ({op}{ver}): {self.reason}"


def format_problems(problems: Sequence[Problem], examples: int = 2) -> str:
    """One line for any number of problems: model-level ones first, then every unsupported
    node counted, grouped by reason and operator, largest groups first, e.g.
    ``143 unsupported nodes: com.microsoft.QLinearSigmoid x58, com.microsoft.QLinearMul x58
    (operator outside the standard ONNX domains; e.g. nodes 'a', 'b')``. Nothing is cut: the
    length grows with the number of distinct operators and reasons, not of nodes."""
    model_level = [p.reason for p in problems if p.node == "(model)"]
    nodes = [p for p in problems if p.node != "(model)"]
    parts = model_level[:]
    if nodes:
        # reason -> operator label -> node names, in first-seen order
        groups: dict[str, dict[str, list[str]]] = {}
        for p in nodes:
            op = p.op_type or "(empty op_type)"
            op = op if not p.domain else f"{p.domain}.{op}"
            op += f"-{p.version}" if p.version is not None else ""
            groups.setdefault(p.reason, {}).setdefault(op, []).append(p.node)
        order = sorted(groups.items(), key=lambda kv: -sum(map(len, kv[1].values())))
        texts = []
        for reason, ops in order:
            ops_sorted = sorted(ops.items(), key=lambda kv: -len(kv[1]))
            counted = ", ".join(f"{op} \u00d7{len(names)}" for op, names in ops_sorted)
            first = [names[0] for _, names in ops_sorted][:examples]
            eg = ", ".join(repr(n) for n in first)
            texts.append(f"{counted} ({reason}; e.g. node{'s' if len(first) > 1 else ''} {eg})")
        n = len(nodes)
        parts.append(f"{n} unsupported node{'s' if n != 1 else ''}: " + "; ".join(texts))
    return "; ".join(parts)


# --------------------------------------------------------------------------- versions


def node_version(op_type: str, domain: str, opset: int) -> int | None:
    """The ``since_version`` of the schema that an ``opset`` import selects, or None."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except Exception:  # SchemaError: no such operator at that opset
        return None


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


def _node_label(node: onnx.NodeProto, index: int) -> str:
    name = node.name or f"#{index} {node.op_type}"
    return name if isinstance(name, str) else repr(name)  # bytes: a name that is not UTF-8


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- static check


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every tensor shape inference can type (best effort)."""
    return _types_and_shapes(model)[0]


def _types_and_shapes(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
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


def _check_qlinear_node(node: onnx.NodeProto, version: int, types: dict[str, int],
                        shapes: dict[str, tuple[int, ...]] | None = None) -> str | None:
    """Why a node of one of the six operators falls outside the contract, or None.

    ``shapes`` (tensor name -> shape, where known before running) lets rules on the shape of
    a constant parameter be found here, with the message the kernel gives when it runs."""
    attrs = _attrs(node)
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
        if version == 10:
            bad = _opset10_per_axis(node, shapes or {})
            if bad:
                return bad
        return None
    if op == "QLinearMatMul":
        return _fmatmul.node_problem(version, {i: t(i) for i in range(8)})
    if op in ("QLinearConv", "QLinearMatMul"):
        for i in (1, 4, 6):
            if t(i) and t(i) != _T.FLOAT:
                return f"input {i} (a scale) is {name(t(i))}; only float32 is supported"
        for i in (0, 2, 3, 5, 7):
            if t(i) and t(i) not in _EIGHT_BIT:
                return f"input {i} is {name(t(i))}; only uint8 and int8 are supported"
        return None
    if op in ("ConvInteger", "MatMulInteger"):
        for i in range(len(node.input)):
            if t(i) and t(i) not in _EIGHT_BIT:
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
    from onnx.reference.ops import load_op
    from onnx.reference.op_run import RuntimeContextError

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
        attrs = {a.name: list(helper.get_attribute_value(a)) for a in node.attribute
                 if a.type == onnx.AttributeProto.INTS}
        for name in ("scan_input_directions", "scan_output_directions",
                     "scan_input_axes", "scan_output_axes"):
            if any(v != 0 for v in attrs.get(name, [])):
                return f"onnx.reference implements Scan only with {name} all 0"
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
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _window_problem(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Why the window attributes of a Conv / ConvTranspose / MaxPool / AveragePool / LpPool node
    are malformed, or None: onnxruntime refuses each of these when it loads the model
    ('Attribute strides must only contain positive values', '... has incorrect size', 'Unknown
    AutoPadType String', 'Pad should be smaller than kernel'), while the float kernels and
    onnx.reference failed halfway through a run with an IndexError or ZeroDivisionError, or
    answered: a stride of -1, a dilation of 0 or an auto_pad of 'FOO' ran, and a 3-value
    kernel_shape pooled a 4-D input over its last two axes."""
    op = node.op_type
    attrs = _attrs(node)
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


def _walk(graph: onnx.GraphProto) -> Iterable[tuple[onnx.NodeProto, int]]:
    for i, node in enumerate(graph.node):
        yield node, i
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _walk(g)


def check_model(model: onnx.ModelProto) -> list[Problem]:
    """Every node qlinear cannot run exactly, with the reason; empty when it can run all.

    Model-local functions are inlined first (as :class:`QLinearRep` runs them), so the
    nodes inside them are checked like any other node.
    """
    try:
        model = inline_functions(model)
    except Exception as e:  # a malformed function: report it instead of running its body blind
        return [Problem("(model)", "FunctionProto", "", None,
                        f"the model-local functions cannot be inlined: {' '.join(str(e).split())}")]
    opsets = {d.domain if d.domain != "ai.onnx" else "": d.version for d in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    types, shapes = _types_and_shapes(model)
    problems: list[Problem] = []
    newest = onnx.defs.onnx_opset_version()
    if opsets.get("", 0) > newest:
        problems.append(Problem("(model)", "opset_import", "", opsets[""],
                                f"the model imports ai.onnx opset {opsets['']}; the installed "
                                f"onnx knows opsets up to {newest}"))
    for node, i in _walk(model.graph):
        label = _node_label(node, i)
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
        if domain == _contrib.DOMAIN:  # onnxruntime's operators: qlinear/backend_contrib.py
            reason = _contrib.check_node(node, types)
            if reason:
                problems.append(Problem(label, node.op_type, domain, _contrib.version(node), reason))
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
                and types.get(node.input[0]) in (_T.UINT8, _T.INT8):
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


# --------------------------------------------------------------------------- kernels


class _QLinearOp(OpRun):
    """Base of the replacement kernels: version lookup and error wrapping."""

    op_domain = ""
    #: ``_run`` reads the attributes from ``self.given``: the graph loop passes the inputs only
    run_ignores_attributes = True

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version(onnx_node.op_type, "", opset)
        self.given = _attrs(onnx_node)
        self._cache_key: tuple | None = None
        self._prepared: Any = None

    def _fail(self, msg: str) -> NodeError:
        return NodeError(f"node {self.onnx_node.name or self.onnx_node.output[0]!r} "
                         f"({self.onnx_node.op_type}-{self.version}): {msg}")

    def _check_opset10_scalar(self, what: str, value: Any) -> None:
        """QuantizeLinear-10 / DequantizeLinear-10: ``what`` must have one element (per-axis
        parameters came with opset 13); the rule ``check_model`` applies to constant ones."""
        bad = None if value is None else _opset10_not_scalar(self.onnx_node.op_type, what, np.shape(value))
        if bad:
            raise self._fail(bad)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            raise self._fail(str(e)) from e

    #: Names of this node's inputs that are constant for the model (initializers, Constant
    #: outputs); set by QLinearRep. None (unknown): nothing is cached across runs.
    constant_inputs: frozenset[str] | None = None

    def _prepared_for(self, factory_name: str, weights: tuple, positions: tuple[int, ...], **kwargs):
        """A prepared object for these weight arrays (inputs at ``positions`` of the node).

        Cached across runs only when every one of them is a constant of the model (the same
        array object, never written, on every run): the pretransform is then paid once per
        model. A weight fed as a graph input or computed at run time is prepared on each run,
        so a caller reusing a buffer with new values gets results for the new values.
        """
        constant = _contrib.constants_at(self, positions) is True
        key = tuple(id(w) for w in weights)
        if not constant or self._cache_key != key or self._prepared is None:
            factory = getattr(_q, factory_name, None)
            if factory is None:
                return None
            prepared = self._call(factory, *weights, **kwargs)
            if not constant:
                return prepared
            self._prepared = prepared
            self._cache_key = key
            self._weights_ref = weights  # keep the arrays alive so ids stay unique
        return self._prepared

    def _prepared_params(self, cls, scale, zero_point, axis):
        """``cls(scale, zero_point, axis=axis)`` built once when both are constants of the model
        (the same array objects on every run), else None (the caller validates per call)."""
        if _contrib.constants_at(self, (1, 2)) is not True:
            return None
        key = (id(scale), id(zero_point))
        if self._cache_key != key or self._prepared is None:
            self._prepared = self._call(cls, scale, zero_point, axis=axis)
            self._cache_key = key
            self._weights_ref = (scale, zero_point)  # keep the arrays alive so ids stay unique
        return self._prepared

    # The repeat path of a node whose weights and per-tensor call parameters (scales, zero
    # points) are all constants of the model: after one call with them validated and run, the
    # node passes its prepared form NumPy scalars of the same values and dtypes (immutable,
    # so the prepared form's repeat path -- ``v.RepeatMemo`` -- may trust them by identity)
    # instead of the model's 0-d or 1-element arrays, which a prepared form must re-validate
    # on every call. The prepared form still checks x on every call.
    _scalars: tuple | None = None  # (the model's parameter arrays, the scalars, the prepared form)
    _no_scalars = False  # some parameter is not a model constant

    def _scalar_params(self, params: tuple, positions: tuple[int, ...], prep) -> tuple | None:
        """The NumPy scalars standing for ``params`` (the node's inputs at ``positions``), when
        ``_remember_scalars`` kept them for these very objects and this prepared form."""
        known = self._scalars
        if known is None or known[2] is not prep:
            return None
        for a, b in zip(params, known[0]):
            if a is not b:
                return None
        return known[1]

    def _remember_scalars(self, params: tuple, positions: tuple[int, ...], prep) -> None:
        """After a successful call of ``prep`` with ``params``: keep their scalar forms when
        every one is a model constant of one element (None stays None)."""
        if self._no_scalars:
            return
        constant = _contrib.constants_at(self, positions)
        if constant is False:
            self._no_scalars = True  # a parameter computed or fed at run time: never (decided once)
            return
        inputs = self.onnx_node.input
        names = [inputs[i] if i < len(inputs) else "" for i in positions]
        if (constant is None or len(names) != len(params)
                or any((p is not None) if not n else False for n, p in zip(names, params))
                or any(p is not None and (type(p) is not np.ndarray or p.size != 1) for p in params)):
            self._scalars = None
            return
        scalars = tuple(None if p is None else p.reshape(-1)[0] for p in params)
        self._scalars = (params, scalars, prep)

    # ``fast_path(inputs, fixed)``, defined by the kernels that have one (the graph loop,
    # ``qlinear.backend_float.FastEvaluator``, asks only those): asked after a call of
    # ``_run(*inputs)`` that succeeded, a function of the node's input list giving its one
    # output for inputs whose positions in ``fixed`` hold these very objects (the loop
    # guarantees it: the model's constants) and whose other inputs are like these (the function
    # checks them), and None otherwise (the loop then calls ``_run``); or None when there is
    # none. It must give exactly ``_run``'s result. Only the exact classes take it (an
    # emulating subclass overrides ``_run``).

    def _bound(self, inputs: list, fixed: frozenset[int], params: tuple[int, ...]) -> bool:
        """Whether the inputs at ``params`` (those given) are all fixed for ``fast_path``."""
        return all(i in fixed for i in params if i < len(inputs) and inputs[i] is not None)

    def _check_float32(self, what: str, v) -> None:
        if v is not None and np.asarray(v).dtype != np.float32:
            raise self._fail(f"{what} is {np.asarray(v).dtype}; qlinear implements the float32 "
                             "contract only")

    def _check_8bit(self, what: str, v) -> None:
        if v is not None and np.asarray(v).dtype not in _NP_EIGHT_BIT:
            raise self._fail(f"{what} is {np.asarray(v).dtype}; only uint8 and int8 are supported")

    def _conv_attrs(self) -> dict[str, Any]:
        g = self.given
        out: dict[str, Any] = {"auto_pad": g.get("auto_pad", "NOTSET"), "group": g.get("group", 1)}
        for k in ("dilations", "kernel_shape", "pads", "strides"):
            if k in g:
                out[k] = list(g[k])
        return out


class QuantizeLinear(_QLinearOp):
    def _run(self, x, y_scale, y_zero_point=None, **_):
        prepared = self._prepared
        if prepared is not None and type(x) is np.ndarray and x.dtype == np.float32 \
                and y_scale is self._weights_ref[0] and y_zero_point is self._weights_ref[1]:
            # the same constant parameters as when ``prepared`` was built: every check below
            # passed then and depends only on them and the attributes (x checked here)
            return (self._call(prepared.run, x),)
        g = self.given
        if (g.get("block_size", 0) or g.get("precision", 0) or g.get("output_dtype", 0) not in (0, _T.UINT8)
                or _dtype(x) not in _F32_I32 or _dtype(y_scale) != np.float32
                or (y_zero_point is not None and _dtype(y_zero_point) not in _NP_EIGHT_BIT)
                or (self.version >= 19 and _dtype(x) == np.int32)):
            # the newer types and attributes (versions 19-28): the function, which takes them all
            return (self._call(_q.quantize_linear, x, y_scale, y_zero_point, axis=g.get("axis", 1),
                               block_size=g.get("block_size", 0), saturate=g.get("saturate", 1),
                               output_dtype=g.get("output_dtype", 0) or None,
                               precision=g.get("precision", 0) or None, version=self.version),)
        if not (self.version < 19 and np.asarray(x).dtype == np.int32):  # T1 of opsets 10-18: float, int32
            self._check_float32("input x", x)
        self._check_float32("y_scale", y_scale)
        odt = g.get("output_dtype", 0)
        if y_zero_point is None:
            if odt == _T.INT8:
                y_zero_point = np.zeros((), np.int8)
            elif odt not in (0, _T.UINT8):
                raise self._fail("output_dtype must be uint8 or int8")
        else:
            self._check_8bit("y_zero_point", y_zero_point)
            if odt and helper.tensor_dtype_to_np_dtype(odt) != y_zero_point.dtype:
                raise self._fail(f"output_dtype {helper.tensor_dtype_to_np_dtype(odt).name} differs from "
                                 f"y_zero_point's type {y_zero_point.dtype}")
        if self.version == 10:
            self._check_opset10_scalar("y_scale", y_scale)
            self._check_opset10_scalar("y_zero_point", y_zero_point)
        prepared = self._prepared_params(PreparedQuantize, y_scale, y_zero_point, g.get("axis", 1))
        if prepared is not None:
            return (self._call(prepared.run, x),)
        return (self._call(_q.quantize_linear, x, y_scale, y_zero_point, axis=g.get("axis", 1)),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_prepared_io(self, QuantizeLinear, inputs, fixed)


class DequantizeLinear(_QLinearOp):
    def _run(self, x, x_scale, x_zero_point=None, **_):
        prepared = self._prepared
        if prepared is not None and type(x) is np.ndarray and x.dtype in _NP_EIGHT_BIT \
                and x_scale is self._weights_ref[0] and x_zero_point is self._weights_ref[1]:
            return (self._call(prepared.run, x),)  # as in QuantizeLinear._run
        g = self.given
        if (g.get("block_size", 0) or g.get("output_dtype", 0) not in (0, _T.FLOAT)
                or _dtype(x) not in (*_NP_EIGHT_BIT, np.dtype(np.int32)) or _dtype(x_scale) != np.float32):
            # the newer types and attributes (versions 19-28): the function, which takes them all
            return (self._call(_q.dequantize_linear, x, x_scale, x_zero_point, axis=g.get("axis", 1),
                               block_size=g.get("block_size", 0), output_dtype=g.get("output_dtype", 0) or None,
                               version=self.version),)
        if np.asarray(x).dtype not in (*_NP_EIGHT_BIT, np.dtype(np.int32)):
            raise self._fail(f"input x is {np.asarray(x).dtype}; only uint8, int8 and int32 "
                             "are supported")
        self._check_float32("x_scale", x_scale)
        if self.version == 10:
            self._check_opset10_scalar("x_scale", x_scale)
            self._check_opset10_scalar("x_zero_point", x_zero_point)
        prepared = self._prepared_params(PreparedDequantize, x_scale, x_zero_point, g.get("axis", 1))
        if prepared is not None:
            return (self._call(prepared.run, x),)
        return (self._call(_q.dequantize_linear, x, x_scale, x_zero_point, axis=g.get("axis", 1)),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_prepared_io(self, DequantizeLinear, inputs, fixed)


def _bound_prepared_io(node: _QLinearOp, cls: type, inputs: list, fixed: frozenset[int]):
    """QuantizeLinear's / DequantizeLinear's ``fast_path``: the repeat path of their ``_run``
    (the prepared form of these very constant parameters) bound to the input's shape."""
    prepared = node._prepared
    if (type(node) is not cls or prepared is None or len(inputs) not in (2, 3)
            or not node._bound(inputs, fixed, (1, 2))
            or inputs[1] is not node._weights_ref[0] or _arg(inputs, 2) is not node._weights_ref[1]):
        return None
    run = prepared.bound_run(inputs[0])
    return None if run is None else (lambda ins: run(ins[0]))


def _arg(args: list | tuple, i: int) -> Any:
    return args[i] if len(args) > i else None


class QLinearConv(_QLinearOp):
    def _run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
             B=None, **_):
        params = (x_scale, x_zero_point, y_scale, y_zero_point)
        prep = self._prepared
        if prep is not None and w is self._weights_ref[0] and w_scale is self._weights_ref[1] \
                and w_zero_point is self._weights_ref[2] and B is self._weights_ref[3]:
            scalars = self._scalar_params(params, (1, 2, 6, 7), prep)
            if scalars is not None:  # every check below passed for these very objects
                return (self._call(prep.run, x, *scalars),)
        for what, v in (("x_scale", x_scale), ("w_scale", w_scale), ("y_scale", y_scale)):
            self._check_float32(what, v)
        attrs = self._conv_attrs()
        prep = self._prepared_for("prepare_qlinear_conv", (w, w_scale, w_zero_point, B), (3, 4, 5, 8),
                                  **attrs)
        if prep is not None:
            y = self._call(prep.run, x, *params)
            if prep is self._prepared:
                self._remember_scalars(params, (1, 2, 6, 7), prep)
            return (y,)
        return (self._call(_q.qlinear_conv, x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                           y_scale, y_zero_point, B, **attrs),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_weighted(self, QLinearConv, inputs, fixed, (3, 4, 5, 8))


class QLinearMatMul(_QLinearOp):
    def _run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
             **_):
        params = (a_scale, a_zero_point, y_scale, y_zero_point)
        prep = self._prepared
        if prep is not None and b is self._weights_ref[0] and b_scale is self._weights_ref[1] \
                and b_zero_point is self._weights_ref[2]:
            scalars = self._scalar_params(params, (1, 2, 6, 7), prep)
            if scalars is not None:  # as in QLinearConv._run
                return (self._call(prep.run, a, *scalars),)
        if any(_dtype(v) not in _NP_EIGHT_BIT for v in (a, b, y_zero_point)) or \
                any(_dtype(v) in _NARROW_SCALES for v in (a_scale, b_scale, y_scale)):
            # version 21: float8 operands or float16/bfloat16 scales, by the function
            return (self._call(_q.qlinear_matmul, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                               y_scale, y_zero_point),)
        for what, v in (("a_scale", a_scale), ("b_scale", b_scale), ("y_scale", y_scale)):
            self._check_float32(what, v)
        prep = self._prepared_for("prepare_qlinear_matmul", (b, b_scale, b_zero_point), (3, 4, 5))
        if prep is not None:
            y = self._call(prep.run, a, *params)
            if prep is self._prepared:
                self._remember_scalars(params, (1, 2, 6, 7), prep)
            return (y,)
        return (self._call(_q.qlinear_matmul, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                           y_scale, y_zero_point),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        return _bound_weighted(self, QLinearMatMul, inputs, fixed, (3, 4, 5))


def _bound_weighted(node: _QLinearOp, cls: type, inputs: list, fixed: frozenset[int],
                    weights: tuple[int, ...]):
    """QLinearConv's / QLinearMatMul's ``fast_path``: their repeat path (the prepared form of
    these very constant weights, called with the scalars of these very constant parameters)
    bound to the data input's shape."""
    prep = node._prepared
    params = (1, 2, 6, 7)
    if (type(node) is not cls or prep is None or len(inputs) < 8
            or not node._bound(inputs, fixed, params + weights)
            or any(_arg(inputs, i) is not r for i, r in zip(weights, node._weights_ref))):
        return None
    scalars = node._scalar_params(tuple(inputs[i] for i in params), params, prep)
    run = None if scalars is None else prep.bound_run(*scalars)
    return None if run is None else (lambda ins: run(ins[0]))


class _IntegerOp(_QLinearOp):
    """ConvInteger and MatMulInteger: the data input, constant weights, two optional zero
    points; the repeat path of QLinearConv._run, plus a zero point computed at run time
    (DynamicQuantizeLinear's) handed straight to the prepared form."""

    def _integer(self, factory: str, plain, x, w, x_zero_point, w_zero_point, attrs=dict):
        prep = self._prepared
        if prep is not None and w is self._weights_ref[0] and w_zero_point is self._weights_ref[1]:
            scalars = self._scalar_params((x_zero_point,), (2,), prep)
            if scalars is not None:  # as in QLinearConv._run
                return (self._call(prep.run, x, *scalars),)
            if self._no_scalars:  # a zero point computed at run time
                return (self._call(prep.run, x, x_zero_point),)
        kw = attrs()  # the attributes: only off the repeat path
        prep = self._prepared_for(factory, (w, w_zero_point), (1, 3), **kw)
        if prep is not None:
            y = self._call(prep.run, x, x_zero_point)
            if prep is self._prepared:
                self._remember_scalars((x_zero_point,), (2,), prep)
            return (y,)
        return (self._call(plain, x, w, x_zero_point, w_zero_point, **kw),)


class ConvInteger(_IntegerOp):
    def _run(self, x, w, x_zero_point=None, w_zero_point=None, **_):
        return self._integer("prepare_conv_integer", _q.conv_integer, x, w, x_zero_point, w_zero_point,
                             self._conv_attrs)


class MatMulInteger(_IntegerOp):
    def _run(self, a, b, a_zero_point=None, b_zero_point=None, **_):
        return self._integer("prepare_matmul_integer", _q.matmul_integer, a, b, a_zero_point, b_zero_point)


def batch_normalization_inference(x, scale, bias, mean, var, epsilon=1e-5):
    """Inference BatchNormalization in onnxruntime's order of float32 operations.

    onnxruntime folds the statistics first (``inv_std = 1 / sqrt(var + eps)``,
    ``new_scale = inv_std * scale``, ``new_bias = bias - mean * new_scale``) and then
    computes ``y = x * new_scale + new_bias``; each step here is one float32 operation.
    """
    dt = x.dtype
    eps = dt.type(epsilon)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv_std = dt.type(1) / np.sqrt((var.astype(dt) + eps))
    new_scale = inv_std * scale.astype(dt)
    new_bias = bias.astype(dt) - mean.astype(dt) * new_scale
    return (x * new_scale.reshape(shape) + new_bias.reshape(shape)).astype(dt)


class BatchNormalization(OpRun):
    """BatchNormalization inference for versions 9-15 in onnxruntime's float32 order.

    Versions 9-13 are wrong in onnx.reference (batch statistics instead of the running ones);
    for 14-15 its formula is right but rounds differently from onnxruntime (ulps), so the same
    onnxruntime-order formula is used. Training mode (14-15) and versions 6-7 run as
    onnx.reference runs them.
    """

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version("BatchNormalization", "", opset)
        self._delegate = None
        training = _attrs(onnx_node).get("training_mode", 0) or len(
            [o for o in onnx_node.output if o]) > 1
        if self.version < 9 or (self.version >= 14 and training):
            from onnx.reference.ops import load_op

            self._delegate = load_op("", "BatchNormalization", self.version)(onnx_node, run_params)

    def run(self, *args, **kwargs):  # noqa: D102 - bypass attribute plumbing when delegating
        if self._delegate is not None:
            return self._delegate.run(*args, **kwargs)
        return super().run(*args, **kwargs)

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None):
        eps = 1e-5 if epsilon is None else epsilon
        return (batch_normalization_inference(x, scale, bias, mean, var, eps),)


def max_pool(x, *, kernel_shape, strides=None, pads=None, dilations=None,
             auto_pad="NOTSET", ceil_mode=0):
    """MaxPool as a running maximum over kernel taps of strided views.

    Padded positions hold the type's minimum (-inf for floats), so they never win. A maximum
    is exact, so this is bit-identical to onnxruntime for integers and for NaN-free floats
    (a NaN in a window propagates to that output). The geometry is computed once per input
    shape and attributes (``_max_pool_plan``).
    """
    tup = lambda v: tuple(int(i) for i in v) if v is not None else None  # noqa: E731
    return _max_pool(x, (tup(kernel_shape), tup(strides), tup(pads), tup(dilations), str(auto_pad),
                         int(ceil_mode)))


def _max_pool(x: np.ndarray, attrs: tuple) -> np.ndarray:
    """max_pool with the attributes as a tuple (kernel, strides, pads, dilations, auto_pad,
    ceil_mode), each a tuple of ints or None: the compiled byte kernel for 8-bit NCHW input,
    the NumPy formulation otherwise."""
    key = (x.shape, *attrs)
    if x.ndim == 4 and x.dtype in _NP_EIGHT_BIT:
        from qlinear import _native

        C = _native.native()
        plan = _max_pool_native_plan(*key) if C is not None else None
        if plan is not None:
            # the compiled byte kernel (qlinear/_native/pool.c): same windows, same maximum
            out, geometry = plan
            y = _native.empty(out, x.dtype)
            C.maxpool2d(C.get_isa(), x if x.flags.c_contiguous else np.ascontiguousarray(x), y, *geometry,
                        x.dtype == np.int8)
            return y
    return _max_pool_numpy(x, key)


@functools.lru_cache(maxsize=256)
def _max_pool_native_plan(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(output shape, the native kernel's geometry arguments) of an NCHW MaxPool, or None when
    the attributes are malformed (the NumPy formulation then reports them as before)."""
    kernel, strides2, dilations2, pb, out = _max_pool_geometry(shape, kernel_shape, strides, pads,
                                                               dilations, auto_pad, ceil_mode)
    if not (len(kernel) == len(strides2) == len(dilations2) == len(pb) == 2
            and min(kernel + strides2 + dilations2) >= 1 and min(pb) >= 0):
        return None
    n, c, h, w = shape
    return out, (n * c, h, w, out[2], out[3], kernel[0], kernel[1], strides2[0], strides2[1],
                 dilations2[0], dilations2[1], pb[0], pb[1])


def _max_pool_numpy(x: np.ndarray, key: tuple) -> np.ndarray:
    """max_pool in NumPy: a running maximum over the taps' strided views of the padded input."""
    pad_width, taps, out = _max_pool_plan(*key)
    lo = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    if 0 in out:
        return np.full(out, lo, dtype=x.dtype)
    xp = np.pad(x, pad_width, constant_values=lo) if pad_width is not None else x
    y = np.array(xp[taps[0]], dtype=x.dtype)  # the first tap (a copy: y is written below)
    for sl in taps[1:]:
        np.maximum(y, xp[sl], out=y)
    return y


@functools.lru_cache(maxsize=256)
def _max_pool_geometry(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(kernel, strides, dilations, begin pads, output shape) of a MaxPool, every value explicit."""
    from qlinear.tools.ortsat import explicit_pads

    nd = len(shape) - 2
    spatial = list(shape[2:])
    kernel = list(kernel_shape)
    if len(kernel) != nd:  # check_model refuses it where the input's shape is known beforehand
        raise ValueError(f"MaxPool: kernel_shape {kernel} has {len(kernel)} values; x {tuple(shape)} has "
                         f"{nd} spatial axes")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    pb, pe = explicit_pads(spatial, kernel, strides, dilations, auto_pad,
                           list(pads) if pads is not None else None)
    out = []
    for i in range(nd):
        eff = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + pb[i] + pe[i] - eff
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + pb[i]:
            o -= 1  # the last window would start in the end padding
        if o < 0 and spatial[i] > 0:
            # onnxruntime: 'Calculated output dimension is negative'; this used to answer an
            # empty tensor (an empty input, size 0, still gives an empty output)
            raise ValueError(f"MaxPool: x's size {spatial[i]} on spatial axis {i}, padded to "
                             f"{spatial[i] + pb[i] + pe[i]}, is smaller than the window's extent {eff} "
                             f"(kernel_shape {kernel[i]}, dilation {dilations[i]}): no output window")
        out.append(max(o, 0))
    return tuple(kernel), tuple(strides), tuple(dilations), tuple(pb), tuple(shape[:2]) + tuple(out)


@functools.lru_cache(maxsize=256)
def _max_pool_plan(shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """(np.pad widths or None when every window lies inside x, the taps' index tuples, the
    output shape) of a MaxPool."""
    import itertools

    kernel, strides, dilations, pb, out_shape = _max_pool_geometry(
        shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    nd = len(shape) - 2
    spatial = list(shape[2:])
    out = list(out_shape[2:])
    pe = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i] - pb[i])
          for i in range(nd)]
    extra = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                 - (spatial[i] + pb[i] + pe[i])) for i in range(nd)]
    pad_width = None
    if any(pb) or any(pe) or any(extra):
        pad_width = [(0, 0), (0, 0)] + [(pb[i], pe[i] + extra[i]) for i in range(nd)]
    taps = [(slice(None), slice(None)) + tuple(
                slice(off[i] * dilations[i], off[i] * dilations[i] + (out[i] - 1) * strides[i] + 1,
                      strides[i]) for i in range(nd))
            for off in itertools.product(*[range(k) for k in kernel])]
    return pad_width, taps, tuple(shape[:2]) + tuple(out)


class MaxPool(OpRun):
    """MaxPool with one output: the vectorized ``max_pool`` (onnx.reference pads integer tensors
    with NaN, which fails or casts to an arbitrary value, and loops over windows in Python for
    floats). With the Indices output, float inputs run as onnx.reference runs them."""

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        from onnx.reference.ops import load_op

        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        self.version = node_version("MaxPool", "", opset)
        self.given = _attrs(onnx_node)
        self._float = load_op("", "MaxPool", self.version)(onnx_node, run_params)
        self._with_indices = len([o for o in onnx_node.output if o]) > 1
        self._attr_key: tuple | None = None

    def run(self, *args, **kwargs):  # noqa: D102
        x = args[0]
        if type(x) is not np.ndarray:
            x = np.asarray(x)
        with_indices = self._with_indices
        if with_indices:
            if x.dtype.kind not in "iu":
                return self._float.run(*args, **kwargs)
            name = self.onnx_node.name or self.onnx_node.output[0]
            raise NodeError(f"node {name!r} (MaxPool-{self.version}): the Indices output is not "
                            "supported for integer inputs")
        key = self._attr_key
        if key is None:
            g = self.given
            tup = lambda v: tuple(int(i) for i in v) if v is not None else None  # noqa: E731
            key = (tup(g["kernel_shape"]), tup(g.get("strides")), tup(g.get("pads")), tup(g.get("dilations")),
                   str(g.get("auto_pad", "NOTSET")), int(g.get("ceil_mode", 0)))
            self._attr_key = key  # the attributes as max_pool reads them, converted once
        return (_max_pool(x, key),)

    def _run(self, *args, **kwargs):  # run() above does the work
        raise NotImplementedError

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """The compiled byte kernel's call bound to an 8-bit NCHW input of this shape (see
        ``_QLinearOp.fast_path``): what ``run`` does for it, minus the per-call planning."""
        from qlinear import _native

        x = inputs[0] if len(inputs) == 1 else None
        C = _native.native()
        if (type(self) is not MaxPool or self._with_indices or self._attr_key is None or C is None
                or type(x) is not np.ndarray or x.ndim != 4 or x.dtype not in _NP_EIGHT_BIT
                or not x.flags.c_contiguous):
            return None
        plan = _max_pool_native_plan(x.shape, *self._attr_key)
        if plan is None:
            return None
        (out, geometry), shape, dtype, signed = plan, x.shape, x.dtype, x.dtype == np.int8
        maxpool2d, empty = C.maxpool2d, _native.empty

        def run(ins: list) -> np.ndarray | None:
            x = ins[0]
            if (type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape or not x.flags.c_contiguous
                    or _native.native() is not C):
                return None
            y = empty(out, dtype)
            maxpool2d(C.get_isa(), x, y, *geometry, signed)
            return y

        return run


KERNELS: list[type[OpRun]] = [QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul,
                              ConvInteger, MatMulInteger, BatchNormalization, MaxPool, *_contrib.KERNELS]


# --------------------------------------------------------------------------- QDQ

#: How a QDQ model (DequantizeLinear -> float op -> QuantizeLinear) runs: "fuse" (default)
#: rewrites its node groups into integer operators as onnxruntime's CPU session does
#: (qlinear.qdq, docs/qdq.md); "literal" runs the graph as written.
QDQ_MODES = ("fuse", "literal")


def fusable_ops() -> frozenset[tuple[str, str]]:
    """The fused operators (domain, op_type) this backend has kernels for: ONNX QLinearConv and
    QLinearMatMul, and every com.microsoft operator among qlinear.qdq.FUSED_OPS registered in
    KERNELS. The QDQ fusion emits only these; other groups run as written."""
    from qlinear.qdq import FUSED_OPS

    have = {("", "QLinearConv"), ("", "QLinearMatMul")}
    for k in KERNELS:
        domain = getattr(k, "op_domain", "")
        have.add((domain, k.__name__))  # a kernel class is named after its operator
    return frozenset(op for op in FUSED_OPS if op in have)


def _exact_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``qlinear.qdq.exact_integer_convs`` where the model has a DequantizeLinear feeding a
    Conv (a rewrite error leaves the model as it was: the float path is always correct)."""
    if not any(n.op_type == "Conv" for n in model.graph.node) or \
            not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model
    from qlinear.qdq import exact_integer_convs

    try:
        return exact_integer_convs(model)
    except Exception:  # noqa: BLE001 - an optimisation only; the graph as fused runs
        return model


def model_as_run(model: onnx.ModelProto, qdq: str = "fuse", emulate: str | None = None) -> onnx.ModelProto:
    """The graph ``prepare`` and ``qlinear run`` execute: :func:`apply_qdq`, then with
    ``qdq="fuse"`` the float Convs whose float32 result is exact on integers
    (:func:`qlinear.qdq.exact_integer_convs`: the same bytes). Not under an emulation (which
    changes ConvInteger's arithmetic), not for ``qdq="literal"`` (the graph as written), and
    only where ConvInteger is the faster form: the native engine at a SIMD level (its portable
    scalar level and the NumPy engine run ConvInteger slower than the float Conv's BLAS:
    retinaface 290 against 105 ms at the scalar level). ``qlinear compare`` keeps the float
    Convs: it compares their outputs with onnxruntime's."""
    model = apply_qdq(model, qdq)
    if qdq != "fuse" or emulate is not None:
        return model
    from qlinear import _native

    info = _native.engine_info()
    if info["engine"] != "native" or info["isa"] == "scalar":
        return model
    return _exact_convs(model)


def apply_qdq(model: onnx.ModelProto, qdq: str = "fuse") -> onnx.ModelProto:
    """The model as it will run: QDQ node groups fused (``qdq="fuse"``) or unchanged
    (``"literal"``)."""
    if qdq not in QDQ_MODES:
        raise ValueError(f"prepare: qdq must be one of {', '.join(QDQ_MODES)}; got {qdq!r}")
    if qdq == "literal":
        return model
    from qlinear.qdq import QDQRefusal, fuse_qdq

    if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model  # nothing to fuse
    model = topologically_sorted(model)  # the rewrite reads the graph in order
    try:
        return fuse_qdq(model, ops=fusable_ops())
    except QDQRefusal as e:  # a model problem, said as such
        raise ValueError(f"prepare: {e}") from None
    except Exception as e:  # a rewrite bug must not look like a model problem
        raise ValueError(f"prepare: the QDQ fusion failed ({type(e).__name__}: {e}); "
                         "qdq='literal' (--qdq literal) runs the graph as written") from e


# --------------------------------------------------------------------------- emulation

#: What ``emulate=`` accepts: "onnxruntime-avx2" is onnxruntime's CPU results on x86 with
#: AVX2 and without AVX-VNNI / AVX512-VNNI (measured on onnxruntime 1.32).
EMULATIONS = ("onnxruntime-avx2",)


def _emulating(base: type[_QLinearOp]) -> type[_QLinearOp]:
    """``base`` computing onnxruntime-avx2's result where its kernel saturates.

    The exact kernel runs first: it validates the inputs (same errors as without emulation)
    and is onnxruntime's answer wherever its kernel is exact (other type pairings,
    depthwise QLinearConv)."""

    def _run(self, *args, **kwargs):
        exact = base._run(self, *args, **kwargs)
        from qlinear.tools import ortsat

        attrs = self._conv_attrs() if "Conv" in base.__name__ else {}
        emulated = self._call(ortsat.emulate, base.__name__, list(args), attrs)
        return exact if emulated is None else (emulated,)

    return type(base.__name__, (base,), {"_run": _run, "__doc__": base.__doc__, "__module__": __name__})


def kernels_for(emulate: str | None) -> list[type[OpRun]]:
    """The replacement kernels for ReferenceEvaluator: exact, or emulating ``emulate``."""
    if emulate is None:
        return KERNELS
    if emulate not in EMULATIONS:
        raise ValueError(f"prepare: emulate must be one of {', '.join(map(repr, EMULATIONS))} "
                         f"or None; got {emulate!r}")
    swap = {k: _emulating(k) for k in (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger)}
    swap.update(_contrib.EMULATING)  # com.microsoft QGemm, QLinearConv, QAttention, ...
    return [swap.get(k, k) for k in KERNELS]


# --------------------------------------------------------------------------- backend


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions (FunctionProto) inlined, so that the six
    operators inside them run on qlinear's kernels too (onnx.reference would otherwise run
    a function's body with its own implementations); ``model`` itself if it has none.
    ValueError, before anything is expanded, when the inlined graph would exceed
    ``qlinear._inline.MAX_INLINED_NODES`` nodes or the functions call each other in a cycle."""
    if not model.functions:
        return model
    from onnx.inliner import inline_local_functions

    from qlinear._inline import check_inline_size

    check_inline_size(model)

    return inline_local_functions(model)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name the subgraphs of ``node`` (If, Loop, Scan bodies, nested) read."""
    names: set[str] = set()
    for g in _subgraphs(node):
        for inner in g.node:
            names.update(inner.input)
            names |= _subgraph_reads(inner)
    return names


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _topological_order(graph: onnx.GraphProto) -> list[int] | None:
    """A topological order of ``graph``'s nodes (not its subgraphs'), keeping the given order
    wherever it is one; None when the given order is one. ValueError for a cycle."""
    import heapq

    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    # what each node waits for: the producers (in this graph) of what it or its subgraphs read
    waits = [{producer[name] for name in set(n.input) | _subgraph_reads(n)
              if name in producer and producer[name] != i} for i, n in enumerate(nodes)]
    if all(j < i for i, w in enumerate(waits) for j in w):
        return None
    readers: list[list[int]] = [[] for _ in nodes]
    for i, w in enumerate(waits):
        for j in w:
            readers[j].append(i)
    pending = [len(w) for w in waits]
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)  # the earliest listed node first: the given order where it can be kept
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
        raise ValueError(f"the nodes form a cycle: node {_node_label(nodes[stuck], stuck)!r} "
                         f"waits for node {_node_label(nodes[other], other)!r}, which waits for "
                         "it (directly or through others)")
    return order


def _out_of_order(graph: onnx.GraphProto) -> bool:
    return _topological_order(graph) is not None or any(
        _out_of_order(g) for n in graph.node for g in _subgraphs(n))


def _sort_nodes(graph: onnx.GraphProto) -> None:
    for n in graph.node:
        for g in _subgraphs(n):
            _sort_nodes(g)
    order = _topological_order(graph)
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


def _rebuild_rep(model: bytes, emulate: str | None, max_tensor_bytes: int | None) -> "QLinearRep":
    """A pickled :class:`QLinearRep` (its ``__reduce__``)."""
    return QLinearRep(onnx.load_from_string(model), emulate, max_tensor_bytes=max_tensor_bytes)


#: The one model-file loader (kept importable here by this name).
missing_external_data = modelfile.missing_external_data


class _TrackedNodes(list):
    """The evaluator's node list, remembering the node being run (for error messages)."""

    current: Any = None

    def __iter__(self):
        for node in list.__iter__(self):
            self.current = node
            yield node
        self.current = None


def _declared_input(vi: onnx.ValueInfoProto) -> tuple[str, np.dtype | None, list | None]:
    """(name, dtype, dimensions) a graph input declares: dtype None where the type is not a
    tensor or not given; dimensions None where the shape is not given, a dimension its name
    (a str, "?" unnamed) where it is symbolic or negative (dynamic, as onnxruntime treats -1)."""
    if not vi.type.HasField("tensor_type"):
        return vi.name, None, None
    tt = vi.type.tensor_type
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
    except KeyError:
        dtype = None
    dims = None
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
                for d in tt.shape.dim]
    return vi.name, dtype, dims


#: The errors a graph run reports as a NodeError naming the node (``QLinearRep._named``).
_NODE_ERRORS = (ValueError, TypeError, RuntimeError, IndexError, KeyError, ZeroDivisionError,
                OverflowError, MemoryError, NotImplementedError, AttributeError)

#: Operators (domain, type) whose kernels here never call a BLAS on the native engine: its
#: integer operators (native kernels; on the NumPy engine they do, on float32 BLAS), onnxruntime's
#: quantized element-wise, table, pooling and concatenation operators (native or NumPy
#: element-wise), MaxPool and data movement / element-wise NumPy. A model made only of these
#: runs without switching OpenBLAS to one thread and back (``QLinearRep._blas_threads``).
_BLAS_FREE = frozenset(
    [("ai.onnx", op) for op in (
        "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
        "DynamicQuantizeLinear", "MaxPool", "Relu", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
        "Identity", "Concat", "Constant", "Shape", "Gather", "Slice", "Split", "Pad", "Cast", "Add", "Sub",
        "Mul", "Div", "Clip", "Exp", "Sigmoid", "LeakyRelu", "Softmax")]
    + [(_contrib.DOMAIN, op) for op in (
        "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearWhere",
        "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QLinearConv", "QGemm",
        "QuantizeLinear", "DequantizeLinear")])


class _NoSwitch:
    """A context manager doing nothing (reusable, re-entrant)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NO_BLAS_SWITCH = _NoSwitch()


class QLinearRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs in graph order.

    ``emulate="onnxruntime-avx2"`` computes, instead of the exact results, what onnxruntime
    gives on x86 CPUs with AVX2 but without VNNI (16-bit pair saturation in its u8 x s8
    kernels; see :mod:`qlinear.tools.ortsat`), on any CPU.
    """

    def __reduce__(self):
        """Pickling (multiprocessing, copy.deepcopy) rebuilds the representation from its model
        and options: what the evaluator holds (protobuf containers, onnx's schemas, prepared
        kernels) cannot be pickled, and is derived again from the model on the other side."""
        return _rebuild_rep, (self.model.SerializeToString(), self.emulate, self.max_tensor_bytes)

    def __init__(self, model: onnx.ModelProto, emulate: str | None = None, *,
                 max_tensor_bytes: int | None = None):
        """``max_tensor_bytes``: refuse (NodeError) before an operator whose output size
        depends on input values or broadcasting (Expand, ConstantOfShape, Tile, Pad, Resize,
        Range, OneHot, MatMul, elementwise operators, the quantized convolutions and products,
        com.microsoft QLinearAdd/Mul/Where/Concat/AveragePool, QGemm, ...) would allocate more (see
        ``qlinear._sizeguard``); None: no limit."""
        from qlinear._control import CONTROL_KERNELS
        from qlinear._sizeguard import with_size_guards

        if max_tensor_bytes is not None:
            byte_count(max_tensor_bytes, "QLinearRep: max_tensor_bytes", "None or an integer >= 1")
        model = topologically_sorted(inline_functions(model))
        self.model = model
        self.emulate = emulate
        self.max_tensor_bytes = max_tensor_bytes
        self.evaluator = FastEvaluator(
            model, new_ops=with_size_guards(kernels_for(emulate) + FLOAT_KERNELS + CONTROL_KERNELS,
                                     max_tensor_bytes))
        self.evaluator.rt_nodes_ = _TrackedNodes(self.evaluator.rt_nodes_)
        # Constant weights (initializers, Constant outputs) are prepared once and cached.
        constants = {i.name for i in model.graph.initializer} | {
            o for n in model.graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
            for o in n.output}
        for rt in getattr(self.evaluator, "rt_nodes_", []):
            rt = getattr(rt, "guarded_impl", rt)  # a size guard's wrapped kernel (max_tensor_bytes)
            if isinstance(rt, (_QLinearOp, _contrib.ContribOp)):
                rt.constant_inputs = frozenset(n for n in rt.onnx_node.input if n in constants)
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        # (name, dtype, dimensions) each input declares: checked on every run, as onnxruntime
        # and the qlinear command check their feeds
        self._declared = [_declared_input(i) for i in model.graph.input if i.name not in inits]
        self._tensor_inputs = frozenset(i.name for i in model.graph.input
                                        if i.type.HasField("tensor_type"))
        self._all_input_names = {i.name for i in model.graph.input}  # defaults may be fed too
        # inputs with an initializer (a default): a fed value is copied on each run, because
        # the nodes treat initializers as the model's constants and may keep what they derived
        # from them by identity (prepared weights, scalars of scales), while the caller may
        # write into its array between runs
        self._defaults = frozenset(i.name for i in model.graph.input if i.name in inits)
        self.output_names = [o.name for o in model.graph.output]
        #: every node is one that never calls a BLAS on the native engine (``_blas_threads``)
        self._blas_free = all((n.domain or "ai.onnx", n.op_type) in _BLAS_FREE
                              and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                          for a in n.attribute)
                              for n in model.graph.node)
        #: graph outputs of optional type: onnx.reference holds such a value as a one-element
        #: list ([tensor], or [None] when empty); the caller gets the tensor (or None), as
        #: from onnxruntime
        self._optional_outputs = [i for i, o in enumerate(model.graph.output)
                                  if o.type.HasField("optional_type")]

    def _unwrap_optionals(self, values: list) -> list:
        """``values`` (every graph output, in order) with the optional ones unwrapped."""
        for i in self._optional_outputs:
            v = values[i]
            if isinstance(v, list) and len(v) == 1:
                values[i] = v[0]
        return values

    def _named(self, fn, *args):
        """``fn(*args)``; an error from inside an operator names the node it came from. (The
        arguments are passed through, so a plain run builds no closure for it.)"""
        try:
            return fn(*args)
        except NodeError:
            raise
        except _NODE_ERRORS as e:
            err = self._node_error(e)
            if err is None:
                raise
            raise err from e

    def _node_error(self, e: Exception) -> NodeError | None:
        """``e``, raised inside the graph run, as a NodeError naming the node being run; None
        when no node was running (the error is then raised as it is)."""
        node = getattr(self.evaluator.rt_nodes_, "current", None)
        if node is None:
            return None
        name = node.onnx_node.name or (node.onnx_node.output[0] if node.onnx_node.output
                                       else "?")
        msg = " ".join(str(e).split()) or type(e).__name__
        return NodeError(f"node {name!r} ({node.onnx_node.op_type}): {type(e).__name__}: {msg}")

    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) if not isinstance(v, np.ndarray) and v is not None else v
                     for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
                # run(3.0) failed with Python's "'float' object is not iterable"
                raise TypeError("run: inputs must be a list or tuple of arrays in the model's input "
                                "order, or a dict of input name -> array; got "
                                f"{type(inputs).__name__}")
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise ValueError(f"run: {len(inputs)} inputs given, the model takes "
                                 f"{len(self.input_names)} ({', '.join(self.input_names)})")
            # a value given for a tensor input as a list, a NumPy scalar or a Python number
            # becomes an array, as in the dict form, so that the declared dtype and shape are
            # checked below (it reached the first node unchecked: a float64 list was refused by
            # a QuantizeLinear, np.float32(1) failed inside a Transpose)
            feeds = {k: np.asarray(v) if k in self._tensor_inputs and v is not None
                     and not isinstance(v, np.ndarray) else v
                     for k, v in zip(self.input_names, inputs)}
        names = ", ".join(repr(n) for n in self.input_names)
        for k in feeds:
            if k not in self._all_input_names:
                raise ValueError(f"run: unknown input {k!r}; the model's inputs are {names}")
        for k in self.input_names:
            if k not in feeds:
                raise ValueError(f"run: no value for input {k!r} (the model's inputs are {names})")
            if feeds[k] is None and k in self._tensor_inputs:
                # reached the first node that read it ('quantize_linear: x must be a NumPy array
                # ...; got a Python NoneType'), naming the node instead of the input
                raise TypeError(f"run: input {k!r} is None; the model declares a tensor")
        for k, v in feeds.items():
            if isinstance(v, np.ndarray) and not v.dtype.isnative:  # '>f4': as qlinear's operators take it
                feeds[k] = v.astype(v.dtype.newbyteorder("="))
            elif k in self._defaults and isinstance(v, np.ndarray):
                # never the caller's array (see __init__); a broadcast view is copied only
                # within the size limit of qlinear's operators (check_view names it otherwise)
                check_view("run", f"input {k!r}", v)
                feeds[k] = v.copy()
        for name, dtype, dims in self._declared:
            v = feeds.get(name)
            if not isinstance(v, np.ndarray):
                continue  # a sequence, a map, or a value the first node reports
            if dtype is not None and v.dtype != dtype:
                raise TypeError(f"run: input {name!r} has dtype {v.dtype}; the model declares {dtype}")
            if dims is not None and (v.ndim != len(dims)
                                     or any(type(d) is int and d != n for d, n in zip(dims, v.shape))):
                want = ", ".join(map(str, dims))
                raise ValueError(f"run: input {name!r} has shape {tuple(v.shape)}; the model "
                                 f"declares [{want}]")
        limit = self.max_tensor_bytes
        if limit is not None:
            # The size guards leave alone the operators whose output is no larger than their
            # input: a broadcast view (np.broadcast_to) takes no memory, yet Relu of one makes
            # the whole array. A view above the limit as an array is refused, as qlinear's
            # operators refuse it; a real array exists already and is accepted.
            for k, v in feeds.items():
                if isinstance(v, np.ndarray) and v.nbytes > limit and repeats_memory(v):
                    given, most = sizes(v.nbytes, limit)
                    raise ValueError(f"run: input {k!r} is a view of shape {tuple(v.shape)} that repeats "
                                     f"its memory (a broadcast view): as an array it would take {given}, "
                                     f"more than the limit of {most} per tensor (max_tensor_bytes)")
        return feeds

    def _blas_threads(self):
        """The run's OpenBLAS setting: single-threaded (``_blas.single_threaded``), unless no node
        of the graph calls a BLAS on this run's engine (``_BLAS_FREE``), where switching it
        would only cost its two library calls (about 4 us of a small model's 45)."""
        if self._blas_free and _native.native() is not None:
            return _NO_BLAS_SWITCH
        return _blas.single_threaded()

    def run(self, inputs, progress: bool | None = False, **kwargs) -> tuple[np.ndarray, ...]:  # type: ignore[override]
        """Outputs in graph order. ``progress=None`` shows a bar on a terminal's stderr."""
        feeds = self._feeds(inputs)
        with self._blas_threads(), np.errstate(**_IEEE):
            if progress is False:  # no bar: the evaluator itself, no closures per run
                values = self._named(self.evaluator.run, None, feeds)
            else:
                values = self._named(lambda: self._with_progress(
                    lambda: self.evaluator.run(None, feeds), progress))
        return tuple(self._unwrap_optionals(values) if self._optional_outputs else values)

    def run_all(self, inputs, progress: bool | None = False) -> dict[str, Any]:
        """Every tensor of the graph (inputs, initializers, intermediates, outputs) by name."""
        feeds = self._feeds(inputs)
        with _blas.single_threaded(), np.errstate(**_IEEE):
            results = self._named(lambda: self._with_progress(
                lambda: self.evaluator.run(None, feeds, intermediate=True), progress))
        if self._optional_outputs:
            values = self._unwrap_optionals([results.get(n) for n in self.output_names])
            for i in self._optional_outputs:
                results[self.output_names[i]] = values[i]
        return results

    def _with_progress(self, fn, enabled):
        if enabled is False:
            return fn()
        from qlinear.tools.table import progress as bar

        nodes = self.evaluator.rt_nodes_
        wrapped = bar(nodes, total=len(nodes), desc="qlinear", enabled=enabled)
        if wrapped is nodes:
            return fn()
        self.evaluator.rt_nodes_ = wrapped  # the evaluator iterates this once per run
        try:
            return fn()
        finally:
            self.evaluator.rt_nodes_ = nodes
            if hasattr(wrapped, "close"):
                wrapped.close()


class QLinearBackend(Backend):
    """``onnx.backend.base.Backend`` for qlinear (CPU only)."""

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        return cls.supports_device(device) and not check_model(model)

    @classmethod
    def prepare(cls, model, device="CPU", emulate: str | None = None, qdq: str = "fuse",
                max_tensor_bytes: int | None = None, **kwargs) -> QLinearRep:
        """A :class:`QLinearRep` for ``model`` (ModelProto, path or bytes), after checking
        every node. ``emulate="onnxruntime-avx2"``: compute what onnxruntime gives on AVX2
        CPUs without VNNI (its u8 x s8 kernels' 16-bit pair saturation) instead of the exact
        results. ``qdq="fuse"`` (default) runs QDQ node groups as onnxruntime's CPU session
        does, on integer kernels (docs/qdq.md); ``qdq="literal"`` runs the graph as written
        (DequantizeLinear -> float operator -> QuantizeLinear). ``max_tensor_bytes``: the
        run-time size guards of :class:`QLinearRep`. Other keywords are refused (TypeError),
        except ``rtol`` and ``atol``, which onnx's backend test runner passes for its own
        comparison."""
        unknown = [k for k in kwargs if k not in ("rtol", "atol")]
        if unknown:
            raise TypeError(f"prepare: unknown keyword argument {unknown[0]!r} (it takes device, "
                            "emulate, qdq and max_tensor_bytes)")
        kernels_for(emulate)  # a bad name fails before anything is loaded
        from_bytes = isinstance(model, bytes)
        try:  # files and bytes through the one loader (qlinear.modelfile): one ValueError each
            if isinstance(model, (str, os.PathLike)):
                model = modelfile.load(model, max_tensor_bytes=max_tensor_bytes)
            elif isinstance(model, bytes):
                model = modelfile.parse(model, "the bytes are")
            elif not isinstance(model, onnx.ModelProto):
                raise TypeError("prepare: model must be an onnx.ModelProto, a path or bytes; got "
                                f"{type(model).__name__}")
            modelfile.check_loaded(model, from_bytes)
            # element types, attribute types, strings: what onnx would fail on with a bare
            # KeyError (61, 0) or UnicodeDecodeError, named here (the commands check the same)
            modelfile.check_contents(model, "the model")
        except modelfile.ModelFileError as e:
            raise ValueError(f"prepare: {e}") from None
        if not model.HasField("graph"):
            # empty bytes (or an empty file) parse as a ModelProto without a graph, which ran
            # and returned no outputs; onnxruntime refuses it ('No graph was found')
            raise ValueError("prepare: the model has no graph (empty bytes or an empty ModelProto "
                             "are not an ONNX model)")
        if not cls.supports_device(device):
            raise ValueError(f"prepare: device {device!r} is not supported (CPU only)")
        if qdq not in QDQ_MODES:
            raise ValueError(f"prepare: qdq must be one of {', '.join(QDQ_MODES)}; got {qdq!r}")
        try:
            model = topologically_sorted(model)
        except ValueError as e:
            raise ValueError(f"prepare: {e}") from None
        problems = check_model(model)
        if problems:
            raise UnsupportedModelError(problems)
        return QLinearRep(model_as_run(model, qdq, emulate), emulate=emulate, max_tensor_bytes=max_tensor_bytes)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", emulate: str | None = None, **kwargs):
        return cls.prepare(model, device, emulate=emulate, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        in_names = [n for n in node.input if n]  # "" is an omitted optional input: no value
        label = f"node {node.name or node.output[0]!r} ({node.op_type})" if node.output else \
            f"node {node.op_type}"
        if isinstance(inputs, dict):
            missing = [n for n in in_names if n not in inputs]
            if missing:
                raise ValueError(f"run_node: no value for input {missing[0]!r} of {label}")
            arrays = [inputs[n] for n in in_names]
        else:
            arrays = list(inputs)
            if len(arrays) != len(in_names):  # zip() below would drop or leave out values
                raise ValueError(f"run_node: {label} has {len(in_names)} input"
                                 f"{'s' if len(in_names) != 1 else ''} "
                                 f"({', '.join(map(repr, in_names))}); got {len(arrays)} "
                                 f"value{'s' if len(arrays) != 1 else ''}")
        graph_inputs = [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape)
            for n, a in zip(in_names, arrays)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        domain = node.domain if node.domain != "ai.onnx" else ""
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
        return cls.run_model(model, dict(zip(in_names, arrays)), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:
            return False


prepare = QLinearBackend.prepare
run_model = QLinearBackend.run_model
run_node = QLinearBackend.run_node
supports_device = QLinearBackend.supports_device
is_compatible = QLinearBackend.is_compatible
