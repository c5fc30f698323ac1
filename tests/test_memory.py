"""The workspace limit holds on a large convolution, measured from outside NumPy's accounting.

tracemalloc does not see the native engine's C allocations, so each case runs in a child
process that measures its peak resident set (VmHWM in /proc/self/status, the high-water mark
reset through /proc/self/clear_refs once the inputs exist) around one QLinearConv call.
(Not ``getrusage(...).ru_maxrss``: after fork and exec it also carries the parent's peak, the
size of the whole pytest process.) The peak above the resident set before the call, minus
the output, must
stay within the workspace limit (plus, on the NumPy engine, one image's float32 padded copy,
the floor of its tiling, and a fixed allowance for the interpreter's own noise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import rss_probe

from qlinear import _native

CHILD = rss_probe.PRELUDE + r"""
import ctypes, json, sys
# no transparent huge pages: with them, touching one byte of a 2 MiB-aligned region (a
# thread's malloc arena, say) makes 2 MiB resident, which is noise here, not workspace
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
import numpy as np
import qlinear
engine, limit, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
qlinear._native.set_engine(engine)
qlinear.set_workspace_limit(limit)
rng = np.random.default_rng(0)
# 2-D: 16 images of 64 channels 56x56; 3-D: 16 clips of 16 channels 8x40x40 (the implicit
# path's copy, 0.55 MiB an image, several images per GEMM up to the limit)
n, c, sp, m = (16, 64, (56, 56), 64) if rank == 2 else (16, 16, (8, 40, 40), 64)
x = rng.integers(0, 256, (n, c, *sp), dtype=np.uint8)
w = rng.integers(-128, 128, (m, c, *(3,) * rank), dtype=np.int8)
p = qlinear.prepare_qlinear_conv(w, np.float32(0.01), np.int8(0), pads=[1] * (2 * rank))
args = (np.float32(0.02), np.uint8(128), np.float32(4.0), np.uint8(128))
p.run(x[:1], *args)  # first-call work (packing, lazy imports) out of the way
before = reset_peak()
paths = qlinear._native._C.conv_path_counts() if engine == "native" else (0, 0)
y = p.run(x, *args)
peak = status_kib("VmHWM")
after = qlinear._native._C.conv_path_counts() if engine == "native" else (0, 0)
print(json.dumps({"above": (peak - before) * 1024 - y.nbytes, "output": y.nbytes,
                  "padded_image": 4 * c * int(np.prod([s + 2 for s in sp])), "accumulator": 4 * y.size,
                  "implicit": after[0] - paths[0]}))
"""

LIMIT = 4 << 20
NOISE = 3 << 20  # the interpreter's and allocator's own resident growth during a call


def _measure(engine: str, rank: int = 2) -> dict:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    env = dict(os.environ, QLINEAR_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", CHILD, engine, str(LIMIT), str(rank)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("rank", [2, 3])
def test_native_convolution_stays_within_the_workspace_limit(rank):
    """2-D and 3-D (a 3x3x3 kernel on 16 clips: the implicit path's copies of several images
    side by side, as many as the limit allows)."""
    if not _native.available():
        pytest.skip("the native engine is not built")
    got = _measure("native", rank)
    assert got["above"] <= LIMIT + NOISE, got
    if _native._C.get_isa() in ("avx2", "scalar"):
        assert got["implicit"] == 1, got   # the implicit path ran (its copies are what is bounded)


def test_numpy_convolution_stays_within_the_workspace_limit():
    got = _measure("numpy")
    # the whole float32 accumulator (12.8 MiB here) would not fit: images go in groups
    assert got["accumulator"] > LIMIT + got["padded_image"] + NOISE
    assert got["above"] <= LIMIT + got["padded_image"] + NOISE, got


def test_numpy_convolution_in_image_groups_is_exact(monkeypatch):
    """The NumPy engine's grouping of images under a small limit (several groups, a short last
    one) gives the oracle's bits, per-channel parameters and bias included."""
    import numpy as np

    import oracle
    import qlinear
    from conftest import assert_exact

    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (7, 5, 9, 9), dtype=np.uint8)
    w = rng.integers(-128, 128, (6, 5, 3, 3), dtype=np.int8)
    w_scale = rng.uniform(0.001, 0.02, 6).astype(np.float32)
    w_zp = rng.integers(-5, 5, 6).astype(np.int8)
    bias = rng.integers(-2**31, 2**31 - 1, 6, dtype=np.int64).astype(np.int32)
    args = (x, np.float32(0.03), np.uint8(120), w, w_scale, w_zp, np.float32(0.2), np.int8(-3), bias)
    saved = qlinear.workspace_limit()
    qlinear.set_workspace_limit(2 * 4 * 6 * 81 * 3)  # three images' accumulators per group
    try:
        with _native.use_engine("numpy"):
            got = qlinear.qlinear_conv(*args, pads=[1, 0, 1, 2])
    finally:
        qlinear.set_workspace_limit(saved)
    assert_exact(got, oracle.qlinear_conv(*args, pads=[1, 0, 1, 2]))


