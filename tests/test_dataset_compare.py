"""qlinear compare --dataset: streamed datasets, exact merging, the same report whatever the
workers (1 process, 2 processes, a lost worker replaced, Ray), one-line errors naming the file."""

from __future__ import annotations

import json
import math
import os
import random
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as T, helper  # noqa: E402

import qlinear  # noqa: E402
from qlinear import cli  # noqa: E402
from qlinear.tools import dataset as D  # noqa: E402
from qlinear.tools.sweep import ExactSum, Tally  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(qlinear.__file__), "examples")
EXAMPLE = os.path.join(EXAMPLES, "digits_cnn_qoperator.onnx")


def _digits(n):
    d = np.load(os.path.join(EXAMPLES, "digits_samples.npz"))
    return d["image"][:n], d["label"][:n]


def _main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _report(capsys, *argv):
    rc, out, err = _main(capsys, *argv, "--json")
    assert rc in (0, 1), err
    r = json.loads(out)
    run = r.pop("run")
    return r, run, json.dumps(r, sort_keys=True)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    x, y = _digits(24)
    np.savez(tmp / "d.npz", image=x)
    np.save(tmp / "labels.npy", y)
    return str(tmp / "d.npz"), str(tmp / "labels.npy")


def test_exact_sum_is_order_independent():
    rng = np.random.default_rng(0)
    values = list(rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000))
    sums = []
    for seed in range(3):
        random.Random(seed).shuffle(values)
        parts = [ExactSum() for _ in range(5)]
        for i, v in enumerate(values):
            parts[i % 5].add(v)
        total = ExactSum()
        for p in parts:
            total.merge(p)
        sums.append(total.value())
    assert sums[0] == sums[1] == sums[2] == math.fsum(values)
    assert sum(values) != math.fsum(values) or True  # (a plain sum may differ: that is the point)


def test_tallies_merge_exactly_in_any_order(digits):
    """One tally over 12 samples equals the merge of per-sample tallies in any order."""
    from qlinear.tools import workers as W

    w = W.Worker(W.Job(model=EXAMPLE, dataset=digits[0], labels=digits[1]))
    whole = w.run(0, 12).report(total_samples=12, labels=True, has_float=False)
    pieces = [w.run(i, i + 1) for i in range(12)]
    for seed in range(2):
        random.Random(seed).shuffle(pieces)
        merged = Tally()
        for p in pieces:
            merged.merge(p)
        assert json.dumps(merged.report(total_samples=12, labels=True, has_float=False),
                          sort_keys=True) == json.dumps(whole, sort_keys=True)


def test_report_identical_for_one_and_two_workers_and_a_lost_worker(capsys, digits, tmp_path,
                                                                   monkeypatch):
    data, labels = digits
    r1, run1, text1 = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--labels", labels,
                              "--workers", "1")
    _, run2, text2 = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--labels", labels,
                             "--workers", "2")
    assert text1 == text2
    assert run1["workers"] == 1 and run2["workers"] == 2 and run2["on"] == "processes"
    assert r1["samples"] == 24 and r1["accuracy"]["samples"] == 24
    assert sum(r1["outputs"][0][k] for k in ("identical", "within_tolerance", "differ")) == 24
    # a worker killed while comparing sample 5: its shard runs again, the report is the same
    monkeypatch.setenv("QLINEAR_TEST_LOSE_WORKER_AT", f"5:{tmp_path / 'lost'}")
    _, run3, text3 = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--labels", labels,
                             "--workers", "2")
    assert os.path.exists(tmp_path / "lost") and run3["restarts"] == 1
    assert text3 == text1


def test_report_identical_on_ray(capsys, digits):
    """On a local Ray instance (2 CPUs, 2 actors): the same report as one process. (Ray
    restarts a lost actor and retries its shard itself, max_restarts / max_task_retries; with
    an actor killed the run takes over a minute on 2 busy cores, so it is not in the suite.)"""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'qlinear[scale]')")
    data, labels = digits
    _, _, text1 = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--labels", labels,
                          "--workers", "1")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        _, run, text = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--labels", labels,
                               "--workers", "2", "--ray")
    finally:
        if started:
            ray.shutdown()
    assert run["on"] == "ray" and run["workers"] == 2 and text == text1


def test_folder_and_single_file_forms_agree(capsys, tmp_path):
    x, y = _digits(6)
    folder = tmp_path / "f"
    folder.mkdir()
    for i in range(6):
        np.savez(folder / f"s{i:03d}.npz", image=x[i:i + 1])
    np.savez_compressed(tmp_path / "c.npz", image=x[:, None])  # (N, *input shape): batches of 1
    texts = []
    for data in (str(folder), str(tmp_path / "c.npz")):
        r, _, _ = _report(capsys, "compare", EXAMPLE, "--dataset", data, "--workers", "1")
        r.pop("dataset")
        texts.append(json.dumps(r, sort_keys=True))
    assert texts[0] == texts[1]


