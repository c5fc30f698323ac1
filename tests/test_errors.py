"""Bad inputs: each class raises ValueError/TypeError whose message starts with the operator
function name and names the offending input or attribute."""

from __future__ import annotations

import re

import numpy as np
import pytest

import qlinear
from conftest import I8, I32, U8

F32 = np.float32


# ----------------------------------------------------------------------------- valid baselines


def conv_args(**changes):
    """A valid qlinear_conv call (x [1, 4, 5, 5], w [6, 2, 3, 3], group 2), then `changes`."""
    args = dict(
        x=np.arange(100, dtype=np.int64).reshape(1, 4, 5, 5).astype(U8),
        x_scale=F32(0.02), x_zero_point=U8(128),
        w=(np.arange(108).reshape(6, 2, 3, 3) % 50 - 25).astype(I8),
        w_scale=np.full(6, 0.01, F32), w_zero_point=np.zeros(6, I8),
        y_scale=F32(0.5), y_zero_point=U8(100), B=np.arange(6, dtype=I32),
    )
    attrs = dict(group=2)
    for k, v in changes.items():
        (args if k in args else attrs)[k] = v
    return args, attrs


def call_qconv(**changes):
    args, attrs = conv_args(**changes)
    return qlinear.qlinear_conv(*args.values(), **attrs)


def call_convint(**changes):
    args, attrs = conv_args(**changes)
    return qlinear.conv_integer(args["x"], args["w"], args["x_zero_point"], args["w_zero_point"], **attrs)


def mm_args(**changes):
    args = dict(
        a=(np.arange(24).reshape(2, 3, 4) % 200).astype(U8), a_scale=F32(0.02), a_zero_point=U8(3),
        b=(np.arange(20).reshape(4, 5) - 10).astype(I8), b_scale=F32(0.01), b_zero_point=I8(0),
        y_scale=F32(0.1), y_zero_point=I8(0),
    )
    args.update(changes)
    return args


def call_qmm(**changes):
    return qlinear.qlinear_matmul(*mm_args(**changes).values())


def call_mmi(**changes):
    args = mm_args(**changes)
    return qlinear.matmul_integer(args["a"], args["b"], args["a_zero_point"], args["b_zero_point"])


def q_args(**changes):
    args = dict(x=np.linspace(-3, 3, 24, dtype=F32).reshape(2, 3, 4),
                y_scale=np.array([0.1, 0.2, 0.3], F32), y_zero_point=np.array([0, 1, 2], U8))
    attrs = dict(axis=1)
    for k, v in changes.items():
        (args if k in args else attrs)[k] = v
    return args, attrs


def call_q(**changes):
    args, attrs = q_args(**changes)
    return qlinear.quantize_linear(*args.values(), **attrs)


def call_dq(**changes):
    args = dict(x=(np.arange(24).reshape(2, 3, 4)).astype(U8),
                x_scale=np.array([0.1, 0.2, 0.3], F32), x_zero_point=np.array([0, 1, 2], U8))
    attrs = dict(axis=1)
    for k, v in changes.items():
        (args if k in args else attrs)[k] = v
    return qlinear.dequantize_linear(*args.values(), **attrs)


def test_baselines_are_valid():
    assert call_qconv().shape == (1, 6, 3, 3)
    assert call_convint().shape == (1, 6, 3, 3)
    assert call_qmm().shape == (2, 3, 5)
    assert call_mmi().shape == (2, 3, 5)
    assert call_q().shape == (2, 3, 4)
    assert call_dq().shape == (2, 3, 4)


def expect_error(exc, op, name, fn, **changes):
    """`name`: the input/attribute the message must name ("a|b": either is acceptable)."""
    names = "|".join(re.escape(n) for n in name.split("|"))
    pattern = rf"^{op}: (.|\n)*\b({names})\b"
    with pytest.raises(exc, match=pattern):
        fn(**changes)


# ----------------------------------------------------------------------------- conv

X = conv_args()[0]["x"]
W = conv_args()[0]["w"]

