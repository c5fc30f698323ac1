"""Model graphs: qlinear's backend against onnxruntime's normal session, node type by node type.

    python benchmarks/graphs.py [--models DIR] [--repeat 10] [--rounds 3] [--only NAME[,NAME...]] [--resnet50 all]
    python benchmarks/graphs.py --interleaved [--repeat 7] [--profile] [--before]
    python benchmarks/graphs.py --table [--repeat 15]     # the docs/models.md table
    python benchmarks/graphs.py --verdicts                # its compare columns only
    python benchmarks/graphs.py --smoke                   # the default mode on a one-node model

Each model in DIR (default /work/shared/models, when present) that qlinear's backend prepares,
plus a QOperator ResNet-50 built as the tests build it (``qlinear.tools.synthetic``), runs on
both engines with the same seeded input, batch 1, ``--threads`` threads (default 2).

The default mode times them as users run them: each runtime alone in its own process with its
default settings (onnxruntime's session options untouched but the thread count: its graph
optimizations on, its workers spinning), warm (two runs first), ``--repeat`` runs back to back,
median; ``--rounds`` such pairs of processes, the order alternating (qlinear first, then
onnxruntime first, ...) so that a drift of the host touches both; the median of the rounds.
The rounds' qlinear/onnxruntime ratios give the spread, and the model is marked noisy above
qlinear.tools.bench.run.NOISY_SPREAD (as ``qlinear bench`` marks its cases).

``--interleaved`` is the second view: both in this process, one warm-up run each, then
``--repeat`` rounds running every engine once in turn (order rotating), onnxruntime's spinning
off (it would take a core from qlinear's next run); medians. ``--profile`` (qlinear's time per
operator type, summed over nodes, median run, the graph engine's per-node overhead and
onnxruntime's profiler's kernel times) and ``--before`` need one process, and imply it.
``--blas-threads N`` limits NumPy's BLAS (which qlinear's matrix products use) to N threads.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import noamx  # noqa: F401  (first: --no-amx must precede both runtimes)
import numpy as np

import onnx
from timing import model_runner


def _inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        # a dynamic dimension becomes 1, except a leading -1 (a time axis, as in Kaldi's TDNN),
        # which gets 100 frames so that every window fits
        shape = [d.dim_value if d.dim_value > 0 else (100 if d.dim_value < 0 and i == 0 else 1)
                 for i, d in enumerate(tt.shape.dim)]
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.random(shape).astype(dt)
        else:
            feeds[vi.name] = rng.integers(0, 8, size=shape).astype(dt)
    return feeds


def _wanted(only: str | None, name: str) -> bool:
    """Whether ``--only`` (None: every model; else substrings, comma-separated) takes ``name``."""
    return not only or any(part and part in name for part in only.split(","))


def _median_ms(fn, repeat: int) -> float:
    fn()  # first run apart (preparation, caches)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def _interleaved_ms(engines: dict, repeat: int) -> dict[str, float]:
    """Median milliseconds per engine, one run of each in turn (the order rotating), after
    one warm-up run each: a shared machine's load changes hit every engine alike."""
    names = list(engines)
    for fn in engines.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeat):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            engines[k]()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def profile_nodes(rep, feeds, repeat: int):
    """Median-run milliseconds per operator type (a node's time includes releasing the
    tensors it consumed last) and the rest of the run (graph loop, feeds, outputs)."""
    ev = rep.evaluator
    nodes = ev.rt_nodes_
    per_run, totals = [], []
    rep.run(feeds)
    try:
        for _ in range(repeat):
            ev.node_seconds = {}
            t = time.perf_counter()
            rep.run(feeds)
            totals.append(time.perf_counter() - t)
            per_run.append(ev.node_seconds)
    finally:
        ev.node_seconds = None
    i = int(np.argsort(totals)[len(totals) // 2])
    by_type = {k: v * 1e3 for k, v in per_run[i].items()}
    overhead = totals[i] * 1e3 - sum(by_type.values())
    counts = collections.Counter(n.op_type for n in nodes)
    return by_type, overhead, counts


SIX_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
           "MatMulInteger")


def per_node_overhead(n: int = 300, repeat: int = 15) -> dict[str, tuple[float, float]]:
    """Microseconds per node of a chain of ``n`` nodes on a 4-element tensor (so the node's
    own arithmetic is negligible), qlinear's backend against onnx.reference's evaluator."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    import qlinear.backend as backend

    x = np.ones(4, np.float32)
    out = {}
    for op in ("Identity", "Relu", "Add", "Reshape"):
        extra = {"Add": ["c"], "Reshape": ["shape"]}.get(op, [])
        nodes = [helper.make_node(op, [f"t{i}"] + extra, [f"t{i + 1}"]) for i in range(n)]
        inits = [numpy_helper.from_array(np.ones(4, np.float32), "c"),
                 numpy_helper.from_array(np.array([4], np.int64), "shape")]
        g = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [4])],
                              inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        rep, ref = backend.prepare(m), ReferenceEvaluator(m)
        q = _median_ms(lambda: rep.run([x]), repeat) * 1e3 / n
        r = _median_ms(lambda: ref.run(None, {"t0": x}), repeat) * 1e3 / n
        out[op] = (q, r)
    return out


OP_CASES = [
    # (label, op, input shapes, attributes, constant inputs, opset)
    ("AveragePool 7x7 global-size", "AveragePool", (1, 2048, 7, 7), {"kernel_shape": [7, 7]}, {}, 13),
    ("AveragePool 3x3 s1 p1", "AveragePool", (1, 64, 56, 56),
     {"kernel_shape": [3, 3], "pads": [1] * 4, "count_include_pad": 1}, {}, 13),
    ("GlobalAveragePool", "GlobalAveragePool", (1, 1280, 7, 7), {}, {}, 13),
    ("Conv 3x3 64->64", "Conv", (1, 64, 56, 56), {"pads": [1] * 4}, {"w": (64, 64, 3, 3)}, 13),
    ("Conv 1x1 256->64", "Conv", (1, 256, 56, 56), {}, {"w": (64, 256, 1, 1)}, 13),
    ("Conv depthwise 3x3 s2", "Conv", (1, 96, 112, 112),
     {"pads": [1] * 4, "strides": [2, 2], "group": 96}, {"w": (96, 1, 3, 3)}, 13),
    ("Conv 7x7 s2 3->64", "Conv", (1, 3, 224, 224), {"pads": [3] * 4, "strides": [2, 2]},
     {"w": (64, 3, 7, 7)}, 13),
    ("Sigmoid", "Sigmoid", (1, 64, 80, 80), {}, {}, 13),
    ("LeakyRelu", "LeakyRelu", (1, 64, 80, 80), {"alpha": 0.1}, {}, 13),
    ("Softmax last axis 2", "Softmax", (1, 16800, 2), {"axis": -1}, {}, 13),
    ("Softmax last axis 1000", "Softmax", (8, 1000), {"axis": -1}, {}, 13),
    ("Resize nearest x2", "Resize", (1, 64, 40, 40), {"mode": "nearest"},
     {"roi": None, "scales": [1, 1, 2, 2]}, 13),
    ("Resize linear x2", "Resize", (1, 64, 40, 40),
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
     {"roi": None, "scales": [1, 1, 2, 2]}, 13),
]


def op_table(repeat: int) -> list[tuple[str, float, float, float]]:
    """Milliseconds of one node: onnx.reference, qlinear's backend, onnxruntime."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    import qlinear.backend as backend

    rng = np.random.default_rng(0)
    rows = []
    for label, op, shape, attrs, consts, opset in OP_CASES:
        x = rng.standard_normal(shape).astype(np.float32)
        inits = []
        for k, v in consts.items():
            if v is None:
                arr = np.zeros(0, np.float32)
            elif k == "w":
                arr = (rng.standard_normal(v) * 0.1).astype(np.float32)
            else:
                arr = np.asarray(v, np.float32)
            inits.append(numpy_helper.from_array(arr, k))
        node = helper.make_node(op, ["x"] + list(consts), ["y"], **attrs)
        g = helper.make_graph([node], "op", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_empty_tensor_value_info("y")], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ref, rep = ReferenceEvaluator(m), backend.prepare(m)
        t = _interleaved_ms({"ref": lambda: ref.run(None, {"x": x}),
                             "q": lambda: rep.run({"x": x}),
                             "ort": lambda: sess.run(None, {"x": x})}, repeat)
        rows.append((label, t["ref"], t["q"], t["ort"]))
        print(f"{label:30s} onnx.reference {t['ref']:9.3f} ms  qlinear {t['q']:8.3f} ms  "
              f"onnxruntime {t['ort']:8.3f} ms", flush=True)
    return rows


def ort_profile(path_or_bytes, feeds, repeat: int):
    import json
    import tempfile

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    s = ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        s.run(None, feeds)
    f = s.end_profiling()
    ev = json.load(open(f))
    acc: dict[str, list] = collections.defaultdict(list)
    runs = [e for e in ev if e.get("cat") == "Session" and e["name"] == "model_run"]
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            acc[e["args"]["op_name"]].append(e["dur"])
    nrun = max(len(runs), 1)
    return {k: sum(v) / nrun / 1e3 for k, v in acc.items()}


#: Warm-up runs of a runtime in its own process before the timed ones.
WARM_RUNS = 2


def _child(args) -> int:
    """``--child RUNTIME``: one runtime alone in this process, its defaults but the threads:
    WARM_RUNS runs, then ``--repeat`` timed back to back; prints {"ms": median, "min_ms": ...}
    as the last line of stdout."""
    model = onnx.load(args.model_path)
    feeds = model_inputs(args.name, model)
    fn = model_runner(args.child, model, feeds, args.threads, path=args.model_path)
    for _ in range(WARM_RUNS):
        fn()
    ts = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    print(json.dumps({"ms": float(np.median(ts)) * 1e3, "min_ms": float(np.min(ts)) * 1e3}))
    return 0


def separate_ms(name: str, path: str, repeat: int, rounds: int, threads: int,
                extra: list[str]) -> dict:
    """The default mode for one model file: ``rounds`` pairs of processes, each runtime alone
    in its own (``--child``), the order alternating; medians over the rounds, and the spread
    of the rounds' ratios (qlinear.tools.bench.run.round_noise)."""
    from qlinear.tools.bench.run import round_noise

    ms: dict[str, list[float]] = {"qlinear": [], "onnxruntime": []}
    for r in range(rounds):
        for runtime in (("qlinear", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "qlinear")):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", runtime,
                                "--model-path", path, "--name", name, "--repeat", str(repeat),
                                "--threads", str(threads), *extra],
                               capture_output=True, text=True)
            if p.returncode != 0:
                last = (p.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"{runtime} in its own process: {last}")
            ms[runtime].append(json.loads(p.stdout.strip().splitlines()[-1])["ms"])
    return {"qlinear": float(np.median(ms["qlinear"])),
            "onnxruntime": float(np.median(ms["onnxruntime"])), "rounds": ms,
            "noise": round_noise(ms["qlinear"], ms["onnxruntime"])}


