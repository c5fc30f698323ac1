"""Control-flow operators for the backend: Loop and Scan.

onnx.reference's Loop stacks its scan outputs with ``np.vstack``, which *concatenates* slices
of rank 2 and above along their first axis: a body output of shape (2, 3) over 4 iterations
gives (8, 3) where the operator's definition (and onnxruntime) give (4, 2, 3). qlinear's Loop
stacks along a new first axis for every rank, runs the body as written when ``cond`` is
omitted (the loop then runs ``M`` times), and both operators count the bytes their scan
outputs accumulate, so that a size limit (``max_tensor_bytes``; see :mod:`qlinear.graph.kernels.sizeguard`)
stops a loop as soon as one stacked output passes it, not after memory runs out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx import helper
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
    """ONNX Scan (opsets 9+) as onnx.reference runs it, with its scan outputs counted."""

    op_domain = ""

    def __init__(self, onnx_node, run_params):
        _RefScan.__init__(self, onnx_node, run_params)
        states = len(onnx_node.input) - int(self.num_scan_inputs)
        self._count_scan_outputs(max(len(self.body.output_names) - states, 0))

    def _run(self, *args, **kwargs):
        self._start()
        return super()._run(*args, **kwargs)


#: The control-flow kernels the backend always uses (no limit).
CONTROL_KERNELS = [Loop, Scan]


def limited(limit: int) -> list[type]:
    """Loop and Scan stopping when a scan output passes ``limit`` bytes."""
    return [type(k.__name__, (k,), {"_limit": int(limit)}) for k in CONTROL_KERNELS]
