"""How a model runs: the QDQ mode (fuse QDQ node groups into integer operators, or run the
graph as written) and the emulation of onnxruntime's saturating AVX2 kernels (the kernels
swapped in; their arithmetic is :mod:`qlinear.engines.ort_avx2`)."""

from __future__ import annotations

from typing import Any

import numpy as np

import onnx
from onnx.reference.op_run import OpRun

from .. import _native
from ..contrib import _raw as _c  # the functions without their errstate wrapper: a graph run has it
from ..engines import ort_avx2
from ..matmul import matmul_integer
from ..passes import FUSED_OPS, QDQRefusal, exact_integer_convs, fuse_qdq, integer_islands
from ..passes.dynamic_matmul import fuse_dynamic_matmul
from ..passes.matmul_nbits import block_size_for
from .kernels.contrib import ContribOp, DynamicQuantizeMatMul, MatMulIntegerToFloat, QAttention, QGemm
from .kernels.contrib import QLinearConv as ContribQLinearConv
from .kernels.standard import ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul, _QLinearOp
from .proto import topologically_sorted
from .registry import KERNELS

#: How a QDQ model (DequantizeLinear -> float op -> QuantizeLinear) runs: "fuse" (default)
#: rewrites its node groups into integer operators as onnxruntime's CPU session does
#: (qlinear.qdq, docs/qdq.md); "literal" runs the graph as written.
QDQ_MODES = ("fuse", "literal")


def fusable_ops() -> frozenset[tuple[str, str]]:
    """The fused operators (domain, op_type) this backend has kernels for: ONNX QLinearConv and
    QLinearMatMul, and every com.microsoft operator among qlinear.qdq.FUSED_OPS registered in
    KERNELS. The QDQ fusion emits only these; other groups run as written."""
    have = {("", "QLinearConv"), ("", "QLinearMatMul")}
    for k in KERNELS:
        domain = getattr(k, "op_domain", "")
        have.add((domain, k.__name__))  # a kernel class is named after its operator
    return frozenset(op for op in FUSED_OPS if op in have)


