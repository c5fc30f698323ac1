"""Whether this machine's onnxruntime saturates in its uint8 x int8 kernels: the probe.

onnxruntime's MLAS u8s8 GEMM on x86 CPUs with AVX2 but without AVX-VNNI / AVX512-VNNI adds
each adjacent pair of products into an int16 with signed saturation (``vpmaddubsw``); with
VNNI it is exact. :func:`onnxruntime_saturates` says which kind of CPU this is *by
measurement*: it runs onnxruntime's QLinearMatMul on operands whose every pair sum exceeds
32767 and compares the result with qlinear's exact one. The arithmetic of the saturating
kernels (``emulate_*``, which ``--emulate onnxruntime-avx2`` runs) is the engine
:mod:`qlinear.engines.ort_avx2`; its names are re-exported here for the tools and tests.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

import qlinear
from qlinear.engines.ort_avx2 import (  # noqa: F401 - re-exported for the tools and tests
    INT16_MAX,
    INT16_MIN,
    _zp_corrected,
    applies,
    emulate,
    emulate_conv_integer,
    emulate_matmul_integer,
    emulate_node,
    emulate_qlinear_conv,
    emulate_qlinear_matmul,
    pair_saturated_matmul,
    requantize,
)


#: Set to ``1`` (saturates) or ``0`` (exact) to override the probe, e.g. to run the test
#: suite as it would run on the other kind of CPU; reports then say the value was set.
PROBE_ENV = "QLINEAR_ORT_SATURATES"


def probe_operands() -> tuple[np.ndarray, np.ndarray]:
    """Probe operands: every u8 x s8 pair sum exceeds 32767 in magnitude.

    ``a`` uint8 in [200, 255]; ``b`` int8 with |b| in [100, 127], one sign per column (half
    the columns positive, half negative), so a pair sum a0*b0 + a1*b1 has magnitude at least
    2 * 200 * 100 = 40000 > 32767 and saturates in a 16-bit kernel, in both directions.
    """
    rng = np.random.default_rng(20268)
    k, n = 64, 16
    a = rng.integers(200, 256, (4, k)).astype(np.uint8)
    mag = rng.integers(100, 128, (k, n))
    sign = np.where(np.arange(n) % 2 == 0, 1, -1)
    return a, (mag * sign).astype(np.int8)


def _probe_model(k: int, n: int, b: np.ndarray):
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.asarray(v), name) for v, name in [
        (np.float32(1.0), "as"), (np.uint8(0), "azp"), (b, "b"), (np.float32(1.0), "bs"),
        (np.int8(0), "bzp"), (np.float32(20000.0), "ys"), (np.uint8(128), "yzp")]]
    node = helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"])
    graph = helper.make_graph([node], "probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [None, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@functools.lru_cache(maxsize=None)
def measure() -> dict[str, Any] | None:
    """Run the probe once: onnxruntime's QLinearMatMul against qlinear's exact result.

    Returns ``{"saturates", "differing", "elements", "matches_emulation"}`` (``saturates``:
    onnxruntime's result differs from the exact one), or None without onnxruntime.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    a, b = probe_operands()
    k, n = b.shape
    params = (np.float32(1.0), np.uint8(0), b, np.float32(1.0), np.int8(0), np.float32(20000.0),
              np.uint8(128))
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(_probe_model(k, n, b).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"a": a})[0]
    exact = qlinear.qlinear_matmul(a, *params)
    emulated = emulate_qlinear_matmul(a, *params)
    differing = int((got != exact).sum())
    return {"saturates": differing > 0, "differing": differing, "elements": int(exact.size),
            "matches_emulation": bool(np.array_equal(got, emulated))}


#: Accepted values of :data:`PROBE_ENV` (any case, surrounding spaces ignored); empty = unset.
_FORCED = {"1": True, "true": True, "yes": True, "saturates": True,
           "0": False, "false": False, "no": False, "exact": False}


def forced() -> bool | None:
    """The value set by ``QLINEAR_ORT_SATURATES``: True, False, or None when unset or empty.

    Raises ValueError naming the variable, the accepted values and what was given for any
    other value: a typo must not silently fall back to the measurement it meant to override.
    """
    raw = os.environ.get(PROBE_ENV, "")
    if not raw.strip():
        return None
    try:
        return _FORCED[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"qlinear: {PROBE_ENV} must be one of 1, 0 (or true/false, yes/no, "
                         f"saturates/exact; empty or unset: measured); got {raw!r}") from None


def onnxruntime_saturates() -> bool | None:
    """Whether this machine's onnxruntime u8 x s8 kernels are inexact (16-bit pair saturation).

    Decided by measurement (:func:`measure`): onnxruntime's QLinearMatMul on operands whose
    every pair sum exceeds 32767, compared with qlinear's exact result. True on AVX2 CPUs
    without VNNI, False where onnxruntime is exact (AVX-VNNI, AVX512-VNNI); None without
    onnxruntime. The environment variable ``QLINEAR_ORT_SATURATES`` (1 or 0; see
    :func:`forced`) overrides it; another value raises ValueError.
    """
    value = forced()
    if value is not None:
        return value
    m = measure()
    return None if m is None else bool(m["saturates"])


def probe_source() -> str:
    """How :func:`onnxruntime_saturates` decided: "measured" or "set by QLINEAR_ORT_SATURATES"."""
    if forced() is not None:
        return f"set by {PROBE_ENV}={os.environ[PROBE_ENV]}"
    return "measured"
