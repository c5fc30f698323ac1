"""The peak-memory probe of the memory tests' child processes (test_memory.py).

PRELUDE imports, in the child, the bench's probe (qlinear/tools/bench/memory.py, its one
home): ``status_kib(field)``, a field of /proc/self/status in KiB, and ``reset_peak()``, which
returns what malloc holds to the system and restarts the peak resident set (VmHWM) from the
current one (Linux's /proc/self/clear_refs, "5"), returning VmRSS in KiB. A child script is
PRELUDE + its own code, which measures ``status_kib("VmHWM")`` against ``before =
reset_peak()`` around the call it checks.
"""

PRELUDE = r"""
from qlinear.tools.bench.memory import reset_peak, status_kib
"""
