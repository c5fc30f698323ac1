"""Run the qlinear benchmark suite and keep the results in benchmarks/results/.

    python benchmarks/run.py            # full suite (about 15 minutes on 2 cores)
    python benchmarks/run.py --quick    # representative subset (a couple of minutes)

Options are those of `qlinear bench` (see `python benchmarks/run.py --help`); the output
directory defaults to benchmarks/results next to this file.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _threads(argv):
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


if __name__ == "__main__":
    argv = sys.argv[1:]
    # Without threadpoolctl, OpenBLAS takes its thread count from the environment when NumPy
    # is first imported: set it before that import.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, _threads(argv))
    sys.path.insert(0, ROOT)
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    if not any(a == "--output-dir" or a.startswith("--output-dir=") for a in argv):
        argv += ["--output-dir", os.path.join(HERE, "results")]
    from qlinear.tools.bench import main

    sys.exit(main(argv))
