"""onnxruntime's quantized-transformer operators one node at a time, and tiny_gpt2, qlinear's
backend against onnxruntime.

    python benchmarks/transformer_ops.py [--repeat 300] [--rounds 3] [--threads 2] [--only qattention,gpt2]

Cases (GPT-2-small-like shapes of shared/models' tiny_gpt2: batch 1, 5 new tokens after a past
of 3, hidden 32, 4 heads): QAttention (int8 weight, a raw mask, past, unidirectional),
EmbedLayerNormalization (position ids), SkipLayerNormalization (bias), FastGelu (bias),
DynamicQuantizeMatMul (32 x 128); then the whole tiny_gpt2_ortdynamic model (when
/work/shared/models or --models has it). Every constant is an initializer, as in a model.

Each runtime runs alone in its own process (onnxruntime with its default session options but
the thread count), warm (five runs), ``--repeat`` runs back to back, median; ``--rounds`` pairs
of processes, the order alternating; the median of the rounds. Prints microseconds for both
and their ratio. About a minute with the defaults on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from timing import model_runner

CASES = ("qattention", "embed_layer_norm", "skip_layer_norm", "fast_gelu", "dynamic_quantize_matmul", "gpt2")
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "case", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def case(name: str, models: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and feeds of case ``name`` (seeded: the same in every process)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    B, S, P, H, N = 1, 5, 3, 32, 4
    if name == "qattention":
        inits = {"w": rng.integers(-128, 128, (H, 3 * H)).astype(np.int8), "b": rng.standard_normal(3 * H).astype(f32),
                 "ws": np.array(0.01, f32), "wz": np.array(0, np.int8)}
        node = helper.make_node("QAttention", ["x", "w", "b", "xs", "ws", "m", "xz", "wz", "past"], ["y", "present"],
                                domain=MS, num_heads=N, unidirectional=1, mask_filter_value=-3.4028234663852886e38)
        feeds = {"x": rng.integers(0, 256, (B, S, H)).astype(np.uint8), "xs": np.array(0.02, f32),
                 "m": np.ones((B, P + S), np.int32), "xz": np.array(128, np.uint8),
                 "past": rng.standard_normal((2, B, N, P, H // N)).astype(f32)}
        ins = [_vi("x", T.UINT8, [B, S, H]), _vi("xs", T.FLOAT, []), _vi("m", T.INT32, [B, P + S]),
               _vi("xz", T.UINT8, []), _vi("past", T.FLOAT, [2, B, N, P, H // N])]
        return _model([node], ins, [_vi("y", T.FLOAT, None), _vi("present", T.FLOAT, None)], inits), feeds
    if name == "embed_layer_norm":
        inits = {"we": rng.standard_normal((1000, H)).astype(f32), "pe": rng.standard_normal((64, H)).astype(f32),
                 "g": rng.standard_normal(H).astype(f32), "beta": rng.standard_normal(H).astype(f32)}
        node = helper.make_node("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "g", "beta", "", "pos"],
                                ["y", "mi", "sum"], domain=MS, epsilon=1e-5)
        feeds = {"ids": rng.integers(0, 1000, (B, S)).astype(np.int32),
                 "pos": np.arange(P, P + S, dtype=np.int32)[None]}
        ins = [_vi("ids", T.INT32, [B, S]), _vi("pos", T.INT32, [B, S])]
        outs = [_vi("y", T.FLOAT, None), _vi("mi", T.INT32, None), _vi("sum", T.FLOAT, None)]
        return _model([node], ins, outs, inits), feeds
    if name == "skip_layer_norm":
        inits = {k: rng.standard_normal(H).astype(f32) for k in ("g", "beta", "bias")}
        node = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "beta", "bias"], ["y", "", "", "sum"],
                                domain=MS, epsilon=1e-5)
        feeds = {k: rng.standard_normal((B, S, H)).astype(f32) for k in ("x", "s")}
        ins = [_vi("x", T.FLOAT, [B, S, H]), _vi("s", T.FLOAT, [B, S, H])]
        return _model([node], ins, [_vi("y", T.FLOAT, None), _vi("sum", T.FLOAT, None)], inits), feeds
    if name == "fast_gelu":
        node = helper.make_node("FastGelu", ["x", "bias"], ["y"], domain=MS)
        feeds = {"x": rng.standard_normal((B, S, 4 * H)).astype(f32)}
        return _model([node], [_vi("x", T.FLOAT, [B, S, 4 * H])], [_vi("y", T.FLOAT, None)],
                      {"bias": rng.standard_normal(4 * H).astype(f32)}), feeds
    if name == "dynamic_quantize_matmul":
        inits = {"w": rng.integers(-128, 128, (H, 4 * H)).astype(np.int8), "ws": np.array(0.01, f32),
                 "wz": np.array(0, np.int8)}
        node = helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws", "wz"], ["y"], domain=MS)
        feeds = {"x": rng.standard_normal((B, S, H)).astype(f32)}
        return _model([node], [_vi("x", T.FLOAT, [B, S, H])], [_vi("y", T.FLOAT, None)], inits), feeds
    if name == "gpt2":
        path = models / "tiny_gpt2_ortdynamic.onnx"
        if not path.exists():
            raise FileNotFoundError(path)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from graphs import model_inputs

        model = onnx.load(str(path))
        return model, model_inputs("tiny_gpt2", model)
    raise ValueError(f"unknown case {name!r}; cases: {', '.join(CASES)}")


def _child(args) -> int:
    model, feeds = case(args.case, args.models)
    fn = model_runner(args.child, model, feeds, args.threads)
    for _ in range(5):
        fn()
    ts = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    print(json.dumps({"us": float(np.median(ts)) * 1e6}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--models", type=Path, default=Path(os.environ.get("QLINEAR_MODELS", "/work/shared/models")))
    ap.add_argument("--child", choices=("qlinear", "onnxruntime"), help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args)
    print(f"{'case':26s} {'qlinear us':>11s} {'onnxruntime us':>15s} {'ratio':>7s}   (each alone in its own process, "
          f"{args.threads} threads, median of {args.rounds} rounds)")
    for name in args.only.split(","):
        if name == "gpt2" and not (args.models / "tiny_gpt2_ortdynamic.onnx").exists():
            print(f"{name:26s} skipped: {args.models / 'tiny_gpt2_ortdynamic.onnx'} is absent")
            continue
        us: dict[str, list[float]] = {"qlinear": [], "onnxruntime": []}
        for r in range(args.rounds):
            for runtime in (("qlinear", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "qlinear")):
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", runtime, "--case", name,
                                    "--repeat", str(args.repeat), "--threads", str(args.threads),
                                    "--models", str(args.models)], capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"{name}, {runtime}: {(p.stderr.strip().splitlines() or ['no output'])[-1]}")
                us[runtime].append(json.loads(p.stdout.strip().splitlines()[-1])["us"])
        q, o = float(np.median(us["qlinear"])), float(np.median(us["onnxruntime"]))
        print(f"{name:26s} {q:11.1f} {o:15.1f} {q / o:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
