"""Node-by-node comparison of qlinear and onnxruntime on one model and one set of inputs.

Both runtimes run the whole model with every intermediate tensor exposed (onnxruntime on a
copy of the model whose graph outputs list every node output). For each node: elements,
mismatching elements, the largest difference (in quantization steps for integer tensors and
for DequantizeLinear's output; absolute and in float32 ulps for other float tensors), and a
diagnosis:

- *propagated*: the node's inputs already differ, and qlinear's kernel run on onnxruntime's
  own inputs reproduces onnxruntime's output, so the node itself agrees;
- *onnxruntime 16-bit saturation*: a uint8 x int8 QLinearConv / QLinearMatMul whose pair
  sums exceed 32767 (see :mod:`qlinear.tools.ortsat`); where the emulation reproduces
  onnxruntime's values exactly, it says so;
- otherwise the size of the difference (float ulps), without a claim about its cause.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import onnx
from onnx import helper

from qlinear.tools import ortsat
from qlinear.tools.table import format_table, progress

_QUANT_OPS = {"QuantizeLinear", "QLinearConv", "QLinearMatMul"}


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


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors come back as exceptions; keep stderr to one line
    ro = ort.RunOptions()
    ro.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds, ro)))


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place (NaN pairs count as equal)."""
    a = a.astype(np.float32).ravel()
    b = b.astype(np.float32).ravel()
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    d = np.abs(ia - ib)
    d[np.isnan(a) & np.isnan(b)] = 0
    return int(d.max()) if d.size else 0


def _ulp_each(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def _mismatch(q: np.ndarray, r: np.ndarray, ulp: int = 0) -> np.ndarray:
    """Elements that differ; float32 elements within ``ulp`` units in the last place match."""
    if q.shape != r.shape:
        return np.ones(max(q.size, r.size), bool)
    if np.issubdtype(q.dtype, np.floating):
        same = (q == r) | (np.isnan(q) & np.isnan(r))
        if ulp and q.dtype == np.float32 and r.dtype == np.float32:
            same |= _ulp_each(q, r) <= ulp
        return ~same
    return q != r


def _run_node_qlinear(node, opsets, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    from qlinear.backend import KERNELS

    ins = [n for n in node.input if n]
    g = helper.make_graph(
        [node], "single",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype),
                                       values[n].shape) for n in dict.fromkeys(ins)],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o])
    m = helper.make_model(g, opset_imports=list(opsets))
    ev = ReferenceEvaluator(m, new_ops=KERNELS)
    outs = [o for o in node.output if o]
    return dict(zip(outs, ev.run(None, {n: values[n] for n in ins})))


def _attrs(node) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else (list(v) if isinstance(v, (list, tuple)) else v)
    return out


