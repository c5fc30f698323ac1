"""Engine and ISA selection, threads, engine_info (the native engine's Python surface)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import qlinear
from qlinear import _native

needs_native = pytest.mark.skipif(not _native.available(), reason="native engine not built")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("QLINEAR_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def test_engine_info_keys():
    info = qlinear.engine_info()
    assert {"engine", "isa", "isas", "threads"} <= set(info)
    assert info["engine"] in ("native", "numpy")
    assert isinstance(info["threads"], int) and info["threads"] >= 1
    if _native.available():
        assert info["isas"][-1] == "scalar" and info["isa"] in info["isas"]
        assert list(info["isas"]) == [i for i in ("amx", "avx512vnni", "avxvnni", "avx2", "scalar") if i in info["isas"]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None, 5000])
def test_set_num_threads_rejects(bad):
    with pytest.raises(ValueError, match="set_num_threads"):
        qlinear.set_num_threads(bad)


def test_set_num_threads_round_trip():
    saved = qlinear.get_num_threads()
    try:
        qlinear.set_num_threads(1)
        assert qlinear.engine_info()["threads"] == 1
        a = np.arange(60, dtype=np.uint8).reshape(6, 10)
        b = np.arange(40, dtype=np.int8).reshape(10, 4)
        one = qlinear.matmul_integer(a, b)
        qlinear.set_num_threads(3)
        np.testing.assert_array_equal(qlinear.matmul_integer(a, b), one)
    finally:
        qlinear.set_num_threads(saved)


@needs_native
def test_environment_selects_engine_isa_and_threads():
    r = _run("import qlinear; i = qlinear.engine_info(); print(i['engine'], i['isa'], i['threads'])",
             QLINEAR_ENGINE="numpy", QLINEAR_ISA="scalar", QLINEAR_NUM_THREADS="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["numpy", "scalar", "1"]


@needs_native
def test_environment_values_are_stripped():
    """Surrounding blanks in QLINEAR_ENGINE / QLINEAR_ISA are ignored, as they are in
    QLINEAR_NUM_THREADS and QLINEAR_REQUIRE_NATIVE (" avx2" was refused)."""
    r = _run("import qlinear; i = qlinear.engine_info(); print(i['engine'], i['isa'])",
             QLINEAR_ENGINE=" native ", QLINEAR_ISA=" scalar\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["native", "scalar"]


@needs_native
@pytest.mark.parametrize("env,message", [
    ({"QLINEAR_ISA": "avx9000"}, "QLINEAR_ISA must be one of amx, avx512vnni, avxvnni, avx2, scalar; got 'avx9000'"),
    ({"QLINEAR_ENGINE": "fast"}, "QLINEAR_ENGINE must be one of native, numpy; got 'fast'"),
    ({"QLINEAR_NUM_THREADS": "0"}, "QLINEAR_NUM_THREADS must be an integer in [1, 1024]; got 0"),
    ({"QLINEAR_REQUIRE_NATIVE": "2"}, "QLINEAR_REQUIRE_NATIVE must be 0 or 1; got '2'"),
])
def test_environment_errors_are_clear(env, message):
    r = _run("import qlinear", **env)
    assert r.returncode != 0
    assert message in r.stderr


@needs_native
@pytest.mark.parametrize("env,message", [
    ({"QLINEAR_ENGINE": "fast"}, "QLINEAR_ENGINE must be one of native, numpy; got 'fast'"),
    ({"QLINEAR_ISA": "avx9000"}, "QLINEAR_ISA must be one of amx, avx512vnni, avxvnni, avx2, scalar; got 'avx9000'"),
    ({"QLINEAR_NUM_THREADS": "many"}, "QLINEAR_NUM_THREADS must be an integer in [1, 1024]; got 'many'"),
    ({"QLINEAR_REQUIRE_NATIVE": "yes"}, "QLINEAR_REQUIRE_NATIVE must be 0 or 1; got 'yes'"),
])
def test_environment_errors_in_the_command_are_one_line(env, message):
    """The `qlinear` command (console script or ``python -m qlinear``) reports a bad
    QLINEAR_* variable as every other bad input: one line, exit status 2 (it was an import
    traceback and exit status 1)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("QLINEAR_")}
    full.update(env)
    script = os.path.join(os.path.dirname(sys.executable), "qlinear")
    commands = [[sys.executable, "-m", "qlinear", "run"]]
    if os.path.exists(script):
        commands.append([script, "run"])
    for cmd in commands:
        r = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=120)
        assert r.returncode == 2, (cmd, r.returncode, r.stderr)
        assert r.stderr.strip() == f"qlinear: error: {message}", (cmd, r.stderr)
        assert r.stdout == ""


@needs_native
def test_isa_the_cpu_lacks_is_an_error():
    missing = [i for i in ("amx", "avx512vnni", "avxvnni", "avx2") if i not in qlinear.engine_info()["isas"]]
    if not missing:
        pytest.skip("this CPU runs every level")
    r = _run("import qlinear", QLINEAR_ISA=missing[0])
    assert r.returncode != 0
    assert f"QLINEAR_ISA='{missing[0]}': this CPU cannot run that level" in r.stderr
    with pytest.raises(ValueError, match="cannot run that level"):
        _native.set_isa(missing[0])


