"""Comparison of qlinear and onnxruntime on one model and one set of inputs.

- **Model outputs** are compared with onnxruntime's *normal* session (default graph
  optimizations: what a user deploys; on QDQ models it fuses DequantizeLinear -> op ->
  QuantizeLinear into quantized kernels, which can change results).
- **Per-node rows** come from a second onnxruntime run on a copy of the model whose graph
  outputs list every node output (exposing intermediates switches off the fusions that
  would hide them), against qlinear's intermediates.
- **Verdicts**: integer tensors are compared exactly (identical or DIFFER); float tensors are
  *identical* (bit for bit), *within tolerance* (every element |q - o| <= atol + rtol * |o|, or
  within ``ulp`` float32 units in the last place), or DIFFER. A node's verdict is its worst
  tensor's; the overall verdict is the worst model output's.
- **Timings** are warm medians of plain runs (the first run apart) of the normal
  onnxruntime session and of qlinear, never of the instrumented runs.

For each node: elements, mismatching elements, the largest difference (in quantization
steps for integer tensors and for DequantizeLinear's output; absolute and relative for other
float tensors, with float32 ulps only where the values are not near zero), and a diagnosis:

- *propagated*: the node's inputs already differ, and qlinear's kernel run on onnxruntime's
  own inputs reproduces onnxruntime's output, so the node itself agrees;
- *onnxruntime 16-bit saturation*: a uint8 x int8 QLinearConv / QLinearMatMul (and the other
  operators on onnxruntime's u8 x s8 GEMM: ConvInteger, MatMulInteger, com.microsoft QGemm,
  MatMulIntegerToFloat, DynamicQuantizeMatMul, QAttention) whose pair
  sums exceed 32767 (see :mod:`qlinear.engines.ort_avx2`); where the emulation reproduces
  onnxruntime's values exactly, it says so;
- *MatMulNBits*: "onnxruntime quantizes activations (accuracy_level 4)" where its int8 kernel
  runs (the same int8 codes as qlinear; the block sums' float order differs) or "float
  reduction order" at the float levels, each with the measured magnitude and both runtimes'
  distance from the exact sum; under ``qdq="literal"`` an output that onnxruntime's session
  computes through fused MatMulNBits at accuracy_level 4 says so;
- otherwise the size of the difference (float ulps), without a claim about its cause.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from qlinear import dtypes as qdtypes
from qlinear.backend import (QLinearRep, UnsupportedModelError, apply_qdq, check_model, inline_functions,
                             kernels_for)
from qlinear.contrib.nbits import prepare_matmul_nbits
from qlinear.graph.proto import node_attributes, subgraphs
from qlinear.graph.registry import FLOAT_KERNELS  # the float operators the backend runs
from qlinear.tools import ortsat
from qlinear.tools.formats import onnxruntime_cannot_run, onnxruntime_divergence, reference_divergence
from qlinear.tools.table import format_table, node_progress, progress

_GEMM_OPS = ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger")
#: onnxruntime's com.microsoft operators on its u8 x s8 GEMM (saturating on AVX2 without VNNI;
#: qlinear.graph.modes emulates them). Its QLinearConv is diagnosed as the standard one.
_CONTRIB_GEMM_OPS = ("QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention")


def expose_all(model: onnx.ModelProto, dtypes: dict[str, np.dtype]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose graph outputs include every node output qlinear computed."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    added = []
    for node in m.graph.node:
        for name in node.output:
            if name and name not in existing and name in dtypes:
                try:
                    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtypes[name]))
                except Exception:
                    continue
                m.graph.output.append(helper.make_tensor_value_info(name, elem, None))
                existing.add(name)
                added.append(name)
    return m, added


#: onnxruntime's intra-op threads for compare's sessions (0: its default, every core). The
#: dataset mode's workers set 1: one worker a core, and results that cannot depend on how the
#: samples were split.
ORT_THREADS = 0


def _session(model: onnx.ModelProto, options: dict[str, str] | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors come back as exceptions; keep stderr to one line
    if ORT_THREADS:
        so.intra_op_num_threads = ORT_THREADS
    for key, value in (options or {}).items():  # the QDQ fusion's keys qlinear was given too
        so.add_session_config_entry(key, str(value))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run_session(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.log_severity_level = 4
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds, ro)))


class _ReferenceSession:
    """onnx.reference in the place of onnxruntime's session, for a model onnxruntime 1.32
    cannot run (qlinear.tools.formats.onnxruntime_cannot_run): ``run`` gives the outputs,
    ``run_all`` every tensor (the per-node rows)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.evaluator = ReferenceEvaluator(model)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.model.graph.output]
        with np.errstate(all="ignore"):
            return dict(zip(names, self.evaluator.run(names, feeds)))

    def run_all(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with np.errstate(all="ignore"):
            return {k: v for k, v in self.evaluator.run(None, feeds, intermediate=True).items()
                    if k and isinstance(v, np.ndarray)}


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of ``model`` in an onnxruntime CPU session with default options."""
    return _run_session(_session(model), feeds)


#: Defaults of --atol / --rtol, as polygraphy's: |q - o| <= atol + rtol * |o|.
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5


def _ulp_each(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place, element by element (monotone integer
    mapping of the float32 bit patterns)."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def _mismatch(q: np.ndarray, r: np.ndarray, ulp: int = 0) -> np.ndarray:
    """Elements that are not bit-identical (NaN equals NaN); float32 elements within ``ulp``
    units in the last place count as equal."""
    if q.shape != r.shape or q.dtype != r.dtype:
        return np.ones(max(q.size, r.size, 1), bool)
    if np.issubdtype(q.dtype, np.floating):
        same = (q == r) | (np.isnan(q) & np.isnan(r))
        if ulp and q.dtype == np.float32:
            same |= _ulp_each(q, r) <= ulp
        return ~same
    if q.dtype.kind == "V":  # ml_dtypes' narrow types (float8, int4, ...): bit for bit, NaN = NaN
        u = np.dtype(f"u{q.dtype.itemsize}")
        return q.view(u) != r.view(u)
    return q != r


def _narrow_float(dt: np.dtype) -> bool:
    """bfloat16, float8, float6, float4 (ml_dtypes): compared as floats."""
    if dt.kind != "V":
        return False
    try:
        return qdtypes.get(dt).kind in ("float", "wide", "e8m0")
    except (KeyError, ValueError, TypeError):
        return False


VERDICTS = ("identical", "within tolerance", "DIFFER")


def compare_tensor(q: Any, r: Any, *, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
                   ulp: int = 0) -> dict[str, Any]:
    """qlinear's ``q`` against onnxruntime's ``r``: a verdict and the figures behind it.

    Integer (quantized) tensors: "identical" or "DIFFER", with the largest difference in
    steps. Float tensors: "identical" (bit for bit, NaN = NaN), "within tolerance" (each
    element |q - r| <= atol + rtol * |r|, or within ``ulp`` float32 ulps), else "DIFFER"; with
    max_abs, max_rel (over r != 0) and max_ulp. max_ulp counts only elements with |r| > atol
    (near zero the ulp distance between two tiny numbers is huge and means nothing; the
    absolute difference says it), and is None when no differing element qualifies.
    """
    q, r = np.asarray(q), np.asarray(r)
    out: dict[str, Any] = {"elements": int(q.size), "mismatches": 0, "outside": 0,
                           "verdict": "identical",
                           "kind": "float" if q.dtype.kind == "f" or _narrow_float(q.dtype) else "integer"}
    if q.dtype.kind in "OSU" or r.dtype.kind in "OSU":
        return _compare_strings(q, r, out)
    if q.shape != r.shape or q.dtype != r.dtype:
        out.update(mismatches=int(max(q.size, r.size)), outside=int(max(q.size, r.size)),
                   verdict="DIFFER",
                   problem=f"qlinear {q.dtype}{list(q.shape)}, onnxruntime {r.dtype}{list(r.shape)}")
        return out
    bad = _mismatch(q, r)
    out["mismatches"] = int(bad.sum())
    if not out["mismatches"]:
        return out
    if out["kind"] != "float":
        out["max_steps"] = int(np.abs(q.astype(np.int64) - r.astype(np.int64)).max())
        out["outside"] = out["mismatches"]
        out["verdict"] = "DIFFER"
        return out
    qd, rd = q[bad].astype(np.float64), r[bad].astype(np.float64)
    both_nan = np.isnan(qd) & np.isnan(rd)
    diff = np.abs(qd - rd)
    diff[both_nan] = 0
    with np.errstate(invalid="ignore"):
        ok = diff <= atol + rtol * np.abs(rd)  # False for NaN against a number, inf mismatches
    if ulp and q.dtype == np.float32:
        ok |= _ulp_each(q[bad], r[bad]) <= ulp
    ok |= both_nan
    out["outside"] = int((~ok).sum())
    out["verdict"] = "within tolerance" if not out["outside"] else "DIFFER"
    finite = np.isfinite(diff)
    out["max_abs"] = float(diff[finite].max()) if finite.any() else float("inf")
    nz = (rd != 0) & finite
    out["max_rel"] = float((diff[nz] / np.abs(rd[nz])).max()) if nz.any() else None
    # ulps mean something only between two numbers of the same sign away from zero, and only
    # while they are few (beyond 1024 the relative difference says it better).
    floor = max(atol, float(np.finfo(np.float32).tiny))
    meaningful = ((np.abs(rd) > floor) & (np.abs(qd) > floor) & (np.sign(qd) == np.sign(rd))
                  & finite & (q.dtype == np.float32))
    max_ulp = int(_ulp_each(q[bad][meaningful], r[bad][meaningful]).max()) if meaningful.any() else None
    out["max_ulp"] = max_ulp if max_ulp is not None and max_ulp <= 1024 else None
    return out


def _compare_strings(q: np.ndarray, r: np.ndarray, out: dict[str, Any]) -> dict[str, Any]:
    """String tensors, exactly: onnxruntime returns them as object arrays, onnx.reference
    (hence qlinear) as unicode arrays, so the values are compared, not the dtypes."""
    out["kind"] = "string"
    qs, rs = q.astype(str), r.astype(str)
    if qs.shape != rs.shape:
        n = int(max(q.size, r.size))
        out.update(mismatches=n, outside=n, verdict="DIFFER",
                   problem=f"qlinear {q.dtype}{list(q.shape)}, onnxruntime {r.dtype}{list(r.shape)}")
        return out
    bad = qs != rs
    n = int(bad.sum())
    if n:
        i = np.flatnonzero(bad)[0]
        out.update(mismatches=n, outside=n, verdict="DIFFER",
                   problem=f"{n} of {q.size} strings differ, e.g. qlinear {str(qs.flat[i])!r}, "
                           f"onnxruntime {str(rs.flat[i])!r}")
    return out


def _worst(verdicts) -> str:
    return max(verdicts, key=VERDICTS.index, default="identical")


def _median_seconds(fn, budget: float, max_runs: int) -> dict[str, Any]:
    """First run timed apart, then warm runs until ``max_runs`` or the time ``budget``."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    warm: list[float] = []
    spent = 0.0
    while len(warm) < max_runs and (len(warm) < 1 or spent < budget):
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
        spent += warm[-1]
    return {"first": round(first, 5), "median": round(float(np.median(warm)), 5), "runs": len(warm)}


def _run_node_qlinear(node, opsets, values: dict[str, np.ndarray], emulate: str | None = None,
                      exact: bool = False, cache: dict | None = None) -> dict[str, np.ndarray]:
    """``node`` run alone by qlinear's kernels on ``values``. ``cache`` (a Comparison's, for
    one model): the single-node evaluators kept across inputs, by node, kernels and input
    types and shapes (building one costs about as much as running it)."""
    ins = list(dict.fromkeys([n for n in node.input if n] + [n for n in _outer_names(node) if n in values]))
    key = None
    if cache is not None:
        key = (id(node), None if exact else emulate,
               tuple((n, values[n].dtype.str, values[n].shape) for n in ins))
    ev = cache.get(key) if cache is not None else None
    if ev is None:
        g = helper.make_graph(
            [node], "single",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype),
                                           values[n].shape) for n in ins],
            [helper.make_empty_tensor_value_info(o) for o in node.output if o])
        m = helper.make_model(g, opset_imports=list(opsets))
        ev = ReferenceEvaluator(m, new_ops=kernels_for(None if exact else emulate) + FLOAT_KERNELS)
        if cache is not None:
            cache[key] = ev
    outs = [o for o in node.output if o]
    return dict(zip(outs, ev.run(None, {n: values[n] for n in ins})))


