"""``qlinear bench`` tells the truth: a peak it cannot trust prints no *% of peak* and says
why, rounds that disagree are marked noisy, and ``--in-model`` times onnxruntime's
convolution kernel without the one-node session's layout transposes (qlinear/tools/bench/).

The measurements are replaced here (monkeypatched) by values chosen to be implausible or
noisy, and the report is checked for saying so; the same runs with sound values are the
controls that the marks are not printed regardless."""

from __future__ import annotations

import json
import sys

import pytest

from qlinear.tools import bench
from qlinear.tools.bench import inmodel, machine, memory, run

pytest.importorskip("onnxruntime")

TINY_CONV = "tiny.qlinearconv.1x8x8x8.k3"
FACTS = {"clock_ghz": 3.0, "cpus": 2, "smt": False}


def _peak(g1: float, g2: float, *, isa="avx512vnni", form="u8s8") -> dict:
    return {"isa": isa, "threads": 2, "peak_gmacs": g2, "rounds": [g2],
            "kernels": {"exact": {"kernel": f"{isa}-{form}", "isa": isa, "form": form,
                                  "gmacs_1t": g1, "gmacs_2t": g2}}}


# ----------------------------------------------------------------------------- the peak

def test_a_plausible_peak_passes():
    # Zen 4 at 2.6 GHz nominal: ~228 GMAC/s a core, ~455 on two
    assert machine.check_peak(_peak(228, 455), dict(FACTS, clock_ghz=2.6)) is None
    # with SMT (two threads on one core) two threads need not be twice as fast
    assert machine.check_peak(_peak(228, 240), dict(FACTS, smt=True)) is None


def test_a_peak_that_did_not_scale_with_the_threads_is_implausible():
    """The 259-instead-of-453 case: the two-thread rate barely above one thread's on a CPU
    with two cores and no SMT."""
    why = machine.check_peak(_peak(228, 259), FACTS)
    assert why and "another process held a CPU" in why and "1.14x" in why
    # unknown topology: only a two-thread rate below one thread's is refused
    assert machine.check_peak(_peak(228, 259), dict(FACTS, smt=None)) is None
    assert "another process" in machine.check_peak(_peak(228, 150), dict(FACTS, smt=None))


def test_a_peak_beyond_the_instruction_throughput_times_the_clock_is_implausible():
    why = machine.check_peak(_peak(5e5, 1e6), FACTS)
    assert why and "outside what 2 cores can do with avx512vnni-u8s8 at 3.00 GHz" in why
    # far below what the slowest CPU of the level reaches at that clock
    why = machine.check_peak(_peak(10, 19), FACTS)
    assert why and "outside" in why
    # AVX2's vpmaddwd kernel: at most 32 multiply-adds per cycle and core
    assert machine.check_peak(_peak(60, 118, isa="avx2", form="i16"), FACTS) is None
    assert "outside" in machine.check_peak(_peak(250, 500, isa="avx2", form="i16"), FACTS)
    # without a known clock the bounds are not checked (the scaling check still is)
    assert machine.check_peak(_peak(5e5, 1e6), dict(FACTS, clock_ghz=None)) is None


def test_repeated_peaks_keep_the_maximum_and_mark_a_moving_host():
    both = machine.combine_peaks([_peak(228, 259), _peak(220, 455)])
    assert both["peak_gmacs"] == 455 and both["kernels"]["exact"]["gmacs_1t"] == 228
    assert both["rounds"] == [259, 455] and both["rounds_noisy"]
    assert machine.check_peak(both, FACTS) is None
    steady = machine.combine_peaks([_peak(228, 455), _peak(227, 450)])
    assert not steady["rounds_noisy"]
    assert machine.combine_peaks([{"isa": None, "note": "no kernel peak"}])["isa"] is None


