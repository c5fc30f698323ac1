"""The run's report: summary, results.md's table, machine.md, the chart.

Two honesty rules beyond the numbers: a case whose rounds disagree (run.round_noise) carries
a *noisy* mark in the table and is counted in the summary, and *% of peak* is printed only
from a peak that machine.check_peak found plausible; otherwise the summary says why not.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import numpy as np

from ..files import write_file
from .cases import MIB
from .run import NOISY_SPREAD


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(results: list[dict[str, Any]], workspace: int) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for group in ("conv", "matmul", "quant"):
        rs = [r for r in results if r["group"] == group]
        if not rs:
            continue
        ratios = [r["qlinear_over_onnxruntime"] for r in rs]
        worst = max(rs, key=lambda r: r["qlinear_over_onnxruntime"])
        s[group] = {"cases": len(rs), "geomean_qlinear_over_onnxruntime": _geomean(ratios),
                    "worst": worst["name"], "worst_ratio": worst["qlinear_over_onnxruntime"],
                    "cases_above_3": sum(x > 3 for x in ratios)}
    refs = [r["reference_over_qlinear"] for r in results if r["reference_over_qlinear"]]
    refs_ops = [r["reference_over_qlinear"] for r in results
                if r["reference_over_qlinear"] and r["group"] != "quant"]
    s["reference"] = {"cases": len(refs), "geomean_reference_over_qlinear": _geomean(refs),
                      "min": min(refs) if refs else None,
                      "operator_cases": len(refs_ops),
                      "geomean_operator_cases": _geomean(refs_ops),
                      "failed": [r["name"] for r in results
                                 if r["reference"].get("status") == "failed"],
                      "skipped": [r["name"] for r in results
                                  if r["reference"].get("status") == "skipped"]}
    b8 = [r for r in results if r["batch8_resnet"]]
    if b8:
        worst = max(b8, key=lambda r: r["peak_extra_bytes"])
        s["memory"] = {"workspace_limit_bytes": workspace, "batch8_resnet_cases": len(b8),
                       "max_peak_extra_bytes": worst["peak_extra_bytes"], "worst": worst["name"],
                       "within_limit": worst["peak_extra_bytes"] <= workspace}
    s["differ_onnxruntime_cases"] = sum(1 for r in results if r["vs_onnxruntime"]["differ"])
    products = [r for r in results if r["group"] != "quant" and not r["name"].startswith("tiny.")]
    if products:
        worst = max(products, key=lambda r: r["plain_over_onnxruntime"])
        s["plain"] = {"cases": len(products),
                      "geomean_plain_over_onnxruntime":
                          _geomean([r["plain_over_onnxruntime"] for r in products]),
                      "worst": worst["name"], "worst_ratio": worst["plain_over_onnxruntime"],
                      "cases_above_1_3": sum(r["plain_over_onnxruntime"] > 1.3 for r in products)}
    s["all"] = {"cases": len(results),
                "geomean_qlinear_over_onnxruntime":
                    _geomean([r["qlinear_over_onnxruntime"] for r in results]),
                "cases_above_1_5": [r["name"] for r in results
                                    if r["qlinear_over_onnxruntime"] > 1.5]}
    s["tiny"] = {r["name"]: r["time_s"]["qlinear"] for r in results
                 if r["name"].startswith("tiny.")}
    s["noise"] = noise_summary(results)
    return s


def noise_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The noisy cases (run.round_noise) and the threshold they passed."""
    return {"threshold": NOISY_SPREAD,
            "noisy": [r["name"] for r in results if (r.get("noise") or {}).get("noisy")]}


def _noise_line(noise: dict[str, Any], cases: int) -> str:
    n = noise["noisy"]
    return (f"- Noisy cases (the middle half of their rounds' qlinear/onnxruntime ratios spread "
            f"over more than {noise['threshold']:.0%} of the median; their ratios say as much "
            f"about the host as about the code): {len(n)} of {cases}"
            + (f" ({', '.join(n[:8])}{', ...' if len(n) > 8 else ''})" if n else "") + ".")


def _noise_cell(r: dict[str, Any]) -> str:
    nz = r.get("noise")
    if not nz:
        return "-"
    return f"{nz['ratio_spread']:.0%}" + (" **noisy**" if nz["noisy"] else "")