def _exact_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``qlinear.qdq.exact_integer_convs`` where the model has a DequantizeLinear feeding a
    Conv (a rewrite error leaves the model as it was: the float path is always correct)."""
    if not any(n.op_type == "Conv" for n in model.graph.node) or \
            not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model
    try:
        return exact_integer_convs(model)
    except Exception:  # noqa: BLE001 - an optimisation only; the graph as fused runs
        return model


#: The onnxruntime session configuration keys ``prepare(..., options=)`` takes: how the QDQ
#: fusion rewrites weight-only DequantizeLinear -> MatMul / Gemm into MatMulNBits.
QDQ_OPTIONS = {"session.qdq_matmulnbits_accuracy_level": "0, 1, 2, 3 or 4 (default 4)",
               "session.qdq_matmulnbits_block_size": "0 (32, the default), -1 (least padding) or a "
                                                     "power of two in [16, 256]"}


def qdq_options(options: Any, caller: str = "prepare") -> dict[str, int]:
    """``options`` (None or a mapping of the :data:`QDQ_OPTIONS` keys to values, strings as
    onnxruntime's ``add_session_config_entry`` takes them, or ints) as ``fuse_qdq``'s keyword
    arguments; a ValueError/TypeError naming the key and the value otherwise."""
    if options is None:
        return {}
    if not hasattr(options, "items"):
        raise TypeError(f"{caller}: options must be a mapping of onnxruntime session configuration keys "
                        f"({', '.join(QDQ_OPTIONS)}) to values; got {type(options).__name__}")
    out = {}
    for key, value in options.items():
        if key not in QDQ_OPTIONS:
            raise ValueError(f"{caller}: options key {key!r} is not one qlinear takes here; it takes "
                             f"{', '.join(QDQ_OPTIONS)}")
        try:
            n = int(value.strip() if isinstance(value, str) else value)
            if isinstance(value, (bool, float)) or (not isinstance(value, str) and n != value):
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"{caller}: options {key} must be {QDQ_OPTIONS[key]}; got {value!r}") from None
        if key == "session.qdq_matmulnbits_accuracy_level":
            if not 0 <= n <= 4:
                raise ValueError(f"{caller}: options {key} must be {QDQ_OPTIONS[key]}; got {value!r}")
            out["nbits_accuracy_level"] = n
        else:
            try:
                block_size_for(32, n)
            except ValueError:
                raise ValueError(f"{caller}: options {key} must be {QDQ_OPTIONS[key]}; got {value!r}") from None
            out["nbits_block_size"] = n
    return out


def _islands(model: onnx.ModelProto) -> onnx.ModelProto:
    """``qlinear.passes.integer_islands`` where the model has a DequantizeLinear (a rewrite
    error leaves the model as it was: the float nodes are always correct)."""
    if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model
    try:
        return integer_islands(model)
    except Exception:  # noqa: BLE001 - an optimisation only; the graph as fused runs
        return model


def model_as_run(model: onnx.ModelProto, qdq: str = "fuse", emulate: str | None = None,
                 options: Any = None) -> onnx.ModelProto:
    """The graph ``prepare`` and ``qlinear run`` execute: :func:`apply_qdq`, then with
    ``qdq="fuse"`` onnxruntime's DynamicQuantizeMatMul fusion (the same arithmetic,
    :mod:`qlinear.passes.dynamic_matmul`), the integer islands (:func:`qlinear.passes.integer_islands`: onnxruntime's
    float glue between quantized nodes in one node each, the same bytes), and the float Convs
    whose float32 result is exact on integers (:func:`qlinear.qdq.exact_integer_convs`: the
    same bytes). The float Convs are not rewritten under an emulation (which
    changes ConvInteger's arithmetic), not for ``qdq="literal"`` (the graph as written), and
    only where ConvInteger is the faster form: the native engine at a SIMD level (its portable
    scalar level and the NumPy engine run ConvInteger slower than the float Conv's BLAS:
    retinaface 290 against 105 ms at the scalar level). ``qlinear compare`` keeps the float
    Convs: it compares their outputs with onnxruntime's. ``options``: :func:`qdq_options`."""
    model = apply_qdq(model, qdq, options)
    if qdq != "fuse":
        return model
    model = fuse_dynamic_matmul(model)  # DynamicQuantizeLinear + MatMulInteger + Cast + Mul, as onnxruntime fuses them
    model = _islands(model)
    if emulate is not None:
        return model
    info = _native.engine_info()
    if info["engine"] != "native" or info["isa"] == "scalar":
        return model
    return _exact_convs(model)


def apply_qdq(model: onnx.ModelProto, qdq: str = "fuse", options: Any = None) -> onnx.ModelProto:
    """The model as it will run: QDQ node groups fused (``qdq="fuse"``) or unchanged
    (``"literal"``); ``options``: onnxruntime's session keys of :data:`QDQ_OPTIONS`."""
    if qdq not in QDQ_MODES:
        raise ValueError(f"prepare: qdq must be one of {', '.join(QDQ_MODES)}; got {qdq!r}")
    fuse_kw = qdq_options(options)
    if qdq == "literal":
        return model
    if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model  # nothing to fuse
    model = topologically_sorted(model)  # the rewrite reads the graph in order
    try:
        return fuse_qdq(model, ops=fusable_ops(), **fuse_kw)
    except QDQRefusal as e:  # a model problem, said as such
        raise ValueError(f"prepare: {e}") from None
    except Exception as e:  # a rewrite bug must not look like a model problem
        raise ValueError(f"prepare: the QDQ fusion failed ({type(e).__name__}: {e}); "
                         "qdq='literal' (--qdq literal) runs the graph as written") from e


# --------------------------------------------------------------------------- emulation

#: What ``emulate=`` accepts: "onnxruntime-avx2" is onnxruntime's CPU results on x86 with
#: What ``emulate=`` accepts: "onnxruntime-avx2" is onnxruntime's CPU results on x86 with
#: AVX2 and without AVX-VNNI / AVX512-VNNI (measured on onnxruntime 1.32).
EMULATIONS = ("onnxruntime-avx2",)


def _emulating(base: type[_QLinearOp]) -> type[_QLinearOp]:
    """``base`` computing onnxruntime-avx2's result where its kernel saturates.

    The exact kernel runs first: it validates the inputs (same errors as without emulation)
    and is onnxruntime's answer wherever its kernel is exact (other type pairings,
    depthwise QLinearConv)."""

    def _run(self, *args, **kwargs):
        exact = base._run(self, *args, **kwargs)
        attrs = self._conv_attrs() if "Conv" in base.__name__ else {}
        emulated = self._call(ort_avx2.emulate, base.__name__, list(args), attrs)
        return exact if emulated is None else (emulated,)

    return type(base.__name__, (base,), {"_run": _run, "__doc__": base.__doc__, "__module__": __name__})


def _saturating_product(a: np.ndarray, b: np.ndarray, a_zero_point: Any, b_zero_point: Any) -> np.ndarray:
    """The integer product onnxruntime computes on x86 with AVX2 but without VNNI: 16-bit
    saturated pair sums for uint8 x int8 (``qlinear.engines.ort_avx2``), exact for the others."""
    acc = ort_avx2.emulate_matmul_integer(a, b, a_zero_point, b_zero_point)
    return _q_matmul_integer(a, b, a_zero_point, b_zero_point) if acc is None else np.asarray(acc, np.int32)


def _q_matmul_integer(*args):
    return matmul_integer(*args)


class _SaturatingQGemm(_c.PreparedQGemm):
    def _accumulate(self, a: np.ndarray, a_zero_point: np.ndarray) -> np.ndarray:
        return _saturating_product(a, self._b, a_zero_point, self._b_zero_point)


def _emulating_qgemm_run(self, A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
                         y_zero_point=None, **_):
    prepared = self._prepared_for(_SaturatingQGemm, (B, b_scale, b_zero_point), (3, 4, 5), **self._kw("transB"))
    return (self._call(prepared.run, A, a_scale, a_zero_point, C, y_scale, y_zero_point,
                       **self._kw("alpha", "transA")),)


def _emulating_conv_run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, **_):
    exact = ContribQLinearConv._run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
    channels_last = self.given.get("channels_last", 0)
    xin = np.moveaxis(x, -1, 1) if channels_last else x
    kw = self._kw("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    y = self._call(ort_avx2.emulate, "QLinearConv", [xin, x_scale, x_zero_point, w, w_scale, w_zero_point,
                                                    y_scale, y_zero_point, B], kw)
    if y is None:
        return exact
    return (np.moveaxis(y, 1, -1) if channels_last else y,)


