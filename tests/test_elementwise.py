"""The NumPy engine's blocked element-wise passes give the bits of the oracle on every block layout.

Tensors large enough for several blocks, in each (pre, C, post) shape the blocking
distinguishes: post longer than a block, channels spanning blocks, many small rows. (The
native engine's Quantize/Dequantize are checked in test_native.py and test_quantize.py.)
"""

import warnings

import numpy as np
import pytest

import oracle
import qlinear
from conftest import assert_exact, rand_int
from qlinear import _elementwise, _native


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """The NumPy engine, with blocks of 64 Ki elements, so that every layout below is cut into
    many blocks (the default needs tensors 16x larger)."""
    monkeypatch.setattr(_elementwise, "BLOCK", 1 << 16)
    with _native.use_engine("numpy"):
        yield


LAYOUTS = [
    ((2, 3, 300_000), 1),     # post >= BLOCK: blocks cut inside one channel's run
    ((2, 300, 1_000), 1),     # C * post >= BLOCK: blocks of whole channels
    ((25_000, 3, 10), 1),     # many small rows: blocks of whole rows
    ((600_000,), None),       # per tensor
    ((8, 7, 10_000), -1),     # per axis on the last axis
]


def _params(rng, shape, axis, dtype):
    if axis is None:
        return np.float32(rng.uniform(0.01, 2)), dtype(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max))
    n = shape[axis]
    return (rng.uniform(0.01, 2, n).astype(np.float32), rand_int(rng, dtype, (n,)))


@pytest.mark.parametrize("shape,axis", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_blocked_equals_oracle(shape, axis, dtype):
    rng = np.random.default_rng(7)
    assert np.prod(shape) >= 8 * _elementwise.BLOCK  # several blocks
    x = (rng.standard_normal(shape) * 200).astype(np.float32)
    flat = x.reshape(-1)
    flat[::9973] = np.nan
    flat[1::7919] = np.inf
    flat[2::7907] = -np.inf
    flat[3::101] = 0.5  # ties
    scale, zp = _params(rng, shape, axis, dtype)
    kw = {} if axis is None else {"axis": axis}
    assert_exact(qlinear.quantize_linear(x, scale, zp, **kw), oracle.quantize_linear(x, scale, zp, **kw))


@pytest.mark.parametrize("shape,axis", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_dequantize_blocked_equals_oracle(shape, axis, dtype):
    rng = np.random.default_rng(8)
    x = rand_int(rng, dtype, shape)
    scale, zp = _params(rng, shape, axis, np.uint8 if dtype == np.int32 else dtype)
    if dtype == np.int32:
        zp = None
    kw = {} if axis is None else {"axis": axis}
    assert_exact(qlinear.dequantize_linear(x, scale, zp, **kw), oracle.dequantize_linear(x, scale, zp, **kw))


def test_non_contiguous_input():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((600, 800)) * 50).astype(np.float32)[::2, ::-3]
    assert_exact(qlinear.quantize_linear(x, np.float32(0.3), np.int8(5)),
                 oracle.quantize_linear(x, np.float32(0.3), np.int8(5)))


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_requantization_blocked_equals_oracle(per_channel):
    """A convolution output large enough for several requantization blocks,
    per-tensor and per-channel (the multiplier runs along the blocks' channel axis)."""
    rng = np.random.default_rng(10)
    x = rand_int(rng, np.uint8, (2, 3, 300, 300))
    w = rand_int(rng, np.int8, (6, 3, 1, 1))
    m = 6 if per_channel else 1
    w_scale = rng.uniform(0.001, 0.05, m).astype(np.float32)
    w_zp = rand_int(rng, np.int8, (m,))
    b = rng.integers(-3000, 3000, 6).astype(np.int32)
    args = (x, np.float32(0.02), np.uint8(120), w, w_scale, w_zp, np.float32(0.05), np.int8(-3), b)
    got = qlinear.qlinear_conv(*args)
    assert got.size >= 8 * _elementwise.BLOCK
    assert_exact(got, oracle.qlinear_conv(*args))


def test_overflow_saturates_silently_in_every_block():
    """Overflow to inf saturates silently in every block (the operator's
    ``errstate(over="ignore")`` covers them all): no warning, even when warnings are errors."""
    x = np.full(1 << 18, 3e38, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = qlinear.quantize_linear(x, np.float32(1e-3), np.int8(0))
        deq = qlinear.dequantize_linear(np.full(1 << 18, 100, np.int8), np.float32(3e38), np.int8(-100))
    assert (got == 127).all()
    assert np.isinf(deq).all()