CONV_CASES = {
    # quantized inputs of a wrong type
    "x float32": (TypeError, "x", dict(x=X.astype(F32))),
    "x int16": (TypeError, "x", dict(x=X.astype(np.int16))),
    "x list": (TypeError, "x", dict(x=X.tolist())),
    "w int32": (TypeError, "w", dict(w=W.astype(I32))),
    "w float64": (TypeError, "w", dict(w=W.astype(np.float64))),
    # zero point / tensor dtype mismatch
    "x_zero_point int8 for uint8 x": (TypeError, "x_zero_point", dict(x_zero_point=I8(0))),
    "w_zero_point uint8 for int8 w": (TypeError, "w_zero_point", dict(w_zero_point=np.zeros(6, U8))),
    "w_zero_point float": (TypeError, "w_zero_point", dict(w_zero_point=np.zeros(6, F32))),
    "x_zero_point NumPy int64 scalar": (TypeError, "x_zero_point", dict(x_zero_point=np.int64(3))),
    "x_zero_point Python float": (TypeError, "x_zero_point", dict(x_zero_point=3.0)),
    # Python int zero point out of the tensor's range
    "x_zero_point int 256": (ValueError, "x_zero_point", dict(x_zero_point=256)),
    "x_zero_point int -1": (ValueError, "x_zero_point", dict(x_zero_point=-1)),
    "w_zero_point int 128": (ValueError, "w_zero_point", dict(w_zero_point=128, w_scale=F32(0.01))),
    # rank
    "x rank 2": (ValueError, "x", dict(x=X[0, 0])),
    "w rank != x rank": (ValueError, "w", dict(w=W[..., 0])),
    # channels and groups
    "channels != group * w.shape[1]": (ValueError, "group", dict(group=1)),
    "M not divisible by group": (ValueError, "group", dict(group=4, x=np.zeros((1, 8, 5, 5), U8))),
    "group 0": (ValueError, "group", dict(group=0)),
    # attributes
    "kernel_shape mismatch": (ValueError, "kernel_shape", dict(kernel_shape=[3, 2])),
    "kernel_shape length": (ValueError, "kernel_shape", dict(kernel_shape=[3])),
    "pads length": (ValueError, "pads", dict(pads=[1, 1])),
    "pads negative": (ValueError, "pads", dict(pads=[1, -1, 1, 1])),
    "strides length": (ValueError, "strides", dict(strides=[1, 1, 1])),
    "strides 0": (ValueError, "strides", dict(strides=[1, 0])),
    "strides negative": (ValueError, "strides", dict(strides=[-1, 1])),
    "dilations length": (ValueError, "dilations", dict(dilations=[1])),
    "dilations 0": (ValueError, "dilations", dict(dilations=[0, 1])),
    "unknown auto_pad": (ValueError, "auto_pad", dict(auto_pad="SAME")),
    "pads with SAME_UPPER": (ValueError, "pads", dict(auto_pad="SAME_UPPER", pads=[1, 1, 1, 1])),
    "pads with VALID": (ValueError, "pads", dict(auto_pad="VALID", pads=[0, 1, 0, 0])),
    # the window does not fit: the message must name one of the inputs/attributes involved
    "empty output window": (ValueError, "x|w|pads|kernel_shape", dict(x=np.zeros((1, 4, 2, 5), U8))),
    "empty output window dilated": (ValueError, "x|w|pads|dilations|kernel_shape", dict(dilations=[3, 1])),
}

QCONV_ONLY_CASES = {
    # scales not floating point
    "x_scale int array": (TypeError, "x_scale", dict(x_scale=np.array(1, I32))),
    "w_scale int array": (TypeError, "w_scale", dict(w_scale=np.ones(6, I32))),
    "y_scale string": (TypeError, "y_scale", dict(y_scale="0.5")),
    # scale / zero point shapes
    "w_scale length != M": (ValueError, "w_scale|w_zero_point",
                            dict(w_scale=np.full(5, 0.01, F32), w_zero_point=np.zeros(5, I8))),
    "w_zero_point length != w_scale": (ValueError, "w_zero_point", dict(w_zero_point=np.zeros(3, I8))),
    "w_scale 2-D": (ValueError, "w_scale|w_zero_point",
                    dict(w_scale=np.full((6, 1), 0.01, F32), w_zero_point=np.zeros((6, 1), I8))),
    "x_scale per channel": (ValueError, "x_scale", dict(x_scale=np.full(4, 0.02, F32), x_zero_point=np.full(4, 1, U8))),
    "y_zero_point two values": (ValueError, "y_zero_point", dict(y_zero_point=np.array([1, 2], U8))),
    # non-finite / zero scales
    "x_scale NaN": (ValueError, "x_scale", dict(x_scale=F32(np.nan))),
    "w_scale inf": (ValueError, "w_scale", dict(w_scale=np.array([0.01] * 5 + [np.inf], F32))),
    "y_scale inf": (ValueError, "y_scale", dict(y_scale=F32(np.inf))),
    "y_scale zero": (ValueError, "y_scale", dict(y_scale=F32(0.0))),
    # output zero point
    "y_zero_point Python int": (TypeError, "y_zero_point", dict(y_zero_point=100)),
    "y_zero_point int32": (TypeError, "y_zero_point", dict(y_zero_point=I32(0))),
    # bias
    "B wrong length": (ValueError, "B", dict(B=np.zeros(5, I32))),
    "B 2-D": (ValueError, "B", dict(B=np.zeros((6, 1), I32))),
    "B int64": (TypeError, "B", dict(B=np.zeros(6, np.int64))),
    "B float32": (TypeError, "B", dict(B=np.zeros(6, F32))),
}


