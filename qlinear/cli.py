"""The ``qlinear`` command: run, compare, inspect, conformance, bench.

    qlinear run                       # the bundled quantized digits classifier
    qlinear run model.onnx --input x=x.npy --output-dir out/
    qlinear run --emulate onnxruntime-avx2          # onnxruntime's results on AVX2 CPUs
    qlinear compare model.onnx --input x=x.npy      # exit 1 when outputs DIFFER
    qlinear compare model.onnx --dataset val/ --labels y.npy --workers 2   # a whole dataset
    qlinear inspect model.onnx        # inputs, outputs, operators, what qlinear supports
    qlinear --version
    qlinear conformance               # ONNX's backend node tests for the operators
    qlinear bench                     # the speed suite (qlinear.tools.bench)

Bad input (missing or broken model, unsupported operators, wrong inputs) prints one line
``qlinear: error: ...`` and exits with status 2. Set QLINEAR_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import textwrap
import threading

import numpy as np

import qlinear
from qlinear.tools.commands.common import EXAMPLE_META, EXAMPLES_DIR, CommandError  # noqa: F401 (EXAMPLE*: re-exported)
from qlinear.tools.ortsat import forced


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``qlinear: error: ...``, exit 2)."""

    def error(self, message):  # noqa: D102
        raise CommandError(f"{message} (see '{self.prog} --help')")


# --------------------------------------------------------------------------- bench


def cmd_bench(args) -> int:
    try:
        bench = importlib.import_module("qlinear.tools.bench")
    except ImportError as e:
        if getattr(e, "name", "") in ("qlinear.tools.bench", "qlinear.tools", "qlinear"):
            raise CommandError("the benchmark suite (qlinear.tools.bench) is not installed in this "
                         "copy of qlinear") from None
        raise
    rc = bench.main(list(args.bench_args))
    return int(rc or 0)


# --------------------------------------------------------------------------- timeout


class _Timeout(BaseException):
    """``--timeout`` expired. A BaseException, as KeyboardInterrupt: the loaders' broad
    ``except Exception`` (which turn a library's failure into 'corrupt file') must not catch
    it and report a slow file as a corrupt one."""


