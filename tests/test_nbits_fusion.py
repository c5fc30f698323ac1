"""Weight-only DequantizeLinear -> MatMul / Gemm into com.microsoft MatMulNBits
(qlinear.passes.matmul_nbits): the fused graph against the one onnxruntime 1.32 writes to
``optimized_model_filepath`` for each condition of its rule, the fused weights' values against
DequantizeLinear's, the accuracy level through prepare / InferenceSession / the CLI, and the
backend's MatMulNBits / GatherBlockQuantized nodes and their refusals."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T, helper, numpy_helper  # noqa: E402

import qlinear  # noqa: E402
from qlinear import backend, contrib  # noqa: E402
from qlinear.passes.matmul_nbits import block_size_for, nbits_inputs  # noqa: E402

_RANGE = {T.INT4: (-8, 7), T.UINT4: (0, 15), T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT2: (-2, 1),
          T.UINT2: (0, 3)}


def dq_model(wtype=T.INT4, K=64, N=24, gran="block", bs=32, zp=True, op="MatMul", attrs=None, bias=None,
             stype=T.FLOAT, axis=None, opset=21, seed=0, edit=None) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    lo, hi = _RANGE[wtype]
    sshape = {"block": [-(-K // bs), N], "channel": [N], "tensor": []}[gran]
    inits = [helper.make_tensor("w", wtype, [K, N], rng.integers(lo, hi + 1, K * N).tolist())]
    s = rng.uniform(0.01, 0.1, sshape).astype(np.float16 if stype == T.FLOAT16 else np.float32)
    inits.append(numpy_helper.from_array(s, "s"))
    dq_in = ["w", "s"]
    if zp:
        inits.append(helper.make_tensor("z", wtype, sshape, rng.integers(lo, hi + 1, int(np.prod(sshape))).tolist()))
        dq_in.append("z")
    kw = dict(axis=0, block_size=bs) if gran == "block" else {}
    if axis is not None:
        kw["axis"] = axis
    xt = stype
    ins = ["x", "wd"]
    if bias is not None:
        inits.append(numpy_helper.from_array(np.asarray(bias, s.dtype), "b"))
        ins.append("b")
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["wd"], **kw),
             helper.make_node(op, ins, ["y"], **(attrs or {}))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", xt, [3, K])],
                          [helper.make_tensor_value_info("y", xt, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if edit:
        edit(m)
    return m


def _two_matmuls(m):
    m.graph.node.append(helper.make_node("MatMul", ["x", "wd"], ["y2"]))
    m.graph.output.append(helper.make_tensor_value_info("y2", T.FLOAT, None))


def _scale_shared(m):
    m.graph.initializer.append(helper.make_tensor("w2", T.INT4, [64, 24], [1] * (64 * 24)))
    m.graph.node.append(helper.make_node("DequantizeLinear", ["w2", "s", "z"], ["wd2"], axis=0, block_size=32))
    m.graph.node.append(helper.make_node("MatMul", ["x", "wd2"], ["y2"]))
    m.graph.output.append(helper.make_tensor_value_info("y2", T.FLOAT, None))


def _zp_shared(m):
    m.graph.initializer.append(helper.make_tensor("w2", T.INT4, [64, 24], [1] * (64 * 24)))
    m.graph.initializer.append(numpy_helper.from_array(np.full((2, 24), 0.5, np.float32), "s2"))
    m.graph.node.append(helper.make_node("DequantizeLinear", ["w2", "s2", "z"], ["wd2"], axis=0, block_size=32))
    m.graph.node.append(helper.make_node("MatMul", ["x", "wd2"], ["y2"]))
    m.graph.output.append(helper.make_tensor_value_info("y2", T.FLOAT, None))


def _dq_graph_output(m):
    m.graph.output.append(helper.make_tensor_value_info("wd", T.FLOAT, None))


def _q_after(m):
    m.graph.node[1].output[0] = "y0"
    m.graph.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
                                numpy_helper.from_array(np.array(0, np.uint8), "yz")])
    m.graph.node.extend([helper.make_node("QuantizeLinear", ["y0", "ys", "yz"], ["yq"]),
                         helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])])


def _relu_then_sigmoid(m):
    m.graph.node[1].output[0] = "y0"
    m.graph.node.extend([helper.make_node("Relu", ["y0"], ["y1"]), helper.make_node("Sigmoid", ["y1"], ["y"])])


def _activation_dq_too(m):
    """x quantized and dequantized (uint8) before the MatMul: two DequantizeLinear inputs."""
    m.graph.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
                                numpy_helper.from_array(np.array(128, np.uint8), "xz")])
    m.graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]))
    m.graph.node.insert(1, helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]))
    m.graph.node[3].input[0] = "xd"


def _weight_as_input(m):
    m.graph.input.append(helper.make_tensor_value_info("s", T.FLOAT, [2, 24]))


rng = np.random.default_rng(1)
#: (id, model, options): each against onnxruntime's own fused graph
CASES = [
    ("int4-block", dq_model(), None),
    ("int4-block-nozp", dq_model(zp=False), None),
    ("uint4-block-nozp", dq_model(T.UINT4, zp=False), None),
    ("uint4-block", dq_model(T.UINT4), None),
    ("int8-channel", dq_model(T.INT8, gran="channel"), None),
    ("uint8-tensor", dq_model(T.UINT8, gran="tensor"), None),
    ("uint8-tensor-nozp", dq_model(T.UINT8, gran="tensor", zp=False), None),
    ("int2-block", dq_model(T.INT2, opset=25), None),
    ("uint2-channel", dq_model(T.UINT2, gran="channel", opset=25), None),
    ("int4-block16", dq_model(bs=16), None),
    ("int4-block8", dq_model(bs=8), None),
    ("int4-block48", dq_model(bs=48, K=96), None),
    ("int4-block512", dq_model(bs=512), None),
    ("int4-block-K-partial", dq_model(K=80, bs=32), None),
    ("channel-axis0", dq_model(gran="channel", axis=0, K=24), None),
    ("channel-axis-1", dq_model(gran="channel", axis=-1), None),
    ("channel-axis1", dq_model(gran="channel", axis=1), None),
    ("channel-K200", dq_model(gran="channel", K=200), None),
    ("channel-K200-bs-1", dq_model(gran="channel", K=200), {"session.qdq_matmulnbits_block_size": "-1"}),
    ("tensor-K200-bs64", dq_model(gran="tensor", K=200), {"session.qdq_matmulnbits_block_size": "64"}),
    ("float16", dq_model(stype=T.FLOAT16), None),
    ("level0", dq_model(), {"session.qdq_matmulnbits_accuracy_level": "0"}),
    ("level1", dq_model(), {"session.qdq_matmulnbits_accuracy_level": "1"}),
    ("gemm", dq_model(op="Gemm"), None),
    ("gemm-bias", dq_model(op="Gemm", bias=rng.standard_normal(24)), None),
    ("gemm-bias-1xN", dq_model(op="Gemm", bias=rng.standard_normal((1, 24))), None),
    ("gemm-bias-beta2", dq_model(op="Gemm", bias=rng.standard_normal(24), attrs=dict(beta=2.0)), None),
    ("gemm-nobias-beta2", dq_model(op="Gemm", attrs=dict(beta=2.0)), None),
    ("gemm-alpha-1ulp", dq_model(op="Gemm", attrs=dict(alpha=0.99999994)), None),
    ("gemm-transB", dq_model(op="Gemm", K=24, attrs=dict(transB=1)), None),
    ("two-matmuls-one-dq", dq_model(edit=_two_matmuls), None),
    ("scale-shared", dq_model(edit=_scale_shared), None),
    ("zero-point-shared", dq_model(edit=_zp_shared), None),
    ("dq-graph-output", dq_model(edit=_dq_graph_output), None),
    ("q-after", dq_model(edit=_q_after), None),
    ("relu-then-sigmoid", dq_model(edit=_relu_then_sigmoid), None),
    ("scale-overridable", dq_model(edit=_weight_as_input), None),
    ("activation-dq-too", dq_model(edit=_activation_dq_too), None),
]


def ort_fused(model: onnx.ModelProto, options, tmp_path) -> list[tuple]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    for k, v in (options or {}).items():
        so.add_session_config_entry(k, v)
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return summary(onnx.load(str(tmp_path / "opt.onnx")))


def summary(model: onnx.ModelProto) -> list[tuple]:
    """The MatMulNBits nodes (attributes, whether a bias is wired) and the float MatMul/Gemm
    left, sorted: what the rule decided (node order, Casts and Identity removal aside)."""
    out = []
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            out.append(("MatMulNBits", a["K"], a["N"], a.get("bits", 4), a["block_size"], a.get("accuracy_level", 0),
                        len(n.input) > 5 and bool(n.input[5])))
        elif n.op_type in ("MatMul", "Gemm"):
            out.append((n.op_type,))
    return sorted(out)


@pytest.mark.parametrize("model, options", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fusion_decisions_match_onnxruntime(model, options, tmp_path):
    ours = summary(backend.apply_qdq(backend.topologically_sorted(model), "fuse", options))
    assert ours == ort_fused(model, options, tmp_path)


@pytest.mark.parametrize("wtype", [T.INT4, T.UINT4, T.INT8, T.UINT8, T.INT2, T.UINT2])
@pytest.mark.parametrize("gran", ["block", "channel", "tensor"])
@pytest.mark.parametrize("zp", [True, False])
def test_fused_weights_are_dequantize_linear_s_values(wtype, gran, zp):
    """(q − zp)·s of the fused node's packed weights, unpacked by an independent reading of the
    layout, equals DequantizeLinear's output (onnx.reference) for every weight, bit for bit."""
    from onnx.reference import ReferenceEvaluator

    K, N, bs = 80, 7, 32
    m = dq_model(wtype, K=K, N=N, gran=gran, bs=bs, zp=zp, opset=25, seed=3)
    want = ReferenceEvaluator(m).run(None, {"x": np.zeros((3, K), np.float32)}, intermediate=True)["wd"]
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    bits, signed = {T.INT4: (4, 1), T.UINT4: (4, 0), T.INT8: (8, 1), T.UINT8: (8, 0), T.INT2: (2, 1),
                    T.UINT2: (2, 0)}[wtype]
    B, scales, zpk = nbits_inputs(inits["w"], inits["s"], inits.get("z"), bits, signed, bs)
    nb = -(-K // bs)
    assert B.shape == (N, nb, bs * bits // 8) and scales.shape == (N * nb,)
    per = 8 // bits
    codes = np.array([[(int(B[n].reshape(-1)[k // per]) >> (bits * (k % per))) & ((1 << bits) - 1)
                       for k in range(K)] for n in range(N)])
    if zpk is None:
        zps = np.full((N, nb), 1 << (bits - 1))
    else:
        zrow = zpk.reshape(N, -1)
        zps = np.array([[(int(zrow[n, b // per]) >> (bits * (b % per))) & ((1 << bits) - 1) for b in range(nb)]
                        for n in range(N)])
    s = scales.reshape(N, nb)
    got = np.array([[np.float32(codes[n, k] - zps[n, k // bs]) * s[n, k // bs] for n in range(N)] for k in range(K)],
                   np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_block_size_option():
    assert block_size_for(200, 0) == 32 and block_size_for(200, -1) == 16 and block_size_for(256, -1) == 256
    assert block_size_for(96, -1) == 32 and block_size_for(200, 128) == 128
    for bad in (8, 48, 512, -2):
        with pytest.raises(ValueError, match="qdq_matmulnbits_block_size"):
            block_size_for(64, bad)


X = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)


def test_accuracy_level_through_prepare_session_and_literal():
    m = dq_model(K=256, N=40, seed=9)
    fused = {lvl: backend.prepare(m, options={"session.qdq_matmulnbits_accuracy_level": str(lvl)}).run([X])[0]
             for lvl in (0, 4)}
    default = backend.prepare(m).run([X])[0]
    assert np.array_equal(default, fused[4]) and not np.array_equal(fused[0], fused[4])
    # the fused node's arithmetic is contrib.matmul_nbits' (level 4: int8 activations)
    f = backend.apply_qdq(backend.topologically_sorted(m), "fuse")
    inits = {i.name: numpy_helper.to_array(i) for i in f.graph.initializer}
    node = f.graph.node[0]
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    want = contrib.matmul_nbits(X, *[inits[n] for n in node.input[1:]], K=a["K"], N=a["N"], bits=a["bits"],
                                block_size=a["block_size"], accuracy_level=4)
    assert np.array_equal(fused[4], want)
    literal = backend.prepare(m, qdq="literal").run([X])[0]
    assert np.abs(literal - fused[0]).max() < 1e-5 * np.abs(literal).max() < np.abs(literal - fused[4]).max()
    # qlinear.InferenceSession takes onnxruntime's key
    so = qlinear.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    y = qlinear.InferenceSession(m.SerializeToString(), so).run(None, {"x": X})[0]
    assert np.array_equal(y, fused[0])
    # onnxruntime, same level: the float order only
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    theirs = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    assert np.abs(theirs - fused[0]).max() < 2e-6 * np.abs(theirs).max()


@pytest.mark.parametrize("options, match", [
    ({"session.qdq_matmulnbits_accuracy_level": "5"}, "0, 1, 2, 3 or 4"),
    ({"session.qdq_matmulnbits_accuracy_level": "x"}, "0, 1, 2, 3 or 4"),
    ({"session.qdq_matmulnbits_block_size": "48"}, "power of two"),
    ({"session.unknown": "1"}, "not one qlinear takes"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        backend.prepare(dq_model(), options=options)


def test_options_must_be_a_mapping_and_session_takes_the_block_size():
    with pytest.raises(TypeError, match="mapping"):
        backend.prepare(dq_model(), options=[("session.qdq_matmulnbits_accuracy_level", "0")])
    m = dq_model(gran="channel", K=200)
    so = qlinear.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_block_size", "-1")
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    x = np.random.default_rng(6).standard_normal((3, 200)).astype(np.float32)
    y = qlinear.InferenceSession(m.SerializeToString(), so).run(None, {"x": x})[0]
    opts = {"session.qdq_matmulnbits_block_size": "-1", "session.qdq_matmulnbits_accuracy_level": "0"}
    assert np.array_equal(y, backend.prepare(m, options=opts).run([x])[0])
    assert [n.op_type for n in backend.apply_qdq(m, "fuse", opts).graph.node] == ["MatMulNBits"]
    with pytest.raises(ValueError, match="qdq_matmulnbits_block_size"):
        qlinear.SessionOptions().add_session_config_entry("session.qdq_matmulnbits_block_size", "48")


def test_cli_qdq_accuracy(tmp_path, capsys):
    from qlinear.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(dq_model(K=256, N=40), str(path))
    np.save(tmp_path / "x.npy", X)
    outs = {}
    for lvl in ("0", "4"):
        assert main(["run", str(path), "-i", f"x={tmp_path / 'x.npy'}", "--qdq-accuracy", lvl, "--json",
                     "--output-dir", str(tmp_path / lvl)]) == 0
        capsys.readouterr()
        outs[lvl] = np.load(next((tmp_path / lvl).glob("*.npy")))
    assert np.array_equal(outs["4"], backend.prepare(dq_model(K=256, N=40)).run([X])[0])
    assert not np.array_equal(outs["0"], outs["4"])
    assert main(["compare", str(path), "-i", f"x={tmp_path / 'x.npy'}", "--qdq", "literal"]) in (0, 1)
    text = capsys.readouterr().out
    assert "onnxruntime quantizes activations (accuracy_level 4)" in text
    assert main(["compare", str(path), "-i", f"x={tmp_path / 'x.npy'}"]) in (0, 1)
    text = capsys.readouterr().out
    assert "onnxruntime quantizes activations (accuracy_level 4), with the same int8 codes" in text
    # level 0 on several rows: onnxruntime's float order is the contract's (4-bit, integer zero
    # points), the same bits; on one row its one-row kernel sums in another order
    assert main(["compare", str(path), "-i", f"x={tmp_path / 'x.npy'}", "--qdq-accuracy", "0"]) in (0, 1)
    assert "outputs: identical" in capsys.readouterr().out
    def one_row(m):
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1

    onnx.save(dq_model(K=256, N=40, edit=one_row), str(tmp_path / "m1.onnx"))
    np.save(tmp_path / "x1.npy", X[:1])
    args = ["compare", str(tmp_path / "m1.onnx"), "-i", f"x={tmp_path / 'x1.npy'}", "--qdq-accuracy", "0"]
    assert main(args) in (0, 1)
    assert "float reduction order" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------
# The backend's kernels and check_model
# ------------------------------------------------------------------------------------------

def nbits_node_model(**attrs) -> onnx.ModelProto:
    K, N, bs = 64, 8, 32
    rng = np.random.default_rng(2)
    B = rng.integers(0, 256, (N, K // bs, bs // 2), dtype=np.uint8)
    s = rng.uniform(0.01, 0.1, (N, K // bs)).astype(np.float32)
    kw = dict(K=K, N=N, bits=4, block_size=bs)
    kw.update(attrs)
    node = helper.make_node("MatMulNBits", ["a", "B", "s"], ["y"], domain="com.microsoft", **kw)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", T.FLOAT, [2, K])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          [numpy_helper.from_array(B, "B"), numpy_helper.from_array(s, "s")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("level", [0, 4])
def test_backend_matmul_nbits_node_is_the_contract_and_prepared_once(level, monkeypatch):
    m = nbits_node_model(accuracy_level=level)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    a = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    rep = backend.prepare(m)
    want = contrib.matmul_nbits(a, inits["B"], inits["s"], K=64, N=8, block_size=32, accuracy_level=level)
    assert np.array_equal(rep.run([a])[0], want)
    calls = []
    import qlinear.contrib as c

    real = c._raw.prepare_matmul_nbits
    monkeypatch.setattr(c._raw, "prepare_matmul_nbits", lambda *x, **k: calls.append(1) or real(*x, **k))
    rep = backend.prepare(m)
    for _ in range(3):
        assert np.array_equal(rep.run([a])[0], want)
    assert len(calls) == 1  # the constant weights are prepared once a session


@pytest.mark.parametrize("attrs, match", [
    (dict(weight_prepacked=1), "weight_prepacked=1"),
    (dict(bits=3), "bits must be 2, 4 or 8"),
    (dict(block_size=24), "power of two"),
    (dict(accuracy_level=5), "accuracy_level must be"),
    (dict(foo=1), "unknown attribute"),
])
def test_check_model_refuses_matmul_nbits_attributes(attrs, match):
    m = nbits_node_model(**attrs)
    problems = backend.check_model(m)
    assert problems and match in str(problems[0])
    with pytest.raises(backend.UnsupportedModelError, match=match):
        backend.prepare(m)
    assert not backend.check_model(nbits_node_model())


def test_backend_gather_block_quantized_matches_onnxruntime():
    import ml_dtypes

    rng = np.random.default_rng(4)
    data = rng.integers(-8, 8, (10, 64)).astype(ml_dtypes.int4)
    scales = rng.uniform(0.01, 0.1, (10, 2)).astype(np.float32)
    node = helper.make_node("GatherBlockQuantized", ["d", "i", "s"], ["y"], domain="com.microsoft", block_size=32,
                            quantize_axis=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("i", T.INT64, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          [numpy_helper.from_array(data, "d"), numpy_helper.from_array(scales, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    idx = np.array([[0, -1, 3], [9, 12, -11]], np.int64)  # wrapping and out-of-range indices
    ours = backend.prepare(m).run([idx])[0]
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"i": idx})[0]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
