"""Shared helpers for the qlinear test suite (the oracle lives in oracle.py)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

import qlinear

U8, I8, I32 = np.uint8, np.int8, np.int32
DTYPES_8 = (U8, I8)
ALL_8BIT_COMBOS = [(x, w, y) for x in DTYPES_8 for w in DTYPES_8 for y in DTYPES_8]


@contextmanager
def num_threads(n: int):
    """qlinear's engine runs on n threads inside the block; the count before it is restored
    after, whatever the block raises."""
    saved = qlinear.get_num_threads()
    qlinear.set_num_threads(n)
    try:
        yield n
    finally:
        qlinear.set_num_threads(saved)


def rand_int(rng, dtype, shape, lo=None, hi=None):
    """Uniform integers of `dtype` in [lo, hi] (default: the dtype's full range)."""
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


def rand_extreme(rng, dtype, shape):
    """Values drawn only from the two ends of the dtype's range."""
    info = np.iinfo(dtype)
    return rng.choice(np.array([info.min, info.max], dtype=dtype), size=shape)


def rand_scale(rng, shape=(), lo=1e-3, hi=5e-2):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def assert_exact(got, want):
    """Bit-for-bit equality, same dtype, same shape."""
    assert isinstance(got, np.ndarray), f"result is {type(got).__name__}, not ndarray"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        # compare bit patterns: distinguishes -0.0 from 0.0 and checks NaN payload-free equality
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        np.testing.assert_array_equal(got.view(bits), want.view(bits))
    else:
        np.testing.assert_array_equal(got, want)


def call_untouched(fn, *args, **kwargs):
    """fn(*args, **kwargs), checking that no array argument was modified in place."""
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else None for a in args]
    result = fn(*args, **kwargs)
    for i, (a, b) in enumerate(zip(args, before)):
        if b is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), \
                f"{fn.__name__} modified argument {i} in place"
    return result


# ------------------------------------------------------------------------------------------
# Engines and ISA levels: the matmul and quantize suites run on the NumPy engine and on the
# native engine at every ISA level this CPU runs; the other levels are skipped, named.
# ------------------------------------------------------------------------------------------

def shared_models_dir() -> "str | None":
    """The folder of real quantized models (``shared/models``): $QLINEAR_MODELS if set, else
    ``<repo>/../shared/models`` (how the project's machines lay it out), else
    ``/work/shared/models``; None when none exists (the tests using it then skip)."""
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [os.environ.get("QLINEAR_MODELS"),
                  os.path.join(os.path.dirname(repo), "shared", "models"), "/work/shared/models"]
    for d in candidates:
        if d and os.path.isdir(d):
            return d
    return None

import pytest  # noqa: E402

from qlinear import _native  # noqa: E402

ISA_LEVELS = ("amx", "avx512vnni", "avxvnni", "avx2", "scalar")
# modules whose every test runs per engine level, and test_properties' matmul/quantize tests
ENGINE_MODULES = {"test_matmul", "test_quantize", "test_native", "test_conv", "test_plain", "test_formats_prepared",
                  "test_f8mm", "test_gemv"}


def engine_level_params():
    params = [pytest.param("numpy", id="numpy")]
    runs = _native.engine_info()["isas"]
    for isa in ISA_LEVELS:
        if not _native.available():
            reason = f"native engine not built: {_native.engine_info().get('native_error')}"
        elif isa not in runs:
            reason = f"this CPU cannot run {isa} (it runs {', '.join(runs)})"
        else:
            reason = None
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(f"native-{isa}", id=f"native-{isa}", marks=marks))
    return params


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    name = metafunc.function.__name__
    wanted = module in ENGINE_MODULES or (
        module == "test_properties" and ("matmul" in name or "quantize" in name or "conv" in name)) or (
        module == "test_formats" and "engine" in name)
    if wanted and "engine_level" in metafunc.fixturenames:
        metafunc.parametrize("engine_level", engine_level_params(), indirect=True)


@pytest.fixture(autouse=True)
def engine_level(request):
    """The engine (and ISA level) a parametrized test runs on; None: the default engine."""
    level = getattr(request, "param", None)
    if level is None:
        yield None
    elif level == "numpy":
        with _native.use_engine("numpy"):
            yield level
    else:
        with _native.use_isa(level.split("-", 1)[1]):
            yield level
