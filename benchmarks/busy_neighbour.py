"""qlinear and onnxruntime with a busy neighbour: one CPU-bound process beside them.

A shared server or a laptop rarely gives a process every core. This script starts one
competing CPU-bound process (``python -c 'while True: pass'``), then times two cases of
qlinear's bench (``qlinear/tools/bench/cases.py``) for qlinear (the prepared form, as a model
runs it) and onnxruntime (a session with its defaults: spinning on, as users run it), each
runtime alone in its own process, 2 threads each; then the same without the neighbour (idle
must not get slower).

Why so many rounds: with a neighbour the time a call takes depends on where the scheduler puts
the three busy threads, which changes from one process to the next (and within one); three
rounds once gave busy ratios of 1.44 and 1.48 for one build and 0.81 and 1.74 for another
case of the same build. So a *round* is one child process of each runtime, back to back, the
order alternating (ABBA: qlinear, onnxruntime, onnxruntime, qlinear, ...), and the round's
ratio pairs the two children that ran in the same minute. Printed per load and case: the
medians over the rounds of each runtime's times, the median of the rounds' ratios with its
quartiles, the spread (interquartile range over the median, the bench's noise measure) and a
verdict against the target: **met** when the upper quartile of the ratios is within it,
**missed** when the lower quartile is above it, else **inconclusive** (run more rounds, or on
a quieter machine). ``--json`` writes every round.

    python benchmarks/busy_neighbour.py                    # 9 rounds, both loads (about 2-3 min)
    python benchmarks/busy_neighbour.py --rounds 15 --load busy
    python benchmarks/busy_neighbour.py --json out.json

Target (issue #31): under load qlinear <= 1.2x onnxruntime; idle as before. Run it on an
otherwise idle machine: the load average is printed first, and a run that starts above 1.0
is marked (another process is already a neighbour).
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
TARGET = 1.2


def worker(runtime: str, case_names: list[str], threads: int, seconds: float) -> None:
    """In a child process: time one runtime on each case; print one JSON line
    {case: {"median": s, "q25": s, "q75": s, "runs": n}} (and qlinear's pool counts)."""
    import numpy as np

    from qlinear.tools.bench import cases as bench_cases

    every = {c.name: c for c in bench_cases.all_cases()}
    out: dict[str, object] = {}
    pool0 = None
    for name in case_names:
        built = every[name].build(np.random.default_rng(0))
        if runtime == "qlinear":
            import qlinear
            from qlinear import _native

            qlinear.set_num_threads(threads)
            fn = built.prepare()
            pool0 = _native._C.pool_counts() if hasattr(_native._C, "pool_counts") else None
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
        q25, q50, q75 = (float(v) for v in np.percentile(times, [25, 50, 75]))
        out[name] = {"median": q50, "q25": q25, "q75": q75, "runs": len(times)}
    if pool0 is not None:
        from qlinear import _native

        out["pool_counts"] = [int(b) - int(a) for a, b in zip(pool0, _native._C.pool_counts())]
    print(json.dumps(out))


def run_child(runtime: str, case_names: list[str], threads: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", runtime,
                          "--case", ",".join(case_names), "--threads", str(threads), "--seconds", str(seconds)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def quartiles(v: list[float]) -> tuple[float, float, float]:
    """25th, 50th, 75th percentiles (linear interpolation, as numpy.percentile)."""
    s = sorted(v)
    def at(p: float) -> float:
        k = (len(s) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)
    return at(0.25), at(0.5), at(0.75)


def verdict(q25: float, q75: float, target: float = TARGET) -> str:
    """met: even the slower quarter of the rounds is within the target; missed: even the faster
    quarter is above it; else inconclusive."""
    if q75 <= target:
        return "met"
    if q25 > target:
        return "missed"
    return "inconclusive"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per load (default 9)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per child and case (default 1)")
    ap.add_argument("--load", choices=["both", "idle", "busy"], default="both")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    ap.add_argument("--json", metavar="FILE", help="also write every round to FILE")
    ap.add_argument("--worker", choices=["qlinear", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.case.split(","), args.threads, args.seconds)
        return
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average (1 min) at the start: {load0:.2f}"
          + ("  ** above 1.0: the machine is not idle; these numbers are not the target's **" if load0 > 1.0 else ""))
    print(f"{'load':5} {'case':10} {'qlinear ms':>10} {'ort ms':>8} {'ratio':>6} {'q25-q75':>11} {'spread':>6}  verdict "
          f"(target <= {TARGET}; {args.rounds} rounds, {args.threads} threads, each runtime in its own process, ABBA)")
    keys = args.cases.split(",")
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    names = [CASES[k] for k in keys]
    record: dict[str, object] = {"load_average_start": load0, "rounds": args.rounds, "threads": args.threads,
                                 "target": TARGET, "loads": {}}
    loads = ["idle", "busy"] if args.load == "both" else [args.load]
    for load in loads:
        neighbour = subprocess.Popen(NEIGHBOUR) if load == "busy" else None
        try:
            if neighbour:
                time.sleep(0.3)
            rounds: list[dict[str, dict]] = []
            for r in range(args.rounds):
                order = ["qlinear", "ort"] if r % 2 == 0 else ["ort", "qlinear"]
                got = {rt: run_child(rt, names, args.threads, args.seconds) for rt in order}
                rounds.append(got)
            summary = {}
            for key, name in zip(keys, names):
                q = [rd["qlinear"][name]["median"] for rd in rounds]
                o = [rd["ort"][name]["median"] for rd in rounds]
                ratios = [a / b for a, b in zip(q, o)]
                r25, r50, r75 = quartiles(ratios)
                spread = (r75 - r25) / r50
                v = verdict(r25, r75)
                summary[key] = {"qlinear_s": statistics.median(q), "ort_s": statistics.median(o),
                                "ratios": ratios, "ratio_q25": r25, "ratio_median": r50, "ratio_q75": r75,
                                "spread": spread, "verdict": v}
                print(f"{load:5} {key:10} {statistics.median(q) * 1e3:10.3f} {statistics.median(o) * 1e3:8.3f} "
                      f"{r50:6.2f} {r25:5.2f}-{r75:<5.2f} {spread * 100:5.0f}%  {v}"
                      + ("  (noisy)" if spread > 0.10 else ""), flush=True)
            pools = [rd["qlinear"].get("pool_counts") for rd in rounds if rd["qlinear"].get("pool_counts")]
            if pools:
                tot = [sum(p[i] for p in pools) for i in range(len(pools[0]))]
                extra = (f", {tot[4]} workers moved off the caller's CPU, {tot[5]} callers lent their CPU"
                         if len(tot) >= 6 else "")
                print(f"{load:5} qlinear pool over the rounds: {tot[0]} jobs to the workers, {tot[1]} on the "
                      f"caller alone, {tot[2]} worker sleeps, {tot[3]} callers that blocked{extra}")
            record["loads"][load] = {"summary": summary, "rounds": rounds}
        finally:
            if neighbour:
                neighbour.kill()
                neighbour.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