PADS_CHILD = rss_probe.PRELUDE + r"""
import ctypes, json, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
import numpy as np
import qlinear
qlinear._native.set_engine(sys.argv[1])
rank = int(sys.argv[2])
x = (np.arange(64 * 4 ** rank, dtype=np.int64) % 251).astype(np.uint8).reshape(1, 64, *(4,) * rank)
w = np.ones((8, 64, *(3,) * rank), np.int8)
attrs = dict(pads=[3000] * (2 * rank), strides=[3000] * rank)
qlinear.conv_integer(x, w, np.uint8(7))  # first-call work out of the way
before = reset_peak()
y = qlinear.conv_integer(x, w, np.uint8(7), **attrs)
print(json.dumps({"above": (status_kib("VmHWM") - before) * 1024, "shape": list(y.shape)}))
"""


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_no_padded_copy_on_either_engine(engine, rank):
    """pads and strides of 3000 around a 64-channel 4x4 image (3x3 kernel): a padded copy would
    take 64 x 6004² elements (2.3 GB as int8, 9 GB as float32), and a loop over the padded
    positions would take minutes. Both engines read only the 3x3 grid of windows. 3-D: a
    4x4x4 clip, 3x3x3 kernel (64 x 6004³ elements: 14 TB). (The values are checked against
    the oracle in test_hostile.py and test_conv.py.)"""
    if engine == "native" and not _native.available():
        pytest.skip("the native engine is not built")
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    out = subprocess.run([sys.executable, "-c", PADS_CHILD, engine, str(rank)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["shape"] == [1, 8, *(3,) * rank]
    assert got["above"] <= NOISE, got


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 9 (an acceptance audit of issue #9, the compiled engine)


_CONV_INTEGER_CHILD = rss_probe.PRELUDE + r"""
import ctypes, json, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE (see test_memory.py)
import numpy as np
import qlinear
qlinear._native.set_engine("numpy")
qlinear.set_workspace_limit(int(sys.argv[1]))
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (16, 64, 56, 56), dtype=np.uint8)
w = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)
p = qlinear.prepare_conv_integer(w, np.int8(1), pads=[1, 1, 1, 1])
p.run(x[:1], np.uint8(128))
before = reset_peak()
y = p.run(x, np.uint8(128))
print(json.dumps({"above": (status_kib("VmHWM") - before) * 1024 - y.nbytes, "output": y.nbytes,
                  "padded_image": 4 * 64 * 58 * 58}))
"""


def test_numpy_conv_integer_makes_no_second_output_sized_copy():
    """regression: The NumPy engine's ConvInteger accumulated in float32 (exact) and returned
    ``out.astype(np.int32)``: a second buffer the size of the whole output, outside the
    workspace limit (the issue's batch-64 224x224 3x3 64->64 layer: 784 MiB above the output
    with the limit at 256 MiB; here 12 MiB above a 4 MiB limit). The conversion now happens
    in place, a bounded block at a time."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    limit, noise = 4 << 20, 3 << 20
    out = subprocess.run([sys.executable, "-c", _CONV_INTEGER_CHILD, str(limit)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["above"] <= limit + got["padded_image"] + noise, got


_MATMUL_CHILD = rss_probe.PRELUDE + r"""
import ctypes, json, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE (see test_memory.py)
import numpy as np
import qlinear
qlinear._native.set_engine("numpy")
rng = np.random.default_rng(0)
m, k, n = 2048, 2048, 2048
a = rng.integers(0, 256, (m, k), dtype=np.uint8)
b = rng.integers(-128, 128, (k, n), dtype=np.int8)   # full range: K = 2048 takes 3 float32 chunks
p = qlinear.prepare_matmul_integer(b, np.int8(1))
p.run(a[:1], np.uint8(3))
before = reset_peak()
y = p.run(a, np.uint8(3))
print(json.dumps({"above": (status_kib("VmHWM") - before) * 1024 - y.nbytes,
                  "centered_a": 4 * m * k, "part": 4 * m * n}))
"""


def test_numpy_matmul_integer_chunks_make_no_extra_output_sized_copies():
    """regression: The NumPy engine's MatMulInteger added each float32 chunk as ``acc +=
    part.astype(np.int32)`` (and converted a one-chunk sum with astype): one more
    output-sized array than the sum needs, per call (16 MiB here). Now converted in the
    chunk's own memory: above the output, only the float32 centered copy of a, one float32
    chunk, and one BLAS thread's packing buffers (OpenBLAS: about 5 MiB measured; 8 allowed)."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # BLAS buffers of one thread
    out = subprocess.run([sys.executable, "-c", _MATMUL_CHILD], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["above"] <= got["centered_a"] + got["part"] + (8 << 20), got
