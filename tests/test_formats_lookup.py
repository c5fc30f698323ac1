"""The decode of float4 and float6 codes held in vector registers (csrc/isa/formats_avx2.c and
formats_avx512.c: vpermps / vpermt2ps by the code's low bits instead of a gather) against the
registry's table, at every ISA level this CPU runs: every code, runs whose length leaves tails,
and bytes with bits set above the format's width (a uint8 array viewed as the format), which
the permutes alone would fold onto a valid code: those lanes must still read the table."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear import _native, dtypes

FORMATS = [ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e4m3fn]


def _levels():
    if not _native.available():
        return []
    return _native.engine_info()["isas"]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: np.dtype(f).name)
@pytest.mark.parametrize("garbage", [False, True])
def test_decode_is_the_table_at_every_level(fmt, garbage):
    levels = _levels()
    if not levels:
        pytest.skip("native engine not built")
    t = dtypes.lookup(np.dtype(fmt))
    table = t.fmt.table
    width = int(t.fmt.sign_bit) * 2
    rng = np.random.default_rng(31)
    for n in (1, 15, 16, 17, 63, 64, 100, 1000, 4099):
        codes = rng.integers(0, 256 if garbage else width, n).astype(np.uint8)
        if garbage and n >= 16:
            codes[:16] = np.arange(16) * 16 + 15  # every high nibble over code 15
        if n >= width:
            codes[-width:] = np.arange(width)  # every code, in the last vector(s)
        x = codes.view(fmt)
        want = table[codes] * np.float32(0.5)  # exact: a power of two
        for isa in levels:
            with _native.use_isa(isa):
                for scale in (np.float32(0.5), np.full(n, 0.5, np.float32)):
                    kw = dict(axis=0) if np.ndim(scale) else {}
                    got = qlinear.dequantize_linear(x, scale, None, **kw)
                    assert got.dtype == np.float32
                    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (isa, n)
