"""``qlinear bench``: the command line (argparse) and the run (main).

Named ``command`` rather than ``main``: the package exposes the function ``main``, which a
submodule of that name would shadow (``import qlinear.tools.bench.main`` would then give the
function, not the module).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import qlinear

from ..files import OutputError, check_target, output_dir, write_file
from . import cases as _cases
from . import inmodel, machine, noamx, report, run
from .cases import MIB

#: The files bench writes into --output-dir (results.png only with matplotlib).
OUTPUT_FILES = ("results.json", "results.md", "machine.md", "results.png")


class BenchError(Exception):
    """A usage error: ``qlinear: error: <message>``, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, like the ``qlinear`` command's."""

    def error(self, message):  # noqa: D102
        raise BenchError(f"{message} (see 'qlinear bench --help')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="qlinear bench",
        description="Benchmark qlinear against onnxruntime and onnx.reference.")
    p.add_argument("--quick", action="store_true",
                   help="a representative subset of the cases (a couple of minutes)")
    p.add_argument("--cases", action="append", metavar="PATTERN",
                   help="only cases whose name matches (glob, or a substring); repeatable, "
                        "comma-separated lists allowed")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed runs per engine and case, at least (default 5)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads for every engine, 1 to 1024 (default 2)")
    p.add_argument("--output-dir", default="qlinear-bench-results",
                   help="where results.md/json/png and machine.md go")
    p.add_argument("--no-reference", action="store_true", help="do not run onnx.reference")
    p.add_argument("--reference-budget", type=float, default=8.0, metavar="SECONDS",
                   help="skip onnx.reference where one run is estimated above this "
                        "(default 8)")
    p.add_argument("--seed", type=int, default=0, help="random data seed, 0 or more (default 0)")
    p.add_argument("--no-amx", action="store_true",
                   help="run both runtimes as on a CPU without AMX (Linux x86-64): the process "
                        "is denied AMX before either detects the CPU, so both pick their "
                        "AVX-512 VNNI kernels, as on AMD Zen 4/5")
    p.add_argument("--in-model", action="store_true",
                   help="convolutions as models run them: qlinear against onnxruntime's "
                        "convolution kernel alone (its profiler's kernel time, without the "
                        "layout transposes of a one-node session), each runtime warm and back "
                        "to back; only the convolution cases of the selection run")
    p.add_argument("--json", action="store_true",
                   help="print the results (machine, summary, every case) as JSON on stdout "
                        "instead of the summary; the files are written as well")
    return p


