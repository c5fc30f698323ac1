"""Run a process as on a CPU without AMX: deny it Linux's AMX permission (``--no-amx``).

On Linux, a process may run AMX tile instructions only after asking the kernel for the tile
data state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``). qlinear's dispatch
(``csrc/runtime/dispatch.c``) and onnxruntime's MLAS (``MlasInitAMX`` in ``platform.cpp``) both ask
once, when they detect the CPU, and fall back to their AVX-512 VNNI kernels when the request
fails. A seccomp filter that fails that one request with EPERM therefore makes both runtimes
choose exactly what they would choose on an AVX-512 VNNI CPU without AMX (AMD Zen 4 and 5,
Intel Ice Lake and Cascade Lake), while every other instruction and system call is unchanged.
That is how ``qlinear bench --no-amx`` and ``benchmarks/graphs.py --no-amx`` compare the two
runtimes' VNNI kernels on an AMX machine.

The filter cannot be removed and is inherited by every later thread and child, so it is only
ever installed in a child process started for it (:func:`child_command`). This file imports
nothing from qlinear: the child loads it by path, installs the filter, and only then imports
qlinear and onnxruntime, whose CPU detection must see the denial (``benchmarks/noamx.py``
loads it the same way).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

#: Set in the child's environment once the filter is installed.
ENV_MARK = "QLINEAR_NO_AMX"

_SYS_ARCH_PRCTL = 158        # x86-64 system call numbers
_SYS_SECCOMP = 317
_ARCH_REQ_XCOMP_PERM = 0x1023
_AUDIT_ARCH_X86_64 = 0xC000003E
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1  # every thread of the process, not only the caller
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_EPERM = 1

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06


def _program() -> bytes:
    """The filter: arch_prctl(ARCH_REQ_XCOMP_PERM, ...) fails with EPERM; all else runs.

    struct seccomp_data: int nr at offset 0, u32 arch at 4, u64 args[6] from 16 (args[0]'s
    low word at 16 on little-endian x86-64; the kernel reads the option as an int).
    """
    ins = [
        (_LD_W_ABS, 0, 0, 4),                       # 0: arch
        (_JEQ_K, 0, 5, _AUDIT_ARCH_X86_64),         # 1: other ABIs (x32/i386) -> allow
        (_LD_W_ABS, 0, 0, 0),                       # 2: system call number
        (_JEQ_K, 0, 3, _SYS_ARCH_PRCTL),            # 3: not arch_prctl -> allow
        (_LD_W_ABS, 0, 0, 16),                      # 4: its option
        (_JEQ_K, 0, 1, _ARCH_REQ_XCOMP_PERM),       # 5: another option -> allow
        (_RET_K, 0, 0, _SECCOMP_RET_ERRNO | _EPERM),  # 6: the AMX request fails
        (_RET_K, 0, 0, _SECCOMP_RET_ALLOW),         # 7
    ]
    return b"".join(struct.pack("<HBBI", *i) for i in ins)


def supported() -> str | None:
    """None if the filter can be installed here, else why not (one phrase)."""
    if sys.platform != "linux":
        return f"needs Linux (this is {sys.platform})"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"needs an x86-64 CPU (this is {platform.machine()})"
    return None


def deny_amx() -> None:
    """Install the filter in this process (irrevocably); OSError if the kernel refuses."""
    why = supported()
    if why:
        raise OSError(f"--no-amx {why}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"--no-amx: prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")
    prog = _program()
    buf = ctypes.create_string_buffer(prog, len(prog))

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.syscall(_SYS_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                    ctypes.byref(fprog)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"--no-amx: installing the seccomp filter failed: {os.strerror(err)}")
    os.environ[ENV_MARK] = "1"


def amx_request_denied() -> bool:
    """Whether this process's AMX permission request fails (what the runtimes will see)."""
    if supported():
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, 18) != 0


def filter_prelude() -> str:
    """Python source that loads this file by path (not the qlinear package) and installs the
    filter, exiting with qlinear's one-line error where it cannot; code after it runs denied."""
    return ("import importlib.util as u, runpy, sys\n"
            f"s = u.spec_from_file_location('_qlinear_noamx', {os.path.abspath(__file__)!r})\n"
            "m = u.module_from_spec(s); s.loader.exec_module(m)\n"
            "try:\n"
            "    m.deny_amx()\n"
            "except OSError as e:\n"
            "    sys.exit(f'qlinear: error: {e}')\n")


def child_command(module: str, args: list[str]) -> list[str]:
    """The command that runs ``python -m module args`` with the filter installed first."""
    code = (filter_prelude()
            + f"sys.argv = [{module!r}] + sys.argv[1:]\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    return [sys.executable, "-c", code, *args]


if __name__ == "__main__":  # pragma: no cover - a manual check
    print("filter", "unsupported: " + supported() if supported() else "supported")
