"""The machine a run measures: its description and its int8 peak, checked for plausibility.

The peak is what the cases' *% of peak* columns divide by, so a wrong one makes every one of
them wrong (a run once measured 259 GMAC/s on a CPU whose peak is ~453). :func:`measure_peak`
therefore repeats each measurement until its two best trials agree, the bench measures it
again after the cases and keeps the maximum (:func:`combine_peaks`), and :func:`check_peak`
refuses a peak that this CPU's instruction throughput and clock, or its thread count, make
implausible; the report then prints no *% of peak* and says why.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
import time
from typing import Any

import numpy as np

import qlinear
from qlinear import _native


def machine_description(threads: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "logical_cpus": os.cpu_count(),
        "threads_per_engine": threads,
    }
    try:
        info["qlinear_engine"] = _native.engine_info()
    except Exception as e:  # noqa: BLE001 - the report says why
        info["qlinear_engine"] = {"error": str(e)}
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = set()
        for line in cpuinfo.splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
        info["simd"] = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni",
                                    "avx_vnni", "amx_int8") if f in flags]
    except OSError:
        info["cpu"] = platform.processor()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["memory_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    for mod in ("onnx", "onnxruntime", "threadpoolctl"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    try:
        import threadpoolctl

        info["blas"] = [{k: p.get(k) for k in ("internal_api", "version", "architecture",
                                                "num_threads", "threading_layer")}
                        for p in threadpoolctl.threadpool_info()]
    except ImportError:
        info["blas"] = os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        info["qlinear"] = getattr(qlinear, "__version__", None)
        here = os.path.dirname(os.path.abspath(qlinear.__file__))
        info["qlinear_commit"] = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True, timeout=10).stdout.strip() or None
        info["workspace_limit_bytes"] = int(qlinear.workspace_limit())
    except Exception:  # noqa: BLE001 - description only
        pass
    info["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return info


# ----------------------------------------------------------------------------------------
# The int8 peak and its plausibility
# ----------------------------------------------------------------------------------------

#: Two trials within this fraction of each other: the measurement has settled.
PEAK_STABLE = 0.02
#: The peak's rounds (before and after the cases) further apart than this: the host's speed
#: changed during the run (reported as noise).
PEAK_ROUNDS_SPREAD = 0.10

#: Multiply-adds one core retires per cycle with each peak kernel's instruction, (lowest,
#: highest) over the CPUs that run the level: the plausibility bounds of check_peak.
#: vpmaddwd ymm is 16 multiply-adds, 0.5 (Zen 1's 128-bit halves) to 2 per cycle; vpmaddubsw
#: and vpdpbusd ymm are 32, 0.5 to 2 per cycle; vpdpbusd zmm is 64, 0.5 (Zen 4 runs 512-bit
#: operations as two halves) to 2 (two 512-bit ports); tdpbusd is 16x16x64 = 16384, at best
#: one per 16 cycles.
MACS_PER_CYCLE: dict[tuple[str, str], tuple[float, float]] = {
    ("avx2", "i16"): (8, 32),
    ("avx2", "u8s8"): (16, 64),
    ("avxvnni", "u8s8"): (16, 64),
    ("avx512vnni", "u8s8"): (32, 128),
    ("amx", "u8s8"): (256, 1024),
    ("amx", "s8u8"): (256, 1024),
}
#: How far the clock may run above the one the system reports (turbo over a VM's nominal
#: clock) and below it (a busy host), for the bounds above.
CLOCK_ABOVE, CLOCK_BELOW = 2.0, 0.35


def cpu_facts() -> dict[str, Any]:
    """What check_peak needs to know of this CPU: its clock in GHz (the highest that
    /proc/cpuinfo or cpufreq reports; None where neither does), the CPUs this process may
    run on, and whether a core runs two hardware threads (None where unknown)."""
    clock = None
    smt = None
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        mhz = [float(line.split(":", 1)[1]) for line in text.splitlines()
               if line.startswith("cpu MHz")]
        clock = max(mhz) / 1e3 if mhz else None
        first = {}
        for line in text.splitlines():
            key = line.split(":", 1)[0].strip()
            if key in ("siblings", "cpu cores") and key not in first:
                first[key] = int(line.split(":", 1)[1])
        if len(first) == 2:  # hardware threads per package against cores per package
            smt = first["siblings"] != first["cpu cores"]
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            clock = max(clock or 0.0, int(f.read()) / 1e6)
    except (OSError, ValueError):
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return {"clock_ghz": clock, "cpus": cpus, "smt": smt}


def measure_peak(threads: int, seconds: float = 0.1, trials: int = 5, *, max_trials: int = 12,
                 roles: tuple[str, ...] = ("exact", "fast", "vpdpbusd")) -> dict[str, Any]:
    """The int8 multiply-add peak of this CPU as qlinear's own micro-kernels reach it.

    Each kernel of the selected ISA level (exact: vpmaddwd on AVX2, vpdpbusd on the VNNI
    levels, tdpbusd on AMX; fast: AVX2's vpmaddubsw, used where packing proves it cannot
    saturate) runs on operands that stay in L1, on 1 and on ``threads`` threads, in trials of
    about ``seconds`` each: at least ``trials`` of them, and more (up to ``max_trials``) until
    the best two agree within PEAK_STABLE; the best is the peak (memory and packing excluded:
    a ceiling). On the amx level the avx512vnni level's exact kernel is measured too (role
    ``vpdpbusd``): the VNNI ceiling, for comparison. ``roles`` limits the kernels measured.
    Cases report their GMAC/s as a percentage of the exact kernel's peak at ``threads``
    threads (``peak_gmacs``).
    """
    C = _native.native()
    if C is None:
        return {"isa": None, "note": "the native engine is not selected: no kernel peak"}
    isa = C.get_isa()
    out: dict[str, Any] = {"isa": isa, "kernels": {}}
    kernels = [(isa, 0, "exact"), (isa, 1, "fast")]
    if isa == "amx":
        kernels.append(("avx512vnni", 0, "vpdpbusd"))
    for level, which, role in kernels:
        info = C.kernel_info(level, which)
        if info is None or role not in roles:
            continue
        row: dict[str, Any] = {"kernel": info["name"], "isa": level, "form": info["form"]}
        for t in sorted({1, threads}):
            reps = 200
            C.kernel_peak(level, which, reps, 4 * t, t)  # warm-up (and the pool's threads)
            rates: list[float] = []
            while len(rates) < max(trials, max_trials):
                t0 = time.perf_counter()
                macs = C.kernel_peak(level, which, reps, 4 * t, t)
                dt = time.perf_counter() - t0
                rates.append(macs / dt / 1e9)
                # size the next trial to about `seconds`
                reps = max(1, int(reps * seconds / max(dt, 1e-6)))
                best2 = sorted(rates)[-2:]
                if len(rates) >= trials and best2[0] >= best2[-1] * (1 - PEAK_STABLE):
                    break
            row[f"gmacs_{t}t"] = max(rates)
            row[f"trials_{t}t"] = len(rates)
        out["kernels"][role] = row
    out["threads"] = threads
    out["peak_gmacs"] = out["kernels"]["exact"][f"gmacs_{threads}t"]
    out["rounds"] = [out["peak_gmacs"]]
    return out


def combine_peaks(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Several measurements of the peak (before and after the cases) as one: every rate the
    maximum over them, ``rounds`` the exact kernel's peak of each, and ``rounds_noisy`` when
    they are further apart than PEAK_ROUNDS_SPREAD (the host's speed changed)."""
    with_kernels = [m for m in measured if m.get("kernels")]
    if not with_kernels:
        return dict(measured[0])
    out = dict(with_kernels[0], kernels={})
    for m in with_kernels:
        for role, row in m["kernels"].items():
            have = out["kernels"].setdefault(role, dict(row))
            for k, v in row.items():
                if k.startswith("gmacs_"):
                    have[k] = max(have.get(k, 0.0), v)
    rounds = [g for m in with_kernels for g in m.get("rounds", [m.get("peak_gmacs")]) if g]
    out["rounds"] = rounds
    out["peak_gmacs"] = max(rounds) if rounds else None
    out["rounds_spread"] = (max(rounds) - min(rounds)) / max(rounds) if rounds else None
    out["rounds_noisy"] = bool(rounds and out["rounds_spread"] > PEAK_ROUNDS_SPREAD)
    return out


