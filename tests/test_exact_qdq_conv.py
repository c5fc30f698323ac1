"""Exact QDQ Convs on integers (qlinear.qdq.exact_integer_convs, QDQConvTail, the native
``qdqconv`` tail): the rewritten graph gives the same bytes as the float graph it replaces, on
every engine and ISA level, and the rewrite is refused where the float32 result may round."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qlinear import _native, backend
from qlinear.passes import exact_convs as qdq
from qlinear.backend import QLinearRep, apply_qdq, topologically_sorted

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models")
RETINAFACE = os.path.join(os.environ.get("QLINEAR_MODELS", "/work/shared/models"),
                          "retinaface_vitisai_qdq.onnx")


def _levels():
    """Context managers for every engine and ISA level this machine runs."""
    out = [("numpy", lambda: _native.use_engine("numpy"))]
    if _native.available():
        out += [(isa, lambda isa=isa: _native.use_isa(isa)) for isa in _native.engine_info()["isas"]]
    return out


def _qdq_conv_model(rng, *, x_type=T.UINT8, zx=128, w_type=T.INT8, cin=8, cout=12, k=3, group=1,
                    hw=(9, 11), strides=(1, 1), pads=(1, 1, 1, 1), ex=-3, ew=-6, eb=-8,
                    per_channel=False, act=None, alpha=0.1015625, q=True, y_scale=2.0 ** -2,
                    y_type=T.UINT8, zy=100, w_range=127, b_dtype=np.int32, b_range=2000):
    """DequantizeLinear(x) -> Conv(DequantizeLinear(w), DequantizeLinear(b)) -> [act] -> [Q],
    with power-of-two scales 2^ex, 2^ew (per channel: 2^(ew - c % 3)), 2^eb."""
    xdt = np.uint8 if x_type == T.UINT8 else np.int8
    wdt = np.int8 if w_type == T.INT8 else np.uint8
    lo, hi = (-w_range, w_range) if wdt == np.int8 else (0, 255)
    w = rng.integers(lo, hi + 1, size=(cout, cin // group, k, k)).astype(wdt)
    b = rng.integers(-b_range, b_range + 1, size=cout).astype(b_dtype)
    sw = (np.float32(2.0 ** ew) * np.float32(2.0) ** -(np.arange(cout) % 3)).astype(np.float32) \
        if per_channel else np.array(2.0 ** ew, np.float32)
    zw = np.zeros(cout if per_channel else (), wdt) + (0 if wdt == np.int8 else 128)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(sw, "sw"),
             numpy_helper.from_array(zw.astype(wdt), "zw"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(2.0 ** eb, np.float32), "sb"),
             numpy_helper.from_array(np.array(2.0 ** ex, np.float32), "sx"),
             numpy_helper.from_array(np.array(zx, xdt), "zx"),
             numpy_helper.from_array(np.array(y_scale, np.float32), "sy"),
             numpy_helper.from_array(np.array(zy, np.uint8 if y_type == T.UINT8 else np.int8), "zy")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], kernel_shape=[k, k], group=group,
                              strides=list(strides), pads=list(pads))]
    last = "c"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["a"]))
        last = "a"
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", ["c"], ["a"], alpha=alpha))
        last = "a"
    if q:
        nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["y"]))
        out = helper.make_tensor_value_info("y", y_type, None)
    else:
        out = helper.make_tensor_value_info(last, T.FLOAT, None)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [1, cin, *hw])],
                          [out], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.integers(0 if xdt == np.uint8 else -128, 256 if xdt == np.uint8 else 128,
                     size=(1, cin, *hw)).astype(xdt)
    return m, {"x": x}


def _both(m):
    """(the prepared model, the float graph as it ran before the rewrite)."""
    return backend.prepare(m), QLinearRep(apply_qdq(topologically_sorted(m)))


def _rewritten(rep) -> int:
    return sum(n.op_type == "ConvInteger" for n in rep.model.graph.node)


def _same_on_every_level(new, old, feeds):
    for name, level in _levels():
        with level():
            for _ in range(2):  # the second run on the bound short paths
                a, b = new.run(feeds), old.run(feeds)
            for x, y in zip(a, b):
                assert x.dtype == y.dtype and x.shape == y.shape, name
                assert x.tobytes() == y.tobytes(), f"{name}: {np.sum(x != y)} values differ"


CASES = [
    dict(),
    dict(act="Relu"),
    dict(act="LeakyRelu"),
    dict(act="LeakyRelu", alpha=0.1),  # not a short mantissa: the float32 product rounds
    dict(act="LeakyRelu", alpha=0.0),
    dict(act="LeakyRelu", alpha=1.0),
    dict(act="Relu", x_type=T.INT8, zx=-3, y_type=T.INT8, zy=-5),
    dict(act="LeakyRelu", y_scale=0.3),  # y_scale not a power of two: a true division
    dict(per_channel=True, act="Relu", strides=(2, 2)),
    dict(group=8, cin=8, cout=16, act="LeakyRelu"),  # depthwise with a channel multiplier
    dict(k=1, pads=(0, 0, 0, 0), act="Relu"),
    dict(w_type=T.UINT8, act="LeakyRelu"),
    dict(b_dtype=np.int8, b_range=127, eb=-4, act="Relu"),  # Vitis AI's int8 bias
    dict(q=False),  # no QuantizeLinear: Cast, Mul and Add
    dict(act="Relu", q=False),
    dict(y_scale=2.0 ** -9, act="LeakyRelu"),  # saturates often
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_rewrite_gives_the_float_graphs_bytes(case):
    rng = np.random.default_rng(7)
    m, feeds = _qdq_conv_model(rng, **case)
    new, old = _both(m)
    assert _rewritten(new) == 1 and _rewritten(old) == 0
    tail = any(n.op_type == "QDQConvTail" for n in new.model.graph.node)
    assert tail == case.get("q", True)
    _same_on_every_level(new, old, feeds)
    # extreme inputs: every x at one end of its range (the largest sums), and at the zero point
    x = feeds["x"]
    info = np.iinfo(x.dtype)
    for v in (info.min, info.max):
        _same_on_every_level(new, old, {"x": np.full_like(x, v)})


def _concat_model(rng, acts=("Relu", "LeakyRelu", None), inexact=None, y_type=T.UINT8, zy=7):
    """Three DQ -> Conv (3x3, 5x5, 1x1) -> [act] branches from one input, Concat on channels,
    one QuantizeLinear (retinaface's SSH modules). ``inexact``: the branch whose weight scale is
    not a power of two (its Conv stays float, so the Concat must stay float too)."""
    nodes, inits = [], []
    xs = np.array(2.0 ** -3, np.float32)
    inits += [numpy_helper.from_array(xs, "sx"), numpy_helper.from_array(np.array(128, np.uint8), "zx"),
              numpy_helper.from_array(np.array(2.0 ** -2, np.float32), "sy"),
              numpy_helper.from_array(np.array(zy, np.uint8 if y_type == T.UINT8 else np.int8), "zy")]
    branch_outs = []
    for k, (ks, act) in enumerate(zip((3, 5, 1), acts)):
        w = rng.integers(-127, 128, size=(4 + k, 6, ks, ks)).astype(np.int8)
        b = rng.integers(-3000, 3001, size=4 + k).astype(np.int32)
        sw = np.array(0.3 if inexact == k else 2.0 ** -7, np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(sw, f"sw{k}"),
                  numpy_helper.from_array(b, f"b{k}"),
                  numpy_helper.from_array(np.array(2.0 ** -10, np.float32), f"sb{k}")]
        nodes += [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], [f"xf{k}"]),
                  helper.make_node("DequantizeLinear", [f"w{k}", f"sw{k}"], [f"wf{k}"]),
                  helper.make_node("DequantizeLinear", [f"b{k}", f"sb{k}"], [f"bf{k}"]),
                  helper.make_node("Conv", [f"xf{k}", f"wf{k}", f"bf{k}"], [f"c{k}"],
                                   kernel_shape=[ks, ks], pads=[ks // 2] * 4)]
        if act is None:
            branch_outs.append(f"c{k}")
        else:
            nodes.append(helper.make_node(act, [f"c{k}"], [f"a{k}"], **({"alpha": 0.1} if act == "LeakyRelu" else {})))
            branch_outs.append(f"a{k}")
    nodes += [helper.make_node("Concat", branch_outs, ["cat"], axis=1),
              helper.make_node("QuantizeLinear", ["cat", "sy", "zy"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.UINT8, [1, 6, 10, 13])],
                          [helper.make_tensor_value_info("y", y_type, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": rng.integers(0, 256, size=(1, 6, 10, 13)).astype(np.uint8)}


@pytest.mark.parametrize("inexact", [None, 1])
@pytest.mark.parametrize("y_type", [T.UINT8, T.INT8])
def test_concat_of_exact_branches_then_quantize(inexact, y_type):
    m, feeds = _concat_model(np.random.default_rng(9), inexact=inexact, y_type=y_type,
                             zy=7 if y_type == T.UINT8 else -7)
    new, old = _both(m)
    ops = [n.op_type for n in new.model.graph.node]
    if inexact is None:  # three tails to 8 bits, the Concat on bytes, no QuantizeLinear left
        assert ops.count("QDQConvTail") == 3 and "QuantizeLinear" not in ops and "Conv" not in ops
    else:  # the float Concat stays: the exact branches end in Cast, Mul, Add
        assert ops.count("QDQConvTail") == 0 and ops.count("Conv") == 1 and ops.count("Cast") == 2
    _same_on_every_level(new, old, feeds)
    for v in (0, 255):
        _same_on_every_level(new, old, {"x": np.full_like(feeds["x"], v)})


def _worst_case(rng, cin=128):
    """Weights at +-127 everywhere: 128 * 127 * 1152 = 18.7M > 2^24 units per output."""
    m, feeds = _qdq_conv_model(rng, cin=cin, cout=4, act="Relu", b_range=0)
    w = (np.where(rng.random((4, cin, 3, 3)) < 0.5, -127, 127)).astype(np.int8)
    for t in m.graph.initializer:
        if t.name == "w":
            t.CopyFrom(numpy_helper.from_array(w, "w"))
    return m, feeds


def test_refused_above_the_bound_and_where_the_float_sum_rounds(monkeypatch):
    rng = np.random.default_rng(3)
    m, _ = _worst_case(rng)
    g = qdq._Graph(apply_qdq(topologically_sorted(m)))
    conv = next(n for n in g.nodes if n.op_type == "Conv")
    # the worst case of this Conv exceeds 2^24 units: refused
    w = g.const(g.producer[conv.input[1]].input[0]).astype(np.int64)
    assert 128 * np.abs(w.reshape(4, -1)).sum(1).max() >= 2 ** 24
    assert qdq._exact_conv_plan(g, conv) is None
    assert _rewritten(backend.prepare(m)) == 0
    # Forcing the rewrite where its condition fails (scales that are not powers of two, taken
    # as the power of two below them) changes the bytes: the comparison above can fail.
    m2, feeds = _qdq_conv_model(np.random.default_rng(4), act="LeakyRelu")
    for t in m2.graph.initializer:
        if t.name in ("sw", "sx"):
            t.CopyFrom(numpy_helper.from_array(np.array(0.3, np.float32), t.name))
    new, old = _both(m2)
    assert _rewritten(new) == 0

    def any_exponent(v):
        v = np.asarray(v)
        return None if v.dtype != np.float32 else np.frexp(v.astype(np.float64))[1].astype(np.int64) - 1

    monkeypatch.setattr(qdq, "_power_of_two_exponents", any_exponent)
    forced = backend.prepare(m2)
    assert _rewritten(forced) == 1
    assert forced.run(feeds)[0].tobytes() != old.run(feeds)[0].tobytes()


@pytest.mark.parametrize("change", ["scale", "no_bias", "graph_output", "two_consumers", "huge_scales"])
def test_not_rewritten(change):
    rng = np.random.default_rng(5)
    m, feeds = _qdq_conv_model(rng, act="Relu")
    g = m.graph
    if change == "scale":  # a scale that is not a power of two: the products round
        for t in g.initializer:
            if t.name == "sw":
                t.CopyFrom(numpy_helper.from_array(np.array(0.3, np.float32), "sw"))
    elif change == "no_bias":  # without a bias the float Conv may give -0.0 where acc gives +0.0
        conv = next(n for n in g.node if n.op_type == "Conv")
        del conv.input[2]
    elif change == "graph_output":  # the Relu's float output is read by the caller
        g.output.append(helper.make_tensor_value_info("a", T.FLOAT, None))
    elif change == "two_consumers":  # x's DequantizeLinear also feeds another node
        g.node.append(helper.make_node("Relu", ["xf"], ["xr"]))
        g.output.append(helper.make_tensor_value_info("xr", T.FLOAT, None))
    elif change == "huge_scales":  # 2^40 * 2^40 (products near 2^100; the sum bound refuses it too)
        for t in g.initializer:
            if t.name in ("sx", "sw"):
                t.CopyFrom(numpy_helper.from_array(np.array(2.0 ** 40, np.float32), t.name))
    new, old = _both(m)
    tails = sum(n.op_type == "QDQConvTail" for n in new.model.graph.node)
    if change == "graph_output":
        assert _rewritten(new) == 1 and tails == 0  # the Conv is, its tail is not
    elif change == "two_consumers":
        assert _rewritten(new) == 1  # ensure_unique_dq gave the Conv its own DequantizeLinear
    else:
        assert _rewritten(new) == 0
    _same_on_every_level(new, old, feeds)


def test_not_under_emulation_nor_literal():
    m, _ = _qdq_conv_model(np.random.default_rng(1), act="Relu")
    assert _rewritten(backend.prepare(m, emulate="onnxruntime-avx2")) == 0
    assert _rewritten(backend.prepare(m, qdq="literal")) == 0


def test_only_where_conv_integer_is_the_faster_form():
    """prepare rewrites at the native engine's SIMD levels only: not on the NumPy engine, not
    at the portable scalar level (ConvInteger slower there than the float Conv's BLAS); the
    command's run builds the same graph as prepare (model_as_run)."""
    m, _ = _qdq_conv_model(np.random.default_rng(2), act="Relu")
    for name, level in _levels():
        with level():
            want = 0 if name in ("numpy", "scalar") else 1
            assert _rewritten(backend.prepare(m)) == want, name
            ran = backend.model_as_run(topologically_sorted(m))
            assert sum(n.op_type == "ConvInteger" for n in ran.graph.node) == want, name


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
def test_native_tail_equals_the_numpy_composition():
    """``qdqconv`` against the float graph's functions on random accumulators within the
    bound, with rounding ties, saturation, both signs, every activation, at every level."""
    from qlinear.graph.kernels.float import leaky_relu, relu
    from qlinear.quantize import quantize_linear

    rng = np.random.default_rng(11)
    for n, m, plane in ((1, 5, 37), (2, 3, 64), (1, 40, 3), (1, 2, 70000)):
        for sy, zy in ((np.float32(2.0 ** -11), np.uint8(3)), (np.float32(0.37), np.int8(-7)),
                       (np.float32(2.0 ** -3), np.int8(0)), (np.float32(0.0123), np.uint8(200))):
            # multipliers 2^-4 .. 2^-8 of y_scale's power of two and accumulators up to 300
            # steps of the output (most values in range, some saturating), the bias a few steps
            e = int(np.frexp(np.float64(sy))[1]) - 1
            k = rng.integers(4, 9, m)
            mult = np.ldexp(np.float32(1), e - k).astype(np.float32)
            acc = (rng.integers(-300, 301, size=(n, m, plane)) << k.reshape(1, m, 1)).astype(np.int32)
            acc += rng.integers(-8, 9, size=acc.shape).astype(np.int32)  # ties and their neighbours
            flat = acc.reshape(-1)
            flat[:4] = [0, 1, -1, (1 << 24) - 1]  # the bound's edge
            bias = (rng.integers(-40, 41, m) * np.float32(2.0 ** (e - 3))).astype(np.float32)
            for act, alpha in ((0, 0.0), (1, 0.0), (2, 0.1015625), (2, 0.1), (2, 1.0)):
                s = acc.astype(np.float32) * mult.reshape(1, m, 1) + bias.reshape(1, m, 1)
                if act == 1:
                    s = relu(s)
                elif act == 2:
                    s = leaky_relu(s, alpha)
                want = quantize_linear(s, np.array(sy), np.array(zy))
                if act == 0 and plane >= 64:  # the inputs reach the rounding, not only the clamps
                    assert 0.2 < np.mean((want != want.min()) & (want != want.max()))
                for isa in _native.engine_info()["isas"]:
                    with _native.use_isa(isa):
                        C = _native.native()
                        out = np.empty(acc.shape, want.dtype)
                        C.qdqconv(C.get_isa(), acc, n * m, m, plane, mult, bias, act, alpha,
                                  float(sy), int(zy), want.dtype == np.int8, out)
                        assert out.tobytes() == want.tobytes(), (isa, act, alpha, sy, n, m, plane)


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
def test_native_tail_on_the_values_where_a_reordering_shows():
    """Accumulators chosen where a plausible slip of the tail changes the output byte: the
    reciprocal of y_scale instead of the division, LeakyRelu's product taken after the
    division instead of before. Random accumulators seldom land there (a 1-ulp difference
    matters only next to a rounding boundary)."""
    from qlinear.graph.kernels.float import leaky_relu
    from qlinear.quantize import quantize_linear

    for sy, alpha in ((np.float32(0.37), 0.1), (np.float32(0.7), 0.3), (np.float32(1.3), 0.2)):
        e = int(np.frexp(np.float64(sy))[1]) - 1
        mult = np.array([2.0 ** (e - 6)], np.float32)
        bias = np.zeros(1, np.float32)
        cand = np.arange(-(1 << 20), 1 << 20, dtype=np.int32)
        s = cand.astype(np.float32) * mult[0]
        want = quantize_linear(leaky_relu(s, alpha), np.array(sy), np.array(0, np.int8))
        v = leaky_relu(s, alpha) * (np.float32(1) / sy)  # the reciprocal
        recip = np.clip(np.rint(v), -128, 127).astype(np.int8)
        d = s / sy
        after = np.clip(np.rint(np.maximum(d, d * np.float32(alpha))), -128, 127).astype(np.int8)
        assert (recip != want).any() and (after != want).any(), (sy, alpha)  # the search finds both
        hard = cand[(recip != want) | (after != want)]
        acc = np.ascontiguousarray(np.resize(hard, 40 * ((hard.size + 39) // 40))).reshape(1, 1, -1)
        ref = quantize_linear(leaky_relu(acc.astype(np.float32) * mult[0], alpha), np.array(sy),
                              np.array(0, np.int8))
        for isa in _native.engine_info()["isas"]:
            with _native.use_isa(isa):
                C = _native.native()
                out = np.empty(acc.shape, np.int8)
                C.qdqconv(C.get_isa(), acc, 1, 1, acc.shape[-1], mult, bias, 2, alpha, float(sy), 0,
                          True, out)
                assert out.tobytes() == ref.tobytes(), (isa, sy, alpha)


@pytest.mark.skipif(not _native.available(), reason="native engine not built")
def test_native_tail_refuses_bad_arguments():
    C = _native.native()
    acc = np.zeros((1, 2, 4), np.int32)
    v = np.ones(2, np.float32)
    out = np.empty(8, np.uint8)
    with pytest.raises(ValueError):
        C.qdqconv(C.get_isa(), acc, 3, 2, 4, v, v, 0, 0.0, 1.0, 0, False, out)  # planes % channels
    with pytest.raises(ValueError):
        C.qdqconv(C.get_isa(), acc, 2, 2, 4, v, v, 3, 0.0, 1.0, 0, False, out)  # act
    with pytest.raises(ValueError):
        C.qdqconv(C.get_isa(), acc, 2, 2, 4, v, v, 0, 0.0, 1.0, 300, False, out)  # zero point
    with pytest.raises(ValueError):
        C.qdqconv(C.get_isa(), acc, 2, 2, 8, v, v, 0, 0.0, 1.0, 0, False, out)  # acc too short


@pytest.mark.skipif(not os.path.exists(RETINAFACE), reason="shared models not present")
def test_retinaface_same_bytes_and_rewritten():
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import graphs

    m = onnx.load(RETINAFACE)
    new, old = _both(m)
    assert _rewritten(new) == 56 and sum(n.op_type == "QDQConvTail" for n in new.model.graph.node) == 47
    feeds = graphs.model_inputs("retinaface_vitisai_qdq", m, 0)
    scaled = {k: (v * np.float32(255 / float(np.abs(v).max()))).astype(np.float32) for k, v in feeds.items()}
    for name, level in _levels()[:2]:  # NumPy and the default level (the others: time)
        with level():
            a, b = new.run(scaled), old.run(scaled)
            assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b)), name
