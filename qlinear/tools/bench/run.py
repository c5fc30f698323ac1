"""Running one case: qlinear (prepared and plain), onnxruntime and onnx.reference, timed.

qlinear, onnxruntime and the plain function are timed interleaved: a *round* runs each once,
so background load on a shared machine hits all of them alike; the reported time is the
median. The rounds alternate between (prepared, plain, onnxruntime) and (plain, prepared,
onnxruntime), so that the two qlinear calls each follow onnxruntime and each other equally
often: a call right after another qlinear call finds the thread pool's worker still spinning,
one after onnxruntime (whose workers block at once) has to wake it, 15-25 us on a 2-vCPU VM
(docs/benchmarks.md, "Interleaving order"). onnx.reference is far slower and runs on its own
afterwards, within a time budget.

A case whose rounds disagree is *noisy*: the interquartile range of the rounds'
qlinear/onnxruntime ratios above :data:`NOISY_SPREAD` of their median. Its ratio is reported
with that mark rather than as a measurement of the code.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from . import memory
from .cases import Built, Case

#: A case is noisy when the interquartile range of its rounds' qlinear/onnxruntime ratios is
#: above this fraction of their median (a quiet 2-vCPU VM stays within a few per cent on every
#: case above ~50 us).
NOISY_SPREAD = 0.10


def ort_session(model, threads: int, *, profile_prefix: str | None = None):
    """onnxruntime's session as the bench runs it: ``threads`` intra-op threads, one inter-op
    thread, sequential, spinning off; with ``profile_prefix``, its profiler on (per-kernel
    times, see inmodel.py)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # Measured here: with spinning worker threads, onnxruntime's idle spinning after each run
    # steals a core from the next (interleaved) measurement, and onnxruntime itself ran
    # slower too (1.55 vs 1.06 ms on a ResNet 3x3 layer). Without spinning both are faster.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def time_once(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def limit_threads(threads: int):
    """Limit BLAS (and OpenMP) threads; returns a controller or None."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads)


def round_noise(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """How much the rounds disagree: the interquartile range of the per-round ratios
    ``ours[i] / theirs[i]`` over their median, and whether that is above NOISY_SPREAD."""
    ratios = np.asarray(ours, np.float64) / np.maximum(np.asarray(theirs, np.float64), 1e-12)
    q25, q50, q75 = np.percentile(ratios, [25, 50, 75])
    spread = float((q75 - q25) / q50) if q50 > 0 else float("inf")
    return {"rounds": int(ratios.size), "ratio_spread": spread,
            "noisy": bool(spread > NOISY_SPREAD)}


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """How many elements differ (NaN equals NaN) and by how much at most."""
    theirs = np.asarray(theirs)
    if ours.shape != theirs.shape:
        return {"differ": None, "max_abs_diff": None,
                "note": f"shape {theirs.shape} != {ours.shape}"}
    if ours.dtype.kind == "f":
        diff = ~((ours == theirs) | (np.isnan(ours) & np.isnan(theirs)))
    else:
        diff = ours != theirs
    n = int(np.count_nonzero(diff))
    mad = 0
    if n:
        mad = float(np.max(np.abs(ours[diff].astype(np.float64)
                                  - theirs[diff].astype(np.float64))))
    return {"differ": n, "max_abs_diff": mad, "size": int(ours.size)}


def run_reference(case: Case, built: Built, ours: np.ndarray, repeat: int, budget: float,
                  rate: dict[str, float]) -> dict[str, Any]:
    """Time onnx.reference unless one run is estimated (from earlier cases' seconds per MAC
    of the same operator) to exceed ``budget``; fewer than ``repeat`` runs where they would
    take more than 3 budgets (the report says so)."""
    from onnx.reference import ReferenceEvaluator

    if case.op in rate:
        est = rate[case.op] * max(case.macs, 1)
        if est > budget:
            return {"status": "skipped", "estimate_s": est,
                    "note": f"one run estimated at {est:.0f} s > budget {budget:g} s"}
    try:
        ev = ReferenceEvaluator(built.model)
        t0 = time.perf_counter()
        out_ref = ev.run(None, built.feeds)[0]
        times = [time.perf_counter() - t0]
    except Exception as e:  # noqa: BLE001 - its limits are part of the report
        return {"status": "failed", "note": f"{type(e).__name__}: {str(e)[:100]}"}
    want = repeat if times[0] * repeat <= 3 * budget else max(1, int(3 * budget / times[0]))
    while len(times) < want:
        times.append(time_once(lambda: ev.run(None, built.feeds)))
    median = float(np.median(times))
    rate[case.op] = max(rate.get(case.op, 0.0), median / max(case.macs, 1))
    return {"status": "ok", "runs": len(times), "time_s": median,
            "vs_qlinear": compare(ours, out_ref)}


def run_count(repeat: int, warm_s: float) -> int:
    """Timed rounds: at least ``repeat``; fast cases get more (up to 200, about 1 s per
    engine) so that their medians are as stable as the slow ones'."""
    return max(repeat, min(200, int(1.0 / max(warm_s, 1e-6))))