def test_single_npz_is_read_sample_by_sample(tmp_path):
    x = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    np.savez(tmp_path / "s.npz", x=x)
    np.savez_compressed(tmp_path / "c.npz", x=x)
    req = {"x": (np.dtype(np.float32), [None, 4])}
    stored, comp = D.open_dataset(str(tmp_path / "s.npz"), req), D.open_dataset(str(tmp_path / "c.npz"), req)
    assert stored.members["x"].file is not None  # positioned reads inside the zip
    assert comp.members["x"].file is None and comp.members["x"].mapped is None  # a stream
    np.savez(tmp_path / "f.npz", x=np.asfortranarray(x))
    fortran = D.open_dataset(str(tmp_path / "f.npz"), req)
    assert fortran.members["x"].mapped is not None  # strided samples: memory-mapped
    for i in (0, 3, 1, 4, 4, 2):  # backwards too: the stream is reopened
        for ds in (stored, comp, fortran):
            np.testing.assert_array_equal(ds.sample(i)["x"], x[i:i + 1])


def _bad(capsys, data, *extra):
    rc, out, err = _main(capsys, "compare", EXAMPLE, "--dataset", data, "--workers", "1", *extra)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("qlinear: error: "), err
    assert "Error:" not in err, err  # the sentence alone, no exception class name
    return err


