"""ONNX's own backend node tests for qlinear's operators, run through ``qlinear.backend``.

The installed onnx ships no node-test data files, so the node cases come from
``onnx.backend.test.case.node.collect_testcases`` (the same generators that write those
files); the model cases it does ship as files (``backend/test/data/*/test_*``, loaded as
``onnx.backend.test.BackendTest`` loads them) are added when they use the family. A case is selected when its model uses one of the six operators (or
BatchNormalization, which the backend corrects). Each selected case is either

- ``supported``: ``qlinear.backend.check_model`` accepts it, and then it must **pass**:
  integer outputs and DequantizeLinear's float outputs bit-identical to the expected data,
  other float outputs within the case's own rtol/atol; or
- ``unsupported``: refused with the reason (a type outside the 8-bit / float32 contract such
  as float8, int4, 16-bit integers, float16 scales, or blocked quantization).
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any

import glob
import os
import types

import numpy as np
import onnx

from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

from qlinear.backend import QLINEAR_OPS, QLinearRep, check_model
from qlinear.tools.table import format_table, progress

FAMILY = set(QLINEAR_OPS) | {"BatchNormalization"}


@functools.lru_cache(maxsize=1)
def collect_cases() -> tuple:
    """The selected cases, sorted by name (generated once per process: it takes seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = []
    for c in cases:
        if c.model is None:
            continue
        ops = {n.op_type for n in c.model.graph.node}
        if ops & FAMILY:
            out.append(c)
    out += _data_dir_cases()
    return tuple(sorted(out, key=lambda c: c.name))


def _data_dir_cases() -> list:
    """Cases shipped as files by the installed onnx (model.onnx + test_data_set_*/), as
    ``onnx.backend.test.BackendTest`` loads them, when their model uses the family."""
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    cases = []
    for model_path in sorted(glob.glob(os.path.join(root, "*", "test_*", "model.onnx"))):
        try:
            model = onnx.load(model_path)
        except Exception:
            continue
        if not {n.op_type for n in model.graph.node} & FAMILY:
            continue
        data_sets = []
        for ds in sorted(glob.glob(os.path.join(os.path.dirname(model_path), "test_data_set_*"))):
            def load(kind):
                files = sorted(glob.glob(os.path.join(ds, f"{kind}_*.pb")),
                               key=lambda f: int(f.rsplit("_", 1)[1].split(".")[0]))
                return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]
            data_sets.append((load("input"), load("output")))
        name = os.path.basename(os.path.dirname(model_path))
        cases.append(types.SimpleNamespace(name=name, model=model, data_sets=data_sets,
                                           rtol=1e-3, atol=1e-7))  # BackendTest's defaults
    return cases


def _exact_required(case, expected: np.ndarray) -> bool:
    if not np.issubdtype(expected.dtype, np.floating):
        return True
    ops = {n.op_type for n in case.model.graph.node}
    return bool(ops & set(QLINEAR_OPS)) and "BatchNormalization" not in ops


_NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _array(a: Any) -> np.ndarray:
    """A data set's value as an array: onnx's generators store the types NumPy lacks (float8,
    int4, ...) as TensorProto, read into ml_dtypes' dtypes."""
    if isinstance(a, onnx.TensorProto):
        return numpy_helper.to_array(a)
    return np.asarray(a)


def run_case(case) -> dict[str, Any]:
    ops = sorted({n.op_type for n in case.model.graph.node} & FAMILY)
    opset = {d.domain or "ai.onnx": d.version for d in case.model.opset_import}.get("ai.onnx")
    row = {"case": case.name, "operators": ", ".join(ops), "opset": opset,
           "result": "", "detail": ""}
    problems = check_model(case.model)
    if problems:
        row["result"] = "unsupported"
        row["detail"] = "; ".join(p.reason for p in problems)
        return row
    try:
        rep = QLinearRep(case.model)
        for inputs, expected in case.data_sets:
            outputs = rep.run([_array(a) for a in inputs])
            for i, (got, want) in enumerate(zip(outputs, expected)):
                got, want = np.asarray(got), _array(want)
                if got.shape != want.shape or got.dtype != want.dtype:
                    raise AssertionError(f"output {i}: got {got.dtype}{list(got.shape)}, "
                                         f"expected {want.dtype}{list(want.shape)}")
                if _exact_required(case, want):
                    if want.dtype not in _NUMPY_FLOATS:  # integers, ml_dtypes' types: the bytes
                        same = np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                              np.ascontiguousarray(want).view(np.uint8))
                    else:
                        same = np.array_equal(got, want, equal_nan=np.issubdtype(want.dtype, np.floating))
                    if not same:
                        n = int((got != want).sum())
                        raise AssertionError(f"output {i}: {n} of {want.size} elements differ")
                else:
                    np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
        row["result"] = "pass"
        row["detail"] = "bit-identical" if all(
            _exact_required(case, np.asarray(w)) for _, exp in case.data_sets for w in exp) \
            else f"rtol={case.rtol:g} atol={case.atol:g}"
    except AssertionError as e:
        row["result"] = "FAIL"
        row["detail"] = str(e).strip().splitlines()[0] if str(e).strip() else "assertion failed"
    except Exception as e:  # a kernel error on a supported case is a failure, reported as such
        row["result"] = "FAIL"
        row["detail"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return row


def run_conformance(show_progress: bool | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    cases = collect_cases()
    rows = [run_case(c) for c in progress(cases, total=len(cases), desc="conformance",
                                         enabled=show_progress)]
    counts = {k: sum(1 for r in rows if r["result"] == k) for k in ("pass", "FAIL", "unsupported")}
    return {"cases": rows, "counts": counts, "seconds": round(time.perf_counter() - t0, 2)}


def format_report(result: dict[str, Any]) -> str:
    table = format_table(result["cases"], [("case", "case"), ("operators", "operator"),
                                           ("opset", "opset"), ("result", "result"),
                                           ("detail", "detail")], right=("opset",))
    c = result["counts"]
    return (f"{table}\n\n{c['pass']} passed, {c['FAIL']} failed, {c['unsupported']} unsupported "
            f"(of {len(result['cases'])} onnx backend test cases; {result['seconds']} s)")
