"""A/B of prepared calls on several threads: this tree's qlinear against another build, in one process.

The other build is a copy of an older commit's ``qlinear`` package renamed ``qlinear_before``
(with its compiled extension) on PYTHONPATH (see benchmarks/plain_ab.py for the recipe):

    PYTHONPATH=/tmp/before-pkg python benchmarks/prepared_ab.py --cases 'resnet50.*b8' --repeat 15

Per case: onnxruntime (prepacked session), the prepared call before and after, all with
--threads threads, wall time, the three interleaved in a rotating order (so that a slow spell of
the shared machine hits each alike), medians, and the median (quartiles) of the per-round
after/before ratios; the outputs of before and after compared bit for bit. On a loaded machine
run it in its own autogroup at a high priority (``flock /tmp/bench.lock setsid nice -n -15 ...``)
and read the quartiles: at load 3 they span 0.85-1.15 for an unchanged case. For calls of
milliseconds only: each build has its own thread pool, whose worker spins 20-40 us after a call,
and on calls of tens of microseconds that biases the comparison (docs/benchmarks.md, "Reading
the peak and the noise", has the measurement).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np

import qlinear
import qlinear_before  # type: ignore[import-not-found]
from qlinear.tools.bench import cases as bench_cases, run as bench_run


# 3-D layers beyond the bench's conv3d case (select them with --cases like any other): a
# video-style 64-channel 8x56x56 clip, a stride-2 one, a 7-bit-weight one (the fast path)
EXTRA_CASES = [
    bench_cases.conv_case("conv3d.c64.8x56x56.k3", 1, 64, (8, 56, 56), 64, (3, 3, 3)),
    bench_cases.conv_case("conv3d.c32.16x56x56.k3s2", 1, 32, (16, 56, 56), 64, (3, 3, 3), strides=(2, 2, 2)),
    bench_cases.conv_case("conv3d.c64.4x28x28.k133", 1, 64, (4, 28, 28), 128, (1, 3, 3)),
    bench_cases.conv_case("conv3d.c16.8x28x28.k3.w7", 1, 16, (8, 28, 28), 32, (3, 3, 3), weight_bits=7),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--no-amx", action="store_true", help=noamx.HELP)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cases", default="resnet50.*b8", help="comma-separated globs or substrings")
    args = p.parse_args()
    qlinear.set_num_threads(args.threads)
    qlinear_before.set_num_threads(args.threads)
    print(f"{args.threads} threads each, wall time, median of {args.repeat} interleaved; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    cases = bench_cases.select_cases(bench_cases.all_cases() + EXTRA_CASES, args.cases.split(","), False)
    before, after = [], []
    for case in cases:
        built = case.build(np.random.default_rng(0))
        sess = bench_run.ort_session(built.model, args.threads)
        new = built.prepare()
        # the same case built again with qlinear_before in qlinear's place (the case builders
        # import qlinear when they run), the same seed: the same operands
        sys.modules["qlinear"] = qlinear_before
        try:
            old = case.build(np.random.default_rng(0)).prepare()
        finally:
            sys.modules["qlinear"] = qlinear
        fns = {"ort": lambda: sess.run(None, built.feeds), "before": old, "after": new}
        assert np.array_equal(old(), new()), case.name
        for f in fns.values():
            f()
        ts: dict[str, list[float]] = {k: [] for k in fns}
        keys = list(fns)
        for r in range(args.repeat):
            for k in keys[r % 3:] + keys[:r % 3]:
                t0 = time.perf_counter()
                fns[k]()
                ts[k].append(time.perf_counter() - t0)
        t = {k: float(np.median(v)) for k, v in ts.items()}
        # paired: after/before of each round (the two calls a few milliseconds apart)
        paired = np.array(ts["after"]) / np.array(ts["before"])
        before.append(t["before"] / t["ort"])
        after.append(t["after"] / t["ort"])
        print(f"{case.name:28s} ort {t['ort'] * 1e3:7.3f} ms  before {t['before'] * 1e3:7.3f} ms ({before[-1]:.2f})"
              f"  after {t['after'] * 1e3:7.3f} ms ({after[-1]:.2f})  after/before {t['after'] / t['before']:.3f}"
              f"  paired {np.median(paired):.3f} ({np.quantile(paired, 0.25):.3f}-{np.quantile(paired, 0.75):.3f})",
              flush=True)
    g = lambda r: math.exp(sum(map(math.log, r)) / len(r))  # noqa: E731
    print(f"qlinear/onnxruntime geometric mean: before {g(before):.3f}, after {g(after):.3f}; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