def run_case(case: Case, *, repeat: int, threads: int, reference: bool,
             reference_budget: float, reference_rate: dict[str, float],
             seed: int) -> dict[str, Any]:
    """Build ``case`` with ``seed``, time its engines interleaved, measure the prepared call's
    peak extra memory, compare the outputs; the case's record for the report."""
    rng = np.random.default_rng(seed)
    built = case.build(rng)
    t0 = time.perf_counter()
    qfn = built.prepare()
    prepare_s = time.perf_counter() - t0
    sess = ort_session(built.model, threads)

    def ort_fn():
        return sess.run(None, built.feeds)[0]  # noqa: F821 (the cell is emptied below, after the last call)

    engines = {"qlinear": qfn, "qlinear_plain": built.plain, "onnxruntime": ort_fn}
    # Warm-up (one call each) and the outputs compared below.
    outputs = {}
    warm = {}
    for name, fn in engines.items():
        t0 = time.perf_counter()
        outputs[name] = fn()
        warm[name] = time.perf_counter() - t0
    n_runs = run_count(repeat, max(warm.values()))
    times: dict[str, list[float]] = {name: [] for name in engines}
    # see the module docstring: prepared and plain swap places every other round, so each
    # follows onnxruntime and the other qlinear call equally often
    orders = (["qlinear", "qlinear_plain", "onnxruntime"],
              ["qlinear_plain", "qlinear", "onnxruntime"])
    for r in range(n_runs):
        for name in orders[r % 2]:
            times[name].append(time_once(engines[name]))
    result: dict[str, Any] = {
        "name": case.name, "group": case.group, "op": case.op, "shape": case.shape,
        "macs": case.macs, "runs": n_runs, "prepare_s": prepare_s,
        "batch8_resnet": case.batch8_resnet,
        "time_s": {name: float(np.median(ts)) for name, ts in times.items()},
        "time_min_s": {name: float(np.min(ts)) for name, ts in times.items()},
        "noise": round_noise(times["qlinear"], times["onnxruntime"]),
    }
    result["peak_extra_bytes"], result["peak_extra_how"] = memory.peak_extra_memory(qfn)
    result["output_bytes"] = int(outputs["qlinear"].nbytes)
    result["vs_onnxruntime"] = compare(outputs["qlinear"], outputs["onnxruntime"])
    plain_cmp = compare(outputs["qlinear"], outputs["qlinear_plain"])
    if plain_cmp["differ"]:
        raise AssertionError(f"{case.name}: prepared and plain qlinear disagree: {plain_cmp}")
    # onnxruntime's session (and its prepacked weights) freed before onnx.reference runs:
    # ort_fn's closure cell is emptied, and ort_fn is not called again
    del sess

    ref: dict[str, Any] = {"status": "not run"}
    if reference:
        ref = run_reference(case, built, outputs["qlinear"], repeat, reference_budget,
                            reference_rate)
    result["reference"] = ref
    tq, to = result["time_s"]["qlinear"], result["time_s"]["onnxruntime"]
    result["qlinear_over_onnxruntime"] = tq / to
    result["reference_over_qlinear"] = ref["time_s"] / tq if ref.get("status") == "ok" else None
    result["gmacs_qlinear"] = case.macs / tq / 1e9 if case.macs else None
    result["gmacs_onnxruntime"] = case.macs / to / 1e9 if case.macs else None
    result["plain_over_onnxruntime"] = result["time_s"]["qlinear_plain"] / to
    return result


def percent_of_peak(results: list[dict[str, Any]], peak: float | None) -> None:
    """Set each result's ``pct_peak_*`` from ``peak`` (GMAC/s), or None where there is no
    usable peak (not measured, or refused as implausible: machine.check_peak)."""
    for r in results:
        for engine in ("qlinear", "onnxruntime"):
            g = r.get(f"gmacs_{engine}")
            r[f"pct_peak_{engine}"] = 100 * g / peak if peak and g else None