def main(argv: list[str] | None = None) -> int:
    """``qlinear bench``: errors are one line ``qlinear: error: ...`` with exit status 2."""
    try:
        return _main(argv)
    except BenchError as e:
        print(f"qlinear: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    patterns = None
    if args.cases:
        patterns = [p.strip() for item in args.cases for p in item.split(",") if p.strip()]
    cases = _cases.select_cases(_cases.all_cases(), patterns, args.quick)
    if not cases:  # with --list too: an empty list would look like success
        raise BenchError("no case matches " + ", ".join(map(repr, patterns or []))
                         + (" in the --quick subset" if args.quick else "")
                         + " ('qlinear bench --list' lists the cases)")
    if args.in_model:
        convs = [c for c in cases if c.group == "conv"]
        if not convs:
            raise BenchError("--in-model times convolutions; no convolution case matches "
                             + (", ".join(map(repr, patterns or [])) or "the selection"))
        cases = convs
    if args.list:
        for c in cases:
            print(f"{c.name:40s} {c.op:15s} {c.shape}")
        return 0
    if args.repeat < 1:
        raise BenchError(f"--repeat must be at least 1; got {args.repeat}")
    if not 1 <= args.threads <= 1024:  # qlinear.set_num_threads' range
        raise BenchError(f"--threads must be in [1, 1024]; got {args.threads}")
    if not args.reference_budget > 0:
        raise BenchError("--reference-budget must be a positive number of seconds")
    if args.seed < 0:  # NumPy's seeds are non-negative (as run's and compare's --seed)
        raise BenchError(f"--seed {args.seed}: must be 0 or more")
    if args.no_amx and os.environ.get(noamx.ENV_MARK) != "1":
        # The denial must precede both runtimes' CPU detection (qlinear's at import, which has
        # happened in this process) and cannot be undone: run the bench in a child process.
        why = noamx.supported()
        if why:
            raise BenchError(f"--no-amx {why}")
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.call(noamx.child_command("qlinear.tools.bench", argv))
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise BenchError(f"qlinear bench needs onnx and onnxruntime ({e}); "
                         "pip install 'qlinear[bench]'") from None

    try:  # before the long run, so that a bad folder or a link in the way fails at once
        args.output_dir = output_dir(args.output_dir, "--output-dir", parents=True)
        for name in OUTPUT_FILES:  # a folder or link of that name in the way
            check_target("--output-dir", args.output_dir, os.path.join(args.output_dir, name))
    except OutputError as e:
        raise BenchError(str(e)) from None
    try:  # a read-only folder: a temporary file created and removed, no empty file left
        tempfile.TemporaryFile(dir=args.output_dir).close()
    except OSError as e:
        raise BenchError(f"--output-dir {args.output_dir}: cannot write "
                         f"{os.path.join(args.output_dir, OUTPUT_FILES[0])} "
                         f"({e.strerror or e})") from None
    limiter = run.limit_threads(args.threads)
    if limiter is None and os.environ.get("OPENBLAS_NUM_THREADS") != str(args.threads):
        # Without threadpoolctl, OpenBLAS reads its thread count once, when NumPy loads:
        # rerun in a child process with the variable set.
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
                   OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.call([sys.executable, "-m", "qlinear.tools.bench", *argv], env=env)
    qlinear.set_num_threads(args.threads)

    desc = machine.machine_description(args.threads)
    if args.no_amx:  # this is the child: say so, and check that the denial holds
        if not noamx.amx_request_denied():
            raise BenchError("--no-amx: the AMX permission request was not denied")
        desc["amx"] = "denied to both runtimes (--no-amx)"
    facts = desc["cpu_facts"] = machine.cpu_facts()
    # the peak before the cases: measured again (the maximum kept) while it is implausible
    peak = machine.measure_peak(args.threads)
    for _ in range(2):
        if not machine.check_peak(peak, facts):
            break
        peak = machine.combine_peaks([peak, machine.measure_peak(args.threads)])
    results: list[dict[str, Any]] = []
    reference_rate: dict[str, float] = {}
    start = time.perf_counter()
    print(f"qlinear bench{' --in-model' if args.in_model else ''}: {len(cases)} cases, "
          f"{args.threads} threads, repeat {args.repeat}", file=sys.stderr)
    for i, case in enumerate(cases, 1):
        if args.in_model:
            r = inmodel.run_case_in_model(case, repeat=args.repeat, threads=args.threads,
                                          seed=args.seed + i)
            tail = (f"ort kernel {report._fmt_t(r['time_s']['onnxruntime_kernel']):>9s}  "
                    f"session {report._fmt_t(r['time_s']['onnxruntime_session']):>9s}  ql/kernel "
                    f"{r['qlinear_over_onnxruntime']:5.2f}")
        else:
            r = run.run_case(case, repeat=args.repeat, threads=args.threads,
                             reference=not args.no_reference,
                             reference_budget=args.reference_budget,
                             reference_rate=reference_rate, seed=args.seed + i)
            ref = r["reference"]
            ref_s = (report._fmt_t(ref["time_s"]) if ref["status"] == "ok" else ref["status"])
            tail = (f"ort {report._fmt_t(r['time_s']['onnxruntime']):>9s}  ql/ort "
                    f"{r['qlinear_over_onnxruntime']:5.2f}  ref {ref_s:>9s}  peak "
                    f"{r['peak_extra_bytes'] / MIB:7.1f} MiB")
        results.append(r)
        print(f"[{i:3d}/{len(cases)}] {case.name:36s} qlinear "
              f"{report._fmt_t(r['time_s']['qlinear']):>9s}  {tail}  ort differs "
              f"{r['vs_onnxruntime']['differ']}"
              + ("  noisy" if r["noise"]["noisy"] else ""), file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    # the peak again after the cases (the exact kernel only): the maximum of the two is used,
    # and a host whose speed changed between them shows as a noisy run
    peak = machine.combine_peaks([peak, machine.measure_peak(args.threads, roles=("exact",))])
    peak["implausible"] = machine.check_peak(peak, facts)
    desc["int8_peak"] = peak
    run.percent_of_peak(results, None if peak["implausible"] else peak.get("peak_gmacs"))
    desc["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    desc["elapsed_s"] = round(elapsed, 1)
    if args.in_model:
        summary = report.summarize_in_model(results)
        text = report.in_model_markdown(results, summary, desc, args)
    else:
        summary = report.summarize(results, desc.get("workspace_limit_bytes", 256 * MIB))
        text = report.markdown_report(results, summary, desc, args)
    texts = {"results.json": json.dumps({"machine": desc, "summary": summary,
                                         "args": vars(args), "results": results}, indent=1),
             "results.md": text, "machine.md": report.machine_markdown(desc)}
    try:  # checked before the run; a full disk or a link planted since still fails here
        for name, content in texts.items():
            write_file("--output-dir", args.output_dir, os.path.join(args.output_dir, name),
                       lambda f, content=content: f.write(content.encode()))
    except OutputError as e:
        raise BenchError(str(e)) from None
    why_no_chart = ("not drawn with --in-model (results.md has the table)" if args.in_model
                    else report.chart(results, os.path.join(args.output_dir, "results.png")))
    if args.json:
        print(json.dumps({"machine": desc, "summary": summary, "results": results},
                         indent=1, default=str))
    else:
        print(text.split("## Cases")[0], file=sys.stdout)
    files = "results.md, results.json, " + ("" if why_no_chart else "results.png, ") + "machine.md"
    print(f"wrote {args.output_dir}/{files} ({elapsed:.0f} s)"
          + (f"; results.png not written: {why_no_chart}" if why_no_chart else ""),
          file=sys.stderr)
    if limiter is not None:
        limiter.restore_original_limits()
    return 0
