"""qlinear's native engine against onnxruntime on QLinearConv / ConvInteger layers.

The layers of ``qlinear bench`` (ResNet-50, MobileNetV2 depthwise, ConvInteger): both engines
in one process, weights prepared (onnxruntime: initializers), calls interleaved, best of N.

- default: 1 thread each, CPU time of the calling thread (time.thread_time; onnxruntime with
  intra_op_num_threads=1 runs in the caller): the stable measure on a shared machine;
- ``--wall``: wall-clock time, ``--threads`` threads each (default 2), as qlinear bench does.

    python benchmarks/native_conv.py [--wall] [--threads 2] [--repeat 20] [--cases a,b]
"""

from __future__ import annotations

import argparse
import os
import time

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np

import qlinear
from qlinear.tools.bench import cases as bench_cases, run as bench_run

CASES = ["resnet50.l1.3x3.b1", "resnet50.l1.1x1a.b1", "resnet50.l1.1x1c.b1", "resnet50.l2.3x3.b1",
         "resnet50.l3.3x3.b1", "resnet50.l3.1x1c.b1", "resnet50.l4.3x3.b1", "resnet50.conv1.b1",
         "mobilenetv2.dw32.112s1", "mobilenetv2.dw96.112s2", "mobilenetv2.dw144.56s1",
         "mobilenetv2.dw384.14s1", "mobilenetv2.dw960.7s1", "convinteger.resnet50.l1.3x3"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wall", action="store_true", help="wall-clock time with --threads threads each")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no-amx", action="store_true", help=noamx.HELP)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--weight-bits", type=int, default=8, choices=(7, 8),
                   help="7: int8 weights in [-64, 64), where qlinear's 7-bit fast path applies")
    args = p.parse_args()
    threads = args.threads if args.wall else 1
    clock = time.perf_counter if args.wall else time.thread_time
    qlinear.set_num_threads(threads)
    info = qlinear.engine_info()
    print(f"qlinear engine {info['engine']} isa {info['isa']}, {threads} thread(s) each, "
          f"{'wall clock' if args.wall else 'CPU time of the calling thread'}, best of {args.repeat}, "
          f"{args.weight_bits}-bit weights; "
          f"load average {os.getloadavg()[0]:.1f}")
    by_name = {c.name: c for c in bench_cases.all_cases(args.weight_bits)}
    for name in args.cases.split(","):
        case = by_name[name]
        built = case.build(np.random.default_rng(0))
        ours = built.prepare()
        sess = bench_run.ort_session(built.model, threads)
        theirs = lambda: sess.run(None, built.feeds)  # noqa: E731
        theirs(), ours()
        t_ort = t_ql = float("inf")
        for _ in range(args.repeat):
            t0 = clock(); theirs(); t_ort = min(t_ort, clock() - t0)  # noqa: E702
            t0 = clock(); ours(); t_ql = min(t_ql, clock() - t0)  # noqa: E702
        g = case.macs / 1e9
        print(f"{name:30s} {case.shape:42s} onnxruntime {t_ort * 1e3:7.3f} ms {g / t_ort:6.1f} GMAC/s  "
              f"qlinear {t_ql * 1e3:7.3f} ms {g / t_ql:6.1f} GMAC/s  qlinear/onnxruntime speed {t_ort / t_ql:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
