"""Control-flow operators for the backend: Loop and Scan.

onnx.reference's Loop stacks its scan outputs with ``np.vstack``, which *concatenates* slices
of rank 2 and above along their first axis: a body output of shape (2, 3) over 4 iterations
gives (8, 3) where the operator's definition (and onnxruntime) give (4, 2, 3). qlinear's Loop
stacks along a new first axis for every rank, runs the body as written when ``cond`` is
omitted (the loop then runs ``M`` times), and both operators count the bytes their scan
outputs accumulate, so that a size limit (``max_tensor_bytes``; see :mod:`qlinear.graph.kernels.sizeguard`)
stops a loop as soon as one stacked output passes it, not after memory runs out.

onnx.reference's Scan runs only scan axes 0 and forward directions; qlinear's runs every
``scan_input_axes`` / ``scan_output_axes`` (negative ones counted from the end, the output's
rank being the body output's plus one) and both directions of inputs and outputs, as the
operator's definition and onnxruntime do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx import helper
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _RefLoop
from onnx.reference.ops.op_scan import Scan as _RefScan

from ..errors import NodeError


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _ScanOutputCounter:
    """Mixin: wraps the body call (``_run_body``, set per instance by OpRun from the ``body``
    attribute) to add each iteration's scan-output bytes to a running total per output;
    above ``_limit`` (None: no limit) the loop stops with NodeError before its next
    iteration."""

    _limit: int | None = None

    def _count_scan_outputs(self, count: int) -> None:
        run_body = self._run_body
        self._scan_count = count
        self._totals = [0] * count
        self._iterations = 0

        def counted(*args: Any, **kwargs: Any):
            outputs = run_body(*args, **kwargs)
            self._iterations += 1
            if count and self._limit is not None:
                for i, o in enumerate(list(outputs)[-count:]):
                    self._totals[i] += int(getattr(o, "nbytes", 0))
                    if self._totals[i] > self._limit:
                        self._refuse(i)
            return outputs

        self._run_body = counted

    def _refuse(self, i: int) -> None:
        node = self.onnx_node
        name = node.name or node.output[0]
        body_name = list(self.body.output_names)[-self._scan_count + i]
        raise NodeError(
            f"node {name!r} ({node.op_type}): scan output {i} (body output {body_name!r}) has "
            f"grown to {_human_bytes(self._totals[i])} after {self._iterations} iterations, "
            f"more than the limit of {_human_bytes(self._limit)} per tensor "
            "(max_tensor_bytes, qlinear's --max-tensor-bytes)")

    def _start(self) -> None:  # per call: a Loop node runs once per model run
        self._totals = [0] * self._scan_count
        self._iterations = 0


class Loop(_ScanOutputCounter, _RefLoop):
    """ONNX Loop (opsets 1-21): ``M`` trips at most, while ``cond``; carried values; scan
    outputs stacked along a new first axis."""

    op_domain = ""

    def __init__(self, onnx_node, run_params):
        _RefLoop.__init__(self, onnx_node, run_params)
        self._count_scan_outputs(self.K)

    def _run(self, M, cond, *args, context=None, body=None, attributes=None,  # noqa: N803
             bindings=None):
        self._start()
        names_in = self.body.input_names
        names_out = self.body.output_names
        inputs: dict[str, Any] = dict.fromkeys(names_in)
        if context is not None:
            inputs.update(context)
        for name, value in zip(names_in[2:], args):  # the N carried values
            inputs[name] = value
        trips = None if M is None or np.size(M) == 0 else int(np.asarray(M).reshape(-1)[0])
        go = True if cond is None or np.size(cond) == 0 else bool(np.asarray(cond).reshape(-1)[0])
        slices: list[list[np.ndarray]] = [[] for _ in range(self.K)]
        it = 0
        while go and (trips is None or it < trips):
            if names_in[0]:
                inputs[names_in[0]] = np.array(it, dtype=np.int64)
            if len(names_in) > 1 and names_in[1]:
                inputs[names_in[1]] = np.array(go)
            outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
            got = dict(zip(names_out, outputs))
            go = bool(np.asarray(got[names_out[0]]).reshape(-1)[0])
            for name_in, name_out in zip(names_in[2:], names_out[1:1 + self.N]):
                inputs[name_in] = got[name_out]
            for k, name in enumerate(names_out[1 + self.N:]):
                slices[k].append(np.asarray(got[name]))
            it += 1
        results = [inputs[name] for name in names_in[2:2 + self.N]]
        for k, parts in enumerate(slices):
            results.append(np.stack(parts) if parts else self._empty_scan_output(k))
        return tuple(results)

    def _empty_scan_output(self, k: int) -> np.ndarray:
        """A loop that ran no iteration: an empty tensor of the body output's declared type,
        shape (0, *declared dims) when they are all known, (0,) otherwise."""
        graph = helper.get_attribute_value(
            next(a for a in self.onnx_node.attribute if a.name == "body"))
        vi = graph.output[1 + self.N + k]
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else np.float32
        dims = [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else []
        known = tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
        return np.zeros((0, *dims) if known else (0,), dtype=dtype)


class Scan(_ScanOutputCounter, _RefScan):
    """ONNX Scan (opsets 9+): ``N`` state variables carried through the body, ``M`` scan inputs
    sliced along their ``scan_input_axes`` (forward, or backward where ``scan_input_directions``
    is 1), the body's scan outputs stacked along their ``scan_output_axes`` (in reverse order
    where ``scan_output_directions`` is 1), the scan outputs counted against the size limit."""

    op_domain = ""

    def __init__(self, onnx_node, run_params):
        # onnx.reference's constructor refuses non-zero axes and directions: the attributes are
        # read as OpRun reads them, the body prepared the same way, and the checks left out
        OpRun.__init__(self, onnx_node, run_params)
        if not hasattr(self.body, "run"):
            raise RuntimeError(f"Parameter 'body' must have a method 'run', type {type(self.body)}.")
        m = int(self.num_scan_inputs)
        name = onnx_node.name or (onnx_node.output[0] if onnx_node.output else "?")
        if m <= 0 or m > len(onnx_node.input):
            raise ValueError(f"Scan node {name!r}: num_scan_inputs must be between 1 and the number of "
                             f"inputs ({len(onnx_node.input)}); got {m}")
        states = len(onnx_node.input) - m
        k = max(len(self.body.output_names) - states, 0)
        self._m, self._k = m, k
        self.input_names = self.body.input_names
        self.output_names = self.body.output_names

        def attr(name_: str, count: int) -> list[int]:
            values = list(getattr(self, name_, None) or [])
            if len(values) > count:
                raise ValueError(f"Scan node {name!r}: attribute {name_} has {len(values)} values, "
                                 f"more than the {count} {'scan inputs' if 'input' in name_ else 'scan outputs'}")
            return [int(v) for v in values] + [0] * (count - len(values))

        self._in_axes = attr("scan_input_axes", m)
        self._in_dirs = attr("scan_input_directions", m)
        self._out_axes = attr("scan_output_axes", k)
        self._out_dirs = attr("scan_output_directions", k)
        for what, dirs in (("scan_input_directions", self._in_dirs),
                           ("scan_output_directions", self._out_dirs)):
            if any(d not in (0, 1) for d in dirs):
                raise ValueError(f"Scan node {name!r}: attribute {what} takes 0 (forward) or 1 "
                                 f"(reverse); got {dirs}")
        self._node_name = name
        self._count_scan_outputs(k)

    def _axis(self, axis: int, rank: int, what: str) -> int:
        if not -rank <= axis < rank:
            raise ValueError(f"Scan node {self._node_name!r}: {what} is {axis}, outside [{-rank}, {rank - 1}] "
                             f"for a tensor of rank {rank}")
        return axis + rank if axis < 0 else axis

    def _run(self, *args, context=None, attributes=None, bindings=None, **_attrs):  # type: ignore[override]
        self._start()
        n = len(args) - self._m
        states = list(args[:n])
        scans = [np.asarray(a) for a in args[n:]]
        axes = [self._axis(ax, s.ndim, f"scan_input_axes[{i}]") for i, (ax, s) in
                enumerate(zip(self._in_axes, scans))]
        lengths = {s.shape[ax] for s, ax in zip(scans, axes)}
        if len(lengths) != 1:
            got = ", ".join(f"{s.shape[ax]} (input {n + i}, axis {ax})"
                            for i, (s, ax) in enumerate(zip(scans, axes)))
            raise ValueError(f"Scan node {self._node_name!r}: the scan inputs differ in length along "
                             f"their scan axes: {got}")
        trips = lengths.pop()
        names_in, names_out = self.input_names, self.output_names
        state_in, scan_in = names_in[:n], names_in[n:]
        parts: list[list[np.ndarray]] = [[] for _ in range(self._k)]
        for it in range(trips):
            inputs: dict[str, Any] = {}
            if context is not None:
                inputs.update(context)  # outer-scope names, shadowed by the body's own below
            inputs.update(zip(state_in, states))
            for name, s, ax, d in zip(scan_in, scans, axes, self._in_dirs):
                inputs[name] = s[(slice(None),) * ax + (trips - 1 - it if d else it,)]
            outputs = self._run_body(inputs, bindings=bindings)
            states = list(outputs[:n])
            for k, o in enumerate(list(outputs)[n:n + self._k]):
                parts[k].append(np.asarray(o))
        if trips == 0 and self._k:
            # the slices' shape and type are known only by running the body
            raise RuntimeError("Scan with zero scan-input length and scan outputs is not supported.")
        results = states
        for k, slices in enumerate(parts):
            if self._out_dirs[k]:
                slices = slices[::-1]
            ax = self._axis(self._out_axes[k], slices[0].ndim + 1, f"scan_output_axes[{k}]")
            results.append(np.stack(slices, axis=ax))
        return self._check_and_fix_outputs(tuple(results))


#: The control-flow kernels the backend always uses (no limit).
CONTROL_KERNELS = [Loop, Scan]


def limited(limit: int) -> list[type]:
    """Loop and Scan stopping when a scan output passes ``limit`` bytes."""
    return [type(k.__name__, (k,), {"_limit": int(limit)}) for k in CONTROL_KERNELS]
