"""qlinear against onnxruntime's CPU kernels (one-node models, one intra-op thread).

Where onnxruntime is exact, qlinear must be bit-identical to it. Measured on an AVX2 machine
without VNNI (onnxruntime 1.32): its u8 x s8 GEMM kernels add adjacent products in saturating
16-bit sums, exact only while the int8 operand stays within [-64, 64] (at +-65 a pair sum
can reach 2 * 255 * 65 = 33150). The kernels that saturate there: QLinearConv (non-depthwise)
and QLinearMatMul with uint8 x / int8 w, MatMulInteger with uint8 a / int8 b, and ConvInteger
with *int8 x* / uint8 w (its GEMM takes the weights as the left operand; padded positions
hold x_zero_point, so an int8 x_zero_point = 115 made it wrong on fully padded rows).
uint8 x uint8 and int8 x int8 are exact over the full range; so are ConvInteger with uint8 x /
int8 w and MatMulInteger with int8 a / uint8 b. On CPUs with AVX-VNNI or AVX512-VNNI every
combination is exact. The tests below keep every mixed int8 operand within [-64, 64], so they
hold on both kinds of CPU; qlinear.tools.ortsat's probe says which kind this one is, and
tests/test_emulation.py checks the saturation model.

Operator/type combinations onnxruntime implements: QLinearConv and QLinearMatMul only
(x, w, y) in {(u8, u8, u8), (u8, s8, u8), (s8, s8, s8)}; ConvInteger and MatMulInteger all four.
onnxruntime refuses dilations with SAME_UPPER/SAME_LOWER and per-row a_scale in QLinearMatMul;
those are not generated here. It does accept (and computes correctly) per-channel QLinearConv
weight zero points that differ between channels, for uint8 and int8 weights, as graph inputs or
as initializers (checked below), contrary to a note in the project brief (docs/contract.md records the measurement).
"""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import I8, I32, U8, assert_exact, rand_extreme, rand_int, rand_scale

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

