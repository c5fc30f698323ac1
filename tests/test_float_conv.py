"""The backend's float32 Conv on the native engine (qlinear/csrc/fconv/, elementwise/fconv.c):
the documented order of operations (docs/qdq.md, "Float Conv") bit for bit on every ISA level
and thread count, the float64 error bound that order implies, and the NumPy engine's
formulation within the same bound.

The oracle below is written from the documentation, not from the kernels: the zero-padded
input sliced per tap, and per output ``acc = +0.0``, then for each input channel of the group,
each kernel row, each kernel column in that order ``acc = acc + w * x`` (NumPy's float32
multiply, then its float32 add: two roundings), then ``acc + b``.
"""

from __future__ import annotations

import numpy as np
import pytest

from qlinear import _native
from qlinear._geometry import explicit_pads, window_output_sizes
from qlinear.graph.kernels import float as bf

F = np.float32
LEVELS = ("amx", "avx512vnni", "avxvnni", "avx2", "scalar")
#: the tile kernels each level uses (runtime/dispatch.c)
KERNELS = {"amx": "avx512", "avx512vnni": "avx512", "avxvnni": "avx2", "avx2": "avx2", "scalar": "portable"}


def _levels():
    runs = _native.engine_info()["isas"] if _native.available() else []
    return [pytest.param(isa, marks=[] if isa in runs else [pytest.mark.skip(
        reason=f"native engine not built or this CPU cannot run {isa}")]) for isa in LEVELS]


def _geometry(x, w, group, pads, strides, dilations):
    kernel = list(w.shape[2:])
    pb, pe = explicit_pads(list(x.shape[2:]), kernel, strides, dilations, "NOTSET", pads)
    out = window_output_sizes(list(x.shape[2:]), kernel, strides, dilations, pb, pe)
    return kernel, pb, pe, out


def oracle(x, w, b, group, pads, strides, dilations, dtype=F, absolute=False):
    """The documented order in ``dtype`` (``absolute``: the same sum of |w| * |x| and |b|)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    mg = m // group
    (kh, kw), pb, pe, (oh, ow) = _geometry(x, w, group, pads, strides, dilations)
    x, w = x.astype(dtype), w.astype(dtype)
    if absolute:
        x, w = np.abs(x), np.abs(w)
    xp = np.pad(x, ((0, 0), (0, 0), (pb[0], pe[0]), (pb[1], pe[1])))
    y = np.empty((n, m, oh, ow), dtype)
    for gi in range(group):
        acc = np.zeros((n, mg, oh, ow), dtype)
        for ci in range(cg):
            for ky in range(kh):
                for kx in range(kw):
                    r0, c0 = ky * dilations[0], kx * dilations[1]
                    tap = xp[:, gi * cg + ci, r0:r0 + strides[0] * (oh - 1) + 1:strides[0],
                             c0:c0 + strides[1] * (ow - 1) + 1:strides[1]]
                    wv = w[gi * mg:(gi + 1) * mg, ci, ky, kx]
                    acc = acc + wv[None, :, None, None] * tap[:, None]
        if b is not None:
            bv = b[gi * mg:(gi + 1) * mg].astype(dtype)
            acc = acc + (np.abs(bv) if absolute else bv)[None, :, None, None]
        y[:, gi * mg:(gi + 1) * mg] = acc
    return y


def _same_bits(got, want, what):
    """Equal bit patterns, NaN positions equal (a NaN's payload is the hardware's choice)."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), what
    assert got[~nan].tobytes() == want[~nan].tobytes(), what


def _cases():
    """(x shape, group, out channels per group, kernel, strides, dilations, pads, bias): 1x1
    (read in place, strided, padded), k x k dense and grouped, depthwise and channel
    multipliers, odd channel and column counts around the tiles (16 x 16, 6 x 16, 4 x 8), batch;
    the larger ones above the threading threshold."""
    return [((1, 64, 14, 14), 1, 24, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True),
            ((2, 33, 9, 11), 1, 17, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False),
            ((1, 12, 10, 10), 3, 5, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), True),
            ((1, 7, 5, 6), 1, 3, (1, 1), (1, 1), (1, 1), (1, 0, 2, 1), True),
            ((1, 96, 28, 28), 1, 40, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True),
            ((3, 5, 13, 9), 1, 31, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),
            ((1, 6, 11, 12), 2, 7, (3, 2), (2, 1), (1, 2), (2, 0, 1, 1), False),
            ((1, 256, 4, 5), 1, 6, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),
            ((2, 32, 20, 18), 1, 48, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True),
            ((1, 9, 8, 8), 9, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),
            ((1, 5, 9, 13), 5, 3, (3, 3), (2, 2), (2, 1), (1, 2, 0, 1), False),
            ((1, 64, 30, 40), 64, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True),
            ((1, 4, 1, 1), 1, 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True),
            ((1, 3, 4, 4), 1, 2, (5, 5), (3, 3), (1, 1), (2, 2, 2, 2), True)]


def _data(case):
    shape, g, mg, kernel, strides, dil, pads, bias = _cases()[case]
    rng = np.random.default_rng(1000 + case)
    x = rng.standard_normal(shape).astype(F)
    w = rng.standard_normal((g * mg, shape[1] // g, *kernel)).astype(F)
    b = rng.standard_normal(g * mg).astype(F) if bias else None
    return x, w, b, dict(group=g, strides=list(strides), dilations=list(dil), pads=list(pads))


def _specials(x, w, rng):
    """Signed zeros, infinities, NaN and values whose products overflow, in place."""
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 6)] = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38]
    w.reshape(-1)[0] = -0.0  # padding taps give -0.0 products: +0.0 + -0.0 is +0.0
    w.reshape(-1)[-1] = 2e38


