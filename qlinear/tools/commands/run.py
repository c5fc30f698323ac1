"""``qlinear run``: a model (default: the bundled example) on qlinear's backend, each output's
summary and the time taken, the outputs saved on request."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from qlinear.backend import QLinearRep, model_as_run
from qlinear.tools.commands.common import dumps, progress_enabled, qdq_options, summarize
from qlinear.tools.commands.inputs import hint_dynamic_dims, model_and_inputs
from qlinear.tools.compare import run_onnxruntime
from qlinear.tools.model import ToolError, make_output_dir, safe_output_path, write_file
from qlinear.tools.ortsat import onnxruntime_saturates, probe_source
from qlinear.tools.table import format_table, node_progress


def _example_report(meta, outputs: dict[str, np.ndarray], labels, model, feeds) -> dict[str, Any]:
    probs = outputs[meta["output"]]
    pred = probs.argmax(axis=-1)
    rep: dict[str, Any] = {"samples": int(len(labels)),
                           "accuracy": float((pred == labels).mean()),
                           "correct": int((pred == labels).sum())}
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


def main(args) -> int:
    """``qlinear run``."""
    example = args.model is None
    model_path, model, feeds, labels, meta, note = model_and_inputs(args)
    if args.output_dir is not None and os.path.exists(args.output_dir) \
            and not os.path.isdir(args.output_dir):
        raise ToolError(f"--output-dir {args.output_dir}: exists and is not a directory")

    t0 = time.perf_counter()
    rep = QLinearRep(model_as_run(model, getattr(args, "qdq", "fuse"), args.emulate, qdq_options(args)),
                     emulate=args.emulate,
                     max_tensor_bytes=args.max_tensor_bytes)
    t_prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    with hint_dynamic_dims(args):
        values = rep.run(feeds, progress=node_progress(progress_enabled(args)))
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
        print(dumps(result))
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
