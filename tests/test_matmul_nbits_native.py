"""MatMulNBits' native kernels (qlinear/csrc/nbits): the same bits as the NumPy path of
qlinear.contrib.nbits (itself held to tests/oracle_nbits.py in test_matmul_nbits.py) on every ISA
level this CPU runs and on 1 and 2 threads, over bits × block sizes × zero-point kinds × g_idx ×
accuracy levels × float32/float16 A × bias, odd K and N tails (partial blocks, partial lines of
codes, column groups of 16, 32, 64 and tasks of 128) and M = 1, 2, 9, 130 (tiles of 8 rows, blocks of 128); special values on every level; the
prepared layouts; and the memory a call adds (resident set, which sees the C allocations)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import rss_probe

import oracle_nbits as oracle
from conftest import engine_level_params, num_threads
from qlinear import _native, contrib
from test_matmul_nbits import SPECIAL, make_case, same_bits

F32, F16 = np.float32, np.float16

pytestmark = pytest.mark.skipif(not _native.available(), reason="native engine not built")


def _cases():
    """(inputs, attrs, level) over the grid; M cycles through 1, 2, 7, 128 and N through
    1, 17, 37, 70 so that every combination meets several tails."""
    rng = np.random.default_rng(30)
    Ms, Ns = (1, 2, 9, 130), (1, 17, 37, 70)
    i = 0
    for bits in (2, 4, 8):
        for bs in (16, 32, 64, 128, 256):
            for zp_kind in ("none", "uint8", "float"):
                if bits == 8 and zp_kind == "float":
                    continue
                for level in (0, 4):
                    M, N = Ms[i % 4], Ns[(i // 4 + i) % 4]
                    K = bs * 2 + 5 if i % 3 else bs + 16 * (i % 5) + 1  # partial block and partial 16-group
                    if M == 130:
                        K = min(K, 300)
                    dtype = F16 if i % 5 == 2 else F32
                    g_idx = i % 7 == 3 and level == 0
                    inputs, attrs = make_case(rng, bits=bits, block_size=bs, zp_kind=zp_kind, g_idx=g_idx,
                                              dtype=dtype, M=M, K=K, N=N, bias=i % 4 != 1)
                    yield inputs, attrs, level
                    i += 1
    # wide N: tasks of several 32-column panels (64 and 128 columns on 1 and 2 threads), the
    # last one partial
    for bits, bs, zp_kind, g_idx, M, K in ((4, 32, "uint8", False, 20, 300), (2, 16, "float", True, 3, 77),
                                          (8, 64, "none", False, 1, 200), (4, 128, "float", False, 1, 259)):
        inputs, attrs = make_case(rng, bits=bits, block_size=bs, zp_kind=zp_kind, g_idx=g_idx, dtype=F32, M=M, K=K,
                                  N=520, bias=True)
        yield inputs, attrs, 0


CASES = list(_cases())
_WANT: dict = {}


def _want(idx):
    """The NumPy path's result (computed once per case)."""
    if idx not in _WANT:
        inputs, attrs, level = CASES[idx]
        with _native.use_engine("numpy"):
            _WANT[idx] = contrib.matmul_nbits(*inputs.values(), **attrs, accuracy_level=level)
    return _WANT[idx]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.values[0] != "numpy"], indirect=True)
def test_native_same_bits_as_numpy_path(engine_level, threads):
    with num_threads(threads):
        for idx, (inputs, attrs, level) in enumerate(CASES):
            got = contrib.matmul_nbits(*inputs.values(), **attrs, accuracy_level=level)
            try:
                same_bits(got, _want(idx))
            except AssertionError as exc:
                raise AssertionError(f"case {idx}: {attrs}, level {level}, M={inputs['A'].shape[0]}: {exc}") from None