@pytest.mark.parametrize("case", list(CONV_CASES) + list(QCONV_ONLY_CASES))
def test_qlinear_conv_rejects(case):
    exc, name, changes = {**CONV_CASES, **QCONV_ONLY_CASES}[case]
    expect_error(exc, "qlinear_conv", name, call_qconv, **changes)


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_integer_rejects(case):
    exc, name, changes = CONV_CASES[case]
    expect_error(exc, "conv_integer", name, call_convint, **changes)


def test_non_finite_requantization_multiplier():
    """x_scale * w_scale overflows float32: the multiplier is not finite."""
    for changes in (dict(x_scale=F32(1e30), w_scale=np.full(6, 1e30, F32)),
                    dict(x_scale=F32(1e20), y_scale=F32(1e-30))):
        with pytest.raises(ValueError, match=r"^qlinear_conv: "):
            call_qconv(**changes)
    with pytest.raises(ValueError, match=r"^qlinear_matmul: "):
        call_qmm(a_scale=F32(3e38), b_scale=F32(10.0))


# ----------------------------------------------------------------------------- matmul

A = mm_args()["a"]
B_ = mm_args()["b"]

MM_CASES = {
    "a float32": (TypeError, "a", dict(a=A.astype(F32))),
    "a int32": (TypeError, "a", dict(a=A.astype(I32))),
    "b uint16": (TypeError, "b", dict(b=B_.astype(np.uint16))),
    "b list": (TypeError, "b", dict(b=B_.tolist())),
    "a_zero_point dtype": (TypeError, "a_zero_point", dict(a_zero_point=I8(0))),
    "b_zero_point dtype": (TypeError, "b_zero_point", dict(b_zero_point=U8(0))),
    "a_zero_point int 300": (ValueError, "a_zero_point", dict(a_zero_point=300)),
    "b_zero_point int -129": (ValueError, "b_zero_point", dict(b_zero_point=-129)),
    "K mismatch": (ValueError, "b", dict(b=np.zeros((3, 5), I8))),
    "batch not broadcastable": (ValueError, "b", dict(b=np.zeros((4, 4, 5), I8))),
    "a 0-d": (ValueError, "a", dict(a=U8(3))),
    "a_zero_point per-row wrong length": (ValueError, "a_zero_point|a_scale", dict(a_zero_point=np.zeros(4, U8))),
    "b_zero_point per-column wrong length": (ValueError, "b_zero_point|b_scale", dict(b_zero_point=np.zeros(4, I8))),
}

QMM_ONLY_CASES = {
    "a_scale int": (TypeError, "a_scale", dict(a_scale=np.array(1, I32))),
    "b_scale int": (TypeError, "b_scale", dict(b_scale=np.ones(5, np.int64))),
    "a_scale per-row wrong length": (ValueError, "a_scale|a_zero_point",
                                     dict(a_scale=np.ones(4, F32), a_zero_point=np.zeros(4, U8))),
    "a_scale [..., M, 1] wrong batch": (ValueError, "a_scale",
                                        dict(a_scale=np.ones((4, 3, 1), F32), a_zero_point=np.zeros((4, 3, 1), U8))),
    "b_scale per-column wrong length": (ValueError, "b_scale|b_zero_point",
                                        dict(b_scale=np.ones(4, F32), b_zero_point=np.zeros(4, I8))),
    "a_scale [M, 1] for 3-D a (ndim differs)": (ValueError, "a_scale|a_zero_point",
                                                 dict(a_scale=np.ones((3, 1), F32), a_zero_point=np.zeros((3, 1), U8))),
    "a_scale/a_zero_point shape mismatch": (ValueError, "a_zero_point", dict(a_scale=np.ones(3, F32))),
    "b_scale/b_zero_point shape mismatch": (ValueError, "b_zero_point", dict(b_zero_point=np.zeros(5, I8))),
    "a_scale NaN": (ValueError, "a_scale", dict(a_scale=F32(np.nan))),
    "b_scale -inf": (ValueError, "b_scale", dict(b_scale=F32(-np.inf))),
    "y_scale zero": (ValueError, "y_scale", dict(y_scale=F32(0))),
    "y_scale 2 values": (ValueError, "y_scale", dict(y_scale=np.ones(2, F32))),
    "y_zero_point Python int": (TypeError, "y_zero_point", dict(y_zero_point=0)),
    "y_zero_point float": (TypeError, "y_zero_point", dict(y_zero_point=F32(0))),
}