EXACT_S8_RANGE = (-64, 64)  # int8 operand range where onnxruntime's u8 x s8 kernels are exact
QLINEAR_COMBOS = [(U8, U8, U8), (U8, I8, U8), (I8, I8, I8)]
INTEGER_COMBOS = [(U8, U8), (U8, I8), (I8, U8), (I8, I8)]
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def run_ort(op_type, inputs, attrs=None, opset=13, out_dtype=np.float32, initializers=()):
    """Run one ONNX node in onnxruntime. inputs: [(name, array or None)] in spec order;
    the names in `initializers` become constant initializers (as weights are in real models,
    where onnxruntime prepacks them), the others graph inputs."""
    names, value_infos, feeds, constants = [], [], {}, []
    for name, value in inputs:
        if value is None:
            names.append("")
            continue
        value = np.asarray(value)
        names.append(name)
        if name in initializers:
            constants.append(numpy_helper.from_array(value, name))
            continue
        value_infos.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
        feeds[name] = value
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op_type, names, ["y"], **(attrs or {}))
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
    model = helper.make_model(helper.make_graph([node], op_type, value_infos, [out], initializer=constants),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def operand(rng, dtype, shape, mixed):
    """Full-range values, except an int8 operand facing a uint8 one: within EXACT_S8_RANGE."""
    if dtype == I8 and mixed:
        return rand_int(rng, I8, shape, *EXACT_S8_RANGE)
    return rand_int(rng, dtype, shape)


def zero_point(rng, dtype, mixed):
    """Zero points too: padded positions of x hold x_zero_point, an operand value for the kernel."""
    return operand(rng, dtype, (), mixed)


def zero_point_array(rng, dtype, shape, mixed):
    return operand(rng, dtype, shape, mixed)


def conv_attrs(rng, nsp, auto_pad):
    kernel = [int(v) for v in rng.integers(1, 3 if nsp == 3 else 4, nsp)]
    strides = [int(v) for v in rng.integers(1, 3, nsp, endpoint=True)]
    dilations = [1] * nsp if auto_pad.startswith("SAME") else [int(v) for v in rng.integers(1, 3, nsp)]
    size = [int(v) for v in rng.integers(3 if nsp == 3 else 4, 6 if nsp == 3 else 9, nsp)]
    size = [max(s, (k - 1) * d + 1) for s, k, d in zip(size, kernel, dilations)]
    attrs = dict(auto_pad=auto_pad, strides=strides, dilations=dilations, kernel_shape=kernel)
    if auto_pad == "NOTSET":
        attrs["pads"] = [int(v) for v in rng.integers(0, 2, 2 * nsp, endpoint=True)]
    return size, kernel, attrs


# ----------------------------------------------------------------------------- exact regime


WEIGHT_CONSTANTS = {"w", "w_scale", "w_zero_point", "B", "b", "b_scale", "b_zero_point"}


@pytest.mark.parametrize("weights_as", ["inputs", "initializers"])
@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("xdt,wdt,ydt", QLINEAR_COMBOS, ids=["u8u8u8", "u8s8u8", "s8s8s8"])
def test_qlinear_conv_matches_ort(xdt, wdt, ydt, nsp, auto_pad, weights_as):
    rng = np.random.default_rng([QLINEAR_COMBOS.index((xdt, wdt, ydt)), nsp, AUTO_PADS.index(auto_pad),
                                 weights_as == "inputs", 61])
    constants = WEIGHT_CONSTANTS if weights_as == "initializers" else ()
    mixed = xdt != wdt
    for _ in range(2):
        size, kernel, attrs = conv_attrs(rng, nsp, auto_pad)
        group = int(rng.choice([1, 2]))
        m_out = group * int(rng.integers(1, 3, endpoint=True))
        x = operand(rng, xdt, (int(rng.integers(1, 2, endpoint=True)), 2 * group, *size), mixed)
        w = operand(rng, wdt, (m_out, 2, *kernel), mixed)
        per_channel = bool(rng.integers(2))
        ws = rand_scale(rng, (m_out,)) if per_channel else rand_scale(rng)
        # per-channel weight zero points that differ between channels (onnxruntime 1.32 accepts them)
        wz = zero_point_array(rng, wdt, (m_out,) if per_channel else (), mixed)
        xs = rand_scale(rng)
        ys = np.float32(float(xs) * float(np.max(ws)) * 120 * np.sqrt(2 * np.prod(kernel)))
        B = rand_int(rng, I32, (m_out,), -20000, 20000) if rng.integers(2) else None
        args = [x, xs, zero_point(rng, xdt, mixed), w, ws, wz, ys, rand_int(rng, ydt, ()), B]
        attrs["group"] = group
        names = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"]
        want = run_ort("QLinearConv", list(zip(names, args)), attrs, 10, ydt, constants)
        assert_exact(qlinear.qlinear_conv(*args, **attrs), want)


@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("xdt,wdt", INTEGER_COMBOS, ids=["u8u8", "u8s8", "s8u8", "s8s8"])
def test_conv_integer_matches_ort(xdt, wdt, auto_pad):
    rng = np.random.default_rng([INTEGER_COMBOS.index((xdt, wdt)), AUTO_PADS.index(auto_pad), 62])
    mixed = xdt != wdt
    for nsp in (1, 2, 3):
        size, kernel, attrs = conv_attrs(rng, nsp, auto_pad)
        attrs["group"] = int(rng.choice([1, 3]))
        x = operand(rng, xdt, (2, 2 * attrs["group"], *size), mixed)
        w = operand(rng, wdt, (attrs["group"] * 2, 2, *kernel), mixed)
        xz, wz = zero_point(rng, xdt, mixed), zero_point(rng, wdt, mixed)
        want = run_ort("ConvInteger", [("x", x), ("w", w), ("x_zero_point", xz), ("w_zero_point", wz)],
                       attrs, 10, I32)
        assert_exact(qlinear.conv_integer(x, w, xz, wz, **attrs), want)
        want = run_ort("ConvInteger", [("x", x), ("w", w)], attrs, 10, I32)
        assert_exact(qlinear.conv_integer(x, w, **attrs), want)


MATMUL_SHAPES = [((3, 7), (7, 4)), ((2, 3, 7), (7, 5)), ((2, 3, 7), (2, 7, 5)), ((1, 3, 7), (4, 7, 2)),
                 ((7,), (7, 3)), ((3, 7), (7,)), ((2, 1, 4, 9), (3, 9, 2)), ((5, 70), (70, 6))]


@pytest.mark.parametrize("weights_as", ["inputs", "initializers"])
@pytest.mark.parametrize("shape_a,shape_b", MATMUL_SHAPES, ids=[f"{a}x{b}" for a, b in MATMUL_SHAPES])
@pytest.mark.parametrize("adt,bdt,ydt", QLINEAR_COMBOS, ids=["u8u8u8", "u8s8u8", "s8s8s8"])
def test_qlinear_matmul_matches_ort(adt, bdt, ydt, shape_a, shape_b, weights_as):
    rng = np.random.default_rng([QLINEAR_COMBOS.index((adt, bdt, ydt)), MATMUL_SHAPES.index((shape_a, shape_b)),
                                 weights_as == "inputs", 63])
    constants = WEIGHT_CONSTANTS if weights_as == "initializers" else ()
    mixed = adt != bdt
    for _ in range(3):
        a = operand(rng, adt, shape_a, mixed)
        b = operand(rng, bdt, shape_b, mixed)
        a_s, b_s = rand_scale(rng), rand_scale(rng)
        ys = np.float32(float(a_s) * float(b_s) * 120 * np.sqrt(shape_a[-1]) * rng.uniform(0.3, 3))
        args = [a, a_s, zero_point(rng, adt, mixed), b, b_s, zero_point(rng, bdt, mixed), ys, rand_int(rng, ydt, ())]
        names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
        want = run_ort("QLinearMatMul", list(zip(names, args)), {}, 10, ydt, constants)
        assert_exact(qlinear.qlinear_matmul(*args), want)


@pytest.mark.parametrize("shape_a,shape_b", MATMUL_SHAPES, ids=[f"{a}x{b}" for a, b in MATMUL_SHAPES])
@pytest.mark.parametrize("adt,bdt", INTEGER_COMBOS, ids=["u8u8", "u8s8", "s8u8", "s8s8"])
def test_matmul_integer_matches_ort(adt, bdt, shape_a, shape_b):
    rng = np.random.default_rng([INTEGER_COMBOS.index((adt, bdt)), MATMUL_SHAPES.index((shape_a, shape_b)), 64])
    mixed = adt != bdt
    for _ in range(2):
        a = operand(rng, adt, shape_a, mixed)
        b = operand(rng, bdt, shape_b, mixed)
        az, bz = zero_point(rng, adt, mixed), zero_point(rng, bdt, mixed)
        want = run_ort("MatMulInteger", [("A", a), ("B", b), ("a_zero_point", az), ("b_zero_point", bz)], {}, 10, I32)
        assert_exact(qlinear.matmul_integer(a, b, az, bz), want)
    want = run_ort("MatMulInteger", [("A", a), ("B", b)], {}, 10, I32)
    assert_exact(qlinear.matmul_integer(a, b), want)


def test_matmul_per_column_b_matches_ort():
    """Per-column b zero points / scales for 2-D b (a per tensor)."""
    rng = np.random.default_rng(65)
    for _ in range(5):
        a = rand_int(rng, U8, (2, 4, 12))
        b = rand_int(rng, U8, (12, 5))
        bz = rand_int(rng, U8, (5,))
        b_s = rand_scale(rng, (5,))
        want = run_ort("MatMulInteger", [("A", a), ("B", b), ("a_zero_point", U8(7)), ("b_zero_point", bz)],
                       {}, 10, I32)
        assert_exact(qlinear.matmul_integer(a, b, U8(7), bz), want)
        args = [a, np.float32(0.02), U8(7), b, b_s, bz, np.float32(0.5), U8(128)]
        names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
        want = run_ort("QLinearMatMul", list(zip(names, args)), {}, 10, U8)
        assert_exact(qlinear.qlinear_matmul(*args), want)


def test_u8s8_exact_range_boundary_is_exact_in_ort(record_property):
    """All activations 255 against int8 weights at -64 or 64: ORT's pair sums stay below 2**15.
    At -65 / 65 they do not; that is reported (not asserted), qlinear must stay exact."""
    a = np.full((4, 32), 255, U8)
    for value in (-65, 65):
        b = np.full((32, 3), value, I8)
        want = oracle.matmul_integer(a, b)
        assert_exact(qlinear.matmul_integer(a, b), want)
        wrong = int((run_ort("MatMulInteger", [("A", a), ("B", b)], {}, 10, I32) != want).sum())
        record_property(f"ort_matmulinteger_wrong_outputs_at_{value}", f"{wrong}/{want.size}")
    for value in EXACT_S8_RANGE:
        b = np.full((32, 3), value, I8)
        want = run_ort("MatMulInteger", [("A", a), ("B", b)], {}, 10, I32)
        assert_exact(qlinear.matmul_integer(a, b), want)
        assert_exact(want, oracle.matmul_integer(a, b))
        args = [a, np.float32(1e-3), U8(0), b, np.float32(1e-3), I8(0), np.float32(1e-2), U8(128)]
        names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
        want = run_ort("QLinearMatMul", list(zip(names, args)), {}, 10, U8)
        assert_exact(qlinear.qlinear_matmul(*args), want)


# ----------------------------------------------------------------------------- (de)quantize


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), -1), ((1, 3, 2, 2), 1)])
def test_quantize_dequantize_match_ort(dt, shape, axis):
    rng = np.random.default_rng([len(shape), axis + 4, int(dt == I8), 66])
    n = shape[axis]
    for per_axis in (False, True):
        scale = rand_scale(rng, (n,), 0.01, 2) if per_axis else rand_scale(rng, (), 0.01, 2)
        zp = rand_int(rng, dt, scale.shape)
        x = (rng.standard_normal(shape) * 150).astype(np.float32)
        x.ravel()[: min(4, x.size)] = np.array([np.nan, np.inf, -np.inf, 2.5], np.float32)[: min(4, x.size)]
        want = run_ort("QuantizeLinear", [("x", x), ("y_scale", scale), ("y_zero_point", zp)], dict(axis=axis), 13, dt)
        assert_exact(qlinear.quantize_linear(x, scale, zp, axis=axis), want)
        want = run_ort("QuantizeLinear", [("x", x), ("y_scale", scale)], dict(axis=axis), 13, U8)
        assert_exact(qlinear.quantize_linear(x, scale, axis=axis), want)
        q = rand_int(rng, dt, shape)
        want = run_ort("DequantizeLinear", [("x", q), ("x_scale", scale), ("x_zero_point", zp)], dict(axis=axis), 13)
        assert_exact(qlinear.dequantize_linear(q, scale, zp, axis=axis), want)
        q32 = rand_int(rng, I32, shape)
        want = run_ort("DequantizeLinear", [("x", q32), ("x_scale", scale)], dict(axis=axis), 13)
        assert_exact(qlinear.dequantize_linear(q32, scale, axis=axis), want)


