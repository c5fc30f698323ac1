"""New-user QA, round 8 (the first on an Intel Xeon with AVX-512 VNNI and AMX, where
onnxruntime's integer kernels are exact): one test per bug found (see the commit that fixes
each)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import qlinear.backend as qb

F = np.float32


def _relu_model(shape=("N", 3)) -> onnx.ModelProto:
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    g = h.make_graph([h.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                      h.make_node("Relu", ["t"], ["y"])], "g", [x], [y])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


# ----------------------------------------------------------------------------- prepare(bytes)


@pytest.mark.parametrize("blob", [b"garbage\x00\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f"])
def test_prepare_corrupt_bytes_is_a_value_error(blob, tmp_path):
    """prepare(b"...") and prepare(path) of a corrupt protobuf raised protobuf's DecodeError
    ('Error parsing message with type onnx.ModelProto'), which is not a ValueError; the
    qlinear command said 'not an ONNX model, or a corrupt or truncated protobuf'."""
    with pytest.raises(ValueError, match=r"prepare: the bytes are not an ONNX model, or a corrupt"):
        qb.prepare(blob)
    p = tmp_path / "bad.onnx"
    p.write_bytes(blob)
    with pytest.raises(ValueError, match=r"prepare: '.*bad\.onnx' is not an ONNX model, or a corrupt"):
        qb.prepare(str(p))
    with pytest.raises(ValueError, match=r"bad\.onnx' is not an ONNX model"):
        qb.prepare(p)  # a pathlib.Path


@pytest.mark.parametrize("model", [b"", onnx.ModelProto(), "empty-file"], ids=["bytes", "proto", "file"])
def test_prepare_refuses_a_model_without_a_graph(model, tmp_path):
    """Empty bytes (or an empty file, or onnx.ModelProto()) parse as a ModelProto without a
    graph: prepare accepted it and run returned (), where onnxruntime refuses it ('No graph
    was found in the protobuf') and the qlinear command says 'empty file, not an ONNX model'."""
    if model == "empty-file":
        model = tmp_path / "empty.onnx"
        model.write_bytes(b"")
    with pytest.raises(ValueError, match=r"prepare: the model has no graph"):
        qb.prepare(model)


# ----------------------------------------------------------------------------- run(inputs)


@pytest.mark.parametrize("inputs", [3.0, None, "x", b"x", 7], ids=["float", "None", "str", "bytes", "int"])
def test_run_refuses_inputs_that_are_not_a_list_or_dict(inputs):
    """rep.run(3.0) failed with Python's "'float' object is not iterable" (run(None) likewise);
    run("x") ran the string's characters as inputs."""
    rep = qb.prepare(_relu_model())
    with pytest.raises(TypeError, match=r"run: inputs must be a list or tuple of arrays in the model's "
                                        r"input order, or a dict of input name -> array; got "):
        rep.run(inputs)


def test_run_checks_a_list_value_as_the_dict_form_does():
    """A nested Python list in the list form reached the first node unchecked (float64 refused
    by whatever node came first, or run), while the dict form converted it and named the
    input; now both name the input and the declared dtype."""
    rep = qb.prepare(_relu_model())
    value = [[1.0, 2.0, 3.0]]
    for feeds in ([value], {"x": value}):
        with pytest.raises(TypeError, match=r"run: input 'x' has dtype float64; the model declares float32"):
            rep.run(feeds)
    got = rep.run([np.asarray(value, F)])
    assert got[0].shape == (3, 1)


def test_run_checks_the_shape_of_a_numpy_scalar_input():
    """np.float32(1) for an input declared [N, 3] skipped run's shape check (not an ndarray)
    and failed inside the Transpose ('Inconsistent permutation [1, 0] with shape ()')."""
    rep = qb.prepare(_relu_model())
    for feeds in ([F(1)], {"x": F(1)}):
        with pytest.raises(ValueError, match=r"run: input 'x' has shape \(\); the model declares \[N, 3\]"):
            rep.run(feeds)


# ----------------------------------------------------------------------------- window attributes

from onnx import numpy_helper as nh  # noqa: E402


def _window_model(op, attrs, shape=(1, 2, 6, 6), dtype=T.FLOAT, w_shape=(3, 2, 2, 2)):
    x = h.make_tensor_value_info("x", dtype, list(shape) if shape is not None else None)
    y = h.make_tensor_value_info("y", dtype, None)
    inputs, inits = ["x"], []
    if op == "Conv":
        inits = [nh.from_array(np.ones(w_shape, F), "w")]
        inputs.append("w")
    g = h.make_graph([h.make_node(op, inputs, ["y"], **attrs)], "g", [x], [y], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


_K = {"kernel_shape": [2, 2]}
WINDOW_CASES = {
    "kernel 0": ({"kernel_shape": [0, 2]}, r"attribute kernel_shape values must be >= 1; got \[0, 2\]"),
    "kernel -1": ({"kernel_shape": [-1, 2]}, r"attribute kernel_shape values must be >= 1"),
    "stride 0": ({**_K, "strides": [0, 1]}, r"attribute strides values must be >= 1; got \[0, 1\]"),
    "stride -1": ({**_K, "strides": [-1, 1]}, r"attribute strides values must be >= 1"),
    "dilation 0": ({**_K, "dilations": [0, 1]}, r"attribute dilations values must be >= 1"),
    "pads -1": ({**_K, "pads": [-1, 0, 0, 0]}, r"attribute pads values must be >= 0"),
    "strides length": ({**_K, "strides": [1]}, r"attribute strides must have 2 values \(one per spatial axis\); got 1"),
    "pads length": ({**_K, "pads": [1, 1]}, r"attribute pads must have 4 values \(two per spatial axis\); got 2"),
    "auto_pad": ({**_K, "auto_pad": "SAME"}, r"attribute auto_pad must be one of NOTSET, SAME_UPPER, SAME_LOWER, "
                                             r"VALID; got 'SAME'"),
    "kernel rank": ({"kernel_shape": [2, 2, 2]}, r"input 'x' has shape \[1, 2, 6, 6\]: 2 spatial axes, while "
                                                  r"the window has 3"),
    "pads >= kernel": ({**_K, "pads": [2, 0, 0, 0]}, r"attribute pads \[2, 0, 0, 0\] must be smaller than "
                                                       r"kernel_shape \[2, 2\]"),
    "no kernel": ({}, r"attribute kernel_shape is required"),
}
_OPS = [("MaxPool", T.FLOAT), ("MaxPool", T.UINT8), ("MaxPool", T.INT8), ("AveragePool", T.FLOAT),
        ("LpPool", T.FLOAT), ("Conv", T.FLOAT)]


@pytest.mark.parametrize("op,dtype", _OPS, ids=[f"{o}-{T.DataType.Name(d)}" for o, d in _OPS])
@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_malformed_window_attributes_are_refused_up_front(op, dtype, case):
    """Malformed kernel_shape / strides / dilations / pads / auto_pad on the pools and the float
    Conv (all of which onnxruntime refuses when it loads the model) failed halfway through a
    run with an IndexError ('list index out of range'), a ZeroDivisionError or 'index can't
    contain negative values', or answered: a stride of -1 gave an empty output, a dilation of 0
    or auto_pad 'SAME' ran, and a 3-value kernel_shape pooled a 4-D input over its last two axes.
    check_model (and so prepare and `qlinear inspect`) now names the attribute and the rule."""
    attrs, message = WINDOW_CASES[case]
    if op == "Conv" and case in ("pads >= kernel", "no kernel"):
        pytest.skip("pools only: a Conv takes its kernel from W, and pads >= kernel is valid for it")
    if op != "MaxPool" and case == "dilation 0" and op != "Conv":
        pytest.skip(f"{op}-17 has no dilations attribute (refused as unknown)")
    model = _window_model(op, attrs, dtype=dtype)
    problems = qb.check_model(model)
    assert len(problems) == 1, problems
    with pytest.raises(ValueError, match=message):
        qb.prepare(model)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("dtype", [F, np.uint8])
def test_kernel_rank_against_an_undeclared_input_shape_at_run_time(op, dtype):
    """Where x's shape is not declared, a kernel_shape of another rank is found when the node
    runs: MaxPool with [2, 2, 2] on a 4-D input pooled its last two axes and answered (1, 2, 5, 5);
    AveragePool with [2] failed with an IndexError."""
    if op == "AveragePool" and dtype is not F:
        pytest.skip("AveragePool is float only")
    t = T.FLOAT if dtype is F else T.UINT8
    for kernel, n in (([2, 2, 2], 3), ([2], 1)):
        model = _window_model(op, {"kernel_shape": kernel}, shape=None, dtype=t)
        assert not qb.check_model(model)
        with pytest.raises(ValueError, match=rf"kernel_shape \[{', '.join(map(str, kernel))}\] has {n} values; "
                                             r"x \(1, 2, 6, 6\) has 2 spatial axes"):
            qb.prepare(model).run([np.ones((1, 2, 6, 6), dtype)])


@pytest.mark.parametrize("op,dtype", [("MaxPool", F), ("MaxPool", np.uint8), ("MaxPool", np.int8),
                                      ("AveragePool", F), ("Conv", F)])
def test_a_window_larger_than_the_padded_input_is_refused(op, dtype):
    """A 9x9 window on a 6x6 input: onnxruntime refuses it ('Calculated output dimension is
    negative'); the pools answered an empty (1, 2, 0, 0) tensor."""
    t = {F: T.FLOAT, np.uint8: T.UINT8, np.int8: T.INT8}[dtype]
    model = _window_model(op, {"kernel_shape": [9, 9]} if op != "Conv" else {}, shape=None, dtype=t,
                          w_shape=(3, 2, 9, 9))
    with pytest.raises(ValueError, match=r"x's size 6 on spatial axis 0, padded to 6, is smaller than the "
                                         r"window's extent 9 \(kernel_shape 9, dilation 1\): no output window"):
        qb.prepare(model).run([np.ones((1, 2, 6, 6), dtype)])
    # an empty input still gives an empty output, as before
    if op != "Conv":
        got = qb.prepare(_window_model(op, {"kernel_shape": [2, 2]}, shape=None, dtype=t)).run(
            [np.ones((1, 2, 0, 0), dtype)])
        assert got[0].shape == (1, 2, 0, 0)


def test_run_names_an_input_given_as_none():
    """rep.run([None]) failed inside the first node that read the input ('node ... : got a
    Python NoneType'), naming the node; run now names the input, in both forms."""
    rep = qb.prepare(_relu_model())
    for feeds in ([None], {"x": None}):
        with pytest.raises(TypeError, match=r"run: input 'x' is None; the model declares a tensor"):
            rep.run(feeds)


# ----------------------------------------------------------------------------- the qlinear command


def test_run_with_emulation_on_an_exact_cpu_says_why_values_differ(monkeypatch, capsys):
    """On a CPU where onnxruntime is exact (the Xeon), `qlinear run --emulate onnxruntime-avx2`
    said 'its uint8 x int8 kernels are exact' and then agreed with onnxruntime on 391/400
    predictions without saying why; where onnxruntime saturates the line says 'qlinear emulates
    that'. The line now says the emulated saturation is the difference."""
    pytest.importorskip("onnxruntime")
    from qlinear import cli
    from qlinear.tools import ortsat

    monkeypatch.setenv(ortsat.PROBE_ENV, "0")
    assert cli.main(["run", "--emulate", "onnxruntime-avx2"]) == 0
    out = capsys.readouterr().out
    assert ("onnxruntime here: its uint8 x int8 kernels are exact (set by QLINEAR_ORT_SATURATES=0); qlinear "
            "emulates their saturation on AVX2 CPUs without VNNI, so the values differ where it saturates") in out
    assert cli.main(["run"]) == 0
    out = capsys.readouterr().out
    assert "kernels are exact (set by QLINEAR_ORT_SATURATES=0)\n" in out
