"""ResNet-50 as onnxruntime's quantizer writes it: QOperator with BatchNormalization folded into
the Convs, QOperator with BatchNormalization kept, and QDQ (issue #31's three ResNet-50 models).

    python benchmarks/resnet50_models.py [--out DIR]      # writes the three .onnx files

The float network is the ResNet-50 of onnx's backend test data (``light_resnet50.onnx``: the
Caffe2 model zoo's topology, residual joins as ``Sum``, 53 BatchNormalization nodes, its
weights replaced by ConstantOfShape nodes), given seeded random weights (He-scaled, with
BatchNormalization statistics that keep the activations in range) and quantized by
``onnxruntime.quantization.quantize_static`` (uint8 activations, int8 per-tensor weights,
MinMax calibration on 4 seeded U[0, 1) images). The QDQ and the "BN fused" models have their
BatchNormalization folded into the Convs first (as ``quant_pre_process`` would); "BN kept"
leaves them, so onnxruntime's quantizer puts them between DequantizeLinear and QuantizeLinear.
The files are cached by content of this script's settings in ``--out`` (default: a folder
under the system's temporary directory), so that ``benchmarks/graphs.py --resnet50`` builds
them once.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import onnx
from onnx import helper, numpy_helper, version_converter

#: The variants, in the order graphs.py lists them.
VARIANTS = ("resnet50_qoperator_bnfused", "resnet50_qoperator_bnkept", "resnet50_qdq")

_CACHE = os.path.join(tempfile.gettempdir(), "qlinear_resnet50_models_v1")


def _light_resnet50() -> onnx.ModelProto:
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_resnet50.onnx")
    return onnx.load(path)


def _random(rng, name: str, shape) -> np.ndarray:
    """A parameter by its Caffe2 name: He-scaled weights, BatchNormalization statistics that
    keep activations in range, small biases."""
    if name.endswith("_w_0") and len(shape) >= 2:
        v = rng.standard_normal(shape) * np.sqrt(2.0 / int(np.prod(shape[1:])))
    elif name.endswith("_riv_0"):  # running variance
        v = rng.uniform(0.5, 1.5, shape)
    elif name.endswith("_rm_0"):  # running mean
        v = rng.normal(0, 0.1, shape)
    elif name.endswith("_s_0"):  # BatchNormalization scale
        v = rng.uniform(0.3, 0.8, shape)
    else:  # biases
        v = rng.normal(0, 0.05, shape)
    return v.astype(np.float32)


def float_resnet50(seed: int = 0, *, fold_bn: bool) -> onnx.ModelProto:
    """The float ResNet-50 with seeded weights, opset 13, BatchNormalization folded or kept."""
    m = _light_resnet50()
    rng = np.random.default_rng(seed)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    weights: dict[str, np.ndarray] = {}
    nodes = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape":
            shape = tuple(int(v) for v in inits[n.input[0]])
            weights[n.output[0]] = _random(rng, n.output[0], shape)
        else:
            nodes.append(n)
    image = m.graph.input[0]
    for name, arr in inits.items():  # the small parameters stored as values: random ones too
        if arr.dtype == np.float32:
            weights[name] = _random(rng, name, arr.shape)
    keep_inits = [i for i in m.graph.initializer if i.name not in weights and not i.name.endswith("__SHAPE")]
    # the Caffe2 export lists its weights as graph inputs too: only the image stays one
    if fold_bn:
        producers = {o: n for n in nodes for o in n.output}
        folded = []
        drop = set()
        for n in nodes:
            if n.op_type != "BatchNormalization":
                continue
            conv = producers[n.input[0]]
            assert conv.op_type == "Conv"
            s, b, mean, var = (weights[k] for k in n.input[1:5])
            eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
            k = s / np.sqrt(var + eps)
            w = weights[conv.input[1]]
            weights[conv.input[1]] = (w * k.reshape(-1, 1, 1, 1)).astype(np.float32)
            cb = weights[conv.input[2]] if len(conv.input) > 2 else np.zeros(w.shape[0], np.float32)
            bias_name = conv.input[1] + "_folded_bias"
            weights[bias_name] = ((cb - mean) * k + b).astype(np.float32)
            new_conv = helper.make_node("Conv", [conv.input[0], conv.input[1], bias_name], [n.output[0]],
                                        name=conv.name or conv.output[0])
            new_conv.attribute.extend(conv.attribute)
            folded.append((conv, new_conv))
            drop.add(id(n))
        swap = {id(c): nc for c, nc in folded}
        nodes = [swap.get(id(n), n) for n in nodes if id(n) not in drop]
        used = {i for n in nodes for i in n.input}
        weights = {k: v for k, v in weights.items() if k in used}
    g = helper.make_graph(nodes, "resnet50", [image], list(m.graph.output),
                          keep_inits + [numpy_helper.from_array(v, k) for k, v in weights.items()])
    fm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    fm.ir_version = 7
    fm = version_converter.convert_version(fm, 13)
    return fm


class _Reader:
    """quantize_static's calibration data: 4 seeded U[0, 1) images."""

    def __init__(self, name: str, shape):
        rng = np.random.default_rng(1)
        self._data = iter([{name: rng.random(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self._data, None)

    def rewind(self):  # pragma: no cover - not used by MinMax
        pass


def quantized(variant: str, folder: str = _CACHE) -> str:
    """The path of ``variant`` (one of VARIANTS), built and cached in ``folder``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if variant not in VARIANTS:
        raise ValueError(f"resnet50 variant must be one of {VARIANTS}; got {variant!r}")
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, variant + ".onnx")
    if os.path.exists(out):
        return out
    fm = float_resnet50(0, fold_bn=variant != "resnet50_qoperator_bnkept")
    fpath = os.path.join(folder, variant + "_float.onnx")
    onnx.save(fm, fpath)
    image = fm.graph.input[0]
    shape = [d.dim_value for d in image.type.tensor_type.shape.dim]
    fmt = QuantFormat.QDQ if variant == "resnet50_qdq" else QuantFormat.QOperator
    tmp = out + ".tmp.onnx"
    quantize_static(fpath, tmp, _Reader(image.name, shape), quant_format=fmt,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=False)
    os.replace(tmp, out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=_CACHE)
    args = ap.parse_args()
    for v in VARIANTS:
        print(quantized(v, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
