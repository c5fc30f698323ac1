"""QuantizeLinear / DequantizeLinear where onnxruntime cannot run the case: qlinear against
onnx.reference (issue 29's target: qlinear at least 20x faster on every such case).

onnxruntime 1.32 runs no version 28 node at all (nor bfloat16, float4, float6 or float8e8m0
scales at any version: ../shared/FORMATS.md section 6), so every case here is a version-28 node:
every output type of QuantizeLinear and every input type of DequantizeLinear per tensor, plus
the bfloat16, float16, e8m0 (microscaling) and blocked forms, each at 64K, 1M and 16M elements.

    python benchmarks/formats_reference.py               # every case, about 2 minutes idle
    python benchmarks/formats_reference.py f4 int2       # the cases whose name contains a word
    python benchmarks/formats_reference.py --sizes=1M    # some sizes only (64K, 1M, 16M)
    python benchmarks/formats_reference.py --rounds=3    # more alternations (default 2)

Each engine runs in its own child process (`--rounds` times, alternating qlinear, onnx.reference,
qlinear, ...; each child builds every case from the same seed). In a child, each case and size
is called once to warm up and then timed `repeat` times (qlinear 9, onnx.reference 3; at 16M
qlinear 5, onnx.reference one call without warm-up); the median of a child's times is taken,
then the median over the rounds. qlinear runs with its defaults (the native engine, every CPU
this process may use); onnx.reference is single-threaded NumPy. Prints one line per case and size: the two medians and onnx.reference/qlinear; then the
cases below 20x.

Cases that cannot reach 20x (docs/benchmarks.md): the integer DequantizeLinear ones, which
onnx.reference computes as two or three vectorized NumPy passes within a few passes of memory
bandwidth, and every case at 64K, where each side's fixed per-call cost dominates.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import zlib

import ml_dtypes
import numpy as np

from timing import median_seconds

SIZES = {"64K": 1 << 16, "1M": 1 << 20, "16M": 1 << 24}
TARGET = 20.0

F32, F16, BF16, E8M0 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), \
    np.dtype(ml_dtypes.float8_e8m0fnu)
INTS = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int4": ml_dtypes.int4,
        "uint4": ml_dtypes.uint4, "int2": ml_dtypes.int2, "uint2": ml_dtypes.uint2}
FLOATS = {"f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
          "f8e5m2": ml_dtypes.float8_e5m2, "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
          "f4e2m1": ml_dtypes.float4_e2m1fn, "f6e2m3": ml_dtypes.float6_e2m3fn, "f6e3m2": ml_dtypes.float6_e3m2fn}


def _cases():
    """name -> (op, x dtype, scale dtype, granularity, attrs, out dtype); granularity "tensor",
    "axis" (x seen as (rows, 256), the scale per column) or ("block", B) (blocks of B rows)."""
    c = {}
    for n, t in INTS.items():
        c[f"q.f32-{n}"] = ("Q", F32, F32, "tensor", {}, np.dtype(t))
    for n, t in FLOATS.items():
        sats = (1, 0) if n.startswith("f8") else (1,)
        for sat in sats:
            c[f"q.f32-{n}" + (f".sat{sat}" if len(sats) > 1 else "")] = ("Q", F32, F32, "tensor", {"saturate": sat},
                                                                         np.dtype(t))
    c["q.bf16-int4.blocked32"] = ("Q", BF16, BF16, ("block", 32), {}, np.dtype(ml_dtypes.int4))
    c["q.bf16-int8.axis"] = ("Q", BF16, BF16, "axis", {}, np.dtype(np.int8))
    c["q.f16-f8e4m3fn.axis"] = ("Q", F16, F16, "axis", {}, np.dtype(ml_dtypes.float8_e4m3fn))
    c["q.f32-int4.blocked128"] = ("Q", F32, F32, ("block", 128), {}, np.dtype(ml_dtypes.int4))
    c["q.f32-f4e2m1.e8m0.blocked32"] = ("Q", F32, E8M0, ("block", 32), {}, np.dtype(ml_dtypes.float4_e2m1fn))
    c["q.f32-f8e4m3fn.e8m0.blocked32"] = ("Q", F32, E8M0, ("block", 32), {}, np.dtype(ml_dtypes.float8_e4m3fn))
    for n, t in {**INTS, "int32": np.int32}.items():
        c[f"dq.{n}-f32"] = ("DQ", np.dtype(t), F32, "tensor", {}, F32)
    for n, t in FLOATS.items():
        c[f"dq.{n}-f32"] = ("DQ", np.dtype(t), F32, "tensor", {}, F32)
    c["dq.int4-f32.blocked32"] = ("DQ", np.dtype(ml_dtypes.int4), F32, ("block", 32), {}, F32)
    c["dq.int4-bf16.blocked32"] = ("DQ", np.dtype(ml_dtypes.int4), BF16, ("block", 32), {}, BF16)
    c["dq.f4e2m1-bf16.blocked32"] = ("DQ", np.dtype(ml_dtypes.float4_e2m1fn), BF16, ("block", 32), {}, BF16)
    c["dq.f4e2m1-f32.e8m0.blocked32"] = ("DQ", np.dtype(ml_dtypes.float4_e2m1fn), E8M0, ("block", 32), {}, F32)
    c["dq.f8e4m3fn-f32.e8m0.blocked32"] = ("DQ", np.dtype(ml_dtypes.float8_e4m3fn), E8M0, ("block", 32), {}, F32)
    c["dq.int8-bf16.axis"] = ("DQ", np.dtype(np.int8), BF16, "axis", {}, BF16)
    c["dq.int16-f16.axis"] = ("DQ", np.dtype(np.int16), F16, "axis", {}, F16)
    return c


def _is_int(t):
    return np.dtype(t).name.startswith(("int", "uint"))


def _spread(out):
    """A spread of x / scale that covers the output type's range (and runs past it a little)."""
    if _is_int(out):
        info = ml_dtypes.iinfo(out)
        return float(int(info.max) - int(info.min)) / 3
    return float(ml_dtypes.finfo(out).max) / 2


