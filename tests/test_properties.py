"""Hypothesis property tests: qlinear equals the oracle over generated shapes, attributes, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import oracle  # noqa: E402
import qlinear  # noqa: E402
from conftest import I8, I32, U8, assert_exact, num_threads, rand_extreme, rand_int  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

dtype8 = st.sampled_from([U8, I8])


def values(rng, dtype, shape, style):
    if style == "extreme":
        return rand_extreme(rng, dtype, shape)
    if style == "small":
        return rand_int(rng, dtype, shape, 0, 3)
    return rand_int(rng, dtype, shape)


# ----------------------------------------------------------------------------- conv


@st.composite
def conv_cases(draw):
    nsp = draw(st.integers(1, 3))
    auto_pad = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    kernel = draw(st.lists(st.integers(1, 3 if nsp < 3 else 2), min_size=nsp, max_size=nsp))
    strides = draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp))
    dilations = draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp))
    wide = draw(st.booleans())  # stride 1 on a wide last axis: flat-image formulations apply
    if wide:
        strides = [1] * nsp
    pads = None
    if auto_pad == "NOTSET" and draw(st.booleans()):
        pads = draw(st.lists(st.integers(0, 3), min_size=2 * nsp, max_size=2 * nsp))
    size = []
    for i in range(nsp):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = pads[i] + pads[nsp + i] if pads else 0
        low = max(1, span - room) if auto_pad in ("NOTSET", "VALID") else 1
        size.append(draw(st.integers(low, low + (6 if nsp < 3 else 3))))
    if wide:
        size[-1] += draw(st.integers(8, 20))
    group = draw(st.integers(1, 3))
    c_per_group = draw(st.integers(1, 3))
    m_per_group = draw(st.integers(1, 3))
    batch = draw(st.integers(0, 2))
    dtypes = (draw(dtype8), draw(dtype8), draw(dtype8))
    per_channel = draw(st.booleans())
    bias = draw(st.sampled_from([None, "small", "large"]))
    style = draw(st.sampled_from(["full", "extreme", "small"]))
    kernel_given = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))

    rng = np.random.default_rng(seed)
    xdt, wdt, ydt = dtypes
    m_out = group * m_per_group
    x = values(rng, xdt, (batch, group * c_per_group, *size), style)
    w = values(rng, wdt, (m_out, c_per_group, *kernel), style)
    shape = (m_out,) if per_channel else ()
    ws = rng.uniform(1e-3, 5e-2, shape).astype(np.float32)
    wz = rand_int(rng, wdt, shape)
    xs = np.float32(rng.uniform(1e-3, 5e-2))
    k = c_per_group * int(np.prod(kernel))
    ys = np.float32(float(xs) * float(np.max(ws)) * 120 * np.sqrt(k) * rng.uniform(0.2, 4))
    B = None
    if bias == "small":
        B = rand_int(rng, I32, (m_out,), -30000, 30000)
    elif bias == "large":
        B = rand_int(rng, I32, (m_out,))
    args = [x, xs, rand_int(rng, xdt, ()), w, ws, wz, ys, rand_int(rng, ydt, ()), B]
    kwargs = dict(auto_pad=auto_pad, group=group, strides=strides, dilations=dilations)
    if pads is not None:
        kwargs["pads"] = pads
    if kernel_given:
        kwargs["kernel_shape"] = kernel
    return args, kwargs


@settings(max_examples=250, **SETTINGS)
@given(conv_cases())
def test_qlinear_conv_equals_oracle(case):
    args, kwargs = case
    assert_exact(qlinear.qlinear_conv(*args, **kwargs), oracle.qlinear_conv(*args, **kwargs))


@settings(max_examples=150, **SETTINGS)
@given(conv_cases())
def test_conv_integer_equals_oracle(case):
    args, kwargs = case
    x, _, xz, w, _, wz = args[:6]
    assert_exact(qlinear.conv_integer(x, w, xz, wz, **kwargs), oracle.conv_integer(x, w, xz, wz, **kwargs))


@settings(max_examples=40, **SETTINGS)
@given(conv_cases())
def test_grouped_conv_is_concatenation_of_groups(case):
    """Metamorphic: a grouped ConvInteger equals its groups run separately, concatenated."""
    args, kwargs = case
    x, _, xz, w, _, wz = args[:6]
    group = kwargs["group"]
    whole = qlinear.conv_integer(x, w, xz, wz, **kwargs)
    c, m = x.shape[1] // group, w.shape[0] // group
    parts = []
    for g in range(group):
        wz_g = wz[g * m:(g + 1) * m] if wz.ndim else wz
        parts.append(qlinear.conv_integer(x[:, g * c:(g + 1) * c], w[g * m:(g + 1) * m], xz, wz_g,
                                          **dict(kwargs, group=1)))
    assert_exact(whole, np.concatenate(parts, axis=1))


@st.composite
def implicit_nd_cases(draw):
    """3-D and 4-D convolutions shaped for the native engine's implicit GEMM (2-8 channels a
    group: the exact kernel's pairs and the 7-bit kernel's quads, padded up to them), with
    strides 1-5 (5: beyond the path, im2col), dilations, asymmetric pads (now and then up to
    40: planes too large, im2col), groups, batch 1-2, full-range or 7-bit weights around
    differing per-channel zero points, every type combination."""
    nsp = draw(st.sampled_from([3, 3, 3, 4]))
    kernel = draw(st.lists(st.integers(1, 3 if nsp == 3 else 2), min_size=nsp, max_size=nsp))
    strides = draw(st.lists(st.sampled_from([1, 1, 2, 3, 4, 5]), min_size=nsp, max_size=nsp))
    dilations = draw(st.lists(st.integers(1, 2), min_size=nsp, max_size=nsp))
    far = draw(st.integers(0, 9)) == 0
    pads = draw(st.lists(st.integers(0, 40 if far else 2), min_size=2 * nsp, max_size=2 * nsp))
    size = []
    for i in range(nsp):
        span = (kernel[i] - 1) * dilations[i] + 1
        low = max(1, span - pads[i] - pads[nsp + i])
        size.append(draw(st.integers(low, low + 4)))
    size[-1] += draw(st.integers(0, 24))
    group = draw(st.integers(1, 2))
    cg = draw(st.sampled_from([2, 3, 4, 6, 8]))
    m = group * draw(st.integers(1, 7))
    batch = draw(st.integers(1, 2))
    xdt, wdt, ydt = draw(dtype8), draw(dtype8), draw(dtype8)
    seven_bit = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rand_extreme(rng, xdt, (batch, group * cg, *size))
    info = np.iinfo(wdt)
    if seven_bit:   # |w - w_zero_point| <= 64, at the bound now and then
        wz = rng.integers(info.min + 64, info.max - 64, m, endpoint=True).astype(wdt)
        d = rng.integers(-64, 64, (m, cg, *kernel), endpoint=True)
        w = (wz.reshape(m, *(1,) * (nsp + 1)).astype(np.int32) + d).astype(wdt)
    else:
        w, wz = rand_extreme(rng, wdt, (m, cg, *kernel)), rand_int(rng, wdt, (m,))
    ws = rng.uniform(1e-3, 5e-2, (m,)).astype(np.float32)
    xs = np.float32(rng.uniform(1e-3, 5e-2))
    ys = np.float32(float(xs) * float(np.max(ws)) * 120 * np.sqrt(cg * np.prod(kernel)))
    args = [x, xs, rand_int(rng, xdt, ()), w, ws, wz, ys, rand_int(rng, ydt, ()), rand_int(rng, I32, (m,))]
    attrs = dict(group=group, strides=strides, dilations=dilations, pads=pads)
    return args, attrs, (tuple(size), tuple(kernel), group * cg, group, seven_bit)


@settings(max_examples=60, **SETTINGS)
@given(case=implicit_nd_cases())
def test_implicit_nd_conv_equals_oracle(case):
    """3-D and 4-D convolutions against the oracle (QLinearConv and ConvInteger), and, on the
    levels with the implicit GEMM (avx2, scalar; avx512vnni and avxvnni for weights their fast
    kernel takes, every int8 centered weight), the path each took: the implicit one wherever
    conv.c's rules (mirrored in test_conv._takes_implicit) take it - every rank, not only 1-D
    and 2-D - and im2col where they decline (strides of 5, planes too large)."""
    from test_conv import _conv_kind, _takes_implicit

    from qlinear import _native
    args, attrs, (size, kernel, cin, group, seven_bit) = case
    level = _native._C.get_isa() if _native.native() is not None else None   # the engine_level fixture's
    before = _native._C.conv_path_counts() if level else None
    assert_exact(qlinear.qlinear_conv(*args, **attrs), oracle.qlinear_conv(*args, **attrs))
    x, _, xz, w, _, wz = args[:6]
    assert_exact(qlinear.conv_integer(x, w, xz, wz, **attrs), oracle.conv_integer(x, w, xz, wz, **attrs))
    if level in ("avx2", "scalar", "amx", "avx512vnni", "avxvnni"):
        took = tuple(a - b for a, b in zip(_native._C.conv_path_counts(), before))[:2]
        fast = _conv_kind(w, wz, **attrs) == 2   # the fast kernel wherever the weights fit its bound
        implicit = _takes_implicit(size, kernel, {k: v for k, v in attrs.items() if k != "group"}, cin, group, fast)
        assert took == ((2, 0) if implicit else (0, 2)), (took, implicit)


@st.composite
def depthwise_cases(draw):
    """Depthwise convolutions (group = C): channel counts around the channels-last path's
    blocks of 16, channel multipliers, 1-D/2-D/3-D, kernels up to 7 wide, strides and
    dilations 1-3, asymmetric pads (some far beyond the kernel), widths around 16 and the
    row kernels' blocks, all 8 type combinations, full-range / 7-bit / extreme weights around
    differing per-channel zero points, biases near the int32 wrap, batch 1-2, 1 or 2 threads."""
    nsp = draw(st.sampled_from([2, 2, 2, 1, 3]))
    c = draw(st.sampled_from([1, 3, 7, 8, 15, 16, 17, 31, 32, 33]))
    mult = draw(st.sampled_from([1, 1, 1, 2, 3]))
    kmax = {1: 7, 2: 7, 3: 3}[nsp]
    kernel = draw(st.lists(st.integers(1, kmax), min_size=nsp, max_size=nsp))
    strides = draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp))
    dilations = draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp))
    far = draw(st.booleans())
    pads = draw(st.lists(st.integers(0, 40 if far else 3), min_size=2 * nsp, max_size=2 * nsp))
    size = []
    for i in range(nsp):
        span = (kernel[i] - 1) * dilations[i] + 1
        low = max(1, span - pads[i] - pads[nsp + i])
        top = 40 if i == nsp - 1 and nsp < 3 else (12 if nsp == 2 else 5)
        size.append(draw(st.integers(low, low + top)))
    batch = draw(st.integers(1, 2))
    xdt, wdt, ydt = draw(dtype8), draw(dtype8), draw(dtype8)
    style = draw(st.sampled_from(["full", "seven_bit", "extreme"]))
    bias = draw(st.sampled_from([None, "small", "wrap"]))
    threads = draw(st.integers(1, 2))
    seed = draw(st.integers(0, 2**32 - 1))

    rng = np.random.default_rng(seed)
    m = c * mult
    x = values(rng, xdt, (batch, c, *size), "extreme" if style == "extreme" else "full")
    wshape = (m, 1, *kernel)
    if style == "seven_bit":   # |w - wz| <= 64 around per-channel zero points
        info = np.iinfo(wdt)
        wz = rng.integers(info.min + 64, info.max - 64, m, endpoint=True).astype(wdt)
        w = (wz.reshape(m, *(1,) * (nsp + 1)).astype(np.int32)
             + rng.integers(-64, 64, wshape, endpoint=True)).astype(wdt)
    else:
        w = values(rng, wdt, wshape, style)
        wz = rand_int(rng, wdt, (m,))
    ws = rng.uniform(1e-3, 5e-2, (m,)).astype(np.float32)
    xs = np.float32(rng.uniform(1e-3, 5e-2))
    k = int(np.prod(kernel))
    ys = np.float32(float(xs) * float(np.max(ws)) * 120 * np.sqrt(k) * rng.uniform(0.2, 4))
    B = None
    if bias == "small":
        B = rand_int(rng, I32, (m,), -30000, 30000)
    elif bias == "wrap":   # within 2^16 of the int32 limits: accumulators wrap past them
        B = (rng.choice([-2**31, 2**31 - 2**16], m) + rng.integers(0, 2**16, m)).astype(I32)
    args = [x, xs, rand_int(rng, xdt, ()), w, ws, wz, ys, rand_int(rng, ydt, ()), B]
    kwargs = dict(group=c, strides=strides, dilations=dilations, pads=pads)
    return args, kwargs, threads


@settings(max_examples=120, **SETTINGS)
@given(depthwise_cases())
def test_depthwise_conv_equals_oracle(case):
    args, kwargs, threads = case
    with num_threads(threads):
        want = oracle.qlinear_conv(*args, **kwargs)
        assert_exact(qlinear.qlinear_conv(*args, **kwargs), want)
        # prepared forms (their own weight layouts: conv.py's native_weights)
        x, xs, xz, w, ws, wz, ys, yz, b = args
        assert_exact(qlinear.prepare_qlinear_conv(w, ws, wz, b, **kwargs).run(x, xs, xz, ys, yz), want)
        want = oracle.conv_integer(x, w, xz, wz, **kwargs)
        assert_exact(qlinear.conv_integer(x, w, xz, wz, **kwargs), want)
        assert_exact(qlinear.prepare_conv_integer(w, wz, **kwargs).run(x, xz), want)


# ----------------------------------------------------------------------------- matmul


@st.composite
def matmul_cases(draw):
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    batch_a = draw(st.lists(st.integers(1, 3), max_size=2))
    batch_b = draw(st.lists(st.integers(1, 3), max_size=2))
    # make the batch shapes broadcast-compatible: equal, 1, or missing
    common = min(len(batch_a), len(batch_b))
    for i in range(1, common + 1):
        if batch_a[-i] != batch_b[-i] and 1 not in (batch_a[-i], batch_b[-i]):
            batch_b[-i] = 1
    a_vec = not batch_a and draw(st.booleans())
    b_vec = not batch_b and draw(st.booleans())
    adt, bdt, ydt = draw(dtype8), draw(dtype8), draw(dtype8)
    a_quant = draw(st.sampled_from(["tensor", "row", "row_keepdims"]))
    b_quant = draw(st.sampled_from(["tensor", "column", "column_keepdims"]))
    style = draw(st.sampled_from(["full", "extreme", "small"]))
    seed = draw(st.integers(0, 2**32 - 1))

    rng = np.random.default_rng(seed)
    shape_a = (k,) if a_vec else (*batch_a, m, k)
    shape_b = (k,) if b_vec else (*batch_b, k, n)
    a = values(rng, adt, shape_a, style)
    b = values(rng, bdt, shape_b, style)
    if a_vec or a_quant == "tensor":
        a_shape = ()
    elif a_quant == "row":
        a_shape = (m,)
    else:
        a_shape = (*[draw(st.sampled_from([d, 1])) for d in batch_a], m, 1)
    if b_vec or b_quant == "tensor":
        b_shape = ()
    elif b_quant == "column":
        b_shape = (n,)
    else:
        b_shape = (*[draw(st.sampled_from([d, 1])) for d in batch_b], 1, n)
    a_s = rng.uniform(1e-3, 5e-2, a_shape).astype(np.float32)
    b_s = rng.uniform(1e-3, 5e-2, b_shape).astype(np.float32)
    ys = np.float32(float(np.max(a_s)) * float(np.max(b_s)) * 120 * np.sqrt(k) * rng.uniform(0.2, 4))
    return [a, a_s, rand_int(rng, adt, a_shape), b, b_s, rand_int(rng, bdt, b_shape), ys, rand_int(rng, ydt, ())]


@settings(max_examples=150, **SETTINGS)
@given(matmul_cases())
def test_qlinear_matmul_equals_oracle(args):
    assert_exact(qlinear.qlinear_matmul(*args), oracle.qlinear_matmul(*args))


@settings(max_examples=100, **SETTINGS)
@given(matmul_cases())
def test_matmul_integer_equals_oracle(args):
    a, _, az, b, _, bz = args[:6]
    assert_exact(qlinear.matmul_integer(a, b, az, bz), oracle.matmul_integer(a, b, az, bz))
    assert_exact(qlinear.matmul_integer(a, b), oracle.matmul_integer(a, b))


@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 5), st.integers(1, 30), st.integers(1, 5), dtype8, dtype8, st.integers(0, 2**32 - 1))
def test_matmul_integer_equals_pointwise_conv(m, k, n, adt, bdt, seed):
    """Metamorphic: MatMulInteger(a, b) == ConvInteger with a 1x1 kernel (w = b^T)."""
    rng = np.random.default_rng(seed)
    a = rand_int(rng, adt, (m, k))
    b = rand_int(rng, bdt, (k, n))
    az, bz = rand_int(rng, adt, ()), rand_int(rng, bdt, (n,))
    mm = qlinear.matmul_integer(a, b, az, bz)
    conv = qlinear.conv_integer(a.T.reshape(1, k, m, 1).copy(), b.T.reshape(n, k, 1, 1).copy(), az, bz)
    assert_exact(mm, conv.reshape(n, m).T.copy())


# ----------------------------------------------------------------------------- quantize


@settings(max_examples=100, **SETTINGS)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.booleans(), dtype8,
       st.sampled_from(["normal", "ties", "wild"]), st.integers(0, 2**32 - 1), st.data())
def test_quantize_dequantize_equal_oracle(shape, per_axis, dt, style, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    pshape = (shape[axis],) if per_axis else ()
    scale = rng.uniform(1e-3, 4, pshape).astype(np.float32)
    zp = rand_int(rng, dt, pshape)
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis] if per_axis else 1
    if style == "ties":
        x = ((rng.integers(-150, 150, shape) + 0.5) * scale.reshape(bshape if per_axis else ())).astype(np.float32)
    elif style == "wild":
        x = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30], np.float32), shape)
    else:
        x = (rng.standard_normal(shape) * 200).astype(np.float32)
    assert_exact(qlinear.quantize_linear(x, scale, zp, axis=axis), oracle.quantize_linear(x, scale, zp, axis=axis))
    q = rand_int(rng, dt, tuple(shape))
    assert_exact(qlinear.dequantize_linear(q, scale, zp, axis=axis),
                 oracle.dequantize_linear(q, scale, zp, axis=axis))
