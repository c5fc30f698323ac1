"""Dataset-scale comparison (``qlinear compare MODEL --dataset DATA``): per-sample figures,
merged exactly, and the aggregated report.

Each sample is compared as ``qlinear compare`` compares one input (:class:`Comparison`); its
figures go into a :class:`Tally` — counts, maxima, exact sums and the first sample of each
diagnosis — and tallies merge by adding counts and sums, so the report does not depend on how
the samples were split among workers (no averages of averages, no float sums whose rounding
depends on the order: sums of float64 values are kept exactly, as integers in units of
2^-1074, and rounded once at the end).

Per model output: samples identical / within tolerance / DIFFER, elements not bit-identical,
largest difference. Top-1: argmax over the last axis of the first output, qlinear against
onnxruntime's normal session (and the float model's), and accuracy with ``--labels``.
Per node: elements, mismatches and their rate, samples in which the node differs, largest and
mean difference (quantization steps for integer tensors and a scalar DequantizeLinear's
output, absolute for other floats), SQNR against the float model's tensor where one matches
(``10 log10(sum f^2 / sum (f - q)^2)``, the figure of onnxruntime's qdq_loss_debug), for
qlinear and for onnxruntime, and the diagnoses with their counts.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import numpy as np
from onnx import TensorProto, shape_inference

from qlinear.tools.compare import VERDICTS, _worst
from qlinear.tools.model import ToolError
from qlinear.tools.table import format_table

#: float64 values as integers in units of 2^-1074 (the smallest subnormal): every finite
#: float64 is an integer multiple of it, so sums are exact and independent of their order
_SCALE_BITS = 1074

#: onnxruntime's quantizer names the dequantized copy of a float tensor X this way; its
#: qdq_loss_debug matches X_DequantizeLinear_Output with the float model's X
_DQ_SUFFIXES = ("_DequantizeLinear_Output", "_dequantized")


class ExactSum:
    """An exact, order-independent sum of float64 values (NaN and infinities kept apart)."""

    __slots__ = ("units", "special")

    def __init__(self) -> None:
        self.units = 0
        self.special: float | None = None  # nan or +-inf once one was added

    def add(self, x: float) -> None:
        x = float(x)
        if not math.isfinite(x):
            self.special = x if self.special is None or self.special == x else math.nan
            return
        n, d = x.as_integer_ratio()
        self.units += n * ((1 << _SCALE_BITS) // d)

    def merge(self, other: "ExactSum") -> None:
        self.units += other.units
        if other.special is not None:
            s = other.special
            self.special = s if self.special is None or self.special == s else math.nan

    def value(self) -> float:
        if self.special is not None:
            return self.special
        return self.units / (1 << _SCALE_BITS)  # int / int: correctly rounded

    def __getstate__(self):
        return (self.units, self.special)

    def __setstate__(self, state):
        self.units, self.special = state


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return math.nan
    return max(a, b)


def _diagnosis_key(text: str) -> str:
    """The diagnosis without its sample-specific numbers, so samples can be counted together."""
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)


class Tally:
    """Everything the report says, for some samples; :meth:`merge` adds another's."""

    def __init__(self) -> None:
        self.samples = 0
        self.outputs: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.top1: dict[str, Any] = {}
        self.info: dict[str, Any] = {}  # facts of the model as run (the same in every worker)

    # ------------------------------------------------------------------ one sample

    def add_sample(self, index: int, comparison, result: dict[str, Any],
                   float_values: dict[str, np.ndarray] | None, label: int | None,
                   float_names: dict[str, str]) -> None:
        """Add one compared sample. ``float_names`` maps a compared tensor to the float
        model's tensor it is checked against (SQNR)."""
        ql, values_ort, ort_outputs = comparison.last_values
        self.samples += 1
        for o in result["outputs"]:
            t = self.outputs.setdefault(o["name"], {
                "dtype": o["dtype"], "samples": {v: 0 for v in VERDICTS}, "elements": 0,
                "mismatches": 0, "outside": 0, "max_abs": None, "max_steps": None,
                "max_ulp": None, "instrumented_differs": 0})
            t["samples"][o["verdict"]] += 1
            t["elements"] += o["elements"]
            t["mismatches"] += o["mismatches"]
            t["outside"] += o["outside"]
            t["max_abs"] = _max(t["max_abs"], o.get("max_abs"))
            t["max_steps"] = _max(t["max_steps"], o.get("max_steps"))
            t["max_ulp"] = _max(t["max_ulp"], o.get("max_ulp"))
            t["instrumented_differs"] += bool(o.get("instrumented_differs"))
        self._add_top1(result, ql, ort_outputs, float_values, label)
        for node, row in zip(comparison.model.graph.node, result["nodes"]):
            self._add_node(index, node, row, ql, values_ort, float_values, float_names)

    def _add_top1(self, result, ql, ort_outputs, float_values, label) -> None:
        name = result["outputs"][0]["name"] if result["outputs"] else None
        q = ql.get(name) if name is not None else None
        if not isinstance(q, np.ndarray) or q.ndim < 1 or q.size == 0 or q.dtype.kind not in "fiu":
            return
        def preds(a):
            a = np.asarray(a)
            return a.reshape(-1, a.shape[-1]).argmax(axis=1) if a.shape == q.shape else None
        pq, po = preds(q), preds(ort_outputs[name])
        t = self.top1.setdefault("counts", {"output": name, "predictions": 0,
                                            "agree_onnxruntime": 0, "agree_float": 0,
                                            "labelled": 0, "correct_qlinear": 0,
                                            "correct_onnxruntime": 0, "correct_float": 0})
        t["predictions"] += len(pq)
        t["agree_onnxruntime"] += int((pq == po).sum()) if po is not None else 0
        pf = None
        if float_values is not None and name in float_values:
            pf = preds(float_values[name])
            if pf is not None:
                t["agree_float"] += int((pq == pf).sum())
        if label is not None:
            if len(pq) != 1:
                raise ToolError(f"--labels: output {name!r} gives {len(pq)} predictions per sample "
                                f"(shape {list(q.shape)}); labels need one per sample")
            t["labelled"] += 1
            t["correct_qlinear"] += int(pq[0] == label)
            t["correct_onnxruntime"] += int(po is not None and po[0] == label)
            t["correct_float"] += int(pf is not None and pf[0] == label)

    def _add_node(self, index, node, row, ql, values_ort, float_values, float_names) -> None:
        t = self.nodes.get(row["node"])
        if t is None:
            t = self.nodes[row["node"]] = {
                "op": row["op"], "elements": 0, "mismatches": 0, "samples_differing": 0,
                "verdicts": {}, "max_steps": None, "sum_steps": ExactSum(), "max_abs": None,
                "sum_abs": ExactSum(), "sqnr": {}, "diagnoses": {}}
        t["elements"] += row["elements"]
        t["mismatches"] += row["mismatches"]
        t["verdicts"][row["verdict"]] = t["verdicts"].get(row["verdict"], 0) + 1
        if row["mismatches"]:
            t["samples_differing"] += 1
            self._add_differences(t, node, ql, values_ort)
        if row.get("diagnosis"):
            key = _diagnosis_key(row["diagnosis"])
            d = t["diagnoses"].get(key)
            if d is None:
                t["diagnoses"][key] = [1, index, row["diagnosis"]]
            else:
                d[0] += 1
                if index < d[1]:
                    d[1], d[2] = index, row["diagnosis"]
        if float_values is not None:
            for out in node.output:
                f = float_values.get(float_names.get(out, ""))
                q, o = ql.get(out), values_ort.get(out)
                if f is None or not isinstance(q, np.ndarray) or q.dtype.kind != "f" or q.shape != f.shape:
                    continue
                s = t["sqnr"].setdefault(out, {"float": float_names[out], "signal": ExactSum(),
                                               "noise_qlinear": ExactSum(),
                                               "noise_onnxruntime": ExactSum()})
                f64 = f.astype(np.float64)
                s["signal"].add(float(np.sum(f64 * f64)))
                dq = f64 - q.astype(np.float64)
                s["noise_qlinear"].add(float(np.sum(dq * dq)))
                if isinstance(o, np.ndarray) and o.shape == f.shape:
                    do = f64 - o.astype(np.float64)
                    s["noise_onnxruntime"].add(float(np.sum(do * do)))

    @staticmethod
    def _add_differences(t, node, ql, values_ort) -> None:
        """Largest and summed differences of the node's differing tensors: in quantization
        steps (integer tensors; a DequantizeLinear's output with a scalar scale) or absolute
        (other floats), the two kinds kept apart."""
        for out in node.output:
            q, o = ql.get(out), values_ort.get(out)
            if not isinstance(q, np.ndarray) or not isinstance(o, np.ndarray) \
                    or q.shape != o.shape or q.dtype != o.dtype or q.dtype.kind not in "fiu" or not q.size:
                continue
            q, o = q.reshape(-1), o.reshape(-1)  # a scalar output (a scale) too
            if q.dtype.kind in "iu":
                d = np.abs(q.astype(np.int64) - o.astype(np.int64))
                t["max_steps"] = _max(t["max_steps"], int(d.max()))
                t["sum_steps"].units += int(d.sum()) << _SCALE_BITS
                continue
            d = np.abs(q.astype(np.float64) - o.astype(np.float64))
            d[np.isnan(q) & np.isnan(o)] = 0
            scale = ql.get(node.input[1]) if node.op_type == "DequantizeLinear" and len(node.input) > 1 else None
            if isinstance(scale, np.ndarray) and scale.size == 1 and float(scale.reshape(())) > 0:
                d = d / float(scale.reshape(()))  # in quantization steps
                t["max_steps"] = _max(t["max_steps"], float(d.max()))
                t["sum_steps"].add(float(d.sum()))
            else:
                t["max_abs"] = _max(t["max_abs"], float(d.max()))
                t["sum_abs"].add(float(d.sum()))

    # ------------------------------------------------------------------ merging

    def merge(self, other: "Tally") -> None:
        self.samples += other.samples
        self.info = self.info or dict(other.info)
        for name, o in other.outputs.items():
            t = self.outputs.get(name)
            if t is None:
                self.outputs[name] = copy.deepcopy(o)  # never alias another tally's figures
                continue
            for v in VERDICTS:
                t["samples"][v] += o["samples"][v]
            for k in ("elements", "mismatches", "outside", "instrumented_differs"):
                t[k] += o[k]
            for k in ("max_abs", "max_steps", "max_ulp"):
                t[k] = _max(t[k], o[k])
        if other.top1:
            if not self.top1:
                self.top1 = copy.deepcopy(other.top1)
            else:
                for k, v in other.top1["counts"].items():
                    if k != "output":
                        self.top1["counts"][k] += v
        for name, o in other.nodes.items():
            t = self.nodes.get(name)
            if t is None:
                self.nodes[name] = copy.deepcopy(o)
                continue
            for k in ("elements", "mismatches", "samples_differing"):
                t[k] += o[k]
            for v, n in o["verdicts"].items():
                t["verdicts"][v] = t["verdicts"].get(v, 0) + n
            for k in ("max_steps", "max_abs"):
                t[k] = _max(t[k], o[k])
            t["sum_steps"].merge(o["sum_steps"])
            t["sum_abs"].merge(o["sum_abs"])
            for out, s in o["sqnr"].items():
                mine = t["sqnr"].get(out)
                if mine is None:
                    t["sqnr"][out] = copy.deepcopy(s)
                else:
                    for k in ("signal", "noise_qlinear", "noise_onnxruntime"):
                        mine[k].merge(s[k])
            for key, d in o["diagnoses"].items():
                mine = t["diagnoses"].get(key)
                if mine is None:
                    t["diagnoses"][key] = list(d)
                else:
                    mine[0] += d[0]
                    if d[1] < mine[1]:
                        mine[1], mine[2] = d[1], d[2]

    # ------------------------------------------------------------------ the report

    def report(self, *, total_samples: int, labels: bool, has_float: bool) -> dict[str, Any]:
        """The JSON-ready report (no timings: those are the caller's ``run`` section)."""
        if self.samples != total_samples:
            raise ToolError(f"internal error: {self.samples} of {total_samples} samples compared")
        outputs = []
        for name, t in self.outputs.items():
            verdict = ("DIFFER" if t["samples"]["DIFFER"] else
                       "within tolerance" if t["samples"]["within tolerance"] else "identical")
            outputs.append({"name": name, "dtype": t["dtype"], "verdict": verdict,
                            "identical": t["samples"]["identical"],
                            "within_tolerance": t["samples"]["within tolerance"],
                            "differ": t["samples"]["DIFFER"], "elements": t["elements"],
                            "mismatches": t["mismatches"], "outside": t["outside"],
                            "max_abs": t["max_abs"], "max_steps": t["max_steps"],
                            "max_ulp": t["max_ulp"],
                            "instrumented_differs": t["instrumented_differs"]})
        nodes = []
        for name, t in self.nodes.items():
            row = {"node": name, "op": t["op"], "elements": t["elements"],
                   "mismatches": t["mismatches"],
                   "mismatch_rate": t["mismatches"] / t["elements"] if t["elements"] else 0.0,
                   "samples_differing": t["samples_differing"],
                   "verdict": _worst(v for v in t["verdicts"] if v in VERDICTS)
                   if any(v in VERDICTS for v in t["verdicts"]) else next(iter(t["verdicts"]), ""),
                   "verdicts": dict(sorted(t["verdicts"].items())),
                   "max_steps": t["max_steps"],
                   "mean_steps": (t["sum_steps"].value() / t["elements"]
                                  if t["elements"] and t["max_steps"] is not None else None),
                   "max_abs": t["max_abs"],
                   "mean_abs": (t["sum_abs"].value() / t["elements"]
                                if t["elements"] and t["max_abs"] is not None else None)}
            if has_float:
                row["sqnr"] = [{"tensor": out, "float_tensor": s["float"],
                                "qlinear_db": _sqnr(s["signal"], s["noise_qlinear"]),
                                "onnxruntime_db": _sqnr(s["signal"], s["noise_onnxruntime"])}
                               for out, s in t["sqnr"].items()]
            row["diagnoses"] = [{"samples": d[0], "first_sample": d[1], "diagnosis": d[2]}
                                for d in sorted(t["diagnoses"].values(), key=lambda d: (-d[0], d[1]))]
            nodes.append(row)
        out: dict[str, Any] = {"samples": self.samples, "outputs": outputs, "nodes": nodes,
                               "verdict": _worst(o["verdict"] for o in outputs)}
        c = self.top1.get("counts")
        if c:
            top = {"output": c["output"], "predictions": c["predictions"],
                   "agree_onnxruntime": c["agree_onnxruntime"],
                   "agreement_onnxruntime": c["agree_onnxruntime"] / c["predictions"]}
            if has_float:
                top.update(agree_float=c["agree_float"], agreement_float=c["agree_float"] / c["predictions"])
            out["top1"] = top
            if labels:
                n = c["labelled"]
                out["accuracy"] = {"samples": n, "qlinear": c["correct_qlinear"] / n,
                                   "onnxruntime": c["correct_onnxruntime"] / n,
                                   "correct_qlinear": c["correct_qlinear"],
                                   "correct_onnxruntime": c["correct_onnxruntime"]}
                if has_float:
                    out["accuracy"].update(float=c["correct_float"] / n,
                                           correct_float=c["correct_float"])
        elif labels:
            raise ToolError("--labels: the model's first output gives no class scores (an empty, "
                            "non-numeric or scalar tensor), so no accuracy can be computed")
        return out


