"""The integer islands' effect, in one process: qlinear's backend with and without the islands
pass (``qlinear.passes.integer_islands``) beside onnxruntime's session, alternating.

    python benchmarks/islands_ab.py [--repeat 15] [MODEL.onnx ...]

Without model paths: issue #31's three quantizer-made ResNet-50s (benchmarks/resnet50_models.py)
and the QDQ models of ../shared/models. Each model: one warm-up run of each engine, then
``--repeat`` rounds running all three in turn (order rotating), onnxruntime's spinning off (its
idle workers would take a core from qlinear's next run), 2 threads each; medians, the ratios
side by side, and whether both qlinear forms give onnxruntime's outputs bit for bit. A steering
A/B (same process, so a busy host touches all three alike); the targets are measured by
``benchmarks/graphs.py`` (each runtime alone in its own process). Under a minute for the
default models on an idle 2-vCPU machine.
"""

from __future__ import annotations

import argparse
import os
import sys

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def default_models() -> list[str]:
    import resnet50_models as rm

    out = [rm.quantized(v) for v in rm.VARIANTS]
    shared = "/work/shared/models"
    for name in ("mobilenetv2-7_qdq_opset10", "ultraface_rfb320_ortstatic_qdq", "mnist_cntk_ortstatic_qdq"):
        path = os.path.join(shared, name + ".onnx")
        if os.path.exists(path):
            out.append(path)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    import onnxruntime as ort

    import graphs
    import qlinear
    import qlinear.backend as backend
    from qlinear.graph import modes

    qlinear.set_num_threads(2)
    for path in args.models or default_models():
        model = onnx.load(path)
        feeds = graphs._inputs(model)
        after = backend.prepare(model)
        saved = modes._islands
        modes._islands = lambda m: m  # the same backend without the islands pass
        try:
            before = backend.prepare(model)
        finally:
            modes._islands = saved
        sess = ort.InferenceSession(path, graphs._interleaved_options(2), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
        same = all(np.asarray(a).tobytes() == w.tobytes() for a, w in zip(after.run(feeds), want)) and \
            all(np.asarray(a).tobytes() == w.tobytes() for a, w in zip(before.run(feeds), want))
        t = graphs._interleaved_ms({"before": lambda: before.run(feeds), "islands": lambda: after.run(feeds),
                                    "onnxruntime": lambda: sess.run(None, feeds)}, args.repeat)
        print(f"{os.path.basename(path)}: without islands {t['before']:.2f} ms, islands {t['islands']:.2f} ms, "
              f"onnxruntime {t['onnxruntime']:.2f} ms; islands/without {t['islands'] / t['before']:.2f}, "
              f"without/onnxruntime {t['before'] / t['onnxruntime']:.2f}, "
              f"islands/onnxruntime {t['islands'] / t['onnxruntime']:.2f}; "
              f"outputs {'identical to' if same else 'DIFFER from'} onnxruntime's", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