def compare_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *,
                  show_progress: bool | None = None, ulp: int = 0,
                  max_tensor_bytes: int | None = None) -> dict[str, Any]:
    """Run both runtimes and compare every node; returns rows, outputs and a summary.

    ``ulp``: float32 values within that many units in the last place count as equal (for
    models ending in float operators such as Softmax, whose onnxruntime kernels round
    differently); integer tensors are always compared exactly.
    """
    from qlinear.backend import QLinearRep, check_model, UnsupportedModelError

    problems = check_model(model)
    if problems:
        raise UnsupportedModelError(problems)
    rep = QLinearRep(model, max_tensor_bytes=max_tensor_bytes)
    t0 = time.perf_counter()
    ql = rep.run_all(feeds, progress=show_progress)
    t_ql = time.perf_counter() - t0
    dtypes = {k: v.dtype for k, v in ql.items() if isinstance(v, np.ndarray)}
    exposed, _ = expose_all(model, dtypes)
    t0 = time.perf_counter()
    note = ""
    try:
        ort_vals = run_onnxruntime(exposed, feeds)
    except Exception as e_exposed:  # retry without the extra outputs: compare outputs only
        try:
            ort_vals = run_onnxruntime(model, feeds)
            note = ("onnxruntime could not run the copy with intermediate outputs "
                    f"({_one_line(e_exposed)}); only graph outputs are compared")
        except Exception as e:
            raise RuntimeError(f"onnxruntime cannot run this model: {_one_line(e)}") from None
    t_ort = time.perf_counter() - t0
    values_ort = dict(ql)  # initializers and inputs are shared; node outputs replaced below
    values_ort.update(ort_vals)

    rows = []
    mismatched_tensors: set[str] = set()
    nodes = list(model.graph.node)
    for i, node in enumerate(progress(nodes, total=len(nodes), desc="compare",
                                      enabled=show_progress)):
        label = node.name or f"#{i} {node.op_type}"
        row: dict[str, Any] = {"node": label, "op": node.op_type, "elements": 0,
                               "mismatches": 0, "max_diff": 0, "unit": "", "diagnosis": ""}
        any_float = False
        for out in node.output:
            if not out or out not in ql or out not in ort_vals:
                continue
            q, r = np.asarray(ql[out]), np.asarray(ort_vals[out])
            bad = _mismatch(q, r, ulp)
            row["elements"] += int(q.size)
            nbad = int(bad.sum())
            row["mismatches"] += nbad
            if np.issubdtype(q.dtype, np.floating):
                any_float = True
            if not nbad:
                continue
            mismatched_tensors.add(out)
            if q.shape != r.shape:
                row["diagnosis"] = f"shapes differ: qlinear {list(q.shape)}, onnxruntime {list(r.shape)}"
                row["max_diff"], row["unit"] = None, ""
                continue
            if np.issubdtype(q.dtype, np.integer):
                d = int(np.abs(q.astype(np.int64) - r.astype(np.int64)).max())
                row["max_diff"], row["unit"] = max(row["max_diff"] or 0, d), "steps"
            elif node.op_type == "DequantizeLinear" and np.asarray(ql[node.input[1]]).size == 1:
                scale = float(np.asarray(ql[node.input[1]]).reshape(()))
                d = float(np.nanmax(np.abs(q - r))) / scale
                row["max_diff"], row["unit"] = round(max(row["max_diff"] or 0, d), 3), "steps"
            else:
                row["max_diff"] = float(np.nanmax(np.abs(q.astype(np.float64) - r)))
                ulps = _ulps(q, r)
                row["unit"] = f"abs ({ulps} ulp)" if ulps <= 1024 else "abs"
        if not row["unit"] and row["mismatches"] == 0:
            row["unit"] = "steps" if not any_float or node.op_type == "DequantizeLinear" else "abs"
        if row["mismatches"] and not row["diagnosis"]:
            row["diagnosis"] = _diagnose(node, model.opset_import, ql, values_ort,
                                         mismatched_tensors)
        rows.append(row)

    outputs = []
    for o in model.graph.output:
        q, r = np.asarray(ql[o.name]), np.asarray(ort_vals[o.name])
        bad = _mismatch(q, r, ulp)
        outputs.append({"name": o.name, "shape": list(q.shape), "dtype": str(q.dtype),
                        "elements": int(q.size), "mismatches": int(bad.sum()),
                        "equal": not bool(bad.any())})
    return {
        "nodes": rows,
        "outputs": outputs,
        "equal": all(o["equal"] for o in outputs),
        "mismatching_nodes": sum(1 for r in rows if r["mismatches"]),
        "seconds": {"qlinear": round(t_ql, 4), "onnxruntime": round(t_ort, 4)},
        "ulp_tolerance": ulp,
        "onnxruntime_note": note,
    }


