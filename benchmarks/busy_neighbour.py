"""qlinear and onnxruntime with a busy neighbour: one CPU-bound process beside them.

A shared server or a laptop rarely gives a process every core. This script starts one
competing CPU-bound process (``python -c 'while True: pass'``), then times two cases of
qlinear's bench (``qlinear/tools/bench/cases.py``) for qlinear (the prepared form, as a model
runs it) and onnxruntime (a session with its defaults: spinning on, as users run it), each
runtime alone in its own process, alternating, 2 threads each; then the same without the
neighbour (idle must not get slower). Per round and runtime: the median of back-to-back calls
after a warm-up; printed: the medians over the rounds and the ratio qlinear / onnxruntime.

    python benchmarks/busy_neighbour.py                  # both cases, idle and busy (about 1-2 min)
    python benchmarks/busy_neighbour.py --rounds 3 --load busy

Target (issue #31): under load qlinear <= 1.2x onnxruntime; idle as before.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

CASES = {
    "resnet3x3": "resnet50.l1.3x3.b1",       # QLinearConv 64 -> 64, 3x3, 56x56
    "bert_qkv": "bert.qkv.128x768x768",      # QLinearMatMul 128 x 768 x 768
}
NEIGHBOUR = [sys.executable, "-c", "while True: pass"]


def worker(runtime: str, case_names: list[str], threads: int, seconds: float) -> None:
    """In a child process: time one runtime on each case; print one JSON line {case: median}."""
    import numpy as np

    from qlinear.tools.bench import cases as bench_cases

    every = {c.name: c for c in bench_cases.all_cases()}
    medians = {}
    for name in case_names:
        built = every[name].build(np.random.default_rng(0))
        if runtime == "qlinear":
            import qlinear

            qlinear.set_num_threads(threads)
            fn = built.prepare()
        else:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.log_severity_level = 3
            sess = ort.InferenceSession(built.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            fn = functools.partial(sess.run, None, built.feeds)
        end = time.perf_counter() + 0.3   # warm-up: caches, pools, the neighbour's share settled
        while time.perf_counter() < end:
            fn()
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 20:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        medians[name] = statistics.median(times)
    print(json.dumps(medians))


def run_child(runtime: str, case_names: list[str], threads: int, seconds: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", runtime,
                          "--case", ",".join(case_names), "--threads", str(threads), "--seconds", str(seconds)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per load (default 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per child (default 1)")
    ap.add_argument("--load", choices=["both", "idle", "busy"], default="both")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    ap.add_argument("--worker", choices=["qlinear", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.case.split(","), args.threads, args.seconds)
        return
    loads = ["idle", "busy"] if args.load == "both" else [args.load]
    print(f"{'load':5} {'case':10} {'qlinear ms':>10} {'ort ms':>8} {'ratio':>6}  (medians of {args.rounds} "
          f"rounds, {args.threads} threads, each runtime in its own process, alternating)")
    keys = args.cases.split(",")
    names = [CASES[k] for k in keys]
    for load in loads:
        neighbour = subprocess.Popen(NEIGHBOUR) if load == "busy" else None
        try:
            if neighbour:
                time.sleep(0.3)
            ours: dict[str, list[float]] = {n: [] for n in names}
            theirs: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                for runtime in (["qlinear", "ort"] if r % 2 == 0 else ["ort", "qlinear"]):
                    for name, t in run_child(runtime, names, args.threads, args.seconds).items():
                        (ours if runtime == "qlinear" else theirs)[name].append(t)
            for key, name in zip(keys, names):
                q, o = statistics.median(ours[name]), statistics.median(theirs[name])
                print(f"{load:5} {key:10} {q * 1e3:10.3f} {o * 1e3:8.3f} {q / o:6.2f}", flush=True)
        finally:
            if neighbour:
                neighbour.kill()
                neighbour.wait()

if __name__ == "__main__":
    main()
