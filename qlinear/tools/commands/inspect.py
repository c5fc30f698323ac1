"""``qlinear inspect``: what a model is made of and what qlinear makes of it, nothing run."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from onnx import helper

from qlinear.backend import check_model, format_problems
from qlinear.graph.proto import walk_nodes
from qlinear.tools.formats import onnxruntime_cannot_run, quantization_summary
from qlinear.tools.commands.common import dumps
from qlinear.tools.model import ToolError, graph_inputs, load_model, validate_model
from qlinear.tools.table import format_table


def inspect_model(model, model_path: str) -> dict[str, Any]:
    """What a model is made of and what qlinear makes of it, without running anything:
    inputs, outputs, opsets, operator counts by domain, and every node qlinear refuses."""
    def value(vi) -> dict[str, Any]:
        tt = vi.type.tensor_type
        dtype = None
        if vi.type.HasField("tensor_type") and tt.elem_type:
            dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        shape = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else
                     (d.dim_param or "?") for d in tt.shape.dim]
        return {"name": vi.name, "dtype": dtype, "shape": shape}

    g = model.graph
    problems = check_model(model)
    counts: collections.Counter = collections.Counter()
    for node, _ in walk_nodes(g):
        counts[("" if node.domain == "ai.onnx" else node.domain, node.op_type)] += 1
    refused: dict[tuple[str, str], list] = collections.defaultdict(list)
    for p in problems:
        if p.node != "(model)":
            refused[(p.domain, p.op_type)].append(p)
    operators = []
    for (domain, op), n in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
        bad = refused.get((domain, op), [])
        operators.append({"domain": domain or "ai.onnx", "op_type": op, "nodes": n,
                          "refused": len(bad),
                          "reasons": sorted({p.reason for p in bad})})
    try:
        validate_model(model, model_path)
        checker = "ok"
    except ToolError as e:
        checker = str(e)
    refusal = format_problems(problems) if problems else None
    if refusal is None and checker != "ok":  # run and compare stop at the checker
        refusal = f"onnx's checker rejects it ({checker.split(': ', 1)[-1]})"
    inits = list(g.initializer)
    return {
        "model": model_path,
        "ir_version": int(model.ir_version),
        "producer": " ".join(x for x in (model.producer_name, model.producer_version) if x),
        "opsets": {(d.domain or "ai.onnx"): int(d.version) for d in model.opset_import},
        "inputs": [value(vi) for vi in graph_inputs(model)],
        "outputs": [value(vi) for vi in g.output],
        "initializers": len(inits),
        "nodes": sum(counts.values()),
        "operators": operators,
        "supported": refusal is None,
        "refused": [_asdict(p) for p in problems],
        "refusal": refusal,
        "onnx_checker": checker,
        "quantization": quantization_summary(model),
        "onnxruntime_cannot": onnxruntime_cannot_run(model),
    }


def _asdict(p) -> dict[str, Any]:
    return dataclasses.asdict(p)


def _shape_text(shape) -> str:
    return "(unknown)" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def main(args) -> int:
    """``qlinear inspect``."""
    model = load_model(args.model, max_tensor_bytes=args.max_tensor_bytes)
    r = inspect_model(model, args.model)
    if args.json:
        print(dumps(r))
        return 0
    print(f"model: {r['model']}")
    print(f"  IR {r['ir_version']}" + (f", producer {r['producer']}" if r["producer"] else "")
          + "; opsets: " + ", ".join(f"{d} {v}" for d, v in r["opsets"].items())
          + f"; {r['nodes']} nodes, {r['initializers']} initializers")
    print()
    rows = [{"kind": kind, "name": v["name"], "dtype": v["dtype"] or "?",
             "shape": _shape_text(v["shape"])}
            for kind, vs in (("input", r["inputs"]), ("output", r["outputs"])) for v in vs]
    print(format_table(rows, [("kind", ""), ("name", "tensor"), ("dtype", "dtype"),
                              ("shape", "shape")]))
    print()
    rows = [{"domain": o["domain"], "op": o["op_type"], "nodes": o["nodes"],
             "qlinear": "runs" if not o["refused"] else
             f"refuses {o['refused']}: " + "; ".join(o["reasons"])} for o in r["operators"]]
    print(format_table(rows, [("domain", "domain"), ("op", "operator"), ("nodes", "nodes"),
                              ("qlinear", "qlinear")]))
    print()
    if r["quantization"]:
        rows = [{**q, "op": q["op_type"] + ("" if q["domain"] == "ai.onnx" else f" ({q['domain']})")
                 + f"-{q['version']}"} for q in r["quantization"]]
        print(format_table(rows, [("op", "quantization"), ("type", "type"), ("scale", "scale"),
                                  ("float", "float"), ("granularity", "granularity"),
                                  ("attributes", "attributes"), ("nodes", "nodes")]))
        print()
    if r["onnxruntime_cannot"]:
        print("onnxruntime: " + "; ".join(r["onnxruntime_cannot"]))
    if r["supported"]:
        print("qlinear runs every node")
    elif r["refused"]:
        print(f"qlinear refuses: {r['refusal']}")
    else:
        print(f"qlinear refuses the model: {r['refusal']}")
    print(f"onnx checker: {r['onnx_checker']}")
    return 0
