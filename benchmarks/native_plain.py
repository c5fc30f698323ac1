"""Plain calls (weights passed every call) against prepared calls and onnxruntime.

The cases of ``qlinear bench``: onnxruntime (weights as initializers, prepacked), qlinear's
prepared form and its plain function, in one process, calls interleaved, best of N.

- default: 1 thread each, CPU time of the calling thread (time.thread_time; onnxruntime with
  intra_op_num_threads=1 runs in the caller): the stable measure on a shared machine;
- ``--wall``: wall-clock time, ``--threads`` threads each (default 2), as qlinear bench does.

    python benchmarks/native_plain.py [--wall] [--threads 2] [--repeat 20] [--cases a,b]
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import qlinear
from qlinear.tools.bench import cases as bench_cases, run as bench_run

CASES = ["resnet50.l1.3x3.b1", "resnet50.l1.1x1a.b1", "resnet50.l2.3x3.b1", "resnet50.l3.3x3.b1",
         "resnet50.l3.1x1c.b1", "resnet50.l4.3x3.b1", "resnet50.l4.1x1c.b1", "resnet50.conv1.b1",
         "mobilenetv2.dw144.56s1", "mobilenetv2.pw960-320.7",
         "bert.qkv.128x768x768", "bert.ffn1.128x768x3072", "bert.ffn2.128x3072x768",
         "matmulinteger.bert.ffn1", "bert.attn.scores"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wall", action="store_true", help="wall-clock time with --threads threads each")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--weight-bits", type=int, default=8, choices=(7, 8))
    args = p.parse_args()
    threads = args.threads if args.wall else 1
    clock = time.perf_counter if args.wall else time.thread_time
    qlinear.set_num_threads(threads)
    info = qlinear.engine_info()
    print(f"qlinear engine {info['engine']} isa {info['isa']}, {threads} thread(s) each, "
          f"{'wall clock' if args.wall else 'CPU time of the calling thread'}, best of {args.repeat}, "
          f"{args.weight_bits}-bit weights; load average {os.getloadavg()[0]:.1f}")
    by_name = {c.name: c for c in bench_cases.all_cases(args.weight_bits)}
    ratios = []
    for name in args.cases.split(","):
        case = by_name[name]
        built = case.build(np.random.default_rng(0))
        ours = built.prepare()
        plain = built.plain
        sess = bench_run.ort_session(built.model, threads)
        theirs = lambda: sess.run(None, built.feeds)  # noqa: E731
        theirs(), ours(), plain()
        t_ort = t_ql = t_pl = float("inf")
        for _ in range(args.repeat):
            t0 = clock(); theirs(); t_ort = min(t_ort, clock() - t0)  # noqa: E702
            t0 = clock(); ours(); t_ql = min(t_ql, clock() - t0)  # noqa: E702
            t0 = clock(); plain(); t_pl = min(t_pl, clock() - t0)  # noqa: E702
        ratios.append(t_pl / t_ort)
        print(f"{name:28s} ort {t_ort * 1e3:7.3f} ms  prepared {t_ql * 1e3:7.3f} ms ({t_ql / t_ort:.2f})  "
              f"plain {t_pl * 1e3:7.3f} ms ({t_pl / t_ort:.2f}; +{(t_pl - t_ql) * 1e3:.3f} ms)", flush=True)
    print(f"plain/onnxruntime geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
