"""What every replacement kernel of the graph runtime shares."""

from __future__ import annotations

from typing import Any, Callable

from onnx.reference.op_run import OpRun

from ..errors import NodeError
from ..proto import node_attributes


def constants_at(op: OpRun, positions: tuple[int, ...]) -> bool | None:
    """Whether every input of ``op``'s node at ``positions`` (those present and named) is a
    constant of the model: the same array object, never written, on every run, which is what
    lets a node keep what it derived from it. None while unknown (``constant_inputs`` not set
    by the backend's QLinearRep): nothing may then be kept across runs."""
    known = op.constant_inputs
    if known is None:
        return None
    names = op.onnx_node.input
    return all(names[i] in known for i in positions if i < len(names) and names[i])


def data_path(run: Callable[[Any], Any]) -> Callable[[list], Any]:
    """A ``fast_path`` answer that reads only the node's first input: ``f(inputs)`` is
    ``run(inputs[0])``, and ``f.data`` is ``run``, which the compiled plan
    (``qlinear.graph.plan``) calls with that input alone (no argument list per call)."""
    def f(ins: list) -> Any:
        return run(ins[0])
    f.data = run  # type: ignore[attr-defined]
    return f


class KernelOp(OpRun):
    """Base of the replacement kernels (``standard``, ``contrib``): the node's attributes, error
    wrapping with the node's name, operator and version, the prepared form of its constant
    weights kept across runs, and the checks a ``fast_path`` makes.

    ``fast_path(inputs, fixed)``, defined by the kernels that have one (the graph loop,
    ``qlinear.graph.evaluator.FastEvaluator``, asks only those): asked after a call of
    ``_run(*inputs)`` that succeeded, a function of the node's input list giving its one output
    for inputs whose positions in ``fixed`` hold these very objects (the loop guarantees it:
    the model's constants) and whose other inputs are like these (the function checks them),
    and None otherwise (the loop then calls ``_run``); or None when there is none. It must give
    exactly ``_run``'s result. Only the exact classes take it (an emulating subclass overrides
    ``_run``)."""

    op_domain = ""
    version = 1
    #: ``_run`` reads the attributes from ``self.given``: the graph loop passes the inputs only
    run_ignores_attributes = True
    #: Names of this node's inputs that are constants of the model (initializers, Constant
    #: outputs); set by QLinearRep. None (unknown): nothing is cached across runs.
    constant_inputs: frozenset[str] | None = None
    _cache_key: tuple | None = None   # the ids of the weights ``_prepared`` was made from
    _prepared: Any = None
    _weights_ref: tuple = ()          # those weights, kept alive so that their ids stay unique

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        self.given = node_attributes(onnx_node)

    def _fail(self, msg: str) -> NodeError:
        domain = f"{self.op_domain}." if self.op_domain else ""
        return NodeError(f"node {self.onnx_node.name or self.onnx_node.output[0]!r} "
                         f"({domain}{self.onnx_node.op_type}-{self.version}): {msg}")

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            raise self._fail(str(e)) from e

    def _prepared_for(self, factory: Callable, weights: tuple, positions: tuple[int, ...], **kwargs):
        """``factory(*weights, **kwargs)`` for these weight arrays (inputs at ``positions`` of the
        node), cached across runs only when every one of them is a constant of the model (the
        same array object, never written, on every run): the pretransform is then paid once
        per model. A weight fed as a graph input or computed at run time is prepared on each
        run, so a caller reusing a buffer with new values gets results for the new values."""
        constant = constants_at(self, positions) is True
        key = tuple(id(w) for w in weights)
        if constant and key == self._cache_key and self._prepared is not None:
            return self._prepared
        prepared = self._call(factory, *weights, **kwargs)
        if constant:
            self._prepared, self._cache_key, self._weights_ref = prepared, key, weights
        return prepared

    def _bound(self, inputs: list, fixed: frozenset[int], params: tuple[int, ...]) -> bool:
        """Whether the inputs at ``params`` (those given) are all fixed for ``fast_path``."""
        return all(i in fixed for i in params if i < len(inputs) and inputs[i] is not None)

    def _kw(self, *names: str) -> dict[str, Any]:
        """The given attributes among ``names``, lists as lists, for a keyword call."""
        return {k: (list(self.given[k]) if isinstance(self.given[k], (list, tuple)) else self.given[k])
                for k in names if k in self.given}
