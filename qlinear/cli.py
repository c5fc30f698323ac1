"""The ``qlinear`` command: run, compare, inspect, conformance, bench.

    qlinear run                       # the bundled quantized digits classifier
    qlinear run model.onnx --input x=x.npy --output-dir out/
    qlinear run --emulate onnxruntime-avx2          # onnxruntime's results on AVX2 CPUs
    qlinear compare model.onnx --input x=x.npy      # exit 1 when outputs DIFFER
    qlinear compare model.onnx --dataset val/ --labels y.npy --workers 2   # a whole dataset
    qlinear inspect model.onnx        # inputs, outputs, operators, what qlinear supports
    qlinear --version
    qlinear conformance               # ONNX's backend node tests for the operators
    qlinear bench                     # the speed suite (qlinear.tools.bench)

Bad input (missing or broken model, unsupported operators, wrong inputs) prints one line
``qlinear: error: ...`` and exits with status 2. Set QLINEAR_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np

import qlinear
from qlinear.tools.ortsat import forced, onnxruntime_saturates, probe_source
from qlinear.tools.table import format_table, node_progress

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples")
EXAMPLE_META = os.path.join(EXAMPLES_DIR, "digits_meta.json")


class _Error(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``qlinear: error: ...``, exit 2)."""

    def error(self, message):  # noqa: D102
        raise _Error(f"{message} (see '{self.prog} --help')")


def _json_safe(v: Any) -> Any:
    """``v`` with every non-finite float as the string "inf", "-inf" or "nan": JSON has no such
    numbers, and json.dumps would write Infinity / NaN, which strict parsers (jq, JavaScript's
    JSON.parse) refuse."""
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def _dumps(result: Any) -> str:
    """The --json text of a command's result: strict JSON."""
    return json.dumps(_json_safe(result), indent=2, allow_nan=False)


def _fmt_num(v: float) -> str:
    return f"{v:.6g}"


def summarize(arr: np.ndarray) -> str:
    a = np.asarray(arr)
    if a.size == 0:
        return "empty"
    if a.dtype == np.bool_:
        return f"{int(a.sum())} true of {a.size}"
    if np.issubdtype(a.dtype, np.integer):
        return f"min {a.min()}  max {a.max()}  mean {_fmt_num(float(a.mean()))}"
    if np.issubdtype(a.dtype, np.floating):
        finite = a[np.isfinite(a)]
        s = (f"min {_fmt_num(float(finite.min()))}  max {_fmt_num(float(finite.max()))}  "
             f"mean {_fmt_num(float(finite.mean()))}") if finite.size else "no finite values"
        nonfinite = a.size - finite.size
        return s + (f"  ({nonfinite} non-finite)" if nonfinite else "")
    return f"dtype {a.dtype}"


def _progress_enabled(args) -> bool | None:
    return False if getattr(args, "json", False) else None


# --------------------------------------------------------------------------- run


def _load_example():
    from qlinear.tools.model import ToolError, load_model

    try:
        with open(EXAMPLE_META) as f:
            meta = json.load(f)
        model_path = os.path.join(EXAMPLES_DIR, meta["model"])
        samples = np.load(os.path.join(EXAMPLES_DIR, meta["samples"]), allow_pickle=False)
    except (OSError, KeyError, ValueError) as e:
        raise ToolError(f"the bundled example is missing or damaged ({e}); "
                        "rebuild it with scripts/build_example.py") from None
    model = load_model(model_path)
    feeds = {meta["input"]: samples[meta["input"]]}
    labels = samples[meta["labels_key"]]
    return model_path, model, feeds, labels, meta


def _dynamic_set_to_1(model, shapes) -> list[str]:
    """The generated inputs whose symbolic or dynamic dimensions were set to 1 (no --shape)."""
    from qlinear.tools.model import _declared, graph_inputs

    names = []
    for vi in graph_inputs(model):
        shape = _declared(vi)[1]
        if vi.name not in shapes and shape is not None and None in shape:
            names.append(vi.name)
    return names


@contextlib.contextmanager
def _hint_dynamic_dims(args):
    """A model that fails on generated inputs whose dynamic dimensions were set to 1 (kaldi's
    time axis: 'empty output window') says so, and that --shape sets them: the error alone
    blames the model."""
    try:
        yield
    except (ValueError, RuntimeError) as e:
        names = getattr(args, "dynamic_set_to_1", None)
        if not names:
            raise
        shown = ", ".join(map(repr, names[:3])) + (", ..." if len(names) > 3 else "")
        raise _Error(f"{' '.join(str(e).split())} (generated inputs: the dynamic dimensions of "
                     f"{shown} were set to 1; --shape NAME=DIMxDIM... sets them)") from None


