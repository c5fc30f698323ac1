"""The compiled engine (qlinear._qlnative): loading, engine and ISA selection, threads.

Selection, read once at import and changeable at run time:

- ``QLINEAR_ENGINE=native|numpy``: the engine (default: native when it was built);
- ``QLINEAR_ISA=amx|avx512vnni|avxvnni|avx2|scalar``: force an instruction-set level (default:
  the best this CPU runs); a level this CPU cannot run is an error;
- ``QLINEAR_NUM_THREADS=n`` or :func:`set_num_threads`: threads of the native engine
  (default: the CPUs this process may use, ``os.sched_getaffinity``);
- ``QLINEAR_REQUIRE_NATIVE=1``: importing qlinear fails if the native engine is missing (CI).

Without the native engine (no C compiler at install time), importing qlinear warns once
(RuntimeWarning; in the ``qlinear`` command a ``qlinear: warning:`` line) unless
``QLINEAR_ENGINE=numpy`` chose the NumPy engine on purpose.

The operators validate their inputs in Python, then hand this module's functions plain
buffers; the NumPy engine (qlinear._engine) stays as the fallback and as a cross-check.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

try:
    from . import _qlnative as _C  # type: ignore[attr-defined]
    _IMPORT_ERROR: str | None = None
except ImportError as exc:  # not built (no compiler at install time), or it does not load
    _C = None
    _here = os.path.dirname(os.path.abspath(__file__))
    if not any(name.startswith("_qlnative") for name in os.listdir(_here)):
        _IMPORT_ERROR = (f"the extension qlinear._qlnative was not built in {_here} (no working C "
                         "compiler when qlinear was installed: reinstall with one to get the native "
                         "engine; or this is a source checkout imported without building it in place: "
                         "`pip install -e .` there, or import the installed qlinear from another folder)")
    else:
        _IMPORT_ERROR = f"the extension qlinear._qlnative does not load: {exc}"

ENGINES = ("native", "numpy")
ISA_LEVELS = ("amx", "avx512vnni", "avxvnni", "avx2", "scalar")

#: The engine's limits and codes, read from it (``_qlnative.limits()``: the values of its C
#: headers, qlinear/csrc/include), never copied by hand: conv_max_rank, dw_cl_max_taps, max_dim,
#: conv_kinds, kernels, types. Without the engine nothing is ever handed to C, so the codes are
#: placeholders then, distinct so that the kinds stay apart, and the limits 0.
LIMITS: dict = _C.limits() if _C is not None else {
    "conv_max_rank": 0, "dw_cl_max_taps": 0, "max_dim": 0,
    "conv_kinds": {"gemm": -1, "depthwise": -2, "gemm_fast": -3},
    "kernels": {"exact": -1, "fast": -2, "conv_fast": -3},
    "types": {"uint8": -1, "int8": -2, "int32": -3, "float32": -4},
}
# type codes of qlinear.h (QL_U8, QL_I8, QL_I32, QL_F32)
TYPE_CODES = dict(LIMITS["types"])
# the same keyed by dtype objects (dtype.name builds a string on every use: per-call cost)
DTYPE_CODES = {np.dtype(name): code for name, code in TYPE_CODES.items()}



def available() -> bool:
    """True when the compiled engine was built and loads."""
    return _C is not None


def _isas() -> list[str]:
    return list(_C.info()["isas"]) if _C is not None else []


def _check_engine(name: str, source: str) -> str:
    if name not in ENGINES:
        raise ValueError(f"qlinear: {source} must be one of {', '.join(ENGINES)}; got {name!r}")
    if name == "native" and _C is None:
        raise ValueError(f"qlinear: {source} is 'native' but the native engine is not built ({_IMPORT_ERROR})")
    return name


def _check_isa(name: str, source: str) -> str:
    if _C is None:
        raise ValueError(f"qlinear: {source}={name!r} needs the native engine, which is not built ({_IMPORT_ERROR})")
    if name not in ISA_LEVELS:
        raise ValueError(f"qlinear: {source} must be one of {', '.join(ISA_LEVELS)}; got {name!r}")
    runs = _isas()
    if name not in runs:
        raise ValueError(f"qlinear: {source}={name!r}: this CPU cannot run that level; it runs {', '.join(runs)}")
    return name


def _positive_threads(n: Any, source: str) -> int:
    # a NumPy integer is an integer too (set_workspace_limit takes them); bools are not counts
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 1024:
        raise ValueError(f"qlinear: {source} must be an integer in [1, 1024]; got {n!r}")
    return int(n)


def _in_the_command() -> bool:
    """True when this process is the ``qlinear`` command (its console script, or
    ``python -m qlinear``): qlinear is then imported before the command's own error handling
    exists, so a bad QLINEAR_* variable is reported here, in the command's format."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if len(argv) >= 3 and argv[1:3] == ["-m", "qlinear"]:
        return True
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("qlinear", "qlinear.exe")


