"""onnxruntime's 16-bit saturation: the probe, the emulation (qlinear.tools.ortsat and
``emulate="onnxruntime-avx2"``), compare's verdicts, and model-local functions.

Every test that depends on how this machine's onnxruntime computes asks the probe
(``ortsat.onnxruntime_saturates()``, measured) and skips with the reason when it needs the
other kind of CPU. The emulation is always checked against an independent model of the
saturating kernel written here with explicit loops (``pair_saturated_oracle``); where this
machine's onnxruntime saturates, also bit for bit against onnxruntime itself.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

import oracle
import qlinear
from conftest import I8, U8, assert_exact, rand_int, rand_scale

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from qlinear import backend, cli  # noqa: E402
from qlinear.tools import ortsat  # noqa: E402
from qlinear.tools.compare import compare_model, compare_tensor  # noqa: E402

SATURATES = ortsat.onnxruntime_saturates()
NEEDS_SATURATING = pytest.mark.skipif(
    not SATURATES, reason="needs a CPU where onnxruntime's u8 x s8 kernels saturate (probe: exact here)")
NEEDS_EXACT = pytest.mark.skipif(
    SATURATES is not False, reason="needs a CPU where onnxruntime's u8 x s8 kernels are exact (probe: saturating here)")


# --------------------------------------------------------------------------- independent model


def _sat16(v: int) -> int:
    return max(-32768, min(32767, v))


def pair_saturated_dot(u: list[int], s: list[int]) -> int:
    """Σ over consecutive pairs of sat16(u[k]s[k] + u[k+1]s[k+1]), raw operands, explicit loop."""
    total = 0
    for k in range(0, len(u), 2):
        p = u[k] * s[k] + (u[k + 1] * s[k + 1] if k + 1 < len(u) else 0)
        total += _sat16(p)
    return total


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def matmul_acc_oracle(a, b, azp, bzp):
    """int64 [M, N]: the saturating kernel's Σ(a - azp)(b - bzp) = pairs(a, b) minus the exact
    zero-point corrections (raw operands enter the kernel), a 2-D."""
    m, k = a.shape
    n = b.shape[1]
    bzp = np.broadcast_to(np.asarray(bzp, np.int64).reshape(-1), (n,))
    out = np.zeros((m, n), np.int64)
    for i in range(m):
        for j in range(n):
            u = [int(v) for v in a[i]]
            s = [int(b[kk, j]) for kk in range(k)]
            out[i, j] = (pair_saturated_dot(u, s) - int(azp) * sum(s) - int(bzp[j]) * sum(u)
                         + k * int(azp) * int(bzp[j]))
    return out


def conv_acc_oracle(x, w, xzp, wzp, order, pads, strides, group):
    """int64 [N, M, OH, OW] of the saturating convolution (2-D), patch elements in ``order``
    ("taps, channels" or "channels, taps"), padded positions holding the raw x_zero_point."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    mg = m // group
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])],
                constant_values=int(xzp))
    oh = (h + pads[0] + pads[2] - kh) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - kw) // strides[1] + 1
    wzp = np.broadcast_to(np.asarray(wzp, np.int64).reshape(-1), (m,))
    out = np.zeros((n, m, oh, ow), np.int64)
    for b_, oc, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = oc // mg
        idx = ([(ky, kx, ci) for ky in range(kh) for kx in range(kw) for ci in range(cg)]
               if order == "taps, channels" else
               [(ky, kx, ci) for ci in range(cg) for ky in range(kh) for kx in range(kw)])
        u = [int(xp[b_, g * cg + ci, i * strides[0] + ky, j * strides[1] + kx]) for ky, kx, ci in idx]
        s = [int(w[oc, ci, ky, kx]) for ky, kx, ci in idx]
        kk = len(u)
        out[b_, oc, i, j] = (pair_saturated_dot(u, s) - int(xzp) * sum(s) - int(wzp[oc]) * sum(u)
                             + kk * int(xzp) * int(wzp[oc]))
    return out


def requantize_oracle(acc, m, yzp):
    v = (np.vectorize(_wrap32, otypes=[np.int64])(acc).astype(np.float32) * m).astype(np.float32)
    info = np.iinfo(np.asarray(yzp).dtype)
    return np.clip(np.rint(v).astype(np.int64) + int(yzp), info.min, info.max).astype(np.asarray(yzp).dtype)


# --------------------------------------------------------------------------- onnxruntime


