"""A prepared model, :class:`QLinearRep`: the inputs checked and fed, the graph run by the lean
graph loop with qlinear's kernels, errors named by node."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

import onnx
from onnx import helper
from onnx.backend.base import BackendRep

from .. import _blas, _native, modelfile
from .._validate import byte_count, check_view, repeats_memory, sizes
from ..contrib.schema import DOMAIN
from .._inline import inline_functions
from .errors import NodeError
from .evaluator import FastEvaluator
from .kernels.contrib import ContribOp
from .kernels.sizeguard import with_size_guards
from .kernels.standard import _QLinearOp
from .modes import kernels_for
from .proto import graphs, topologically_sorted
from .registry import CONTROL_KERNELS, FLOAT_KERNELS

#: NumPy's error state while a graph runs. ONNX's float operators are IEEE 754 arithmetic: an
#: overflow to ±inf, an underflow to a denormal or 0, or a NaN from inf - inf is a value of the
#: result (what onnxruntime returns), not an error. The float kernels (Softmax's x - max(x),
#: AveragePool's window sums, LeakyRelu's alpha · x, FastGelu's x³, onnx.reference's own
#: operators...) would otherwise warn, or raise FloatingPointError under a caller's
#: np.errstate(all="raise"), on values whose ONNX result is well defined.
_IEEE = {"all": "ignore"}

try:  # NumPy 2's error state: a context variable holding an error-state object
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj
except ImportError:  # pragma: no cover - another NumPy: np.errstate on every run
    _extobj_contextvar = _make_extobj = None

#: (the caller's error state, the same with every floating-point error ignored), the last pair made
_IGNORED: tuple = (None, None)


def _ignore_float_errors() -> Any:
    """``np.errstate(all="ignore")`` entered: what ``_restore_float_errors`` takes back. The
    ignoring state is made once per state of the caller's (``np.errstate`` makes it anew on each
    entry: about 0.7 us of a small model's run), from that state (its buffer size and call)."""
    if _extobj_contextvar is None:
        es = np.errstate(**_IEEE)
        es.__enter__()
        return es
    global _IGNORED
    current = _extobj_contextvar.get()
    known = _IGNORED
    if known[0] is not current:
        known = _IGNORED = (current, _make_extobj(**_IEEE))
    return _extobj_contextvar.set(known[1])


def _restore_float_errors(token: Any) -> None:
    if _extobj_contextvar is None:
        token.__exit__(None, None, None)
    else:
        _extobj_contextvar.reset(token)


def _rebuild_rep(model: bytes, emulate: str | None, max_tensor_bytes: int | None) -> "QLinearRep":
    """A pickled :class:`QLinearRep` (its ``__reduce__``)."""
    return QLinearRep(onnx.load_from_string(model), emulate, max_tensor_bytes=max_tensor_bytes)


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


#: A progress display: called with the list of nodes a run goes through, it returns an iterable
#: over the same nodes (the list itself when it shows nothing), closed after the run if it can be.
Progress = Callable[[list], Iterable]

#: The errors a graph run reports as a NodeError naming the node (``QLinearRep._named``).
_NODE_ERRORS = (ValueError, TypeError, RuntimeError, IndexError, KeyError, ZeroDivisionError,
                OverflowError, MemoryError, NotImplementedError, AttributeError)

#: Operators (domain, type) whose kernels here never call a BLAS on the native engine: its
#: integer operators (native kernels; on the NumPy engine they do, on float32 BLAS), onnxruntime's
#: quantized element-wise, table, pooling and concatenation operators (native or NumPy
#: element-wise), MaxPool and data movement / element-wise NumPy, the integer islands
#: (qlinear.passes.islands: native element-wise passes and tables). A model made only of these
#: runs without switching OpenBLAS to one thread and back (``QLinearRep._blas_threads``).
_BLAS_FREE = frozenset(
    [("ai.onnx", op) for op in (
        "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
        "DynamicQuantizeLinear", "MaxPool", "Relu", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
        "Identity", "Concat", "Constant", "Shape", "Gather", "Slice", "Split", "Pad", "Cast", "Add", "Sub",
        "Mul", "Div", "Clip", "Exp", "Sigmoid", "LeakyRelu", "Softmax")]
    + [(DOMAIN, op) for op in (
        "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearWhere",
        "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QLinearConv", "QGemm",
        "QuantizeLinear", "DequantizeLinear",
        # the transformer operators' native kernels; QAttention's NumPy attention (above the
        # native kernel's size) switches OpenBLAS itself (contrib/transformer._attention_core)
        "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "SkipLayerNormalization", "FastGelu", "Gelu",
        "EmbedLayerNormalization", "QAttention")]
    + [("qlinear.internal", op) for op in ("QDQIsland", "QDQTableIsland")])


