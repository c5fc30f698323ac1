"""Per-node cost of the graph engine: chains of N small nodes, qlinear against onnxruntime.

    python benchmarks/pernode.py [--nodes 64] [--repeat 400] [--rounds 3] [--threads 2]
    python benchmarks/pernode.py --only float,qmatmul      # some of the chains

Each chain is a model of ``--nodes`` nodes of one kind on a tensor so small that a node's own
arithmetic is negligible, and the same kind of model with 1 node; the difference of their
median run times divided by ``nodes - 1`` is the cost per node (graph loop, dispatch, the
operator's call and its small output), with the cost per run (feeds, outputs, session entry)
taken out. Chains:

- ``float``: Add, Mul, Sub (a constant each), Relu in turn on a (1, 16) float32;
- ``reshape``: Reshape / Transpose / Identity in turn (data movement, no arithmetic);
- ``qmatmul``: QLinearMatMul of a (1, 16) uint8 by a constant (16, 16) int8, scalar scales;
- ``qadd``: com.microsoft QLinearAdd of the chain's tensor and a constant, (1, 16) uint8;
- ``qdq``: QuantizeLinear then DequantizeLinear in turn (each pair onnxruntime and qlinear may
  fuse away is kept apart by a Relu between them: Q, DQ, Relu, ...), (1, 16).

Each runtime runs alone in its own process (onnxruntime with its default session options but
the thread count, as users run it), warm, ``--repeat`` runs back to back, median; ``--rounds``
such pairs of processes, the order alternating; the median of the rounds. Prints microseconds
per node for both and their ratio, chain by chain, then the two figures of issue #31's targets:
the cost per float node (the mean of the ``float`` and ``reshape`` chains', target 0.5 us) and
per small quantized node (the mean of the ``qmatmul``, ``qadd`` and ``qdq`` chains', target
1.5 us). Under ~2 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from timing import median_seconds

import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

CHAINS = ("float", "reshape", "qmatmul", "qadd", "qdq")
#: the two figures the summary reports: (name, chains, target in microseconds per node)
FIGURES = (("float node", ("float", "reshape"), 0.5), ("quantized node", ("qmatmul", "qadd", "qdq"), 1.5))


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def chain_model(kind: str, n: int) -> onnx.ModelProto:
    """A model of ``n`` nodes of ``kind`` (see the module docstring) in a chain."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    ms = helper.make_opsetid("com.microsoft", 1)
    opsets = [helper.make_opsetid("", 17)]
    if kind in ("float", "reshape", "qdq"):
        elem, shape = T.FLOAT, [1, 16]
        inits += [numpy_helper.from_array(rng.random((1, 16)).astype(np.float32) + 0.5, "c"),
                  numpy_helper.from_array(np.array([4, 4], np.int64), "s44"),
                  numpy_helper.from_array(np.array([1, 16], np.int64), "s116"),
                  numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
                  numpy_helper.from_array(np.array(128, np.uint8), "qz")]
        for i in range(n):
            a, b = f"t{i}", f"t{i + 1}"
            if kind == "float":
                op = ("Add", "Mul", "Sub", "Relu")[i % 4]
                nodes.append(helper.make_node(op, [a, "c"] if op != "Relu" else [a], [b]))
            elif kind == "reshape":
                op = i % 3
                if op == 0:
                    nodes.append(helper.make_node("Reshape", [a, "s44" if i % 2 == 0 else "s116"], [b]))
                elif op == 1:
                    nodes.append(helper.make_node("Transpose", [a], [b]))
                else:
                    nodes.append(helper.make_node("Identity", [a], [b]))
            else:
                op = i % 3
                nodes.append(helper.make_node(("QuantizeLinear", "DequantizeLinear", "Relu")[op],
                                              [a, "qs", "qz"] if op < 2 else [a], [b]))
        out_elem = T.FLOAT if kind != "qdq" or n % 3 != 1 else T.UINT8
        out_shape = None
    else:
        elem, shape = T.UINT8, [1, 16]
        inits += [numpy_helper.from_array(rng.integers(-20, 20, (16, 16)).astype(np.int8), "w"),
                  numpy_helper.from_array(rng.integers(0, 255, (1, 16)).astype(np.uint8), "c"),
                  numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
                  numpy_helper.from_array(np.array(120, np.uint8), "xz"),
                  numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
                  numpy_helper.from_array(np.array(0, np.int8), "wz"),
                  numpy_helper.from_array(np.array(0.05, np.float32), "cs"),
                  numpy_helper.from_array(np.array(128, np.uint8), "cz")]
        for i in range(n):
            a, b = f"t{i}", f"t{i + 1}"
            if kind == "qmatmul":
                nodes.append(helper.make_node("QLinearMatMul", [a, "xs", "xz", "w", "ws", "wz", "xs", "xz"], [b]))
            else:
                nodes.append(helper.make_node("QLinearAdd", [a, "xs", "xz", "c", "cs", "cz", "xs", "xz"], [b],
                                              domain="com.microsoft"))
        if kind == "qadd":
            opsets.append(ms)
        out_elem, out_shape = T.UINT8, None
    g = helper.make_graph(nodes, kind, [_vi("t0", elem, shape)], [_vi(f"t{n}", out_elem, out_shape)], inits)
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    return m


