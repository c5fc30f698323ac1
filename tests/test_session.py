"""qlinear.InferenceSession against onnxruntime.InferenceSession, side by side: the same
script patterns (dict feeds, None / named outputs, batch dimensions), descriptions, metadata,
options and errors."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as T, helper  # noqa: E402

import qlinear  # noqa: E402
from qlinear import session as qs  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(qlinear.__file__), "examples", "digits_cnn_qoperator.onnx")
MODELS = os.environ.get("QLINEAR_MODELS", "/work/shared/models")
SHARED = sorted(glob.glob(os.path.join(MODELS, "*.onnx")))


def _ort(path_or_bytes, so=None):
    so = so or ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])


def _args(args):
    return [(a.name, a.type, a.shape) for a in args]


@pytest.mark.parametrize("path", [EXAMPLE, *SHARED], ids=os.path.basename)
def test_descriptions_and_metadata_equal_onnxruntime(path):
    o, q = _ort(path), qlinear.InferenceSession(path)
    assert _args(q.get_inputs()) == _args(o.get_inputs())
    assert _args(q.get_outputs()) == _args(o.get_outputs())
    assert _args(q.get_overridable_initializers()) == _args(o.get_overridable_initializers())
    om, qm = o.get_modelmeta(), q.get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description",
                  "version", "custom_metadata_map"):
        assert getattr(qm, field) == getattr(om, field), field
    assert q.get_providers() == ["CPUExecutionProvider"] == o.get_providers()


def _tiny(**meta):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])], "tiny",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", None, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", None, 3]),
         helper.make_tensor_value_info("z", T.FLOAT, None)], doc_string="graph doc")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], **meta)
    return m


def test_metadata_fields_and_defaults():
    m = _tiny(doc_string="model doc", domain="ex.dom", model_version=7, producer_name="p")
    helper.set_model_props(m, {"k": "v"})
    b = m.SerializeToString()
    o, q = _ort(b), qlinear.InferenceSession(b)
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description",
                  "version", "custom_metadata_map"):
        assert getattr(q.get_modelmeta(), field) == getattr(o.get_modelmeta(), field), field
    assert q.get_modelmeta().version == 7
    bare = _tiny().SerializeToString()
    assert qlinear.InferenceSession(bare).get_modelmeta().version == _ort(bare).get_modelmeta().version
    assert _args(qlinear.InferenceSession(bare).get_inputs()) == [("x", "tensor(float)", ["batch", None, 3])]


def test_script_patterns_give_onnxruntimes_outputs():
    """A typical script, run with each runtime: None output names, named outputs, an empty
    list, a batch of any size on the symbolic dimension, list feeds converted."""
    samples = np.load(EXAMPLE.replace("digits_cnn_qoperator.onnx", "digits_samples.npz"))["image"] \
        if os.path.exists(EXAMPLE.replace("digits_cnn_qoperator.onnx", "digits_samples.npz")) else None
    rng = np.random.default_rng(0)
    batch = samples[:7] if samples is not None else rng.random((7, 1, 8, 8), dtype=np.float32)
    for make in (_ort, qlinear.InferenceSession):
        sess = make(EXAMPLE)
        name = sess.get_inputs()[0].name
        out = sess.get_outputs()[0].name
        all_ = sess.run(None, {name: batch})
        named = sess.run([out], {name: batch})
        empty = sess.run([], {name: batch})
        one = sess.run(None, {name: batch[:1]})
        lst = sess.run(None, {name: batch[:2].tolist()})
        assert isinstance(all_, list) and len(all_) == 1
        if make is _ort:
            ref = (all_, named, empty, one, lst)
        else:
            got = (all_, named, empty, one, lst)
    # on the example onnxruntime saturates without VNNI: compare with the emulation there
    from qlinear.tools.ortsat import onnxruntime_saturates

    if onnxruntime_saturates():
        em = qlinear.InferenceSession(EXAMPLE, emulate="onnxruntime-avx2")
        got = (em.run(None, {"image": batch}),)
        ref = ref[:1]
    for g, r in zip(got, ref):
        assert len(g) == len(r)
        for a, b in zip(g, r):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # Softmax rounding only


def test_outputs_selected_by_name_and_order():
    m = _tiny().SerializeToString()
    x = np.array([[[-1.0, 2.0, -3.0]]], np.float32)
    for make in (_ort, qlinear.InferenceSession):
        z, y = make(m).run(["z", "y"], {"x": x})
        np.testing.assert_array_equal(y, [[[0, 2, 0]]])
        np.testing.assert_array_equal(z, [[[0, -2, 0]]])


def _raises_both(fn_ort, fn_q, cls, words):
    with pytest.raises(Exception) as eo:
        fn_ort()
    with pytest.raises(cls) as eq:
        fn_q()
    assert isinstance(eq.value, ValueError)
    for w in words:
        assert w in str(eq.value), (w, str(eq.value))
    return eo.value, eq.value


def test_feed_errors_are_onnxruntime_like_and_name_the_input():
    o, q = _ort(EXAMPLE), qlinear.InferenceSession(EXAMPLE)
    x = np.zeros((2, 1, 8, 8), np.float32)
    # float64 fed to a float32 input: refused by both (onnxruntime: InvalidArgument)
    eo, eq = _raises_both(lambda: o.run(None, {"image": x.astype(np.float64)}),
                          lambda: q.run(None, {"image": x.astype(np.float64)}),
                          qs.InvalidArgument, ["'image'", "float64", "float32"])
    assert type(eo).__name__ == "InvalidArgument"
    eo, eq = _raises_both(lambda: o.run(None, {"image": np.zeros((2, 1, 8, 9), np.float32)}),
                          lambda: q.run(None, {"image": np.zeros((2, 1, 8, 9), np.float32)}),
                          qs.InvalidArgument, ["'image'", "(2, 1, 8, 9)", "[N, 1, 8, 8]"])
    assert type(eo).__name__ == "InvalidArgument"
    eo, eq = _raises_both(lambda: o.run(None, {"imag": x}), lambda: q.run(None, {"imag": x}),
                          qs.InvalidArgument, ["'imag'", "'image'"])
    eo, eq = _raises_both(lambda: o.run(None, {}), lambda: q.run(None, {}),
                          qs.InvalidArgument, ["'image'", "missing"])
    assert isinstance(eo, ValueError)  # onnxruntime: a plain ValueError for a missing input
    eo, eq = _raises_both(lambda: o.run(["nope"], {"image": x}), lambda: q.run(["nope"], {"image": x}),
                          qs.InvalidArgument, ["'nope'", "'probabilities'"])
    assert type(eo).__name__ == "InvalidArgument"


def test_load_errors(tmp_path):
    with pytest.raises(qs.NoSuchFile, match="no such file") as e:
        qlinear.InferenceSession("/nonexistent/m.onnx")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)
    with pytest.raises(qs.InvalidProtobuf, match="not an ONNX model"):
        qlinear.InferenceSession(b"garbage\xff\xff")
    with pytest.raises(qs.InvalidArgument, match="is a directory"):
        qlinear.InferenceSession(os.path.dirname(EXAMPLE))
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)  # read by the one model loader: refused at once, never waited on
    with pytest.raises(qs.InvalidArgument, match="not a regular file"):
        qlinear.InferenceSession(fifo)
    with pytest.raises(qs.NoModel):
        qlinear.InferenceSession(b"")
    # an operator qlinear does not run: every node listed, as NotImplemented (onnxruntime's name)
    g = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], domain="custom")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("custom", 1)])
    with pytest.raises(qs.NotImplemented, match="custom.Foo"):
        qlinear.InferenceSession(m.SerializeToString())


def test_node_error_is_runtime_exception_naming_the_node():
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="flat")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("s", T.INT64, [1])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    feed = {"x": np.zeros((2, 3), np.float32), "s": np.array([7], np.int64)}
    with pytest.raises(Exception) as eo:
        _ort(m).run(None, feed)
    assert type(eo.value).__name__ in ("Fail", "RuntimeException")
    with pytest.raises(qs.RuntimeException, match="node 'flat'") as eq:
        qlinear.InferenceSession(m).run(None, feed)
    assert isinstance(eq.value, qs.Fail)


def _qdq_model():
    """x -> Q -> DQ -> Softmax -> Q -> DQ: a group onnxruntime fuses into QLinearSoftmax
    (whose output scale is 1/floor(1/y_scale): the fused and the literal graphs differ)."""
    inits = [helper.make_tensor("xs", T.FLOAT, [], [0.0173]), helper.make_tensor("xz", T.UINT8, [], [128]),
             helper.make_tensor("ys", T.FLOAT, [], [1 / 255.3]), helper.make_tensor("yz", T.UINT8, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("Softmax", ["xd"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", T.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_graph_optimization_level_maps_to_qdq_fusion():
    m = _qdq_model()
    x = np.random.default_rng(1).uniform(-2, 2, (5, 16)).astype(np.float32)
    results = {}
    for level in (qlinear.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  qlinear.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  qlinear.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so_o = ort.SessionOptions()
        so_o.graph_optimization_level = ort.GraphOptimizationLevel(int(level))
        so_q = qlinear.SessionOptions()
        so_q.graph_optimization_level = level
        want = _ort(m, so_o).run(None, {"x": x})[0]
        got = qlinear.InferenceSession(m, so_q).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
        # an onnxruntime.SessionOptions is read field by field
        np.testing.assert_array_equal(qlinear.InferenceSession(m, so_o).run(None, {"x": x})[0], want)
        results[level] = got
    # the fused and literal graphs round differently here, so the mapping is visible
    assert not np.array_equal(results[0], results[99])
    so = qlinear.SessionOptions()
    so.graph_optimization_level = qlinear.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with pytest.raises(qs.InvalidArgument, match="ORT_ENABLE_BASIC"):
        qlinear.InferenceSession(m, so)
    # a model without DequantizeLinear: BASIC is the graph as written
    assert qlinear.InferenceSession(_tiny().SerializeToString(), so).run(["y"], {"x": np.ones((1, 1, 3), np.float32)})
    so = qlinear.SessionOptions()
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    np.testing.assert_array_equal(qlinear.InferenceSession(m, so).run(None, {"x": x})[0], results[0])


def test_session_options_fields_and_config_keys():
    so = qlinear.SessionOptions()
    assert so.intra_op_num_threads == 0 and so.graph_optimization_level == 99
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "4")
    assert so.get_session_config_entry("session.qdq_matmulnbits_accuracy_level") == "4"
    with pytest.raises(qs.InvalidArgument, match="0, 1, 2, 3 or 4"):
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "7")
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # neutral
    with pytest.raises(qs.InvalidArgument, match="not a key qlinear knows"):
        so.add_session_config_entry("session.qdq_matmulnbits_acuracy_level", "4")
    with pytest.raises(qs.InvalidArgument, match="set_denormal_as_zero"):
        so.add_session_config_entry("session.set_denormal_as_zero", "1")
    with pytest.raises(qs.Fail):
        so.get_session_config_entry("nope")
    with pytest.raises(AttributeError, match="intra_op_num_thread"):
        so.intra_op_num_thread = 2  # misspelt: onnxruntime's object refuses it too
    so.enable_mem_pattern = False  # ignored: same results
    so.execution_mode = qlinear.ExecutionMode.ORT_PARALLEL
    so.enable_profiling = True
    with pytest.raises(qs.InvalidArgument, match="enable_profiling"):
        qlinear.InferenceSession(EXAMPLE, so)
    so.enable_profiling = False
    so.optimized_model_filepath = "/tmp/x.onnx"
    with pytest.raises(qs.InvalidArgument, match="optimized_model_filepath"):
        qlinear.InferenceSession(EXAMPLE, so)
    with pytest.raises(qs.NotImplemented):
        so.register_custom_ops_library("libx.so")
    with pytest.raises(qs.InvalidArgument):
        qlinear.InferenceSession(EXAMPLE, disabled_optimizers=["QDQSelectorActionTransformer"])
    with pytest.raises(TypeError, match="unknown keyword"):
        qlinear.InferenceSession(EXAMPLE, emulat="onnxruntime-avx2")


def test_intra_op_threads_set_for_the_run_and_restored(monkeypatch):
    from qlinear import _native

    seen = []
    so = qlinear.SessionOptions()
    so.intra_op_num_threads = 1
    sess = qlinear.InferenceSession(EXAMPLE, so)
    before = _native.get_num_threads()
    real = sess._rep.run

    def spy(feeds):
        seen.append(_native.get_num_threads())
        return real(feeds)

    monkeypatch.setattr(sess._rep, "run", spy)
    sess.run(None, {"image": np.zeros((1, 1, 8, 8), np.float32)})
    assert seen == [1] and _native.get_num_threads() == before


def test_free_dimension_override_and_providers():
    so = qlinear.SessionOptions()
    so.add_free_dimension_override_by_name("N", 2)
    so_o = ort.SessionOptions()
    so_o.add_free_dimension_override_by_name("N", 2)
    q, o = qlinear.InferenceSession(EXAMPLE, so), _ort(EXAMPLE, so_o)
    assert _args(q.get_inputs()) == _args(o.get_inputs())
    with pytest.raises(qs.InvalidArgument, match="'image'"):
        q.run(None, {"image": np.zeros((3, 1, 8, 8), np.float32)})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = qlinear.InferenceSession(EXAMPLE, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"] and "CUDAExecutionProvider" in str(w[0].message)
    run_options = qlinear.RunOptions()
    run_options.terminate = True
    with pytest.raises(qs.Fail, match="terminate"):
        s.run(None, {"image": np.zeros((1, 1, 8, 8), np.float32)}, run_options)


def test_import_qlinear_does_not_import_onnx():
    code = "import sys, qlinear; assert 'onnx' not in sys.modules; qlinear.SessionOptions(); qlinear.session.Fail; " \
           "assert 'onnx' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("name", ["mnist_cntk_ortstatic_qdq.onnx", "mobilenetv2-7_qdq_opset10.onnx",
                                  "tf_mobilenetv2_ortstatic_qoperator.onnx"])
def test_shared_models_run_like_onnxruntime(name):
    """A script's loop over a real model: inputs built from get_inputs() (symbolic dimensions
    as a batch of 2), every output by None; the outputs have onnxruntime's names, shapes and
    dtypes, and are qlinear.backend's values (the session adds no arithmetic of its own)."""
    path = os.path.join(MODELS, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here (QLINEAR_MODELS)")
    outs = {}
    for make in (_ort, qlinear.InferenceSession):
        sess = make(path)
        feeds = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 2 for d in i.shape]
            assert i.type == "tensor(float)"
            feeds[i.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
        outs[make] = (sess.run(None, feeds), [o.name for o in sess.get_outputs()], feeds)
    (o_vals, o_names, feeds), (q_vals, q_names, _) = outs[_ort], outs[qlinear.InferenceSession]
    assert q_names == o_names
    assert [(v.shape, v.dtype) for v in q_vals] == [(v.shape, v.dtype) for v in o_vals]
    want = qlinear.backend.prepare(path).run(feeds)
    for a, b in zip(q_vals, want):
        np.testing.assert_array_equal(a, b)
