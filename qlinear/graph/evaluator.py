"""The graph loop: :class:`FastEvaluator` is ReferenceEvaluator with a leaner top-level
``run`` (2-3 us per node instead of 25-60): onnx.reference operators are called through ``_run`` with their
attributes read once, elementwise binaries through their ufunc, Constant nodes once; each
intermediate tensor is released after its last consumer (memory is reused instead of growing
over the whole graph). Logging, shape-annotation checks and function attributes take
ReferenceEvaluator's own ``run``. After a node's full call succeeds, the loop asks it for a
*bound short path* (``fast_path``: qlinear's quantized operators, MaxPool): its repeat path
bound once to the model's constants and to inputs like these, one Python frame and the native
call, which answers None for any other input (shape, dtype, layout), engine, ISA level or
size limit, and the node's full call then runs. A node's Python work is mostly touched cold
inside a whole model (the convolutions stream megabytes of weights through the caches
between two calls of it), so fewer frames per node save more there than alone. From the
second run on, a plain run takes the loop compiled once (:mod:`qlinear.graph.plan`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops import op_cast
from onnx.reference.ops._op import OpRunBinaryNumpy

from .plan import CompiledPlan, compile_plan, guarded_short_path

#: Operators never folded into constants: their outputs differ between runs on the same
#: inputs (random generators) or they have effects beyond their outputs.
_NOT_FOLDABLE = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                           "Multinomial", "Bernoulli", "Dropout"})

# --------------------------------------------------------------------------- graph loop


#: Cast targets whose onnx.reference implementation (``cast_to``) is ``x.astype(dtype)`` for
#: every ``saturate`` and ``round_mode`` (those change only float8 and float8e8m0 targets).
_PLAIN_CAST = {t: np.dtype(helper.tensor_dtype_to_np_dtype(t)) for t in (
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64)}


def _plain_cast(impl: OpRun) -> np.dtype | None:
    """The target dtype of an onnx.reference Cast node whose cast is ``x.astype(dtype)``, else None."""
    if impl.op_type != "Cast" or type(impl).__module__ != op_cast.__name__:
        return None
    return _PLAIN_CAST.get(getattr(impl, "to", None))


#: the results key of a node's omitted ("") outputs in the graph loop
_OMITTED = object()

#: How many times the graph loop asks a node for its bound short path (``fast_path``) after a
#: full call: once a node has one it is asked again only after the short path declined its
#: inputs (another shape, engine or level), so a node whose inputs keep changing between runs
#: stops asking after this many.
_FAST_TRIES = 8


def _tracking(tracked: Any, nodes: list):
    """``nodes`` in order, each recorded as ``tracked.current`` while it runs (what iterating
    the backend's ``_TrackedNodes`` list does), None after the last."""
    for node in nodes:
        tracked.current = node
        yield node
    tracked.current = None


def _bind_fast(fast: list, node: OpRun, inputs: list, outputs: Any) -> None:
    """After a full call of ``node`` on ``inputs`` that gave ``outputs``: ask it for its bound
    short path (the graph loop's plan entry ``fast``, see ``FastEvaluator._make_plan``)."""
    fast[2] -= 1  # a node whose inputs keep changing stops asking
    fast[1] = None
    if type(outputs) is not tuple or len(outputs) != 1 or type(outputs[0]) is not np.ndarray:
        return
    x = inputs[0] if inputs else None
    if type(x) is np.ndarray and not x.flags.c_contiguous:
        # a strided view (a Transpose's): bound to an input like its contiguous copy, which
        # the compiled plan hands a data-only short path in its place (the same values)
        inputs = [np.ascontiguousarray(x), *inputs[1:]]
    try:
        fn = node.fast_path(inputs, fast[0])
    except Exception:  # noqa: BLE001 - no short path then
        return
    if fn is not None:
        fast[4] = tuple((j, inputs[j]) for j in fast[3] if j < len(inputs))
        fast[1] = fn


def _call(entry: tuple, inputs: list) -> tuple:
    """A node's full call as the graph loop makes it (after its size check and its bound short
    path, which declined or is not bound), for every kind of call but ``const`` and
    ``context``: its outputs. After a qlinear kernel's full call the node is asked for its
    bound short path (``_bind_fast``)."""
    pnode, how, extra, _, _, _, _, fast, _ = entry
    if how == "direct0":  # qlinear's kernels: they read their attributes themselves
        try:
            outputs = pnode._run(*inputs)
        except (TypeError, AttributeError):
            outputs = pnode.run(*inputs)  # for OpRun's own error message
        if type(outputs) is not tuple or ((len(outputs) != 1 or type(outputs[0]) is not np.ndarray)
                                          and any(type(o) is not np.ndarray for o in outputs)):
            outputs = pnode._check_and_fix_outputs(outputs)  # (one array: no generator)
        if fast is not None and fast[2] > 0:
            _bind_fast(fast, pnode, inputs, outputs)
    elif how == "cast" and type(inputs[0]) is np.ndarray and len(inputs) == 1:
        outputs = (inputs[0].astype(extra),)  # what onnx.reference's cast_to returns
    elif how == "binary" and type(inputs[0]) is np.ndarray \
            and type(inputs[1]) is np.ndarray and inputs[0].dtype == inputs[1].dtype:
        out = extra(inputs[0], inputs[1])
        if type(out) is not np.ndarray:  # a ufunc of two 0-d arrays returns a scalar
            out = np.asarray(out)
        outputs = (out,) if out.dtype == inputs[0].dtype else pnode.run(*inputs)
    elif how == "direct":
        try:
            outputs = pnode._run(*inputs, **extra)
        except (TypeError, AttributeError):
            outputs = pnode.run(*inputs)  # for OpRun's own error message
        if type(outputs) is not tuple or ((len(outputs) != 1 or type(outputs[0]) is not np.ndarray)
                                          and any(type(o) is not np.ndarray for o in outputs)):
            outputs = pnode._check_and_fix_outputs(outputs)  # (one array: no generator)
    else:
        outputs = pnode.run(*inputs)
        if fast is not None and fast[2] > 0:
            _bind_fast(fast, pnode, inputs, outputs)
    return outputs


class FastEvaluator(ReferenceEvaluator):
    """ReferenceEvaluator whose top-level ``run`` is a lean loop over the nodes.

    Same results as ReferenceEvaluator.run. When verbose logging, shape-annotation checks,
    function attributes or nested bindings are in play, the original ``run`` is used.
    Constant nodes (without linked attributes) are evaluated on the first run and reused.
    Without ``intermediate=True``, a tensor is released after its last consumer.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fast_plan = self._make_plan(list(self.rt_nodes_))
        self._fast_consts: dict[int, Any] = {}
        #: once every constant node has its outputs: (the other nodes, their plan entries,
        #: the constant tensors they or the graph's outputs read), see ``_compact``
        self._fast_compact: tuple[list, list, dict[str, Any]] | None = None
        #: when a dict, each run adds every node's seconds under its operator type
        self.node_seconds: dict[str, float] | None = None
        #: the compiled plan (qlinear.graph.plan), built after the first full run, and the
        #: node list it was built for (another one, a progress display's: the general loop)
        self._compiled: CompiledPlan | None = None
        self._compiled_for: Any = None
        #: set when the plan is compiled: the evaluator is one whose plain runs may take it
        #: (no logging, shape-annotation checks or function; a node list naming the running node)
        self._plain = False

    def _make_plan(self, nodes):
        """Per node: how to call it, inputs, outputs, and the tensors whose last consumer it is.

        How to call: ``context`` (control flow: the node reads outer tensors), ``direct``
        (an onnx.reference operator that keeps OpRun's generic ``run``: its ``_run`` is called
        with the attribute values read once, skipping the per-call attribute plumbing),
        ``direct0`` (qlinear's own kernels, marked ``run_ignores_attributes``: ``_run`` with
        the inputs only), ``cast`` (onnx.reference's Cast to a standard numeric type: its
        ``x.astype``), ``binary`` (onnx.reference's elementwise NumPy binaries: the ufunc, after
        the same dtype check), ``const`` (Constant: evaluated once) or ``run``.
        """
        subgraphs = any(node.need_context() for node in nodes)
        last: dict[str, int] = {}
        for i, node in enumerate(nodes):
            for name in node.input:
                last[name] = i
        keep = set(self.output_names) | set(self.rt_inits_) | set(self.input_names) | {""}
        drop: list[list[str]] = [[] for _ in nodes]
        if not subgraphs:  # a subgraph may read any outer tensor: then keep everything
            for name, i in last.items():
                if name not in keep:
                    drop[i].append(name)
        plan = []
        # Tensors with the same value on every run: initializers that no feed can replace (a
        # graph input's initializer is only its default), then the outputs of Constant nodes
        # and of deterministic nodes that read only such tensors (evaluated on the first run
        # and reused, as onnxruntime folds constants when it loads a model: a DequantizeLinear
        # of a constant weight, a Shape-free chain of Reshape constants, ...).
        graph_inputs = set(self.input_names)
        constant = {n for n in self.rt_inits_ if n not in graph_inputs} if not subgraphs else set()
        default_inputs = {n for n in self.rt_inits_ if n in graph_inputs} if not subgraphs else set()
        for i, node in enumerate(nodes):
            how, extra, check = "run", None, None
            impl = node
            if isinstance(getattr(node, "guarded_impl", None), OpRun):
                # a size guard (qlinear.graph.kernels.sizeguard): its check, then the wrapped operator's
                # own fast path below (not the guard's run, which goes through OpRun.run)
                check, impl = node.check_size, node.guarded_impl
            plain = not impl.has_linked_attribute and not getattr(impl, "has_subgraph", False)
            if impl.need_context():
                how = "context"
            elif impl.op_type == "Constant" and plain:
                how = "const"
            elif plain and type(impl).run is OpRun.run and _plain_cast(impl) is not None:
                how, extra = "cast", _plain_cast(impl)
            elif plain and type(impl).run is OpRun.run:
                how, extra = "direct", {a: getattr(impl, a) for a in impl.attributes_names_}
                if getattr(impl, "run_ignores_attributes", False):
                    how, extra = "direct0", None
            elif plain and isinstance(impl, OpRunBinaryNumpy) and len(impl.input) == 2 \
                    and type(impl)._run is OpRunBinaryNumpy._run:
                how, extra = "binary", impl.numpy_fct
            if how in ("context", "const") or (how == "run" and check is not None):
                impl = node  # the guard's own run() checks (context and Constant: unguarded)
                check = None
            fold = (how not in ("context", "const") and plain and impl.op_type not in _NOT_FOLDABLE
                    and all(n in constant for n in node.input if n))
            if fold or how == "const":
                constant.update(n for n in node.output if n)
            outs = list(node.output)
            if "" in outs:
                # an omitted output: its value goes under a key of its own, dropped after the
                # node (under "" it would become the value of every later omitted input)
                outs = [o if o else _OMITTED for o in outs]
                drop[i].append(_OMITTED)
            fast = None
            if (how in ("direct0", "run") and check is None and not fold and impl is node
                    and callable(getattr(type(impl), "fast_path", None))):
                # [the input positions holding model constants (the same objects on every run:
                # initializers no feed replaces, Constant and folded outputs) or a graph input's
                # initializer (its default: the same object unless fed, checked per run), the
                # node's bound short path or None (asked for after a successful call), tries
                # left, the positions of defaults, (position, object) of the defaults it was
                # bound to]
                defaults = tuple(j for j, n in enumerate(node.input) if n in default_inputs)
                fast = [frozenset(j for j, n in enumerate(node.input) if n and n in constant) | set(defaults),
                        None, _FAST_TRIES, defaults, ()]
            plan.append((impl, how, extra, list(node.input), outs, drop[i], check, fast, fold))
        return plan

    def run(self, output_names, feed_inputs, attributes=None, intermediate=False,  # type: ignore[override]
            check_shape_annotations=None, _bindings=None):
        compiled = self._compiled
        if (compiled is not None and output_names is None and attributes is None and _bindings is None
                and not intermediate and not check_shape_annotations and self._plain and not self.verbose
                and self.node_seconds is None and self.rt_nodes_ is self._compiled_for
                and compiled.required.issubset(feed_inputs)):
            # a plain run after the first (the checks below, in short): the compiled plan
            nodes = self.rt_nodes_
            if nodes.current is not None:
                nodes.current = None
            return compiled.run(feed_inputs, nodes)
        if (attributes is not None or _bindings is not None or check_shape_annotations
                or self.check_shape_annotations_ or self.verbose
                or not isinstance(self.proto_, onnx.ModelProto)):
            return super().run(output_names, feed_inputs, attributes=attributes,
                               intermediate=intermediate,
                               check_shape_annotations=check_shape_annotations,
                               _bindings=_bindings)
        if output_names is None:
            output_names = self.output_names
        nodes = self.rt_nodes_  # may be a progress-bar wrapper around the same list
        compiled = self._compiled
        if (compiled is not None and not intermediate and self.node_seconds is None
                and nodes is self._compiled_for and output_names == self.output_names
                and compiled.required.issubset(feed_inputs)):
            # a plain run after the first: the compiled plan (qlinear.graph.plan)
            if getattr(nodes, "current", None) is not None:
                nodes.current = None
            return compiled.run(feed_inputs, nodes if hasattr(nodes, "current") else None)
        plan = self._fast_plan
        consts = self._fast_consts
        results: dict[str, Any] = {"": None}
        results.update(self.rt_inits_)
        results.update(feed_inputs)
        timing = self.node_seconds
        compact = self._fast_compact
        order = nodes
        if compact is not None and not intermediate and isinstance(nodes, list):
            # the constant nodes are done: their tensors go in at once and the loop runs the
            # other nodes only (the list keeps naming the running node for error messages)
            order, plan, const_results = compact
            results.update(const_results)
            if hasattr(nodes, "current"):
                order = _tracking(nodes, order)
        for _, entry in zip(order, plan):
            pnode, how, extra, ins, outs, drop, check, fast, fold = entry
            if timing is not None:
                t0 = time.perf_counter()
            if fold:
                outputs = consts.get(id(pnode))
                if outputs is not None:
                    for name, value in zip(outs, outputs):
                        results[name] = value
                    if timing is not None:
                        timing[pnode.op_type] = timing.get(pnode.op_type, 0.0) + time.perf_counter() - t0
                    continue
            try:
                inputs = [results[i] for i in ins]
            except KeyError as e:
                raise RuntimeError(f"Unable to find input {e.args[0]!r} in known results "
                                   f"{sorted(results)}") from None
            y = guarded_short_path(how, check, fast, inputs)
            if y is not None:
                outputs = (y,)
            elif how == "const":
                outputs = consts.get(id(pnode))
                if outputs is None:
                    outputs = consts[id(pnode)] = pnode.run()
            elif how == "context":
                outputs = pnode.run(*inputs, context=results)
            else:
                outputs = _call(entry, inputs)
            if fold:
                # read-only: a consumer writing into a cached tensor would change later runs
                for o in outputs:
                    if isinstance(o, np.ndarray):
                        o.flags.writeable = False
                consts[id(pnode)] = outputs
            for name, value in zip(outs, outputs):
                results[name] = value
            if not intermediate:
                for name in drop:
                    results.pop(name, None)
            if timing is not None:
                timing[pnode.op_type] = timing.get(pnode.op_type, 0.0) + time.perf_counter() - t0
        if compact is None and isinstance(nodes, list):
            self._fast_compact = self._compact(nodes)
            if self._fast_compact is not None:
                self._compiled = compile_plan(self, *self._fast_compact, _call, _bind_fast)
                self._compiled_for = nodes
                self._plain = (not self.check_shape_annotations_ and not self.verbose
                               and isinstance(self.proto_, onnx.ModelProto) and hasattr(nodes, "current"))
        if intermediate:
            results.pop(_OMITTED, None)
            return results
        missing = [n for n in output_names if n not in results]
        if missing:
            raise RuntimeError(f"Unable to find output name {missing[0]!r} in {sorted(results)}")
        return [results[n] for n in output_names]

    def _compact(self, nodes: list) -> tuple[list, list, dict[str, Any]] | None:
        """The loop without its constant nodes (Constant, and nodes folded on the first run),
        once all of them have run: (the other nodes, their plan entries, the constant
        tensors that those nodes or the graph's outputs read, by name), else None.

        Each value is the one the constant node gave on its first run (what a later run
        reads from ``_fast_consts`` too), so the other nodes see the same tensors."""
        plan, consts = self._fast_plan, self._fast_consts
        if len(nodes) != len(plan):
            return None
        kept, kept_plan, made = [], [], {}
        for node, entry in zip(nodes, plan):
            impl, how, fold, outs = entry[0], entry[1], entry[8], entry[4]
            if fold or how == "const":
                outputs = consts.get(id(impl))
                if outputs is None:
                    return None  # not run yet (an earlier run stopped before it)
                made.update((name, value) for name, value in zip(outs, outputs) if name is not _OMITTED)
            else:
                kept.append(node)
                kept_plan.append(entry)
        needed = set(self.output_names) | {name for entry in kept_plan for name in entry[3]}
        return kept, kept_plan, {name: value for name, value in made.items() if name in needed}