class _time_limit:
    """``--timeout``: a SIGALRM interrupts the whole command (loading, preparing, running)
    between two Python steps (a node, a Loop iteration), so a model that computes forever
    ends with one line instead of a hang. The one step that could expand without bound in C++
    out of its reach, inlining model-local functions, is bounded before it starts
    (qlinear._inline)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        # signals reach the main thread only; elsewhere (an embedding program) no time limit
        self.active = bool(seconds) and hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.active:
            def stop(signum, frame):
                raise _Timeout(f"stopped after --timeout {self.seconds:g} s: the model was "
                               "still being loaded, prepared or run (a Loop or recursion that "
                               "does not end?)")

            self._old = signal.signal(signal.SIGALRM, stop)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
        return False


# --------------------------------------------------------------------------- parser


def _add_model_args(p, what: str) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL.onnx",
                   help=f"the ONNX model to {what} (default: the bundled digits example)")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input tensor from a .npy (or .npz) file, or FILE.npz holding every "
                        "input by name (as --save-inputs writes); repeat for each input. "
                        "Without any, seeded random inputs of the declared shapes are used")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMxDIM...",
                   help="shape of a generated input, fixing its symbolic dimensions (e.g. "
                        "images=1x3x224x224); repeat for each input. Without it, symbolic "
                        "dimensions are 1")
    p.add_argument("--save-inputs", metavar="DIR",
                   help="write the inputs used to DIR/inputs.npz, to repeat the run with "
                        "--input DIR/inputs.npz")
    p.add_argument("--max-tensor-bytes", type=int, default=None, metavar="N",
                   help="refuse models declaring a tensor larger than N bytes, and stop before "
                        "an operator computes one (default 2 GiB)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop with an error when running takes longer (default: no limit)")
    p.add_argument("--qdq", choices=("fuse", "literal"), default="fuse",
                   help="QDQ models: 'fuse' (default) runs DequantizeLinear -> op -> "
                        "QuantizeLinear groups on integer kernels as onnxruntime's CPU session "
                        "does; 'literal' runs the graph as written (docs/qdq.md)")
    p.add_argument("--qdq-accuracy", type=int, choices=(0, 1, 2, 3, 4), default=None, metavar="LEVEL",
                   help="accuracy_level of the MatMulNBits nodes that weight-only DequantizeLinear -> "
                        "MatMul groups become under --qdq fuse, as onnxruntime's "
                        "session.qdq_matmulnbits_accuracy_level (0-4; default 4, its default: int8 "
                        "activations; 0 or 1: float32)")


def _add_emulate_arg(p) -> None:
    try:
        from qlinear.backend import EMULATIONS
    except ImportError:  # a plain install without onnx: --help still works, and running says
        EMULATIONS = None  # how to install the tools (main's error handler)

    p.add_argument("--emulate", choices=EMULATIONS, default=None, metavar="TARGET",
                   help="compute what TARGET computes instead of the exact results, on any CPU; "
                        "onnxruntime-avx2: onnxruntime on x86 CPUs with AVX2 and without VNNI, "
                        "whose uint8 x int8 kernels saturate 16-bit pair sums")


def _version() -> str:
    return f"qlinear {qlinear.__version__}"


def _wrap(text: str) -> str:
    return textwrap.fill(text, 79)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="qlinear", formatter_class=fmt,
        description="Run and check quantized ONNX models with qlinear's exact integer kernels.",
        epilog="examples:\n  qlinear run\n  qlinear compare model.onnx --input x=x.npy\n"
               "  qlinear inspect model.onnx\n  qlinear conformance\n  qlinear bench\n\nqlinear COMMAND --help explains each "
               "command.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "run", formatter_class=fmt, help="run a model (default: the bundled example)",
        description=_wrap("Run a model with qlinear's backend and print each output's name, shape, "
                    "dtype, a summary and the time taken. Without MODEL, runs the bundled "
                    "quantized 8x8-digits classifier on its 400 bundled test images and reports "
                    "its accuracy (and onnxruntime's agreement, if onnxruntime is installed)."),
        epilog="examples:\n  qlinear run\n  qlinear run model.onnx --input images=batch.npy "
               "--output-dir out/\n  qlinear run model.onnx --json\n"
               "  qlinear run model.onnx --shape images=1x3x224x224 --save-inputs in/\n"
               "  qlinear run model.onnx --input in/inputs.npz --timeout 60")
    _add_model_args(p, "run")
    p.add_argument("--output-dir", metavar="DIR",
                   help="save every output as DIR/NAME.npy, names made distinct, with a manifest "
                        "DIR/outputs.json mapping output names to files (nothing is written "
                        "elsewhere)")
    _add_emulate_arg(p)
    p.set_defaults(func="run")

    p = sub.add_parser(
        "compare", formatter_class=fmt, help="compare qlinear and onnxruntime node by node",
        description=_wrap("Run the model in qlinear and in onnxruntime. The model's outputs are "
                    "compared with onnxruntime's normal session (default graph optimizations, "
                    "what users deploy); one row per node compares qlinear's intermediates with "
                    "an onnxruntime run exposing every intermediate: operator, elements, "
                    "mismatching elements, verdict, largest difference (quantization steps for "
                    "integer tensors; absolute, relative and ulps for floats) and a diagnosis - "
                    "in particular whether onnxruntime's 16-bit saturation in its uint8 x int8 "
                    "kernels explains the difference. Integer tensors are compared exactly; "
                    "float tensors are identical, within tolerance (|q - o| <= atol + rtol*|o|) "
                    "or DIFFER. Times are warm medians of plain runs. Exit status 1 only when "
                    "an output DIFFERs, else 0. With --dataset, every sample of a dataset is "
                    "compared, on worker processes or Ray actors, and the figures are merged "
                    "exactly (counts and sums): the report is the same whatever the workers."),
        epilog="examples:\n  qlinear compare model.onnx --input x=x.npy\n"
               "  qlinear compare model.onnx --atol 1e-4 --rtol 1e-3\n"
               "  qlinear compare --emulate onnxruntime-avx2   # as on AVX2 servers without VNNI\n"
               "  qlinear compare            # the bundled example\n"
               "  qlinear compare model.onnx --input in/inputs.npz   # inputs saved by "
               "--save-inputs\n"
               "  qlinear compare model.onnx --json > report.json\n"
               "  qlinear compare model.onnx --dataset samples/ --labels labels.npy --workers 2\n"
               "  qlinear compare model.onnx --dataset val.npz --float model_fp32.onnx --plot nodes.png\n"
               "  qlinear compare model.onnx --dataset val.npz --ray auto   # on a Ray cluster")
    _add_model_args(p, "compare")
    p.add_argument("--atol", type=float, default=1e-5, metavar="A",
                   help="absolute tolerance of float tensors: |q - o| <= A + R*|o| is within "
                        "tolerance (default 1e-5)")
    p.add_argument("--rtol", type=float, default=1e-5, metavar="R",
                   help="relative tolerance of float tensors (default 1e-5)")
    p.add_argument("--ulp", type=int, default=0, metavar="N",
                   help="also count float32 values within N units in the last place as within "
                        "tolerance (default 0); integer tensors are always compared exactly")
    _add_emulate_arg(p)
    g = p.add_argument_group(
        "dataset mode", _wrap("compare over many samples and report aggregated figures (per "
                              "output: samples identical / within tolerance / DIFFER; top-1 "
                              "agreement; per node: mismatch rate, max and mean difference, "
                              "SQNR against --float, diagnoses with their counts)"))
    g.add_argument("--dataset", metavar="DATA",
                   help="a folder of .npz files (one sample each, arrays named by input, in "
                        "file-name order), or one .npz whose arrays have a leading sample axis "
                        "(N, *input shape); read sample by sample, never loaded whole")
    g.add_argument("--labels", metavar="FILE.npy",
                   help="one integer class per sample: accuracy of qlinear, onnxruntime (and "
                        "--float) from the argmax of the first output")
    g.add_argument("--float", dest="float_model", metavar="MODEL.onnx",
                   help="the float model the quantized one came from: top-1 agreement with it and "
                        "each node's SQNR against its tensor of the same name (or X for "
                        "X_DequantizeLinear_Output), as onnxruntime's qdq_loss_debug matches them")
    g.add_argument("--workers", type=int, metavar="N",
                   help="worker processes, each preparing the model once (default: one per CPU "
                        "core); the report is the same whatever N")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the workers as Ray actors: on a new local Ray instance, or on the "
                        "cluster at ADDRESS (e.g. auto, ray://head:10001); needs pip install "
                        "'qlinear[scale]', and DATA and the models at the same path on every node")
    g.add_argument("--plot", metavar="FILE.png",
                   help="write a chart of each node's mismatch rate (and SQNR with --float); "
                        "needs matplotlib")
    p.set_defaults(func="compare")

    p = sub.add_parser(
        "inspect", formatter_class=fmt,
        help="describe a model and what qlinear supports in it, without running it",
        description=_wrap("Print a model's inputs and outputs (dtype, shape with symbolic "
                    "dimensions), opsets, operator counts by domain, and for each operator "
                    "whether qlinear runs it or why it refuses it, and onnx's checker verdict. "
                    "Nothing is run."),
        epilog="examples:\n  qlinear inspect model.onnx\n  qlinear inspect model.onnx --json")
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model to inspect")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--max-tensor-bytes", type=int, default=None, metavar="N",
                   help="refuse models declaring a tensor larger than N bytes (default 2 GiB)")
    p.set_defaults(func="inspect")

    p = sub.add_parser(
        "conformance", formatter_class=fmt, help="run ONNX's backend node tests for the operators",
        description=_wrap("Run ONNX's own backend test cases for QuantizeLinear, "
                    "DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger "
                    "(and BatchNormalization) through qlinear.backend, and print one row per "
                    "case: pass, FAIL, or unsupported with the reason. Exit status 1 if any "
                    "supported case fails."),
        epilog="examples:\n  qlinear conformance\n  qlinear conformance --json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func="conformance")

    p = sub.add_parser(
        "bench", formatter_class=fmt, add_help=False,
        help="run the speed benchmark suite (qlinear.tools.bench)",
        description="Run qlinear's benchmark suite; arguments are passed to qlinear.tools.bench.",
        epilog="examples:\n  qlinear bench\n  qlinear bench --help")
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    return parser


def _commands() -> dict:
    """The commands' entry points (and the default --max-tensor-bytes), imported when a command
    runs: they need onnx, the tools extra, which ``qlinear --help``, ``--version`` and the
    error saying how to install it run without."""
    from qlinear.tools.commands import compare, conformance, inspect, run
    from qlinear.tools.model import DEFAULT_MAX_TENSOR_BYTES

    return {"run": run.main, "compare": compare.main, "inspect": inspect.main, "conformance": conformance.main,
            "max_tensor_bytes": DEFAULT_MAX_TENSOR_BYTES}


#: Modules of the optional extras: a plain ``pip install qlinear`` lacks them.
_TOOL_MODULES = ("onnx", "onnxruntime", "tqdm", "matplotlib", "google")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    debug = bool(os.environ.get("QLINEAR_DEBUG"))
    try:
        if os.environ.get("QLINEAR_ORT_SATURATES", "").strip():
            # checked up front, as qlinear's import checks the other QLINEAR_* variables: a
            # bad value would otherwise surface only after a whole comparison has run
            try:
                forced()
            except ValueError as e:
                raise CommandError(str(e).removeprefix("qlinear: ")) from None
        if argv[:1] == ["bench"]:  # everything after "bench" belongs to qlinear.tools.bench, options too
            return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        commands = _commands()   # needs onnx: a plain install says here what to install
        if getattr(args, "max_tensor_bytes", None) is None and hasattr(args, "max_tensor_bytes"):
            args.max_tensor_bytes = commands["max_tensor_bytes"]
        if getattr(args, "max_tensor_bytes", 1) < 1:
            raise CommandError(f"--max-tensor-bytes {args.max_tensor_bytes}: must be 1 or more")
        for flag in ("output_dir", "save_inputs"):  # before any work: '' meant the current folder
            folder = getattr(args, flag, None)
            if folder is not None and not folder.strip():
                raise CommandError(f"--{flag.replace('_', '-')} {folder!r}: an empty folder name (for "
                             f"the current folder say --{flag.replace('_', '-')} .)")
        timeout = getattr(args, "timeout", None)
        if timeout is not None and not (0 < timeout < 1e9):
            raise CommandError(f"--timeout {timeout:g}: must be a number of seconds above 0 and below "
                         "1e+09")  # (1e9 s is about 31 years)
        # A model's float operators give inf and NaN as IEEE 754 (and onnxruntime) define
        # them: results, not errors, so NumPy's RuntimeWarnings about them are not printed
        with _time_limit(timeout), np.errstate(all="ignore"):
            return commands[args.func](args)
    except KeyboardInterrupt:
        print("qlinear: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (Exception, _Timeout) as e:  # every error is one line; QLINEAR_DEBUG=1 shows the traceback
        if debug:
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] in _TOOL_MODULES:
            extra = "bench" if argv[:1] == ["bench"] else "tools"
            msg = (f"qlinear {argv[0] if argv else ''} needs the model tools, and the Python "
                   f"package {missing.split('.')[0]!r} is not installed: "
                   f"pip install 'qlinear[{extra}]'")
        elif not isinstance(e, (CommandError, _Timeout, ValueError, TypeError, OSError,
                                RuntimeError)) and \
                type(e).__name__ != "ToolError":
            msg = f"{type(e).__name__}: {msg}"
        if len(msg) > 2000:
            msg = msg[:1997] + "..."
        print(f"qlinear: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