@pytest.mark.parametrize("dt", [U8, I8])
def test_nan_quantization_is_type_minimum_like_ort(dt, record_property):
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    for zp in (0, 5, int(np.iinfo(dt).max)):
        want = run_ort("QuantizeLinear", [("x", x), ("y_scale", np.float32(0.5)), ("y_zero_point", dt(zp))], {}, 13, dt)
        assert want[:2].tolist() == [np.iinfo(dt).min] * 2  # what onnxruntime gives: T's min
        assert_exact(qlinear.quantize_linear(x, np.float32(0.5), dt(zp)), want)
    record_property("ort_nan_quantizes_to", int(np.iinfo(dt).min))


def test_quantize_near_ties_match_ort():
    """Values whose x / scale lies within an ulp or two of k + 0.5."""
    rng = np.random.default_rng(67)
    scale = rand_scale(rng, (), 0.01, 3)
    k = rng.integers(-120, 120, 4000)
    x = ((k + 0.5) * float(scale)).astype(np.float32)
    x = np.where(rng.random(4000) < 0.3, np.nextafter(x, np.float32(np.inf)), x).astype(np.float32)
    for dt in (U8, I8):
        zp = dt(0 if dt == I8 else 128)
        want = run_ort("QuantizeLinear", [("x", x), ("y_scale", scale), ("y_zero_point", zp)], {}, 13, dt)
        assert_exact(qlinear.quantize_linear(x, scale, zp), want)


