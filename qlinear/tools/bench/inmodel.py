"""``--in-model``: convolutions against onnxruntime's kernel as a model runs it.

A one-node onnxruntime session pays for more than its convolution: on x86 its layout pass
rewrites QLinearConv to the NHWC kernel and wraps it in two Transpose nodes (NCHW to NHWC and
back), 32-170 us per ResNet-50 layer, which a whole model pays once rather than per layer.
The default bench times that session, which flatters qlinear. This mode times onnxruntime's
convolution kernel alone, from its profiler (``SessionOptions.enable_profiling``: the
``<node>_kernel_time`` event of the QLinearConv or ConvInteger node, whose duration excludes
the Transposes and the session's own overhead), against qlinear's whole prepared call.

Why the profiler rather than a chain of the same layer in one session (where the transposes
would amortize): a layer can follow itself only when its input and output have the same
channels and size, which 6 of ResNet-50's 23 layers do; the profiler measures every layer as
it is, and names the Transposes' cost next to it.

Each runtime runs as in a model, warm and back to back, with its own defaults (onnxruntime's
workers spin between runs as they do between a model's nodes): blocks of runs alternate
qlinear, onnxruntime, onnxruntime, qlinear, ... (ABBA, so a drift of the host touches both
alike), with a pause between blocks for the other runtime's spinning workers to park. A
*round* is a pair of blocks; the rounds' ratios give the noise mark, as in the default mode.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from . import run
from .cases import Case

#: Blocks of back-to-back runs per runtime, in ABBA order; a qlinear block and the
#: onnxruntime block beside it are a round.
BLOCKS = 4
#: Seconds between blocks: onnxruntime's workers spin after a run before they sleep, and
#: would take a core from qlinear's next block.
PAUSE_S = 0.05


def _ort_profiled_session(model, threads: int, prefix: str):
    """onnxruntime with its defaults (graph optimizations, spinning workers) but ``threads``
    intra-op threads and its profiler on."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = prefix
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def kernel_times(events: list[dict[str, Any]], op: str) -> tuple[list[float], list[float]]:
    """Per run of the profiled session, in order: seconds in the ``op`` node's kernel (by
    that name, or ``Nhwc`` + it, as some onnxruntime versions name the rewritten node), and
    seconds in every other node's kernel (the layout Transposes). A run ends at its
    ``model_run`` event, which the profiler writes after the run's node events."""
    ours, others = [], []
    k = o = 0.0
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            if e.get("args", {}).get("op_name") in (op, "Nhwc" + op):
                k += e["dur"] * 1e-6
            else:
                o += e["dur"] * 1e-6
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            ours.append(k)
            others.append(o)
            k = o = 0.0
    return ours, others


def run_case_in_model(case: Case, *, repeat: int, threads: int, seed: int) -> dict[str, Any]:
    """Time ``case`` (a convolution) as a model runs it: qlinear's prepared call against
    onnxruntime's kernel time (module docstring)."""
    rng = np.random.default_rng(seed)
    built = case.build(rng)
    qfn = built.prepare()
    folder = tempfile.mkdtemp(prefix="qlinear-bench-profile-")
    try:
        sess = _ort_profiled_session(built.model, threads, os.path.join(folder, "ort"))

        def ort_fn():
            return sess.run(None, built.feeds)[0]

        ours = qfn()
        t0 = time.perf_counter()
        theirs = ort_fn()
        warm = time.perf_counter() - t0
        per_block = max(2, -(-run.run_count(repeat, max(warm, run.time_once(qfn))) // BLOCKS))
        # which of onnxruntime's runs are timed: the first of each block warms it up again
        timed_ort: list[int] = []
        n_ort = 1  # the warm-up above
        blocks: dict[str, list[list[float]]] = {"qlinear": [], "onnxruntime": []}
        for b in range(BLOCKS):
            for name in (("qlinear", "onnxruntime") if b % 2 == 0 else ("onnxruntime", "qlinear")):
                fn = qfn if name == "qlinear" else ort_fn
                time.sleep(PAUSE_S)
                fn()
                if name == "onnxruntime":
                    n_ort += 1
                block = []
                for _ in range(per_block):
                    block.append(run.time_once(fn))
                    if name == "onnxruntime":
                        timed_ort.append(n_ort)
                        n_ort += 1
                blocks[name].append(block)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    kern, other = kernel_times(events, case.op)
    if len(kern) != n_ort:
        raise RuntimeError(f"{case.name}: onnxruntime's profile holds {len(kern)} runs, "
                           f"expected {n_ort}")
    kern_t = [kern[i] for i in timed_ort]
    if not all(kern_t):
        raise RuntimeError(f"{case.name}: onnxruntime's profile has no {case.op} kernel time in "
                           "some runs (its node was rewritten to another operator)")
    other_t = [other[i] for i in timed_ort]
    # the rounds' ratios: each qlinear block against the onnxruntime block beside it
    q_blocks = [float(np.median(b)) for b in blocks["qlinear"]]
    k_blocks = [float(np.median(kern_t[i * per_block:(i + 1) * per_block]))
                for i in range(len(blocks["onnxruntime"]))]
    q_all = [t for b in blocks["qlinear"] for t in b]
    s_all = [t for b in blocks["onnxruntime"] for t in b]
    tq, tk = float(np.median(q_all)), float(np.median(kern_t))
    ts = float(np.median(s_all))
    return {
        "name": case.name, "group": case.group, "op": case.op, "shape": case.shape,
        "macs": case.macs, "runs": len(q_all),
        "time_s": {"qlinear": tq, "onnxruntime_kernel": tk, "onnxruntime_session": ts,
                   "onnxruntime_other_nodes": float(np.median(other_t))},
        "qlinear_over_onnxruntime": tq / tk,
        "session_over_kernel": ts / tk,
        "gmacs_qlinear": case.macs / tq / 1e9 if case.macs else None,
        "gmacs_onnxruntime": case.macs / tk / 1e9 if case.macs else None,
        "noise": run.round_noise(q_blocks, k_blocks),
        "vs_onnxruntime": run.compare(ours, theirs),
    }