def _sqnr(signal: ExactSum, noise: ExactSum) -> float:
    """onnxruntime's qdq_loss_debug figure: 20 log10(|f| / |f - q|), each norm at least the
    float64 epsilon."""
    eps = float(np.finfo(np.float64).eps)
    num = max(math.sqrt(max(signal.value(), 0.0)), eps)
    den = max(math.sqrt(max(noise.value(), 0.0)), eps)
    return round(20 * math.log10(num / den), 6)


def float_matches(model, float_model) -> dict[str, str]:
    """Compared tensor -> the float model's tensor it is checked against: the same name, or
    onnxruntime's quantizer's dequantized copy X_DequantizeLinear_Output of X (as its
    qdq_loss_debug matches them). Only float tensors of the float model count."""

    try:
        inferred = shape_inference.infer_shapes(float_model)
    except Exception:  # noqa: BLE001 - without inference, declared types only
        inferred = float_model
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.value_info, *g.output, *g.input]}
    floats = {n for n, t in types.items() if t in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                                    TensorProto.DOUBLE, TensorProto.BFLOAT16)}
    produced = {o for n in float_model.graph.node for o in n.output if o}
    candidates = floats & (produced | {o.name for o in float_model.graph.output})
    out = {}
    for node in model.graph.node:
        for name in node.output:
            if name in candidates:
                out[name] = name
                continue
            for suffix in _DQ_SUFFIXES:
                if name.endswith(suffix) and name[:-len(suffix)] in candidates:
                    out[name] = name[:-len(suffix)]
    return out