def _model_and_inputs(args):
    """The model and feeds a command works on: the bundled example, or MODEL with --input
    files (seeded random inputs when none are given), checked before anything runs.
    Returns (model_path, model, feeds, labels, meta, note); labels/meta only for the example."""
    from qlinear.tools.model import (ToolError, check_inputs, check_supported, load_model,
                                     parse_input_args, random_inputs, validate_model)

    from qlinear.tools.model import parse_shape_args, save_inputs

    labels = meta = None
    note = ""
    if args.seed < 0:
        raise ToolError(f"--seed {args.seed}: must be 0 or more")
    shapes = parse_shape_args(getattr(args, "shape", None))
    if args.model is None:
        if args.input or shapes:
            raise ToolError(f"{'--input' if args.input else '--shape'} needs a MODEL (without "
                            "one, the bundled example runs on its own samples)")
        model_path, model, feeds, labels, meta = _load_example()
    else:
        model_path = args.model
        model = load_model(model_path, max_tensor_bytes=args.max_tensor_bytes)
        feeds = parse_input_args(args.input, max_tensor_bytes=args.max_tensor_bytes)
        if feeds and shapes:
            raise ToolError("--shape sets the shape of generated inputs; it cannot be combined "
                            "with --input")
        if not feeds:
            feeds = random_inputs(model, seed=args.seed, shapes=shapes,
                                  max_tensor_bytes=args.max_tensor_bytes)
            note = f"no --input given: seeded random inputs (seed {args.seed})"
            args.dynamic_set_to_1 = _dynamic_set_to_1(model, shapes)
    check_supported(model)
    validate_model(model, model_path)
    check_inputs(model, feeds)
    if getattr(args, "save_inputs", None):
        path = save_inputs(args.save_inputs, feeds)
        note = (note + "; " if note else "") + f"inputs saved to {path} (--input {path})"
    return model_path, model, feeds, labels, meta, note


def _example_report(meta, outputs: dict[str, np.ndarray], labels, model, feeds) -> dict[str, Any]:
    probs = outputs[meta["output"]]
    pred = probs.argmax(axis=-1)
    rep: dict[str, Any] = {"samples": int(len(labels)),
                           "accuracy": float((pred == labels).mean()),
                           "correct": int((pred == labels).sum())}
    try:
        from qlinear.tools.compare import run_onnxruntime
    except ImportError:
        return rep
    try:
        ort_out = run_onnxruntime(model, feeds)[meta["output"]]
    except ImportError:
        rep["onnxruntime"] = None
        return rep
    ort_pred = ort_out.argmax(axis=-1)
    rep["onnxruntime"] = {
        # measured here by a probe (qlinear.tools.ortsat), not inferred from the CPU's name
        "saturating_u8s8_kernels": onnxruntime_saturates(),
        "saturation_probe": probe_source(),
        "accuracy": float((ort_pred == labels).mean()),
        "predictions_agree": int((ort_pred == pred).sum()),
        "identical_elements": int((ort_out == probs).sum()),
        "elements": int(probs.size),
    }
    return rep


def output_files(out_dir: str, names: list[str]) -> dict[str, str]:
    """One distinct .npy path inside ``out_dir`` per output name.

    Names are made safe for a file system (separators and dots neutralized); two names that
    end up alike (``a/b`` and ``a_b``), also alike up to case (case-insensitive file systems),
    get ``_2``, ``_3``, ... suffixes until they are distinct, so no file is written twice.
    """
    from qlinear.tools.model import safe_output_path

    used: set[str] = set()
    paths: dict[str, str] = {}
    for name in names:
        base = os.path.splitext(os.path.basename(safe_output_path(out_dir, name)))[0]
        stem, n = base, 1
        while stem.lower() in used:
            n += 1
            stem = f"{base}_{n}"
        used.add(stem.lower())
        paths[name] = safe_output_path(out_dir, stem)
    return paths