def test_the_peak_is_measured_until_two_trials_agree():
    if not _native_selected():
        pytest.skip("needs the native engine")
    got = machine.measure_peak(2, seconds=0.002, trials=2, max_trials=4)
    row = got["kernels"]["exact"]
    assert 2 <= row["trials_2t"] <= 4 and got["rounds"] == [got["peak_gmacs"]]


def _native_selected() -> bool:
    from qlinear import _native

    return _native.native() is not None


def _bench(tmp_path, capsys, *argv) -> tuple[dict, str]:
    out = tmp_path / "b"
    rc = bench.main(["--cases", TINY_CONV, "--repeat", "1", "--no-reference", "--output-dir",
                     str(out), "--json", *argv])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out), (out / "results.md").read_text()


def test_an_implausible_peak_prints_no_percentages_and_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    calls = []
    monkeypatch.setattr(machine, "measure_peak",
                        lambda *a, **k: calls.append(k) or _peak(228, 259))
    data, md = _bench(tmp_path, capsys)
    why = data["machine"]["int8_peak"]["implausible"]
    assert "another process held a CPU" in why
    assert "No *% peak* is shown: this peak is implausible**: " + why in md
    r = data["results"][0]
    assert r["gmacs_qlinear"] and r["pct_peak_qlinear"] is None and r["pct_peak_onnxruntime"] is None
    assert len(calls) == 4  # three tries before the cases, one after