_engine = "native" if _C is not None else "numpy"
_threads_numpy: int | None = None  # set_num_threads without the native engine: remembered only
try:
    # "1" requires the engine; "0" or unset does not; anything else ("2", "yes") would have been
    # silently ignored, so a CI that asks for the engine believed it got it
    _require = os.environ.get("QLINEAR_REQUIRE_NATIVE", "").strip()
    if _require not in ("", "0", "1"):
        raise ValueError(f"qlinear: QLINEAR_REQUIRE_NATIVE must be 0 or 1; got {_require!r}")
    if _require == "1" and _C is None:
        raise ImportError(f"qlinear: QLINEAR_REQUIRE_NATIVE=1 but the native engine is not built: {_IMPORT_ERROR}")
    if os.environ.get("QLINEAR_ENGINE"):
        _engine = _check_engine(os.environ["QLINEAR_ENGINE"].strip(), "QLINEAR_ENGINE")
    # read whether or not the native engine is built: a level is an error without it (none
    # runs), and the thread count is remembered as set_num_threads remembers it
    if os.environ.get("QLINEAR_ISA"):
        _env_isa = _check_isa(os.environ["QLINEAR_ISA"].strip(), "QLINEAR_ISA")
        _C.set_isa(_env_isa)
    if os.environ.get("QLINEAR_NUM_THREADS"):
        _env_threads = os.environ["QLINEAR_NUM_THREADS"].strip()
        _env_count = _positive_threads(int(_env_threads) if _env_threads.isascii() and _env_threads.isdigit()
                                       else _env_threads, "QLINEAR_NUM_THREADS")
        if _C is not None:
            _C.set_threads(_env_count)
        else:
            _threads_numpy = _env_count
except ValueError as _env_error:
    if not _in_the_command():
        raise  # importing qlinear fails with the one-sentence ValueError
    # the command's convention for bad input: one line, exit status 2, no traceback
    sys.stderr.write("qlinear: error: " + str(_env_error).removeprefix("qlinear: ") + "\n")
    raise SystemExit(2) from None
if _C is None and not os.environ.get("QLINEAR_ENGINE", "").strip():
    # pip shows a build's output only when it fails (or with -v), so setup.py's warning that
    # the engine could not be built reaches nobody: the first import says it instead, unless
    # the NumPy engine was chosen on purpose
    _missing = (f"qlinear: the native engine is not built ({_IMPORT_ERROR}); running on the NumPy engine, "
                "exact but much slower. QLINEAR_ENGINE=numpy chooses it and silences this warning")
    if _in_the_command():
        sys.stderr.write("qlinear: warning: " + _missing.removeprefix("qlinear: ") + "\n")
    else:
        import warnings
        warnings.warn(_missing, RuntimeWarning, stacklevel=2)


def engine() -> str:
    """The selected engine: "native" or "numpy"."""
    return _engine


