"""QuantizeLinear / DequantizeLinear for the newer formats (issue 29's bench cases): qlinear's
native engine against onnxruntime, and against onnx.reference where onnxruntime cannot run the
case. Under ~3 minutes on the 2-vCPU Zen 4.

    python benchmarks/formats.py            # every case
    python benchmarks/formats.py int4 f8    # the cases whose name contains a word

Each case times qlinear and onnxruntime in separate processes (one child each, the same case
rebuilt from the same seed; ``--threads`` threads for both, default all the CPUs this process
may use; onnxruntime with one inter-op thread, spinning off, IOBinding so that its int4/float8
outputs need no NumPy type), `--repeat` runs after two warm-up calls, and reports medians. onnx.reference runs in the
qlinear child, fewer times (it is slow). Memory bandwidth is measured once, in the parent: the
median of 9 ``numpy.copyto`` calls of a 256 MiB float32 array into another (bytes read +
written per second, one thread: NumPy's copy does not use threads), and each qlinear case's
fraction of it is (bytes read + bytes written) / time / bandwidth. Prints one line per case:
median times, qlinear/onnxruntime, onnx.reference/qlinear, fraction of bandwidth; then the
geometric mean of qlinear/onnxruntime over the cases onnxruntime runs (issue 29's target:
<= 0.5, none above 1.0) and the smallest onnx.reference/qlinear over the others (>= 20).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib

import ml_dtypes
import numpy as np

from timing import median_seconds

N16M = 16 << 20


def _case_defs():
    """name -> (op, opset, x shape, x dtype, scale shape, scale dtype, attrs, out dtype, ort runs it)"""
    f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16
    i4, e4 = ml_dtypes.int4, ml_dtypes.float8_e4m3fn
    c = {}
    for b in (32, 128):
        c[f"q.f32-int4.blocked{b}.4096x4096"] = ("QuantizeLinear", 21, (4096, 4096), f32, (4096 // b, 4096), f32,
                                                  {"axis": 0, "block_size": b}, i4, True)
        c[f"dq.int4-f32.blocked{b}.4096x4096"] = ("DequantizeLinear", 21, (4096, 4096), i4, (4096 // b, 4096), f32,
                                                   {"axis": 0, "block_size": b}, f32, True)
    for sat in (1, 0):
        c[f"q.f32-f8e4m3fn.sat{sat}.16M"] = ("QuantizeLinear", 21, (N16M,), f32, (), f32, {"saturate": sat}, e4, True)
    c["dq.f8e4m3fn-f32.16M"] = ("DequantizeLinear", 21, (N16M,), e4, (), f32, {}, f32, True)
    c["q.f32-int16.axis.1x64x112x112"] = ("QuantizeLinear", 21, (1, 64, 112, 112), f32, (64,), f32, {"axis": 1},
                                          np.int16, True)
    c["dq.int16-f32.axis.1x64x112x112"] = ("DequantizeLinear", 21, (1, 64, 112, 112), np.int16, (64,), f32,
                                           {"axis": 1}, f32, True)
    c["q.f16-int8.f16scale.1x64x112x112"] = ("QuantizeLinear", 21, (1, 64, 112, 112), f16, (64,), f16, {"axis": 1},
                                             np.int8, True)
    c["dq.int8-f16.f16scale.1x64x112x112"] = ("DequantizeLinear", 21, (1, 64, 112, 112), np.int8, (64,), f16,
                                              {"axis": 1}, f16, True)
    # onnxruntime 1.32 runs no bfloat16, float4 or version 28: against onnx.reference
    c["q.bf16-int4.blocked32.1024x1024.v28"] = ("QuantizeLinear", 28, (1024, 1024), bf16, (32, 1024), bf16,
                                                {"axis": 0, "block_size": 32}, i4, False)
    c["dq.f4e2m1-bf16.blocked32.1024x1024.v28"] = ("DequantizeLinear", 28, (1024, 1024), ml_dtypes.float4_e2m1fn,
                                                   (32, 1024), bf16, {"axis": 0, "block_size": 32}, bf16, False)
    c["q.f32-f8e5m2.sat0.1M.v28"] = ("QuantizeLinear", 28, (1 << 20,), f32, (), f32, {"saturate": 0},
                                     ml_dtypes.float8_e5m2, False)
    return c


def _inputs(name):
    op, opset, xs, xt, ss, st, attrs, out, _ = _case_defs()[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if op == "QuantizeLinear":
        spread = 3e4 if out == np.int16 else (300.0 if out == ml_dtypes.float8_e4m3fn else 4.0)
        x = (rng.standard_normal(xs, dtype=np.float32) * spread).astype(xt)
    elif np.dtype(xt).kind in "iu":
        info = np.iinfo(xt)
        x = rng.integers(info.min, info.max + 1, xs).astype(xt)
    elif xt == ml_dtypes.int4:
        x = rng.integers(-8, 8, xs).astype(xt)
    else:  # float format codes
        x = rng.integers(0, 256, xs, dtype=np.uint8).view(xt) if np.dtype(xt).itemsize == 1 else None
        if xt == ml_dtypes.float4_e2m1fn:
            x = (rng.integers(0, 16, xs, dtype=np.uint8)).view(xt)
        elif xt == ml_dtypes.float8_e4m3fn:
            codes = rng.integers(0, 256, xs, dtype=np.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0  # NaN codes: onnxruntime and qlinear agree, but keep values finite
            x = codes.view(xt)
    s = rng.uniform(0.01, 0.5, ss).astype(np.float32).astype(st)
    return op, opset, x, s, attrs, out


def _model(name):
    from onnx import helper, numpy_helper
    op, opset, x, s, attrs, out = _inputs(name)
    elem_x = helper.np_dtype_to_tensor_dtype(x.dtype)
    elem_y = helper.np_dtype_to_tensor_dtype(np.dtype(out))
    a = dict(attrs)
    if op == "QuantizeLinear":
        a["output_dtype"] = elem_y
    elif opset >= 23 and np.dtype(out) != s.dtype:
        a["output_dtype"] = elem_y
    node = helper.make_node(op, ["x", "s"], ["y"], **a)
    g = helper.make_graph([node], name, [helper.make_tensor_value_info("x", elem_x, x.shape)],
                          [helper.make_tensor_value_info("y", elem_y, None)], [numpy_helper.from_array(s, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m, x


def _median_time(fn, repeat):
    return median_seconds(fn, repeat, warm=2)


def child(engine, name, repeat, threads):
    if engine == "onnxruntime":
        import onnxruntime as ort
        m, x = _model(name)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        io = sess.io_binding()
        if x.dtype == ml_dtypes.int4:  # no NumPy type in onnxruntime: its packed layout, copied in
            import ctypes
            from qlinear import dtypes
            packed = dtypes.get("int4").pack(x)
            xv = ort.OrtValue.ortvalue_from_shape_and_type(list(x.shape), 22)
            ctypes.memmove(xv.data_ptr(), packed.ctypes.data, packed.nbytes)
            io.bind_ortvalue_input("x", xv)
        elif x.dtype == ml_dtypes.float8_e4m3fn:  # no NumPy type in onnxruntime: the bytes, typed FLOAT8E4M3FN
            io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint8), 17))
        else:
            io.bind_cpu_input("x", x)
        io.bind_output("y")
        return {"time": _median_time(lambda: sess.run_with_iobinding(io), repeat)}
    import qlinear
    qlinear.set_num_threads(threads)
    op, opset, x, s, attrs, out = _inputs(name)
    if op == "QuantizeLinear":
        def run():
            return qlinear.quantize_linear(x, s, output_dtype=out, version=opset, **attrs)
    else:
        od = out if opset >= 23 else None
        def run():
            return qlinear.dequantize_linear(x, s, output_dtype=od, version=opset, **attrs)
    y = run()
    res = {"time": _median_time(run, repeat), "bytes": x.nbytes + y.nbytes}
    if not _case_defs()[name][-1]:
        from onnx.reference import ReferenceEvaluator
        m, _ = _model(name)
        ev = ReferenceEvaluator(m)
        res["reference"] = _median_time(lambda: ev.run(None, {"x": x}), 1)
    return res


def _bandwidth():
    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    return 2 * a.nbytes / _median_time(lambda: np.copyto(b, a), 9)


def matmul_part(repeat):
    """QLinearMatMul-21 (issue 29's targets): float8 e4m3fn operands against NumPy's float32
    matmul of the dequantized operands (same process, same threads: OpenBLAS's), and 8-bit
    operands with float16 scales against the same call with float32 scales."""
    import qlinear
    rng = np.random.default_rng(1)
    e4 = ml_dtypes.float8_e4m3fn
    print(f"{'QLinearMatMul-21':44s} {'qlinear':>10s} {'reference':>10s} {'ratio':>7s}")
    for m, k, n in ((128, 768, 768), (128, 768, 3072)):
        def f8(shape):
            c = rng.integers(0, 256, shape, dtype=np.uint8)
            c[(c & 0x7F) == 0x7F] = 0
            return c.view(e4)
        a, b = f8((m, k)), f8((k, n))
        z = np.zeros((), e4)
        af, bf = a.astype(np.float32), b.astype(np.float32)
        tq = _median_time(lambda: qlinear.qlinear_matmul(a, np.float32(0.1), z, b, np.float32(0.1), z,
                                                         np.float32(10.0), z), repeat)
        tn = _median_time(lambda: np.matmul(af, bf), repeat)
        print(f"{f'f8e4m3fn {m}x{k}x{n} vs numpy f32 matmul':44s} {tq * 1e3:8.2f}ms {tn * 1e3:8.2f}ms {tq / tn:7.2f}"
              f"  (target <= 2)")
        a8 = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b8 = rng.integers(-128, 128, (k, n), dtype=np.int8)
        zu, zs = np.uint8(128), np.int8(0)
        t16 = _median_time(lambda: qlinear.qlinear_matmul(a8, np.float16(0.05), zu, b8, np.float16(0.01), zs,
                                                          np.float16(2.0), zu), repeat)
        t32 = _median_time(lambda: qlinear.qlinear_matmul(a8, np.float32(0.05), zu, b8, np.float32(0.01), zs,
                                                          np.float32(2.0), zu), repeat)
        print(f"{f'u8s8 {m}x{k}x{n} f16 scales vs f32 scales':44s} {t16 * 1e3:8.2f}ms {t32 * 1e3:8.2f}ms "
              f"{t16 / t32:7.2f}  (target ~1)")


def main(argv):
    threads = len(os.sched_getaffinity(0))
    repeat = 15
    words = [w for w in argv if not w.startswith("--")]
    for w in argv:
        if w.startswith("--threads="):
            threads = int(w.split("=")[1])
        if w.startswith("--repeat="):
            repeat = int(w.split("=")[1])
    names = [n for n in _case_defs() if not words or any(w in n for w in words)]
    if not words or "matmul" in words:
        matmul_part(repeat)
    bw = _bandwidth()
    print(f"memory bandwidth (numpy.copyto of 256 MiB, read + write): {bw / 1e9:.1f} GB/s; threads {threads}")
    print(f"{'case':44s} {'qlinear':>10s} {'ort':>10s} {'q/ort':>7s} {'ref':>10s} {'ref/q':>7s} {'bw':>6s}")
    ratios, speedups = [], []
    for name in names:
        runs = {}
        engines = ["qlinear"] + (["onnxruntime"] if _case_defs()[name][-1] else [])
        for eng in engines:
            out = subprocess.run([sys.executable, __file__, "--child", eng, name, str(repeat), str(threads)],
                                 capture_output=True, text=True, check=True)
            runs[eng] = json.loads(out.stdout.strip().splitlines()[-1])
        tq = runs["qlinear"]["time"]
        frac = runs["qlinear"]["bytes"] / tq / bw
        line = f"{name:44s} {tq * 1e3:8.2f}ms"
        if "onnxruntime" in runs:
            to = runs["onnxruntime"]["time"]
            ratios.append(tq / to)
            line += f" {to * 1e3:8.2f}ms {tq / to:7.3f} {'':>10s} {'':>7s}"
        else:
            tr = runs["qlinear"]["reference"]
            speedups.append(tr / tq)
            line += f" {'-':>10s} {'-':>7s} {tr * 1e3:8.1f}ms {tr / tq:7.1f}"
        print(line + f" {frac:6.2f}", flush=True)
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geometric mean qlinear/onnxruntime over {len(ratios)} cases: {gm:.3f} (max {max(ratios):.3f}); "
              f"target <= 0.5, none above 1.0")
    if speedups:
        print(f"onnx.reference/qlinear: min {min(speedups):.1f}x over {len(speedups)} cases; target >= 20x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        main(sys.argv[1:])
