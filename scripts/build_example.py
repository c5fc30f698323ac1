#!/usr/bin/env python
"""Build qlinear's bundled example: a quantized 8x8-digits classifier.

    pip install -e ".[example]"                # onnx, onnxruntime, scikit-learn (the data)
    python scripts/build_example.py            # writes qlinear/examples/digits_*.{onnx,npz,json}

Reproducible (fixed seeds, deterministic NumPy float64 training; only onnxruntime's
quantizer could change the output between versions, which is why metadata records them).

1. Data: scikit-learn's bundled 8x8 digits (1797 images, no download), pixels / 16 in
   [0, 1]; a seeded split into 1397 training and 400 test images.
2. Float model, NumPy only:
   - conv1: 8 filters 3x3 = the 4 leading principal components of the training images'
     3x3 patches, each with both signs (derived, not trained);
   - conv2: 16 filters 3x3 over those 8 channels, seeded random (fixed, not trained);
   - Relu after each conv, MaxPool 2x2, Flatten (256 features);
   - a two-layer MLP head (MatMul 256x32, Add, Relu, MatMul 32x10, Add) trained with
     minibatch SGD + momentum on softmax cross-entropy; Softmax output.
3. Quantization: onnxruntime's ``quantize_static`` in QOperator format, uint8 activations,
   int8 weights, calibrated on 200 training images, quantizing Conv and MatMul (the result
   holds QuantizeLinear, QLinearConv, QLinearMatMul, DequantizeLinear and float Add, Relu,
   MaxPool, Reshape, Softmax).
4. Bundle: the quantized model, the 400 test images with labels, and metadata.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SEED = 20261122
N_TEST = 400


def load_digits_split():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]  # [N, 1, 8, 8] in [0, 1]
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(SEED).permutation(len(y))
    test, train = perm[:N_TEST], perm[N_TEST:]
    return x[train], y[train], x[test], y[test]


def im2col(x, k=3, pad=1):
    """[N, C, H, W] -> [N, H, W, C*k*k] patches (stride 1, zero padding)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.stack([xp[:, :, i:i + h, j:j + w] for i in range(k) for j in range(k)], axis=2)
    return cols.reshape(n, c * k * k, h, w).transpose(0, 2, 3, 1)


def conv(x, w, b):
    """Float64 reference of Conv(pads=1) used for training features."""
    m = w.shape[0]
    y = im2col(x) @ w.reshape(m, -1).T + b
    return y.transpose(0, 3, 1, 2)


def features(x, w1, b1, w2, b2):
    h = np.maximum(conv(x.astype(np.float64), w1, b1), 0)
    h = np.maximum(conv(h, w2, b2), 0)
    n, c, hh, ww = h.shape
    h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    return h.reshape(n, -1)


def make_conv_filters(x_train, rng):
    patches = im2col(x_train.astype(np.float64)).reshape(-1, 9)
    patches = patches - patches.mean(axis=0)
    _, _, vt = np.linalg.svd(patches[rng.choice(len(patches), 20000, replace=False)],
                             full_matrices=False)
    pcs = vt[:4].reshape(4, 1, 3, 3)
    w1 = np.concatenate([pcs, -pcs]) * 2.0
    b1 = np.zeros(8)
    w2 = rng.normal(0, 1 / np.sqrt(72), size=(16, 8, 3, 3))
    b2 = rng.normal(0, 0.05, size=16)
    return w1, b1, w2, b2


def train_head(f, y, rng, hidden=32, epochs=40, lr=0.05, batch=32):
    mu, sd = f.mean(0), f.std()  # one global scale: per-feature scales would blow up the
    fn = (f - mu) / sd          # folded weights of near-constant features and ruin int8
    w3 = rng.normal(0, np.sqrt(2 / fn.shape[1]), (fn.shape[1], hidden))
    b3 = np.zeros(hidden)
    w4 = rng.normal(0, np.sqrt(1 / hidden), (hidden, 10))
    b4 = np.zeros(10)
    params = [w3, b3, w4, b4]
    vel = [np.zeros_like(p) for p in params]
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for s in range(0, len(y), batch):
            idx = order[s:s + batch]
            a = fn[idx]
            h = np.maximum(a @ w3 + b3, 0)
            z = h @ w4 + b4
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1
            dz = p / len(idx)
            dh = (dz @ w4.T) * (h > 0)
            grads = [a.T @ dh + 1e-4 * w3, dh.sum(0), h.T @ dz + 1e-4 * w4, dz.sum(0)]
            for i, g in enumerate(grads):
                vel[i] = 0.9 * vel[i] - lr * g
                params[i] += vel[i]
    # fold the standardization into the first layer: ((f - mu) / sd) @ w3 + b3
    w3f = w3 / sd
    b3f = b3 - (mu / sd) @ w3
    return w3f, b3f, w4, b4