def isa() -> str | None:
    """The selected ISA level of the native engine (None when it is not built)."""
    return _C.get_isa() if _C is not None else None


def native() -> Any:
    """The compiled module when the native engine is selected, else None."""
    return _C if _engine == "native" else None


def set_engine(name: str) -> None:
    """Select the engine ("native" or "numpy") for subsequent calls."""
    global _engine
    _engine = _check_engine(name, "engine")


def set_isa(name: str) -> None:
    """Select the native engine's ISA level (one this CPU runs)."""
    _C.set_isa(_check_isa(name, "isa"))


def set_num_threads(n: int) -> None:
    """Threads the native engine uses per call (default: the CPUs this process may use)."""
    global _threads_numpy
    value = _positive_threads(n, "set_num_threads(n)")
    if _C is not None:
        _C.set_threads(value)
    else:
        _threads_numpy = value


def get_num_threads() -> int:
    """Threads the native engine uses per call."""
    if _C is not None:
        return int(_C.get_threads())
    if _threads_numpy:
        return _threads_numpy
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# outputs from this many bytes on come from outbuf.c (pooled from _POOL_MIN on), 64-byte
# aligned: NumPy's (malloc's) large blocks start 16 bytes into a page, so a 64-byte row store of
# a matmul epilogue would span two cache lines (int32 outputs, one thread, 24 Nov 2026: 3-5%
# slower misaligned on the amx level, 1.5% on avx512vnni; 8-bit outputs: no difference). About 0.4 us
# a call, so only for outputs whose computation takes tens of microseconds.
_ALIGN_MIN = 1 << 18
_POOL_MIN = 1 << 20  # outputs from this many bytes on come from the pool (outbuf.c's POOL_MIN)


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized output array, like numpy.empty.

    With the native engine, outputs of 256 KiB or more are 64-byte aligned, and those of 1 MiB
    or more live in memory from a bounded pool
    (qlinear/csrc/python/outbuf.c, at most 8 blocks and 256 MiB kept): when the array and every
    view of it are gone, the memory goes back to the pool and the next output of about the
    same size reuses it, without the page faults and zeroing of fresh memory (a 64 MiB output
    costs about as much to fault in as to compute). The array is an ordinary writable
    ndarray whose ``base`` is the buffer object.
    """
    dt = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dt.itemsize
    if _C is None or nbytes < _ALIGN_MIN:
        return np.empty(shape, dt)
    return np.frombuffer(_C.empty(nbytes), dtype=dt, count=count).reshape(shape)


def engine_info() -> dict[str, Any]:
    """What runs: ``engine``, ``isa`` (selected level), ``isas`` (every level this CPU runs,
    best first), ``threads``, and for the native engine ``compiled``, ``cpu_flags``,
    ``compiler``, ``emulated`` (a SIMDe test build); ``native_error`` when it is not built."""
    info: dict[str, Any] = {"engine": _engine, "native_available": _C is not None}
    if _C is None:
        info.update(isa=None, isas=[], threads=get_num_threads(), native_error=_IMPORT_ERROR)
        return info
    c = _C.info()
    info.update(isa=_C.get_isa(), isas=list(c["isas"]), threads=int(c["threads"]), compiled=c["compiled"],
                cpu_flags=c["cpu_flags"], compiler=c["compiler"], emulated=bool(c["emulated"]))
    return info


@contextmanager
def use_engine(name: str) -> Iterator[None]:
    """Temporarily select an engine (tests, benchmarks)."""
    global _engine
    saved = _engine
    set_engine(name)
    try:
        yield
    finally:
        _engine = saved


@contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Temporarily select the native engine and an ISA level (tests, benchmarks)."""
    global _engine
    saved_engine, saved_isa = _engine, _C.get_isa() if _C is not None else None
    _check_engine("native", "engine")
    set_isa(name)   # a refused level raises here, before anything changed
    _engine = "native"
    try:
        yield
    finally:
        _engine = saved_engine
        _C.set_isa(saved_isa)