def _outer_names(node) -> list[str]:
    """The outer graph's tensors that ``node``'s subgraphs (If, Loop, Scan bodies, at any depth)
    read: re-run alone, the node needs them as inputs too, and when they differ its inputs do."""
    names: dict[str, None] = {}

    def visit(graph, defined: set[str]) -> None:
        defined = defined | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        defined |= {t.values.name for t in graph.sparse_initializer}
        for n in graph.node:
            defined |= {o for o in n.output if o}
        for n in graph.node:
            for i in n.input:
                if i and i not in defined:
                    names[i] = None
            for sub in subgraphs(n):
                visit(sub, defined)

    for sub in subgraphs(node):
        visit(sub, set())
    return list(names)


def compare_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *,
                  show_progress: bool | None = None, ulp: int = 0, atol: float = DEFAULT_ATOL,
                  rtol: float = DEFAULT_RTOL, emulate: str | None = None,
                  timing_budget: float = 1.0, timing_runs: int = 5,
                  max_tensor_bytes: int | None = None, qdq: str = "fuse",
                  options: dict[str, str] | None = None) -> dict[str, Any]:
    """Run both runtimes, compare the outputs (normal onnxruntime session) and every node
    (intermediates-exposed run); returns rows, outputs, verdicts, timings.

    ``atol``/``rtol``/``ulp``: the tolerance of float tensors (see :func:`compare_tensor`);
    integer tensors are always compared exactly. ``emulate="onnxruntime-avx2"`` runs qlinear
    emulating onnxruntime on AVX2 CPUs without VNNI. Timings: the first run apart, then warm
    runs up to ``timing_runs`` or ``timing_budget`` seconds each (at least one), medians.

    ``qdq="fuse"`` (default): qlinear runs a QDQ model as onnxruntime's optimizer rewrites it
    (qlinear.qdq); the node rows compare that rewritten graph in both runtimes (exposing the
    original graph's tensors as outputs would stop onnxruntime's own fusion), the outputs
    compare with onnxruntime's normal session on the model as given. ``"literal"``: qlinear
    runs the graph as written. ``options``: onnxruntime session keys of the QDQ fusion
    (``{"session.qdq_matmulnbits_accuracy_level": "0"}``), given to both runtimes.
    """
    comparison = Comparison(model, ulp=ulp, atol=atol, rtol=rtol, emulate=emulate,
                            max_tensor_bytes=max_tensor_bytes, qdq=qdq, single_shot=True,
                            options=options)
    result = comparison.run(feeds, show_progress=show_progress)
    rep, normal = comparison.rep, comparison.normal
    result["seconds"] = {
        "qlinear": _median_seconds(lambda: rep.run(feeds), timing_budget, timing_runs),
        "onnxruntime": _median_seconds(lambda: normal.run(feeds) if isinstance(normal, _ReferenceSession)
                                       else _run_session(normal, feeds), timing_budget, timing_runs),
    }
    return result