def _emulating_mitf_run(self, *args, **_):
    return (self._call(_c.gemm._matmul_integer_to_float_op, *args, product=_saturating_product),)


def _emulating_dqmm_run(self, *args, **_):
    return (self._call(_c.gemm._dynamic_quantize_matmul_op, *args, product=_saturating_product),)


def _emulating_qattention_run(self, *args, **_):
    kw = self._kw("num_heads", "unidirectional", "scale", "mask_filter_value")
    return self._call(_c.transformer._qattention_op, *args, product=_saturating_product, **kw)


def _emulating_contrib(base: type[ContribOp], run) -> type[ContribOp]:
    return type(base.__name__, (base,), {"_run": run, "__doc__": base.__doc__, "__module__": __name__})


#: The kernels swapped in by ``qlinear.backend.prepare(..., emulate="onnxruntime-avx2")``: the
#: integer products of these operators as onnxruntime computes them on AVX2 without VNNI.
_CONTRIB_EMULATING: dict[type[OpRun], type[OpRun]] = {
    QGemm: _emulating_contrib(QGemm, _emulating_qgemm_run),
    ContribQLinearConv: _emulating_contrib(ContribQLinearConv, _emulating_conv_run),
    MatMulIntegerToFloat: _emulating_contrib(MatMulIntegerToFloat, _emulating_mitf_run),
    DynamicQuantizeMatMul: _emulating_contrib(DynamicQuantizeMatMul, _emulating_dqmm_run),
    QAttention: _emulating_contrib(QAttention, _emulating_qattention_run),
}


def kernels_for(emulate: str | None) -> list[type[OpRun]]:
    """The replacement kernels for ReferenceEvaluator: exact, or emulating ``emulate``."""
    if emulate is None:
        return KERNELS
    if emulate not in EMULATIONS:
        raise ValueError(f"prepare: emulate must be one of {', '.join(map(repr, EMULATIONS))} "
                         f"or None; got {emulate!r}")
    swap = {k: _emulating(k) for k in (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger)}
    swap.update(_CONTRIB_EMULATING)  # com.microsoft QGemm, QLinearConv, QAttention, ...
    return [swap.get(k, k) for k in KERNELS]