def _model_file(src, folder: str, name: str) -> str:
    """A path onnxruntime and the child processes can load: the model's own file, or the
    in-memory model saved into ``folder``."""
    if isinstance(src, Path):
        return str(src)
    path = os.path.join(folder, "".join(c if c.isalnum() else "_" for c in name) + ".onnx")
    onnx.save(src, path)
    return path


def _interleaved_options(threads: int):
    """onnxruntime's session options in the interleaved view: ``threads`` intra-op threads,
    one inter-op thread, spinning off: in the interleaved rounds its spinning workers took a
    core from qlinear's next run (``qlinear bench`` turns it off too)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def child_flags(args) -> list[str]:
    """The flags a child process repeats: --no-amx (its filter is inherited anyway, and the
    child checks it), --blas-threads."""
    return (["--no-amx"] if args.no_amx else []) + (
        ["--blas-threads", str(args.blas_threads)] if args.blas_threads else [])


def smoke_models():
    """--smoke: one tiny QLinearConv model (a case of ``qlinear bench``)."""
    from qlinear.tools.bench import cases

    case = cases.conv_case("smoke.qlinearconv.1x8x8x8.k3", 1, 8, (8, 8), 8, (3, 3))
    return [(case.name, case.build(np.random.default_rng(0)).model)]


def separate(args, sources) -> list[tuple[str, float, float]]:
    """The default mode over ``sources`` ((name, path or model) pairs): one line a model,
    then the geometric mean."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, src in sources:
            if not _wanted(args.only, name):
                continue
            try:
                t = separate_ms(name, _model_file(src, folder, name), args.repeat, args.rounds,
                                args.threads, child_flags(args))
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{name}: failed ({type(e).__name__}: {str(e)[:160]})", flush=True)
                continue
            q, o, nz = t["qlinear"], t["onnxruntime"], t["noise"]
            rows.append((name, q, o))
            print(f"{name}: qlinear {q:.2f} ms, onnxruntime {o:.2f} ms, ratio {q / o:.2f} "
                  f"(each alone in its own process, median of {args.rounds} round"
                  f"{'s' if args.rounds > 1 else ''}; rounds' spread {nz['ratio_spread']:.0%}"
                  f"{', NOISY' if nz['noisy'] else ''})", flush=True)
    if rows:
        r = [q / o for _, q, o in rows]
        print(f"geometric mean qlinear/onnxruntime: {float(np.exp(np.mean(np.log(r)))):.2f} "
              "(each alone in its own process)")
    return rows