def _inputs(name, n):
    op, xt, st, gran, attrs, out = _cases()[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}.{n}".encode()))
    cols = 256
    shape = (n // cols, cols)
    a = dict(attrs)
    if gran == "tensor":
        sshape = ()
    elif gran == "axis":
        sshape, a["axis"] = (cols,), 1
    else:
        b = gran[1]
        sshape, a["axis"], a["block_size"] = (shape[0] // b, cols), 0, b
    if st == E8M0:
        s = np.exp2(rng.integers(-3, 3, sshape)).astype(np.float32).astype(E8M0)
    else:
        s = rng.uniform(0.05, 0.5, sshape).astype(np.float32).astype(st)
    if op == "Q":
        x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(_spread(out) * 0.25)).astype(xt)
    elif _is_int(xt):
        info = ml_dtypes.iinfo(xt)
        x = rng.integers(int(info.min), int(info.max) + 1, shape).astype(np.int64).astype(xt)
    else:  # float format codes: every code of the format's width
        width = {"float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6}.get(xt.name, 8)
        x = rng.integers(0, 1 << width, shape, dtype=np.uint8).view(xt)
    if op == "Q" or (st == E8M0 or out != st):
        a["output_dtype"] = out
    return op, x, s, a


def _model(name, x, s, a):
    from onnx import helper, numpy_helper
    op = "QuantizeLinear" if _cases()[name][0] == "Q" else "DequantizeLinear"
    attrs = {k: v for k, v in a.items() if k != "output_dtype"}
    out = np.dtype(a.get("output_dtype", s.dtype))
    if "output_dtype" in a:
        attrs["output_dtype"] = helper.np_dtype_to_tensor_dtype(out)
    node = helper.make_node(op, ["x", "s"], ["y"], **attrs)
    g = helper.make_graph([node], name, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
                          [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out), None)],
                          [numpy_helper.from_array(s, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 28)])
    m.ir_version = 11
    return m


def _times(fn, repeat, warm=True):
    return median_seconds(fn, repeat, warm=1 if warm else 0)


def child(engine, names, sizes):
    res = {}
    if engine == "qlinear":
        import qlinear
    else:
        from onnx.reference import ReferenceEvaluator
    for name in names:
        for sz in sizes:
            n = SIZES[sz]
            op, x, s, a = _inputs(name, n)
            if engine == "qlinear":
                f = qlinear.quantize_linear if op == "Q" else qlinear.dequantize_linear
                def run(f=f, x=x, s=s, a=a):
                    return f(x, s, version=28, **a)
                repeat = 9 if n < (1 << 24) else 5
            else:
                ev = ReferenceEvaluator(_model(name, x, s, a))
                def run(ev=ev, x=x):
                    return ev.run(None, {"x": x})
                repeat = 3 if n < (1 << 24) else 1
            # (onnx.reference at 16M: one timed call, no warm-up: NumPy has nothing to warm,
            # and the case list stays within the time budget)
            res[f"{name}@{sz}"] = _times(run, repeat, warm=engine == "qlinear" or n < (1 << 24))
    return res


def main(argv):
    rounds = 2
    sizes = list(SIZES)
    words = []
    for w in argv:
        if w.startswith("--rounds="):
            rounds = int(w.split("=")[1])
        elif w.startswith("--sizes="):
            sizes = w.split("=")[1].split(",")
        else:
            words.append(w)
    names = [n for n in _cases() if not words or any(w in n for w in words)]
    times = {"qlinear": {}, "reference": {}}
    t0 = time.perf_counter()
    for _ in range(rounds):
        for eng in ("qlinear", "reference"):
            out = subprocess.run([sys.executable, __file__, "--child", eng, json.dumps(names), json.dumps(sizes)],
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{eng} child failed:\n{out.stderr}")
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                times[eng].setdefault(k, []).append(v)
    print(f"{'case (opset 28)':40s} {'size':>4s} {'qlinear':>10s} {'reference':>11s} {'ref/q':>7s}")
    low = []
    for name in names:
        for sz in sizes:
            k = f"{name}@{sz}"
            tq, tr = statistics.median(times["qlinear"][k]), statistics.median(times["reference"][k])
            r = tr / tq
            if r < TARGET:
                low.append((k, r))
            print(f"{name:40s} {sz:>4s} {tq * 1e3:8.3f}ms {tr * 1e3:9.2f}ms {r:7.1f}")
    print(f"{len(names) * len(sizes)} cases, {rounds} rounds, {time.perf_counter() - t0:.0f} s; "
          f"onnx.reference/qlinear below {TARGET:.0f}x: " + (", ".join(f"{k} {r:.1f}x" for k, r in low) or "none"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]))))
    else:
        main(sys.argv[1:])