def peak_lines(pk: dict[str, Any]) -> list[str]:
    """The summary's lines on the CPU's int8 peak: its rates, its rounds, and whether the
    *% peak* columns use it (machine.check_peak) or why not."""
    if not pk.get("kernels"):
        return []
    parts = []
    for role, row in pk["kernels"].items():
        rates = ", ".join(f"{row[k]:.0f} GMAC/s on {k[6:-1]} thread{'s' if k != 'gmacs_1t' else ''}"
                          for k in row if k.startswith("gmacs_"))
        parts.append(f"{role} kernel {row['kernel']}: {rates}")
    rounds = pk.get("rounds") or []
    line = (f"- int8 peak of this CPU, measured by qlinear's micro-kernels on L1-resident "
            f"operands ({pk['isa']}): " + "; ".join(parts) + "; the best of "
            + (f"{len(rounds)} measurements ({', '.join(f'{g:.0f}' for g in rounds)} GMAC/s on "
               f"{pk.get('threads')} threads, before and after the cases)" if len(rounds) > 1
               else "one measurement") + ".")
    if pk.get("implausible"):
        line += (" **No *% peak* is shown: this peak is implausible**: "
                 f"{pk['implausible']}.")
    else:
        line += (f" *% peak* columns are relative to the exact kernel's {pk['peak_gmacs']:.0f} "
                 "GMAC/s.")
    out = [line]
    if pk.get("rounds_noisy"):
        out.append(f"- **Noisy run**: the peak moved by {pk['rounds_spread']:.0%} between its "
                   "measurements before and after the cases: the host's speed changed during "
                   "the run, and the cases measured in the slower spell read slower.")
    return out


