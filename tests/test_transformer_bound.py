"""The graph runtime's bound paths of the transformer nodes (qlinear/csrc/transformer/bound.c,
qlinear/csrc/python/bind_bound.c): DynamicQuantizeMatMul, QAttention and SkipLayerNormalization
whose weights and parameters are model constants run, from their second or third run on, as
one native call on constants checked once (``dqmm_run``, ``qattention_run``, ``sln_run``).

Each must give exactly what the node's full call gives: the public function of
``qlinear.contrib`` on the same inputs at the same engine and ISA level (itself checked against
the oracle and onnxruntime in tests/test_contrib.py, test_dynamic_matmul.py,
test_attention_native.py), bit for bit, on every run (the first, full; the binding one; the
bound ones), over seeded cases covering every parameter form (per-tensor and per-column scales,
zero points, int8 and uint8 weights, bias or none, every mask form, past or none,
unidirectional) and the inputs whose DynamicQuantizeLinear takes its guarded branch (NaN,
±inf, 1e38: the bound call declines and the full call answers). Each test also checks that the
bound call did run (a counting wrapper around it), so that it cannot pass on the old path alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import qlinear.backend as backend
from qlinear import _native
from qlinear import contrib

from conftest import engine_level_params

pytestmark = pytest.mark.skipif(not _native.available(), reason="native engine not built")

F32 = np.float32
MS = "com.microsoft"
LEVELS = engine_level_params()  # the NumPy engine too: no bound path there, the same results


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def _model(node, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph([node], "bound", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


class _Count:
    """A counting wrapper around the native function ``name`` (installed before the model is
    prepared, so that the bound path captures it)."""

    def __init__(self, monkeypatch, name: str):
        self.calls = 0
        real = getattr(_native._C, name)

        def wrapped(*args):
            self.calls += 1
            return real(*args)
        monkeypatch.setattr(_native._C, name, wrapped)


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.array_equal(_bits(g), _bits(w))


# ----------------------------------------------------------------------- DynamicQuantizeMatMul

def _dqmm_case(seed: int):
    rng = np.random.default_rng(seed)
    M, K, N = [(5, 32, 128), (1, 3, 1), (17, 67, 129), (4, 64, 16), (2, 8, 40)][seed % 5]
    lead = (1,) if seed % 2 else ()
    bt = np.int8 if seed % 3 else np.uint8
    info = np.iinfo(bt)
    B = rng.integers(info.min, info.max + 1, (K, N)).astype(bt)
    per_col = seed % 4 >= 2
    bs = (rng.random(N if per_col else ()) * 0.02 + 1e-4).astype(F32)
    if seed % 5 == 4:
        bz = rng.integers(info.min, info.max + 1, (N,)).astype(bt)  # per column
    elif seed % 2:
        bz = np.array(info.min // 2 + 3 if info.min else 128, bt)
    else:
        bz = None
    bias = rng.standard_normal(N).astype(F32) if seed % 3 != 1 else None
    scale = [1.0, 1e-3, 40.0, 1e-20][seed % 4]
    return (M, K, N, lead), B, bs, bz, bias, rng, scale


def _dqmm_inputs(rng, shape, scale, run):
    a = (rng.standard_normal(shape) * scale).astype(F32)
    kind = run % 7
    if kind == 1:
        a[...] = 0.0  # mx == mn: scale 1
    elif kind == 2:
        a = np.abs(a) + F32(0.5)  # all positive: the zero point at 0
    elif kind == 3:
        a.reshape(-1)[::3] = -0.0
        a.reshape(-1)[1::5] = F32(1e-40)  # subnormals
    elif kind == 4:
        a.reshape(-1)[0] = np.nan  # DynamicQuantizeLinear's guarded branch: the full call
    elif kind == 5:
        a.reshape(-1)[-1] = F32(1e38)
    elif kind == 6:
        a.reshape(-1)[0] = -np.inf
    return a


@pytest.mark.parametrize("engine_level", LEVELS, indirect=True)
@pytest.mark.parametrize("seed", range(10))
def test_dynamic_quantize_matmul_bound_is_the_full_call(engine_level, seed, monkeypatch):
    count = _Count(monkeypatch, "dqmm_run")
    (M, K, N, lead), B, bs, bz, bias, rng, scale = _dqmm_case(seed)
    names = ["a", "B", "bs"] + (["bz"] if bz is not None or bias is not None else [])
    inits = {"B": B, "bs": bs}
    if bz is not None:
        inits["bz"] = bz
    elif bias is not None:
        names[-1] = ""
    if bias is not None:
        names.append("bias")
        inits["bias"] = bias
    node = helper.make_node("DynamicQuantizeMatMul", names, ["y"], domain=MS)
    shape = (*lead, M, K)
    m = _model(node, [helper.make_tensor_value_info("a", T.FLOAT, list(shape))],
               [helper.make_tensor_value_info("y", T.FLOAT, None)], inits)
    rep = backend.prepare(m)
    with np.errstate(all="ignore"):
        for run in range(14):
            a = _dqmm_inputs(rng, shape, scale, run)
            got = rep.run({"a": a})
            want = contrib.dynamic_quantize_matmul(a, B, bs, bz, bias)
            _same(got, [want])
    if engine_level != "numpy":
        assert count.calls >= 6  # the bound call ran (and declined on the guarded inputs)


# ---------------------------------------------------------------------------------- QAttention

MASKS = ("none", "2d", "3d", "end", "end_start")


def _mask(kind, rng, batch, seq, total):
    if kind == "none":
        return None
    if kind == "2d":
        m = (rng.random((batch, total)) > 0.3).astype(np.int32)
        m[:, 0] = 1
        return m
    if kind == "3d":
        m = (rng.random((batch, seq, total)) > 0.3).astype(np.int32)
        m[..., 0] = 1
        return m
    if kind == "end":
        return rng.integers(1, total + 1, batch).astype(np.int32)
    return np.concatenate([rng.integers(total // 2 + 1, total + 1, batch),
                           rng.integers(0, total // 2 + 1, batch)]).astype(np.int32)


@pytest.mark.parametrize("engine_level", LEVELS, indirect=True)
@pytest.mark.parametrize("seed", range(10))
def test_qattention_bound_is_the_full_call(engine_level, seed, monkeypatch):
    count = _Count(monkeypatch, "qattention_run")
    rng = np.random.default_rng(100 + seed)
    batch, seq, past_len, heads, head = [(1, 5, 3, 4, 8), (2, 3, 0, 2, 4), (1, 1, 7, 4, 8), (3, 4, 2, 1, 5),
                                         (1, 6, 1, 3, 2)][seed % 5]
    hidden = heads * head
    hidden_in = [hidden, 7, 16][seed % 3]
    xt = np.uint8 if seed % 2 == 0 else np.int8
    wt = np.int8 if seed % 3 else np.uint8
    wi = np.iinfo(wt)
    w = rng.integers(wi.min, wi.max + 1, (hidden_in, 3 * hidden)).astype(wt)
    bias = rng.standard_normal(3 * hidden).astype(F32)
    ws = (rng.random(3 * hidden if seed % 4 >= 2 else ()) * 0.01 + 1e-4).astype(F32)
    wz = np.array(wi.min // 4 if wi.min else 100, wt) if seed % 2 else np.array(0, wt)
    kind = MASKS[seed % 5]
    total = past_len + seq
    uni = seed % 2
    names = ["x", "w", "bias", "xs", "ws", "mask" if kind != "none" else "", "xz", "wz",
             "past" if past_len else ""]
    while names[-1] == "":
        names.pop()
    attrs = dict(num_heads=heads, unidirectional=uni)
    if seed % 3 == 2:
        attrs["mask_filter_value"] = -3.4028234663852886e38
    if seed % 5 == 3:
        attrs["scale"] = float(F32(0.3))  # an ONNX float attribute: the float32 value
    node = helper.make_node("QAttention", names, ["y", "present"], domain=MS, **attrs)
    xi = np.iinfo(xt)
    ins = [helper.make_tensor_value_info("x", T.UINT8 if xt is np.uint8 else T.INT8, [batch, seq, hidden_in]),
           helper.make_tensor_value_info("xs", T.FLOAT, []),
           helper.make_tensor_value_info("xz", T.UINT8 if xt is np.uint8 else T.INT8, [])]
    if kind != "none":
        ins.append(helper.make_tensor_value_info("mask", T.INT32, None))
    if past_len:
        ins.append(helper.make_tensor_value_info("past", T.FLOAT, [2, batch, heads, past_len, head]))
    outs = [helper.make_tensor_value_info("y", T.FLOAT, None), helper.make_tensor_value_info("present", T.FLOAT, None)]
    rep = backend.prepare(_model(node, ins, outs, {"w": w, "bias": bias, "ws": ws, "wz": wz}))
    with np.errstate(all="ignore"):
        for run in range(8):
            feeds = {"x": rng.integers(xi.min, xi.max + 1, (batch, seq, hidden_in)).astype(xt),
                     "xs": np.array(rng.random() * 0.05 + 1e-3, F32),
                     "xz": np.array(rng.integers(xi.min, xi.max + 1), xt)}
            mask = _mask(kind, rng, batch, seq, total)
            if mask is not None:
                feeds["mask"] = mask
            past = rng.standard_normal((2, batch, heads, past_len, head)).astype(F32) if past_len else None
            if past is not None:
                feeds["past"] = past
            if run == 5:
                # the bound call declines, the full call reports it as the public function does
                feeds["xs"] = np.array(np.inf, F32)
                with pytest.raises(ValueError, match="input_scale must be finite"):
                    rep.run(feeds)
                with pytest.raises(ValueError, match="input_scale must be finite"):
                    contrib.qattention(feeds["x"], w, bias, feeds["xs"], ws, mask, feeds["xz"], wz, past, **attrs)
                continue
            got = rep.run(feeds)
            want = contrib.qattention(feeds["x"], w, bias, feeds["xs"], ws, mask, feeds["xz"], wz, past, **attrs)
            _same(got, want)
    if engine_level != "numpy":
        assert count.calls >= 5


# --------------------------------------------------------------------- SkipLayerNormalization

@pytest.mark.parametrize("engine_level", LEVELS, indirect=True)
@pytest.mark.parametrize("seed", range(6))
def test_skip_layer_normalization_bound_is_the_full_call(engine_level, seed, monkeypatch):
    count = _Count(monkeypatch, "sln_run")
    rng = np.random.default_rng(200 + seed)
    shape = [(1, 5, 32), (2, 3, 7), (4, 129), (1, 1, 1), (3, 2, 200), (2, 300)][seed]
    hidden = shape[-1]
    gamma = rng.standard_normal(hidden).astype(F32)
    beta = rng.standard_normal(hidden).astype(F32) if seed % 2 == 0 else None
    bias = rng.standard_normal(hidden).astype(F32) if seed % 3 != 2 else None
    names = ["x", "skip", "gamma", "beta" if beta is not None else "", "bias" if bias is not None else ""]
    while names[-1] == "":
        names.pop()
    inits = {"gamma": gamma, **({"beta": beta} if beta is not None else {}),
             **({"bias": bias} if bias is not None else {})}
    node = helper.make_node("SkipLayerNormalization", names, ["y", "mean", "inv_std", "sum"], domain=MS,
                            epsilon=1e-5)
    ins = [helper.make_tensor_value_info(n, T.FLOAT, list(shape)) for n in ("x", "skip")]
    outs = [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "mean", "inv_std", "sum")]
    rep = backend.prepare(_model(node, ins, outs, inits))
    with np.errstate(all="ignore"):
        for run in range(6):
            x = (rng.standard_normal(shape) * [1.0, 1e3, 1e-3][run % 3]).astype(F32)
            skip = rng.standard_normal(shape).astype(F32)
            if run == 4:
                x.reshape(-1)[0] = np.nan
                skip.reshape(-1)[-1] = np.inf
            got = rep.run({"x": x, "skip": skip})
            want = contrib.skip_layer_normalization(x, skip, gamma, beta, bias, epsilon=float(F32(1e-5)))
            _same(got, want)
    if engine_level != "numpy":
        assert count.calls >= 3


@pytest.mark.parametrize("engine_level", [p for p in LEVELS if p.id != "numpy"], indirect=True)
def test_bound_paths_follow_a_change_of_shape(engine_level):
    # the bound calls are for one shape: another one takes the full call (and binds again),
    # with the same results as the public functions
    rng = np.random.default_rng(300)
    gamma = rng.standard_normal(16).astype(F32)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "sum"], domain=MS)
    ins = [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("x", "skip")]
    outs = [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "sum")]
    rep = backend.prepare(_model(node, ins, outs, {"gamma": gamma}))
    for shape in [(1, 3, 16)] * 3 + [(2, 5, 16)] * 3 + [(1, 3, 16), (4, 16), (2, 5, 16)]:
        x, skip = (rng.standard_normal(shape).astype(F32) for _ in range(2))
        want = contrib.skip_layer_normalization(x, skip, gamma, epsilon=1e-12)
        _same(rep.run({"x": x, "skip": skip}), [want[0], want[3]])


def test_bound_bindings_refuse_bad_arguments():
    C = _native._C
    isa = C.get_isa()
    z8 = np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="dqmm geometry"):
        C.dqmm_bind(isa, 0, 0, 4, 4, z8, z8, z8, np.ones(1, F32), 0, None, 1.0)
    with pytest.raises(ValueError, match="dqmm geometry"):
        C.dqmm_bind(isa, 0, 1, 4, 4, z8, z8, z8, np.ones(1, F32), 0, None, float("nan"))
    with pytest.raises(ValueError, match="buffer"):
        C.dqmm_bind(isa, 0, 4, 64, 64, z8, z8, z8, np.ones(1, F32), 0, None, 1.0)
    with pytest.raises(ValueError, match="qattention geometry"):
        C.qattention_bind(isa, 0, 4, 10, 0, z8, z8, z8, np.ones(1, F32), 0, np.zeros(10, F32),
                          1, 1, 2, 2, 0, 0, 0, 1.0, -1e4)  # cols != 3 · heads · head
    with pytest.raises(ValueError, match="skip_layer_norm geometry"):
        C.sln_bind(np.ones(4), None, None, 0, 4, 1e-5)
    cap = C.sln_bind(np.ones(4), None, None, 2, 4, 1e-5)
    x = np.zeros(8, F32)
    with pytest.raises(ValueError, match="buffer"):
        C.sln_run(cap, x[:4], x, x.copy(), np.zeros(2, F32), np.zeros(2, F32), x.copy())
    with pytest.raises(TypeError):
        C.sln_run(cap, x, x)
    with pytest.raises(ValueError):  # another capsule kind
        C.dqmm_run(cap, x, x.copy())