def check_peak(peak: dict[str, Any], facts: dict[str, Any]) -> str | None:
    """None if the measured peak is plausible on this CPU, else why not (one sentence).

    Two checks on the exact kernel. Its rate on ``threads`` threads must lie within what that
    many cores can retire with the kernel's instruction at this clock (MACS_PER_CYCLE, the
    clock from ``facts`` widened by CLOCK_ABOVE/CLOCK_BELOW): far outside it, the timer or the
    kernel's count is wrong. And it must grow with the threads as the cores allow: at least
    0.7 x threads x the one-thread rate without SMT, and not below 0.9 x the one-thread rate
    with SMT or an unknown topology: less means another process held a CPU while the peak was
    measured (what made one run report 259 GMAC/s on a CPU that reaches ~453).
    """
    row = (peak.get("kernels") or {}).get("exact")
    if not row:
        return None  # no peak measured: there is nothing to divide by anyway
    threads = int(peak.get("threads") or 1)
    used = min(threads, int(facts.get("cpus") or threads))
    g_t = row.get(f"gmacs_{threads}t")
    g_1 = row.get("gmacs_1t")
    if not g_t or g_t <= 0 or not math.isfinite(g_t):
        return f"the exact kernel's rate on {threads} threads was not measured ({g_t})"
    bounds = MACS_PER_CYCLE.get((row.get("isa"), row.get("form")))
    clock = facts.get("clock_ghz")
    if bounds and clock:
        lo = bounds[0] * clock * CLOCK_BELOW
        hi = bounds[1] * clock * CLOCK_ABOVE * used
        if not lo <= g_t <= hi:
            return (f"{g_t:.0f} GMAC/s on {threads} thread{'s' if threads > 1 else ''} is outside "
                    f"what {used} core{'s' if used > 1 else ''} can do with {row.get('kernel')} at "
                    f"{clock:.2f} GHz ({lo:.0f} to {hi:.0f} GMAC/s: {bounds[0]:g}-{bounds[1]:g} "
                    f"multiply-adds per cycle and core)")
    if g_1 and used > 1:
        need = 0.7 * used * g_1 if facts.get("smt") is False else 0.9 * g_1
        if g_t < need:
            return (f"{g_t:.0f} GMAC/s on {threads} threads is {g_t / g_1:.2f}x the one-thread "
                    f"{g_1:.0f} GMAC/s, below the {need / g_1:.2f}x that {used} "
                    f"{'cores' if facts.get('smt') is False else 'CPUs'} reach: another "
                    "process held a CPU while the peak was measured")
    return None
