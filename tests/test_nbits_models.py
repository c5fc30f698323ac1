"""Real int4 models through ``qlinear.backend`` against onnxruntime: a transformer block and a
tiny GPT-2-style language model made with onnx.helper (tests/nbits_models.py), quantized by
onnxruntime's MatMulNBitsQuantizer into MatMulNBits + GatherBlockQuantized and into the QDQ
form (DequantizeLinear(int4, axis=0, block_size) -> MatMul, which both runtimes fuse into
MatMulNBits at the session's accuracy level); symmetric and asymmetric, block 32 and 128.

The MatMulNBits nodes follow qlinear's contract (docs/contract.md: at accuracy_level 4 the same
int8 activation codes as onnxruntime, float order otherwise); the float nodes (LayerNorm,
Softmax, Erf) run in NumPy against MLAS; GatherBlockQuantized is onnxruntime's arithmetic, bit
for bit. Measured distances are in docs/nbits.md (benchmarks/nbits_distances.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir", reason="onnxruntime's MatMulNBitsQuantizer needs onnx_ir")

from onnx import helper  # noqa: E402

from conftest import engine_level_params, num_threads  # noqa: E402
from nbits_models import quantize, rel, set_accuracy_level, tiny_gpt2, transformer_block  # noqa: E402
from qlinear import backend  # noqa: E402

F32 = np.float32
#: Largest model-output distance to onnxruntime at the same accuracy level (max |diff| over the
#: largest |output|; docs/nbits.md): at the float levels measured up to 8.6e-7 on these models
#: (AVX-512 VNNI), the MatMulNBits float order and the float glue operators' MLAS rounding
#: together; at level 4 the same, except where such a float ulp upstream moves an activation
#: across an int8 rounding boundary: one code step, measured up to 1.3e-2 of the output.
ORT_DISTANCE = {0: 5e-6, 1: 5e-6, 4: 5e-2}

_CACHE: dict = {}


def _quiet():
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)


def gpt2():
    if "gpt2" not in _CACHE:
        _CACHE["gpt2"] = tiny_gpt2()
    return _CACHE["gpt2"]


def quantized(block_size: int, symmetric: bool, qdq: bool) -> onnx.ModelProto:
    key = (block_size, symmetric, qdq)
    if key not in _CACHE:
        _quiet()
        _CACHE[key] = quantize(gpt2(), block_size, symmetric, qdq=qdq, gather=not qdq)
    return _CACHE[key]


IDS = np.random.default_rng(7).integers(0, 256, (1, 8)).astype(np.int64)


def with_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(model.SerializeToString())
    m.graph.output.append(helper.make_empty_tensor_value_info(name))
    return m


def run_ort(model: onnx.ModelProto, level: int | None = None, feeds=None) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    if level is not None:
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(level))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds or {"ids": IDS})


def run_ours(model: onnx.ModelProto, level: int, qdq: bool) -> list[np.ndarray]:
    if qdq:
        return list(backend.prepare(model, options={"session.qdq_matmulnbits_accuracy_level": str(level)}).run([IDS]))
    return list(backend.prepare(set_accuracy_level(model, level)).run([IDS]))


@pytest.mark.parametrize("block_size, symmetric, qdq", [(32, False, False), (128, True, False),
                                                        (32, True, True), (128, False, True)],
                         ids=["b32-asym-nbits", "b128-sym-nbits", "b32-sym-qdq", "b128-asym-qdq"])
def test_tiny_gpt2_against_onnxruntime(block_size, symmetric, qdq):
    qm = quantized(block_size, symmetric, qdq)
    ops = [n.op_type for n in qm.graph.node]
    if qdq:
        assert ops.count("DequantizeLinear") == 9 and "MatMulNBits" not in ops, ops  # 4 a layer + head
    else:
        assert ops.count("MatMulNBits") == 9 and ops.count("GatherBlockQuantized") >= 1, ops
    y_float = run_ort(gpt2())[0]
    # GatherBlockQuantized's output (the token embeddings) is onnxruntime's arithmetic: bit for bit
    probe = with_output(qm, "tok") if not qdq else qm
    for level in (0, 4):
        m = probe if qdq else set_accuracy_level(probe, level)
        ours = run_ours(m, level, qdq)
        theirs = run_ort(m, level if qdq else None)
        assert rel(ours[0], theirs[0]) < ORT_DISTANCE[level], (level, rel(ours[0], theirs[0]))
        assert 1e-3 < rel(ours[0], y_float) < 0.5, (level, rel(ours[0], y_float))  # the int4 error itself
        if not qdq:
            assert ours[1].dtype == theirs[1].dtype and np.array_equal(ours[1].view(np.uint32),
                                                                       theirs[1].view(np.uint32))


@pytest.mark.parametrize("block_size, symmetric", [(32, False), (128, True)])
def test_qdq_form_fused_is_the_matmul_nbits_form_bit_for_bit(block_size, symmetric):
    """The quantizer's two formats hold the same codes and scales: the QDQ form fused by qlinear
    (weights transposed, signed codes shifted, zero points packed) computes exactly what the
    MatMulNBits form computes, at every accuracy level; run as written (qdq="literal"), it is
    the float graph of the dequantized weights, which differs."""
    a, b = quantized(block_size, symmetric, False), quantized(block_size, symmetric, True)
    # the MatMulNBits form's embeddings are quantized too: compare the models' shared parts
    # through the QDQ model with the float embeddings against the MatMul-only quantization
    _quiet()
    a = quantize(gpt2(), block_size, symmetric, qdq=False, gather=False)
    for level in (0, 4):
        ya = run_ours(a, level, qdq=False)[0]
        yb = run_ours(b, level, qdq=True)[0]
        assert np.array_equal(ya.view(np.uint32), yb.view(np.uint32)), (level, rel(ya, yb))
    literal = backend.prepare(b, qdq="literal").run([IDS])[0]
    assert 0 < rel(literal, ya) < 0.05


_REFERENCE: dict = {}


@pytest.mark.parametrize("engine_level", engine_level_params(), indirect=True)
def test_tiny_gpt2_same_bits_on_every_engine_level_and_thread_count(engine_level):
    qm = quantized(32, False, False)
    for level in (0, 4):
        m = set_accuracy_level(qm, level)
        for threads in (1, 2):
            with num_threads(threads):
                y = backend.prepare(m).run([IDS])[0]
            want = _REFERENCE.setdefault(level, y)
            assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (engine_level, level, threads)


@pytest.mark.parametrize("block_size, symmetric", [(32, False), (128, True)])
def test_int4_transformer_block_against_onnxruntime(block_size, symmetric):
    d, ff = 128, 256
    float_model = transformer_block(d, ff, seed=block_size + symmetric)
    _quiet()
    qmodel = quantize(float_model, block_size, symmetric)
    assert [n.op_type for n in qmodel.graph.node].count("MatMulNBits") == 6
    x = np.random.default_rng(1).standard_normal((5, d)).astype(F32)
    y_float = run_ort(float_model, feeds={"x": x})[0]
    for level in (0, 1, 4):
        m = set_accuracy_level(qmodel, level)
        ours = backend.prepare(m).run([x])[0]
        theirs = run_ort(m, feeds={"x": x})[0]
        assert rel(ours, theirs) < ORT_DISTANCE[level], (level, rel(ours, theirs))
        assert 1e-4 < rel(ours, y_float) < 0.3, (level, rel(ours, y_float))
