"""``--no-amx``: both runtimes run as on a CPU without AMX (qlinear/tools/bench/noamx.py).

The filter is irrevocable, so every check runs in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qlinear.tools.bench import noamx as _noamx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(_noamx.supported() is not None,
                                reason=f"--no-amx {_noamx.supported()}")


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _noamx.filter_prelude() + code], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_the_filter_denies_amx_to_qlinear_and_only_that():
    """qlinear's dispatch sees no AMX (its level disappears), every other level stays, the
    process otherwise works (threads, files), and the request really fails (on an AMX CPU it
    would succeed without the filter: checked in this process below)."""
    r = _child("import qlinear, numpy as np, os\n"
               "from qlinear.tools.bench import noamx as _noamx\n"
               "info = qlinear.engine_info()\n"
               "a = np.arange(64 * 64, dtype=np.uint8).reshape(64, 64)\n"
               "b = (np.arange(64 * 64) % 256 - 128).astype(np.int8).reshape(64, 64)\n"
               "y = qlinear.matmul_integer(a, b)\n"
               "ok = bool((y == a.astype(np.int64) @ b.astype(np.int64)).all())\n"
               "print(info['isas'], _noamx.amx_request_denied(), os.environ.get('QLINEAR_NO_AMX'), ok)\n")
    assert r.returncode == 0, r.stderr
    isas, denied, mark, ok = r.stdout.rsplit("]", 1)[0] + "]", *r.stdout.rsplit("]", 1)[1].split()
    assert "amx" not in isas and "scalar" in isas
    assert (denied, mark, ok) == ("True", "1", "True")
    import qlinear
    if "amx" in qlinear.engine_info()["isas"]:  # this process asked before any filter
        assert not _noamx.amx_request_denied()


def test_bench_no_amx_runs_in_a_child_and_says_so(tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "b"
    r = subprocess.run([sys.executable, "-m", "qlinear", "bench", "--no-amx", "--cases",
                        "tiny.qlinearmatmul.4x64x64", "--repeat", "1", "--no-reference",
                        "--output-dir", str(out), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["machine"]["amx"] == "denied to both runtimes (--no-amx)"
    assert "amx" not in data["machine"]["qlinear_engine"]["isas"]
    assert data["results"][0]["vs_onnxruntime"]["differ"] == 0
    assert "AMX denied to both runtimes" in (out / "results.md").read_text()
    # the parent process was not filtered: its own request is unaffected
    import qlinear
    if "amx" in qlinear.engine_info()["isas"]:
        assert not _noamx.amx_request_denied()


def test_no_amx_where_it_cannot_work_is_a_one_line_error(monkeypatch, capsys):
    from qlinear.tools import bench
    monkeypatch.setattr(_noamx, "supported", lambda: "needs Linux (this is darwin)")
    monkeypatch.delenv(_noamx.ENV_MARK, raising=False)
    assert bench.main(["--no-amx", "--cases", "tiny.qlinearmatmul.4x64x64"]) == 2
    err = capsys.readouterr().err
    assert err == "qlinear: error: --no-amx needs Linux (this is darwin)\n"
