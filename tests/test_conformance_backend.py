"""ONNX's backend node tests for the operator family, through qlinear.backend.

The installed onnx ships no node-test data files, so the cases come from onnx's generators
(``collect_testcases``). Every case must pass (every type and attribute of versions 10 to 28);
a case refused up front must name a type or attribute outside the contract (never run with
other semantics).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

from qlinear import backend  # noqa: E402
from qlinear.tools import conformance  # noqa: E402

CASES = conformance.collect_cases()
UNSUPPORTED_REASONS = ("float8", "float4", "int4", "uint4", "int2", "uint2", "int16", "uint16",
                       "float16", "block_size")


def test_family_cases_found():
    names = {c.name for c in CASES}
    for required in ("test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32", "test_convinteger_with_padding",
                     "test_matmulinteger", "test_quantizelinear", "test_dequantizelinear_axis"):
        assert required in names


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backend_node_case(case):
    row = conformance.run_case(case)
    if row["result"] == "unsupported":
        assert any(r in row["detail"] for r in UNSUPPORTED_REASONS), row
        with pytest.raises(backend.UnsupportedModelError):
            backend.prepare(case.model)
    else:
        assert row["result"] == "pass", row


def _restamp(case, opset):
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", opset))
    return m


@pytest.mark.parametrize("opset", [10, 13, 19])
@pytest.mark.parametrize("name", ["test_quantizelinear", "test_dequantizelinear",
                                  "test_quantizelinear_axis", "test_dequantizelinear_axis"])
def test_quantize_cases_at_older_opsets(name, opset):
    """The same data at the versions quantized models actually use (DequantizeLinear-13 is the
    one onnx.reference lacks); per-axis cases are refused at opset 10, which had no axis."""
    case = next(c for c in CASES if c.name == name)
    m = _restamp(case, opset)
    inputs, expected = case.data_sets[0]
    if "axis" in name and opset == 10:  # the scale's declared shape (3,): refused before running
        with pytest.raises(backend.UnsupportedModelError, match=r"-10 takes a scalar \w+_scale \(per-axis needs opset 13\)"):
            backend.prepare(m)
        return
    rep = backend.prepare(m)
    for got, want in zip(rep.run(list(inputs)), expected):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_counts():
    rows = [conformance.run_case(c) for c in CASES]
    counts = {k: sum(r["result"] == k for r in rows) for k in ("pass", "FAIL", "unsupported")}
    assert counts["FAIL"] == 0
    assert counts["pass"] == len(CASES) >= 51  # every type and attribute of versions 10-28


@pytest.mark.parametrize("name,opset,reason", [
    ("test_quantizelinear_int4", 19, "int4"), ("test_dequantizelinear_float4e2m1", 21, "float4e2m1"),
    ("test_quantizelinear_blocked_asymmetric", 19, "block_size"), ("test_dequantizelinear_uint2", 24, "uint2"),
    ("test_quantizelinear_e4m3fn", 13, "float8e4m3fn")])
def test_newer_types_refused_at_older_opsets(name, opset, reason):
    """A type or attribute a node's version does not have is refused before running, named."""
    case = next(c for c in CASES if c.name == name)
    with pytest.raises(backend.UnsupportedModelError, match=reason):
        backend.prepare(_restamp(case, opset))
