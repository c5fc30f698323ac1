"""The benchmark's cases: one ONNX operator each, on fixed shapes from real networks.

Every case is one operator on shapes taken from ResNet-50, MobileNetV2 and BERT-base plus a
few synthetic ones. A :class:`Case` builds (:class:`Built`) the inputs, the one-node ONNX model
that onnxruntime and onnx.reference run, and the two qlinear callables (prepared and plain).
Activations and weights span their full ranges; see docs/benchmarks.md, "What is measured".
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from typing import Any, Callable

import numpy as np

import qlinear
from qlinear import dtypes

MIB = 1 << 20


@dataclasses.dataclass
class Case:
    """One benchmark case: an operator on fixed shapes."""

    name: str
    group: str  # "conv", "matmul" or "quant": the groups the targets are stated over
    op: str  # ONNX operator type
    shape: str  # human-readable shapes
    macs: int  # multiply-accumulates (0 for QuantizeLinear / DequantizeLinear)
    build: Callable[[np.random.Generator], "Built"]
    quick: bool = False  # part of the --quick subset
    batch8_resnet: bool = False  # the workspace-limit target applies to these
    types: str = ""  # operand types of the products ("u8s8": uint8 activations, int8 weights)


@dataclasses.dataclass
class Built:
    """Materialized case: inputs, one-node ONNX model and the qlinear callables."""

    feeds: dict[str, np.ndarray]  # runtime inputs of the ONNX model
    model: Any  # onnx.ModelProto
    prepare: Callable[[], Callable[[], np.ndarray]]  # builds the prepared qlinear callable
    plain: Callable[[], np.ndarray]  # the plain qlinear function call


# operand types: (activations / a, weights / b)
_TYPES = {"u8s8": (np.dtype(np.uint8), np.dtype(np.int8)),
          "u8u8": (np.dtype(np.uint8), np.dtype(np.uint8)),
          "s8s8": (np.dtype(np.int8), np.dtype(np.int8))}


def _types_note(types: str) -> str:
    return "" if types == "u8s8" else f" ({types[:2]}x{types[2:]})"


def _full_range(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Uniform values over the whole range of the 8-bit dtype (what exactness must cover)."""
    lo, hi = dtypes.INT_RANGE[np.dtype(dtype)]
    return rng.integers(lo, hi + 1, shape, dtype=dtype)


def _weights(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, bits: int) -> np.ndarray:
    """Weights over the full range (bits 8), or within 2^(bits-1) of the benchmark's weight
    zero point (0 for int8, 128 for uint8): 7 bits is where qlinear's fast path applies."""
    if bits >= 8:
        return _full_range(rng, shape, dtype)
    zero = 0 if dtype == np.int8 else 128
    return rng.integers(zero - (1 << (bits - 1)), zero + (1 << (bits - 1)), shape, dtype=dtype)


def _mid_zero_point(rng: np.random.Generator, dtype: np.dtype) -> np.generic:
    lo = 100 if dtype == np.uint8 else -28
    return dtype.type(rng.integers(lo, lo + 56))