def test_bad_datasets_are_one_line_naming_the_file(capsys, tmp_path):
    x, y = _digits(3)
    f = tmp_path / "f"
    f.mkdir()
    assert "empty" in _bad(capsys, str(f))
    np.savez(f / "a.npz", image=x[:1])
    np.savez(f / "b.npz", image=x[:1].astype(np.float64))  # float64 for a float32 input
    err = _bad(capsys, str(f))  # the first sample passes, the second is refused while running
    assert "b.npz" in err and "float64" in err and "float32" in err
    rc, out, err2 = _main(capsys, "compare", EXAMPLE, "--dataset", str(f), "--workers", "2")
    assert rc == 2 and err2 == err  # from a worker process: the same line
    os.remove(f / "b.npz")
    np.savez(f / "b.npz", image=x[:1, :, :4])
    err = _bad(capsys, str(f))
    assert "b.npz" in err and "[1, 1, 4, 8]" in err
    os.remove(f / "b.npz")
    np.savez(f / "b.npz", picture=x[:1])
    err = _bad(capsys, str(f))
    assert "b.npz" in err and "'picture'" in err
    os.remove(f / "b.npz")
    (f / "b.npz").write_bytes(b"PK\x03\x04 not really a zip")
    err = _bad(capsys, str(f))
    assert "b.npz" in err and "not a NumPy .npy/.npz file" in err
    os.remove(f / "b.npz")
    (f / "notes.txt").write_text("hi")
    err = _bad(capsys, str(f))
    assert "notes.txt" in err and "nothing is skipped" in err
    np.savez(tmp_path / "one.npz", image=x, extra=x)
    assert "'extra'" in _bad(capsys, str(tmp_path / "one.npz"))
    np.savez(tmp_path / "one.npz", image=x.astype(np.float64))
    assert "float64" in _bad(capsys, str(tmp_path / "one.npz"))
    np.savez(tmp_path / "one.npz", image=x[:, 0, :3])
    assert "one.npz" in _bad(capsys, str(tmp_path / "one.npz"))
    np.savez(tmp_path / "one.npz", image=x)
    raw = (tmp_path / "one.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    assert "trunc.npz" in _bad(capsys, str(tmp_path / "trunc.npz"))
    np.save(tmp_path / "labels.npy", y[:2])
    assert "2 labels for 3 samples" in _bad(capsys, str(tmp_path / "one.npz"), "--labels",
                                            str(tmp_path / "labels.npy"))
    assert "needs a" not in _bad(capsys, str(tmp_path / "missing.npz"))


def test_flags_without_dataset_and_conflicting_flags(capsys, digits):
    rc, _, err = _main(capsys, "compare", EXAMPLE, "--workers", "2")
    assert rc == 2 and "--workers goes with --dataset" in err
    rc, _, err = _main(capsys, "compare", EXAMPLE, "--dataset", digits[0], "--seed", "3")
    assert rc == 2 and "--seed cannot be combined with --dataset" in err
    rc, _, err = _main(capsys, "compare", EXAMPLE, "--dataset", digits[0], "--workers", "0")
    assert rc == 2 and "--workers 0" in err


def test_ray_and_matplotlib_missing_are_one_line(capsys, digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    rc, _, err = _main(capsys, "compare", EXAMPLE, "--dataset", digits[0], "--ray")
    assert rc == 2 and "'ray'" in err and "qlinear[scale]" in err and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = _main(capsys, "compare", EXAMPLE, "--dataset", digits[0], "--plot", "x.png")
    assert rc == 2 and "matplotlib" in err and err.count("\n") == 1


def _float_and_qdq(tmp_path):
    """A float Conv model and its QDQ copy, named as onnxruntime's quantizer names tensors."""
    rng = np.random.default_rng(5)
    w = rng.uniform(-0.5, 0.5, (3, 2, 3, 3)).astype(np.float32)
    xin = helper.make_tensor_value_info("x", T.FLOAT, ["n", 2, 5, 5])
    out = helper.make_tensor_value_info("y", T.FLOAT, ["n", 3, 5, 5])
    fl = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1] * 4),
         helper.make_node("Relu", ["conv"], ["y"])], "f", [xin], [out],
        [onnx.numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 13)])
    ws = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / ws), -127, 127).astype(np.int8)
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in (
        (wq, "w_q"), (np.float32(ws), "ws"), (np.int8(0), "wz"), (np.float32(0.01), "xs"),
        (np.uint8(128), "xz"), (np.float32(0.02), "cs"), (np.uint8(100), "cz"))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_QuantizeLinear_Output"]),
             helper.make_node("DequantizeLinear", ["x_QuantizeLinear_Output", "xs", "xz"],
                              ["x_DequantizeLinear_Output"]),
             helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_DequantizeLinear_Output"]),
             helper.make_node("Conv", ["x_DequantizeLinear_Output", "w_DequantizeLinear_Output"],
                              ["conv"], pads=[1] * 4),
             helper.make_node("QuantizeLinear", ["conv", "cs", "cz"], ["conv_QuantizeLinear_Output"]),
             helper.make_node("DequantizeLinear", ["conv_QuantizeLinear_Output", "cs", "cz"],
                              ["conv_DequantizeLinear_Output"]),
             helper.make_node("Relu", ["conv_DequantizeLinear_Output"], ["y"])]
    q = helper.make_model(helper.make_graph(nodes, "q", [xin], [out], inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(fl, tmp_path / "f.onnx")
    onnx.save(q, tmp_path / "q.onnx")
    return str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")


def test_sqnr_against_the_float_model_is_the_whole_datasets_figure(capsys, tmp_path):
    """SQNR = 10 log10(sum f^2 / sum (f - q)^2) over every sample (not a mean of per-sample
    figures), for the tensors matched by name and by X_DequantizeLinear_Output -> X."""
    import onnxruntime as ort

    fpath, qpath = _float_and_qdq(tmp_path)
    x = np.random.default_rng(2).uniform(-1, 1, (7, 1, 2, 5, 5)).astype(np.float32)
    x[3] *= 0.05  # samples of very different size: a mean of per-sample SQNRs would differ
    np.savez(tmp_path / "d.npz", x=x)
    r, _, _ = _report(capsys, "compare", qpath, "--dataset", str(tmp_path / "d.npz"),
                      "--float", fpath, "--qdq", "literal", "--workers", "1")
    rows = {row["node"] or row["op"]: row for row in r["nodes"]}
    sq = {s["tensor"]: s for row in r["nodes"] for s in row.get("sqnr", [])}
    assert sq["conv_DequantizeLinear_Output"]["float_tensor"] == "conv"
    assert sq["conv"]["float_tensor"] == "conv"
    f = ort.InferenceSession(fpath)
    exposed = onnx.load(qpath)
    exposed.graph.output.append(helper.make_tensor_value_info("conv_DequantizeLinear_Output", T.FLOAT, None))
    q = qlinear.backend.prepare(exposed, qdq="literal")
    fo = onnx.load(fpath)
    fo.graph.output.append(helper.make_tensor_value_info("conv", T.FLOAT, None))
    fs = ort.InferenceSession(fo.SerializeToString())
    sig = noise = 0.0
    for i in range(7):
        fconv = fs.run(["conv"], {"x": x[i]})[0].astype(np.float64)
        qconv = q.run({"x": x[i]})[1].astype(np.float64)
        sig += float(np.sum(fconv ** 2))
        noise += float(np.sum((fconv - qconv) ** 2))
    want = 20 * math.log10(math.sqrt(sig) / math.sqrt(noise))
    assert abs(sq["conv_DequantizeLinear_Output"]["qlinear_db"] - want) < 1e-4
    assert r["top1"]["predictions"] == 7 * 3 * 5  # argmax over the last axis, per row
    assert rows  # every node has a row
    del f


def test_plot_is_a_png(capsys, digits, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (qlinear[bench])")
    rc, out, err = _main(capsys, "compare", EXAMPLE, "--dataset", digits[0], "--workers", "1",
                         "--plot", str(tmp_path / "p.png"))
    assert rc == 0, err
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'p.png'}" in out


def test_readme_dataset_example_runs(tmp_path):
    """The README's shell commands for --dataset run as written (qlinear as python -m qlinear)."""
    import re
    import shlex
    import subprocess

    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    block = re.search(r"```sh\n(.*?)```", readme[readme.index("Over a dataset"):], flags=re.S).group(1)
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and "--dataset" in commands[1]
    for c in commands:
        argv = shlex.split(c)
        argv = [sys.executable] + (["-m", "qlinear"] + argv[1:] if argv[0] == "qlinear" else argv[1:])
        if "--plot" in argv:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                i = argv.index("--plot")
                del argv[i:i + 2]
        out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
    assert "accuracy with --labels: qlinear 98.50% (394/400)" in out.stdout


def test_kept_diagnosis_evaluators_change_nothing(digits):
    """The single-node evaluators a worker keeps across samples give the diagnoses a fresh
    evaluator gives (here with the emulation, which makes the convolutions differ on VNNI CPUs
    and agree where onnxruntime saturates: diagnoses either way)."""
    from qlinear.tools import workers as W

    reports = []
    for keep in (True, False):
        w = W.Worker(W.Job(model=EXAMPLE, dataset=digits[0], emulate="onnxruntime-avx2"))
        if not keep:
            w.comparison._evaluators = None
        else:
            assert w.comparison._evaluators == {}
        reports.append(json.dumps(w.run(0, 6).report(total_samples=6, labels=False, has_float=False),
                                  sort_keys=True))
        if keep:
            assert w.comparison._evaluators  # kept and reused
            diagnosed = [n for n in json.loads(reports[0])["nodes"] if n["diagnoses"]]
            assert diagnosed
    assert reports[0] == reports[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")
@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_a_large_npz_is_never_loaded_whole(tmp_path, compressed):
    """Reading every sample of a 96 MiB .npz (stored: positioned reads; compressed: a stream)
    raises the peak resident memory by far less than the file: about one sample (1 MiB)."""
    import subprocess

    sys.path.insert(0, os.path.dirname(__file__))
    import rss_probe

    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 512, 512), dtype=np.float32)  # 96 samples of 1 MiB
    path = tmp_path / "big.npz"
    (np.savez_compressed if compressed else np.savez)(path, x=x)
    del x
    child = rss_probe.PRELUDE + f"""
import numpy as np
from qlinear.tools.dataset import open_dataset
ds = open_dataset({str(path)!r}, {{"x": (np.dtype(np.float32), [None, 1, 512, 512])}})
before = reset_peak()
total = 0.0
for i in range(ds.size):
    total += float(ds.sample(i)["x"][0, 0, 0, 0])
print(status_kib("VmHWM") - before)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 24 * 1024, f"peak grew by {grown_kib} KiB reading a 96 MiB dataset"


def _huge_header_npz(path, name, shape):
    """An .npz of a few hundred bytes whose member declares ``shape`` float32."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.npy", buf.getvalue() + b"\0" * 64)


def test_a_header_declaring_terabytes_is_refused_before_allocating(capsys, tmp_path):
    """A sample whose header declares 4 TiB (a few hundred bytes on disk) is one line, in both
    forms, nothing allocated (NumPy would allocate what the header declares)."""
    f = tmp_path / "f"
    f.mkdir()
    _huge_header_npz(f / "a.npz", "image", (1 << 40, 1, 8, 8))
    err = _bad(capsys, str(f))
    assert "a.npz" in err and "declares" in err
    _huge_header_npz(tmp_path / "one.npz", "image", (1 << 40, 1, 8, 8))
    err = _bad(capsys, str(tmp_path / "one.npz"))
    assert "one.npz" in err and "declares" in err and "truncated or corrupt" in err
    _huge_header_npz(tmp_path / "row.npz", "image", (2, 1 << 20, 1 << 20))  # one sample: 4 TiB
    err = _bad(capsys, str(tmp_path / "row.npz"))
    assert "row.npz" in err and "limit" in err