def _feed(kind: str) -> np.ndarray:
    rng = np.random.default_rng(1)
    if kind in ("qmatmul", "qadd"):
        return rng.integers(0, 255, (1, 16)).astype(np.uint8)
    return rng.standard_normal((1, 16)).astype(np.float32)


def _child(runtime: str, kind: str, nodes: int, repeat: int, threads: int) -> dict[str, float]:
    """Median seconds per run of the 1-node and the ``nodes``-node chain in this process."""
    x = _feed(kind)
    out = {}
    for n in (1, nodes):
        m = chain_model(kind, n)
        if runtime == "qlinear":
            import qlinear
            import qlinear.backend as backend

            qlinear.set_num_threads(threads)
            rep = backend.prepare(m)

            def fn(rep=rep):
                return rep.run({"t0": x})
        else:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            path = os.path.join(tempfile.mkdtemp(), "m.onnx")
            onnx.save(m, path)
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

            def fn(sess=sess):
                return sess.run(None, {"t0": x})
        out[str(n)] = median_seconds(fn, repeat, warm=20)
    return out


def per_node_us(runtime: str, kind: str, nodes: int, repeat: int, threads: int) -> float:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", runtime, "--only", kind,
                        "--nodes", str(nodes), "--repeat", str(repeat), "--threads", str(threads)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{runtime} {kind}: {last}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return (r[str(nodes)] - r["1"]) / (nodes - 1) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=",".join(CHAINS))
    ap.add_argument("--child", choices=("qlinear", "onnxruntime"))
    a = ap.parse_args(argv)
    kinds = [k for k in a.only.split(",") if k]
    bad = [k for k in kinds if k not in CHAINS]
    if bad or a.nodes < 2:
        ap.error(f"--only takes {', '.join(CHAINS)}; --nodes at least 2")
    if a.child:
        print(json.dumps(_child(a.child, kinds[0], a.nodes, a.repeat, a.threads)))
        return 0
    print(f"us per node, chains of {a.nodes} nodes minus 1, {a.rounds} rounds (own processes, alternating), "
          f"{a.threads} threads")
    print(f"{'chain':10s} {'qlinear':>9s} {'onnxruntime':>12s} {'ratio':>7s}   rounds (qlinear/onnxruntime)")
    got: dict[str, tuple[float, float]] = {}
    for kind in kinds:
        q, o = [], []
        for r in range(a.rounds):
            order = ("qlinear", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "qlinear")
            for rt in order:
                (q if rt == "qlinear" else o).append(per_node_us(rt, kind, a.nodes, a.repeat, a.threads))
        mq, mo = float(np.median(q)), float(np.median(o))
        spread = " ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(q, o))
        print(f"{kind:10s} {mq:9.2f} {mo:12.2f} {mq / mo if mo > 0 else float('nan'):7.2f}   {spread}",
              flush=True)
        got[kind] = (mq, mo)
    for name, chains, target in FIGURES:
        have = [got[c] for c in chains if c in got]
        if len(have) != len(chains):
            continue  # (--only left a chain out)
        q, o = (float(np.mean([h[i] for h in have])) for i in (0, 1))
        print(f"per {name:15s} qlinear {q:5.2f} us, onnxruntime {o:5.2f} us (target <= {target} us: "
              f"{'met' if q <= target else 'NOT met'}; mean of the {', '.join(chains)} chains)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
