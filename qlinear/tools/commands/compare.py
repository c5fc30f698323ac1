"""``qlinear compare``: qlinear against onnxruntime node by node on one input, or over a whole
dataset on worker processes or Ray actors (``qlinear.tools.workers``)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from qlinear.tools import workers as W
from qlinear.tools.commands.common import EXAMPLE_META, EXAMPLES_DIR, dumps, progress_enabled, qdq_options
from qlinear.tools.commands.inputs import hint_dynamic_dims, model_and_inputs
from qlinear.tools.compare import compare_model, format_report
from qlinear.tools.dataset import load_labels, open_dataset
from qlinear.tools.model import ToolError, check_supported, load_model, validate_model, write_file
from qlinear.tools.ortsat import onnxruntime_saturates, probe_source
from qlinear.tools.sweep import format_dataset_report, plot_report


def main(args) -> int:
    """``qlinear compare``."""
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
    model_path, model, feeds, _, _, note = model_and_inputs(args)
    with hint_dynamic_dims(args):
        result = compare_model(model, feeds, show_progress=progress_enabled(args), ulp=args.ulp,
                               atol=args.atol, rtol=args.rtol, emulate=args.emulate,
                               max_tensor_bytes=args.max_tensor_bytes,
                               qdq=getattr(args, "qdq", "fuse"), options=qdq_options(args))
    result["onnxruntime_u8s8_saturates"] = onnxruntime_saturates()
    result["saturation_probe"] = probe_source()
    result["model"] = model_path
    if note:
        result["note"] = note
    if args.json:
        print(dumps(result))
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
                float_model=args.float_model, emulate=args.emulate, qdq=args.qdq,
                qdq_accuracy=getattr(args, "qdq_accuracy", None), atol=args.atol,
                rtol=args.rtol, ulp=args.ulp, max_tensor_bytes=args.max_tensor_bytes,
                threads=max(1, cpus // workers))
    bar = None
    if progress_enabled(args) is not False and sys.stderr.isatty():
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
        write_file("--plot", args.plot, args.plot, lambda f: plot_report(result, f))
    if args.json:
        print(dumps(result))
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
