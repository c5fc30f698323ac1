"""The seed pages' examples and ONNX's own node conformance cases, through qlinear's functions."""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest

import oracle
import qlinear
from conftest import assert_exact

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

# ----------------------------------------------------------------------------- ONNX conformance cases

# The cases this suite must run: exact names, or patterns over the installed onnx's case names.
WANTED_EXACT = {"test_qlinearconv", "test_matmulinteger", "test_quantizelinear", "test_quantizelinear_axis",
                "test_dequantizelinear", "test_dequantizelinear_axis"}
WANTED_PATTERNS = [r"test_convinteger_.*", r"test_qlinearmatmul_.*_float32", r"test_qlinearmatmul_.*_float16"]

# What onnx 1.23 ships for those names; if the installed onnx adds or drops any,
# test_every_matching_case_is_listed fails instead of silently skipping it.
KNOWN_CASES = [
    "test_qlinearconv",
    "test_convinteger_with_padding",
    "test_convinteger_without_padding",
    "test_qlinearmatmul_2D_int8_float32",
    "test_qlinearmatmul_2D_uint8_float32",
    "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_3D_uint8_float32",
    "test_qlinearmatmul_2D_int8_float16",  # float16 scales: rounded to float32 first (exact)
    "test_qlinearmatmul_2D_uint8_float16",
    "test_qlinearmatmul_3D_int8_float16",
    "test_qlinearmatmul_3D_uint8_float16",
    "test_matmulinteger",
    "test_quantizelinear",
    "test_quantizelinear_axis",
    "test_dequantizelinear",
    "test_dequantizelinear_axis",
]

# ONNX input names in spec order for each operator -> qlinear function and its positional arity
OPERATORS = {
    "QLinearConv": (qlinear.qlinear_conv, oracle.qlinear_conv, 9),
    "ConvInteger": (qlinear.conv_integer, oracle.conv_integer, 4),
    "QLinearMatMul": (qlinear.qlinear_matmul, oracle.qlinear_matmul, 8),
    "MatMulInteger": (qlinear.matmul_integer, oracle.matmul_integer, 4),
    "QuantizeLinear": (qlinear.quantize_linear, oracle.quantize_linear, 3),
    "DequantizeLinear": (qlinear.dequantize_linear, oracle.dequantize_linear, 3),
}


def wanted(name):
    return name in WANTED_EXACT or any(re.fullmatch(p, name) for p in WANTED_PATTERNS)


