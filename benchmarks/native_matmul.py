"""qlinear's native engine against onnxruntime on u8 x s8 MatMulInteger / QLinearMatMul.

Both engines in one process, weights prepared (onnxruntime: initializers, prepacked), calls
interleaved, best of N. Two modes:

- ``--cpu-time`` (default): 1 thread each, CPU time of the calling thread (time.thread_time;
  onnxruntime with intra_op_num_threads=1 runs in the caller). On a machine shared with
  other work this is the stable measure of the kernels' efficiency.
- ``--wall``: wall-clock time, ``--threads`` threads each (default 2), as qlinear bench does.

Weights: full-range int8 (qlinear's exact path; onnxruntime saturates on AVX2 CPUs without
VNNI) and 7-bit int8 in [-64, 64] (where qlinear's AVX2 vpmaddubsw fast path applies).

    python benchmarks/native_matmul.py [--wall] [--threads 2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import time

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import qlinear

CASES = [(1024, 1024, 1024), (128, 768, 3072), (3136, 576, 64)]


def session(op: str, m: int, k: int, b: np.ndarray, threads: int) -> ort.InferenceSession:
    init = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(0, np.int8), "bz"),
            numpy_helper.from_array(np.array(3, np.uint8), "az")]
    if op == "MatMulInteger":
        node = helper.make_node(op, ["a", "b", "az", "bz"], ["y"])
        out = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    else:
        init += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("as", 0.02), ("bs", 0.01), ("ys", 0.5))]
        init.append(numpy_helper.from_array(np.array(128, np.uint8), "yz"))
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        out = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])], [out], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wall", action="store_true", help="wall-clock time with --threads threads each")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no-amx", action="store_true", help=noamx.HELP)
    args = p.parse_args()
    threads = args.threads if args.wall else 1
    clock = time.perf_counter if args.wall else time.thread_time
    qlinear.set_num_threads(threads)
    info = qlinear.engine_info()
    print(f"qlinear engine {info['engine']} isa {info['isa']} ({', '.join(info['isas'])}), {threads} thread(s) each, "
          f"{'wall clock' if args.wall else 'CPU time of the calling thread'}, best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(0)
    for m, k, n in CASES:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        for weights, (lo, hi) in (("full-range", (-128, 127)), ("7-bit", (-64, 64))):
            b = rng.integers(lo, hi, (k, n), endpoint=True).astype(np.int8)
            for op in ("MatMulInteger", "QLinearMatMul"):
                sess = session(op, m, k, b, threads)
                if op == "MatMulInteger":
                    prep = qlinear.prepare_matmul_integer(b, np.int8(0))
                    ours = lambda: prep.run(a, np.uint8(3))  # noqa: E731
                else:
                    prep = qlinear.prepare_qlinear_matmul(b, np.float32(0.01), np.int8(0))
                    ours = lambda: prep.run(a, np.float32(0.02), np.uint8(3), np.float32(0.5), np.uint8(128))  # noqa: E731
                theirs = lambda: sess.run(None, {"a": a})  # noqa: E731
                theirs(), ours()
                t_ort = t_ql = float("inf")
                for _ in range(args.repeat):
                    t0 = clock(); theirs(); t_ort = min(t_ort, clock() - t0)  # noqa: E702
                    t0 = clock(); ours(); t_ql = min(t_ql, clock() - t0)  # noqa: E702
                g = m * k * n / 1e9
                print(f"{op:14s} {m}x{k}x{n} {weights:10s}  onnxruntime {g / t_ort:6.1f} GMAC/s  "
                      f"qlinear {g / t_ql:6.1f} GMAC/s  qlinear/onnxruntime speed {t_ort / t_ql:.2f}", flush=True)


if __name__ == "__main__":
    main()
