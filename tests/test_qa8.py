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