class Comparison:
    """A model prepared once for comparing qlinear and onnxruntime on many inputs: qlinear's
    representation, onnxruntime's normal session and (after the first run, which gives the
    intermediates' dtypes) its intermediates-exposed session. ``run(feeds)`` returns what
    :func:`compare_model` returns, without timings; ``last_values`` then holds qlinear's
    tensors, onnxruntime's (exposed run over qlinear's inputs and initializers) and
    onnxruntime's normal-session outputs, for figures beyond the report (``qlinear compare
    --dataset``). ``single_shot``: one run (the exposed copy gets a session of its own via
    :func:`run_onnxruntime`, not kept)."""

    def __init__(self, model: onnx.ModelProto, *, ulp: int = 0, atol: float = DEFAULT_ATOL,
                 rtol: float = DEFAULT_RTOL, emulate: str | None = None,
                 max_tensor_bytes: int | None = None, qdq: str = "fuse",
                 single_shot: bool = False, options: dict[str, str] | None = None) -> None:
        if atol < 0 or rtol < 0 or ulp < 0:
            raise ValueError("compare: atol, rtol and ulp must be 0 or more")
        problems = check_model(model)
        if problems:
            raise UnsupportedModelError(problems)
        model = inline_functions(model)
        self.original = model
        self.options = options
        #: why onnxruntime 1.32 cannot run the model (its newer-format nodes): then both the
        #: outputs and the node rows are compared with onnx.reference, on the graph as written
        self.onnxruntime_cannot = onnxruntime_cannot_run(model)
        if self.onnxruntime_cannot:
            qdq = "literal"
        self.model = apply_qdq(model, qdq, options)
        self.rep = QLinearRep(self.model, emulate=emulate, max_tensor_bytes=max_tensor_bytes)
        self.emulate, self.qdq, self.single_shot = emulate, qdq, single_shot
        self.tol = dict(atol=atol, rtol=rtol, ulp=ulp)
        self.normal = None
        self._exposed: tuple[Any, Any] | None = None  # (dtypes key, session or error)
        self.last_values: tuple[dict, dict, dict] | None = None
        #: single-node evaluators of the diagnoses, kept across inputs (_run_node_qlinear)
        self._evaluators: dict | None = None if single_shot else {}

    def _normal_outputs(self, feeds):
        if self.onnxruntime_cannot:
            if self.normal is None:
                self.normal = _ReferenceSession(self.original)
            return self.normal.run(feeds)
        try:
            if self.normal is None:
                self.normal = (_session(self.original, self.options) if self.options
                               else _session(self.original))
            return _run_session(self.normal, feeds)
        except Exception as e:
            raise RuntimeError(f"onnxruntime cannot run this model: {_one_line(e)}") from None

    def _exposed_values(self, dtypes: dict[str, np.dtype], feeds):
        if self.onnxruntime_cannot:
            return _ReferenceSession(self.model).run_all(feeds)
        exposed, _ = expose_all(self.model, dtypes)
        if self.single_shot:
            return run_onnxruntime(exposed, feeds)
        key = tuple(sorted((k, str(v)) for k, v in dtypes.items()))
        if self._exposed is None or self._exposed[0] != key:
            try:
                self._exposed = (key, _session(exposed))
            except Exception as e:  # noqa: BLE001 - reported as the note, as in one run
                self._exposed = (key, e)
        if isinstance(self._exposed[1], Exception):
            raise self._exposed[1]
        return _run_session(self._exposed[1], feeds)

    def run(self, feeds: dict[str, np.ndarray], show_progress: bool | None = None) -> dict[str, Any]:
        """Compare one set of inputs (see :func:`compare_model`; no ``seconds``)."""
        model, original, emulate = self.model, self.original, self.emulate
        ql = self.rep.run_all(feeds, progress=node_progress(show_progress))
        dtypes = {k: v.dtype for k, v in ql.items() if isinstance(v, np.ndarray)}
        note = ""
        ort_outputs = self._normal_outputs(feeds)
        try:
            ort_vals = self._exposed_values(dtypes, feeds)
        except Exception as e_exposed:  # compare outputs only
            ort_vals = dict(ort_outputs)
            note = ("onnxruntime could not run the copy with intermediate outputs "
                    f"({_one_line(e_exposed)}); only graph outputs are compared")
        _as_qlinear_dtypes(ort_vals, ql)
        _as_qlinear_dtypes(ort_outputs, ql)
        values_ort = dict(ql)  # initializers and inputs are shared; node outputs replaced below
        values_ort.update(ort_vals)
        self.last_values = (ql, values_ort, ort_outputs)
        return self._report(model, original, emulate, ql, ort_vals, values_ort, ort_outputs,
                            note, show_progress)

    def _report(self, model, original, emulate, ql, ort_vals, values_ort, ort_outputs, note,
                show_progress) -> dict[str, Any]:
        tol = self.tol
        atol, rtol, ulp = tol["atol"], tol["rtol"], tol["ulp"]
        qdq = self.qdq
        rows = []
        mismatched_tensors: set[str] = set()
        nodes = list(model.graph.node)
        for i, node in enumerate(progress(nodes, total=len(nodes), desc="compare",
                                          enabled=show_progress)):
            label = node.name or f"#{i} {node.op_type}"
            row: dict[str, Any] = {"node": label, "op": node.op_type, "elements": 0,
                                   "mismatches": 0, "verdict": "identical", "max_diff": 0,
                                   "unit": "", "max_abs": None, "max_rel": None, "max_ulp": None,
                                   "diagnosis": ""}
            steps: list[float] = []
            floats: list[dict[str, Any]] = []
            uncompared: list[str] = []
            compared = 0
            for out in node.output:
                if not out or out not in ql:
                    continue
                if out not in ort_vals or not isinstance(ql[out], np.ndarray):
                    uncompared.append(out)  # a sequence or map: never exposed, not compared
                    continue
                compared += 1
                q, r = np.asarray(ql[out]), np.asarray(ort_vals[out])
                c = compare_tensor(q, r, **tol)
                row["elements"] += c["elements"]
                row["mismatches"] += c["mismatches"]
                row["verdict"] = _worst([row["verdict"], c["verdict"]])
                if not c["mismatches"]:
                    continue
                mismatched_tensors.add(out)
                if "problem" in c:
                    row["diagnosis"] = (c["problem"] if c["kind"] == "string"
                                        else f"shapes or types differ: {c['problem']}")
                    row["max_diff"], row["unit"] = None, ""
                elif c["kind"] == "integer":
                    steps.append(c["max_steps"])
                elif node.op_type == "DequantizeLinear" and np.asarray(ql[node.input[1]]).size == 1:
                    scale = float(np.asarray(ql[node.input[1]]).reshape(()))
                    steps.append(round(c["max_abs"] / scale, 3))
                else:
                    floats.append(c)
            if (steps or floats) and row["max_diff"] is not None:  # None: shapes or types differ
                # A node's outputs can be of both kinds (DynamicQuantizeLinear: uint8 y, float
                # scale): quantization steps and absolute differences are kept apart, never one
                # maximum over both, and each figure is the largest over the tensors of its kind.
                if floats:
                    row["max_abs"] = max(f["max_abs"] for f in floats)
                    row["max_rel"] = _max_or_none(f["max_rel"] for f in floats)
                    row["max_ulp"] = _max_or_none(f["max_ulp"] for f in floats)
                row["max_diff"], row["unit"] = ((max(steps), "steps") if steps
                                                else (row["max_abs"], "abs"))
            row["own_verdict"] = "identical" if not row["mismatches"] else None
            if uncompared and not compared:  # "identical" would claim a comparison never made
                kinds = {"sequence" if isinstance(ql[o], list) else "tensor" for o in uncompared}
                row.update(verdict="not compared", own_verdict=None, max_diff=None,
                           diagnosis=f"not compared: {', '.join(map(repr, uncompared))} "
                                     f"({' or '.join(sorted(kinds))}) is not among onnxruntime's results")
            if row["mismatches"] and not row["diagnosis"]:
                info: dict[str, Any] = {}
                row["diagnosis"] = _diagnose(node, model.opset_import, ql, values_ort,
                                             mismatched_tensors, emulate, info=info, tol=tol,
                                             cache=self._evaluators,
                                             against="onnx.reference" if self.onnxruntime_cannot else "onnxruntime")
                row["own_verdict"] = info.get("own_verdict")
            rows.append(row)

        producers = {out: node for node in nodes for out in node.output if out}
        outputs = []
        for o in model.graph.output:
            c = compare_tensor(np.asarray(ql[o.name]), np.asarray(ort_outputs[o.name]), **tol)
            q = np.asarray(ql[o.name])
            entry = {"name": o.name, "shape": list(q.shape), "dtype": str(q.dtype), **c}
            node = producers.get(o.name)
            if c.get("max_abs") is not None and node is not None and node.op_type == "DequantizeLinear" \
                    and np.asarray(ql.get(node.input[1])).size == 1:
                scale = float(np.asarray(ql[node.input[1]]).reshape(()))
                if scale > 0:  # a dequantized output: the difference in quantization steps too
                    entry["max_steps"] = round(c["max_abs"] / scale, 3)
            if o.name in ort_vals and compare_tensor(np.asarray(ort_vals[o.name]),
                                                     np.asarray(ort_outputs[o.name]))["mismatches"]:
                entry["instrumented_differs"] = True  # normal session's optimizations change it
            outputs.append(entry)
        verdict = _worst(o["verdict"] for o in outputs)

        return {
            "nodes": rows,
            "outputs": outputs,
            "verdict": verdict,
            "equal": verdict == "identical",
            "mismatching_nodes": sum(1 for r in rows if r["mismatches"]),
            "tolerance": {"atol": atol, "rtol": rtol, "ulp": ulp},
            "ulp_tolerance": ulp,
            "emulate": emulate,
            "qdq": qdq,
            # the node rows are the graph after QDQ fusion (the rewrite returns a new model even
            # where it fuses nothing: compare what it holds)
            "qdq_fused": sorted(n.op_type for n in model.graph.node)
            != sorted(n.op_type for n in original.graph.node),
            "has_qdq": any(n.op_type == "DequantizeLinear" for n in original.graph.node),
            # weight-only groups onnxruntime's session fuses into MatMulNBits, which qlinear runs
            # as written under qdq="literal" (at accuracy_level 4 they quantize activations)
            "nbits_fusions": nbits_fusions(original, self.options) if qdq == "literal" else 0,
            "nbits_accuracy_level": int((self.options or {}).get("session.qdq_matmulnbits_accuracy_level", 4)),
            "onnxruntime_outputs": "normal session (default graph optimizations)",
            "onnxruntime_nodes": "session with every intermediate exposed as an output",
            "onnxruntime_note": note,
            **({"onnxruntime_outputs": "onnx.reference (onnxruntime cannot run this model)",
                "onnxruntime_nodes": "onnx.reference, every intermediate",
                "against": "onnx.reference", "onnxruntime_cannot": list(self.onnxruntime_cannot)}
               if self.onnxruntime_cannot else {"against": "onnxruntime"}),
        }


