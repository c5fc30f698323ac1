"""The float Convs QDQ models keep between quantized layers: qlinear's against onnxruntime's, layer
by layer, each runtime alone in its own process.

    python benchmarks/float_conv.py [--models DIR] [--repeat 50] [--rounds 3] [--threads 2]
    python benchmarks/float_conv.py --only ultraface

The layers are every float Conv of shared/models' mobilenetv2-7_qdq_opset10 and
ultraface_rfb320_ortstatic_qdq as qlinear's backend runs them (after its QDQ fusion, the
same Convs onnxruntime's optimizer leaves float: 15 and 19), on the tensors they receive for
the benchmark's seeded input. qlinear runs ``qlinear.graph.kernels.float.conv`` (the native
engine's float Conv, qlinear/csrc/fconv/); onnxruntime runs a one-node float Conv model at
ORT_ENABLE_EXTENDED (in the whole models its Convs run as plain NCHW float Convs, not NCHWc,
and ENABLE_ALL would add NCHWc reorders a one-node model pays and a model does not). Both
with ``--threads`` threads, warm, ``--repeat`` runs back to back, median; ``--rounds`` pairs
of processes, the order alternating; the median of the rounds. Prints per layer and summed
per model, with the ratio qlinear / onnxruntime. Under ~2 minutes on an idle 2-core machine.

Whole models (the issue's target) are ``python benchmarks/graphs.py --rounds 3 --repeat 7``
(``--only mobilenetv2-7`` or ``--only ultraface`` for one of them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from timing import median_seconds

MODELS = ("mobilenetv2-7_qdq_opset10", "ultraface_rfb320_ortstatic_qdq")
ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def collect(models_dir: Path, only: str | None, out: str) -> list[dict]:
    """The float Conv layers of the models, their inputs saved in ``out`` (an .npz)."""
    import onnx

    sys.path.insert(0, str(Path(__file__).parent))
    from graphs import model_inputs

    from qlinear import backend

    layers, arrays = [], {}
    for name in MODELS:
        if only and only not in name:
            continue
        path = models_dir / f"{name}.onnx"
        if not path.exists():
            print(f"{name}: not found in {models_dir}", flush=True)
            continue
        model = onnx.load(str(path))
        rep = backend.prepare(model)
        ev = rep.evaluator
        res = ev.run(None, model_inputs(name, model), intermediate=True)
        for node in ev.rt_nodes_:
            if node.op_type != "Conv" or node.onnx_node.domain not in ("", "ai.onnx"):
                continue
            i = len(layers)
            ins = [res[n] for n in node.onnx_node.input if n]
            for j, a in enumerate(ins):
                arrays[f"l{i}_{j}"] = np.asarray(a)
            attrs = {k: v for k, v in node.given.items() if k in ATTRS}
            layers.append({"model": name, "inputs": len(ins), "attrs": attrs,
                           "shape": f"x{list(ins[0].shape)} w{list(ins[1].shape)} g{attrs.get('group', 1)}"
                                    f" s{attrs.get('strides', [1, 1])}"})
    np.savez(out, **arrays)
    return layers


def _one_node(x, w, b, attrs):
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["y"], **attrs)
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def child(runtime: str, layers: list[dict], data: str, repeat: int, threads: int) -> list[float]:
    """Median microseconds per layer in this process."""
    arrays = np.load(data)
    if runtime == "qlinear":
        import qlinear
        from qlinear.graph.kernels import float as bf

        qlinear.set_num_threads(threads)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    times = []
    for i, layer in enumerate(layers):
        ins = [arrays[f"l{i}_{j}"] for j in range(layer["inputs"])]
        x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
        if runtime == "qlinear":
            def fn(x=x, w=w, b=b, a=layer["attrs"]):
                bf.conv(x, w, b, **a)
        else:
            sess = ort.InferenceSession(_one_node(x, w, b, layer["attrs"]), so, providers=["CPUExecutionProvider"])

            def fn(sess=sess, x=x):
                sess.run(None, {"x": x})
        times.append(median_seconds(fn, repeat, warm=3) * 1e6)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path("/work/shared/models"))
    ap.add_argument("--only", default=None, help="a model name substring")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("qlinear", "onnxruntime"), help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        layers = json.loads(Path(args.work, "layers.json").read_text())
        print(json.dumps(child(args.child, layers, os.path.join(args.work, "data.npz"), args.repeat, args.threads)))
        return 0
    work = tempfile.mkdtemp(prefix="float_conv_")
    layers = collect(args.models, args.only, os.path.join(work, "data.npz"))
    if not layers:
        print("no float Conv layers found")
        return 1
    Path(work, "layers.json").write_text(json.dumps(layers))
    runs: dict[str, list[list[float]]] = {"qlinear": [], "onnxruntime": []}
    for r in range(args.rounds):
        order = ("qlinear", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "qlinear")
        for rt in order:
            out = subprocess.run([sys.executable, __file__, "--child", rt, "--work", work, "--repeat",
                                  str(args.repeat), "--threads", str(args.threads)],
                                 check=True, capture_output=True, text=True).stdout
            runs[rt].append(json.loads(out.strip().splitlines()[-1]))
    q = np.median(np.array(runs["qlinear"]), axis=0)
    o = np.median(np.array(runs["onnxruntime"]), axis=0)
    print(f"{'layer':58s} {'qlinear us':>11s} {'ort us':>9s} {'ratio':>6s}")
    for model in dict.fromkeys(layer["model"] for layer in layers):
        idx = [i for i, layer in enumerate(layers) if layer["model"] == model]
        print(model)
        for i in idx:
            print(f"  {layers[i]['shape']:56s} {q[i]:11.1f} {o[i]:9.1f} {q[i] / o[i]:6.2f}")
        sq, so_ = float(q[idx].sum()), float(o[idx].sum())
        print(f"  {'sum':56s} {sq:11.1f} {so_:9.1f} {sq / so_:6.2f}")
    print(f"(each runtime alone in its own process, {args.threads} threads, median of {args.repeat} runs, "
          f"median of {args.rounds} rounds)")
    print("whole models: python benchmarks/graphs.py --rounds 3 --repeat 7 [--only mobilenetv2-7|ultraface]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
