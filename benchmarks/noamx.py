"""``--no-amx`` for the benchmark scripts: deny this process AMX before any runtime loads.

Imported by a script before it imports qlinear or onnxruntime. When ``--no-amx`` is on the
command line it installs qlinear's seccomp filter (``qlinear/tools/bench/noamx.py``, loaded
by path so that the qlinear package is not imported yet): both runtimes then detect a CPU
without AMX and run their AVX-512 VNNI kernels, as on AMD Zen 4/5. The flag stays in ``sys.argv`` for
the script's own parser (which documents it).
"""

from __future__ import annotations

import importlib.util
import os
import sys

HELP = ("deny this process AMX before qlinear and onnxruntime detect the CPU: both run their "
        "AVX-512 VNNI kernels, as on a CPU without AMX (Linux x86-64)")

if "--no-amx" in sys.argv[1:]:
    _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "qlinear",
                         "tools", "bench", "noamx.py")
    _spec = importlib.util.spec_from_file_location("_qlinear_noamx", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    if "qlinear" in sys.modules or "onnxruntime" in sys.modules:
        sys.exit("--no-amx: import benchmarks/noamx.py before qlinear and onnxruntime")
    try:
        _mod.deny_amx()
    except OSError as e:
        sys.exit(f"error: {e}")
