"""Benchmark suite: qlinear against onnxruntime and onnx.reference, side by side.

Run it as ``qlinear bench`` or ``python benchmarks/run.py`` (see docs/benchmarks.md).

Every case is one ONNX operator on fixed shapes taken from real networks (ResNet-50,
MobileNetV2, BERT-base) plus a few synthetic ones. Each engine sees the same inputs:

- ``qlinear``: the prepared form of the operator (constant weights pre-transformed once,
  as onnxruntime prepacks its initializers), timed on ``.run(...)``;
- ``qlinear (plain)``: the plain function, which prepares and runs on every call;
- ``onnxruntime``: a one-node model with the constant inputs as initializers,
  ``intra_op_num_threads=threads``, ``inter_op_num_threads=1``, sequential execution;
- ``onnx.reference``: the same model in ``onnx.reference.ReferenceEvaluator``, skipped where
  one run is estimated to exceed a time budget (the table says so).

qlinear, onnxruntime and the plain function are timed interleaved (one run of each in
turn), so background load on a shared machine hits all of them alike; the reported time is
the median. The rounds alternate between (prepared, plain, onnxruntime) and (plain, prepared,
onnxruntime), so that the two qlinear calls each follow onnxruntime and each other equally
often: a call right after another qlinear call finds the thread pool's worker still spinning,
one after onnxruntime (whose workers block at once) has to wake it, 15-25 us on this 2-vCPU
VM, and a rotating order let the plain call follow a qlinear call in 2 rounds of 3 and the
prepared one in 1 of 3 (docs/benchmarks.md, "Interleaving order"). All engines use the same number of threads (OpenBLAS
limited through threadpoolctl, or through OPENBLAS_NUM_THREADS in a child process when
threadpoolctl is not installed). Peak extra memory is the resident-set high-water mark
(Linux; tracemalloc elsewhere) of one separate call of the prepared form, output included.

Before the cases, the bench measures this CPU's int8 peak with qlinear's own micro-kernels
on L1-resident operands (``measure_peak``: on AVX2 the exact vpmaddwd kernel and the
vpmaddubsw fast kernel, on VNNI levels vpdpbusd, on AMX tdpbusd and, for reference, the
avx512vnni level's vpdpbusd) and reports every case's GMAC/s as a percentage of the exact
kernel's peak.

Outputs (in ``--output-dir``): ``results.md`` (table and summary), ``results.json``,
``results.png`` (chart) and ``machine.md`` (machine description).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable

import numpy as np

from . import _noamx

# ----------------------------------------------------------------------------------------
# Case definitions
# ----------------------------------------------------------------------------------------

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
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape, dtype=dtype)


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
        import qlinear

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
        import qlinear

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
        import qlinear

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


# ----------------------------------------------------------------------------------------
# Engines and timing
# ----------------------------------------------------------------------------------------

def _ort_session(model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # Measured here: with spinning worker threads, onnxruntime's idle spinning after each run
    # steals a core from the next (interleaved) measurement, and onnxruntime itself ran
    # slower too (1.55 vs 1.06 ms on a ResNet 3x3 layer). Without spinning both are faster.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _time_once(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_extra_memory(fn: Callable[[], Any]) -> tuple[int, str]:
    """Peak bytes one call adds to the process, output included, and how it was measured.

    On Linux: the resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs)
    above the resident size before the call, which sees the native engine's C allocations
    (tracemalloc does not). Elsewhere: tracemalloc's peak (NumPy's allocations only).
    The native engine's output pool is emptied first, so that the call allocates everything
    it uses.
    """
    try:
        from qlinear import _native

        if _native.available() and hasattr(_native._C, "pool_clear"):
            _native._C.pool_clear()
    except ImportError:
        pass
    try:
        import ctypes

        # return freed heap pages to the OS first: memory the allocator kept from earlier
        # calls would otherwise be reused without raising the resident set
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS to the current RSS
        base = _status_kib("VmRSS")
        if base is not None:
            out = fn()
            peak = _status_kib("VmHWM")
            del out
            if peak is not None:
                return max(0, peak - base) * 1024, "rss"
    except OSError:
        pass
    return _peak_traced(fn), "tracemalloc"


def _peak_traced(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        del out
    finally:
        tracemalloc.stop()
    return peak


def _compare(ours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    theirs = np.asarray(theirs)
    if ours.shape != theirs.shape:
        return {"differ": None, "max_abs_diff": None,
                "note": f"shape {theirs.shape} != {ours.shape}"}
    if ours.dtype.kind == "f":
        diff = ~((ours == theirs) | (np.isnan(ours) & np.isnan(theirs)))
    else:
        diff = ours != theirs
    n = int(np.count_nonzero(diff))
    mad = 0
    if n:
        mad = float(np.max(np.abs(ours[diff].astype(np.float64)
                                  - theirs[diff].astype(np.float64))))
    return {"differ": n, "max_abs_diff": mad, "size": int(ours.size)}


def _run_reference(case: Case, built: Built, ours: np.ndarray, repeat: int, budget: float,
                   rate: dict[str, float]) -> dict[str, Any]:
    """Time onnx.reference unless one run is estimated (from earlier cases' seconds per MAC
    of the same operator) to exceed ``budget``; fewer than ``repeat`` runs where they would
    take more than 3 budgets (the report says so)."""
    from onnx.reference import ReferenceEvaluator

    if case.op in rate:
        est = rate[case.op] * max(case.macs, 1)
        if est > budget:
            return {"status": "skipped", "estimate_s": est,
                    "note": f"one run estimated at {est:.0f} s > budget {budget:g} s"}
    try:
        ev = ReferenceEvaluator(built.model)
        t0 = time.perf_counter()
        out_ref = ev.run(None, built.feeds)[0]
        times = [time.perf_counter() - t0]
    except Exception as e:  # noqa: BLE001 - its limits are part of the report
        return {"status": "failed", "note": f"{type(e).__name__}: {str(e)[:100]}"}
    want = repeat if times[0] * repeat <= 3 * budget else max(1, int(3 * budget / times[0]))
    while len(times) < want:
        times.append(_time_once(lambda: ev.run(None, built.feeds)))
    median = float(np.median(times))
    rate[case.op] = max(rate.get(case.op, 0.0), median / max(case.macs, 1))
    return {"status": "ok", "runs": len(times), "time_s": median,
            "vs_qlinear": _compare(ours, out_ref)}



def run_case(case: Case, *, repeat: int, threads: int, reference: bool,
             reference_budget: float, reference_rate: dict[str, float],
             seed: int, peak: float | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    built = case.build(rng)
    t0 = time.perf_counter()
    qfn = built.prepare()
    prepare_s = time.perf_counter() - t0
    sess = _ort_session(built.model, threads)

    def ort_fn():
        return sess.run(None, built.feeds)[0]  # noqa: F821 (the cell is emptied below, after the last call)

    engines = {"qlinear": qfn, "qlinear_plain": built.plain, "onnxruntime": ort_fn}
    # Warm-up (one call each) and the outputs compared below.
    outputs = {}
    warm = {}
    for name, fn in engines.items():
        t0 = time.perf_counter()
        outputs[name] = fn()
        warm[name] = time.perf_counter() - t0
    # Fast cases get more runs so that their medians are as stable as the slow ones'.
    n_runs = max(repeat, min(200, int(1.0 / max(max(warm.values()), 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in engines}
    # see the module docstring: prepared and plain swap places every other round, so each
    # follows onnxruntime and the other qlinear call equally often
    orders = (["qlinear", "qlinear_plain", "onnxruntime"],
              ["qlinear_plain", "qlinear", "onnxruntime"])
    for r in range(n_runs):
        for name in orders[r % 2]:
            times[name].append(_time_once(engines[name]))
    result: dict[str, Any] = {
        "name": case.name, "group": case.group, "op": case.op, "shape": case.shape,
        "macs": case.macs, "runs": n_runs, "prepare_s": prepare_s,
        "batch8_resnet": case.batch8_resnet,
        "time_s": {name: float(np.median(ts)) for name, ts in times.items()},
        "time_min_s": {name: float(np.min(ts)) for name, ts in times.items()},
    }
    result["peak_extra_bytes"], result["peak_extra_how"] = _peak_extra_memory(qfn)
    result["output_bytes"] = int(outputs["qlinear"].nbytes)
    result["vs_onnxruntime"] = _compare(outputs["qlinear"], outputs["onnxruntime"])
    plain_cmp = _compare(outputs["qlinear"], outputs["qlinear_plain"])
    if plain_cmp["differ"]:
        raise AssertionError(f"{case.name}: prepared and plain qlinear disagree: {plain_cmp}")
    # onnxruntime's session (and its prepacked weights) freed before onnx.reference runs:
    # ort_fn's closure cell is emptied, and ort_fn is not called again
    del sess

    # onnx.reference: far slower; timed on its own after the others, within a budget.
    ref: dict[str, Any] = {"status": "not run"}
    if reference:
        ref = _run_reference(case, built, outputs["qlinear"], repeat, reference_budget,
                             reference_rate)
    result["reference"] = ref
    tq, to = result["time_s"]["qlinear"], result["time_s"]["onnxruntime"]
    result["qlinear_over_onnxruntime"] = tq / to
    result["reference_over_qlinear"] = ref["time_s"] / tq if ref.get("status") == "ok" else None
    result["gmacs_qlinear"] = case.macs / tq / 1e9 if case.macs else None
    result["gmacs_onnxruntime"] = case.macs / to / 1e9 if case.macs else None
    result["plain_over_onnxruntime"] = result["time_s"]["qlinear_plain"] / to
    result["pct_peak_qlinear"] = (100 * result["gmacs_qlinear"] / peak
                                  if peak and result["gmacs_qlinear"] else None)
    result["pct_peak_onnxruntime"] = (100 * result["gmacs_onnxruntime"] / peak
                                      if peak and result["gmacs_onnxruntime"] else None)
    return result


# ----------------------------------------------------------------------------------------
# Machine description, summary, report
# ----------------------------------------------------------------------------------------

def machine_description(threads: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "logical_cpus": os.cpu_count(),
        "threads_per_engine": threads,
    }
    try:
        from . import _native
        info["qlinear_engine"] = _native.engine_info()
    except Exception as e:  # noqa: BLE001 - the report says why
        info["qlinear_engine"] = {"error": str(e)}
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = set()
        for line in cpuinfo.splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
        info["simd"] = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni",
                                    "avx_vnni", "amx_int8") if f in flags]
    except OSError:
        info["cpu"] = platform.processor()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["memory_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    for mod in ("onnx", "onnxruntime", "threadpoolctl"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    try:
        import threadpoolctl

        info["blas"] = [{k: p.get(k) for k in ("internal_api", "version", "architecture",
                                                "num_threads", "threading_layer")}
                        for p in threadpoolctl.threadpool_info()]
    except ImportError:
        info["blas"] = os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        import qlinear

        info["qlinear"] = getattr(qlinear, "__version__", None)
        here = os.path.dirname(os.path.abspath(qlinear.__file__))
        info["qlinear_commit"] = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True, timeout=10).stdout.strip() or None
        info["workspace_limit_bytes"] = _workspace_limit()
    except Exception:  # noqa: BLE001 - description only
        pass
    info["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return info


def _workspace_limit() -> int:
    try:
        from qlinear import _engine

        for attr in ("get_workspace_limit", "workspace_limit"):
            v = getattr(_engine, attr, None)
            if callable(v):
                return int(v())
        for attr in ("WORKSPACE_LIMIT", "DEFAULT_WORKSPACE_LIMIT", "WORKSPACE_BYTES"):
            if hasattr(_engine, attr):
                return int(getattr(_engine, attr))
    except Exception:  # noqa: BLE001
        pass
    return 256 * MIB


def measure_peak(threads: int, seconds: float = 0.1, trials: int = 5) -> dict[str, Any]:
    """The int8 multiply-add peak of this CPU as qlinear's own micro-kernels reach it.

    Each kernel of the selected ISA level (exact: vpmaddwd on AVX2, vpdpbusd on the VNNI
    levels, tdpbusd on AMX; fast: AVX2's vpmaddubsw, used where packing proves it cannot
    saturate) runs on operands that stay in L1, on 1 and on ``threads`` threads; the best of
    ``trials`` runs of about ``seconds`` each is the peak (memory and packing excluded: a
    ceiling). On the amx level the avx512vnni level's exact kernel is measured too (role
    ``vpdpbusd``): the VNNI ceiling, for comparison. Cases report their GMAC/s as a
    percentage of the exact kernel's peak at ``threads`` threads.
    """
    from qlinear import _native

    C = _native.native()
    if C is None:
        return {"isa": None, "note": "the native engine is not selected: no kernel peak"}
    isa = C.get_isa()
    out: dict[str, Any] = {"isa": isa, "kernels": {}}
    kernels = [(isa, 0, "exact"), (isa, 1, "fast")]
    if isa == "amx":
        kernels.append(("avx512vnni", 0, "vpdpbusd"))
    for level, which, role in kernels:
        info = C.kernel_info(level, which)
        if info is None:
            continue
        row: dict[str, Any] = {"kernel": info["name"]}
        for t in sorted({1, threads}):
            reps = 200
            C.kernel_peak(level, which, reps, 4 * t, t)  # warm-up (and the pool's threads)
            best = 0.0
            for _ in range(trials):
                t0 = time.perf_counter()
                macs = C.kernel_peak(level, which, reps, 4 * t, t)
                dt = time.perf_counter() - t0
                best = max(best, macs / dt / 1e9)
                # size the next trial to about `seconds`
                reps = max(1, int(reps * seconds / max(dt, 1e-6)))
            row[f"gmacs_{t}t"] = best
        out["kernels"][role] = row
    out["threads"] = threads
    out["peak_gmacs"] = out["kernels"]["exact"][f"gmacs_{threads}t"]
    return out


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(results: list[dict[str, Any]], workspace: int) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for group in ("conv", "matmul", "quant"):
        rs = [r for r in results if r["group"] == group]
        if not rs:
            continue
        ratios = [r["qlinear_over_onnxruntime"] for r in rs]
        worst = max(rs, key=lambda r: r["qlinear_over_onnxruntime"])
        s[group] = {"cases": len(rs), "geomean_qlinear_over_onnxruntime": _geomean(ratios),
                    "worst": worst["name"], "worst_ratio": worst["qlinear_over_onnxruntime"],
                    "cases_above_3": sum(x > 3 for x in ratios)}
    refs = [r["reference_over_qlinear"] for r in results if r["reference_over_qlinear"]]
    refs_ops = [r["reference_over_qlinear"] for r in results
                if r["reference_over_qlinear"] and r["group"] != "quant"]
    s["reference"] = {"cases": len(refs), "geomean_reference_over_qlinear": _geomean(refs),
                      "min": min(refs) if refs else None,
                      "operator_cases": len(refs_ops),
                      "geomean_operator_cases": _geomean(refs_ops),
                      "failed": [r["name"] for r in results
                                 if r["reference"].get("status") == "failed"],
                      "skipped": [r["name"] for r in results
                                  if r["reference"].get("status") == "skipped"]}
    b8 = [r for r in results if r["batch8_resnet"]]
    if b8:
        worst = max(b8, key=lambda r: r["peak_extra_bytes"])
        s["memory"] = {"workspace_limit_bytes": workspace, "batch8_resnet_cases": len(b8),
                       "max_peak_extra_bytes": worst["peak_extra_bytes"], "worst": worst["name"],
                       "within_limit": worst["peak_extra_bytes"] <= workspace}
    s["differ_onnxruntime_cases"] = sum(1 for r in results if r["vs_onnxruntime"]["differ"])
    products = [r for r in results if r["group"] != "quant" and not r["name"].startswith("tiny.")]
    if products:
        worst = max(products, key=lambda r: r["plain_over_onnxruntime"])
        s["plain"] = {"cases": len(products),
                      "geomean_plain_over_onnxruntime":
                          _geomean([r["plain_over_onnxruntime"] for r in products]),
                      "worst": worst["name"], "worst_ratio": worst["plain_over_onnxruntime"],
                      "cases_above_1_3": sum(r["plain_over_onnxruntime"] > 1.3 for r in products)}
    s["all"] = {"cases": len(results),
                "geomean_qlinear_over_onnxruntime":
                    _geomean([r["qlinear_over_onnxruntime"] for r in results]),
                "cases_above_1_5": [r["name"] for r in results
                                    if r["qlinear_over_onnxruntime"] > 1.5]}
    s["tiny"] = {r["name"]: r["time_s"]["qlinear"] for r in results
                 if r["name"].startswith("tiny.")}
    return s


def _fmt_t(t: float | None) -> str:
    if t is None:
        return "-"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.0f} µs"


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown_report(results: list[dict[str, Any]], summary: dict[str, Any],
                    machine: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["# qlinear benchmark results", ""]
    lines.append(f"Measured {machine.get('date_utc')} UTC on {machine.get('cpu')} "
                 f"({machine.get('logical_cpus')} logical CPUs, "
                 f"{', '.join(machine.get('simd', []))}), {machine.get('threads_per_engine')} "
                 f"threads per engine; {_qlinear_version_text(machine)}, numpy "
                 f"{machine.get('numpy')}, onnxruntime {machine.get('onnxruntime')}, onnx "
                 f"{machine.get('onnx')}"
                 + ("; AMX denied to both runtimes (--no-amx): their AVX-512 VNNI kernels"
                    if machine.get("amx") else "")
                 + f". Median of at least {args.repeat} interleaved runs "
                 "(more for fast cases). Load average (1 min) "
                 f"{_fmt((machine.get('load_average') or [None])[0], '.1f')} at the start, "
                 f"{_fmt((machine.get('load_average_end') or [None])[0], '.1f')} at the end "
                 "(ratios of a shared machine's runs are reliable only at low load). "
                 "See machine.md.")
    lines += ["", "## Summary", ""]
    for group, label in (("conv", "Convolutions (QLinearConv, ConvInteger)"),
                         ("matmul", "Matrix products (QLinearMatMul, MatMulInteger)"),
                         ("quant", "QuantizeLinear / DequantizeLinear")):
        g = summary.get(group)
        if g:
            lines.append(f"- {label}: {g['cases']} cases, geometric mean of qlinear/onnxruntime "
                         f"time **{g['geomean_qlinear_over_onnxruntime']:.2f}**, worst "
                         f"{g['worst_ratio']:.2f} ({g['worst']}), {g['cases_above_3']} above 3.")
    ref = summary["reference"]
    if ref["cases"]:
        ops = ref["geomean_operator_cases"]
        lines.append("- onnx.reference/qlinear time: geometric mean "
                     + (f"**{ops:.0f}** over the {ref['operator_cases']} convolution and "
                        f"matrix-product cases it ran, " if ops else "")
                     + f"{ref['geomean_reference_over_qlinear']:.0f} over all "
                     f"{ref['cases']} cases it ran (lowest {ref['min']:.1f}); skipped over the "
                     f"time budget: {len(ref['skipped'])}; failed (unsupported): "
                     f"{len(ref['failed'])}.")
    mem = summary.get("memory")
    if mem:
        lines.append(f"- Peak extra memory on the batch-8 ResNet-50 layers: at most "
                     f"{mem['max_peak_extra_bytes'] / MIB:.1f} MiB ({mem['worst']}), workspace "
                     f"limit {mem['workspace_limit_bytes'] / MIB:.0f} MiB: "
                     f"{'within' if mem['within_limit'] else 'ABOVE'} the limit.")
    pk = machine.get("int8_peak") or {}
    if pk.get("kernels"):
        parts = []
        for role, row in pk["kernels"].items():
            rates = ", ".join(f"{row[k]:.0f} GMAC/s on {k[6:-1]} thread{'s' if k != 'gmacs_1t' else ''}"
                              for k in row if k.startswith("gmacs_"))
            parts.append(f"{role} kernel {row['kernel']}: {rates}")
        lines.append(f"- int8 peak of this CPU, measured by qlinear's micro-kernels on L1-resident "
                     f"operands ({pk['isa']}): " + "; ".join(parts) + ". *% peak* columns are "
                     f"relative to the exact kernel's {pk['peak_gmacs']:.0f} GMAC/s.")
    al = summary.get("all")
    if al:
        lines.append(f"- All {al['cases']} cases: geometric mean of qlinear/onnxruntime time "
                     f"**{al['geomean_qlinear_over_onnxruntime']:.2f}**; above 1.5: "
                     f"{len(al['cases_above_1_5'])}"
                     + (f" ({', '.join(al['cases_above_1_5'][:8])}"
                        + (", ..." if len(al['cases_above_1_5']) > 8 else "") + ")"
                        if al['cases_above_1_5'] else "")
                     + ".")
    pl = summary.get("plain")
    if pl:
        lines.append(f"- Plain calls (weights passed every call, no prepare) against "
                     f"onnxruntime's prepacked session, {pl['cases']} convolution and matrix "
                     f"cases: geometric mean **{pl['geomean_plain_over_onnxruntime']:.2f}**, "
                     f"worst {pl['worst_ratio']:.2f} ({pl['worst']}), "
                     f"{pl['cases_above_1_3']} above 1.3.")
    for name, t in (summary.get("tiny") or {}).items():
        lines.append(f"- {name}: one prepared call {_fmt_t(t)}.")
    lines.append(f"- Cases where onnxruntime's output differs from qlinear's (exact by "
                 f"construction): {summary['differ_onnxruntime_cases']} of {len(results)}.")
    lines += ["", "## Cases", "",
              "Times are medians. *ort/ql* is qlinear time over onnxruntime time (lower is "
              "better for qlinear); *ref/ql* is onnx.reference time over qlinear time. "
              "*plain* is the unprepared function (prepares the weights on every call); "
              "*plain/ort* its time over onnxruntime's (prepacked) time. *% peak* is GMAC/s "
              "over the exact kernel's measured peak (onnxruntime's AVX2 u8xs8 kernel "
              "saturates and can pass it). "
              "*peak MiB* is the extra memory of one qlinear call, output included (resident "
              "set high-water mark on Linux). *ort "
              "differs* counts output elements where onnxruntime differs from qlinear "
              "(max difference in brackets).", "",
              "| case | op | shapes | qlinear | plain | onnxruntime | onnx.reference | ql/ort "
              "| plain/ort | ref/ql | GMAC/s ql | GMAC/s ort | % peak ql | % peak ort "
              "| peak MiB | ort differs |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["time_s"]
        ref_r = r["reference"]
        if ref_r["status"] == "ok":
            ref_s = _fmt_t(ref_r["time_s"]) + ("" if ref_r["runs"] >= args.repeat
                                               else f" ({ref_r['runs']} run"
                                               f"{'s' if ref_r['runs'] > 1 else ''})")
        elif ref_r["status"] == "skipped":
            ref_s = f"skipped (est. {ref_r['estimate_s']:.0f} s)"
        elif ref_r["status"] == "failed":
            ref_s = "fails: " + ref_r["note"].split(":")[0]
        else:
            ref_s = "not run"
        d = r["vs_onnxruntime"]
        if d["differ"] is None:
            diff_s = d.get("note", "?")
        elif d["differ"]:
            diff_s = f"{d['differ']} / {d['size']} ({d['max_abs_diff']:g})"
        else:
            diff_s = "0"
        lines.append(
            f"| {r['name']} | {r['op']} | {r['shape']} | {_fmt_t(t['qlinear'])} | "
            f"{_fmt_t(t['qlinear_plain'])} | {_fmt_t(t['onnxruntime'])} | {ref_s} | "
            f"{r['qlinear_over_onnxruntime']:.2f} | {r['plain_over_onnxruntime']:.2f} | "
            f"{_fmt(r['reference_over_qlinear'], '.0f')} | "
            f"{_fmt(r['gmacs_qlinear'], '.1f')} | {_fmt(r['gmacs_onnxruntime'], '.1f')} | "
            f"{_fmt(r['pct_peak_qlinear'], '.0f')} | {_fmt(r['pct_peak_onnxruntime'], '.0f')} | "
            f"{r['peak_extra_bytes'] / MIB:.1f} | {diff_s} |")
    lines.append("")
    return "\n".join(lines)


def _qlinear_version_text(machine: dict[str, Any]) -> str:
    """'qlinear 0.1.0 (commit abc1234)', without a commit outside a git checkout; never
    'qlinear None'."""
    version = machine.get("qlinear") or "(version unknown)"
    commit = machine.get("qlinear_commit")
    return f"qlinear {version}" + (f" (commit {commit})" if commit else "")


def machine_markdown(machine: dict[str, Any]) -> str:
    lines = ["# Machine of the latest benchmark run", ""]
    for k, v in machine.items():
        lines.append(f"- **{k}**: {v}")
    lines.append("")
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], path: str) -> str | None:
    """Draw the chart to ``path``; None when written, else why not (one line)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed (pip install 'qlinear[bench]')"
    if not results:
        return "no results to draw"
    from qlinear.tools.files import write_file

    try:  # written as every output is (qlinear.tools.files): never through a link
        write_file("--output-dir", os.path.dirname(path) or ".", path,
                   lambda f: _draw_chart(results, f, plt, matplotlib))
    except Exception as e:  # noqa: BLE001 - the chart is optional; say why it is missing
        return f"drawing it failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return None