def _as_qlinear_dtypes(values: dict[str, Any], ql: dict[str, Any]) -> None:
    """onnxruntime's Python binding returns a float8 tensor as its uint8 bytes: view it as the
    ml_dtypes type qlinear's tensor of that name has (the same bytes, so nothing is converted)."""
    for k, v in values.items():
        q = ql.get(k)
        if isinstance(v, np.ndarray) and isinstance(q, np.ndarray) and v.dtype == np.uint8 and \
                q.dtype != v.dtype and q.dtype.itemsize == 1 and q.dtype.kind == "V" and v.shape == q.shape:
            values[k] = v.view(q.dtype)


def _diagnose(node, opsets, ql, values_ort, mismatched: set[str], emulate: str | None = None,
              info: dict[str, Any] | None = None, tol: dict[str, Any] | None = None,
              cache: dict | None = None, against: str = "onnxruntime") -> str:
    """The diagnosis text of a mismatching node; ``info["own_verdict"]`` gets the verdict of
    qlinear's kernel run on onnxruntime's own inputs against onnxruntime's outputs (every
    output of the node; None when it could not be re-run). ``against``: "onnx.reference" when
    the other values are onnx.reference's (onnxruntime cannot run the model); a documented
    divergence of the other runtime from the contract (qlinear.tools.formats) is named."""
    if against == "onnx.reference":
        known = reference_divergence(node, values_ort, {(d.domain or ""): d.version for d in opsets})
    else:
        known = onnxruntime_divergence(node, values_ort)
    out = node.output[0]
    inputs_differ = any(n in mismatched for n in [*node.input, *_outer_names(node)] if n)
    try:
        own_all = _run_node_qlinear(node, opsets, values_ort, emulate=emulate, cache=cache)
    except Exception:
        own_all = None
    if own_all is not None:
        if info is not None:
            info["own_verdict"] = _worst(
                compare_tensor(np.asarray(v), np.asarray(values_ort[k]), **(tol or {}))["verdict"]
                for k, v in own_all.items() if k in values_ort)
        # Every output is checked, and the rest of the diagnosis is about the first one that
        # differs on onnxruntime's inputs (a node can agree on its first output, not another).
        differing = [k for k, v in own_all.items()
                     if k in values_ort and _mismatch(np.asarray(v), np.asarray(values_ort[k])).any()]
        out = differing[0] if differing else out
    own = own_all.get(out) if own_all is not None else None
    ort_out = values_ort[out]
    whose = "onnx.reference's" if against == "onnx.reference" else "onnxruntime's"
    if own is not None and not _mismatch(np.asarray(own), np.asarray(ort_out)).any():
        if inputs_differ:
            return f"propagated (agrees on {whose} inputs)"
        return f"agrees on {whose} inputs"
    if own is not None and inputs_differ:
        n_own = int(_mismatch(np.asarray(own), np.asarray(ort_out)).sum())
        prefix = f"inputs differ; {n_own} differ on {whose} inputs: "
    else:
        prefix = ""
    if node.domain == "com.microsoft" and node.op_type == "MatMulNBits":
        return prefix + _diagnose_matmul_nbits(node, values_ort, out, own)
    if known:
        return prefix + "known divergence: " + known
    if node.domain == "com.microsoft" and node.op_type in _CONTRIB_GEMM_OPS:
        return prefix + _diagnose_contrib_gemm(node, opsets, values_ort, out, own, emulate, cache)
    if node.op_type in _GEMM_OPS:
        ins = [values_ort[n] if n else None for n in node.input]
        try:
            emu = ortsat.emulate(node.op_type, ins, node_attributes(node))
        except Exception:
            emu = None
        if emulate:
            if emu is not None and own is not None:
                exact = _run_node_qlinear(node, opsets, values_ort, exact=True, cache=cache)[out]
                if not _mismatch(np.asarray(exact), np.asarray(ort_out)).any():
                    n_sat = int(_mismatch(np.asarray(emu), np.asarray(exact)).sum())
                    return (prefix + "onnxruntime here is exact; with AVX2 and no VNNI its 16-bit "
                            f"saturation changes {n_sat} values (emulated)")
            return prefix + f"differs from the {emulate} emulation"
        x, w = np.asarray(ins[0]), np.asarray(ins[3 if node.op_type.startswith("QLinear") else 1])
        if emu is None:
            return prefix + (f"{x.dtype} x {w.dtype}: onnxruntime's kernel for this case does not "
                             "saturate (measured on AVX2)")
        exact = own if own is not None else ql[out]
        sat = _mismatch(np.asarray(emu), np.asarray(exact))
        if not sat.any():
            # (pair sums may saturate and still round to the same outputs: say what was checked)
            return prefix + "not explained by 16-bit saturation (emulating it changes no value)"
        wrong = _mismatch(np.asarray(exact), np.asarray(ort_out))
        reproduced = int((wrong & ~_mismatch(np.asarray(emu), np.asarray(ort_out))).sum())
        s8 = x if x.dtype == np.int8 else w
        smax = int(np.abs(s8.astype(np.int64)).max())
        if not _mismatch(np.asarray(emu), np.asarray(ort_out)).any():
            return (prefix + f"onnxruntime 16-bit saturation (u8 x s8 pair sums > 32767, |s8| up "
                    f"to {smax}); emulating it reproduces onnxruntime exactly "
                    f"({reproduced}/{int(wrong.sum())})")
        return (prefix + f"pair sums exceed 32767 (onnxruntime 16-bit saturation, |s8| up to "
                f"{smax}); emulation reproduces {reproduced}/{int(wrong.sum())}, not all")
    if own is not None and np.issubdtype(np.asarray(own).dtype, np.floating):
        c = compare_tensor(np.asarray(own), np.asarray(ort_out))
        rel = f", max rel {c['max_rel']:.3g}" if c.get("max_rel") is not None else ""
        return prefix + f"float arithmetic differs (max abs {c['max_abs']:.3g}{rel})"
    if own is not None and np.issubdtype(np.asarray(own).dtype, np.integer):
        d = int(np.abs(np.asarray(own, np.int64) - np.asarray(ort_out, np.int64)).max())
        return prefix + f"differs by up to {_steps(d)} on onnxruntime's own inputs"
    if own_all is None:
        return ("inputs differ; " if inputs_differ else "") + \
            "not re-run alone on onnxruntime's inputs (qlinear cannot run this node by itself)"
    return prefix.rstrip("; ")