# --------------------------------------------------------------------------- text


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.2f}% ({n}/{d})" if d else "-"


def _diff_text(r: dict[str, Any], mean: bool = False) -> str:
    """The node's largest (or mean) difference: steps, absolute, or both."""
    if not r["mismatches"]:
        return "0"
    parts = []
    steps, absolute = (r["mean_steps"], r["mean_abs"]) if mean else (r["max_steps"], r["max_abs"])
    if steps is not None:
        parts.append(f"{steps:.3g} steps" if isinstance(steps, float) else f"{steps} steps")
    if absolute is not None:
        parts.append(f"abs {absolute:.3g}" if isinstance(absolute, float) else f"abs {absolute}")
    return "; ".join(parts)


def format_dataset_report(rep: dict[str, Any]) -> str:
    lines = []
    t = rep["tolerance"]
    tol = f"|q - o| <= {t['atol']:g} + {t['rtol']:g}|o|" + (f" or <= {t['ulp']} ulp" if t["ulp"] else "")
    lines.append(f"outputs over {rep['samples']} samples: qlinear vs onnxruntime's normal session; "
                 f"floats within {tol}, integers exact")
    rows = [{**o, "max": ("0" if not o["mismatches"] else
                          (f"{o['max_steps']:g} steps" if o.get("max_steps") is not None else
                           f"abs {o['max_abs']:.3g}" if isinstance(o.get("max_abs"), float) else
                           str(o.get("max_abs"))))} for o in rep["outputs"]]
    lines.append(format_table(rows, [("name", "output"), ("identical", "identical"),
                                     ("within_tolerance", "within tolerance"), ("differ", "DIFFER"),
                                     ("mismatches", "elements not bit-identical"),
                                     ("elements", "elements"), ("max", "max diff")],
                              right=("identical", "within_tolerance", "differ", "mismatches", "elements")))
    top = rep.get("top1")
    if top:
        line = (f"top-1 (output {top['output']!r}, argmax over its last axis): qlinear and "
                f"onnxruntime agree on {_pct(top['agree_onnxruntime'], top['predictions'])}")
        if "agree_float" in top:
            line += f"; qlinear and the float model on {_pct(top['agree_float'], top['predictions'])}"
        lines.append(line)
    acc = rep.get("accuracy")
    if acc:
        line = (f"accuracy with --labels: qlinear {_pct(acc['correct_qlinear'], acc['samples'])}, "
                f"onnxruntime {_pct(acc['correct_onnxruntime'], acc['samples'])}")
        if "correct_float" in acc:
            line += f", float model {_pct(acc['correct_float'], acc['samples'])}"
        lines.append(line)
    lines.append("")
    has_float = rep.get("float_model") is not None
    head = (f"nodes over {rep['samples']} samples: qlinear vs onnxruntime with every intermediate "
            "exposed (fusions off)")
    if rep.get("qdq_fused"):
        head += ", both on the graph after onnxruntime's QDQ fusions (--qdq fuse)"
    lines.append(head)
    rows = []
    for r in rep["nodes"]:
        row = {**r, "rate": f"{r['mismatch_rate']:.2%}" if r["mismatches"] else "0",
               "max": _diff_text(r), "mean": _diff_text(r, mean=True),
               # each diagnosis with the number of samples it was given for; its figures are
               # those of the first such sample
               "diag": "; ".join(f"{d['diagnosis']} [{d['samples']} sample{'s' if d['samples'] != 1 else ''}; "
                                 f"figures of sample {d['first_sample']}]"
                                 for d in r["diagnoses"][:2])
               + (f"; {len(r['diagnoses']) - 2} more (--json)" if len(r["diagnoses"]) > 2 else "")}
        if has_float:
            sq = r.get("sqnr") or []
            row["sq_q"] = ", ".join(f"{s['qlinear_db']:.1f}" for s in sq)
            row["sq_o"] = ", ".join(f"{s['onnxruntime_db']:.1f}" for s in sq)
        rows.append(row)
    cols = [("node", "node"), ("op", "operator"), ("elements", "elements"),
            ("mismatches", "mismatches"), ("rate", "rate"), ("samples_differing", "samples"),
            ("max", "max diff"), ("mean", "mean diff")]
    if has_float:
        cols += [("sq_q", "SQNR qlinear dB"), ("sq_o", "SQNR onnxruntime dB")]
    cols.append(("diag", "diagnosis"))
    lines.append(format_table(rows, cols, right=("elements", "mismatches", "samples_differing")))
    lines.append("")
    n_diff = sum(1 for r in rep["nodes"] if r["mismatches"])
    lines.append(f"{n_diff} of {len(rep['nodes'])} nodes not bit-identical in some sample "
                 "(samples: in how many; mean diff: over all elements)")
    return "\n".join(lines)


