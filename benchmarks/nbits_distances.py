"""Measured distances of qlinear's MatMulNBits modes on real int4 models (docs/nbits.md).

For the tiny GPT-2-style model and the transformer block of tests/nbits_models.py, quantized by
onnxruntime's MatMulNBitsQuantizer (block 32 asymmetric, block 128 symmetric; the MatMulNBits
form), each accuracy level (0, 1, 4) and the exact mode: the model output's distance to the
exact one (every MatMulNBits node computing the exact sum rounded once, the other nodes as
qlinear runs them) and to onnxruntime's at the same level, as max |difference| over the largest
|output|, the largest and the median over ``--inputs`` random inputs.

    python benchmarks/nbits_distances.py [--inputs 10]

Runs in about two minutes on an idle machine (the exact mode is Python integers; onnxruntime
on one thread, qlinear's default engine).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import onnxruntime as ort  # noqa: E402
from nbits_models import quantize, rel, set_accuracy_level, tiny_gpt2, transformer_block  # noqa: E402

from qlinear import backend  # noqa: E402
from qlinear.graph.kernels import nbits as nbits_kernels  # noqa: E402


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def exact_run(model, feeds):
    nbits_kernels.MatMulNBits.mode = "exact"
    try:
        return backend.prepare(model).run(feeds)[0]
    finally:
        nbits_kernels.MatMulNBits.mode = "contract"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=10)
    args = ap.parse_args(argv)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    models = {
        "tiny GPT-2": (tiny_gpt2(), lambda r: {"ids": r.integers(0, 256, (1, 8)).astype(np.int64)}),
        "transformer block": (transformer_block(128, 256),
                              lambda r: {"x": r.standard_normal((5, 128)).astype(np.float32)}),
    }
    print("| model | quantization | mode | to the exact result (max, median) | to onnxruntime (max, median) |")
    print("|---|---|---|---|---|")
    for name, (fm, make) in models.items():
        for bs, sym in ((32, False), (128, True)):
            qm = quantize(fm, bs, sym)
            feeds = [make(np.random.default_rng(s)) for s in range(args.inputs)]
            exact = [exact_run(qm, f) for f in feeds]
            for mode in (0, 1, 4, "exact"):
                if mode == "exact":
                    ours, theirs = exact, [ort_run(set_accuracy_level(qm, 0), f) for f in feeds]
                else:
                    m = set_accuracy_level(qm, mode)
                    rep = backend.prepare(m)
                    ours = [rep.run(f)[0] for f in feeds]
                    theirs = [ort_run(m, f) for f in feeds]
                d_exact = [rel(o, e) for o, e in zip(ours, exact)]
                d_ort = [rel(o, t) for o, t in zip(ours, theirs)]
                label = f"level {mode}" if mode != "exact" else "exact (onnxruntime at level 0)"
                print(f"| {name} | int4 block {bs} {'symmetric' if sym else 'asymmetric'} | {label} | "
                      f"{max(d_exact):.2g}, {np.median(d_exact):.2g} | {max(d_ort):.2g}, {np.median(d_ort):.2g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