def models(directory: Path | None):
    from qlinear.tools import synthetic

    out = []
    if directory and directory.is_dir():
        for p in sorted(directory.glob("*.onnx")):
            out.append((p.stem, p))
    out.append(("resnet50_qoperator (synthetic)", synthetic.resnet50_qoperator(0)))
    return out


def resnet50_models(which: str) -> list[tuple[str, Path]]:
    """``--resnet50``: issue #31's ResNet-50s as onnxruntime's quantizer writes them
    (benchmarks/resnet50_models.py: QOperator with BatchNormalization folded, kept, and QDQ;
    built once into a cache folder, about 15 s), "all" of them, "none", or a comma list of
    the variant names."""
    if which == "none":
        return []
    try:
        import resnet50_models as rm
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import resnet50_models as rm
    wanted = rm.VARIANTS if which == "all" else tuple(w.strip() for w in which.split(","))
    try:
        return [(v, Path(rm.quantized(v))) for v in wanted]
    except Exception as e:  # noqa: BLE001 - say why and time the others
        print(f"resnet50 models: not built ({type(e).__name__}: {str(e)[:160]})", flush=True)
        return []


def model_inputs(name: str, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """The benchmark's inputs: :func:`_inputs`, except the GPT-2 model, whose token ids must
    index its 1000-row embedding and whose past and mask lengths must agree: 5 new tokens
    after a past of 3."""
    if not name.startswith("tiny_gpt2"):
        return _inputs(model, seed)
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 1000, (1, 5)).astype(np.int32),
             "position_ids": np.arange(3, 8, dtype=np.int32)[None],
             "attention_mask": np.ones((1, 8), np.int32)}
    for i in range(5):
        feeds[f"past_{i}"] = rng.standard_normal((2, 1, 4, 3, 8)).astype(np.float32)
    return feeds