@functools.lru_cache(maxsize=1)
def onnx_cases():
    """All of ONNX's node test cases (collected once; this takes several seconds)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return {c.name: c for c in cases}


def node_call(node, arrays):
    """Map an ONNX node and its input arrays to (qlinear function, oracle, args, kwargs)."""
    fn, ref, arity = OPERATORS[node.op_type]
    args = []
    present = iter(arrays)
    for name in node.input:  # positional, in spec order; "" marks an absent optional input
        args.append(next(present) if name else None)
    assert len(args) <= arity
    kwargs = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        kwargs[attr.name] = list(value) if isinstance(value, (list, tuple)) else value
    return fn, ref, args, kwargs


def test_every_matching_case_is_listed():
    names = sorted(n for n in onnx_cases() if wanted(n))
    assert names == sorted(KNOWN_CASES)


@pytest.mark.parametrize("name", KNOWN_CASES)
def test_onnx_conformance_case(name):
    case = onnx_cases()[name]
    assert case.model is not None and len(case.data_sets) >= 1
    (node,) = case.model.graph.node
    for inputs, outputs in case.data_sets:
        fn, ref, args, kwargs = node_call(node, [np.asarray(a) for a in inputs])
        (expected,) = outputs
        expected = np.asarray(expected)
        got = fn(*args, **kwargs)
        assert_exact(got, expected)
        assert_exact(ref(*args, **kwargs), expected)  # the oracle agrees with ONNX too


# ----------------------------------------------------------------------------- seed page examples


def test_seed_qlinearconv_default():
    x = np.array([
        [255, 174, 162, 25, 203, 168, 58],
        [15, 59, 237, 95, 129, 0, 64],
        [56, 242, 153, 221, 168, 12, 166],
        [232, 178, 186, 195, 237, 162, 237],
        [188, 39, 124, 77, 80, 102, 43],
        [127, 230, 21, 83, 41, 40, 134],
        [255, 154, 92, 141, 42, 148, 247],
    ], dtype=np.uint8).reshape((1, 1, 7, 7))
    x_scale = np.float32(0.00369204697)
    x_zero_point = np.uint8(132)
    w = np.array([0], dtype=np.uint8).reshape((1, 1, 1, 1))
    w_scale = np.array([0.00172794575], dtype=np.float32)
    w_zero_point = np.array([255], dtype=np.uint8)
    y_scale = np.float32(0.00162681262)
    y_zero_point = np.uint8(123)
    output = np.array([
        [0, 81, 93, 230, 52, 87, 197],
        [240, 196, 18, 160, 126, 255, 191],
        [199, 13, 102, 34, 87, 243, 89],
        [23, 77, 69, 60, 18, 93, 18],
        [67, 216, 131, 178, 175, 153, 212],
        [128, 25, 234, 172, 214, 215, 121],
        [0, 101, 163, 114, 213, 107, 8],
    ], dtype=np.uint8).reshape((1, 1, 7, 7))
    args = (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point)
    assert_exact(qlinear.qlinear_conv(*args), output)
    assert_exact(oracle.qlinear_conv(*args), output)


def test_seed_dequantizelinear_default():
    x = np.array([0, 3, 128, 255]).astype(np.uint8)
    y = np.array([-256, -250, 0, 254], dtype=np.float32)
    assert_exact(qlinear.dequantize_linear(x, np.float32(2), np.uint8(128)), y)
    assert_exact(oracle.dequantize_linear(x, np.float32(2), np.uint8(128)), y)


def test_seed_dequantizelinear_axis():
    x = np.array([[
        [[3, 89], [34, 200], [74, 59]],
        [[5, 24], [24, 87], [32, 13]],
        [[245, 99], [4, 142], [121, 102]],
    ]], dtype=np.uint8)
    x_scale = np.array([2, 4, 5], dtype=np.float32)
    x_zero_point = np.array([84, 24, 196], dtype=np.uint8)
    y = (x.astype(np.float32) - x_zero_point.reshape(1, 3, 1, 1).astype(np.float32)) * x_scale.reshape(1, 3, 1, 1)
    assert_exact(qlinear.dequantize_linear(x, x_scale, x_zero_point), y)
    assert_exact(qlinear.dequantize_linear(x, x_scale, x_zero_point, axis=-3), y)
    assert_exact(oracle.dequantize_linear(x, x_scale, x_zero_point), y)
    # and back: QuantizeLinear of y with the same parameters recovers x exactly
    assert_exact(qlinear.quantize_linear(y, x_scale, x_zero_point), x)


def test_seed_convinteger_shapes():
    """ConvInteger page: output dtype int32, x.shape[1] == w.shape[1] * group."""
    x = np.arange(2 * 4 * 3 * 3).reshape(2, 4, 3, 3).astype(np.uint8)
    w = np.ones((6, 2, 2, 2), np.int8)
    y = qlinear.conv_integer(x, w, np.uint8(1), group=2)
    assert y.dtype == np.int32 and y.shape == (2, 6, 2, 2)
    assert_exact(y, oracle.conv_integer(x, w, np.uint8(1), group=2))


# ----------------------------------------------------------------------------- oracle vs onnx.reference


def reference_run(op_type, inputs, attrs, opset):
    from onnx.reference import ReferenceEvaluator

    names = [n for n, _ in inputs]
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)
    model = helper.make_model(helper.make_graph([node], "g", infos, [out]),
                              opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(inputs))[0]


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
def test_oracle_conv_geometry_matches_onnx_reference(auto_pad):
    """Independent check of the oracle's padding/auto_pad/output-shape code (incl. SAME with
    dilations, which onnxruntime refuses) against onnx.reference's ConvInteger (exact integers)."""
    rng = np.random.default_rng([["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"].index(auto_pad), 81])
    for _ in range(8):
        nsp = int(rng.integers(1, 3, endpoint=True))
        kernel = [int(v) for v in rng.integers(1, 3, nsp, endpoint=True)]
        strides = [int(v) for v in rng.integers(1, 3, nsp, endpoint=True)]
        dilations = [int(v) for v in rng.integers(1, 2, nsp, endpoint=True)]
        size = [max(int(v), (k - 1) * d + 1) for v, k, d in zip(rng.integers(1, 8, nsp), kernel, dilations)]
        group = int(rng.choice([1, 2]))
        attrs = dict(auto_pad=auto_pad, strides=strides, dilations=dilations, group=group, kernel_shape=kernel)
        if auto_pad == "NOTSET":
            attrs["pads"] = [int(v) for v in rng.integers(0, 2, 2 * nsp, endpoint=True)]
        x = rng.integers(0, 256, (2, 2 * group, *size)).astype(np.uint8)
        w = rng.integers(-128, 128, (2 * group, 2, *kernel)).astype(np.int8)
        xz, wz = np.uint8(rng.integers(256)), np.int8(rng.integers(-128, 128))
        want = reference_run("ConvInteger", [("x", x), ("w", w), ("x_zero_point", np.asarray(xz)),
                                             ("w_zero_point", np.asarray(wz))], attrs, 10)
        assert_exact(oracle.conv_integer(x, w, xz, wz, **attrs), want.astype(np.int32))
        assert_exact(qlinear.conv_integer(x, w, xz, wz, **attrs), want.astype(np.int32))