def _diagnose(node, opsets, ql, values_ort, mismatched: set[str]) -> str:
    out = node.output[0]
    ort_out = values_ort[out]
    inputs_differ = any(n in mismatched for n in node.input if n)
    try:
        own = _run_node_qlinear(node, opsets, values_ort)[out]
    except Exception:
        own = None
    if own is not None and not _mismatch(np.asarray(own), np.asarray(ort_out)).any():
        if inputs_differ:
            return "propagated (agrees on onnxruntime's inputs)"
        return "agrees on onnxruntime's inputs"
    if own is not None and inputs_differ:
        n_own = int(_mismatch(np.asarray(own), np.asarray(ort_out)).sum())
        prefix = f"inputs differ; {n_own} differ on onnxruntime's inputs: "
    else:
        prefix = ""
    if node.op_type in ("QLinearConv", "QLinearMatMul"):
        ins = [values_ort[n] if n else None for n in node.input]
        x, w = np.asarray(ins[0]), np.asarray(ins[3])
        if not ortsat.applies(x.dtype, w.dtype):
            return prefix + f"{x.dtype} x {w.dtype}: not onnxruntime's saturating u8s8 kernel"
        emu = ortsat.emulate_node(node.op_type, ins, _attrs(node))
        if emu is None:
            return prefix + "u8s8, but no emulation for this case (e.g. depthwise)"
        exact = own if own is not None else ql[out]
        sat = _mismatch(np.asarray(emu), np.asarray(exact))
        if not sat.any():
            return prefix + "not explained by 16-bit saturation (no pair sum exceeds 32767)"
        wrong = _mismatch(np.asarray(exact), np.asarray(ort_out))
        reproduced = int((wrong & ~_mismatch(np.asarray(emu), np.asarray(ort_out))).sum())
        wmax = int(np.abs(w.astype(np.int64)).max())
        if not _mismatch(np.asarray(emu), np.asarray(ort_out)).any():
            return (prefix + f"onnxruntime 16-bit saturation (u8 x s8 pair sums > 32767, |w| up "
                    f"to {wmax}); emulating it reproduces onnxruntime exactly "
                    f"({reproduced}/{int(wrong.sum())})")
        return (prefix + f"pair sums exceed 32767 (onnxruntime 16-bit saturation, |w| up to "
                f"{wmax}); emulation reproduces {reproduced}/{int(wrong.sum())}, not all")
    if own is not None and np.issubdtype(np.asarray(own).dtype, np.floating):
        return prefix + f"float arithmetic differs by up to {_ulps(np.asarray(own), np.asarray(ort_out))} ulp"
    if own is not None and np.issubdtype(np.asarray(own).dtype, np.integer):
        d = int(np.abs(np.asarray(own, np.int64) - np.asarray(ort_out, np.int64)).max())
        return prefix + f"differs by up to {d} steps on onnxruntime's own inputs"
    return prefix.rstrip("; ")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def format_report(result: dict[str, Any]) -> str:
    rows = []
    for r in result["nodes"]:
        md = r["max_diff"]
        md_s = "" if md is None else (f"{md:g}" if isinstance(md, float) else str(md))
        rows.append({**r, "max": f"{md_s} {r['unit']}".strip() if r["mismatches"] else "0"})
    table = format_table(rows, [("node", "node"), ("op", "operator"), ("elements", "elements"),
                                ("mismatches", "mismatches"), ("max", "max diff"),
                                ("diagnosis", "diagnosis")],
                         right=("elements", "mismatches"))
    lines = [table, ""]
    for o in result["outputs"]:
        state = "identical" if o["equal"] else f"{o['mismatches']} of {o['elements']} elements differ"
        lines.append(f"output {o['name']} {o['dtype']}{o['shape']}: {state}")
    s = result["seconds"]
    lines.append(f"{result['mismatching_nodes']} of {len(result['nodes'])} nodes differ; "
                 f"qlinear {s['qlinear']:.3f} s, onnxruntime {s['onnxruntime']:.3f} s")
    if result.get("onnxruntime_note"):
        lines.append(f"note: {result['onnxruntime_note']}")
    lines.append("outputs: IDENTICAL" if result["equal"] else "outputs: DIFFER")
    return "\n".join(lines)