@pytest.mark.parametrize("isa", _levels())
@pytest.mark.parametrize("case", range(len(_cases())))
def test_float_conv_documented_order_bit_for_bit_every_level_and_thread_count(isa, case):
    x, w, b, attrs = _data(case)
    with np.errstate(all="ignore"):
        want = oracle(x, w, b, attrs["group"], attrs["pads"], attrs["strides"], attrs["dilations"])
    saved = _native.get_num_threads()
    try:
        with _native.use_isa(isa):
            assert _native.native().fconv_kernels() == KERNELS[isa]
            for threads in (1, 2):
                _native.set_num_threads(threads)
                _same_bits(bf.conv(x, w, b, **attrs), want, f"{isa} threads={threads}")
    finally:
        _native.set_num_threads(saved)


@pytest.mark.parametrize("isa", _levels())
@pytest.mark.parametrize("case", [0, 3, 5, 9, 12])
def test_float_conv_special_values_bit_for_bit(isa, case):
    """±0, ±inf, NaN and overflowing products go through the same two roundings per tap (inf *
    0 of a padding tap is NaN, as in the padded formulation)."""
    x, w, b, attrs = _data(case)
    _specials(x, w, np.random.default_rng(case))
    with np.errstate(all="ignore"):
        want = oracle(x, w, b, attrs["group"], attrs["pads"], attrs["strides"], attrs["dilations"])
        with _native.use_isa(isa):
            got = bf.conv(x, w, b, **attrs)
    _same_bits(got, want, isa)


@pytest.mark.parametrize("engine", ["native", "numpy"])
@pytest.mark.parametrize("case", range(len(_cases())))
def test_float_conv_within_the_float64_bound(engine, case):
    """Against the sum in float64 (float32 products are exact there): the documented order's
    error bound, (K + 1) * 2^-24 * (sum |w| |x| + |b|) per output (K products per output, one
    rounding per product and per addition; 2^-24 the unit roundoff). The NumPy engine's BLAS
    product, in its own order, stays within it too."""
    if engine == "native" and not _native.available():
        pytest.skip("the native engine is not built")
    x, w, b, attrs = _data(case)
    args = (attrs["group"], attrs["pads"], attrs["strides"], attrs["dilations"])
    exact = oracle(x, w, b, *args, dtype=np.float64)
    bound = oracle(x, w, b, *args, dtype=np.float64, absolute=True)
    k = w[0].size
    with _native.use_engine(engine):
        got = bf.conv(x, w, b, **attrs)
    err = np.abs(got.astype(np.float64) - exact)
    assert (err <= (k + 1) * 2.0 ** -24 * bound + 1e-45).all(), float((err / np.maximum(bound, 1e-30)).max())


def test_float_conv_float16_rounds_the_float32_result_once():
    x, w, b, attrs = _data(6)
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b
    want = oracle(x16.astype(F), w16.astype(F), None, attrs["group"], attrs["pads"], attrs["strides"],
                  attrs["dilations"]).astype(np.float16)
    got = bf.conv(x16, w16, b16, **attrs)
    assert got.dtype == np.float16
    if _native.available():
        assert got.tobytes() == want.tobytes()


def test_fgemm_checks_every_buffer_size():
    """The binding refuses a buffer shorter than the geometry needs (no read or write past it)."""
    if not _native.available():
        pytest.skip("the native engine is not built")
    C = _native.native()
    w, x, y, b = np.zeros(12, F), np.zeros(20, F), np.zeros(15, F), np.zeros(3, F)
    C.fgemm(w, b, x, y, 1, 1, 3, 4, 5, 5, 0, 0)  # M=3, K=4, P=5
    for args, what in (((w[:11], b, x, y), "w"), ((w, b[:2], x, y), "b"), ((w, b, x[:19], y), "x"),
                       ((w, b, x, y[:14]), "y")):
        with pytest.raises(ValueError, match=f"buffer {what} "):
            C.fgemm(*args, 1, 1, 3, 4, 5, 5, 0, 0)
    with pytest.raises(ValueError, match="ldx"):
        C.fgemm(w, b, x, y, 1, 1, 3, 4, 5, 4, 0, 0)
    with pytest.raises(ValueError, match="out of range"):
        C.fgemm(w, b, x, y, 1, 1, 3, -4, 5, 5, 0, 0)
    # a second image 20 elements on: x must hold 40
    with pytest.raises(ValueError, match="buffer x "):
        C.fgemm(w, b, x, np.zeros(30, F), 1, 2, 3, 4, 5, 5, 20, 0)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _geometries(draw):
    g = draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    cg = 1 if depthwise else draw(st.integers(1, 5))
    mg = draw(st.integers(1, 4 if depthwise else 19))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - pads[0] - pads[2]), 12))
    w_ = draw(st.integers(max(1, (kw - 1) * dw + 1 - pads[1] - pads[3]), 40))
    n = draw(st.integers(1, 2))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return (n, g * cg, h, w_), g, mg, (kh, kw), (sh, sw), (dh, dw), pads, bias, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_geometries())
def test_float_conv_documented_order_hypothesis(geometry):
    """Random geometries (groups, channel multipliers, kernels, strides, dilations, pads, odd
    sizes, batch) on the selected level: the oracle's bits."""
    if not _native.available():
        pytest.skip("the native engine is not built")
    shape, g, mg, kernel, strides, dil, pads, bias, seed = geometry
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(F)
    w = rng.standard_normal((g * mg, shape[1] // g, *kernel)).astype(F)
    b = rng.standard_normal(g * mg).astype(F) if bias else None
    attrs = dict(group=g, strides=list(strides), dilations=list(dil), pads=list(pads))
    want = oracle(x, w, b, g, list(pads), list(strides), list(dil))
    _same_bits(bf.conv(x, w, b, **attrs), want, str(geometry))