def _draw_chart(results, path, plt, matplotlib) -> None:
    names = [r["name"] for r in results]
    ratios = [r["qlinear_over_onnxruntime"] for r in results]
    refs = [r["reference_over_qlinear"] or 0 for r in results]
    colors = {"conv": "tab:blue", "matmul": "tab:orange", "quant": "tab:green"}
    height = max(4.0, 0.17 * len(results) + 1.5)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    y = np.arange(len(results))
    ax1.barh(y, ratios, color=[colors[r["group"]] for r in results])
    for x, style in ((1.0, "-"), (1.5, "--"), (3.0, ":")):
        ax1.axvline(x, color="k", linestyle=style, linewidth=0.8)
    ax1.set_xscale("log")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 50)
             if min(ratios) / 1.5 <= t <= max(ratios) * 1.5]
    ax1.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax1.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax1.set_xlabel("qlinear time / onnxruntime time (lower is better; lines at 1, 1.5, 3)")
    ax1.set_yticks(y, names, fontsize=6)
    ax1.invert_yaxis()
    ax2.barh(y, [v if v else np.nan for v in refs], color=[colors[r["group"]] for r in results])
    ax2.axvline(50, color="k", linestyle="--", linewidth=0.8)
    ax2.set_xscale("log")
    ax2.set_xlabel("onnx.reference time / qlinear time (higher is better; line at 50)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax1.legend(handles, list(colors), loc="lower right", fontsize=8)
    fig.suptitle("qlinear vs onnxruntime and onnx.reference (same thread count)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------

#: The files bench writes into --output-dir (results.png only with matplotlib).
OUTPUT_FILES = ("results.json", "results.md", "machine.md", "results.png")


class BenchError(Exception):
    """A usage error: ``qlinear: error: <message>``, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, like the ``qlinear`` command's."""

    def error(self, message):  # noqa: D102
        raise BenchError(f"{message} (see 'qlinear bench --help')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="qlinear bench",
        description="Benchmark qlinear against onnxruntime and onnx.reference.")
    p.add_argument("--quick", action="store_true",
                   help="a representative subset of the cases (a couple of minutes)")
    p.add_argument("--cases", action="append", metavar="PATTERN",
                   help="only cases whose name matches (glob, or a substring); repeatable, "
                        "comma-separated lists allowed")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed runs per engine and case, at least (default 5)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads for every engine, 1 to 1024 (default 2)")
    p.add_argument("--output-dir", default="qlinear-bench-results",
                   help="where results.md/json/png and machine.md go")
    p.add_argument("--no-reference", action="store_true", help="do not run onnx.reference")
    p.add_argument("--reference-budget", type=float, default=8.0, metavar="SECONDS",
                   help="skip onnx.reference where one run is estimated above this "
                        "(default 8)")
    p.add_argument("--seed", type=int, default=0, help="random data seed, 0 or more (default 0)")
    p.add_argument("--no-amx", action="store_true",
                   help="run both runtimes as on a CPU without AMX (Linux x86-64): the process "
                        "is denied AMX before either detects the CPU, so both pick their "
                        "AVX-512 VNNI kernels, as on AMD Zen 4/5")
    p.add_argument("--json", action="store_true",
                   help="print the results (machine, summary, every case) as JSON on stdout "
                        "instead of the summary; the files are written as well")
    return p


def _limit_threads(threads: int):
    """Limit BLAS (and OpenMP) threads; returns a controller or None."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads)


def main(argv: list[str] | None = None) -> int:
    """``qlinear bench``: errors are one line ``qlinear: error: ...`` with exit status 2."""
    try:
        return _main(argv)
    except BenchError as e:
        print(f"qlinear: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    patterns = None
    if args.cases:
        patterns = [p.strip() for item in args.cases for p in item.split(",") if p.strip()]
    cases = select_cases(all_cases(), patterns, args.quick)
    if not cases:  # with --list too: an empty list would look like success
        raise BenchError("no case matches " + ", ".join(map(repr, patterns or []))
                         + (" in the --quick subset" if args.quick else "")
                         + " ('qlinear bench --list' lists the cases)")
    if args.list:
        for c in cases:
            print(f"{c.name:40s} {c.op:15s} {c.shape}")
        return 0
    if args.repeat < 1:
        raise BenchError(f"--repeat must be at least 1; got {args.repeat}")
    if not 1 <= args.threads <= 1024:  # qlinear.set_num_threads' range
        raise BenchError(f"--threads must be in [1, 1024]; got {args.threads}")
    if not args.reference_budget > 0:
        raise BenchError("--reference-budget must be a positive number of seconds")
    if args.seed < 0:  # NumPy's seeds are non-negative (as run's and compare's --seed)
        raise BenchError(f"--seed {args.seed}: must be 0 or more")
    if args.no_amx and os.environ.get(_noamx.ENV_MARK) != "1":
        # The denial must precede both runtimes' CPU detection (qlinear's at import, which has
        # happened in this process) and cannot be undone: run the bench in a child process.
        why = _noamx.supported()
        if why:
            raise BenchError(f"--no-amx {why}")
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.call(_noamx.child_command("qlinear.bench", argv))
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise BenchError(f"qlinear bench needs onnx and onnxruntime ({e}); "
                         "pip install 'qlinear[bench]'") from None

    from qlinear.tools.files import OutputError, check_target, output_dir

    try:  # before the long run, so that a bad folder or a link in the way fails at once
        args.output_dir = output_dir(args.output_dir, "--output-dir", parents=True)
        for name in OUTPUT_FILES:  # a folder or link of that name in the way
            check_target("--output-dir", args.output_dir, os.path.join(args.output_dir, name))
    except OutputError as e:
        raise BenchError(str(e)) from None
    try:  # a read-only folder: a temporary file created and removed, no empty file left
        tempfile.TemporaryFile(dir=args.output_dir).close()
    except OSError as e:
        raise BenchError(f"--output-dir {args.output_dir}: cannot write "
                         f"{os.path.join(args.output_dir, OUTPUT_FILES[0])} "
                         f"({e.strerror or e})") from None
    limiter = _limit_threads(args.threads)
    if limiter is None and os.environ.get("OPENBLAS_NUM_THREADS") != str(args.threads):
        # Without threadpoolctl, OpenBLAS reads its thread count once, when NumPy loads:
        # rerun in a child process with the variable set.
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
                   OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.call([sys.executable, "-m", "qlinear.bench", *argv], env=env)
    try:
        import qlinear

        set_threads = getattr(qlinear, "set_num_threads", None)
        if set_threads is not None:
            set_threads(args.threads)
    except ImportError as e:
        raise BenchError(f"cannot import qlinear: {e}") from None

    machine = machine_description(args.threads)
    if args.no_amx:  # this is the child: say so, and check that the denial holds
        if not _noamx.amx_request_denied():
            raise BenchError("--no-amx: the AMX permission request was not denied")
        machine["amx"] = "denied to both runtimes (--no-amx)"
    machine["int8_peak"] = measure_peak(args.threads)
    peak = machine["int8_peak"].get("peak_gmacs")
    results: list[dict[str, Any]] = []
    reference_rate: dict[str, float] = {}
    start = time.perf_counter()
    print(f"qlinear bench: {len(cases)} cases, {args.threads} threads, repeat {args.repeat}",
          file=sys.stderr)
    for i, case in enumerate(cases, 1):
        r = run_case(case, repeat=args.repeat, threads=args.threads,
                     reference=not args.no_reference, reference_budget=args.reference_budget,
                     reference_rate=reference_rate, seed=args.seed + i, peak=peak)
        results.append(r)
        ref = r["reference"]
        ref_s = (_fmt_t(ref["time_s"]) if ref["status"] == "ok" else ref["status"])
        print(f"[{i:3d}/{len(cases)}] {case.name:36s} qlinear {_fmt_t(r['time_s']['qlinear']):>9s}"
              f"  ort {_fmt_t(r['time_s']['onnxruntime']):>9s}  ql/ort "
              f"{r['qlinear_over_onnxruntime']:5.2f}  ref {ref_s:>9s}  peak "
              f"{r['peak_extra_bytes'] / MIB:7.1f} MiB  ort differs "
              f"{r['vs_onnxruntime']['differ']}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    machine["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    machine["elapsed_s"] = round(elapsed, 1)
    summary = summarize(results, machine.get("workspace_limit_bytes", 256 * MIB))

    report = markdown_report(results, summary, machine, args)
    from qlinear.tools.files import write_file

    texts = {"results.json": json.dumps({"machine": machine, "summary": summary,
                                         "args": vars(args), "results": results}, indent=1),
             "results.md": report, "machine.md": machine_markdown(machine)}
    try:  # checked before the run; a full disk or a link planted since still fails here
        for name, text in texts.items():
            write_file("--output-dir", args.output_dir, os.path.join(args.output_dir, name),
                       lambda f, text=text: f.write(text.encode()))
    except OutputError as e:
        raise BenchError(str(e)) from None
    why_no_chart = chart(results, os.path.join(args.output_dir, "results.png"))
    if args.json:
        print(json.dumps({"machine": machine, "summary": summary, "results": results},
                         indent=1, default=str))
    else:
        print(report.split("## Cases")[0], file=sys.stdout)
    files = "results.md, results.json, " + ("" if why_no_chart else "results.png, ") + "machine.md"
    print(f"wrote {args.output_dir}/{files} ({elapsed:.0f} s)"
          + (f"; results.png not written: {why_no_chart}" if why_no_chart else ""),
          file=sys.stderr)
    if limiter is not None:
        limiter.restore_original_limits()
    return 0


if __name__ == "__main__":
    sys.exit(main())
