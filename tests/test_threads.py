"""One prepared object used from several Python threads at once (the GIL is released inside
the native engine, so calls on the same object overlap).

A prepared form remembers its last native call's arguments for the repeat-call short path.
Those arguments must be the ones of the call that remembers them: when another thread's call
(other input shape) lands between a call's native run and its ``remember``, the form used to
keep the other call's arguments under this call's shape, and the next call of this shape then
ran the other call's plan (an output of the other shape, reads past the input).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import oracle
import qlinear
from qlinear import _native
from qlinear import conv as _conv
from qlinear import matmul as _matmul
from conftest import I8, U8, assert_exact, rand_int

needs_native = pytest.mark.skipif(_native.native() is None, reason="the native engine is not selected")


def _interleave(monkeypatch, module, name, other):
    """Make ``module.name`` run ``other()`` (another thread's call on the same form) right
    after the native call it wraps, once: the interleaving a thread switch can give."""
    real = getattr(module, name)
    state = {"armed": True}

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        if state["armed"]:
            state["armed"] = False
            other()
        return out

    monkeypatch.setattr(module, name, wrapped)
    return state


@needs_native
@pytest.mark.parametrize("quantized", [False, True])
def test_prepared_matmul_remembers_its_own_call_when_another_lands_between(monkeypatch, quantized):
    rng = np.random.default_rng(3)
    b = rand_int(rng, I8, (16, 8))
    small, large = rand_int(rng, U8, (2, 16)), rand_int(rng, U8, (5, 16))
    zp, a_s, ys, yzp = U8(3), np.float32(0.02), np.float32(0.5), U8(7)
    if quantized:
        prep = qlinear.prepare_qlinear_matmul(b, np.float32(0.01), I8(0))
        run = lambda a: prep.run(a, a_s, zp, ys, yzp)  # noqa: E731
        want = lambda a: oracle.qlinear_matmul(a, a_s, zp, b, np.float32(0.01), I8(0), ys, yzp)  # noqa: E731
    else:
        prep = qlinear.prepare_matmul_integer(b)
        run = lambda a: prep.run(a, zp)  # noqa: E731
        want = lambda a: oracle.matmul_integer(a, b, zp)  # noqa: E731
    state = _interleave(monkeypatch, _matmul, "_native_matmul", lambda: run(large))
    assert_exact(run(small), want(small))
    assert not state["armed"]
    assert_exact(run(small), want(small))   # the repeat path: this shape's own plan
    assert_exact(run(large), want(large))


@needs_native
def test_prepared_matmul_zero_point_array_repeat_path_keeps_its_own_call(monkeypatch):
    """The 0-d zero point repeat path (DynamicQuantizeLinear's output) too."""
    rng = np.random.default_rng(4)
    b = rand_int(rng, I8, (16, 8))
    small, large = rand_int(rng, U8, (2, 16)), rand_int(rng, U8, (5, 16))
    prep = qlinear.prepare_matmul_integer(b)
    run = lambda a: prep.run(a, np.array(9, U8))  # noqa: E731
    _interleave(monkeypatch, _matmul, "_native_matmul", lambda: run(large))
    assert_exact(run(small), oracle.matmul_integer(small, b, U8(9)))
    assert_exact(run(small), oracle.matmul_integer(small, b, U8(9)))
    assert_exact(run(large), oracle.matmul_integer(large, b, U8(9)))


@needs_native
@pytest.mark.parametrize("quantized", [False, True])
def test_prepared_conv_remembers_its_own_call_when_another_lands_between(monkeypatch, quantized):
    rng = np.random.default_rng(5)
    w = rand_int(rng, I8, (4, 3, 3, 3))
    small, large = rand_int(rng, U8, (1, 3, 5, 5)), rand_int(rng, U8, (2, 3, 9, 7))
    zp, xs, ws, ys, yzp = U8(5), np.float32(0.02), np.float32(0.01), np.float32(0.3), U8(9)
    if quantized:
        prep = qlinear.prepare_qlinear_conv(w, ws, I8(0), pads=[1, 1, 1, 1])
        run = lambda x: prep.run(x, xs, zp, ys, yzp)  # noqa: E731
        want = lambda x: oracle.qlinear_conv(x, xs, zp, w, ws, I8(0), ys, yzp, pads=[1, 1, 1, 1])  # noqa: E731
    else:
        prep = qlinear.prepare_conv_integer(w, pads=[1, 1, 1, 1])
        run = lambda x: prep.run(x, zp)  # noqa: E731
        want = lambda x: oracle.conv_integer(x, w, zp, pads=[1, 1, 1, 1])  # noqa: E731
    state = _interleave(monkeypatch, _conv._ConvWeights, "run_native", lambda: run(large))
    assert_exact(run(small), want(small))
    assert not state["armed"]
    assert_exact(run(small), want(small))
    assert_exact(run(large), want(large))


def _in_threads(work, n: int = 4) -> None:
    """Runs work(0) ... work(n - 1) in n Python threads at once and waits for all of them."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

def test_prepared_forms_from_several_threads_with_different_shapes():
    """The real thing, briefly: four threads share each prepared form, each cycling through
    inputs of different shapes; every result is exact (on either engine)."""
    rng = np.random.default_rng(6)
    b = rand_int(rng, I8, (32, 16))
    w = rand_int(rng, I8, (4, 2, 3, 3))
    mm = qlinear.prepare_matmul_integer(b)
    cv = qlinear.prepare_qlinear_conv(w, np.float32(0.01), I8(0))
    a_in = [rand_int(rng, U8, (m, 32)) for m in (1, 3, 7, 2)]
    x_in = [rand_int(rng, U8, (1, 2, h, 6)) for h in (3, 5, 8, 4)]
    a_want = [oracle.matmul_integer(a, b, U8(1)) for a in a_in]
    p = (np.float32(0.02), U8(4), np.float32(0.2), U8(6))
    x_want = [oracle.qlinear_conv(x, p[0], p[1], w, np.float32(0.01), I8(0), p[2], p[3]) for x in x_in]
    bad: list = []

    def work(i: int) -> None:
        for j in range(300):
            k = (i + j) % 4
            y = mm.run(a_in[k], U8(1))
            z = cv.run(x_in[k], *p)
            if not (y.shape == a_want[k].shape and np.array_equal(y, a_want[k])
                    and z.shape == x_want[k].shape and np.array_equal(z, x_want[k])):
                bad.append(k)
                return

    _in_threads(work)
    assert bad == []


def test_backend_representation_from_several_threads():
    """One QLinearRep run from four Python threads at once, each with its own batch size: every
    output equals the single-threaded run (the nodes' cached prepared forms, parameter scalars
    and QLinearLeakyRelu's table are shared between the threads)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper, numpy_helper

    from qlinear import backend

    path = os.path.join(os.path.dirname(qlinear.__file__), "examples", "digits_cnn_qoperator.onnx")
    rep = backend.prepare(path)
    rng = np.random.default_rng(7)
    xs = [rng.random((n, 1, 8, 8), dtype=np.float32) for n in (1, 3, 5, 2)]
    wants = [rep.run([x])[0] for x in xs]
    # a QLinearLeakyRelu node, whose table the node builds on its first run and keeps
    node = helper.make_node("QLinearLeakyRelu", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                            alpha=0.3)
    consts = [numpy_helper.from_array(np.asarray(v), n) for n, v in
              {"xs": np.float32(0.04), "xz": np.uint8(3), "ys": np.float32(0.02), "yz": np.uint8(9)}.items()]
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", T.UNDEFINED, None)],
                          [helper.make_tensor_value_info("y", T.UINT8, None)], consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    table_rep = backend.prepare(m)
    tx = rand_int(rng, U8, (64,))
    t_want = table_rep.run({"x": tx})[0]
    bad: list = []

    def work(i: int) -> None:
        for j in range(40):
            k = (i + j) % 4
            y = rep.run([xs[k]])[0]
            if y.shape != wants[k].shape or not np.array_equal(y, wants[k]):
                bad.append(k)
                return
            if not np.array_equal(table_rep.run({"x": tx})[0], t_want):
                bad.append("table")
                return

    _in_threads(work)
    assert bad == []


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 9 (an acceptance audit of issue #9, the compiled engine)

import subprocess  # noqa: E402
import sys  # noqa: E402


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_runs_on_the_pool():
    """regression: (Held; a regression test.) A fork while another Python thread is inside a native call
    (the pool's job lock held, its workers busy): the child has neither that thread nor the
    workers; it computes exactly, for every operator kind, and on its own rebuilt pool (2
    threads: without threads.c's after-fork reset it would find the job lock taken, or count
    the parent's workers as its own, and run every call serially); the parent's calls also
    stay exact."""
    code = r"""
import os, sys, threading, numpy as np, qlinear
sys.path.insert(0, sys.argv[1])
import oracle
qlinear.set_num_threads(2)
rng = np.random.default_rng(0)
a = rng.integers(0, 256, (400, 700), dtype=np.uint8); b = rng.integers(-128, 128, (700, 300), dtype=np.int8)
want = oracle.matmul_integer(a, b, np.uint8(3), np.int8(-1))
x = rng.integers(0, 256, (2, 8, 9, 9), dtype=np.uint8); w = rng.integers(-128, 128, (6, 8, 3, 3), dtype=np.int8)
want_c = oracle.qlinear_conv(x, np.float32(.02), np.uint8(5), w, np.float32(.01), np.int8(0), np.float32(.7),
                             np.int8(1), pads=[1] * 4)
xf = rng.standard_normal((300, 70)).astype(np.float32) * 40
want_q = oracle.quantize_linear(xf, np.float32(.3), np.int8(2))
def ops():
    return (np.array_equal(qlinear.matmul_integer(a, b, np.uint8(3), np.int8(-1)), want)
            and np.array_equal(qlinear.qlinear_conv(x, np.float32(.02), np.uint8(5), w, np.float32(.01), np.int8(0),
                                                    np.float32(.7), np.int8(1), pads=[1] * 4), want_c)
            and np.array_equal(qlinear.quantize_linear(xf, np.float32(.3), np.int8(2)), want_q))
assert ops()   # every lazy import and first-call setup done before any thread starts
stop, bad = threading.Event(), []
def busy():
    while not stop.is_set():
        if not ops():
            bad.append(1)
t = threading.Thread(target=busy); t.start()
codes = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        exact = ops() and ops()
        with open("/proc/self/status") as f:   # the child's pool: itself and one worker
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
        os._exit(0 if exact and threads == 2 else 3 if not exact else 4)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
stop.set(); t.join()
print(codes, bad)
"""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc/self/status to count the child's threads")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code, tests_dir], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"{[0] * 20} []", r.stdout