#: The ``--shape`` flags ``qlinear compare`` needs on these models (symbolic dimensions that its
#: default of 1 does not fit: Kaldi's 3-frame kernel, GPT-2's mask spanning past + new tokens).
CLI_SHAPES: dict[str, dict[str, list[int]]] = {
    "kaldi_qtdnn_qlinearconv": {"input": [10, 10]},
    "tiny_gpt2_ortdynamic": {"attention_mask": [1, 2]},
}


def compare_command(name: str) -> str:
    """The ``qlinear compare`` command whose verdict the table shows for ``name``."""
    flags = "".join(f" --shape {k}={'x'.join(map(str, v))}" for k, v in CLI_SHAPES.get(name, {}).items())
    return f"qlinear compare {name}.onnx{flags}"


def cli_inputs(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The inputs ``qlinear compare`` (and ``qlinear run``) generates without ``--input``:
    seed 0, symbolic dimensions 1 unless ``--shape`` (CLI_SHAPES) sets them."""
    from qlinear.tools.model import random_inputs

    return random_inputs(model, seed=0, shapes=CLI_SHAPES.get(name))


def verdicts(name: str, model: onnx.ModelProto, saturates: bool | None) -> tuple[str, str, int]:
    """The table's compare columns, on ``qlinear compare``'s own inputs (``cli_inputs``): the
    worst output verdict with qlinear's exact kernels and with ``--emulate
    onnxruntime-avx2``, and the quantized nodes that differ on onnxruntime's own inputs in the
    run that models this machine's onnxruntime (the emulated one where it saturates, the exact
    one where it is exact). On a CPU where onnxruntime is exact the emulated column says what
    onnxruntime's saturation on AVX2 servers would change (DIFFER there is expected)."""
    from qlinear.tools import compare

    feeds = cli_inputs(name, model)
    kw = dict(timing_runs=1, timing_budget=0.0)
    plain = compare.compare_model(model, feeds, **kw)
    emu = compare.compare_model(model, feeds, emulate="onnxruntime-avx2", **kw)
    chosen = emu if saturates else plain
    own_differ = sum(1 for r in chosen["nodes"] if r.get("own_verdict") == "DIFFER")
    return _verdict_text(plain), _verdict_text(emu), own_differ


