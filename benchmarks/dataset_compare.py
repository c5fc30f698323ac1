"""Throughput of ``qlinear compare MODEL --dataset DATA`` over generated samples: one worker,
two worker processes, and Ray actors (issue 32's targets: 2 workers >= 1.7x one; Ray within
15% of the process pool; the reports identical apart from their ``run`` section).

    python benchmarks/dataset_compare.py                       # MobileNetV2 (QDQ), 1,000 samples
    python benchmarks/dataset_compare.py --samples 200 --no-ray
    python benchmarks/dataset_compare.py --model resnet50.onnx --shape 1x3x224x224

The dataset is one uncompressed .npz of seeded U[0, 1) float32 samples (written once into
--workdir and reused). Each configuration runs the ``qlinear`` command in a subprocess, as a
user would, and its wall time includes starting the workers and preparing the model in each.
Peak resident memory of the command and its workers (their sum, sampled every 0.2 s from /proc)
is reported too: every worker holds one prepared model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

DEFAULT_MODEL = os.path.join(os.environ.get("QLINEAR_MODELS", "/work/shared/models"),
                             "mobilenetv2-7_qdq_opset10.onnx")


def _tree_rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (KiB), from /proc."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total


def run(cmd: list[str]) -> tuple[dict, float, int, float]:
    """(report, wall seconds, peak RSS KiB of the command and its workers, CPU seconds of the
    command and its waited-for descendants: the worker processes, not Ray's daemons)."""
    import resource
    import tempfile

    before = resource.getrusage(resource.RUSAGE_CHILDREN)

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # files, not pipes: a report larger than a pipe's buffer would block the command
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kib(proc.pid))
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed: {err.read().strip()}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return json.loads(out.read()), wall, peak, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--shape", default=None, help="sample shape, e.g. 1x3x224x224 (default: the "
                                                 "model's first input, symbolic dimensions 1)")
    p.add_argument("--workdir", default="/tmp/qlinear_dataset_bench")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import onnx

    from qlinear.tools.model import _declared, graph_inputs

    model = onnx.load(args.model, load_external_data=False)
    inputs = graph_inputs(model)
    if len(inputs) != 1:
        sys.exit("this benchmark generates one input; the model has "
                 f"{len(inputs)}")
    name = inputs[0].name
    dtype, shape = _declared(inputs[0])
    shape = [int(d) for d in args.shape.split("x")] if args.shape else [d or 1 for d in shape]
    os.makedirs(args.workdir, exist_ok=True)
    data = os.path.join(args.workdir, f"{os.path.basename(args.model)}.{args.samples}.{args.seed}.npz")
    if not os.path.exists(data):
        rng = np.random.default_rng(args.seed)
        arr = np.lib.format.open_memmap(data + ".npy", mode="w+", dtype=dtype,
                                        shape=(args.samples, *shape))
        for i in range(args.samples):  # one sample at a time: never the whole set in memory
            arr[i] = rng.random(shape, dtype=np.float32).astype(dtype)
        arr.flush()
        del arr
        import zipfile

        with zipfile.ZipFile(data + ".tmp", "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            z.write(data + ".npy", f"{name}.npy")
        os.remove(data + ".npy")
        os.replace(data + ".tmp", data)
    base = [sys.executable, "-m", "qlinear", "compare", args.model, "--dataset", data, "--json"]
    configs = [("1 worker", ["--workers", "1"]), ("2 workers", ["--workers", "2"])]
    if not args.no_ray:
        configs.append(("Ray, 2 actors", ["--workers", "2", "--ray"]))
    results = {}
    load = os.getloadavg()[0]
    for label, extra in configs:
        report, wall, peak, cpu = run(base + extra)
        run_section = report.pop("run")
        results[label] = (json.dumps(report, sort_keys=True), wall, run_section, peak)
        print(f"{label:14s} {wall:8.1f} s wall  {args.samples / wall:7.2f} samples/s  "
              f"(command's own {run_section['seconds']:.1f} s)  CPU {cpu:.1f} s"
              f"{' (without Ray daemons and actors)' if 'Ray' in label else ''}  "
              f"peak RSS of command + workers {peak / 1024:.0f} MiB", flush=True)
    texts = {r[0] for r in results.values()}
    one, two = results["1 worker"][1], results["2 workers"][1]
    print(f"2 workers / 1 worker: {one / two:.2f}x (target >= 1.7x)")
    if "Ray, 2 actors" in results:
        ray_wall = results["Ray, 2 actors"][1]
        print(f"Ray / process pool throughput: {two / ray_wall:.2f} (target >= 0.85)")
    print(f"reports identical apart from 'run': {len(texts) == 1}")
    print(f"load average at the start: {load:.1f} (the machine's other work slows every figure)")
    return 0 if len(texts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
