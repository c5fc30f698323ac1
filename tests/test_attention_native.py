"""The native kernels of com.microsoft Attention / QAttention (qlinear/csrc/transformer/
attention.c) and EmbedLayerNormalization (embed.c), and the graph kernels' lean paths to them.

- Attention's float attention: no bits are promised (onnxruntime's MLAS SGEMM and exp round by
  instruction set; qlinear computes the float64 formula and rounds once), so the native kernel
  is checked against a plainly written float64 oracle (Python floats, math.exp, math.fsum) at
  the documented tolerance: within one float32 rounding of the exact float64 value plus a
  double's error on the terms' magnitudes. What is exact is checked bit for bit: `present`
  (copies of past and of k, v), QAttention's projection (qlinear's exact integer product,
  scaled as onnxruntime scales it: present is bit-identical to onnxruntime's), every ISA
  level and thread count giving the same bits.
- EmbedLayerNormalization's native kernel runs the NumPy engine's float64 operations in its
  order: bit for bit equal to it; onnxruntime within tests/test_contrib.py's tolerance.
- tiny_gpt2 (shared/models): the same bits at every ISA level and at 1 and 2 threads, within
  tolerance of onnxruntime.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qlinear
from qlinear import _native
from qlinear.contrib import transformer as tf

from conftest import engine_level_params
from ms_ort import run_node

pytestmark = pytest.mark.skipif(not _native.available(), reason="native engine not built")

F32 = np.float32
NATIVE_LEVELS = [p for p in engine_level_params() if p.id != "numpy"]
FILTERS = (-10000.0, -3.4028234663852886e38)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def _numpy(fn, *args, **kw):
    with _native.use_engine("numpy"):
        return fn(*args, **kw)


# ----------------------------------------------------------------------------- the oracle

def _keeps(kind, mask, b, i, j, batch):
    if kind == "none":
        return True
    if kind == "2d":
        return mask[b, j] > 0
    if kind == "3d":
        return mask[b, i, j] > 0
    if kind == "end":
        return j < mask[b]
    return mask[batch + b] <= j < mask[b]  # end and start


def attention_oracle(qkv, num_heads, kind, mask, past, unidirectional, scale, filt):
    """softmax(q·kᵀ · scale + masks) · v per batch row and head, in Python floats: each score
    a correctly rounded dot product (math.fsum), then the spec's additions, max, exp and a
    correctly rounded sum. Returns (output float64 (B, S, H), an error bound per output: a
    double's error on the terms' magnitudes, present float32)."""
    batch, seq, three_h = qkv.shape
    hidden = three_h // 3
    head = hidden // num_heads
    plen = 0 if past is None else past.shape[3]
    total = plen + seq
    out = np.zeros((batch, seq, hidden))
    bound = np.zeros((batch, seq, hidden))
    present = np.zeros((2, batch, num_heads, total, head), F32)
    s = scale if scale else 1.0 / math.sqrt(head)
    for b in range(batch):
        for n in range(num_heads):
            ks, vs = [], []
            for j in range(total):
                if j < plen:
                    ks.append([float(t) for t in past[0, b, n, j]])
                    vs.append([float(t) for t in past[1, b, n, j]])
                else:
                    r = qkv[b, j - plen]
                    ks.append([float(t) for t in r[hidden + n * head: hidden + (n + 1) * head]])
                    vs.append([float(t) for t in r[2 * hidden + n * head: 2 * hidden + (n + 1) * head]])
                present[0, b, n, j] = ks[-1]
                present[1, b, n, j] = vs[-1]
            for i in range(seq):
                q = [float(t) for t in qkv[b, i, n * head: (n + 1) * head]]
                scores = []
                for j in range(total):
                    v = math.fsum(a * c for a, c in zip(q, ks[j])) * s
                    if kind != "none":
                        v += 0.0 if _keeps(kind, mask, b, i, j, batch) else filt
                    if unidirectional:
                        v += filt if j > plen + i else 0.0
                    scores.append(v)
                if not total:
                    continue
                mx = max(scores)
                e = [math.exp(v - mx) for v in scores]
                den = math.fsum(e)
                p = [t / den for t in e]
                for d in range(head):
                    terms = [p[j] * vs[j][d] for j in range(total)]
                    out[b, i, n * head + d] = math.fsum(terms)
                    # the scores' double errors (relative 1e-15 of |q|·|k|, times the score's
                    # scale) move each probability by that much relative
                    qk = max(math.fsum(abs(a * c) for a, c in zip(q, ks[j])) for j in range(total)) * s
                    bound[b, i, n * head + d] = math.fsum(abs(t) for t in terms) * (1e-14 + 8e-16 * qk * total)
    return out, bound, present


def _within(got, want, bound):
    """got (float32) is want (float64) rounded to float32, give or take one float32 step and the
    double error ``bound`` (the documented tolerance of the float attention)."""
    g = got.astype(np.float64)
    step = np.spacing(np.abs(want).astype(F32)).astype(np.float64)
    return np.abs(g - want) <= step + bound


def _mask(rng, kind, batch, seq, total):
    if kind == "none":
        return None
    if kind == "2d":
        return (rng.random((batch, total)) < 0.75).astype(np.int32)
    if kind == "3d":
        return (rng.random((batch, seq, total)) < 0.75).astype(np.int32)
    if kind == "end":
        return rng.integers(0, total + 2, batch).astype(np.int32)
    return np.concatenate([rng.integers(0, total + 2, batch), rng.integers(-1, total, batch)]).astype(np.int32)


def _case(seed, batch, seq, heads, head, plen, kind, unidirectional, scale, filt, magnitude=1.0):
    rng = np.random.default_rng(seed)
    hidden = heads * head
    qkv = (rng.standard_normal((batch, seq, 3 * hidden)) * magnitude).astype(F32).astype(np.float64)
    past = None if plen is None else rng.standard_normal((2, batch, heads, plen, head)).astype(F32)
    total = (plen or 0) + seq
    return qkv, heads, kind, _mask(rng, kind, batch, seq, total), past, unidirectional, scale, filt


def _check_attention(case):
    qkv, heads, kind, mask, past, uni, scale, filt = case
    out, present = tf._attention_native("attention", qkv, heads, mask, past, uni, scale, filt)
    want, bound, want_present = attention_oracle(qkv, heads, kind, mask, past, uni, scale, filt)
    assert out.dtype == F32 and out.shape == want.shape
    ok = _within(out, want, bound)
    assert ok.all(), (np.argwhere(~ok)[:3], out[~ok][:3], want[~ok][:3])
    assert np.array_equal(_bits(present), _bits(want_present))


KINDS = ("none", "2d", "3d", "end", "end_start")


@pytest.mark.parametrize("engine_level", NATIVE_LEVELS, indirect=True)
@pytest.mark.parametrize("kind", KINDS)
def test_attention_native_against_float64_oracle(engine_level, kind):
    for seed in range(6):
        rng = np.random.default_rng([seed, KINDS.index(kind)])
        batch, seq, heads, head = (int(t) for t in (rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 5),
                                                    rng.choice([1, 3, 8, 13])))
        plen = [None, 0, 1, 4][seed % 4]
        _check_attention(_case(seed, batch, seq, heads, head, plen, kind, seed % 2, [0.0, 0.37][seed % 3 == 2],
                               FILTERS[seed % 2], magnitude=[1.0, 4.0, 0.01][seed % 3]))


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 5), heads=st.integers(1, 4), head=st.integers(1, 9),
       plen=st.one_of(st.none(), st.integers(0, 4)), kind=st.sampled_from(KINDS), uni=st.integers(0, 1),
       scale=st.sampled_from([0.0, 0.125, 2.0]), filt=st.sampled_from(FILTERS), seed=st.integers(0, 2 ** 16))
def test_attention_native_hypothesis(batch, seq, heads, head, plen, kind, uni, scale, filt, seed):
    _check_attention(_case(seed, batch, seq, heads, head, plen, kind, uni, scale, filt))


def test_attention_native_special_values():
    # all keys masked (the filter on every score: softmax of equal scores), huge scores (a
    # filter of -3.4e38 added twice stays finite in double), NaN and inf in q
    qkv, heads, kind, mask, past, uni, scale, filt = _case(3, 2, 3, 2, 4, 2, "2d", 1, 0.0, FILTERS[1])
    mask[0] = 0
    got, present = tf._attention_native("attention", qkv, heads, mask, past, uni, scale, filt)
    want, bound, _ = attention_oracle(qkv, heads, kind, mask, past, uni, scale, filt)
    assert _within(got, want, bound).all()
    qkv[1, 0, 0] = np.nan
    qkv[1, 1, 1] = np.inf
    with np.errstate(all="ignore"):
        got, _ = tf._attention_native("attention", qkv, heads, mask, past, uni, scale, filt)
        ref, _ = tf._attention_numpy("attention", qkv, heads, mask, past, uni, scale, filt)
    assert np.array_equal(np.isnan(got), np.isnan(ref))


def test_attention_native_same_bits_at_every_level_and_thread_count(monkeypatch):
    # large enough for the heads to go to the pool (qlinear/csrc/transformer/attention.c),
    # which the native path takes with its size limit raised
    monkeypatch.setattr(tf, "NATIVE_ATTENTION_MACS", 1 << 30)
    case = _case(11, 2, 24, 4, 16, 9, "2d", 1, 0.0, FILTERS[0])
    levels = _native.engine_info()["isas"]
    before, isa = qlinear.get_num_threads(), _native.isa()
    results = []
    try:
        for level in levels:
            for threads in (1, 2):
                _native.set_isa(level)
                qlinear.set_num_threads(threads)
                results.append(tf._attention_native("attention", *case[:2], *case[3:]))
    finally:
        _native.set_isa(isa)
        qlinear.set_num_threads(before)
    for r in results[1:]:
        assert np.array_equal(_bits(r[0]), _bits(results[0][0])) and np.array_equal(_bits(r[1]), _bits(results[0][1]))
    _check_attention(case)


def test_attention_native_size_limit():
    small = _case(1, 1, 4, 2, 8, 2, "2d", 1, 0.0, FILTERS[0])
    large = _case(1, 1, 32, 4, 16, 0, "2d", 1, 0.0, FILTERS[0])  # 2 · 4 · 32 · 32 · 16 MACs
    assert tf._attention_native("attention", *small[:2], *small[3:]) is not None
    assert tf._attention_native("attention", *large[:2], *large[3:]) is None
    # the general path takes NumPy's there, within the tolerance of the oracle
    out, present = tf._attention_core("attention", *large[:2], *large[3:])
    want, bound, want_present = attention_oracle(*large)
    assert _within(out, want, bound).all() and np.array_equal(_bits(present), _bits(want_present))


def test_attention_native_refusals_match_numpy_path():
    qkv = np.zeros((1, 2, 12))
    for kw, msg in ((dict(num_heads=5), "divisible by num_heads"),
                    (dict(num_heads=2, past=np.zeros((2, 1, 2, 3, 4), np.float32)), "past must have shape"),
                    (dict(num_heads=2, mask_index=np.ones((1, 3), np.int32)), "mask_index must have shape"),
                    (dict(num_heads=2, mask_index=np.ones((1, 2), np.float32)), "mask_index")):
        args = (kw.get("num_heads"), kw.get("mask_index"), kw.get("past"), 0, 0.0, -10000.0)
        for fn in (tf._attention_native, tf._attention_numpy):
            with pytest.raises((ValueError, TypeError), match=msg):
                fn("attention", qkv, *args)


# ----------------------------------------------------------------------------- QAttention

def _qattention_inputs(rng, batch, seq, hidden_in, heads, head, plen, per_column, wdt):
    cols = 3 * heads * head
    x = rng.integers(0, 256, (batch, seq, hidden_in)).astype(np.uint8)
    if wdt == np.int8:
        w = rng.integers(-64, 65, (hidden_in, cols)).astype(np.int8)  # onnxruntime's u8s8 product is exact here
        wz = np.zeros(cols if per_column else (), np.int8)
    else:
        w = rng.integers(0, 256, (hidden_in, cols)).astype(np.uint8)
        wz = rng.integers(0, 256, cols if per_column else ()).astype(np.uint8)
    ws = (rng.random(cols if per_column else ()) * 0.02 + 0.001).astype(F32) / F32(hidden_in)
    bias = rng.standard_normal(cols).astype(F32)
    past = rng.standard_normal((2, batch, heads, plen, head)).astype(F32)
    xz = np.uint8(rng.integers(0, 256))
    if hidden_in > 1024:  # one token and a third of the columns at the accumulator's extremes
        x[0, 0], xz = 255, np.uint8(0)
        w[:, : cols // 3] = 64 if wdt == np.int8 else 255
        if wz.ndim:
            wz[: cols // 3] = 0
        else:
            wz = np.zeros((), wdt)
    mask = (rng.random((batch, plen + seq)) < 0.8).astype(np.int32)
    mask[:, -1] = 1
    return x, w, bias, F32(0.03), ws, mask, xz, wz, past


@pytest.mark.parametrize("engine_level", NATIVE_LEVELS, indirect=True)
@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("hidden_in", [16, 1100])  # 1100: accumulators beyond 2^24, rounded to float32
def test_qattention_native_projection_exact_and_attention_within_tolerance(engine_level, wdt, per_column, hidden_in):
    rng = np.random.default_rng([per_column, wdt == np.int8, hidden_in])
    ins = _qattention_inputs(rng, 2, 3, hidden_in, 4, 5, 2, per_column, wdt)
    kw = dict(num_heads=4, unidirectional=1, mask_filter_value=FILTERS[1])
    out, present = tf.qattention(*ins, **kw)
    # the projection as the contract writes it, from the exact integer accumulator
    x, w, bias, xs, ws, mask, xz, wz, past = ins
    acc = (x.astype(np.int64) - int(xz)) @ (w.astype(np.int64) - wz.astype(np.int64))
    qkv = (acc.astype(F32) * (ws * xs).astype(F32)) + bias
    want, bound, want_present = attention_oracle(qkv.astype(np.float64), 4, "2d", mask, past, 1, 0.0, FILTERS[1])
    assert np.array_equal(_bits(present), _bits(want_present))
    assert _within(out, want, bound).all()
    # present is bit-identical to onnxruntime's (its projection's arithmetic is fixed); the
    # attention output within the float tolerance
    if per_column and wdt == np.uint8:
        return  # onnxruntime's QAttention takes per-column parameters for int8 weights only
    names = ["x", "w", "b", "xs", "ws", "m", "xz", "wz", "p"]
    ort_out, ort_present = run_node("QAttention", list(zip(names, ins)), kw, out_dtypes=(F32, F32))
    assert np.array_equal(_bits(present), _bits(ort_present))
    rel = np.abs(out.astype(np.float64) - ort_out).max() / np.abs(ort_out).max()
    assert rel < 2e-6


def test_qattention_lean_path_same_bits_as_general_path():
    rng = np.random.default_rng(19)
    x, w, bias, xs, ws, mask, xz, wz, past = _qattention_inputs(rng, 1, 5, 32, 4, 8, 3, False, np.int8)
    from qlinear.graph.kernels.contrib import _prepared_product
    prepared = tf.PreparedQAttention(w, bias, ws, wz, num_heads=4, unidirectional=1, product=_prepared_product(w, wz))
    general = tf._qattention_op(x, w, bias, xs, ws, mask, np.asarray(xz), wz, past, num_heads=4, unidirectional=1)
    for _ in range(3):  # the first call sets up the product's plan; later ones take the lean path
        zx = np.asarray(xz)
        assert prepared._lean(x, np.asarray(xs), mask, zx, past) is not None or _ == 0
        got = prepared.run(x, np.asarray(xs), mask, zx, past)
        for g, r in zip(got, general):
            assert np.array_equal(_bits(g), _bits(r))
    # inputs it does not take go the general way, with its messages
    assert prepared._lean(x, np.asarray(np.nan, F32), mask, np.asarray(xz), past) is None
    assert prepared._lean(x, np.asarray(xs), mask.astype(np.int64), np.asarray(xz), past) is None
    with pytest.raises(ValueError, match="mask_index must have shape"):
        prepared.run(x, np.asarray(xs), mask[:, :3], np.asarray(xz), past)


# ----------------------------------------------------------------------------- EmbedLayerNormalization

HIDDEN = [1, 7, 8, 9, 16, 17, 128, 129, 257]


@pytest.mark.parametrize("engine_level", NATIVE_LEVELS, indirect=True)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_embed_layer_norm_native_is_the_numpy_formula_bit_for_bit(engine_level, hidden):
    rng = np.random.default_rng(hidden)
    words = (rng.standard_normal((40, hidden)) * 10.0 ** rng.uniform(-3, 3, (40, 1))).astype(F32)
    positions, segments = rng.standard_normal((12, hidden)).astype(F32), rng.standard_normal((3, hidden)).astype(F32)
    gamma, beta = rng.standard_normal(hidden).astype(F32), rng.standard_normal(hidden).astype(F32)
    words[0] = -0.0
    for batch, seq in ((1, 1), (2, 5), (3, 4)):
        ids = rng.integers(0, 40, (batch, seq)).astype(np.int32)
        ids[0, 0] = 0
        seg = rng.integers(0, 3, (batch, seq)).astype(np.int32)
        mask = (rng.random((batch, seq)) < 0.5).astype(np.int32)
        for pos in (None, rng.integers(0, 12, (batch, seq)).astype(np.int64),
                    rng.integers(0, 12, (1, seq)).astype(np.int32)):
            for with_seg in (False, True):
                args = (ids, seg if with_seg else None, words, positions, segments if with_seg else None, gamma, beta,
                        mask, pos)
                got = tf.embed_layer_normalization(*args, epsilon=1e-5)
                want = _numpy(tf.embed_layer_normalization, *args, epsilon=1e-5)
                for g, wv in zip(got, want):
                    assert g.dtype == wv.dtype and g.shape == wv.shape
                    assert g.tobytes() == wv.tobytes()


def test_embed_layer_norm_native_refusals_name_the_input():
    rng = np.random.default_rng(2)
    words, positions = rng.standard_normal((10, 4)).astype(F32), rng.standard_normal((6, 4)).astype(F32)
    gamma, beta = np.ones(4, F32), np.zeros(4, F32)
    ids = np.array([[1, 2, 3]], np.int32)
    segs = rng.standard_normal((2, 4)).astype(F32)
    for args, msg in (((np.array([[1, 10, 3]], np.int32), None, words, positions, None), "input_ids must index"),
                      ((np.array([[-1, 0, 0]], np.int32), None, words, positions, None), "input_ids must index"),
                      ((ids, None, words, positions[:2], None), "position_ids must index"),
                      ((ids, np.array([[0, 2, 0]], np.int32), words, positions, segs), "segment_ids must index")):
        for engine in ("native", "numpy"):
            with _native.use_engine(engine), pytest.raises(ValueError, match=msg):
                tf.embed_layer_normalization(*args, gamma, beta)
    # an out-of-range id with a bad position_ids too: the ids are reported first, as on NumPy
    with pytest.raises(ValueError, match="input_ids must index"):
        tf.embed_layer_normalization(np.array([[1, 10, 3]], np.int32), None, words, positions, None, gamma, beta,
                                     None, np.array([[0, 99, 0]], np.int32))


# ----------------------------------------------------------------------------- tiny_gpt2

def _gpt2():
    from conftest import shared_models_dir
    from pathlib import Path

    import onnx

    d = shared_models_dir()
    path = None if d is None else Path(d) / "tiny_gpt2_ortdynamic.onnx"
    if path is None or not path.exists():
        pytest.skip("shared/models' tiny_gpt2_ortdynamic.onnx is absent")
    return onnx.load(str(path))


def _gpt2_feeds(seed, batch=1, seq=5, plen=3):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int32),
             "position_ids": np.tile(np.arange(plen, plen + seq, dtype=np.int32), (batch, 1)),
             "attention_mask": (rng.random((batch, plen + seq)) < 0.8).astype(np.int32)}
    feeds["attention_mask"][:, -1] = 1
    for i in range(5):
        feeds[f"past_{i}"] = rng.standard_normal((2, batch, 4, plen, 8)).astype(F32)
    return feeds


def test_tiny_gpt2_same_bits_at_every_level_and_thread_count_and_near_onnxruntime():
    import onnxruntime as ort

    import qlinear.backend as backend

    model = _gpt2()
    feeds = [_gpt2_feeds(0), _gpt2_feeds(1, batch=2, seq=3, plen=4)]
    levels = _native.engine_info()["isas"]
    before, isa = qlinear.get_num_threads(), _native.isa()
    runs = []
    try:
        for level in levels:
            for threads in (1, 2):
                _native.set_isa(level)
                qlinear.set_num_threads(threads)
                rep = backend.prepare(model)
                runs.append([rep.run(f) for f in feeds + feeds])  # the second round: the lean paths
    finally:
        _native.set_isa(isa)
        qlinear.set_num_threads(before)
    for r in runs:
        for got, want in zip(r, runs[0]):
            for g, w in zip(got, want):
                assert g.tobytes() == w.tobytes()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for f, got in zip(feeds, runs[0]):
        for g, w in zip(got, sess.run(None, f)):
            # the float operators' tolerance, carried through DynamicQuantizeLinear's ranges
            # (docs/models.md: a quantization step may move; measured max abs 3e-08 .. 6e-08)
            assert g.shape == w.shape
            assert np.abs(g.astype(np.float64) - w).max() <= 1e-3 * max(1.0, float(np.abs(w).max()))


# ----------------------------------------------------------------------------- graph kernels' lean paths

def test_dynamic_quantize_matmul_bound_short_path_same_bits():
    """DynamicQuantizeMatMul's short path (direct native calls by the full call's plan) gives
    the public function's bits, with a bias and per-column or per-tensor scales, for new
    inputs of the bound shape and of others, across runs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import qlinear.backend as backend
    from qlinear.contrib import gemm

    rng = np.random.default_rng(23)
    for per_column, with_bias in ((True, True), (False, True), (True, False)):
        b = rng.integers(-128, 128, (24, 10)).astype(np.int8)
        bs = (rng.random(10 if per_column else ()) * 0.01 + 1e-3).astype(F32)
        bz = np.zeros(10 if per_column else (), np.int8)
        bias = rng.standard_normal(10).astype(F32) if with_bias else None
        inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(bs, "bs"),
                 numpy_helper.from_array(bz, "bz")] + ([numpy_helper.from_array(bias, "bias")] if with_bias else [])
        node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz"] + (["bias"] if with_bias else []),
                                ["y"], domain="com.microsoft")
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        rep = backend.prepare(model)
        for shape in ((1, 5, 24), (1, 5, 24), (1, 5, 24), (3, 24), (1, 5, 24)):
            a = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 100.0])).astype(F32)
            got = rep.run({"a": a})[0]
            want = gemm.dynamic_quantize_matmul(a, b, bs, bz, bias)
            assert got.tobytes() == want.tobytes() and got.shape == want.shape


def test_tiny_gpt2_repeat_runs_take_the_lean_paths(monkeypatch):
    """After two runs, a run of tiny_gpt2 quantizes through no public DynamicQuantizeLinear and
    checks no QAttention or EmbedLayerNormalization argument the general way, with the same
    bits as the first runs."""
    import qlinear.backend as backend
    from qlinear.contrib import _raw, gemm

    model = _gpt2()
    feeds = _gpt2_feeds(4)
    rep = backend.prepare(model)
    want = rep.run(feeds)
    rep.run(feeds)

    def refuse(*a, **k):
        raise AssertionError("a general path was taken")

    for mod, name in ((gemm, "dynamic_quantize_linear"), (_raw, "dynamic_quantize_linear"),
                      (_raw, "embed_layer_normalization"), (tf, "_attention_checks")):
        monkeypatch.setattr(mod, name, refuse)
    for g, w in zip(rep.run(feeds), want):
        assert g.tobytes() == w.tobytes()