def float_model(w1, b1, w2, b2, w3, b3, w4, b4):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def init(name, v, dt=np.float32):
        return numpy_helper.from_array(np.asarray(v, dtype=dt), name)

    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool2"),
        helper.make_node("Reshape", ["p2", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc1.w"], ["m3"], name="fc1"),
        helper.make_node("Add", ["m3", "fc1.b"], ["a3"], name="fc1_bias"),
        helper.make_node("Relu", ["a3"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "fc2.w"], ["m4"], name="fc2"),
        helper.make_node("Add", ["m4", "fc2.b"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax"),
    ]
    inits = [init("conv1.w", w1), init("conv1.b", b1), init("conv2.w", w2), init("conv2.b", b2),
             init("flat_shape", [-1, 256], np.int64), init("fc1.w", w3), init("fc1.b", b3),
             init("fc2.w", w4), init("fc2.b", b4)]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="qlinear scripts/build_example.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "qlinear", "examples"))
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime
    import sklearn

    from qlinear.tools.quantize import quantize_qoperator

    rng = np.random.default_rng(SEED)
    x_train, y_train, x_test, y_test = load_digits_split()
    w1, b1, w2, b2 = make_conv_filters(x_train, rng)
    f_train = features(x_train, w1, b1, w2, b2)
    head = train_head(f_train, y_train, rng)
    fm = float_model(w1, b1, w2, b2, *head)

    sess = onnxruntime.InferenceSession(fm.SerializeToString(), providers=["CPUExecutionProvider"])
    float_acc = float((sess.run(None, {"image": x_test})[0].argmax(1) == y_test).mean())

    calib_idx = np.random.default_rng(SEED + 1).choice(len(y_train), 200, replace=False)
    calibration = [{"image": x_train[calib_idx[i:i + 20]]} for i in range(0, 200, 20)]
    qm = quantize_qoperator(fm, calibration, per_channel=True)
    qm.producer_name = "qlinear scripts/build_example.py (onnxruntime quantize_static, QOperator)"
    ops = sorted({n.op_type for n in qm.graph.node})

    qsess = onnxruntime.InferenceSession(qm.SerializeToString(), providers=["CPUExecutionProvider"])
    ort_q_acc = float((qsess.run(None, {"image": x_test})[0].argmax(1) == y_test).mean())

    os.makedirs(args.out_dir, exist_ok=True)
    model_path = os.path.join(args.out_dir, "digits_cnn_qoperator.onnx")
    onnx.save(qm, model_path)
    np.savez_compressed(os.path.join(args.out_dir, "digits_samples.npz"),
                        image=x_test, label=y_test)
    meta = {
        "model": "digits_cnn_qoperator.onnx",
        "samples": "digits_samples.npz",
        "task": "classifier",
        "input": "image",
        "output": "probabilities",
        "labels_key": "label",
        "description": "8x8 handwritten digits (scikit-learn's bundled copy of the UCI data), "
                       "conv(PCA filters)-conv-maxpool-MLP, quantized by onnxruntime's "
                       "quantize_static (QOperator, uint8 activations, int8 per-channel weights)",
        "operators": ops,
        "n_samples": int(len(y_test)),
        "float_model_accuracy_onnxruntime": float_acc,
        "quantized_model_accuracy_onnxruntime_at_build": ort_q_acc,
        "seed": SEED,
        "built_with": {"numpy": np.__version__, "onnx": onnx.__version__,
                       "onnxruntime": onnxruntime.__version__, "scikit-learn": sklearn.__version__,
                       "python": sys.version.split()[0]},
    }
    with open(os.path.join(args.out_dir, "digits_meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"wrote {model_path} ({os.path.getsize(model_path)} bytes); operators: {', '.join(ops)}")
    print(f"float accuracy {float_acc:.4f}, quantized (onnxruntime) accuracy {ort_q_acc:.4f} "
          f"on {len(y_test)} test images")


if __name__ == "__main__":
    main()