def test_without_the_extension_the_numpy_engine_runs(tmp_path):
    """A copy of the package without the compiled module (an install without a C compiler):
    the NumPy engine runs and says why; QLINEAR_REQUIRE_NATIVE=1 makes the import fail."""
    import shutil
    pkg = tmp_path / "qlinear"
    shutil.copytree(os.path.dirname(qlinear.__file__), pkg,
                    ignore=shutil.ignore_patterns("_qlnative*", "__pycache__", "_native"))
    code = (
        "import sys\n"
        "sys.meta_path = [m for m in sys.meta_path if 'editable' not in repr(m).lower()]\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import numpy as np, qlinear\n"
        f"assert qlinear.__file__.startswith({str(tmp_path)!r}), qlinear.__file__\n"
        "i = qlinear.engine_info()\n"
        "print(i['engine'], i['native_available'], i['native_error'])\n"
        "print(qlinear.matmul_integer(np.ones((2, 3), np.uint8), np.ones((3, 2), np.int8)).tolist())\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("numpy False the extension qlinear._qlnative was not built")
    assert lines[1] == "[[3, 3], [3, 3]]"
    r = _run(code, QLINEAR_REQUIRE_NATIVE="1")
    assert r.returncode != 0 and "QLINEAR_REQUIRE_NATIVE=1 but the native engine is not built" in r.stderr


def test_concurrent_calls_from_python_threads():
    """The GIL is released: calls from several Python threads run at once (one of them on the
    pool, the others on their own thread) and all give the exact result."""
    from concurrent.futures import ThreadPoolExecutor

    import oracle
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, (97, 300)).astype(np.uint8)
    b = rng.integers(-128, 128, (300, 70)).astype(np.int8)
    want = oracle.matmul_integer(a, b, np.uint8(7), np.int8(-3))
    prepared = qlinear.prepare_matmul_integer(b, np.int8(-3))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: prepared.run(a, np.uint8(7)), range(16)))
    for got in results:
        np.testing.assert_array_equal(got, want)


