"""A/B of plain calls: this tree's qlinear against another build of it, in one process.

The other build is a copy of an older commit's ``qlinear`` package renamed ``qlinear_before``
(with its compiled extension) on PYTHONPATH:

    git archive <commit> | tar -x -C /tmp/before && (cd /tmp/before && python setup.py build_ext --inplace)
    mkdir /tmp/before-pkg && cp -r /tmp/before/qlinear /tmp/before-pkg/qlinear_before
    PYTHONPATH=/tmp/before-pkg python benchmarks/plain_ab.py [--cases a,b] [--repeat 30]

Per case: onnxruntime (prepacked session), this tree's prepared form, the plain call before and after, interleaved, 1
thread each, CPU time of the calling thread (``--wall``: wall clock, ``--threads`` threads
each, every timed call right after an untimed one of the same function: the two builds have a
thread pool each, whose worker spins for a while after a call), medians; ratios to onnxruntime.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np

import qlinear
import qlinear_before  # type: ignore[import-not-found]
from qlinear.tools.bench import cases as bench_cases, run as bench_run

from native_plain import CASES


def _call(fn_name: str, module, closure: dict, op: str):
    if op == "QLinearConv":
        c = closure
        return lambda: module.qlinear_conv(c["x"], c["x_scale"], c["x_zp"], c["w"], c["w_scale"], c["w_zp"],
                                           c["y_scale"], c["y_zp"], c["bias"], **c["attrs"])
    if op == "ConvInteger":
        c = closure
        return lambda: module.conv_integer(c["x"], c["w"], c["x_zp"], c["w_zp"], **c["attrs"])
    if op == "QLinearMatMul":
        c = closure
        return lambda: module.qlinear_matmul(c["a"], c["a_scale"], c["a_zp"], c["b"], c["b_scale"], c["b_zp"],
                                             c["y_scale"], c["y_zp"])
    if op == "MatMulInteger":
        c = closure
        return lambda: module.matmul_integer(c["a"], c["b"], c["a_zp"], c["b_zp"])
    raise ValueError(op)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--no-amx", action="store_true", help=noamx.HELP)
    p.add_argument("--wall", action="store_true", help="wall-clock time with --threads threads each")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weight-bits", type=int, default=8, choices=(7, 8))
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    threads = args.threads if args.wall else 1
    clock = time.perf_counter if args.wall else time.thread_time
    qlinear.set_num_threads(threads)
    qlinear_before.set_num_threads(threads)
    print(f"{threads} thread(s) each, {'wall clock' if args.wall else 'CPU time of the calling thread'}, "
          f"median of {args.repeat}, {args.weight_bits}-bit weights; load average {os.getloadavg()[0]:.1f}")
    by_name = {c.name: c for c in bench_cases.all_cases(args.weight_bits)}
    before, after = [], []
    for name in args.cases.split(","):
        case = by_name[name]
        built = case.build(np.random.default_rng(0))
        closure = {n: c.cell_contents for n, c in zip(built.plain.__code__.co_freevars, built.plain.__closure__)}
        sess = bench_run.ort_session(built.model, threads)
        fns = {"ort": lambda: sess.run(None, built.feeds), "prepared": built.prepare(),
               "before": _call("plain", qlinear_before, closure, case.op),
               "after": _call("plain", qlinear, closure, case.op)}
        outs = {k: f() for k, f in fns.items() if k in ("before", "after")}
        assert np.array_equal(outs["before"], outs["after"]), name
        ts = {k: [] for k in fns}
        # every call reads the same weights: the order alternates, so that neither plain call
        # always runs right after the other one has brought them into the caches
        orders = (list(fns.items()), [(k, fns[k]) for k in ("after", "before", "prepared", "ort")])
        for r in range(args.repeat):
            for k, f in orders[r % 2]:
                if args.wall:
                    # each build has its own thread pool, whose worker spins for a while after a
                    # call: an untimed call first, so the other build's spinning worker (or
                    # onnxruntime's) does not share the CPUs with the timed one
                    f()
                t0 = clock(); f(); ts[k].append(clock() - t0)  # noqa: E702
        t = {k: float(np.median(v)) for k, v in ts.items()}
        before.append(t["before"] / t["ort"])
        after.append(t["after"] / t["ort"])
        print(f"{name:28s} ort {t['ort'] * 1e3:7.3f} ms  prepared {t['prepared'] * 1e3:7.3f} ms  "
              f"plain before {t['before'] * 1e3:7.3f} ms ({before[-1]:.2f}; +{(t['before'] / t['prepared'] - 1) * 100:.0f}%)  "
              f"after {t['after'] * 1e3:7.3f} ms ({after[-1]:.2f}; +{(t['after'] / t['prepared'] - 1) * 100:.0f}%)",
              flush=True)
    g = lambda r: math.exp(sum(map(math.log, r)) / len(r))  # noqa: E731
    print(f"plain/onnxruntime geometric mean: before {g(before):.2f}, after {g(after):.2f}; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
