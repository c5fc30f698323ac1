"""MatMulNBits, qlinear's native kernels side by side with onnxruntime (issue 30's targets):
decode (M = 1) and prefill (M = 128) at K x N = 4096x4096, 4096x11008, 11008x4096, int4 with
packed uint8 zero points (onnxruntime's quantizer's default, asymmetric), block 32 and 128, at
accuracy_level 4 (int8 activations) and 0 (float).

    python benchmarks/matmul_nbits.py                  # everything, 2 threads (~2-3 min idle)
    python benchmarks/matmul_nbits.py --only decode    # or prefill
    python benchmarks/matmul_nbits.py --quick          # fewer rounds (steering under load)

Each runtime lives in its own worker process (qlinear with QLINEAR_NUM_THREADS, onnxruntime
with intra_op_num_threads, both 2 by default) that builds its prepared weights / session once
per case; the parent alternates the two workers case by case and round by round, each time
asking for a batch of timed calls, and reports the median of all of them. Ratio = qlinear's
median / onnxruntime's (<= 1.0 meets the target).

Decode is timed twice. Warm: calls back to back (the weights, 8 to 30 MiB with their scales,
partly stay in a 32 MiB L3 between calls). Cold: before each timed call the worker reads a
64 MiB array (twice the L3), which evicts the weights, so every call streams them from DRAM,
as a model whose layers together exceed the cache does. Decode's GB/s counts the bytes one
call must read (packed weights + float32 scales + packed zero points) over its cold median,
and % bw compares that with the machine's bandwidth, measured first in its own step: two
threads each summing a 256 MiB float32 array (NumPy's reduction, which releases the GIL) while
the other does the same, total bytes over the slower thread's time, best of 5.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time

import numpy as np

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
BLOCKS = [32, 128]
LEVELS = [4, 0]


def make_weights(K: int, N: int, bs: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    nb = -(-K // bs)
    B = rng.integers(0, 256, (N, nb, bs // 2), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.02, (N, nb)).astype(np.float32)
    zp = rng.integers(0, 256, (N, -(-nb // 2)), dtype=np.uint8)
    return B, scales, zp


def case_bytes(K: int, N: int, bs: int) -> int:
    nb = -(-K // bs)
    return N * nb * bs // 2 + N * nb * 4 + N * (-(-nb // 2))


def worker(kind: str, threads: int, conn) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if kind == "qlinear":
        os.environ["QLINEAR_NUM_THREADS"] = str(threads)
        from qlinear import contrib
    else:
        import onnxruntime as ort
        from onnx import helper, numpy_helper
    cache: dict = {}
    flush = np.ones(16 << 20, np.float32)  # 64 MiB: twice the L3
    while True:
        msg = conn.recv()
        if msg is None:
            return
        K, N, bs, level, M, calls, cold = msg
        key = (K, N, bs, level)
        if key not in cache:
            cache.clear()
            B, s, zp = make_weights(K, N, bs)
            if kind == "qlinear":
                p = contrib.prepare_matmul_nbits(B, s, zp, K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
                cache[key] = p.run
            else:
                node = helper.make_node("MatMulNBits", ["A", "B", "s", "z"], ["Y"], domain="com.microsoft",
                                        K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
                g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", 1, None)],
                                      [helper.make_tensor_value_info("Y", 1, None)],
                                      initializer=[numpy_helper.from_array(B, "B"), numpy_helper.from_array(s, "s"),
                                                   numpy_helper.from_array(zp, "z")])
                m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.microsoft", 1)])
                m.ir_version = 10
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                cache[key] = lambda a, sess=sess: sess.run(None, {"A": a})[0]
        fn = cache[key]
        a = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
        fn(a)
        times = []
        for _ in range(calls):
            if cold:
                np.add.reduce(flush)  # evicts the weights from the caches (not timed)
            t = time.perf_counter()
            fn(a)
            times.append(time.perf_counter() - t)
        conn.send(times)


def bandwidth() -> float:
    """GB/s of two threads each summing its own 256 MiB float32 array (best of 5)."""
    arrays = [np.ones(64 << 20, np.float32) for _ in range(2)]
    best = 0.0
    for _ in range(5):
        done = [0.0, 0.0]

        def run(i: int) -> None:
            t = time.perf_counter()
            np.add.reduce(arrays[i])
            done[i] = time.perf_counter() - t

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, 2 * arrays[0].nbytes / max(done) / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["decode", "prefill"])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a steer under load, not a result)")
    args = ap.parse_args()
    bw = bandwidth()
    print(f"memory bandwidth: {bw:.1f} GB/s (2 threads, read-only NumPy reductions of 2 x 256 MiB)", flush=True)
    ctx = mp.get_context("spawn")
    workers = {}
    for kind in ("qlinear", "onnxruntime"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(kind, args.threads, child), daemon=True)
        proc.start()
        workers[kind] = (proc, parent)
    cases = []
    for M in ((1,) if args.only == "decode" else (128,) if args.only == "prefill" else (1, 128)):
        for K, N in SHAPES:
            for bs in BLOCKS:
                for level in LEVELS:
                    cases.append((K, N, bs, level, M))
    rounds = 2 if args.quick else 4
    print(f"{'M':>4} {'K':>6} {'N':>6} {'bs':>4} {'lvl':>3} | {'qlinear ms':>10} {'ort ms':>9} {'ratio':>6} |"
          f" {'cold: qlinear':>13} {'ort ms':>9} {'ratio':>6} | {'GB/s':>6} {'% bw':>5}", flush=True)

    def timed(K: int, N: int, bs: int, level: int, M: int, calls: int, cold: bool) -> tuple[float, float]:
        got: dict = {"qlinear": [], "onnxruntime": []}
        for r in range(rounds):
            order = ("qlinear", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "qlinear")
            for kind in order:
                workers[kind][1].send((K, N, bs, level, M, calls, cold))
                got[kind] += workers[kind][1].recv()
        return statistics.median(got["qlinear"]), statistics.median(got["onnxruntime"])

    for K, N, bs, level, M in cases:
        calls = (20 if M == 1 else 2) if args.quick else (30 if M == 1 else 3)
        q, o = timed(K, N, bs, level, M, calls, False)
        line = f"{M:>4} {K:>6} {N:>6} {bs:>4} {level:>3} | {q * 1e3:>10.3f} {o * 1e3:>9.3f} {q / o:>6.2f} |"
        if M == 1:
            qc, oc = timed(K, N, bs, level, M, 5 if args.quick else 10, True)
            gbs = case_bytes(K, N, bs) / qc / 1e9
            line += f" {qc * 1e3:>13.3f} {oc * 1e3:>9.3f} {qc / oc:>6.2f} | {gbs:>6.1f} {100 * gbs / bw:>4.0f}%"
        print(line, flush=True)
    for proc, conn in workers.values():
        conn.send(None)
        proc.join(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