def _ort(op, inputs, consts, attrs=None, opset=13, out=T.INT32):
    feeds = {k: v for k, v in inputs if k not in consts and v is not None}
    g = helper.make_graph(
        [helper.make_node(op, [k if v is not None else "" for k, v in inputs], ["y"], **(attrs or {}))], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", out, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inputs if k in consts and v is not None])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0], model


# --------------------------------------------------------------------------- the probe


def test_probe_operands_saturate_every_pair():
    a, b = ortsat.probe_operands()
    assert a.dtype == np.uint8 and b.dtype == np.int8
    pairs = a[:, None, 0::2].astype(np.int64) * b[0::2].T[None] + a[:, None, 1::2].astype(np.int64) * b[1::2].T[None]
    assert (np.abs(pairs) > 32767).all()
    assert (b > 0).any() and (b < 0).any()


def test_probe_is_a_measurement_against_qlinear(monkeypatch):
    monkeypatch.delenv(ortsat.PROBE_ENV, raising=False)
    m = ortsat.measure()
    assert m is not None and m["elements"] == 64
    assert m["saturates"] == (m["differing"] > 0) == ortsat.onnxruntime_saturates()
    if m["saturates"]:
        assert m["matches_emulation"]  # the saturation is exactly the modelled one
    monkeypatch.setenv(ortsat.PROBE_ENV, "0")
    assert ortsat.onnxruntime_saturates() is False and "QLINEAR_ORT_SATURATES" in ortsat.probe_source()
    monkeypatch.setenv(ortsat.PROBE_ENV, "1")
    assert ortsat.onnxruntime_saturates() is True
    monkeypatch.delenv(ortsat.PROBE_ENV)
    assert ortsat.probe_source() == "measured"


def test_probe_decides_by_comparison_not_a_constant(monkeypatch):
    """With a (fake) onnxruntime that returns qlinear's exact result, the probe says exact; with
    one returning the emulated saturation, it says saturating."""
    import types

    class FakeSession:
        def __init__(self, result):
            self.result = result

        def run(self, _names, feeds):
            a = feeds["a"]
            b = ortsat.probe_operands()[1]
            args = (np.float32(1.0), np.uint8(0), b, np.float32(1.0), np.int8(0), np.float32(20000.0), np.uint8(128))
            return [self.result(a, *args)]

    for fn, want in ((qlinear.qlinear_matmul, False), (ortsat.emulate_qlinear_matmul, True)):
        fake = types.SimpleNamespace(SessionOptions=ort.SessionOptions,
                                     InferenceSession=lambda *a, _fn=fn, **k: FakeSession(_fn))
        monkeypatch.setitem(__import__("sys").modules, "onnxruntime", fake)
        ortsat.measure.cache_clear()
        try:
            assert ortsat.measure()["saturates"] is want
        finally:
            monkeypatch.undo()
            ortsat.measure.cache_clear()


# --------------------------------------------------------------------------- the emulation


@pytest.mark.parametrize("seed", range(4))
def test_emulated_matmul_integer_and_qlinear_matmul(seed):
    rng = np.random.default_rng(300 + seed)
    k = int(rng.integers(1, 40))
    a = rand_int(rng, U8, (5, k))
    b = rand_int(rng, I8, (k, 6))
    azp = rand_int(rng, U8, ())
    bzp = rand_int(rng, I8, (6,)) if seed % 2 else rand_int(rng, I8, ())
    want = np.vectorize(_wrap32, otypes=[np.int64])(matmul_acc_oracle(a, b, azp, bzp)).astype(np.int32)
    assert_exact(ortsat.emulate_matmul_integer(a, b, azp, bzp), want)
    if SATURATES is not None:
        # where onnxruntime saturates it is the emulation; where it is exact (VNNI, AMX), the
        # exact oracle (on these full-range operands the two differ: see the probe)
        got, _ = _ort("MatMulInteger", [("a", a), ("b", b), ("azp", azp), ("bzp", bzp)], {"b", "azp", "bzp"})
        assert_exact(got, want if SATURATES else oracle.matmul_integer(a, b, azp, bzp))
    bs = rand_scale(rng, (6,))
    ys, yzp = np.float32(rng.uniform(2, 8)), U8(128)
    m = ((np.float32(0.03) * bs).astype(np.float32) / ys).astype(np.float32)
    want_q = requantize_oracle(matmul_acc_oracle(a, b, azp, bzp), m, yzp)
    bzp_q = np.broadcast_to(bzp, (6,)).copy()
    assert_exact(ortsat.emulate_qlinear_matmul(a, np.float32(0.03), azp, b, bs, bzp_q, ys, yzp), want_q)
    if SATURATES is not None:
        got, _ = _ort("QLinearMatMul", [("a", a), ("as", np.float32(0.03)), ("azp", azp), ("b", b), ("bs", bs),
                                        ("bzp", bzp_q), ("ys", ys), ("yzp", yzp)],
                      {"as", "azp", "b", "bs", "bzp", "ys", "yzp"}, out=T.UINT8)
        assert_exact(got, want_q if SATURATES else
                     oracle.qlinear_matmul(a, np.float32(0.03), azp, b, bs, bzp_q, ys, yzp))


MATMUL_SHAPES = [((7,), (7, 3)), ((4, 7), (7,)), ((7,), (7,)), ((2, 3, 9), (2, 9, 4)), ((3, 9), (2, 9, 4)),
                 ((0, 5), (5, 3)), ((2, 0), (0, 3)), ((3, 4), (4, 0))]


@pytest.mark.parametrize("ashape,bshape", MATMUL_SHAPES, ids=[f"{a}x{b}" for a, b in MATMUL_SHAPES])
def test_emulated_matmul_shapes(ashape, bshape):
    """numpy.matmul shapes (1-D, batched b, empty): the emulation against the loop model on
    the broadcast matrices, and against onnxruntime where it saturates."""
    rng = np.random.default_rng(sum(ashape) * 31 + sum(bshape))
    a = rand_int(rng, U8, ashape)
    b = rand_int(rng, I8, bshape)
    azp, bzp = U8(7), I8(-3)
    got = ortsat.emulate_matmul_integer(a, b, azp, bzp)
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    nb = int(np.prod(batch))
    ab = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape((nb,) + a2.shape[-2:])
    bb = np.broadcast_to(b2, batch + b2.shape[-2:]).reshape((nb,) + b2.shape[-2:])
    if ab.size and bb.size:
        want = np.stack([matmul_acc_oracle(x, y, azp, bzp) for x, y in zip(ab, bb)])
    else:  # an empty product: numpy.matmul's zeros (K = 0) or empty result
        want = np.zeros(np.matmul(a.astype(np.int64), b.astype(np.int64)).shape, np.int64)
    want = np.asarray(want).reshape(np.matmul(a.astype(np.int64), b.astype(np.int64)).shape).astype(np.int32)
    assert_exact(got, want)
    if SATURATES is not None and 0 not in ashape + bshape:
        y, _ = _ort("MatMulInteger", [("a", a), ("b", b), ("azp", azp), ("bzp", bzp)], {"b", "azp", "bzp"})
        assert_exact(y, want if SATURATES else qlinear.matmul_integer(a, b, azp, bzp))


CONV_CASES = [(3, 4, 1, 3, [1, 0, 1, 1], [1, 1]), (8, 6, 2, 2, [0, 1, 1, 0], [2, 1]),
              (4, 4, 4, 3, [1, 1, 1, 1], [1, 2]), (5, 2, 1, 1, [0, 0, 0, 0], [1, 1])]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_emulated_conv_integer_int8_x_uint8_w(case):
    """ConvInteger saturates with int8 x and uint8 w (measured; depthwise too), NCHW order."""
    c, m, group, k, pads, strides = CONV_CASES[case]
    rng = np.random.default_rng(400 + case)
    x = rand_int(rng, I8, (1, c, 5, 6))
    w = rand_int(rng, U8, (m, c // group, k, k))
    xzp, wzp = rand_int(rng, I8, ()), rand_int(rng, U8, ())
    attrs = dict(pads=pads, strides=strides, group=group)
    acc = conv_acc_oracle(x, w, xzp, wzp, "channels, taps", pads, strides, group)
    want = np.vectorize(_wrap32, otypes=[np.int64])(acc).astype(np.int32)
    assert_exact(ortsat.emulate_conv_integer(x, w, xzp, wzp, **attrs), want)
    assert ortsat.emulate_conv_integer(x.view(U8), w.view(I8), xzp.view(U8), wzp.view(I8), **attrs) is None
    if SATURATES is not None:
        got, _ = _ort("ConvInteger", [("x", x), ("w", w), ("xzp", xzp), ("wzp", wzp)], {"w", "xzp", "wzp"},
                      attrs, opset=10)
        assert_exact(got, want if SATURATES else oracle.conv_integer(x, w, xzp, wzp, **attrs))


@pytest.mark.parametrize("case", range(len(CONV_CASES) - 1))
def test_emulated_qlinear_conv(case):
    c, m, group, k, pads, strides = CONV_CASES[case]
    rng = np.random.default_rng(500 + case)
    x = rand_int(rng, U8, (1, c, 5, 6))
    w = rand_int(rng, I8, (m, c // group, k, k))
    xzp = rand_int(rng, U8, ())
    wzp = rand_int(rng, I8, (m,), -20, 20)  # per-channel zero points that differ (onnxruntime takes them)
    ws = rand_scale(rng, (m,))
    B = rng.integers(-2000, 2000, m).astype(np.int32)
    ys, yzp = np.float32(rng.uniform(1, 4)), U8(120)
    attrs = dict(pads=pads, strides=strides, group=group)
    emu = ortsat.emulate_qlinear_conv(x, np.float32(0.05), xzp, w, ws, wzp, ys, yzp, B, **attrs)
    if c // group == 1 and m // group == 1:  # depthwise: onnxruntime accumulates exactly
        assert emu is None
        want = oracle.qlinear_conv(x, np.float32(0.05), xzp, w, ws, wzp, ys, yzp, B, **attrs)
    else:
        acc = conv_acc_oracle(x, w, xzp, wzp, "taps, channels", pads, strides, group) + B.reshape(1, -1, 1, 1)
        mult = ((np.float32(0.05) * ws).astype(np.float32) / ys).astype(np.float32).reshape(1, -1, 1, 1)
        want = requantize_oracle(acc, mult, yzp)
        assert_exact(emu, want)
    if SATURATES is not None:
        names = ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "B"]
        vals = [x, np.float32(0.05), xzp, w, ws, wzp, ys, yzp, B]
        got, _ = _ort("QLinearConv", list(zip(names, vals)), set(names[1:]), attrs, opset=10, out=T.UINT8)
        assert_exact(got, want if SATURATES else
                     oracle.qlinear_conv(x, np.float32(0.05), xzp, w, ws, wzp, ys, yzp, B, **attrs))


def _four_op_model():
    """QLinearConv -> QLinearMatMul on uint8 x int8, and MatMulInteger (u8 x s8) and
    ConvInteger (s8 x u8) side by side: the four saturating kernels, full-range weights."""
    rng = np.random.default_rng(7)
    inits = {
        "xs": np.float32(0.05), "xzp": U8(100), "w": rand_int(rng, I8, (6, 4, 3, 3)),
        "ws": rand_scale(rng, (6,)), "wzp": np.zeros(6, I8), "ys": np.float32(2.0), "yzp": U8(128),
        "b": rand_int(rng, I8, (7, 5)), "bs": np.float32(0.01), "bzp": I8(0), "ms": np.float32(0.5),
        "mzp": U8(128), "bi": rand_int(rng, I8, (7, 3)), "azp": U8(3), "bizp": I8(-2),
        "wc": rand_int(rng, U8, (2, 3, 2, 2)), "czp": I8(5), "wczp": U8(100),
    }
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QLinearMatMul", ["c", "ys", "yzp", "b", "bs", "bzp", "ms", "mzp"], ["y1"]),
        helper.make_node("MatMulInteger", ["c", "bi", "azp", "bizp"], ["y2"]),
        helper.make_node("ConvInteger", ["xi", "wc", "czp", "wczp"], ["y3"]),
    ]
    g = helper.make_graph(nodes, "four", [helper.make_tensor_value_info("x", T.UINT8, [1, 4, 6, 7]),
                                          helper.make_tensor_value_info("xi", T.INT8, [1, 3, 5, 5])],
                          [helper.make_tensor_value_info("y1", T.UINT8, None),
                           helper.make_tensor_value_info("y2", T.INT32, None),
                           helper.make_tensor_value_info("y3", T.INT32, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": rand_int(rng, U8, (1, 4, 6, 7)), "xi": rand_int(rng, I8, (1, 3, 5, 5))}
    return model, feeds, inits


def test_backend_emulate_runs_the_four_kernels():
    model, feeds, p = _four_op_model()
    rep = backend.prepare(model, emulate="onnxruntime-avx2")
    y1, y2, y3 = rep.run(feeds)
    exact = backend.prepare(model).run(feeds)
    c = ortsat.emulate_qlinear_conv(feeds["x"], p["xs"], p["xzp"], p["w"], p["ws"], p["wzp"], p["ys"], p["yzp"],
                                    pads=[1, 1, 1, 1])
    assert_exact(y1, ortsat.emulate_qlinear_matmul(c, p["ys"], p["yzp"], p["b"], p["bs"], p["bzp"], p["ms"], p["mzp"]))
    assert_exact(y2, ortsat.emulate_matmul_integer(c, p["bi"], p["azp"], p["bizp"]))
    assert_exact(y3, ortsat.emulate_conv_integer(feeds["xi"], p["wc"], p["czp"], p["wczp"]))
    assert all(not np.array_equal(e, x) for e, x in zip((y1, y2, y3), exact))  # the emulation bites
    if SATURATES:
        import onnxruntime as rt

        so = rt.SessionOptions()
        so.log_severity_level = 4
        got = rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
        for g_, e in zip(got, (y1, y2, y3)):
            assert_exact(g_, e)


def test_backend_emulate_bad_name():
    model, _, _ = _four_op_model()
    with pytest.raises(ValueError, match="emulate must be one of 'onnxruntime-avx2'"):
        backend.prepare(model, emulate="onnxruntime-avx512")


def test_emulation_keeps_validation_errors():
    """An emulated QLinearConv still validates its inputs: x with 3 channels against weights
    of 4 is refused by the operator (x's declared shape is dropped, so that run's own check
    against the declaration does not refuse it first)."""
    model, feeds, _ = _four_op_model()
    x_info = next(i for i in model.graph.input if i.name == "x")
    x_info.type.tensor_type.ClearField("shape")
    rep = backend.prepare(model, emulate="onnxruntime-avx2")
    with pytest.raises(ValueError, match="QLinearConv"):
        rep.run({"x": feeds["x"][:, :3], "xi": feeds["xi"]})


# --------------------------------------------------------------------------- compare's verdicts


def test_compare_tensor_verdicts():
    i = np.array([1, 2, 3], np.uint8)
    assert compare_tensor(i, i.copy())["verdict"] == "identical"
    c = compare_tensor(i, np.array([1, 2, 4], np.uint8))
    assert c["verdict"] == "DIFFER" and c["max_steps"] == 1
    f = np.array([1.0, -2.0, 0.5], np.float32)
    assert compare_tensor(f, f.copy())["verdict"] == "identical"
    g = f.copy()
    g[0] = np.nextafter(g[0], np.float32(2))
    c = compare_tensor(g, f)
    assert c["verdict"] == "within tolerance" and c["max_ulp"] == 1 and c["max_abs"] > 0
    assert compare_tensor(g, f, atol=0, rtol=0)["verdict"] == "DIFFER"
    assert compare_tensor(g, f, atol=0, rtol=0, ulp=1)["verdict"] == "within tolerance"
    c = compare_tensor(f + np.float32(0.01), f)
    assert c["verdict"] == "DIFFER" and c["outside"] == 3 and abs(c["max_abs"] - 0.01) < 1e-6
    # near zero: the ulp figure would be ~8.7e8; the absolute difference says it
    near = compare_tensor(np.array([1.8e-7], np.float32), np.array([0.0], np.float32))
    assert near["verdict"] == "within tolerance" and near["max_ulp"] is None and near["max_rel"] is None
    nan = np.array([np.nan], np.float32)
    assert compare_tensor(nan, nan.copy())["verdict"] == "identical"
    assert compare_tensor(nan, np.array([1.0], np.float32))["verdict"] == "DIFFER"
    assert compare_tensor(i, i.astype(np.int8))["verdict"] == "DIFFER"


def test_compare_outputs_use_the_normal_session(monkeypatch):
    """Outputs come from a session on the unmodified model, nodes from the exposed copy; times
    are warm medians of plain runs."""
    from qlinear.tools import compare

    model, feeds, _ = _four_op_model()
    sessions = []
    real = compare._session

    def spy(m):
        sessions.append(len(m.graph.output))
        return real(m)

    monkeypatch.setattr(compare, "_session", spy)
    r = compare_model(model, feeds, show_progress=False, timing_budget=0.0, timing_runs=3)
    assert sessions[0] == 3 and sessions[1] > 3  # normal session first, then the exposed copy
    assert "normal session" in r["onnxruntime_outputs"]
    for side in ("qlinear", "onnxruntime"):
        assert set(r["seconds"][side]) == {"first", "median", "runs"} and r["seconds"][side]["runs"] >= 1


def _dynamic_quantize_model():
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"],
                                            name="dql")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", T.UINT8, x.shape),
                           helper.make_tensor_value_info("ys", T.FLOAT, []),
                           helper.make_tensor_value_info("yz", T.UINT8, [])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), {"x": x}


def _perturbed_exposed_run(monkeypatch, change):
    """compare's intermediates-exposed onnxruntime run, its values changed by ``change``: the
    row figures and diagnoses are then checked against differences known in advance."""
    from qlinear.tools import compare

    real = compare.run_onnxruntime

    def run(model, feeds):
        vals = real(model, feeds)
        change(vals)
        return vals

    monkeypatch.setattr(compare, "run_onnxruntime", run)


def test_compare_row_keeps_steps_and_float_differences_apart(monkeypatch):
    """A node with a uint8 and a float output that both differ (DynamicQuantizeLinear's y by 15
    steps, its scale by a relative 1e-3): the row said 'abs 15, rel 0.001' (the steps taken
    as an absolute difference, next to the scale's relative one); it says both, each in its
    unit."""
    from qlinear.tools.compare import format_report

    model, feeds = _dynamic_quantize_model()

    def change(vals):
        vals["y"] = vals["y"].copy()
        vals["y"].flat[0] = vals["y"].flat[0] + 15 if vals["y"].flat[0] < 128 else vals["y"].flat[0] - 15
        vals["ys"] = (vals["ys"] * np.float32(1.001)).astype(np.float32)

    _perturbed_exposed_run(monkeypatch, change)
    r = compare_model(model, feeds, show_progress=False, timing_budget=0.0, timing_runs=1)
    row = r["nodes"][0]
    assert (row["max_diff"], row["unit"]) == (15, "steps"), row
    scale = float(np.asarray(backend.prepare(model).run(feeds)[1]))
    assert row["max_abs"] == pytest.approx(scale * 1e-3, rel=1e-3), row
    assert row["max_rel"] == pytest.approx(1e-3, rel=1e-2), row
    line = next(ln for ln in format_report(r).splitlines() if ln.startswith("dql "))
    assert "15 steps; abs " in line and "abs 15" not in line, line


def test_compare_diagnosis_checks_every_output_of_the_node(monkeypatch):
    """onnxruntime's DynamicQuantizeLinear scale changed, y left alone: re-running the node on
    onnxruntime's inputs reproduces y but not the scale. The diagnosis looked at the first
    output only and said 'agrees on onnxruntime's inputs' (while own_verdict said DIFFER)."""
    model, feeds = _dynamic_quantize_model()

    def change(vals):
        vals["ys"] = (vals["ys"] * np.float32(1.001)).astype(np.float32)

    _perturbed_exposed_run(monkeypatch, change)
    r = compare_model(model, feeds, show_progress=False, timing_budget=0.0, timing_runs=1)
    row = r["nodes"][0]
    assert row["own_verdict"] == "DIFFER" and row["mismatches"] == 1, row
    assert "agrees" not in row["diagnosis"] and row["diagnosis"].startswith("float arithmetic differs"), row


def test_compare_diagnoses_a_node_whose_subgraph_reads_a_differing_tensor(monkeypatch):
    """An If whose branches read an outer tensor that differs (here onnxruntime's is changed):
    the If row had an empty diagnosis (re-run alone, the node lacked the outer tensor, and its
    inputs counted as equal). It is re-run with the outer tensors it reads: propagated."""
    c = numpy_helper.from_array(np.array(True), "c")
    one = numpy_helper.from_array(np.float32(1), "one")
    branch = lambda out: helper.make_graph(  # noqa: E731
        [helper.make_node("Neg", ["y"], [out])], out, [],
        [helper.make_tensor_value_info(out, T.FLOAT, None)])
    g = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"], name="add"),
                           helper.make_node("If", ["c"], ["o"], then_branch=branch("t"),
                                            else_branch=branch("e"), name="if")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [3])],
                          [helper.make_tensor_value_info("o", T.FLOAT, None)], [c, one])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])

    def change(vals):
        vals["y"] = vals["y"] + np.float32(1)
        vals["o"] = -vals["y"]

    _perturbed_exposed_run(monkeypatch, change)
    r = compare_model(model, {"x": np.arange(3, dtype=np.float32)}, show_progress=False,
                      timing_budget=0.0, timing_runs=1)
    add, if_ = r["nodes"]
    assert add["diagnosis"].startswith("float arithmetic differs"), add
    assert (if_["mismatches"], if_["diagnosis"]) == (3, "propagated (agrees on onnxruntime's inputs)"), if_
    assert if_["own_verdict"] == "identical", if_