def plot_report(rep: dict[str, Any], out: Any) -> None:
    """Per-node mismatch rate (and SQNR against the float model, when given) as a PNG, to
    ``out`` (a path or a binary file object: the command's guarded writer gives one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = rep["nodes"]
    names = [r["node"] for r in nodes]
    has_sqnr = any(r.get("sqnr") for r in nodes)
    panels = 2 if has_sqnr else 1
    height = max(3.0, 0.18 * len(nodes) + 1.5)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, height), sharey=True, squeeze=False)
    y = np.arange(len(nodes))
    ax = axes[0][0]
    ax.barh(y, [100 * r["mismatch_rate"] for r in nodes], color="tab:red")
    ax.set_yticks(y, names, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("elements not bit-identical to onnxruntime (%)")
    ax.set_title(f"qlinear vs onnxruntime, {rep['samples']} samples", fontsize=9)
    if has_sqnr:
        ax = axes[0][1]
        q = [min((s["qlinear_db"] for s in r.get("sqnr") or []), default=np.nan) for r in nodes]
        o = [min((s["onnxruntime_db"] for s in r.get("sqnr") or []), default=np.nan) for r in nodes]
        ax.barh(y - 0.2, q, height=0.4, label="qlinear", color="tab:blue")
        ax.barh(y + 0.2, o, height=0.4, label="onnxruntime", color="tab:orange")
        ax.set_xlabel("SQNR against the float model (dB)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110, format="png")
    plt.close(fig)