# ----------------------------------------------------------------------------- where ORT is wrong


def test_full_range_u8s8_ort_mismatches_but_qlinear_is_exact(record_property, capsys):
    """uint8 activations x full-range int8 weights: onnxruntime's AVX2 kernels saturate 16-bit
    pair sums; qlinear must equal the oracle. What onnxruntime must do follows the probe
    (qlinear.tools.ortsat, measured): mismatches where it saturates, none where it is exact
    (VNNI); the counts are reported."""
    rng = np.random.default_rng(68)
    # QLinearConv, 3x3, 16 input channels
    x = rand_int(rng, U8, (1, 16, 8, 8))
    w = rand_int(rng, I8, (8, 16, 3, 3))
    w[:, :, 0, 0] = rand_extreme(rng, I8, (8, 16))
    conv_args = [x, np.float32(0.02), U8(128), w, np.float32(0.01), I8(0),
                 np.float32(0.02 * 0.01 * 128 * 127 * 12 / 100), U8(128)]
    names = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point"]
    conv_attrs_ = dict(pads=[1, 1, 1, 1])
    want = oracle.qlinear_conv(*conv_args, **conv_attrs_)
    assert_exact(qlinear.qlinear_conv(*conv_args, **conv_attrs_), want)
    conv_report, conv_size = {}, want.size
    for weights_as, constants in (("inputs", ()), ("initializers", WEIGHT_CONSTANTS)):
        got_ort = run_ort("QLinearConv", list(zip(names, conv_args)), conv_attrs_, 10, U8, constants)
        conv_report[weights_as] = (int((got_ort != want).sum()),
                                   int(np.abs(got_ort.astype(int) - want.astype(int)).max()))

    # QLinearMatMul, 50 random cases
    mm_cases_wrong = mm_max_steps = 0
    for case in range(50):
        k = int(rng.integers(16, 128))
        a = rand_int(rng, U8, (4, k))
        b = rand_int(rng, I8, (k, 6))
        args = [a, np.float32(0.02), rand_int(rng, U8, ()), b, np.float32(0.01), I8(0),
                np.float32(0.02 * 0.01 * 128 * 127 * np.sqrt(k) / 100), U8(128)]
        want = oracle.qlinear_matmul(*args)
        assert_exact(qlinear.qlinear_matmul(*args), want)
        got_ort = run_ort("QLinearMatMul", list(zip(
            ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"], args)),
            {}, 10, U8, WEIGHT_CONSTANTS if case % 2 else ())  # half with b as an initializer
        if (got_ort != want).any():
            mm_cases_wrong += 1
            mm_max_steps = max(mm_max_steps, int(np.abs(got_ort.astype(int) - want.astype(int)).max()))

    from qlinear.tools.ortsat import onnxruntime_saturates

    saturates = onnxruntime_saturates()
    if saturates:  # the extreme weights of the first tap make pair sums of up to 64770
        assert all(wrong > 0 for wrong, _ in conv_report.values()), conv_report
    elif saturates is False:
        assert all(wrong == 0 for wrong, _ in conv_report.values()) and mm_cases_wrong == 0, \
            (conv_report, mm_cases_wrong)
    for weights_as, (wrong, steps) in conv_report.items():
        record_property(f"ort_qlinearconv_wrong_outputs_weights_as_{weights_as}", f"{wrong}/{conv_size}")
        record_property(f"ort_qlinearconv_max_steps_weights_as_{weights_as}", steps)
    record_property("ort_qlinearmatmul_wrong_cases", f"{mm_cases_wrong}/50")
    record_property("ort_qlinearmatmul_max_steps", mm_max_steps)
    with capsys.disabled():
        conv_text = ", ".join(f"{wrong}/{conv_size} outputs wrong, max {steps} steps (weights as {how})"
                              for how, (wrong, steps) in conv_report.items())
        print(f"\n[onnxruntime {ort.__version__}, full-range u8 x s8] QLinearConv: {conv_text}; "
              f"QLinearMatMul: {mm_cases_wrong}/50 cases wrong (max {mm_max_steps} steps); qlinear: exact")