@needs_native
def test_pool_survives_fork():
    """A forked child (multiprocessing's default on Linux) rebuilds the pool on first use."""
    code = (
        "import os, numpy as np, qlinear\n"
        "a = np.ones((300, 300), np.uint8); b = np.ones((300, 300), np.int8)\n"
        "qlinear.set_num_threads(2); qlinear.matmul_integer(a, b)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = int(qlinear.matmul_integer(a, b)[0, 0]) == 300\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 9 (an acceptance audit of issue #9, the compiled engine)


def _without_extension(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` against a copy of the package without the compiled module (what
    ``pip install .`` leaves where no C compiler works)."""
    import shutil

    pkg = tmp_path / "qlinear"
    if not pkg.exists():
        shutil.copytree(os.path.dirname(qlinear.__file__), pkg,
                        ignore=shutil.ignore_patterns("_qlnative*", "__pycache__", "_native"))
    prelude = ("import sys\n"
               "sys.meta_path = [m for m in sys.meta_path if 'editable' not in repr(m).lower()]\n"
               f"sys.path.insert(0, {str(tmp_path)!r})\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("QLINEAR_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=full,
                          timeout=120)


def test_missing_native_engine_is_said_at_import(tmp_path):
    """regression: Without a C compiler `pip install .` succeeds on the NumPy engine, and setup.py prints
    why, but pip shows a successful build's output only with -v: the install said nothing
    a user would see, and importing qlinear said nothing either (only engine_info() told).
    The first import now warns once (RuntimeWarning), naming the cause and how to silence it;
    choosing the NumPy engine explicitly (QLINEAR_ENGINE=numpy) silences it."""
    code = "import qlinear\nprint(qlinear.engine_info()['engine'])\n"  # Python's default warning filters
    r = _without_extension(tmp_path, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["numpy"]
    assert "RuntimeWarning: qlinear: the native engine is not built" in r.stderr, r.stderr
    assert "running on the NumPy engine" in r.stderr and "QLINEAR_ENGINE=numpy" in r.stderr, r.stderr
    r = _without_extension(tmp_path, code, QLINEAR_ENGINE="numpy")
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
@pytest.mark.parametrize("bad", ["avx9000", "AMX", ""])
def test_use_isa_refused_leaves_the_engine_as_it_was(bad):
    """regression: _native.use_isa (what the tests and benchmarks select levels with) switched to the
    native engine before checking the level: a refused level raised but left the native engine
    selected where the NumPy engine was."""
    with _native.use_engine("numpy"):
        with pytest.raises(ValueError, match="isa"):
            with _native.use_isa(bad):
                pass
        assert _native.engine() == "numpy"


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "1\u00b2"])
def test_num_threads_variable_of_non_ascii_digits_is_named(value):
    """regression: QLINEAR_NUM_THREADS='²' passed str.isdigit, then int() raised its own ValueError
    ('invalid literal for int() with base 10'), naming neither the variable nor the accepted
    range (and '٣', an Arabic-Indic three, was taken as 3 threads)."""
    r = subprocess.run([sys.executable, "-c", "import qlinear"], capture_output=True, text=True, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("QLINEAR_")},
                            "QLINEAR_NUM_THREADS": value})
    assert r.returncode != 0
    assert f"QLINEAR_NUM_THREADS must be an integer in [1, 1024]; got {value!r}" in r.stderr, r.stderr


def test_set_num_threads_takes_a_numpy_integer():
    """regression: set_num_threads(np.int64(2)) was refused as 'must be an integer in [1, 1024]; got
    np.int64(2)' (set_workspace_limit and set_max_output_bytes take NumPy integers)."""
    saved = qlinear.get_num_threads()
    try:
        qlinear.set_num_threads(np.int64(1))
        assert qlinear.get_num_threads() == 1 and type(qlinear.get_num_threads()) is int
        assert qlinear.engine_info()["threads"] == 1
        qlinear.set_num_threads(np.uint8(2))
        assert qlinear.get_num_threads() == 2
        for bad in (np.int64(0), np.int64(1025), np.bool_(True), np.float32(2)):
            with pytest.raises(ValueError, match=r"set_num_threads\(n\) must be an integer in \[1, 1024\]"):
                qlinear.set_num_threads(bad)
    finally:
        qlinear.set_num_threads(saved)


@pytest.mark.parametrize("env,message", [
    ({"QLINEAR_ISA": "avx9000"}, "QLINEAR_ISA='avx9000' needs the native engine, which is not built"),
    ({"QLINEAR_ISA": "avx2"}, "QLINEAR_ISA='avx2' needs the native engine, which is not built"),
    ({"QLINEAR_NUM_THREADS": "abc"}, "QLINEAR_NUM_THREADS must be an integer in [1, 1024]; got 'abc'"),
    ({"QLINEAR_NUM_THREADS": "0"}, "QLINEAR_NUM_THREADS must be an integer in [1, 1024]; got 0"),
])
def test_environment_is_checked_without_the_native_engine(tmp_path, env, message):
    """regression: Without the compiled module, QLINEAR_ISA and QLINEAR_NUM_THREADS were not read at all:
    a misspelt level, a level that cannot run, or 'abc' threads were silently ignored (with the
    native engine each is an error at import)."""
    r = _without_extension(tmp_path, "import qlinear\n", QLINEAR_ENGINE="numpy", **env)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


def test_thread_count_from_the_environment_without_the_native_engine(tmp_path):
    """regression: QLINEAR_NUM_THREADS=3 is what engine_info() and get_num_threads() report without the
    native engine too, as set_num_threads(3) is (it was ignored: they said the CPU count)."""
    code = "import qlinear\nprint(qlinear.get_num_threads(), qlinear.engine_info()['threads'])\n"
    r = _without_extension(tmp_path, code, QLINEAR_ENGINE="numpy", QLINEAR_NUM_THREADS="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "3"]


def test_calls_do_not_import_numpy_ma():
    """regression: Every call checked ``isinstance(value, np.ma.MaskedArray)``; NumPy imports numpy.ma
    lazily on that first attribute access, under importlib's module lock. A process forked
    (multiprocessing's default on Linux) while another thread made its first qlinear call
    inherited that lock held by a thread it does not have: the child's first call waited on it
    forever (seen as hung children in a fork stress test: 'acquire' in
    importlib._bootstrap._lock_unlock_module under numpy.__getattr__ under as_array). A
    masked array can only exist once numpy.ma was imported, so the check now looks in
    sys.modules and never imports it; masked arrays are still refused."""
    code = ("import sys, numpy as np, qlinear\n"
            "u8, i8, f = np.uint8, np.int8, np.float32\n"
            "a = np.ones((3, 4), u8); b = np.ones((4, 2), i8)\n"
            "qlinear.matmul_integer(a, b, u8(1), i8(0))\n"
            "qlinear.qlinear_matmul(a, f(.1), u8(1), b, f(.1), i8(0), f(.2), u8(3))\n"
            "qlinear.prepare_qlinear_matmul(b, f(.1), i8(0)).run(a, f(.1), u8(1), f(.2), u8(3))\n"
            "x = np.ones((1, 2, 3, 3), u8); w = np.ones((2, 2, 1, 1), i8)\n"
            "qlinear.conv_integer(x, w, u8(1), i8(0))\n"
            "qlinear.qlinear_conv(x, f(.1), u8(1), w, f(.1), i8(0), f(.2), u8(3), np.zeros(2, np.int32))\n"
            "qlinear.quantize_linear(np.ones(3, f), f(.5), u8(2))\n"
            "qlinear.dequantize_linear(np.ones(3, u8), f(.5), u8(2))\n"
            "print('numpy.ma' in sys.modules)\n"
            "import numpy.ma\n"
            "try:\n"
            "    qlinear.matmul_integer(np.ma.masked_array(a), b)\n"
            "except TypeError as e:\n"
            "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "False"
    assert lines[1].startswith("matmul_integer: a must not be a masked array")