def test_cases_cover_the_grid():
    """The grid above meets every M, every N tail, float16, g_idx and both arithmetic kinds."""
    Ms = {c[0]["A"].shape[0] for c in CASES}
    Ns = {c[1]["N"] for c in CASES}
    assert Ms >= {1, 2, 9, 130} and Ns == {1, 17, 37, 70, 520}
    assert any(c[0]["A"].dtype == F16 for c in CASES) and any(c[0]["g_idx"] is not None for c in CASES)
    kinds = {contrib.prepare_matmul_nbits(*list(c[0].values())[1:], **c[1], accuracy_level=c[2]).int8 for c in CASES}
    assert kinds == {True, False}


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.values[0] != "numpy"], indirect=True)
def test_native_special_values_match_oracle(engine_level):
    """Signed zeros, subnormals, code ties, blocks whose 127/amax overflows, huge values, ±inf and
    NaN, at every level against the plain oracle (rows of 1 and 3: the decode kernel and the
    panel path)."""
    rng = np.random.default_rng(31)
    pool = np.array(SPECIAL + [math.inf, -math.inf, math.nan], F32)
    for t in range(24):
        bits = (2, 4, 8)[t % 3]
        bs = (16, 32)[t % 2]
        zp_kind = ("none", "uint8", "float")[t % 3] if bits != 8 else ("none", "uint8")[t % 2]
        K = int(rng.integers(1, 2 * bs + 6))
        M = 1 if t % 2 else 3
        vals = np.where(rng.random((M, K)) < 0.5, rng.choice(pool[:-3] if t % 4 else pool, (M, K)),
                        rng.standard_normal((M, K))).astype(F32)
        with np.errstate(over="ignore"):
            A = vals.astype(F16 if t % 5 == 4 else F32)
        inputs, attrs = make_case(rng, bits=bits, block_size=bs, zp_kind=zp_kind, g_idx=t % 6 == 5, M=M, K=K, N=19,
                                  dtype=A.dtype, a=A, bias=t % 3 != 0)
        for level in (0, 4):
            got = contrib.matmul_nbits(*inputs.values(), **attrs, accuracy_level=level)
            same_bits(got, oracle.matmul_nbits(*inputs.values(), **attrs, accuracy_level=level))


def test_prepared_form_is_repacked_once_and_used():
    """prepare_matmul_nbits makes the kernels' layout once (codes at their bit width: no float32
    weights) and run() takes the native path (a patched-out kernel call would show)."""
    rng = np.random.default_rng(32)
    inputs, attrs = make_case(rng, bits=4, block_size=32, zp_kind="uint8", g_idx=False, M=1, K=256, N=64)
    A = inputs.pop("A")
    for level in (4, 0):
        p = contrib.prepare_matmul_nbits(*inputs.values(), **attrs, accuracy_level=level)
        nat = p._native
        arr = nat.w8  # one layout for both arithmetics
        assert arr.dtype == np.uint8 and arr.nbytes <= 64 * 256 // 2 + 64 * 16
        calls = []
        run = nat.run
        nat.run = lambda C, a: calls.append(1) or run(C, a)
        p.run(A)
        assert calls == [1]
        with _native.use_engine("numpy"):
            p.run(A)
        assert calls == [1]


