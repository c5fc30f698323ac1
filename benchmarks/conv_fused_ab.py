"""A/B in one process: ResNet-50's batch-1 pointwise layers with the input copy inside the
GEMM tasks (the default) against the separate copy job (``conv_fused_copy(0)``).

    python benchmarks/conv_fused_ab.py [--threads 2] [--rounds 7] [--repeat 30]

Per layer: rounds of ``--repeat`` back-to-back prepared calls, the two variants alternating
A B B A ... (so a drift of the host touches both), each round's median; prints both medians
of the rounds' medians and their ratio (fused / copy job; below 1: the fused copy is faster).
Runs in well under a minute on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import qlinear
from qlinear import _native
from qlinear.tools.bench.cases import all_cases

from timing import median_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cases", default="1x1", help="substring of the resnet50.*.b1 case names")
    a = ap.parse_args()
    qlinear.set_num_threads(a.threads)
    C = _native._C
    cases = [c for c in all_cases() if c.name.startswith("resnet50.") and c.name.endswith(".b1")
             and a.cases in c.name]
    print(f"{'layer':24s} {'fused us':>9s} {'job us':>9s} {'ratio':>6s}  ({a.threads} threads, "
          f"{a.rounds} rounds of {a.repeat})")
    ratios = []
    for case in cases:
        fn = case.build(np.random.default_rng(0)).prepare()
        times: dict[int, list[float]] = {1: [], 0: []}
        for r in range(a.rounds):
            for on in ((1, 0) if r % 2 == 0 else (0, 1)):
                C.conv_fused_copy(on)
                times[on].append(median_seconds(fn, a.repeat, warm=3))
        C.conv_fused_copy(1)
        f, j = statistics.median(times[1]), statistics.median(times[0])
        ratios.append(f / j)
        print(f"{case.name:24s} {f * 1e6:9.1f} {j * 1e6:9.1f} {f / j:6.3f}")
    print(f"geometric mean fused / copy job: {float(np.exp(np.mean(np.log(ratios)))):.3f}")


if __name__ == "__main__":
    main()
