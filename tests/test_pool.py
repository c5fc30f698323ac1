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


# ---------------------------------------------------------------------------------------------
# The pool itself, independently of any kernel: pool_check runs jobs of counting tasks
# (runtime/pool_check.c) and reports tasks run other than once per job, calls that returned
# before their tasks were done and thread indices out of range.
# ---------------------------------------------------------------------------------------------

def _run_isolated(code: str, timeout: float = 120.0) -> str:
    """Runs `code` in a fresh interpreter and returns its output; a hang fails the test (the
    timeout) instead of hanging the suite."""
    import os
    import textwrap

    env = dict(os.environ, QLINEAR_REQUIRE_NATIVE="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@needs_native
@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_every_task_once_and_thread_indices_in_range(threads):
    nat = _native.native()
    with _threads(threads):
        for max_threads in sorted({1, 2, threads, 8}):
            for n in (1, 2, 3, 7, 64, 1000):
                bad, top = nat.pool_check(n, max_threads, 20, 0, 0, 0)
                assert bad == 0, (threads, max_threads, n, bad)
                assert top < max(1, min(max_threads, threads, n)), (threads, max_threads, n, top)
            # tasks long enough that the workers join: indices still below the call's limit
            bad, top = nat.pool_check(4 * threads, max_threads, 3, 0, 200, 0)
            assert bad == 0 and top < max(1, min(max_threads, threads)), (threads, max_threads, bad, top)


@needs_native
def test_many_small_calls():
    """20,000 calls of a few tiny tasks each on 2 threads (the workers spinning, joining late,
    missing jobs): each task once per call, nothing lost, no hang."""
    out = _run_isolated("""
        import qlinear
        from qlinear import _native
        nat = _native.native()
        qlinear.set_num_threads(2)
        bad = 0
        for n in (2, 3, 5, 9):
            bad += nat.pool_check(n, 2, 5000, 0, 0, 0)[0]
        print(bad)
    """)
    assert out.split() == ["0"]


@needs_native
def test_nested_calls_run_inline():
    """A task that itself calls the pool (the pool busy with the outer job) runs its tasks on its
    own thread: every inner task once, no deadlock."""
    nat = _native.native()
    for threads in (2, 3):
        with _threads(threads):
            bad, top = nat.pool_check(16, threads, 4, 8, 50, 0)
            assert bad == 0, bad
            assert top < threads


@needs_native
def test_concurrent_calls_from_two_python_threads():
    """Two Python threads calling at once (the GIL released in each call): one gets the pool,
    the other runs its tasks itself; both exact, no hang, for pool_check and a real kernel."""
    out = _run_isolated("""
        import threading
        import numpy as np
        import qlinear
        from qlinear import _native
        import oracle
        from conftest import I8, U8, rand_int
        nat = _native.native()
        qlinear.set_num_threads(2)
        rng = np.random.default_rng(3)
        a, b = rand_int(rng, U8, (96, 320)), rand_int(rng, I8, (320, 256))
        want = oracle.matmul_integer(a, b, U8(3))
        errors = []
        def run(k):
            try:
                for i in range(40):
                    bad, _ = nat.pool_check(64, 2, 2, 0, 5 * (k + 1), 0)
                    if bad:
                        errors.append(("pool_check", k, i, bad))
                    if not np.array_equal(qlinear.matmul_integer(a, b, U8(3)), want):
                        errors.append(("matmul_integer", k, i))
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(len(errors), errors[:3])
    """.replace("import oracle", "import sys; sys.path.insert(0, %r); import oracle" % str(__import__("pathlib").Path(__file__).parent)))
    assert out.split()[0] == "0", out


@needs_native
def test_the_pool_after_fork():
    """A child forked after the pool ran (multiprocessing's fork start method) rebuilds it: its
    calls run on threads again, exact, without hanging on the parent's workers."""
    out = _run_isolated("""
        import os
        import qlinear
        from qlinear import _native
        nat = _native.native()
        qlinear.set_num_threads(2)
        assert nat.pool_check(64, 2, 3, 0, 20, 0)[0] == 0
        pid = os.fork()
        if pid == 0:
            ok = nat.pool_check(64, 2, 20, 0, 20, 0)[0] == 0 and nat.pool_check(5, 2, 2000, 0, 0, 0)[0] == 0
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), nat.pool_check(64, 2, 3, 0, 20, 0)[0])
    """)
    assert out.split() == ["0", "0"], out


@needs_native
def test_resizing_the_pool():
    """set_num_threads stops and starts workers between calls: the workers' count follows."""
    import time

    nat = _native.native()
    for threads in (4, 1, 3, 2):
        with _threads(threads):
            assert nat.pool_check(32, threads, 3, 0, 100, 0)[0] == 0
            time.sleep(0.02)   # the new workers record their thread ids when they start
            assert len(nat.pool_worker_tids()) == threads - 1, (threads, nat.pool_worker_tids())


@needs_native
@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity") or len(__import__("os").sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU sets of at least 2 CPUs")
def test_a_worker_off_its_cpu_mid_task_gets_the_callers_cpu_and_gives_it_back():
    """A worker that is off its CPU inside a task (here: the task sleeps 3 ms on a worker, as one
    that another process preempted) holds the call up; the caller, once it has run every other
    task, lends it its CPU (pool_counts()[5]) and blocks, and takes it back after: each task
    once, the call returns after the task is done, and every worker's CPU set is again what it
    was (a caller that left a worker pinned to its CPU fails this)."""
    import os
    import time

    nat = _native.native()
    with _threads(2):
        nat.pool_check(16, 2, 2, 0, 100, 0)
        time.sleep(0.02)
        tids = nat.pool_worker_tids()
        assert len(tids) == 1
        before = {t: os.sched_getaffinity(t) for t in tids}
        lent0 = nat.pool_counts()[5]
        deadline = time.perf_counter() + 10.0
        while nat.pool_counts()[5] == lent0 and time.perf_counter() < deadline:
            bad, _ = nat.pool_check(8, 2, 3, 0, 300, 3000)
            assert bad == 0
        assert nat.pool_counts()[5] > lent0, "the caller never lent its CPU to the sleeping worker"
        # a worker that spins on its caller's CPU narrows its set for a moment to move off it;
        # give such a move time to end (a set never given back still fails after 2 s)
        settle = time.perf_counter() + 2.0
        while {t: os.sched_getaffinity(t) for t in tids} != before and time.perf_counter() < settle:
            time.sleep(0.005)
        assert {t: os.sched_getaffinity(t) for t in tids} == before