def cmd_run(args) -> int:
    from qlinear.backend import QLinearRep, model_as_run
    from qlinear.tools.model import ToolError

    example = args.model is None
    model_path, model, feeds, labels, meta, note = _model_and_inputs(args)
    if args.output_dir is not None and os.path.exists(args.output_dir) \
            and not os.path.isdir(args.output_dir):
        raise ToolError(f"--output-dir {args.output_dir}: exists and is not a directory")

    t0 = time.perf_counter()
    rep = QLinearRep(model_as_run(model, getattr(args, "qdq", "fuse"), args.emulate), emulate=args.emulate,
                     max_tensor_bytes=args.max_tensor_bytes)
    t_prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    with _hint_dynamic_dims(args):
        values = rep.run(feeds, progress=node_progress(_progress_enabled(args)))
    t_run = time.perf_counter() - t0
    outputs = dict(zip(rep.output_names, values))

    result: dict[str, Any] = {
        "model": os.path.basename(model_path) if example else model_path,
        "example": example,
        "inputs": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()],
        "outputs": [{"name": k, "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype),
                     "summary": summarize(v)} for k, v in outputs.items()],
        "seconds": {"prepare": round(t_prepare, 4), "run": round(t_run, 4)},
        "emulate": args.emulate,
    }
    if note:
        result["note"] = note
    if example:
        result["description"] = meta.get("description", "")
        result["classifier"] = _example_report(meta, outputs, labels, model, feeds)

    if args.output_dir is not None:
        from qlinear.tools.model import make_output_dir, write_file

        out_dir = make_output_dir(args.output_dir, "--output-dir")
        files = output_files(out_dir, list(outputs))
        written = []
        for k, v in outputs.items():
            write_file("--output-dir", args.output_dir, files[k],
                       lambda f, v=v: np.save(f, np.asarray(v)))
            written.append(files[k])
        manifest = os.path.join(os.path.realpath(out_dir), "outputs.json")
        listing = {"outputs": [{"name": k, "file": os.path.basename(files[k]),
                                "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)}
                               for k, v in outputs.items()]}  # output name -> file, in graph order
        write_file("--output-dir", args.output_dir, manifest,
                   lambda f: f.write(json.dumps(listing, indent=2).encode()))
        result["written"] = written
        result["manifest"] = manifest

    if args.json:
        print(_dumps(result))
        return 0
    _print_run(result)
    return 0


def _print_run(r: dict[str, Any]) -> None:
    if r["example"]:
        print(f"bundled example: {r['model']}")
        print(f"  {r['description']}")
    else:
        print(f"model: {r['model']}")
    if r.get("note"):
        print(f"  {r['note']}")
    if r.get("emulate"):
        print(f"  emulating {r['emulate']}: onnxruntime's results on x86 CPUs with AVX2 and without "
              "VNNI (16-bit pair saturation in its uint8 x int8 kernels)")
    for i in r["inputs"]:
        print(f"input  {i['name']}: {i['dtype']}{i['shape']}")
    print()
    print(format_table(r["outputs"], [("name", "output"), ("shape", "shape"), ("dtype", "dtype"),
                                      ("summary", "summary")]))
    print()
    s = r["seconds"]
    print(f"time: prepare {s['prepare']:.3f} s, run {s['run']:.3f} s")
    c = r.get("classifier")
    if c:
        print(f"accuracy on the {c['samples']} bundled samples: {c['accuracy']:.2%} "
              f"({c['correct']}/{c['samples']})")
        o = c.get("onnxruntime")
        if o:
            print(f"onnxruntime: accuracy {o['accuracy']:.2%}; predictions agree with qlinear on "
                  f"{o['predictions_agree']}/{c['samples']} samples; "
                  f"{o['identical_elements']}/{o['elements']} output values bit-identical")
            how = ("measured by a probe on this machine" if o.get("saturation_probe") == "measured"
                   else o.get("saturation_probe", ""))
            if o.get("saturating_u8s8_kernels"):
                print(f"  onnxruntime here: its uint8 x int8 kernels saturate 16-bit pair sums ({how})"
                      + ("; qlinear emulates that" if r.get("emulate") else
                         "; 'qlinear run --emulate onnxruntime-avx2' reproduces them"))
            elif o.get("saturating_u8s8_kernels") is False:
                # with --emulate on such a CPU the differences are the emulated saturation: said
                # here, as the saturating case says 'qlinear emulates that'
                print(f"  onnxruntime here: its uint8 x int8 kernels are exact ({how})"
                      + ("; qlinear emulates their saturation on AVX2 CPUs without VNNI, so the "
                         "values differ where it saturates" if r.get("emulate") else ""))
            if o["identical_elements"] != o["elements"]:
                print("  (see 'qlinear compare' for where the values differ)")
    for p in r.get("written", []):
        print(f"wrote {p}")
    if r.get("manifest"):
        print(f"wrote {r['manifest']} (output name -> file)")


# --------------------------------------------------------------------------- compare


def cmd_compare(args) -> int:
    from qlinear.tools.compare import compare_model, format_report
    from qlinear.tools.model import ToolError

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ToolError("compare needs onnxruntime: pip install 'qlinear[tools]'") from None
    for flag, value in (("--ulp", args.ulp), ("--atol", args.atol), ("--rtol", args.rtol)):
        if not value >= 0:  # also refuses NaN
            raise ToolError(f"{flag} must be 0 or more; got {value}")
    if args.dataset is not None:
        return _compare_dataset(args)
    for flag, value in (("--labels", args.labels), ("--float", args.float_model),
                        ("--workers", args.workers), ("--ray", args.ray), ("--plot", args.plot)):
        if value is not None:
            raise ToolError(f"{flag} goes with --dataset (one input is compared without it)")
    model_path, model, feeds, _, _, note = _model_and_inputs(args)
    with _hint_dynamic_dims(args):
        result = compare_model(model, feeds, show_progress=_progress_enabled(args), ulp=args.ulp,
                               atol=args.atol, rtol=args.rtol, emulate=args.emulate,
                               max_tensor_bytes=args.max_tensor_bytes,
                               qdq=getattr(args, "qdq", "fuse"))
    result["onnxruntime_u8s8_saturates"] = onnxruntime_saturates()
    result["saturation_probe"] = probe_source()
    result["model"] = model_path
    if note:
        result["note"] = note
    if args.json:
        print(_dumps(result))
    else:
        print(f"model: {model_path}" + (f"  ({note})" if note else ""))
        sat = result["onnxruntime_u8s8_saturates"]
        if sat is not None:
            how = ("a probe on this machine" if result["saturation_probe"] == "measured"
                   else result["saturation_probe"])
            print("onnxruntime here: uint8 x int8 kernels "
                  + ("saturate 16-bit pair sums" if sat else "exact") + f" ({how})")
        print(format_report(result))
    return 1 if result["verdict"] == "DIFFER" else 0


def _compare_dataset(args) -> int:
    """``qlinear compare MODEL --dataset DATA``: every sample compared, the figures merged."""
    from qlinear.tools import workers as W
    from qlinear.tools.dataset import load_labels, open_dataset
    from qlinear.tools.model import ToolError, check_supported, load_model, validate_model
    from qlinear.tools.sweep import format_dataset_report, plot_report

    for flag, given in (("--input", args.input), ("--shape", args.shape),
                        ("--save-inputs", args.save_inputs), ("--seed", args.seed != 0)):
        if given:
            raise ToolError(f"{flag} cannot be combined with --dataset (the samples are the inputs)")
    if args.workers is not None and args.workers < 1:
        raise ToolError(f"--workers {args.workers}: must be 1 or more")
    if args.ray is not None:
        if args.ray.endswith(".onnx"):  # `--ray model.onnx`: the optional ADDRESS took the model
            raise ToolError(f"--ray {args.ray}: that is a model, not a Ray address; put MODEL.onnx "
                            "before --ray (or give --ray an ADDRESS)")
        W.ray_module()  # not installed: one line naming ray, before anything runs
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ToolError("--plot needs matplotlib, which is not installed: pip install "
                            "matplotlib (or 'qlinear[bench]')") from None
        if not args.plot.endswith(".png"):
            raise ToolError(f"--plot {args.plot}: the chart is a PNG file; name it FILE.png")
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            raise ToolError(f"--plot {args.plot}: the folder {folder} does not exist")
    model_path = args.model
    if model_path is None:
        with open(EXAMPLE_META) as f:
            model_path = os.path.join(EXAMPLES_DIR, json.load(f)["model"])
    # checked here, before any worker starts: the model, the dataset's form and first sample,
    # the labels, the float model (each worker loads its own copy: none is sent)
    model = load_model(model_path, max_tensor_bytes=args.max_tensor_bytes)
    check_supported(model)
    validate_model(model, model_path)
    required, optional = W.declared_inputs(model)
    ds = open_dataset(args.dataset, required, optional, args.max_tensor_bytes)
    total, kind = ds.size, ds.kind
    ds.close()
    del model
    if args.labels is not None:
        load_labels(args.labels, total)
    if args.float_model is not None:
        load_model(args.float_model, max_tensor_bytes=args.max_tensor_bytes)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(args.workers or cpus, total)
    job = W.Job(model=model_path, dataset=args.dataset, labels=args.labels,
                float_model=args.float_model, emulate=args.emulate, qdq=args.qdq, atol=args.atol,
                rtol=args.rtol, ulp=args.ulp, max_tensor_bytes=args.max_tensor_bytes,
                threads=max(1, cpus // workers))
    bar = None
    if _progress_enabled(args) is not False and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="sample", desc="compare", file=sys.stderr, leave=False,
                       dynamic_ncols=True)
        except ImportError:
            bar = None
    t0 = time.perf_counter()
    try:
        if args.ray is not None:
            # Ray's driver prints its own notices (a worker died, ...): to stderr, so that
            # stdout stays the report (--json > report.json)
            with contextlib.redirect_stdout(sys.stderr):
                tally, restarts = W.run_ray(job, workers, total, args.ray or None, bar)
            how = "ray"
        else:
            tally, restarts = W.run_local(job, workers, total, bar)
            how = "processes" if workers > 1 else "this process"
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    from qlinear.tools.ortsat import onnxruntime_saturates, probe_source

    result: dict[str, Any] = {
        "model": model_path, "dataset": {"path": args.dataset, "form": kind, "samples": total},
        "labels": args.labels, "float_model": args.float_model,
        "tolerance": {"atol": args.atol, "rtol": args.rtol, "ulp": args.ulp},
        "emulate": args.emulate, "qdq": args.qdq, "qdq_fused": bool(tally.info.get("qdq_fused")),
        "onnxruntime_u8s8_saturates": onnxruntime_saturates(), "saturation_probe": probe_source(),
    }
    result.update(tally.report(total_samples=total, labels=args.labels is not None,
                               has_float=args.float_model is not None))
    result["run"] = {"workers": workers, "on": how, "ray_address": args.ray or None,
                     # restarts: None on Ray, whose own retries are not counted
                     "restarts": restarts, "seconds": round(seconds, 3),
                     "samples_per_second": round(total / seconds, 3) if seconds > 0 else None}
    if args.plot is not None:
        from qlinear.tools.model import write_file

        write_file("--plot", args.plot, args.plot, lambda f: plot_report(result, f))
    if args.json:
        print(_dumps(result))
    else:
        print(f"model: {model_path}")
        print(f"dataset: {args.dataset} ({total} samples: {kind})"
              + (f"; labels {args.labels}" if args.labels else "")
              + (f"; float reference {args.float_model}" if args.float_model else ""))
        sat = result["onnxruntime_u8s8_saturates"]
        if sat is not None:
            print("onnxruntime here: uint8 x int8 kernels "
                  + ("saturate 16-bit pair sums" if sat else "exact")
                  + f" ({'a probe on this machine' if result['saturation_probe'] == 'measured' else result['saturation_probe']})")
        print(format_dataset_report(result))
        r = result["run"]
        print(f"{total} samples in {r['seconds']:.2f} s ({r['samples_per_second']:.2f} samples/s; "
              f"{workers} worker{'s' if workers != 1 else ''}, {how}"
              + (f"; {restarts} lost worker{'s' if restarts != 1 else ''} replaced" if restarts else "")
              + ")")
        if args.plot is not None:
            print(f"wrote {args.plot}")
        print(f"outputs: {result['verdict']}")
    return 1 if result["verdict"] == "DIFFER" else 0


# --------------------------------------------------------------------------- inspect


def inspect_model(model, model_path: str) -> dict[str, Any]:
    """What a model is made of and what qlinear makes of it, without running anything:
    inputs, outputs, opsets, operator counts by domain, and every node qlinear refuses."""
    from qlinear.backend import check_model, format_problems
    from qlinear.graph.proto import walk_nodes
    from qlinear.tools.formats import onnxruntime_cannot_run, quantization_summary
    from qlinear.tools.model import ToolError, graph_inputs, validate_model

    def value(vi) -> dict[str, Any]:
        tt = vi.type.tensor_type
        dtype = None
        if vi.type.HasField("tensor_type") and tt.elem_type:
            from onnx import helper

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


def cmd_inspect(args) -> int:
    from qlinear.tools.model import load_model
    model = load_model(args.model, max_tensor_bytes=args.max_tensor_bytes)
    r = inspect_model(model, args.model)
    if args.json:
        print(_dumps(r))
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


# --------------------------------------------------------------------------- conformance


def cmd_conformance(args) -> int:
    from qlinear.tools.conformance import format_report, run_conformance

    result = run_conformance(show_progress=_progress_enabled(args))
    if args.json:
        print(_dumps(result))
    else:
        print(format_report(result))
    return 0 if result["counts"]["FAIL"] == 0 else 1


# --------------------------------------------------------------------------- bench


def cmd_bench(args) -> int:
    try:
        bench = importlib.import_module("qlinear.tools.bench")
    except ImportError as e:
        if getattr(e, "name", "") in ("qlinear.tools.bench", "qlinear.tools", "qlinear"):
            raise _Error("the benchmark suite (qlinear.tools.bench) is not installed in this "
                         "copy of qlinear") from None
        raise
    rc = bench.main(list(args.bench_args))
    return int(rc or 0)


# --------------------------------------------------------------------------- timeout


class _Timeout(BaseException):
    """``--timeout`` expired. A BaseException, as KeyboardInterrupt: the loaders' broad
    ``except Exception`` (which turn a library's failure into 'corrupt file') must not catch
    it and report a slow file as a corrupt one."""


class _time_limit:
    """``--timeout``: a SIGALRM interrupts the whole command (loading, preparing, running)
    between two Python steps (a node, a Loop iteration), so a model that computes forever
    ends with one line instead of a hang. The one step that could expand without bound in C++
    out of its reach, inlining model-local functions, is bounded before it starts
    (qlinear._inline)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        # signals reach the main thread only; elsewhere (an embedding program) no time limit
        self.active = bool(seconds) and hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.active:
            def stop(signum, frame):
                raise _Timeout(f"stopped after --timeout {self.seconds:g} s: the model was "
                               "still being loaded, prepared or run (a Loop or recursion that "
                               "does not end?)")

            self._old = signal.signal(signal.SIGALRM, stop)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
        return False


# --------------------------------------------------------------------------- parser


def _add_model_args(p, what: str) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL.onnx",
                   help=f"the ONNX model to {what} (default: the bundled digits example)")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input tensor from a .npy (or .npz) file, or FILE.npz holding every "
                        "input by name (as --save-inputs writes); repeat for each input. "
                        "Without any, seeded random inputs of the declared shapes are used")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMxDIM...",
                   help="shape of a generated input, fixing its symbolic dimensions (e.g. "
                        "images=1x3x224x224); repeat for each input. Without it, symbolic "
                        "dimensions are 1")
    p.add_argument("--save-inputs", metavar="DIR",
                   help="write the inputs used to DIR/inputs.npz, to repeat the run with "
                        "--input DIR/inputs.npz")
    p.add_argument("--max-tensor-bytes", type=int, default=None, metavar="N",
                   help="refuse models declaring a tensor larger than N bytes, and stop before "
                        "an operator computes one (default 2 GiB)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop with an error when running takes longer (default: no limit)")
    p.add_argument("--qdq", choices=("fuse", "literal"), default="fuse",
                   help="QDQ models: 'fuse' (default) runs DequantizeLinear -> op -> "
                        "QuantizeLinear groups on integer kernels as onnxruntime's CPU session "
                        "does; 'literal' runs the graph as written (docs/qdq.md)")


def _add_emulate_arg(p) -> None:
    try:
        from qlinear.backend import EMULATIONS
    except ImportError:  # a plain install without onnx: --help still works, and running says
        EMULATIONS = None  # how to install the tools (main's error handler)

    p.add_argument("--emulate", choices=EMULATIONS, default=None, metavar="TARGET",
                   help="compute what TARGET computes instead of the exact results, on any CPU; "
                        "onnxruntime-avx2: onnxruntime on x86 CPUs with AVX2 and without VNNI, "
                        "whose uint8 x int8 kernels saturate 16-bit pair sums")


def _version() -> str:
    return f"qlinear {qlinear.__version__}"


def _wrap(text: str) -> str:
    return textwrap.fill(text, 79)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="qlinear", formatter_class=fmt,
        description="Run and check quantized ONNX models with qlinear's exact integer kernels.",
        epilog="examples:\n  qlinear run\n  qlinear compare model.onnx --input x=x.npy\n"
               "  qlinear inspect model.onnx\n  qlinear conformance\n  qlinear bench\n\nqlinear COMMAND --help explains each "
               "command.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "run", formatter_class=fmt, help="run a model (default: the bundled example)",
        description=_wrap("Run a model with qlinear's backend and print each output's name, shape, "
                    "dtype, a summary and the time taken. Without MODEL, runs the bundled "
                    "quantized 8x8-digits classifier on its 400 bundled test images and reports "
                    "its accuracy (and onnxruntime's agreement, if onnxruntime is installed)."),
        epilog="examples:\n  qlinear run\n  qlinear run model.onnx --input images=batch.npy "
               "--output-dir out/\n  qlinear run model.onnx --json\n"
               "  qlinear run model.onnx --shape images=1x3x224x224 --save-inputs in/\n"
               "  qlinear run model.onnx --input in/inputs.npz --timeout 60")
    _add_model_args(p, "run")
    p.add_argument("--output-dir", metavar="DIR",
                   help="save every output as DIR/NAME.npy, names made distinct, with a manifest "
                        "DIR/outputs.json mapping output names to files (nothing is written "
                        "elsewhere)")
    _add_emulate_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "compare", formatter_class=fmt, help="compare qlinear and onnxruntime node by node",
        description=_wrap("Run the model in qlinear and in onnxruntime. The model's outputs are "
                    "compared with onnxruntime's normal session (default graph optimizations, "
                    "what users deploy); one row per node compares qlinear's intermediates with "
                    "an onnxruntime run exposing every intermediate: operator, elements, "
                    "mismatching elements, verdict, largest difference (quantization steps for "
                    "integer tensors; absolute, relative and ulps for floats) and a diagnosis - "
                    "in particular whether onnxruntime's 16-bit saturation in its uint8 x int8 "
                    "kernels explains the difference. Integer tensors are compared exactly; "
                    "float tensors are identical, within tolerance (|q - o| <= atol + rtol*|o|) "
                    "or DIFFER. Times are warm medians of plain runs. Exit status 1 only when "
                    "an output DIFFERs, else 0. With --dataset, every sample of a dataset is "
                    "compared, on worker processes or Ray actors, and the figures are merged "
                    "exactly (counts and sums): the report is the same whatever the workers."),
        epilog="examples:\n  qlinear compare model.onnx --input x=x.npy\n"
               "  qlinear compare model.onnx --atol 1e-4 --rtol 1e-3\n"
               "  qlinear compare --emulate onnxruntime-avx2   # as on AVX2 servers without VNNI\n"
               "  qlinear compare            # the bundled example\n"
               "  qlinear compare model.onnx --input in/inputs.npz   # inputs saved by "
               "--save-inputs\n"
               "  qlinear compare model.onnx --json > report.json\n"
               "  qlinear compare model.onnx --dataset samples/ --labels labels.npy --workers 2\n"
               "  qlinear compare model.onnx --dataset val.npz --float model_fp32.onnx --plot nodes.png\n"
               "  qlinear compare model.onnx --dataset val.npz --ray auto   # on a Ray cluster")
    _add_model_args(p, "compare")
    p.add_argument("--atol", type=float, default=1e-5, metavar="A",
                   help="absolute tolerance of float tensors: |q - o| <= A + R*|o| is within "
                        "tolerance (default 1e-5)")
    p.add_argument("--rtol", type=float, default=1e-5, metavar="R",
                   help="relative tolerance of float tensors (default 1e-5)")
    p.add_argument("--ulp", type=int, default=0, metavar="N",
                   help="also count float32 values within N units in the last place as within "
                        "tolerance (default 0); integer tensors are always compared exactly")
    _add_emulate_arg(p)
    g = p.add_argument_group(
        "dataset mode", _wrap("compare over many samples and report aggregated figures (per "
                              "output: samples identical / within tolerance / DIFFER; top-1 "
                              "agreement; per node: mismatch rate, max and mean difference, "
                              "SQNR against --float, diagnoses with their counts)"))
    g.add_argument("--dataset", metavar="DATA",
                   help="a folder of .npz files (one sample each, arrays named by input, in "
                        "file-name order), or one .npz whose arrays have a leading sample axis "
                        "(N, *input shape); read sample by sample, never loaded whole")
    g.add_argument("--labels", metavar="FILE.npy",
                   help="one integer class per sample: accuracy of qlinear, onnxruntime (and "
                        "--float) from the argmax of the first output")
    g.add_argument("--float", dest="float_model", metavar="MODEL.onnx",
                   help="the float model the quantized one came from: top-1 agreement with it and "
                        "each node's SQNR against its tensor of the same name (or X for "
                        "X_DequantizeLinear_Output), as onnxruntime's qdq_loss_debug matches them")
    g.add_argument("--workers", type=int, metavar="N",
                   help="worker processes, each preparing the model once (default: one per CPU "
                        "core); the report is the same whatever N")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the workers as Ray actors: on a new local Ray instance, or on the "
                        "cluster at ADDRESS (e.g. auto, ray://head:10001); needs pip install "
                        "'qlinear[scale]', and DATA and the models at the same path on every node")
    g.add_argument("--plot", metavar="FILE.png",
                   help="write a chart of each node's mismatch rate (and SQNR with --float); "
                        "needs matplotlib")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "inspect", formatter_class=fmt,
        help="describe a model and what qlinear supports in it, without running it",
        description=_wrap("Print a model's inputs and outputs (dtype, shape with symbolic "
                    "dimensions), opsets, operator counts by domain, and for each operator "
                    "whether qlinear runs it or why it refuses it, and onnx's checker verdict. "
                    "Nothing is run."),
        epilog="examples:\n  qlinear inspect model.onnx\n  qlinear inspect model.onnx --json")
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model to inspect")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--max-tensor-bytes", type=int, default=None, metavar="N",
                   help="refuse models declaring a tensor larger than N bytes (default 2 GiB)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "conformance", formatter_class=fmt, help="run ONNX's backend node tests for the operators",
        description=_wrap("Run ONNX's own backend test cases for QuantizeLinear, "
                    "DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger "
                    "(and BatchNormalization) through qlinear.backend, and print one row per "
                    "case: pass, FAIL, or unsupported with the reason. Exit status 1 if any "
                    "supported case fails."),
        epilog="examples:\n  qlinear conformance\n  qlinear conformance --json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser(
        "bench", formatter_class=fmt, add_help=False,
        help="run the speed benchmark suite (qlinear.tools.bench)",
        description="Run qlinear's benchmark suite; arguments are passed to qlinear.tools.bench.",
        epilog="examples:\n  qlinear bench\n  qlinear bench --help")
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    return parser


#: Modules of the optional extras: a plain ``pip install qlinear`` lacks them.
_TOOL_MODULES = ("onnx", "onnxruntime", "tqdm", "matplotlib", "google")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    debug = bool(os.environ.get("QLINEAR_DEBUG"))
    try:
        if os.environ.get("QLINEAR_ORT_SATURATES", "").strip():
            # checked up front, as qlinear's import checks the other QLINEAR_* variables: a
            # bad value would otherwise surface only after a whole comparison has run
            try:
                forced()
            except ValueError as e:
                raise _Error(str(e).removeprefix("qlinear: ")) from None
        if argv[:1] == ["bench"]:  # everything after "bench" belongs to qlinear.tools.bench, options too
            return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        if getattr(args, "max_tensor_bytes", None) is None and hasattr(args, "max_tensor_bytes"):
            from qlinear.tools.model import DEFAULT_MAX_TENSOR_BYTES

            args.max_tensor_bytes = DEFAULT_MAX_TENSOR_BYTES
        if getattr(args, "max_tensor_bytes", 1) < 1:
            raise _Error(f"--max-tensor-bytes {args.max_tensor_bytes}: must be 1 or more")
        for flag in ("output_dir", "save_inputs"):  # before any work: '' meant the current folder
            folder = getattr(args, flag, None)
            if folder is not None and not folder.strip():
                raise _Error(f"--{flag.replace('_', '-')} {folder!r}: an empty folder name (for "
                             f"the current folder say --{flag.replace('_', '-')} .)")
        timeout = getattr(args, "timeout", None)
        if timeout is not None and not (0 < timeout < 1e9):
            raise _Error(f"--timeout {timeout:g}: must be a number of seconds above 0 and below "
                         "1e+09")  # (1e9 s is about 31 years)
        # A model's float operators give inf and NaN as IEEE 754 (and onnxruntime) define
        # them: results, not errors, so NumPy's RuntimeWarnings about them are not printed
        with _time_limit(timeout), np.errstate(all="ignore"):
            return args.func(args)
    except KeyboardInterrupt:
        print("qlinear: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (Exception, _Timeout) as e:  # every error is one line; QLINEAR_DEBUG=1 shows the traceback
        if debug:
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] in _TOOL_MODULES:
            extra = "bench" if argv[:1] == ["bench"] else "tools"
            msg = (f"qlinear {argv[0] if argv else ''} needs the model tools, and the Python "
                   f"package {missing.split('.')[0]!r} is not installed: "
                   f"pip install 'qlinear[{extra}]'")
        elif not isinstance(e, (_Error, _Timeout, ValueError, TypeError, OSError,
                                RuntimeError)) and \
                type(e).__name__ != "ToolError":
            msg = f"{type(e).__name__}: {msg}"
        if len(msg) > 2000:
            msg = msg[:1997] + "..."
        print(f"qlinear: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
