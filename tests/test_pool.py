"""The native thread pool: the same bits whatever the thread count and whatever else runs.

Every kernel splits its work into tasks that the pool's threads claim in turn (the caller
too), more tasks than threads, so the thread that computes a task depends on timing: which
worker woke first, whether another process held its CPU. A task's result must not: each
writes its own outputs with the whole reduction, so the output is the same for every thread
count and every interleaving. These tests run each native path (implicit GEMM convolutions in
both forms, im2col, depthwise, matmuls in both forms, quantize) on 1 to 4 threads, and again
with a CPU-bound process beside them (the pool's workers then come late, are preempted inside
a task, or not at all, and the caller takes over their share), against the oracle.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import numpy as np
import pytest

import oracle
import qlinear
from qlinear import _native
from conftest import I8, U8, assert_exact, rand_int

needs_native = pytest.mark.skipif(_native.native() is None, reason="the native engine is not selected")

THREAD_COUNTS = (1, 2, 3, 4)


@contextlib.contextmanager
def _threads(n: int):
    before = qlinear.get_num_threads()
    qlinear.set_num_threads(n)
    try:
        yield
    finally:
        qlinear.set_num_threads(before)


@contextlib.contextmanager
def _busy_neighbour():
    """One CPU-bound process beside the test (killed on exit)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _cases():
    """(name, call, oracle result) for each native path, sizes past the pool's one-thread limits
    (2^21 multiply-adds, 2^18 quantized values) so that they run on the threads."""
    rng = np.random.default_rng(31)
    xs, ws, ys = np.float32(0.02), np.float32(0.01), np.float32(0.9)
    cases = []
    x = rand_int(rng, U8, (2, 32, 24, 24))
    for name, w, wzp in [("conv3x3 exact", rand_int(rng, I8, (48, 32, 3, 3)), I8(3)),
                         ("conv3x3 7-bit", rand_int(rng, I8, (48, 32, 3, 3), -64, 64), I8(0))]:
        prep = qlinear.prepare_qlinear_conv(w, ws, wzp, pads=[1, 1, 1, 1])
        cases.append((name, lambda p=prep: p.run(x, xs, U8(7), ys, U8(120)),
                      oracle.qlinear_conv(x, xs, U8(7), w, ws, wzp, ys, U8(120), pads=[1, 1, 1, 1])))
    w = rand_int(rng, I8, (40, 32, 3, 3))
    cases.append(("convinteger s2", lambda: qlinear.conv_integer(x, w, U8(9), I8(-2), strides=[2, 2], pads=[0, 0, 1, 1]),
                  oracle.conv_integer(x, w, U8(9), I8(-2), strides=[2, 2], pads=[0, 0, 1, 1])))
    w1 = rand_int(rng, I8, (64, 32, 1, 1))
    cases.append(("conv1x1", lambda: qlinear.qlinear_conv(x, xs, U8(7), w1, ws, I8(0), ys, U8(128)),
                  oracle.qlinear_conv(x, xs, U8(7), w1, ws, I8(0), ys, U8(128))))
    xd = rand_int(rng, U8, (2, 64, 40, 40))
    wd = rand_int(rng, I8, (64, 1, 3, 3))
    cases.append(("depthwise", lambda: qlinear.qlinear_conv(xd, xs, U8(7), wd, ws, I8(1), ys, U8(128),
                                                            group=64, pads=[1, 1, 1, 1]),
                  oracle.qlinear_conv(xd, xs, U8(7), wd, ws, I8(1), ys, U8(128), group=64, pads=[1, 1, 1, 1])))
    a = rand_int(rng, U8, (96, 320))
    b = rand_int(rng, I8, (320, 256))
    cases.append(("qlinear_matmul", lambda: qlinear.qlinear_matmul(a, xs, U8(3), b, ws, I8(0), ys, U8(128)),
                  oracle.qlinear_matmul(a, xs, U8(3), b, ws, I8(0), ys, U8(128))))
    b7 = rand_int(rng, I8, (320, 256), -64, 64)
    pm = qlinear.prepare_matmul_integer(b7)
    cases.append(("matmul_integer 7-bit", lambda: pm.run(a, U8(3)), oracle.matmul_integer(a, b7, U8(3))))
    f = rng.standard_normal((4, 64, 40, 40)).astype(np.float32)
    cases.append(("quantize", lambda: qlinear.quantize_linear(f, np.float32(0.05), U8(128)),
                  oracle.quantize_linear(f, np.float32(0.05), U8(128))))
    return cases


@needs_native
def test_same_bits_on_every_thread_count():
    for name, call, want in _cases():
        for n in THREAD_COUNTS:
            with _threads(n):
                got = call()
                assert_exact(got, want)
                assert_exact(call(), want)   # the second call: warm pool, repeat paths


@needs_native
def test_same_bits_with_a_busy_neighbour():
    cases = _cases()
    with _busy_neighbour():
        for n in (2, 3):
            with _threads(n):
                for _ in range(3):   # back to back: workers spinning, sleeping, preempted
                    for name, call, want in cases:
                        assert_exact(call(), want)


@needs_native
def test_pool_counts_the_jobs_it_hands_out():
    """pool_counts() (the diagnostic docs/engine.md names): a product past the one-thread limit
    goes to the workers on 2 threads, and runs on the caller alone on 1."""
    nat = _native.native()
    rng = np.random.default_rng(5)
    a, b = rand_int(rng, U8, (128, 256)), rand_int(rng, I8, (256, 256))
    want = oracle.matmul_integer(a, b, U8(1))
    for n, handed in ((2, True), (1, False)):
        with _threads(n):
            before = nat.pool_counts()
            assert_exact(qlinear.matmul_integer(a, b, U8(1)), want)
            after = nat.pool_counts()
        assert (after[0] > before[0]) == handed, (n, before, after)
        assert all(x >= y for x, y in zip(after, before))


@needs_native
def test_the_caller_takes_over_a_late_worker():
    """A worker that comes late to every job (pool_late_workers: it waits 300 ms after each
    job is posted, as one whose CPU another process holds) takes no task and holds up no call:
    the caller claims every task itself (the workers' task count does not move), each call ends
    long before the worker would join, and the results are the same bits. Fails for a pool that
    hands each thread a fixed share, or whose caller waits for every worker to join."""
    import time

    nat = _native.native()
    cases = _cases()
    late_s = 0.3
    with _threads(2):
        for _, call, want in cases:   # warm: the workers exist and have joined jobs
            assert_exact(call(), want)
        ran0 = nat.pool_late_workers(int(late_s * 1e6))
        try:
            time.sleep(0.05)   # any job still being joined ends
            ran1 = nat.pool_late_workers(int(late_s * 1e6))
            t0 = time.perf_counter()
            for _, call, want in cases:
                assert_exact(call(), want)
            elapsed = time.perf_counter() - t0
            ran2 = nat.pool_late_workers(int(late_s * 1e6))
        finally:
            nat.pool_late_workers(0)
    assert ran1 >= ran0
    assert ran2 == ran1, (ran1, ran2)
    assert elapsed < late_s * len(cases) / 2, elapsed
    # the pool is itself again: the workers take tasks. A worker may still be in the last
    # job's 300 ms wait, and on a loaded machine it may get no CPU for a while, so wait that
    # out and keep calling (up to 10 s) until a worker has run a task
    time.sleep(late_s + 0.05)
    with _threads(2):
        deadline = time.perf_counter() + 10.0
        while nat.pool_late_workers(0) == ran2 and time.perf_counter() < deadline:
            for _, call, want in cases:
                assert_exact(call(), want)
        assert nat.pool_late_workers(0) > ran2