def test_compare_does_not_claim_no_pair_sum_saturates_when_some_do(monkeypatch):
    """A QLinearMatMul whose pair sums exceed 32767 (checked here with the explicit-loop model)
    but whose coarse output scale rounds the saturated sums to the exact outputs; onnxruntime's
    value is changed by one step, another cause. The row said 'not explained by 16-bit
    saturation (no pair sum exceeds 32767)', false; it says what was checked."""
    r = np.random.default_rng(0)
    a = r.integers(200, 256, (4, 32)).astype(U8)
    b = (r.integers(100, 128, (32, 8)) * r.choice([-1, 1], (32, 8))).astype(I8)
    inits = {"as": np.float32(0.01), "az": U8(0), "b": b, "bs": np.float32(0.01), "bz": I8(0),
             "ys": np.float32(100.0), "yz": U8(128)}
    g = helper.make_graph([helper.make_node("QLinearMatMul", ["a", *inits], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("a", T.UINT8, a.shape)],
                          [helper.make_tensor_value_info("y", T.UINT8, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert any(pair_saturated_dot([int(v) for v in a[0]], [int(v) for v in b[:, j]])
               != int(a[0].astype(np.int64) @ b[:, j].astype(np.int64)) for j in range(8))
    params = [a, *[inits[k] for k in ("as", "az", "b", "bs", "bz", "ys", "yz")]]
    assert np.array_equal(ortsat.emulate_qlinear_matmul(*params), qlinear.qlinear_matmul(*params))

    def change(vals):
        vals["y"] = vals["y"].copy()
        vals["y"].flat[0] += 1

    _perturbed_exposed_run(monkeypatch, change)
    row = compare_model(model, {"a": a}, show_progress=False, timing_budget=0.0,
                        timing_runs=1)["nodes"][0]
    assert row["diagnosis"] == "not explained by 16-bit saturation (emulating it changes no value)", row


def test_compare_row_of_a_sequence_is_not_compared_not_identical():
    """onnxruntime's intermediates-exposed run returns no sequence: SequenceConstruct's row
    said 'identical' (0 elements) for a value never compared. It says 'not compared', why,
    and the summary line counts it."""
    from qlinear.tools.compare import format_report

    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"], name="mk"),
             helper.make_node("SequenceAt", ["s", "i"], ["y"], name="at")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [3])],
                          [numpy_helper.from_array(np.int64(1), "i")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    r = compare_model(model, {"x": np.arange(3, dtype=np.float32)}, show_progress=False,
                      timing_budget=0.0, timing_runs=1)
    mk, at = r["nodes"]
    assert (mk["verdict"], mk["max_diff"], mk["own_verdict"]) == ("not compared", None, None), mk
    assert mk["diagnosis"] == "not compared: 's' (sequence) is not among onnxruntime's results"
    assert at["verdict"] == "identical" and at["elements"] == 3 and r["verdict"] == "identical"
    text = format_report(r)
    assert "0 of 2 nodes not bit-identical (1 not compared);" in text, text


def _contrib_gemm_model(op):
    """One com.microsoft node on onnxruntime's u8 x s8 GEMM, every pair sum of the operands
    above 32767 in magnitude (uint8 in [200, 255], |int8| in [100, 127])."""
    r = np.random.default_rng(0)
    a = r.integers(200, 256, (4, 32)).astype(U8)
    b = (r.integers(100, 128, (32, 8)) * r.choice([-1, 1], (32, 8))).astype(I8)
    inits = {"b": b, "as": np.float32(0.01), "bs": np.float32(0.01), "az": U8(0), "bz": I8(0),
             "ys": np.float32(0.5), "yz": U8(128)}
    ins = {"QGemm": ["a", "as", "az", "b", "bs", "bz", "", "ys", "yz"],
           "MatMulIntegerToFloat": ["a", "b", "as", "bs", "az", "bz"]}[op]
    out = T.UINT8 if op == "QGemm" else T.FLOAT
    g = helper.make_graph([helper.make_node(op, ins, ["y"], domain="com.microsoft", name="n")], "g",
                          [helper.make_tensor_value_info("a", T.UINT8, a.shape)],
                          [helper.make_tensor_value_info("y", out, None)],
                          [numpy_helper.from_array(np.asarray(inits[k]), k) for k in ins if k and k != "a"])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                                helper.make_opsetid("com.microsoft", 1)])
    return model, a, b


@pytest.mark.parametrize("op", ["QGemm", "MatMulIntegerToFloat"])
def test_compare_diagnoses_saturation_of_contrib_gemm_operators(op):
    """QGemm and MatMulIntegerToFloat run on the same saturating u8 x s8 GEMM as QLinearMatMul.
    compare diagnosed only the four standard operators: a saturating MatMulIntegerToFloat row
    said 'float arithmetic differs (max abs 8.72, max rel 3.71)', the wrong cause. The pair
    sums are checked here with the explicit-loop model, and the diagnosis must match what this
    machine's onnxruntime does."""
    model, a, b = _contrib_gemm_model(op)
    sat = [pair_saturated_dot([int(v) for v in a[i]], [int(v) for v in b[:, j]])
           for i in range(a.shape[0]) for j in range(b.shape[1])]
    exact = (a.astype(np.int64) @ b.astype(np.int64)).ravel().tolist()
    assert sat != exact  # the pair sums saturate (the zero points are 0)
    r = compare_model(model, {"a": a}, show_progress=False, timing_budget=0.0, timing_runs=1)
    e = compare_model(model, {"a": a}, show_progress=False, timing_budget=0.0, timing_runs=1,
                      emulate="onnxruntime-avx2")
    row, erow = r["nodes"][0], e["nodes"][0]
    if SATURATES:
        assert row["verdict"] == "DIFFER" and row["diagnosis"].startswith(
            "onnxruntime 16-bit saturation (u8 x s8 pair sums > 32767); emulating it reproduces "
            "onnxruntime exactly"), row
        assert erow["verdict"] == "identical", erow
    else:
        assert row["verdict"] == "identical", row
        assert erow["diagnosis"].startswith("onnxruntime here is exact; with AVX2 and no VNNI its "
                                            "16-bit saturation changes"), erow


@NEEDS_SATURATING
def test_compare_four_ops_saturating_here():
    model, feeds, _ = _four_op_model()
    r = compare_model(model, feeds, show_progress=False)
    assert r["verdict"] == "DIFFER"
    assert compare_model(model, feeds, show_progress=False, emulate="onnxruntime-avx2")["verdict"] == "identical"


@NEEDS_EXACT
def test_compare_four_ops_exact_here():
    model, feeds, _ = _four_op_model()
    assert compare_model(model, feeds, show_progress=False)["verdict"] == "identical"
    r = compare_model(model, feeds, show_progress=False, emulate="onnxruntime-avx2")
    assert r["verdict"] == "DIFFER"
    assert any("saturation changes" in row["diagnosis"] for row in r["nodes"])


# --------------------------------------------------------------------------- model-local functions


def _function_model():
    rng = np.random.default_rng(11)
    x = rand_int(rng, U8, (2, 16, 12, 12))
    w = rand_int(rng, I8, (16, 16, 3, 3))
    ws = rand_scale(rng, (16,), 1e-3, 3e-3)
    fn = helper.make_function(
        "local", "qconv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"],
        [helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], pads=[1, 1, 1, 1])],
        opset_imports=[helper.make_opsetid("", 13)])
    inits = {"xs": np.float32(0.0173), "xzp": U8(131), "w": w, "ws": ws, "wzp": np.zeros(16, I8),
             "ys": np.float32(0.0371), "yzp": U8(121)}
    g = helper.make_graph([helper.make_node("qconv", ["x", *inits], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", T.UINT8, x.shape)],
                          [helper.make_tensor_value_info("y", T.UINT8, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, functions=[fn], opset_imports=[helper.make_opsetid("", 13),
                                                                helper.make_opsetid("local", 1)])
    return model, x, inits


def test_qlinear_conv_inside_a_model_local_function_runs_on_qlinear():
    model, x, p = _function_model()
    want = oracle.qlinear_conv(x, p["xs"], p["xzp"], p["w"], p["ws"], p["wzp"], p["ys"], p["yzp"],
                               pads=[1, 1, 1, 1])
    assert backend.check_model(model) == []
    assert_exact(backend.prepare(model).run([x])[0], want)
    # onnx.reference runs a function's body with its own QLinearConv unless it is inlined;
    # the emulation shows whose kernel ran (onnx.reference's would give the exact values)
    emu = ortsat.emulate_qlinear_conv(x, p["xs"], p["xzp"], p["w"], p["ws"], p["wzp"], p["ys"], p["yzp"],
                                      pads=[1, 1, 1, 1])
    assert not np.array_equal(emu, want)
    assert_exact(backend.prepare(model, emulate="onnxruntime-avx2").run([x])[0], emu)


def test_check_model_looks_inside_functions():
    model, _, _ = _function_model()
    fn = model.functions[0]
    fn.node.append(helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["z"],
                                    name="too_new"))
    fn.node[-1].ClearField("input")
    fn.node[-1].input.extend(["x"] * 8)  # x (uint8) as scales: outside the contract
    problems = backend.check_model(model)
    assert problems and any("QLinearConv" in str(p) for p in problems)


# --------------------------------------------------------------------------- CLI


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"qlinear {qlinear.__version__}"


def test_output_dir_distinct_names_and_manifest(capsys, tmp_path):
    names = ["a/b", "a_b", "a_b_2", "A_B"]
    nodes = [helper.make_node("Relu", ["x"], [names[0]])] + [
        helper.make_node("Add", [names[i - 1], "x"], [names[i]]) for i in range(1, 4)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in names])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([1.0, -1.0], np.float32))
    out = tmp_path / "out"
    rc = cli.main(["run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(out)])
    assert rc == 0, capsys.readouterr().err
    manifest = json.load(open(out / "outputs.json"))["outputs"]
    assert [e["name"] for e in manifest] == names
    files = [e["file"] for e in manifest]
    assert len({f.lower() for f in files}) == 4
    assert sorted(os.listdir(out)) == sorted(files + ["outputs.json"])
    for i, e in enumerate(manifest):
        assert np.array_equal(np.load(out / e["file"]), np.array([1.0, 0.0], np.float32) + i * np.array([1, -1]))