def _formats(directory: Path | None) -> dict[str, str]:
    """model stem -> the ``format:`` line of SOURCES.md."""
    out: dict[str, str] = {}
    src = directory / "SOURCES.md" if directory else None
    if src is None or not src.is_file():
        return out
    current = None
    for line in src.read_text().splitlines():
        if line.startswith("## ") and line.endswith(".onnx"):
            current = line[3:-5]
        elif current and line.startswith("- format:"):
            out[current] = line.split(":", 1)[1].strip()
    return out


def _ops_summary(model: onnx.ModelProto, top: int = 5) -> str:
    counts = collections.Counter(n.op_type for n in model.graph.node if n.op_type != "Constant")
    items = [f"{op}×{n}" for op, n in counts.most_common(top)]
    return ", ".join(items) + (", …" if len(counts) > top else "")


def _verdict_text(result: dict) -> str:
    """Worst output verdict, with the largest difference when not identical."""
    v = result["verdict"]
    if v == "identical":
        return "identical"
    worst = [o for o in result["outputs"] if o["verdict"] != "identical"]
    abs_ = max((o.get("max_abs") or 0) for o in worst)
    steps = [o["max_steps"] for o in worst if o.get("max_steps") is not None]
    text = f"{v}, max abs {abs_:.2g}"
    if steps and v == "DIFFER":
        text += f" ({max(steps):g} step{'' if max(steps) == 1 else 's'})"
    return text