@pytest.mark.parametrize("case", list(MM_CASES) + list(QMM_ONLY_CASES))
def test_qlinear_matmul_rejects(case):
    exc, name, changes = {**MM_CASES, **QMM_ONLY_CASES}[case]
    if "a_zero_point" in changes and "a_scale" not in changes and np.ndim(changes["a_zero_point"]) == 1:
        changes = dict(changes, a_scale=np.ones(changes["a_zero_point"].shape, F32))
    if "b_zero_point" in changes and "b_scale" not in changes and np.ndim(changes["b_zero_point"]) == 1 \
            and case != "b_scale/b_zero_point shape mismatch":
        changes = dict(changes, b_scale=np.ones(changes["b_zero_point"].shape, F32))
    expect_error(exc, "qlinear_matmul", name, call_qmm, **changes)


@pytest.mark.parametrize("case", list(MM_CASES))
def test_matmul_integer_rejects(case):
    exc, name, changes = MM_CASES[case]
    expect_error(exc, "matmul_integer", name, call_mmi, **changes)


# ----------------------------------------------------------------------------- quantize

Q_CASES = {
    "x uint8": (TypeError, "x", dict(x=np.zeros((2, 3, 4), U8))),
    "x float64": (TypeError, "x", dict(x=np.zeros((2, 3, 4)))),
    "x list": (TypeError, "x", dict(x=[[1.0]])),
    "y_scale int before version 19": (TypeError, "y_scale", dict(y_scale=np.ones(3, I32), version=13)),
    "y_scale zero": (ValueError, "y_scale", dict(y_scale=np.array([0.1, 0.0, 0.3], F32))),
    "y_scale NaN": (ValueError, "y_scale", dict(y_scale=np.array([0.1, np.nan, 0.3], F32))),
    "y_scale inf": (ValueError, "y_scale", dict(y_scale=F32(np.inf), y_zero_point=U8(0))),
    "y_scale 2-D": (ValueError, "y_scale", dict(y_scale=np.ones((3, 1), F32), y_zero_point=np.zeros((3, 1), U8))),
    "y_scale length != x.shape[axis]": (ValueError, "y_scale",
                                        dict(y_scale=np.ones(4, F32), y_zero_point=np.zeros(4, U8))),
    "y_zero_point shape != y_scale": (ValueError, "y_zero_point", dict(y_zero_point=np.zeros(2, U8))),
    "y_zero_point int32": (TypeError, "y_zero_point", dict(y_zero_point=np.zeros(3, I32))),
    "y_zero_point Python int": (TypeError, "y_zero_point", dict(y_scale=F32(0.1), y_zero_point=3)),
    "axis too large": (ValueError, "axis", dict(axis=3)),
    "axis too small": (ValueError, "axis", dict(axis=-4)),
}


@pytest.mark.parametrize("case", list(Q_CASES))
def test_quantize_linear_rejects(case):
    exc, name, changes = Q_CASES[case]
    expect_error(exc, "quantize_linear", name, call_q, **changes)


DQ_CASES = {
    "x float32": (TypeError, "x", dict(x=np.zeros((2, 3, 4), F32))),
    "x int16 before version 21": (TypeError, "x", dict(x=np.zeros((2, 3, 4), np.int16), version=13)),
    "x float64": (TypeError, "x", dict(x=np.zeros((2, 3, 4)))),
    "x_scale int": (TypeError, "x_scale", dict(x_scale=np.ones(3, I32))),
    "x_scale NaN": (ValueError, "x_scale", dict(x_scale=np.array([0.1, np.nan, 0.3], F32))),
    "x_scale inf": (ValueError, "x_scale", dict(x_scale=np.array([0.1, 0.2, np.inf], F32))),
    "x_zero_point dtype": (TypeError, "x_zero_point", dict(x_zero_point=np.zeros(3, I8))),
    "x_zero_point shape != x_scale": (ValueError, "x_zero_point", dict(x_zero_point=np.zeros(2, U8))),
    "x_scale length != x.shape[axis]": (ValueError, "x_scale",
                                        dict(x_scale=np.ones(2, F32), x_zero_point=np.zeros(2, U8))),
    "x_zero_point int 256": (ValueError, "x_zero_point", dict(x_scale=F32(0.1), x_zero_point=256)),
    "int32 x with nonzero zero point": (ValueError, "x_zero_point",
                                        dict(x=np.zeros((2, 3, 4), I32), x_zero_point=np.array([0, 1, 0], I32))),
    "int32 x with Python int zero point 5": (ValueError, "x_zero_point",
                                             dict(x=np.zeros((2, 3, 4), I32), x_scale=F32(0.1), x_zero_point=5)),
    "axis too large": (ValueError, "axis", dict(axis=3)),
    "axis too small": (ValueError, "axis", dict(axis=-4)),
}


@pytest.mark.parametrize("case", list(DQ_CASES))
def test_dequantize_linear_rejects(case):
    exc, name, changes = DQ_CASES[case]
    expect_error(exc, "dequantize_linear", name, call_dq, **changes)