def _diagnose_contrib_gemm(node, opsets, values_ort, out: str, own, emulate: str | None,
                           cache: dict | None = None) -> str:
    """The diagnosis of a com.microsoft operator built on onnxruntime's u8 x s8 GEMM (QGemm,
    MatMulIntegerToFloat, DynamicQuantizeMatMul, QAttention): qlinear's kernel re-run on
    onnxruntime's inputs exactly and emulating onnxruntime-avx2, both against onnxruntime."""
    ort_out = np.asarray(values_ort[out])
    try:
        exact = np.asarray(_run_node_qlinear(node, opsets, values_ort, exact=True, cache=cache)[out])
        emu = np.asarray(_run_node_qlinear(node, opsets, values_ort,
                                           emulate="onnxruntime-avx2", cache=cache)[out])
    except Exception:
        return ""
    n_sat = int(_mismatch(emu, exact).sum())
    if emulate:
        if not _mismatch(exact, ort_out).any() and n_sat:
            return ("onnxruntime here is exact; with AVX2 and no VNNI its 16-bit saturation "
                    f"changes {n_sat} values (emulated)")
        return f"differs from the {emulate} emulation"
    if not n_sat:
        return "not explained by 16-bit saturation (emulating it changes nothing here)"
    wrong = _mismatch(exact, ort_out)
    reproduced = int((wrong & ~_mismatch(emu, ort_out)).sum())
    if not _mismatch(emu, ort_out).any():
        return ("onnxruntime 16-bit saturation (u8 x s8 pair sums > 32767); emulating it "
                f"reproduces onnxruntime exactly ({reproduced}/{int(wrong.sum())})")
    return (f"pair sums exceed 32767 (onnxruntime 16-bit saturation); emulation reproduces "
            f"{reproduced}/{int(wrong.sum())}, not all")