CHILD = rss_probe.PRELUDE + r"""
import ctypes, json, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE (see test_memory.py)
import numpy as np
from qlinear import contrib
K = N = 4096
level, M = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
nb = K // 32
B = rng.integers(0, 256, (N, nb, 16), dtype=np.uint8)
s = rng.uniform(0.01, 0.1, (N, nb)).astype(np.float32)
z = rng.integers(0, 256, (N, nb // 2), dtype=np.uint8)
p = contrib.prepare_matmul_nbits(B, s, z, K=K, N=N, bits=4, block_size=32, accuracy_level=level)
A = rng.standard_normal((M, K)).astype(np.float32)
p.run(A)  # first-call work out of the way
before = reset_peak()
y = p.run(A)
print(json.dumps({"above": (status_kib("VmHWM") - before) * 1024 - y.nbytes, "f32_weights": 4 * K * N}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident-set probe needs Linux /proc")
@pytest.mark.parametrize("level, M", [(4, 1), (0, 1), (4, 128), (0, 128)])
def test_memory_native_no_float32_copy(level, M):
    """Peak resident memory a call adds above inputs, packed weights and output <= 5 % of the
    float32 weights (4096 x 4096: 64 MiB, so 3.2 MiB), the C scratch included (tracemalloc
    would not see it)."""
    env = dict(os.environ, QLINEAR_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", CHILD, str(level), str(M)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["above"] <= 0.05 * r["f32_weights"], r


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.values[0] != "numpy"], indirect=True)
def test_k_past_k_are_not_computed(engine_level):
    """A = -0 everywhere, weights > 0, K not a multiple of a line of codes (4·8/bits k) or of 16:
    every step is fma(-0, w, -0) = -0, so Y = -0. A kernel that ran the last, partial line of
    codes to its end with zero padding would add fma(+0, w, -0) = +0 and give Y = +0 (decode
    kernel: M = 1; panel: M = 3)."""
    for K in (17, 35, 47):
        for M in (1, 3):
            nb = -(-K // 16)
            B = np.full((5, nb, 8), 0x99, np.uint8)  # codes 9 > zero point 8: w = scale > 0
            scales = np.full((5, nb), 0.25, F32)
            A = np.full((M, K), -0.0, F32)
            y = contrib.matmul_nbits(A, B, scales, K=K, N=5, bits=4, block_size=16, accuracy_level=0)
            assert np.all(np.signbit(y)), (K, M, y)
            same_bits(y, oracle.matmul_nbits(A, B, scales, K=K, N=5, bits=4, block_size=16))


@pytest.mark.parametrize("engine_level", [p for p in engine_level_params() if p.values[0] != "numpy"], indirect=True)
def test_activation_quantization_edges_match_oracle(engine_level):
    """The int8 level's activation quantization (ql_nbits_qa_*: vectors of 16 or 8 values, a
    masked or scalar remainder) against the oracle: whole blocks whose 127 / amax overflows
    (every |a| below 3.7e-37: subnormals, ±0, 3e-37; the codes must be 0 there, not the
    conversion's invalid value), all-zero blocks, blocks of exact code ties (a · 127 / amax
    = n + 0.5: round half to even), and a lone NaN or ±inf (NaN rows); K with a partial last
    block and a partial vector (K % 16 and K % 8 not 0), M = 1 and 3."""
    rng = np.random.default_rng(33)
    tiny = np.array([1e-45, -1e-45, 1e-40, -3e-37, 3e-37, 0.0, -0.0, 2e-38], F32)
    ties = np.array([127.0, 0.5, -0.5, 1.5, -2.5, 63.5, -126.5, 3.5], F32)  # amax 127: inv 1, code = rne(a)
    for t, (bits, bs, K) in enumerate(((4, 16, 61), (4, 32, 100), (8, 64, 203), (2, 32, 77), (4, 128, 300))):
        M = 1 if t % 2 else 3
        A = rng.standard_normal((M, K)).astype(F32)
        nb = -(-K // bs)
        for b in range(nb):
            k0, k1 = b * bs, min(K, (b + 1) * bs)
            kind = (b + t) % 4
            if kind == 0:
                A[:, k0:k1] = rng.choice(tiny, (M, k1 - k0))
            elif kind == 1:
                A[:, k0:k1] = 0.0
            elif kind == 2:
                A[:, k0:k1] = rng.choice(ties, (M, k1 - k0))
                A[:, k0] = 127.0
        if M == 3:
            A[1, K // 2] = (math.nan, math.inf, -math.inf)[t % 3]
        for zp_kind in ("none", "uint8"):
            inputs, attrs = make_case(rng, bits=bits, block_size=bs, zp_kind=zp_kind, g_idx=False, M=M, K=K, N=37,
                                      a=A, bias=True)
            got = contrib.matmul_nbits(*inputs.values(), **attrs, accuracy_level=4)
            assert contrib.prepare_matmul_nbits(*list(inputs.values())[1:], **attrs, accuracy_level=4).int8
            same_bits(got, oracle.matmul_nbits(*inputs.values(), **attrs, accuracy_level=4))