def _fmt_t(t: float | None) -> str:
    if t is None:
        return "-"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.0f} µs"


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown_report(results: list[dict[str, Any]], summary: dict[str, Any],
                    machine: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["# qlinear benchmark results", ""]
    lines.append(f"Measured {machine.get('date_utc')} UTC on {machine.get('cpu')} "
                 f"({machine.get('logical_cpus')} logical CPUs, "
                 f"{', '.join(machine.get('simd', []))}), {machine.get('threads_per_engine')} "
                 f"threads per engine; {_qlinear_version_text(machine)}, numpy "
                 f"{machine.get('numpy')}, onnxruntime {machine.get('onnxruntime')}, onnx "
                 f"{machine.get('onnx')}"
                 + ("; AMX denied to both runtimes (--no-amx): their AVX-512 VNNI kernels"
                    if machine.get("amx") else "")
                 + f". Median of at least {args.repeat} interleaved runs "
                 "(more for fast cases). Load average (1 min) "
                 f"{_fmt((machine.get('load_average') or [None])[0], '.1f')} at the start, "
                 f"{_fmt((machine.get('load_average_end') or [None])[0], '.1f')} at the end "
                 "(ratios of a shared machine's runs are reliable only at low load). "
                 "See machine.md.")
    lines += ["", "## Summary", ""]
    for group, label in (("conv", "Convolutions (QLinearConv, ConvInteger)"),
                         ("matmul", "Matrix products (QLinearMatMul, MatMulInteger)"),
                         ("quant", "QuantizeLinear / DequantizeLinear")):
        g = summary.get(group)
        if g:
            lines.append(f"- {label}: {g['cases']} cases, geometric mean of qlinear/onnxruntime "
                         f"time **{g['geomean_qlinear_over_onnxruntime']:.2f}**, worst "
                         f"{g['worst_ratio']:.2f} ({g['worst']}), {g['cases_above_3']} above 3.")
    ref = summary["reference"]
    if ref["cases"]:
        ops = ref["geomean_operator_cases"]
        lines.append("- onnx.reference/qlinear time: geometric mean "
                     + (f"**{ops:.0f}** over the {ref['operator_cases']} convolution and "
                        f"matrix-product cases it ran, " if ops else "")
                     + f"{ref['geomean_reference_over_qlinear']:.0f} over all "
                     f"{ref['cases']} cases it ran (lowest {ref['min']:.1f}); skipped over the "
                     f"time budget: {len(ref['skipped'])}; failed (unsupported): "
                     f"{len(ref['failed'])}.")
    mem = summary.get("memory")
    if mem:
        lines.append(f"- Peak extra memory on the batch-8 ResNet-50 layers: at most "
                     f"{mem['max_peak_extra_bytes'] / MIB:.1f} MiB ({mem['worst']}), workspace "
                     f"limit {mem['workspace_limit_bytes'] / MIB:.0f} MiB: "
                     f"{'within' if mem['within_limit'] else 'ABOVE'} the limit.")
    lines += peak_lines(machine.get("int8_peak") or {})
    lines.append(_noise_line(summary["noise"], len(results)))
    al = summary.get("all")
    if al:
        lines.append(f"- All {al['cases']} cases: geometric mean of qlinear/onnxruntime time "
                     f"**{al['geomean_qlinear_over_onnxruntime']:.2f}**; above 1.5: "
                     f"{len(al['cases_above_1_5'])}"
                     + (f" ({', '.join(al['cases_above_1_5'][:8])}"
                        + (", ..." if len(al['cases_above_1_5']) > 8 else "") + ")"
                        if al['cases_above_1_5'] else "")
                     + ".")
    pl = summary.get("plain")
    if pl:
        lines.append(f"- Plain calls (weights passed every call, no prepare) against "
                     f"onnxruntime's prepacked session, {pl['cases']} convolution and matrix "
                     f"cases: geometric mean **{pl['geomean_plain_over_onnxruntime']:.2f}**, "
                     f"worst {pl['worst_ratio']:.2f} ({pl['worst']}), "
                     f"{pl['cases_above_1_3']} above 1.3.")
    for name, t in (summary.get("tiny") or {}).items():
        lines.append(f"- {name}: one prepared call {_fmt_t(t)}.")
    lines.append(f"- Cases where onnxruntime's output differs from qlinear's (exact by "
                 f"construction): {summary['differ_onnxruntime_cases']} of {len(results)}.")
    lines += ["", "## Cases", "",
              "Times are medians. *ql/ort* is qlinear time over onnxruntime time (lower is "
              "better for qlinear); *spread* is the interquartile range of the rounds' ql/ort "
              "ratios over their median (a round runs each engine once), **noisy** above "
              f"{NOISY_SPREAD:.0%}; *ref/ql* is onnx.reference time over qlinear time. "
              "*plain* is the unprepared function (prepares the weights on every call); "
              "*plain/ort* its time over onnxruntime's (prepacked) time. *% peak* is GMAC/s "
              "over the exact kernel's measured peak (onnxruntime's AVX2 u8xs8 kernel "
              "saturates and can pass it; '-' where the peak was implausible, see the "
              "summary). "
              "*peak MiB* is the extra memory of one qlinear call, output included (resident "
              "set high-water mark on Linux). *ort "
              "differs* counts output elements where onnxruntime differs from qlinear "
              "(max difference in brackets).", "",
              "| case | op | shapes | qlinear | plain | onnxruntime | onnx.reference | ql/ort "
              "| spread | plain/ort | ref/ql | GMAC/s ql | GMAC/s ort | % peak ql | % peak ort "
              "| peak MiB | ort differs |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["time_s"]
        ref_r = r["reference"]
        if ref_r["status"] == "ok":
            ref_s = _fmt_t(ref_r["time_s"]) + ("" if ref_r["runs"] >= args.repeat
                                               else f" ({ref_r['runs']} run"
                                               f"{'s' if ref_r['runs'] > 1 else ''})")
        elif ref_r["status"] == "skipped":
            ref_s = f"skipped (est. {ref_r['estimate_s']:.0f} s)"
        elif ref_r["status"] == "failed":
            ref_s = "fails: " + ref_r["note"].split(":")[0]
        else:
            ref_s = "not run"
        d = r["vs_onnxruntime"]
        if d["differ"] is None:
            diff_s = d.get("note", "?")
        elif d["differ"]:
            diff_s = f"{d['differ']} / {d['size']} ({d['max_abs_diff']:g})"
        else:
            diff_s = "0"
        lines.append(
            f"| {r['name']} | {r['op']} | {r['shape']} | {_fmt_t(t['qlinear'])} | "
            f"{_fmt_t(t['qlinear_plain'])} | {_fmt_t(t['onnxruntime'])} | {ref_s} | "
            f"{r['qlinear_over_onnxruntime']:.2f} | {_noise_cell(r)} | "
            f"{r['plain_over_onnxruntime']:.2f} | "
            f"{_fmt(r['reference_over_qlinear'], '.0f')} | "
            f"{_fmt(r['gmacs_qlinear'], '.1f')} | {_fmt(r['gmacs_onnxruntime'], '.1f')} | "
            f"{_fmt(r['pct_peak_qlinear'], '.0f')} | {_fmt(r['pct_peak_onnxruntime'], '.0f')} | "
            f"{r['peak_extra_bytes'] / MIB:.1f} | {diff_s} |")
    lines.append("")
    return "\n".join(lines)


def _qlinear_version_text(machine: dict[str, Any]) -> str:
    """'qlinear 0.1.0 (commit abc1234)', without a commit outside a git checkout; never
    'qlinear None'."""
    version = machine.get("qlinear") or "(version unknown)"
    commit = machine.get("qlinear_commit")
    return f"qlinear {version}" + (f" (commit {commit})" if commit else "")


def machine_markdown(machine: dict[str, Any]) -> str:
    lines = ["# Machine of the latest benchmark run", ""]
    for k, v in machine.items():
        lines.append(f"- **{k}**: {v}")
    lines.append("")
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], path: str) -> str | None:
    """Draw the chart to ``path``; None when written, else why not (one line)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed (pip install 'qlinear[bench]')"
    if not results:
        return "no results to draw"
    try:  # written as every output is (qlinear.tools.files): never through a link
        write_file("--output-dir", os.path.dirname(path) or ".", path,
                   lambda f: _draw_chart(results, f, plt, matplotlib))
    except Exception as e:  # noqa: BLE001 - the chart is optional; say why it is missing
        return f"drawing it failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return None


def _draw_chart(results, path, plt, matplotlib) -> None:
    names = [r["name"] for r in results]
    ratios = [r["qlinear_over_onnxruntime"] for r in results]
    refs = [r["reference_over_qlinear"] or 0 for r in results]
    colors = {"conv": "tab:blue", "matmul": "tab:orange", "quant": "tab:green"}
    height = max(4.0, 0.17 * len(results) + 1.5)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    y = np.arange(len(results))
    ax1.barh(y, ratios, color=[colors[r["group"]] for r in results])
    for x, style in ((1.0, "-"), (1.5, "--"), (3.0, ":")):
        ax1.axvline(x, color="k", linestyle=style, linewidth=0.8)
    ax1.set_xscale("log")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 50)
             if min(ratios) / 1.5 <= t <= max(ratios) * 1.5]
    ax1.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax1.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax1.set_xlabel("qlinear time / onnxruntime time (lower is better; lines at 1, 1.5, 3)")
    ax1.set_yticks(y, names, fontsize=6)
    ax1.invert_yaxis()
    ax2.barh(y, [v if v else np.nan for v in refs], color=[colors[r["group"]] for r in results])
    ax2.axvline(50, color="k", linestyle="--", linewidth=0.8)
    ax2.set_xscale("log")
    ax2.set_xlabel("onnx.reference time / qlinear time (higher is better; line at 50)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax1.legend(handles, list(colors), loc="lower right", fontsize=8)
    fig.suptitle("qlinear vs onnxruntime and onnx.reference (same thread count)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


# ----------------------------------------------------------------------------------------
# --in-model
# ----------------------------------------------------------------------------------------

def summarize_in_model(results: list[dict[str, Any]]) -> dict[str, Any]:
    """--in-model: qlinear's summed time over onnxruntime's summed kernel time (issue #31's
    measure over ResNet-50's layers), the geometric mean, the worst case, those above 1.2."""
    if not results:
        return {"cases": 0, "noise": noise_summary(results)}
    worst = max(results, key=lambda r: r["qlinear_over_onnxruntime"])
    return {
        "cases": len(results),
        "summed_qlinear_over_onnxruntime_kernel":
            sum(r["time_s"]["qlinear"] for r in results)
            / sum(r["time_s"]["onnxruntime_kernel"] for r in results),
        "geomean_qlinear_over_onnxruntime_kernel":
            _geomean([r["qlinear_over_onnxruntime"] for r in results]),
        "geomean_session_over_kernel": _geomean([r["session_over_kernel"] for r in results]),
        "worst": worst["name"], "worst_ratio": worst["qlinear_over_onnxruntime"],
        "cases_above_1_2": [r["name"] for r in results if r["qlinear_over_onnxruntime"] > 1.2],
        "differ_onnxruntime_cases": sum(1 for r in results if r["vs_onnxruntime"]["differ"]),
        "noise": noise_summary(results),
    }


def in_model_markdown(results: list[dict[str, Any]], summary: dict[str, Any],
                      machine: dict[str, Any], args: argparse.Namespace) -> str:
    """results.md of ``--in-model``: qlinear against onnxruntime's convolution kernel."""
    lines = ["# qlinear benchmark results: convolutions as models run them (--in-model)", "",
             f"Measured {machine.get('date_utc')} UTC on {machine.get('cpu')} "
             f"({machine.get('logical_cpus')} logical CPUs), {machine.get('threads_per_engine')} "
             f"threads per engine; {_qlinear_version_text(machine)}, onnxruntime "
             f"{machine.get('onnxruntime')}"
             + ("; AMX denied to both runtimes (--no-amx)" if machine.get("amx") else "")
             + ". qlinear's prepared call against onnxruntime's convolution kernel alone (its "
             "profiler's kernel time: the layout Transposes of a one-node session excluded), "
             f"each warm and back to back in alternating blocks, medians of at least "
             f"{args.repeat} runs. Load average (1 min) "
             f"{_fmt((machine.get('load_average') or [None])[0], '.1f')} at the start, "
             f"{_fmt((machine.get('load_average_end') or [None])[0], '.1f')} at the end.",
             "", "## Summary", ""]
    if summary["cases"]:
        above = summary["cases_above_1_2"]
        lines.append(
            f"- {summary['cases']} convolutions: qlinear's summed time over onnxruntime's "
            f"summed kernel time **{summary['summed_qlinear_over_onnxruntime_kernel']:.2f}**, "
            f"geometric mean {summary['geomean_qlinear_over_onnxruntime_kernel']:.2f}, worst "
            f"{summary['worst_ratio']:.2f} ({summary['worst']}); above 1.2: {len(above)}"
            + (f" ({', '.join(above[:8])}{', ...' if len(above) > 8 else ''})" if above else "")
            + ".")
        lines.append(f"- onnxruntime's one-node session over its kernel alone (what the layout "
                     f"Transposes and the session add): geometric mean "
                     f"{summary['geomean_session_over_kernel']:.2f}.")
        lines.append(f"- Cases where onnxruntime's output differs from qlinear's: "
                     f"{summary['differ_onnxruntime_cases']} of {summary['cases']}.")
    lines += peak_lines(machine.get("int8_peak") or {})
    lines.append(_noise_line(summary["noise"], summary["cases"]))
    lines += ["", "## Cases", "",
              "*ort kernel* is onnxruntime's convolution kernel in the profiler; *ort session* "
              "the whole one-node session (wall time, Transposes included); *ql/kernel* "
              "qlinear's time over the kernel's; *spread* the interquartile range of the "
              "rounds' ql/kernel ratios over their median (a round is a block of each "
              f"runtime's runs), **noisy** above {NOISY_SPREAD:.0%}.", "",
              "| case | op | shapes | qlinear | ort kernel | ort session | ql/kernel | spread "
              "| session/kernel | GMAC/s ql | GMAC/s ort kernel | % peak ql | % peak ort |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["time_s"]
        lines.append(
            f"| {r['name']} | {r['op']} | {r['shape']} | {_fmt_t(t['qlinear'])} | "
            f"{_fmt_t(t['onnxruntime_kernel'])} | {_fmt_t(t['onnxruntime_session'])} | "
            f"{r['qlinear_over_onnxruntime']:.2f} | {_noise_cell(r)} | "
            f"{r['session_over_kernel']:.2f} | {_fmt(r['gmacs_qlinear'], '.1f')} | "
            f"{_fmt(r['gmacs_onnxruntime'], '.1f')} | {_fmt(r.get('pct_peak_qlinear'), '.0f')} | "
            f"{_fmt(r.get('pct_peak_onnxruntime'), '.0f')} |")
    lines.append("")
    return "\n".join(lines)