def _conv_out(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    return (size + pb + pe - d * (k - 1) - 1) // s + 1


def _requant_scale(x_scale: float, w_scale: np.ndarray, reduction: int) -> np.float32:
    """A y_scale that spreads accumulators of uniform full-range data over the output range.

    For x - zp uniform in about [-128, 127] and w uniform in [-128, 127], each product has
    standard deviation ~74 * 74, so the accumulator's is ~sqrt(K) * 5476; map +-3 sigma
    onto 255 steps.
    """
    sigma = math.sqrt(reduction) * 74.0 * 74.0
    return np.float32(float(x_scale) * float(np.mean(w_scale)) * 6.0 * sigma / 255.0)


def _onnx_model(op: str, inputs: list[tuple[str, np.ndarray, bool]], out_dtype: np.dtype,
                attrs: dict[str, Any], opset: int = 13):
    """One-node model; inputs are (name, value, is_initializer); '' names an absent input."""
    from onnx import TensorProto, helper, numpy_helper

    graph_inputs, inits, names = [], [], []
    for name, value, is_init in inputs:
        names.append(name)
        if not name:
            continue
        if is_init:
            inits.append(numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, ["y"], **attrs)
    out_elem = helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype))
    graph = helper.make_graph([node], op, graph_inputs,
                              [helper.make_tensor_value_info("y", out_elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    _ = TensorProto  # keep the import explicit for readers
    return model


def _conv_case(name: str, n: int, c: int, spatial: tuple[int, ...], m: int,
              kernel: tuple[int, ...], *, strides: tuple[int, ...] | None = None,
              pads: tuple[int, ...] | None = None, group: int = 1, op: str = "QLinearConv",
              quick: bool = False, batch8_resnet: bool = False, types: str = "u8s8",
              weight_bits: int = 8) -> Case:
    rank = len(spatial)
    # Per-channel weight scales for 2-D layers (as quantized CNNs use); per-tensor elsewhere,
    # because onnx.reference handles per-channel scales only for 2-D convolutions.
    per_channel = rank == 2
    strides = strides or (1,) * rank
    pads = pads if pads is not None else tuple(k // 2 for k in kernel) * 2
    out = tuple(_conv_out(spatial[i], kernel[i], strides[i], 1, pads[i], pads[i + rank])
                for i in range(rank))
    cg = c // group
    macs = n * m * math.prod(out) * cg * math.prod(kernel)
    k_str = "x".join(map(str, kernel))
    x_dt, w_dt = _TYPES[types]
    shape = (f"{n}x{c}x{'x'.join(map(str, spatial))} * {m}x{cg}x{k_str}"
             + (f" s{strides[0]}" if max(strides) > 1 else "")
             + (f" g{group}" if group > 1 else "")
             + f" -> {'x'.join(map(str, out))}")

    def build(rng: np.random.Generator) -> Built:
        x = _full_range(rng, (n, c) + spatial, x_dt)
        x_zp = _mid_zero_point(rng, x_dt)
        attrs = dict(kernel_shape=list(kernel), pads=list(pads), strides=list(strides),
                     group=group)
        reduction = cg * math.prod(kernel)
        if op == "QLinearConv":
            w = _weights(rng, (m, cg) + kernel, w_dt, weight_bits)
            x_scale = np.float32(0.02)
            w_zero = 0 if w_dt == np.int8 else 128
            if per_channel:
                w_scale = rng.uniform(0.002, 0.02, m).astype(np.float32)
                w_zp = np.full(m, w_zero, w_dt)
            else:
                w_scale, w_zp = np.array(0.01, np.float32), np.array(w_zero, w_dt)
            y_scale = _requant_scale(x_scale, w_scale, reduction)
            y_zp = x_dt.type(128 if x_dt == np.uint8 else 0)
            bias = rng.integers(-20000, 20000, m, dtype=np.int32)
            model = _onnx_model(op, [("x", x, False), ("x_scale", np.array(x_scale), True),
                                     ("x_zero_point", np.array(x_zp), True), ("w", w, True),
                                     ("w_scale", np.asarray(w_scale), True),
                                     ("w_zero_point", np.asarray(w_zp), True),
                                     ("y_scale", np.array(y_scale), True),
                                     ("y_zero_point", np.array(y_zp), True), ("B", bias, True)],
                                x_dt, attrs)

            def prepare():
                p = qlinear.prepare_qlinear_conv(w, w_scale, w_zp, bias, **attrs)
                return lambda: p.run(x, x_scale, x_zp, y_scale, y_zp)

            def plain():
                return qlinear.qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp,
                                            bias, **attrs)
        else:  # ConvInteger
            w = _weights(rng, (m, cg) + kernel, w_dt, weight_bits)
            w_zp = w_dt.type(0 if w_dt == np.int8 else 128)
            model = _onnx_model(op, [("x", x, False), ("w", w, True),
                                     ("x_zero_point", np.array(x_zp), True),
                                     ("w_zero_point", np.array(w_zp), True)], np.int32, attrs)

            def prepare():
                p = qlinear.prepare_conv_integer(w, w_zero_point=w_zp, **attrs)
                return lambda: p.run(x, x_zp)

            def plain():
                return qlinear.conv_integer(x, w, x_zp, w_zp, **attrs)
        return Built({"x": x}, model, prepare, plain)

    return Case(name, "conv", op, shape + _types_note(types), macs, build, quick,
                batch8_resnet, types)


def matmul_case(name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], *,
                op: str = "QLinearMatMul", b_const: bool = True, quick: bool = False,
                types: str = "u8s8") -> Case:
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    m, k = a_shape[-2:]
    n = b_shape[-1]
    macs = math.prod(batch) * m * k * n
    shape = f"{'x'.join(map(str, a_shape))} * {'x'.join(map(str, b_shape))}" + (
        "" if b_const else " (b variable)") + _types_note(types)
    a_dt, b_dt = _TYPES[types]

    def build(rng: np.random.Generator) -> Built:
        a = _full_range(rng, a_shape, a_dt)
        b = _full_range(rng, b_shape, b_dt)
        a_zp = _mid_zero_point(rng, a_dt)
        b_zp = b_dt.type(0 if b_dt == np.int8 else 128)
        feeds = {"a": a} if b_const else {"a": a, "b": b}
        if op == "QLinearMatMul":
            a_scale, b_scale = np.float32(0.02), np.float32(0.01)
            y_scale = _requant_scale(a_scale, np.array([b_scale]), k)
            y_zp = a_dt.type(128 if a_dt == np.uint8 else 0)
            model = _onnx_model(op, [("a", a, False), ("a_scale", np.array(a_scale), True),
                                     ("a_zero_point", np.array(a_zp), True), ("b", b, b_const),
                                     ("b_scale", np.array(b_scale), True),
                                     ("b_zero_point", np.array(b_zp), True),
                                     ("y_scale", np.array(y_scale), True),
                                     ("y_zero_point", np.array(y_zp), True)], a_dt, {})

            def plain():
                return qlinear.qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)

            def prepare():
                if not b_const:  # b changes per call: nothing to prepare
                    return plain
                p = qlinear.prepare_qlinear_matmul(b, b_scale, b_zp)
                return lambda: p.run(a, a_scale, a_zp, y_scale, y_zp)
        else:  # MatMulInteger
            model = _onnx_model(op, [("a", a, False), ("b", b, b_const),
                                     ("a_zero_point", np.array(a_zp), True),
                                     ("b_zero_point", np.array(b_zp), True)], np.int32, {})

            def plain():
                return qlinear.matmul_integer(a, b, a_zp, b_zp)

            def prepare():
                if not b_const:
                    return plain
                p = qlinear.prepare_matmul_integer(b, b_zp)
                return lambda: p.run(a, a_zp)
        return Built(feeds, model, prepare, plain)

    return Case(name, "matmul", op, shape, macs, build, quick, types=types)


# onnx.reference implements DequantizeLinear from opset 19 on; 19 keeps opset 13's semantics
# for uint8 and float32.
QUANT_OPSET = 19


def quant_case(name: str, shape: tuple[int, ...], op: str, quick: bool = False) -> Case:
    def build(rng: np.random.Generator) -> Built:
        scale, zp = np.float32(0.05), np.uint8(117)
        if op == "QuantizeLinear":
            x = (rng.standard_normal(shape, dtype=np.float32) * 3.0).astype(np.float32)
            model = _onnx_model(op, [("x", x, False), ("y_scale", np.array(scale), True),
                                     ("y_zero_point", np.array(zp), True)], np.uint8, {},
                                opset=QUANT_OPSET)

            def plain():
                return qlinear.quantize_linear(x, scale, zp)
        else:
            x = rng.integers(0, 256, shape, dtype=np.uint8)
            model = _onnx_model(op, [("x", x, False), ("x_scale", np.array(scale), True),
                                     ("x_zero_point", np.array(zp), True)], np.float32, {},
                                opset=QUANT_OPSET)

            def plain():
                return qlinear.dequantize_linear(x, scale, zp)
        return Built({"x": x}, model, lambda: plain, plain)

    return Case(name, "quant", op, "x".join(map(str, shape)), 0, build, quick)


# ResNet-50 (torchvision v1.5: stride on the 3x3 conv), every distinct convolution layer:
# (name, C, H, M, k, stride)
RESNET50_LAYERS = [
    ("conv1", 3, 224, 64, 7, 2),
    ("l1.1x1a", 64, 56, 64, 1, 1),
    ("l1.3x3", 64, 56, 64, 3, 1),
    ("l1.1x1b", 64, 56, 256, 1, 1),
    ("l1.1x1c", 256, 56, 64, 1, 1),
    ("l2.1x1a", 256, 56, 128, 1, 1),
    ("l2.3x3s2", 128, 56, 128, 3, 2),
    ("l2.1x1b", 128, 28, 512, 1, 1),
    ("l2.down", 256, 56, 512, 1, 2),
    ("l2.1x1c", 512, 28, 128, 1, 1),
    ("l2.3x3", 128, 28, 128, 3, 1),
    ("l3.1x1a", 512, 28, 256, 1, 1),
    ("l3.3x3s2", 256, 28, 256, 3, 2),
    ("l3.1x1b", 256, 14, 1024, 1, 1),
    ("l3.down", 512, 28, 1024, 1, 2),
    ("l3.1x1c", 1024, 14, 256, 1, 1),
    ("l3.3x3", 256, 14, 256, 3, 1),
    ("l4.1x1a", 1024, 14, 512, 1, 1),
    ("l4.3x3s2", 512, 14, 512, 3, 2),
    ("l4.1x1b", 512, 7, 2048, 1, 1),
    ("l4.down", 1024, 14, 2048, 1, 2),
    ("l4.1x1c", 2048, 7, 512, 1, 1),
    ("l4.3x3", 512, 7, 512, 3, 1),
]
RESNET_QUICK = {"conv1", "l1.3x3", "l3.1x1c", "l4.3x3s2"}

# MobileNetV2 (224x224), every distinct depthwise 3x3 layer: (channels, H, stride)
MOBILENETV2_DW = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                  (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
# ... and every distinct pointwise (1x1) layer: (C, H, M)
MOBILENETV2_PW = [(32, 112, 16), (16, 112, 96), (96, 56, 24), (24, 56, 144), (144, 56, 24),
                  (144, 28, 32), (32, 28, 192), (192, 28, 32), (192, 14, 64), (64, 14, 384),
                  (384, 14, 64), (384, 14, 96), (96, 14, 576), (576, 14, 96), (576, 7, 160),
                  (160, 7, 960), (960, 7, 160), (960, 7, 320), (320, 7, 1280)]


conv_case = _conv_case


def all_cases(weight_bits: int = 8) -> list[Case]:
    """Every case; convolution weights of ``weight_bits`` bits (7: within 64 of their zero point)."""
    conv_case = functools.partial(_conv_case, weight_bits=weight_bits)
    cases: list[Case] = []
    for batch in (1, 8):
        for name, c, h, m, k, s in RESNET50_LAYERS:
            cases.append(conv_case(
                f"resnet50.{name}.b{batch}", batch, c, (h, h), m, (k, k), strides=(s, s),
                pads=(k // 2,) * 4, quick=(name in RESNET_QUICK and batch == 1)
                or (name == "l1.3x3" and batch == 8), batch8_resnet=batch == 8))
    for c, h, s in MOBILENETV2_DW:
        cases.append(conv_case(f"mobilenetv2.dw{c}.{h}s{s}", 1, c, (h, h), c, (3, 3),
                               strides=(s, s), group=c, quick=(c, h, s) == (144, 56, 1)))
    for c, h, m in MOBILENETV2_PW:
        cases.append(conv_case(f"mobilenetv2.pw{c}-{m}.{h}", 1, c, (h, h), m, (1, 1),
                               quick=(c, h, m) == (24, 56, 144)))
    cases.append(conv_case("conv1d.c256.l1000.k3", 1, 256, (1000,), 256, (3,), quick=True))
    cases.append(conv_case("conv3d.c16.8x28x28.k3", 1, 16, (8, 28, 28), 32, (3, 3, 3),
                           quick=True))
    cases.append(conv_case("convinteger.resnet50.l1.3x3", 1, 64, (56, 56), 64, (3, 3),
                           op="ConvInteger", quick=True))
    # the other operand types (onnxruntime is slower there) on the same 3x3 layer
    for types in ("u8u8", "s8s8"):
        cases.append(conv_case(f"types.{types}.resnet50.l1.3x3", 1, 64, (56, 56), 64, (3, 3),
                               types=types, quick=True))
    # a tiny layer: the fixed cost of one prepared call (validation, planning, dispatch)
    cases.append(conv_case("tiny.qlinearconv.1x8x8x8.k3", 1, 8, (8, 8), 8, (3, 3), quick=True))
    cases += [
        matmul_case("bert.qkv.128x768x768", (128, 768), (768, 768), quick=True),
        matmul_case("bert.ffn1.128x768x3072", (128, 768), (768, 3072)),
        matmul_case("bert.ffn2.128x3072x768", (128, 3072), (3072, 768)),
        matmul_case("bert.batch8.qkv", (8, 128, 768), (768, 768), quick=True),
        matmul_case("bert.attn.scores", (12, 128, 64), (12, 64, 128), b_const=False,
                    quick=True),
        matmul_case("bert.attn.context", (12, 128, 128), (12, 128, 64), b_const=False),
        matmul_case("broadcast.4x1x64x256*3x256x128", (4, 1, 64, 256), (3, 256, 128)),
        matmul_case("matmulinteger.bert.ffn1", (128, 768), (768, 3072), op="MatMulInteger",
                    quick=True),
        matmul_case("types.u8u8.bert.qkv", (128, 768), (768, 768), types="u8u8", quick=True),
        matmul_case("types.s8s8.bert.qkv", (128, 768), (768, 768), types="s8s8", quick=True),
        matmul_case("types.u8u8.matmulinteger.bert.qkv", (128, 768), (768, 768),
                    op="MatMulInteger", types="u8u8"),
        matmul_case("types.s8s8.matmulinteger.bert.qkv", (128, 768), (768, 768),
                    op="MatMulInteger", types="s8s8"),
        matmul_case("tiny.qlinearmatmul.4x64x64", (4, 64), (64, 64), quick=True),
        matmul_case("tiny.matmulinteger.4x64x64", (4, 64), (64, 64), op="MatMulInteger",
                    quick=True),
        quant_case("quantize.1x3x224x224", (1, 3, 224, 224), "QuantizeLinear", quick=True),
        quant_case("quantize.16M", (16 << 20,), "QuantizeLinear"),
        quant_case("dequantize.1x3x224x224", (1, 3, 224, 224), "DequantizeLinear",
                   quick=True),
        quant_case("dequantize.16M", (16 << 20,), "DequantizeLinear"),
    ]
    return cases


def select_cases(cases: list[Case], patterns: list[str] | None, quick: bool) -> list[Case]:
    if quick:
        cases = [c for c in cases if c.quick]
    if patterns:
        def wanted(c: Case) -> bool:
            return any(fnmatch.fnmatchcase(c.name, p) or fnmatchcase_sub(c.name, p)
                       for p in patterns)
        cases = [c for c in cases if wanted(c)]
    return cases


def fnmatchcase_sub(name: str, pattern: str) -> bool:
    """A pattern without wildcards selects every case whose name contains it."""
    return not any(ch in pattern for ch in "*?[") and pattern in name
