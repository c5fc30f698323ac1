"""The ``qlinear`` command: run, compare, conformance, bench, --help, and bad input
(one-line error, exit status 2, no traceback, nothing written outside --output-dir)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from qlinear import cli  # noqa: E402
from qlinear.tools import synthetic  # noqa: E402
from qlinear.tools.quantize import quantize_qoperator  # noqa: E402

EXAMPLE = os.path.join(cli.EXAMPLES_DIR, "digits_cnn_qoperator.onnx")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_bundled_example(capsys):
    rc, out, err = _main(capsys, "run")
    assert rc == 0, err
    assert "probabilities" in out and "[400, 10]" in out and "float32" in out
    assert "accuracy on the 400 bundled samples:" in out
    assert "time: prepare" in out
    assert "onnxruntime: accuracy" in out


def test_run_json(capsys):
    rc, out, _ = _main(capsys, "run", "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["example"] and r["outputs"][0]["name"] == "probabilities"
    assert r["classifier"]["accuracy"] >= 0.95
    assert r["seconds"]["run"] > 0


def test_run_model_with_inputs_and_output_dir(capsys, tmp_path):
    x = np.load(os.path.join(cli.EXAMPLES_DIR, "digits_samples.npz"))["image"][:7]
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    rc, out, err = _main(capsys, "run", EXAMPLE, "--input", f"image={tmp_path / 'x.npy'}",
                         "--output-dir", str(out_dir))
    assert rc == 0, err
    assert sorted(os.listdir(out_dir)) == ["outputs.json", "probabilities.npy"]
    assert np.load(out_dir / "probabilities.npy").shape == (7, 10)
    assert json.load(open(out_dir / "outputs.json"))["outputs"] == [
        {"name": "probabilities", "file": "probabilities.npy", "shape": [7, 10], "dtype": "float32"}]
    assert sorted(os.listdir(tmp_path)) == ["out", "x.npy"]


def test_run_random_inputs_note(capsys):
    rc, out, _ = _main(capsys, "run", EXAMPLE)
    assert rc == 0 and "seeded random inputs" in out and "[1, 1, 8, 8]" in out


def test_output_names_cannot_escape_output_dir(capsys, tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["../../escape"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("../../escape", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    (tmp_path / "m").mkdir()
    onnx.save(m, tmp_path / "m" / "m.onnx")
    out_dir = tmp_path / "m" / "out"
    rc, _, err = _main(capsys, "run", str(tmp_path / "m" / "m.onnx"), "--output-dir", str(out_dir))
    assert rc == 0, err
    assert sorted(os.listdir(out_dir)) == ["_.._escape.npy", "outputs.json"]
    assert sorted(os.listdir(tmp_path)) == ["m"] and sorted(os.listdir(tmp_path / "m")) == ["m.onnx", "out"]


def test_compare_example_diagnoses_saturation(capsys):
    from qlinear.tools.ortsat import onnxruntime_saturates

    if not onnxruntime_saturates():
        pytest.skip("onnxruntime's u8 x s8 kernels are exact on this CPU (probe): nothing to diagnose")
    rc, out, _ = _main(capsys, "compare")
    assert rc == 1
    assert "onnxruntime here: uint8 x int8 kernels saturate 16-bit pair sums (a probe on this machine)" in out
    assert "conv1_quant" in out and "QLinearConv" in out
    assert "onnxruntime 16-bit saturation" in out and "reproduces onnxruntime exactly" in out
    assert "outputs: DIFFER" in out


def test_compare_example_where_onnxruntime_is_exact(capsys):
    """On a CPU where onnxruntime is exact (VNNI), the only differences are Softmax's float
    rounding, within the default tolerance: exit 0."""
    from qlinear.tools.ortsat import onnxruntime_saturates

    if onnxruntime_saturates() is not False:
        pytest.skip("onnxruntime's u8 x s8 kernels saturate on this CPU (probe)")
    rc, out, _ = _main(capsys, "compare")
    assert "onnxruntime here: uint8 x int8 kernels exact" in out
    assert "onnxruntime 16-bit saturation" not in out
    assert rc == 0 and out.rstrip().splitlines()[-1] in ("outputs: identical", "outputs: within tolerance")


def test_compare_emulating_avx2_on_any_cpu(capsys):
    """Emulating onnxruntime-avx2: identical integer nodes where this machine's onnxruntime
    saturates; where it is exact, the saturating convolutions are the ones that differ."""
    from qlinear.tools.ortsat import onnxruntime_saturates

    rc, out, _ = _main(capsys, "compare", "--emulate", "onnxruntime-avx2", "--json")
    r = json.loads(out)
    assert r["emulate"] == "onnxruntime-avx2"
    integer_rows = [row for row in r["nodes"] if row["op"] not in ("Softmax",)]
    if onnxruntime_saturates():
        assert all(row["verdict"] == "identical" for row in integer_rows), integer_rows
        assert rc == 0 and r["verdict"] in ("identical", "within tolerance")
    else:
        conv1 = next(row for row in r["nodes"] if row["node"] == "conv1_quant")
        assert conv1["verdict"] == "DIFFER" and "saturation changes" in conv1["diagnosis"]
        assert rc == 1


def test_compare_json_and_identical_model(capsys, tmp_path):
    rng = np.random.default_rng(0)
    calib = [{"x": rng.normal(size=(2, 8, 32)).astype(np.float32)}]
    m = quantize_qoperator(synthetic.mlp_block(0), calib, reduce_range=True)
    # drop the float Softmax tail so that every tensor is exact in onnxruntime too
    soft = next(n for n in m.graph.node if n.op_type == "Softmax")
    m.graph.node.remove(soft)
    m.graph.output[0].name = soft.input[0]
    onnx.save(m, tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", rng.normal(size=(3, 8, 32)).astype(np.float32))
    rc, out, err = _main(capsys, "compare", str(tmp_path / "mlp.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                         "--json")
    assert rc == 0, (out, err)
    r = json.loads(out)
    assert r["equal"] and r["mismatching_nodes"] == 0
    assert {row["op"] for row in r["nodes"]} >= {"QLinearMatMul", "QuantizeLinear", "DequantizeLinear", "Add"}


def test_conformance_json(capsys):
    rc, out, _ = _main(capsys, "conformance", "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["counts"]["FAIL"] == 0 and r["counts"]["pass"] >= 24
    assert all(set(c) >= {"case", "result"} for c in r["cases"])


def test_conformance_table(capsys):
    rc, out, _ = _main(capsys, "conformance")
    assert rc == 0
    assert out.splitlines()[0].split()[:2] == ["case", "operator"]
    assert "test_qlinearconv" in out and "passed, 0 failed" in out


def test_bench_delegates(monkeypatch, capsys):
    seen = []
    monkeypatch.setitem(sys.modules, "qlinear.tools.bench",
                        types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0))
    rc, _, _ = _main(capsys, "bench", "--quick", "--json")
    assert rc == 0 and seen == [["--quick", "--json"]]


def test_bench_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "qlinear.tools.bench", None)
    rc, out, err = _main(capsys, "bench")
    assert rc == 2 and err.startswith("qlinear: error:") and "qlinear.tools.bench" in err


@pytest.mark.parametrize("command", [[], ["run"], ["compare"], ["conformance"]])
def test_help(capsys, command):
    with pytest.raises(SystemExit) as e:
        cli.main(command + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and "usage: qlinear" in out


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    data = open(EXAMPLE, "rb").read()
    (d / "trunc.onnx").write_bytes(data[: len(data) // 2])
    (d / "trunc_end.onnx").write_bytes(data[:-5])
    (d / "text.onnx").write_text("this is not an onnx model\n")
    corrupt = bytearray(data)
    for i in range(100, 400, 7):
        corrupt[i] ^= 0x5A
    (d / "corrupt.onnx").write_bytes(bytes(corrupt))
    (d / "empty.onnx").write_bytes(b"")
    nodes = [helper.make_node("QLinearReduceMean", ["a", "s", "z", "s", "z"], ["b"],  # no kernel anywhere
                              domain="com.microsoft", name="qadd"),
             helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q_half"),  # x, y_scale: one type at 21
             helper.make_node("FooBar", ["x"], ["y"], name="foo")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT16, [2]),
                                       helper.make_tensor_value_info("a", T.UINT8, [2])],
                          [helper.make_tensor_value_info(o, T.FLOAT, [2]) for o in "bqy"],
                          [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(1), "z"),
                           numpy_helper.from_array(np.float16(0.1), "sh")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]),
              d / "unsupported.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 99)]), d / "opset99.onnx")
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    for k, v in [("location", "../outside.bin"), ("offset", "0"), ("length", "16")]:
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "external.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [100000, 100000])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "huge.onnx")
    qmm = helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"])
    g = helper.make_graph([qmm], "g", [helper.make_tensor_value_info("a", T.UINT8, [3, 4])],
                          [helper.make_tensor_value_info("y", T.UINT8, [3, 2])],
                          [numpy_helper.from_array(v, n) for v, n in [
                              (np.array([[0.1], [0.2], [0.3]], np.float32), "as"),
                              (np.array([[3], [4], [5]], np.uint8), "azp"), (np.ones((4, 2), np.int8), "b"),
                              (np.array(0.1, np.float32), "bs"), (np.array(0, np.int8), "bzp"),
                              (np.array(0.3, np.float32), "ys"), (np.array(4, np.uint8), "yzp")]])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "per_row.onnx")
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", T.FLOAT, [2]),
                           helper.make_tensor_value_info("b", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "two_inputs.onnx")
    np.save(d / "two.npy", np.zeros(2, np.float32))
    (d / "outside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    (d / "sub").mkdir()
    os.symlink(d / "outside.bin", d / "sub" / "link.bin")
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    for k, v in [("location", "link.bin"), ("offset", "0"), ("length", "16")]:
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "sub" / "symlink.onnx")
    np.save(d / "f64.npy", np.zeros((3, 1, 8, 8)))
    np.save(d / "shape.npy", np.zeros((3, 1, 9, 8), np.float32))
    np.save(d / "ok.npy", np.zeros((3, 1, 8, 8), np.float32))
    return d


BAD = [
    (["run", "{d}/missing.onnx"], "no such file"),
    (["run", "{d}"], "is a directory"),
    (["run", "{d}/text.onnx"], "not an ONNX model"),
    (["run", "{d}/empty.onnx"], "empty file"),
    (["run", "{d}/trunc.onnx"], "truncated"),
    (["run", "{d}/trunc_end.onnx"], "truncated"),
    (["compare", "{d}/corrupt.onnx"], "corrupt"),
    (["run", "{d}/unsupported.onnx"], "3 unsupported nodes: "),
    (["run", "{d}/unsupported.onnx"], "FooBar ×1 (no such operator in opset 21; e.g. node 'foo')"),
    (["run", "{d}/opset99.onnx"], "imports ai.onnx opset 99"),
    (["run", "{d}/external.onnx"], "points outside the model's folder"),
    (["run", "{d}/huge.onnx"], "more than the limit"),
    (["run", EXAMPLE, "--max-tensor-bytes", "1000"], "more than the limit"),
    (["run", EXAMPLE, "--input", "image"], "expected NAME=FILE.npy"),
    (["run", EXAMPLE, "--input", "=x.npy"], "expected NAME=FILE.npy"),
    (["run", EXAMPLE, "--input", "image={d}/nope.npy"], "no such file"),
    # a folder or a device is there, not missing (both said "no such file")
    (["run", EXAMPLE, "--input", "image={d}/sub"], "--input image: {d}/sub: not a regular file"),
    (["run", EXAMPLE, "--input", "image=/dev/zero"], "--input image: /dev/zero: not a regular file"),
    (["run", EXAMPLE, "--input", "{d}/sub.npz"], "--input {d}/sub.npz: no such file"),
    (["run", EXAMPLE, "--input", "image={d}/text.onnx"], "not a NumPy"),
    (["run", EXAMPLE, "--input", "images={d}/ok.npy"], "unknown input 'images'"),
    (["run", EXAMPLE, "--input", "image={d}/f64.npy"], "dtype float64"),
    (["run", EXAMPLE, "--input", "image={d}/shape.npy"], "shape [3, 1, 9, 8]"),
    (["run", EXAMPLE, "--input", "image={d}/ok.npy", "--input", "image={d}/ok.npy"], "given twice"),
    (["run", "--input", "image={d}/ok.npy"], "needs a MODEL"),
    (["run", "--bogus"], "unrecognized arguments"),
    (["run", "{d}/two_inputs.onnx", "--input", "a={d}/two.npy"], "missing input 'b'"),
    (["run", "{d}/sub/symlink.onnx"], "points outside the model's folder"),
    (["compare", "{d}/per_row.onnx"], "onnxruntime cannot run this model"),
    (["frobnicate"], "invalid choice"),
    (["run", EXAMPLE, "--emulate", "onnxruntime-avx512"], "invalid choice"),
    (["compare", EXAMPLE, "--atol", "nan"], "--atol must be 0 or more"),
    (["run", EXAMPLE, "--output-dir", "{d}/ok.npy"], "not a directory"),
]


@pytest.mark.parametrize("argv,fragment", BAD, ids=[" ".join(a).replace("{d}/", "") for a, _ in BAD])
def test_bad_input_one_line_exit_2(capsys, bad_files, argv, fragment):
    before = sorted(os.listdir(bad_files))
    argv = [a.replace("{d}", str(bad_files)) for a in argv]
    fragment = fragment.replace("{d}", str(bad_files))
    rc, out, err = _main(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qlinear: error: "), err
    assert fragment in lines[0]
    assert "Traceback" not in err
    assert sorted(os.listdir(bad_files)) == before


def test_per_row_model_runs_in_qlinear(capsys, bad_files):
    """The model onnxruntime refuses above (per-row a parameters) runs here."""
    rc, out, err = _main(capsys, "run", str(bad_files / "per_row.onnx"), "--json")
    assert rc == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [3, 2]


def test_external_data_inside_folder(capsys, tmp_path):
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    rc, out, err = _main(capsys, "run", str(tmp_path / "ext.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                         "--output-dir", str(tmp_path / "out"))
    assert rc == 0, err
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), np.arange(1, 5, dtype=np.float32))


def test_python_dash_m(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "qlinear", "run", "--json"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["classifier"]["samples"] == 400
    assert os.listdir(tmp_path) == []
    p = subprocess.run([sys.executable, "-m", "qlinear", "run", "nothere.onnx"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and p.stderr == "qlinear: error: nothere.onnx: no such file\n"


def test_compare_ulp_tolerance_for_float_tail(capsys, tmp_path):
    rng = np.random.default_rng(1)
    m = quantize_qoperator(synthetic.mlp_block(0), [{"x": rng.normal(size=(2, 8, 32)).astype(np.float32)}],
                           reduce_range=True)
    onnx.save(m, tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", rng.normal(0, 3, size=(4, 8, 32)).astype(np.float32))
    args = ["compare", str(tmp_path / "mlp.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--json"]
    rc, out, _ = _main(capsys, *args, "--ulp", "8", "--atol", "0", "--rtol", "0")
    assert rc == 0, out
    r = json.loads(out)
    assert r["verdict"] in ("identical", "within tolerance") and r["tolerance"]["ulp"] == 8
    assert all(row["verdict"] != "DIFFER" for row in r["nodes"])
    for flag in ("--ulp", "--atol", "--rtol"):
        rc, out, err = _main(capsys, *args[:-1], flag, "-1")
        assert rc == 2 and flag in err and out == ""


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 7

from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
import qlinear.backend as qb  # noqa: E402


F = np.float32


def _external_model(folder, location="weights/w.bin"):
    w = nh.from_array(np.arange(16, dtype=F).reshape(4, 4), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(m, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


@pytest.mark.parametrize("missing", ["folder", "file"])
def test_missing_external_data_names_the_expected_path(capsys, tmp_path, monkeypatch, missing):
    """regression: A model whose external data folder (or file) is missing: the CLI said only "external
    data file 'weights/w.bin' not found" and prepare(path) passed on onnx's ValidationError;
    both now name the absolute path the model expects, the model's folder it is read from
    (whatever the current directory) and what to do."""
    import shutil

    from qlinear.cli import main

    _external_model(tmp_path / "m")
    if missing == "folder":
        shutil.rmtree(tmp_path / "m" / "weights")
    else:
        (tmp_path / "m" / "weights" / "w.bin").unlink()
    want = str(tmp_path / "m" / "weights" / "w.bin")
    monkeypatch.chdir(tmp_path)  # a relative path from elsewhere: the data is still the model folder's
    for cmd in ("run", "inspect", "compare"):
        assert main([cmd, "m/model.onnx"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("qlinear: error: "), err
        assert "tensor 'w'" in err and "'weights/w.bin'" in err and want in err, err
        assert str(tmp_path / "m") in err and "model's folder" in err, err
        if missing == "folder":
            assert f"folder {tmp_path / 'm' / 'weights'} does not exist" in err, err
    with pytest.raises(ValueError) as e:
        qb.prepare("m/model.onnx")
    msg = str(e.value)
    assert msg.startswith("prepare: ") and "tensor 'w'" in msg and want in msg, msg


def test_external_data_read_relative_to_the_model_from_any_directory(tmp_path, monkeypatch):
    """regression: found by new-user QA round 7."""
    path = _external_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    x = np.ones((1, 4), F)
    want = x @ np.arange(16, dtype=F).reshape(4, 4)
    np.testing.assert_array_equal(qb.prepare("m/model.onnx").run({"x": x})[0], want)
    np.testing.assert_array_equal(qb.prepare(path).run({"x": x})[0], want)


# ----------------------------------------------------------------------------- regressions
# found by new-user QA round 8 (Intel Xeon, AVX-512 VNNI and AMX)


def test_run_with_emulation_on_an_exact_cpu_says_why_values_differ(monkeypatch, capsys):
    """regression: On a CPU where onnxruntime is exact (the Xeon), `qlinear run --emulate onnxruntime-avx2`
    said 'its uint8 x int8 kernels are exact' and then agreed with onnxruntime on 391/400
    predictions without saying why; where onnxruntime saturates the line says 'qlinear emulates
    that'. The line now says the emulated saturation is the difference."""
    pytest.importorskip("onnxruntime")
    from qlinear import cli
    from qlinear.tools import ortsat

    monkeypatch.setenv(ortsat.PROBE_ENV, "0")
    assert cli.main(["run", "--emulate", "onnxruntime-avx2"]) == 0
    out = capsys.readouterr().out
    assert ("onnxruntime here: its uint8 x int8 kernels are exact (set by QLINEAR_ORT_SATURATES=0); qlinear "
            "emulates their saturation on AVX2 CPUs without VNNI, so the values differ where it saturates") in out
    assert cli.main(["run"]) == 0
    out = capsys.readouterr().out
    assert "kernels are exact (set by QLINEAR_ORT_SATURATES=0)\n" in out