def test_a_plausible_peak_prints_percentages(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    monkeypatch.setattr(machine, "measure_peak", lambda *a, **k: _peak(228, 455))
    data, md = _bench(tmp_path, capsys)
    assert data["machine"]["int8_peak"]["implausible"] is None
    assert "this peak is implausible" not in md
    assert "relative to the exact kernel's 455 GMAC/s" in md
    r = data["results"][0]
    assert r["pct_peak_qlinear"] == pytest.approx(100 * r["gmacs_qlinear"] / 455)


# ----------------------------------------------------------------------------- noise

def test_round_noise():
    assert run.round_noise([1.0] * 8, [2.0] * 8) == {"rounds": 8, "ratio_spread": 0.0,
                                                     "noisy": False}
    nz = run.round_noise([1.0] * 8, [1.0, 3.0] * 4)
    assert nz["noisy"] and nz["ratio_spread"] > 0.5


def _fake_clock(monkeypatch, ort_times):
    """run.time_once returning 1 ms for qlinear's calls and ``ort_times[round % 2]`` for
    onnxruntime's (the third call of every round), the calls themselves still made."""
    calls = [0]

    def time_once(fn):
        fn()
        i = calls[0]
        calls[0] += 1
        return ort_times[(i // 3) % 2] if i % 3 == 2 else 1e-3

    monkeypatch.setattr(run, "time_once", time_once)


def test_rounds_that_disagree_are_reported_noisy(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "measure_peak", lambda *a, **k: _peak(228, 455))
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    _fake_clock(monkeypatch, (1e-3, 3e-3))
    data, md = _bench(tmp_path, capsys)
    r = data["results"][0]
    assert r["noise"]["noisy"] and r["noise"]["ratio_spread"] > 0.5
    assert data["summary"]["noise"]["noisy"] == [TINY_CONV]
    assert f"| {r['noise']['ratio_spread']:.0%} **noisy** |" in md
    assert f"spread over more than 10% of the median; their ratios say as much about the host " \
           f"as about the code): 1 of 1 ({TINY_CONV})" in md


def test_steady_rounds_are_not_marked(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "measure_peak", lambda *a, **k: _peak(228, 455))
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    _fake_clock(monkeypatch, (1e-3, 1e-3))
    data, md = _bench(tmp_path, capsys)
    assert not data["results"][0]["noise"]["noisy"] and data["summary"]["noise"]["noisy"] == []
    assert "% **noisy** |" not in md and "about the host as about the code): 0 of 1." in md


def test_a_peak_that_moved_during_the_run_is_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    peaks = iter([_peak(228, 455), _peak(228, 380)])
    monkeypatch.setattr(machine, "measure_peak", lambda *a, **k: next(peaks))
    data, md = _bench(tmp_path, capsys)
    assert data["machine"]["int8_peak"]["rounds_noisy"]
    assert "**Noisy run**: the peak moved by 16%" in md


# ----------------------------------------------------------------------------- --in-model

def test_kernel_times_split_the_profile_by_run():
    ev = [{"cat": "Node", "name": "T_kernel_time", "dur": 20, "args": {"op_name": "Transpose"}},
          {"cat": "Node", "name": "c_kernel_time", "dur": 300, "args": {"op_name": "QLinearConv"}},
          {"cat": "Node", "name": "c_fence_before", "dur": 0, "args": {"op_name": "QLinearConv"}},
          {"cat": "Session", "name": "model_run", "dur": 400},
          {"cat": "Node", "name": "c_kernel_time", "dur": 280, "args": {"op_name": "QLinearConv"}},
          {"cat": "Session", "name": "model_run", "dur": 300}]
    kern, other = inmodel.kernel_times(ev, "QLinearConv")
    assert kern == pytest.approx([300e-6, 280e-6]) and other == pytest.approx([20e-6, 0.0])


def test_in_model_runs_a_tiny_convolution(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "measure_peak", lambda *a, **k: _peak(228, 455))
    monkeypatch.setattr(machine, "cpu_facts", lambda: dict(FACTS))
    monkeypatch.setattr(inmodel, "PAUSE_S", 0.0)
    data, md = _bench(tmp_path, capsys, "--in-model")
    (r,) = data["results"]
    t = r["time_s"]
    assert r["name"] == TINY_CONV and r["vs_onnxruntime"]["differ"] == 0
    # the kernel alone is part of the session's run: never longer than the whole run
    assert 0 < t["onnxruntime_kernel"] <= t["onnxruntime_session"]
    assert t["onnxruntime_other_nodes"] >= 0 and r["runs"] >= 2
    assert r["qlinear_over_onnxruntime"] == pytest.approx(t["qlinear"] / t["onnxruntime_kernel"])
    assert data["summary"]["cases"] == 1 and "convolutions as models run them" in md
    assert not (tmp_path / "b" / "results.png").exists()


def test_in_model_without_a_convolution_is_a_one_line_error(capsys):
    assert bench.main(["--in-model", "--cases", "tiny.qlinearmatmul"]) == 2
    err = capsys.readouterr().err
    assert err == ("qlinear: error: --in-model times convolutions; no convolution case "
                   "matches 'tiny.qlinearmatmul'\n")


# ----------------------------------------------------------------------------- the rest

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_the_memory_probe_reads_the_resident_set():
    before = memory.reset_peak()
    assert before and before > 0 and memory.status_kib("VmHWM") >= before
    block = bytearray(64 << 20)  # 64 MiB touched (zero-filled)
    assert memory.status_kib("VmHWM") - before >= 60 << 10
    del block
    assert memory.status_kib("NoSuchField") is None


def test_python_m_runs_the_bench(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "qlinear.tools.bench", "--cases", "nothing-at-all"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("qlinear: error: no case matches")


def test_graphs_default_mode_runs_each_runtime_in_its_own_process(tmp_path):
    """benchmarks/graphs.py's default mode on a one-node model (--smoke): a qlinear process
    and an onnxruntime process, each reporting its warm median to the parent."""
    import os
    import re
    import subprocess

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks", "graphs.py")
    p = subprocess.run([sys.executable, script, "--smoke", "--repeat", "3"], capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    m = re.search(r"^smoke\.qlinearconv\S*: qlinear ([\d.]+) ms, onnxruntime ([\d.]+) ms, ratio "
                  r"([\d.]+) \(each alone in its own process, median of 1 round;", p.stdout, re.M)
    assert m, p.stdout
    assert "geometric mean qlinear/onnxruntime" in p.stdout
