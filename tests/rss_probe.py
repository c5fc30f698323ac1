"""The peak-memory probe of the memory tests' child processes (test_memory.py, test_qa9.py).

PRELUDE defines, in the child: ``status_kib(field)``, a field of /proc/self/status in KiB, and
``reset_peak()``, which returns what malloc holds to the system and restarts the peak resident
set (VmHWM) from the current one (Linux's /proc/self/clear_refs, "5"), returning VmRSS in KiB.
A child script is PRELUDE + its own code, which measures ``status_kib("VmHWM")`` against
``before = reset_peak()`` around the call it checks.
"""

PRELUDE = r"""
import ctypes


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set restarts from the current one
    return status_kib("VmRSS")
"""