class _NoSwitch:
    """A context manager doing nothing (reusable, re-entrant)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NO_BLAS_SWITCH = _NoSwitch()


def densified(model: onnx.ModelProto, max_tensor_bytes: int | None) -> onnx.ModelProto:
    """``model``, or a copy with its sparse initializers made dense (onnx.reference cannot run
    them: protobuf's 'SparseTensorProto has no "data_location" field' came out)."""
    if not any(len(g.sparse_initializer) for g in graphs(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    modelfile.densify_sparse_initializers(copy, "the model", max_tensor_bytes)
    return copy


def _static_types(model: onnx.ModelProto) -> dict[str, tuple]:
    """name -> (NumPy dtype, shape or None) of the tensors whose element type the model declares
    (graph inputs, value_info, outputs); the shape only when every dimension is a number."""
    out: dict[str, tuple] = {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.elem_type:
            continue
        try:
            dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except (KeyError, ValueError, TypeError):
            continue
        shape = None
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shape = tuple(d.dim_value for d in tt.shape.dim)
        out[vi.name] = (dt, shape)
    return out


def _prepare_constants(evaluator: Any, model: onnx.ModelProto) -> None:
    """The kernels that prepare their constant parameters at ``backend.prepare`` (a
    ``prepare_constants`` method: QuantizeLinear, DequantizeLinear), given the initializers'
    arrays and the declared types; their errors (NodeError) come out of prepare."""
    nodes = [getattr(rt, "guarded_impl", rt) for rt in getattr(evaluator, "rt_nodes_", [])]
    nodes = [rt for rt in nodes if hasattr(rt, "prepare_constants")]
    if nodes:
        values, static = getattr(evaluator, "rt_inits_", {}), _static_types(model)
        for rt in nodes:
            rt.prepare_constants(values, static)


class QLinearRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs in graph order.

    ``emulate="onnxruntime-avx2"`` computes, instead of the exact results, what onnxruntime
    gives on x86 CPUs with AVX2 but without VNNI (16-bit pair saturation in its u8 x s8
    kernels; see :mod:`qlinear.engines.ort_avx2`), on any CPU.
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
        ``qlinear.graph.kernels.sizeguard``); None: no limit."""
        if max_tensor_bytes is not None:
            byte_count(max_tensor_bytes, "QLinearRep: max_tensor_bytes", "None or an integer >= 1")
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"QLinearRep: model must be an onnx.ModelProto; got "
                            f"{type(model).__name__} (backend.prepare takes paths and bytes)")
        try:  # what onnx would fail on with a bare KeyError, named (prepare's check, here too
            # for a QLinearRep built directly; cheap: one walk of the model's messages)
            modelfile.check_contents(model, "the model")
            model = densified(model, max_tensor_bytes)
        except modelfile.ModelFileError as e:
            raise ValueError(f"QLinearRep: {e}") from None
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
            if isinstance(rt, (_QLinearOp, ContribOp)):
                rt.constant_inputs = frozenset(n for n in rt.onnx_node.input if n in constants)
        _prepare_constants(self.evaluator, model)
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
        #: ``_quick_feeds``' checks: (name, dtype, rank or None, ((axis, size), ...)) of each
        #: input, when every one declares a tensor type of a native dtype
        self._quick = None
        if all(dt is not None and dt.isnative and name in self._tensor_inputs
               for name, dt, _ in self._declared):
            self._quick = tuple((name, dt, None if dims is None else len(dims),
                                 () if dims is None else tuple((i, d) for i, d in enumerate(dims) if type(d) is int))
                                for name, dt, dims in self._declared)
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

    def _quick_feeds(self, inputs) -> dict[str, np.ndarray] | None:
        """What ``_feeds`` gives for a dict of exactly the model's inputs (no default fed), each
        an array of the declared dtype (native byte order) and declared dimensions, none above
        the size limit: a copy of the dict, every check of ``_feeds`` passed; else None."""
        quick = self._quick
        if quick is None or type(inputs) is not dict or len(inputs) != len(quick):
            return None
        limit = self.max_tensor_bytes
        for name, dtype, ndim, fixed in quick:
            v = inputs.get(name)
            if type(v) is not np.ndarray or v.dtype is not dtype:
                return None
            if ndim is not None:
                shape = v.shape
                if len(shape) != ndim:
                    return None
                for i, n in fixed:
                    if shape[i] != n:
                        return None
            if limit is not None and v.nbytes > limit:
                return None
        return dict(inputs)

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

    def run(self, inputs, progress: Progress | None = None, **kwargs) -> tuple[np.ndarray, ...]:  # type: ignore[override]
        """Outputs in graph order. ``progress``: a function wrapping the list of nodes for a
        progress display, e.g. ``qlinear.tools.table.progress`` (a bar on a terminal); None or
        False: none."""
        feeds = self._quick_feeds(inputs)
        if feeds is None:
            feeds = self._feeds(inputs)
        with self._blas_threads():
            token = _ignore_float_errors()
            try:
                if not progress:  # no bar: the evaluator itself, no closures per run
                    values = self._named(self.evaluator.run, None, feeds)
                else:
                    values = self._named(lambda: self._with_progress(
                        lambda: self.evaluator.run(None, feeds), progress))
            finally:
                _restore_float_errors(token)
        return tuple(self._unwrap_optionals(values) if self._optional_outputs else values)

    def run_all(self, inputs, progress: Progress | None = None) -> dict[str, Any]:
        """Every tensor of the graph (inputs, initializers, intermediates, outputs) by name;
        ``progress`` as in :meth:`run`."""
        feeds = self._feeds(inputs)
        with _blas.single_threaded(), np.errstate(**_IEEE):
            results = self._named(lambda: self._with_progress(
                lambda: self.evaluator.run(None, feeds, intermediate=True), progress))
        if self._optional_outputs:
            values = self._unwrap_optionals([results.get(n) for n in self.output_names])
            for i in self._optional_outputs:
                results[self.output_names[i]] = values[i]
        return results

    def _with_progress(self, fn, progress: Progress | None):
        if not progress:
            return fn()
        nodes = self.evaluator.rt_nodes_
        wrapped = progress(nodes)
        if wrapped is nodes:
            return fn()
        self.evaluator.rt_nodes_ = wrapped  # the evaluator iterates this once per run
        try:
            return fn()
        finally:
            self.evaluator.rt_nodes_ = nodes
            if hasattr(wrapped, "close"):
                wrapped.close()