def _relative(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> float:
    """max |a − b| over max |scale| (0 where scale is all 0), in float64."""
    top = float(np.abs(scale.astype(np.float64)).max()) if scale.size else 0.0
    d = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
    return d / top if top else d


def _diagnose_matmul_nbits(node, values_ort, out: str, own) -> str:
    """A MatMulNBits difference on onnxruntime's own inputs: at accuracy_level 4 (where int8
    activations apply) both quantize the activations with the same int8 codes and differ in the
    order their block sums are added; at the float levels only in the float reduction order.
    The figures: the largest difference over the largest output, and each one's distance from
    the exact sum (qlinear's ``mode="exact"``)."""
    if own is None:
        return ""
    attrs = node_attributes(node)
    ins = [values_ort[n] if n else None for n in node.input] + [None] * 6
    try:
        exact = prepare_matmul_nbits(*ins[1:6], K=attrs["K"], N=attrs["N"], bits=attrs.get("bits", 4),
                                     block_size=attrs["block_size"], accuracy_level=attrs.get("accuracy_level", 0),
                                     mode="exact").run(ins[0])
        int8 = prepare_matmul_nbits(*ins[1:6], K=attrs["K"], N=attrs["N"], bits=attrs.get("bits", 4),
                                    block_size=attrs["block_size"],
                                    accuracy_level=attrs.get("accuracy_level", 0)).int8
    except Exception:
        return ""
    ort_out, own = np.asarray(values_ort[out]), np.asarray(own)
    d = _relative(own, ort_out, exact)
    e_ort, e_own = _relative(ort_out, exact, exact), _relative(own, exact, exact)
    if int8:
        return (f"onnxruntime quantizes activations (accuracy_level 4), with the same int8 codes as "
                f"qlinear; the block sums' float order differs: max {d:.2g} of the largest output "
                f"(each {max(e_ort, e_own):.2g} from the exact sum)")
    return (f"float reduction order (accuracy_level {attrs.get('accuracy_level', 0)}: float32 "
            f"arithmetic): max {d:.2g} of the largest output (onnxruntime {e_ort:.2g}, qlinear "
            f"{e_own:.2g} from the exact sum)")


def nbits_fusions(model: onnx.ModelProto, options: dict[str, str] | None = None) -> int:
    """How many weight-only DequantizeLinear -> MatMul / Gemm groups onnxruntime's session turns
    into MatMulNBits (``qlinear.passes.matmul_nbits``: the same conditions); 0 on any failure."""
    if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return 0
    try:
        fused = apply_qdq(model, "fuse", options)
    except Exception:
        return 0
    count = lambda m: sum(n.op_type == "MatMulNBits" for n in m.graph.node)  # noqa: E731
    return count(fused) - count(model)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _steps(n: float, unit: str = "step") -> str:
    """``n`` steps, singular for 1 ("1 step", "0.5 steps")."""
    text = f"{n:g}" if isinstance(n, float) else str(n)  # int32 differences: every digit
    return f"{text} {unit}" + ("" if n == 1 else "s")


def _max_or_none(values) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _fmt_diff(r: dict[str, Any]) -> str:
    if r.get("verdict") == "not compared":
        return ""
    if not r["mismatches"]:
        return "0"
    md = r["max_diff"]
    if md is None:
        return ""
    if r["unit"] == "steps":
        if r.get("max_abs") is None:
            return _steps(md)
        return _steps(md) + "; " + _fmt_diff({**r, "unit": "abs", "max_diff": r["max_abs"]})
    text = f"abs {md:.3g}"
    if r.get("max_rel") is not None:
        text += f", rel {r['max_rel']:.3g}"
    if r.get("max_ulp") is not None:
        text += f" ({r['max_ulp']} ulp)"
    return text


def _output_line(o: dict[str, Any]) -> str:
    head = f"output {o['name']} {o['dtype']}{o['shape']}: {o['verdict']}"
    if o["verdict"] == "identical":
        return head
    if "problem" in o:
        return f"{head} ({o['problem']})"
    if o["kind"] == "integer":
        return f"{head} ({o['mismatches']} of {o['elements']} elements, up to {_steps(o['max_steps'])})"
    rel = f", max rel {o['max_rel']:.3g}" if o.get("max_rel") is not None else ""
    ulp = f" ({o['max_ulp']} ulp)" if o.get("max_ulp") is not None else ""
    if o.get("max_steps") is not None:
        ulp += f"; up to {_steps(o['max_steps'], 'quantization step')}"
    outside = f", {o['outside']} outside the tolerance" if o["outside"] else ""
    return (f"{head} ({o['mismatches']} of {o['elements']} elements not bit-identical{outside}; "
            f"max abs {o['max_abs']:.3g}{rel}{ulp})")


def format_report(result: dict[str, Any]) -> str:
    """The human-readable report: node table, outputs with verdicts, timings, overall verdict."""
    rows = [{**r, "max": _fmt_diff(r)} for r in result["nodes"]]
    table = format_table(rows, [("node", "node"), ("op", "operator"), ("elements", "elements"),
                                ("mismatches", "mismatches"), ("verdict", "verdict"),
                                ("max", "max diff"), ("diagnosis", "diagnosis")],
                         right=("elements", "mismatches"))
    t = result["tolerance"]
    tol = f"|q - o| <= {t['atol']:g} + {t['rtol']:g}|o|" + (f" or <= {t['ulp']} ulp" if t["ulp"] else "")
    lines = []
    if result.get("emulate"):
        lines.append(f"qlinear emulates {result['emulate']} (onnxruntime on AVX2 CPUs without VNNI)")
    if result.get("onnxruntime_cannot"):
        lines.append("onnxruntime cannot run this model: " + "; ".join(result["onnxruntime_cannot"])
                     + "; compared with onnx.reference instead, on the graph as written "
                     "(its known divergences from the contract are named per node)")
    head = "nodes: qlinear vs onnxruntime with every intermediate exposed (fusions off)"
    if result.get("against") == "onnx.reference":
        head = "nodes: qlinear vs onnx.reference, every intermediate"
    if result.get("qdq_fused"):
        head += ", both on the graph after onnxruntime's QDQ fusions (--qdq fuse)"
    other = ("onnx.reference" if result.get("against") == "onnx.reference"
             else "onnxruntime's normal session (default optimizations)")
    lines += [head, table, "",
              f"outputs: qlinear vs {other}; floats within {tol}, integers exact"]
    for o in result["outputs"]:
        lines.append(_output_line(o))
        if o.get("instrumented_differs"):
            hint = ("; --qdq fuse runs qlinear on the graph as onnxruntime fuses it"
                    if result.get("qdq") == "literal" and result.get("has_qdq") else "")
            if result.get("nbits_fusions") and result.get("nbits_accuracy_level") == 4:
                hint += (f"; onnxruntime quantizes activations (accuracy_level 4): it fuses "
                         f"{result['nbits_fusions']} weight-only DequantizeLinear -> MatMul into MatMulNBits "
                         "and quantizes their activations to int8 per block")
            lines.append("  (the normal session's result differs from the intermediates-exposed "
                         f"run: its graph optimizations change this output{hint})")
    s = result["seconds"]
    q, o = s["qlinear"], s["onnxruntime"]
    n_not = sum(1 for r in result["nodes"] if r["verdict"] == "not compared")
    not_compared = f" ({n_not} not compared)" if n_not else ""
    lines.append(f"{result['mismatching_nodes']} of {len(result['nodes'])} nodes not bit-identical"
                 f"{not_compared}; "
                 f"warm median: qlinear {q['median'] * 1e3:.2f} ms, "
                 f"{'onnx.reference' if result.get('against') == 'onnx.reference' else 'onnxruntime'} "
                 f"{o['median'] * 1e3:.2f} ms "
                 f"({q['runs']} and {o['runs']} runs after a first one)")
    if result.get("onnxruntime_note"):
        lines.append(f"note: {result['onnxruntime_note']}")
    lines.append(f"outputs: {result['verdict']}")
    return "\n".join(lines)