def table(directory: Path | None, repeat: int, only: str | None = None, *, rounds: int = 3,
          threads: int = 2, extra: list[str] | None = None) -> list[str]:
    """The docs/models.md table: per model its format, operators, ``qlinear compare``'s
    verdict against onnxruntime's normal session on the command's own inputs (exact kernels,
    and ``--emulate onnxruntime-avx2`` where onnxruntime saturates here), the nodes that
    differ on onnxruntime's own inputs, and warm medians of both engines (``threads`` threads,
    batch 1) on the benchmark's inputs (``model_inputs``), interleaved in this process, and
    each alone in its own process (the default mode, ``rounds`` rounds)."""
    import onnxruntime as ort

    import qlinear.backend as backend
    from qlinear.tools import ortsat

    saturates = ortsat.onnxruntime_saturates()
    formats = _formats(directory)
    lines = ["| model | format | operators | compare | compare --emulate onnxruntime-avx2 | "
             "quantized nodes differing on onnxruntime's inputs | qlinear ms | onnxruntime ms | "
             "ratio | own process: qlinear ms | own process: onnxruntime ms | "
             "own process: ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    ratios, alone_ratios = [], []
    folder = tempfile.mkdtemp(prefix="graphs-")
    for name, src in models(directory):
        if not _wanted(only, name):
            continue
        model = onnx.load(src) if isinstance(src, Path) else src
        plain, emu, own_differ = verdicts(name, model, saturates)
        feeds = model_inputs(name, model)  # timing: the benchmark's inputs (GPT-2: 5 tokens after 3)
        rep = backend.prepare(model)
        sess = ort.InferenceSession(_model_file(src, folder, name), _interleaved_options(threads),
                                    providers=["CPUExecutionProvider"])
        t = _interleaved_ms({"qlinear": lambda: rep.run(feeds),
                             "onnxruntime": lambda: sess.run(None, feeds)}, repeat)
        ratios.append(t["qlinear"] / t["onnxruntime"])
        rep = sess = None  # freed: the processes below have the machine to themselves
        sep = separate_ms(name, _model_file(src, folder, name), repeat, rounds, threads,
                          extra or [])
        alone, ort_alone = sep["qlinear"], sep["onnxruntime"]
        alone_ratios.append(alone / ort_alone)
        fmt = formats.get(name, "QOperator (synthetic, 7-bit weights)" if "synthetic" in name
                          else "?")
        lines.append(f"| {name} | {fmt} | {_ops_summary(model)} | {plain} | {emu} | {own_differ} | "
                     f"{t['qlinear']:.2f} | {t['onnxruntime']:.2f} | {ratios[-1]:.2f} | {alone:.2f} | "
                     f"{ort_alone:.2f} | {alone_ratios[-1]:.2f} |")
        print(lines[-1], flush=True)
    if ratios:
        g = float(np.exp(np.mean(np.log(ratios))))
        ga = float(np.exp(np.mean(np.log(alone_ratios))))
        lines.append(f"\ngeometric mean qlinear/onnxruntime: {g:.2f} interleaved, {ga:.2f} each "
                     "in its own process")
        print(lines[-1])
    shutil.rmtree(folder, ignore_errors=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path("/work/shared/models"))
    ap.add_argument("--repeat", type=int, default=7,
                    help="timed runs per engine (per process in the default mode); default 7")
    ap.add_argument("--rounds", type=int, default=None,
                    help="default mode: pairs of processes, the order alternating; default 3 "
                         "(1 with --smoke)")
    ap.add_argument("--threads", type=int, default=2, help="threads per runtime (default 2)")
    ap.add_argument("--interleaved", action="store_true",
                    help="the second view: both runtimes in this process, one run of each in "
                         "turn, onnxruntime's spinning off")
    ap.add_argument("--smoke", action="store_true",
                    help="the default mode on a one-node QLinearConv model (a quick check)")
    ap.add_argument("--no-amx", action="store_true", help=noamx.HELP)
    ap.add_argument("--profile", action="store_true",
                    help="per operator type and the graph loop's overhead (implies --interleaved)")
    ap.add_argument("--child", choices=("qlinear", "onnxruntime"), help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--name", default="", help=argparse.SUPPRESS)
    ap.add_argument("--only", default=None)
    ap.add_argument("--resnet50", default="all",
                    help="issue #31's quantizer-made ResNet-50s to time besides the models: all (default), "
                         "none, or a comma list of " + ", ".join(("resnet50_qoperator_bnfused",
                                                                  "resnet50_qoperator_bnkept", "resnet50_qdq")))
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="limit NumPy's BLAS threads (threadpoolctl); default: its own setting")
    ap.add_argument("--ops", action="store_true",
                    help="single float operators: onnx.reference, qlinear, onnxruntime")
    ap.add_argument("--overhead", action="store_true",
                    help="per-node overhead of the graph loop (chains of 300 tiny nodes)")
    ap.add_argument("--table", action="store_true",
                    help="the docs/models.md table: format, operators, compare verdicts, times")
    ap.add_argument("--verdicts", action="store_true",
                    help="the compare columns of the docs/models.md table only (no timing)")
    ap.add_argument("--before", action="store_true",
                    help="also time the graph as before qlinear.graph.evaluator: onnx.reference's "
                         "evaluator and float operators, qlinear's kernels for the rest "
                         "(implies --interleaved)")
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 3
    if min(args.repeat, args.rounds, args.threads) < 1:
        ap.error("--repeat, --rounds and --threads must be at least 1")
    if args.blas_threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=args.blas_threads, user_api="blas")
    if args.child:
        return _child(args)
    import onnxruntime as ort

    import qlinear
    import qlinear.backend as backend

    sources = smoke_models() if args.smoke else models(args.models) + resnet50_models(args.resnet50)
    if args.table:
        table(args.models, args.repeat, args.only, rounds=args.rounds, threads=args.threads,
              extra=child_flags(args))
        return 0
    if args.verdicts:
        from qlinear.tools import ortsat

        saturates = ortsat.onnxruntime_saturates()
        print("| model | command | compare | compare --emulate onnxruntime-avx2 | "
              "quantized nodes differing on onnxruntime's inputs |\n|---|---|---|---|---|")
        for name, src in models(args.models):
            if not _wanted(args.only, name):
                continue
            model = onnx.load(src) if isinstance(src, Path) else src
            command = "(built in memory)" if not isinstance(src, Path) else f"`{compare_command(name)}`"
            print(f"| {name} | {command} | " + " | ".join(map(str, verdicts(name, model, saturates))) + " |",
                  flush=True)
        return 0
    if args.ops:
        op_table(args.repeat)
    if args.overhead:
        for op, (q, r) in per_node_overhead().items():
            print(f"per-node overhead, {op:8s}: qlinear {q:5.1f} us, onnx.reference {r:5.1f} us")
    if not (args.interleaved or args.profile or args.before):
        return 0 if separate(args, sources) or not args.smoke else 1
    qlinear.set_num_threads(args.threads)
    rows = []
    for name, src in sources:
        if not _wanted(args.only, name):
            continue
        model = onnx.load(src) if isinstance(src, Path) else src
        try:
            rep = backend.prepare(model)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: not run by qlinear ({type(e).__name__}: {str(e)[:100]})", flush=True)
            continue
        feeds = model_inputs(name, model)
        so = _interleaved_options(args.threads)
        blob = str(src) if isinstance(src, Path) else model.SerializeToString()
        engines = {"qlinear": lambda: rep.run(feeds)}
        try:
            sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
            engines["onnxruntime"] = lambda: sess.run(None, feeds)
            if args.before:
                from onnx.reference import ReferenceEvaluator

                old = ReferenceEvaluator(model, new_ops=backend.KERNELS)
                engines["before"] = lambda: old.run(None, feeds)
            t = _interleaved_ms(engines, args.repeat)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: failed ({type(e).__name__}: {str(e)[:100]})", flush=True)
            continue
        t_q, t_ort = t["qlinear"], t["onnxruntime"]
        rows.append((name, t_q, t_ort))
        before = ""
        if args.before:
            before = f", before {t['before']:.2f} ms ({t['before'] / t_ort:.2f}x)"
        print(f"{name}: qlinear {t_q:.2f} ms, onnxruntime {t_ort:.2f} ms, ratio {t_q / t_ort:.2f}"
              f"{before}", flush=True)
        if args.profile:
            by_type, overhead, counts = profile_nodes(rep, feeds, args.repeat)
            ort_by = ort_profile(blob, feeds, args.repeat)
            from qlinear.graph.kernels.contrib import ContribOp
            from qlinear.graph.kernels.standard import _QLinearOp

            # qlinear's quantized kernels: the six and onnxruntime's (com.microsoft, and the
            # standard DynamicQuantizeLinear computed as onnxruntime computes it)
            quantized = set(SIX_OPS) | {
                n.op_type for n in rep.evaluator.rt_nodes_
                if isinstance(n, (_QLinearOp, ContribOp))}
            six = sum(v for k, v in by_type.items() if k in quantized)
            glue = sum(v for k, v in by_type.items() if k not in quantized)
            total = six + glue + overhead
            print(f"    quantized operators {six:.2f} ms ({six / total:.0%}), "
                  f"other operators {glue:.2f} ms ({glue / total:.0%}), "
                  f"graph loop {overhead:.2f} ms")
            for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]):
                print(f"    {k:24s} x{counts[k]:<4d} {v:9.2f} ms", flush=True)
            print(f"    {'(engine overhead)':24s} {'':5s} {overhead:9.2f} ms "
                  f"({overhead / max(len(rep.evaluator.rt_nodes_), 1) * 1e3:.1f} us/node)")
            print("    onnxruntime kernels: " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(ort_by.items(), key=lambda kv: -kv[1])[:8]))
    if rows:
        r = [q / o for _, q, o in rows]
        print(f"geometric mean qlinear/onnxruntime: {float(np.exp(np.mean(np.log(r)))):.2f} "
              "(interleaved in one process)")
    return 0 if rows or not args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
