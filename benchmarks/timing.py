"""The benchmarks' one timing loop: warm calls, then the median of back-to-back timed calls."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeat: int, warm: int = 2) -> float:
    """``warm`` untimed calls of ``fn``, then the median wall time in seconds of ``repeat`` calls."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def model_runner(runtime: str, model, feeds: dict, threads: int, path: str | None = None) -> Callable[[], object]:
    """One run of ``model`` on ``feeds`` by ``runtime`` ("qlinear" or "onnxruntime"), each with
    its defaults but the thread count: qlinear's backend prepared once, or an onnxruntime
    session (from ``path`` when given, else from the model's bytes) on the CPU provider."""
    if runtime == "qlinear":
        import qlinear
        import qlinear.backend as backend

        qlinear.set_num_threads(threads)
        rep = backend.prepare(model)
        return lambda: rep.run(feeds)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path if path is not None else model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)
