"""Float matrix products of the backend's float operators (Conv): OpenBLAS single-threaded
while a model runs, large products split over a few Python threads instead.

Why. qlinear's compiled engine has its own thread pool, onnxruntime (often in the same
process, for a comparison) has its own, and OpenBLAS keeps its worker threads spinning for a
while after each call. On the 2-core benchmark machine a float Conv between quantized layers
(QDQ models keep some Convs float, as onnxruntime does) took 10-15 ms instead of 0.3 ms when
OpenBLAS's statically split threads had to wait for a core held by another pool's spinning
thread: a QDQ MobileNetV2 ran in 270 ms with OpenBLAS's threads and 78 ms single-threaded
(same load). A product split into row blocks claimed by the caller and one helper thread
(NumPy releases the GIL inside ``matmul``) degrades gracefully under load instead.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_lock = threading.Lock()
_handle: tuple | None | bool = False  # False: not looked up yet; None: no OpenBLAS found
_users = 0
_saved = 1
_pool: ThreadPoolExecutor | None = None

#: A product is split over threads from this many multiply-adds on (below, one thread's
#: SGEMM takes well under 0.1 ms and the hand-off would cost more than it saves).
SPLIT_MIN_MACS = 1 << 21


def _openblas_libraries() -> list:
    """The OpenBLAS libraries mapped into this process (Linux ``/proc/self/maps``), opened with
    ctypes, in path order; empty where there is no such file or library."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    libs = []
    for path in sorted(paths):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


def _find_openblas() -> tuple | None:
    """(set_num_threads, get_num_threads) of the OpenBLAS NumPy uses, through ctypes: the
    library mapped into this process (Linux ``/proc/self/maps``), under the symbol names of
    scipy-openblas (NumPy's wheels) or a plain OpenBLAS. None when there is none."""
    for lib in _openblas_libraries():
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""),
                               ("openblas", "64_"), ("openblas", "")):
            try:
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}")
            except AttributeError:
                continue
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            return setter, getter
    return None


@functools.cache
def dgemm() -> tuple[int, bool] | None:
    """(address, ilp64) of the ``cblas_dgemm`` of the OpenBLAS NumPy uses (ilp64: its integers
    are 64-bit, which the build's configuration string says: ``USE64BITINT``), for compiled code
    that calls it single-threaded on its own threads (qlinear/_fmatmul.py); None when there is
    no OpenBLAS or its integer width cannot be told."""
    for lib in _openblas_libraries():
        for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            try:
                fn = getattr(lib, f"{prefix}cblas_dgemm{suffix}")
                config = getattr(lib, f"{prefix}openblas_get_config{suffix}")
            except AttributeError:
                continue
            config.argtypes, config.restype = [], ctypes.c_char_p
            words = (config() or b"").split()
            return ctypes.cast(fn, ctypes.c_void_p).value, b"USE64BITINT" in words
    return None


def _openblas():
    global _handle
    if _handle is False:
        _handle = _find_openblas()
    return _handle


@functools.cache
def threads() -> int:
    """Threads a split product uses: the CPUs this process may run on, at most 2 helpers'
    worth (the products here are a few MFLOP; more threads only add hand-off cost)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


class _SingleThreaded:
    """The context manager :func:`single_threaded` returns (one object, re-entrant: the count
    of users is global). A class rather than a ``@contextmanager`` generator: the backend
    enters it on every run, and the generator's machinery cost more than the rest of a small
    model's run overhead."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _users, _saved
        h = _handle if _handle is not False else _openblas()
        if h is None:
            return
        with _lock:
            if _users == 0:
                _saved = max(1, int(h[1]()))
                if _saved > 1:
                    h[0](1)
            _users += 1

    def __exit__(self, *exc) -> None:
        global _users
        h = _handle
        if not h:
            return
        with _lock:
            _users -= 1
            if _users == 0 and _saved > 1:
                h[0](_saved)


_SINGLE_THREADED = _SingleThreaded()


def single_threaded() -> _SingleThreaded:
    """Within (``with single_threaded():``): OpenBLAS runs single-threaded (re-entrant;
    restored when the last user leaves). Without an OpenBLAS that exposes its thread setting,
    a no-op."""
    return _SINGLE_THREADED


def batched_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` of stacks ``a`` (G, M, K) and ``b`` (G, K, N) (a grouped Conv's products):
    inside :func:`single_threaded`, large stacks are split into blocks of whole entries over the
    threads, every entry an ordinary SGEMM as ``np.matmul`` computes it."""
    g, m, k = a.shape
    n = b.shape[2]
    nt = threads()
    if nt <= 1 or _users == 0 or g < 2 or g * m * k * n < SPLIT_MIN_MACS:
        return np.matmul(a, b)
    out = np.empty((g, m, n), np.result_type(a, b))
    tiles = min(g, 2 * nt)
    bounds = [g * i // tiles for i in range(tiles + 1)]
    _run_tiles(tiles, nt, lambda i: np.matmul(a[bounds[i]:bounds[i + 1]], b[bounds[i]:bounds[i + 1]],
                                              out=out[bounds[i]:bounds[i + 1]]))
    return out


def _run_tiles(tiles: int, nt: int, fn) -> None:
    """fn(i) for i in range(tiles), claimed one at a time by the caller and nt - 1 helpers."""
    global _pool
    claim = iter(range(tiles))
    claim_lock = threading.Lock()

    def work() -> None:
        while True:
            with claim_lock:
                i = next(claim, None)
            if i is None:
                return
            fn(i)

    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="qlinear-blas")
        pool = _pool
    helpers = [pool.submit(work) for _ in range(nt - 1)]
    try:
        work()
    finally:
        for h in helpers:
            h.result()


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D float arrays; a large product inside :func:`single_threaded` is split
    into row blocks of ``a`` (or column blocks of ``b`` when ``a`` has few rows) computed
    concurrently. Each block is an ordinary SGEMM on its rows, so every output element is the
    same dot product as without the split (BLAS may block K differently by shape, so results
    agree with an unsplit product within float rounding, as any two BLAS calls do)."""
    m, k = a.shape
    n = b.shape[1]
    nt = threads()
    if nt <= 1 or _users == 0 or m * k * n < SPLIT_MIN_MACS:
        return np.matmul(a, b)
    out = np.empty((m, n), np.result_type(a, b))
    by_rows = m >= 32 * nt
    length = m if by_rows else n
    tiles = 2 * nt  # claimed one at a time: a thread slowed by other load takes fewer
    bounds = [length * i // tiles for i in range(tiles + 1)]

    def block(i: int) -> None:
        s = slice(bounds[i], bounds[i + 1])
        if by_rows:
            np.matmul(a[s], b, out=out[s])
        else:
            out[:, s] = np.matmul(a, b[:, s])

    _run_tiles(tiles, nt, block)
    return out


def split_channels(channels: int, work: int, fn) -> None:
    """fn(c0, c1) over blocks of channels [0, channels): inside :func:`single_threaded` and with
    ``work`` (element operations) large enough, blocks are claimed by the caller and helper
    threads (NumPy releases the GIL inside ufuncs on large arrays); else one call."""
    nt = threads()
    if nt <= 1 or _users == 0 or channels < 2 or work < SPLIT_MIN_MACS:
        fn(0, channels)
        return
    tiles = min(channels, 2 * nt)
    bounds = [channels * i // tiles for i in range(tiles + 1)]
    _run_tiles(tiles, nt, lambda i: fn(bounds[i], bounds[i + 1]))
