"""The graph loop's compiled plan (qlinear.graph.plan): after the first run, a plain run takes
the compiled steps; the results, the error naming the node, intermediate outputs, progress
displays, per-node timing, fed defaults and size guards are those of the general loop."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qlinear import backend
from qlinear.graph import plan as plan_mod


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(extra_input_default=False):
    """x -> Add c -> Relu -> Reshape s -> QuantizeLinear -> QLinearMatMul -> DequantizeLinear
    -> Cast(float64) -> Mul by itself, and a Constant folded on the first run."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((2, 8)).astype(np.float32), "c"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "s"),
             numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
             numpy_helper.from_array(np.array(10, np.uint8), "qz"),
             numpy_helper.from_array(rng.integers(-9, 9, (4, 4)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "s"], ["rs"], name="reshape"),
             helper.make_node("QuantizeLinear", ["rs", "qs", "qz"], ["q"], name="quant"),
             helper.make_node("QLinearMatMul", ["q", "qs", "qz", "w", "ws", "wz", "qs", "qz"], ["qm"],
                              name="qmm"),
             helper.make_node("DequantizeLinear", ["qm", "qs", "qz"], ["d"], name="dequant"),
             helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(2.0), "k")),
             helper.make_node("Cast", ["d"], ["d64"], to=T.DOUBLE, name="cast"),
             helper.make_node("Mul", ["d64", "k"], ["y"], name="mul")]
    inputs = [_vi("x", T.FLOAT, None)]
    if extra_input_default:
        inputs.append(_vi("c", T.FLOAT, [2, 8]))
    g = helper.make_graph(nodes, "g", inputs, [_vi("y", T.DOUBLE, None), _vi("r", T.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class _Ref:
    """onnx.reference with qlinear's operator kernels left out: its own QuantizeLinear,
    DequantizeLinear and QLinearMatMul (opset 19 for its Q/DQ, same arithmetic here)."""

    def __init__(self, m):
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m2.opset_import[0].version = 19
        self.ev = onnx.reference.ReferenceEvaluator(m2)

    def run(self, _, feeds):
        return self.ev.run(None, feeds)


def _counting(monkeypatch) -> list[int]:
    calls = [0]
    real = plan_mod.CompiledPlan.run

    def counted(self, *a, **k):
        calls[0] += 1
        return real(self, *a, **k)
    monkeypatch.setattr(plan_mod.CompiledPlan, "run", counted)
    return calls


def _x(seed=1, shape=(2, 8)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_plain_runs_after_the_first_take_the_compiled_plan(monkeypatch):
    calls = _counting(monkeypatch)
    m = _model()
    rep, ref = backend.prepare(m), _Ref(m)
    feeds = [_x(i) for i in range(4)]
    for i, x in enumerate(feeds):
        got = rep.run({"x": x})
        for g, w in zip(got, ref.run(None, {"x": x})):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        assert calls[0] == i  # the first run is the general loop's, every later one compiled
    steps = {node.onnx_node.name: step.__name__ for node, step, _ in rep.evaluator._compiled.steps}
    # the constant node is not a step; each kind of node has its bound call
    assert steps == {"add": "binary_c", "relu": "relu", "reshape": "reshape", "quant": "shortcut",
                     "qmm": "shortcut", "dequant": "shortcut", "cast": "cast", "mul": "binary_c"}


def test_quantized_short_paths_are_taken_by_the_plan():
    rep = backend.prepare(_model())
    for i in range(3):
        rep.run({"x": _x(i)})
    answered = [0]
    for node, step, _ in rep.evaluator._compiled.steps:
        if step.__name__ == "shortcut":
            fast = next(e[7] for e in rep.evaluator._fast_plan if e[0] is node)
            fn = fast[1]
            assert fn is not None

            def counted(ins, fn=fn):
                answered[0] += 1
                return fn(ins)
            fast[1] = counted
    rep.run({"x": _x(9)})
    assert answered[0] == 3


def test_compiled_run_names_the_failing_node(monkeypatch):
    calls = _counting(monkeypatch)
    rep = backend.prepare(_model())
    rep.run({"x": _x()})
    # a (3, 8) x: Add broadcasting fails in the compiled plan's first step
    with pytest.raises(backend.NodeError, match="node 'add' \\(Add\\)"):
        rep.run({"x": _x(2, (3, 8))})
    # a (1, 8) x broadcasts; 16 elements do not reshape to... they do: (2, 8) -> 4x4; a
    # (2, 1) x gives (2, 8) too; a (2, 2, 8) x fails at the Reshape
    with pytest.raises(backend.NodeError, match="node 'reshape' \\(Reshape\\)"):
        rep.run({"x": _x(3, (2, 2, 8))})
    assert calls[0] == 2
    # and the next plain run is right again
    x = _x(4)
    assert np.array_equal(rep.run({"x": x})[0], backend.prepare(_model()).run({"x": x})[0])


def test_intermediates_progress_and_timing_take_the_general_loop(monkeypatch):
    calls = _counting(monkeypatch)
    rep = backend.prepare(_model())
    x = _x()
    y = rep.run({"x": x})
    y2 = rep.run({"x": x})
    assert calls[0] == 1
    every = rep.run_all({"x": x})
    assert calls[0] == 1 and {"a", "r", "rs", "q", "qm", "d", "d64", "k", "y"} <= set(every)
    assert np.array_equal(every["y"], y[0]) and np.array_equal(y2[0], y[0])
    seen = []

    def progress(nodes):
        return [seen.append(n) or n for n in nodes]
    rep.run({"x": x}, progress=progress)
    assert calls[0] == 1 and len(seen) == len(rep.evaluator.rt_nodes_)
    rep.evaluator.node_seconds = {}
    rep.run({"x": x})
    assert calls[0] == 1 and "QLinearMatMul" in rep.evaluator.node_seconds
    rep.evaluator.node_seconds = None
    rep.run({"x": x})
    assert calls[0] == 2


def test_fed_default_replaces_the_initializer_in_the_plan(monkeypatch):
    calls = _counting(monkeypatch)
    m = _model(extra_input_default=True)
    rep, ref = backend.prepare(m), _Ref(m)
    x = _x()
    for c in (None, np.full((2, 8), 0.5, np.float32), None, np.zeros((2, 8), np.float32)):
        feeds = {"x": x} if c is None else {"x": x, "c": c}
        got = rep.run(feeds)
        assert np.array_equal(got[0], ref.run(None, feeds)[0])
    assert calls[0] == 3


def test_size_guard_still_checked_in_the_plan(monkeypatch):
    calls = _counting(monkeypatch)
    rep = backend.QLinearRep(_model(), max_tensor_bytes=4096)
    rep.run({"x": _x()})
    # (64, 2, 8) broadcast against c (2, 8): 4 KiB of float32 output is the limit
    with pytest.raises(backend.NodeError, match="'add' \\(Add-14\\).*limit"):
        rep.run({"x": _x(1, (65, 2, 8))})
    assert calls[0] == 1



def test_compiled_run_releases_each_tensor_after_its_last_consumer():
    # the slots of consumed intermediates are cleared as the run goes (memory is reused, not
    # held until the run ends): seen from the last step, "a" and "rs" are gone, "r" (a graph
    # output) is kept
    rep = backend.prepare(_model())
    rep.run({"x": _x()})
    compiled = rep.evaluator._compiled
    seen = {}
    node, step, clear = compiled.steps[-1]

    def last(s, step=step):
        seen["slots"] = list(s)
        step(s)
    compiled.steps[-1] = (node, last, clear)
    rep.run({"x": _x()})
    slot = compiled.slots
    assert seen["slots"][slot["a"]] is None and seen["slots"][slot["rs"]] is None
    assert seen["slots"][slot["r"]] is not None and seen["slots"][slot["d64"]] is not None


def test_compiled_plan_runs_from_several_threads_at_once():
    # one prepared model, four Python threads each running its own inputs many times: every
    # result is the one a single thread gets (the steps keep no per-call state between calls)
    import threading

    rep = backend.prepare(_model())
    feeds = [{"x": _x(i)} for i in range(4)]
    want = [rep.run(f) for f in feeds]
    bad = []

    def work(k):
        try:
            for _ in range(50):
                got = rep.run(feeds[k])
                if not all(np.array_equal(g, w) for g, w in zip(got, want[k])):
                    bad.append(k)
        except Exception as e:  # noqa: BLE001 - reported below
            bad.append(e)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch between almost any two bytecodes
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not bad, bad[:3]
