"""Build of qlinear's optional compiled engine (qlinear._qlnative).

`pip install .` compiles qlinear/csrc/**/*.c with the system C compiler. Without a working
compiler the install still succeeds and qlinear runs on its NumPy engine (a warning says so);
QLINEAR_REQUIRE_NATIVE=1 makes a failed build an error instead (CI uses it).

Flags: -O3 -std=c11, -ffp-contract=off and -fno-fast-math (the requantization must be one
float32 multiply and one rounding, never a fused multiply-add); never -march=native: every
ISA-specific file enables its own instructions with #pragma GCC target and the CPU is
checked at run time (qlinear/csrc/runtime/dispatch.c). Extra flags for test builds (sanitizers,
the SIMDe emulation of scripts/emulated_isa.sh): QLINEAR_CFLAGS and QLINEAR_LDFLAGS.
"""

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_REQUIRE_VALUE = os.environ.get("QLINEAR_REQUIRE_NATIVE", "").strip()
if _REQUIRE_VALUE not in ("", "0", "1"):  # "2" or "yes" would silently build without requiring
    sys.exit(f"qlinear: QLINEAR_REQUIRE_NATIVE must be 0 or 1; got {_REQUIRE_VALUE!r}")
REQUIRE = _REQUIRE_VALUE == "1"


class NativeBuildError(RuntimeError):
    """The native engine failed to build while QLINEAR_REQUIRE_NATIVE=1."""


class OptionalBuildExt(build_ext):
    """Build the engine; on failure fall back to the NumPy engine unless it is required."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, for instance
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._fallback(exc)

    def _fallback(self, exc: Exception) -> None:
        if isinstance(exc, NativeBuildError):
            raise exc
        if REQUIRE:
            raise NativeBuildError(f"qlinear: the native engine failed to build (QLINEAR_REQUIRE_NATIVE=1): {exc}") from exc
        msg = (f"qlinear: the native engine could not be built ({exc}); "
               "qlinear will run on its NumPy engine")
        print("WARNING: " + msg, file=sys.stderr)


def _flags() -> tuple[list[str], list[str]]:
    if sys.platform == "win32":
        return ["/O2", "/fp:precise", "/std:c11"], []
    cflags = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-pthread",
              "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas"]
    ldflags = ["-pthread"]
    cflags += os.environ.get("QLINEAR_CFLAGS", "").split()
    ldflags += os.environ.get("QLINEAR_LDFLAGS", "").split()
    return cflags, ldflags


here = os.path.dirname(os.path.abspath(__file__))
csrc = os.path.join(here, "qlinear", "csrc")
sources = sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(csrc, "**", "*.c"), recursive=True))
headers = sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(csrc, "**", "*.h"), recursive=True))
# include/: the engine's shared headers (#include "qlinear.h"); csrc itself: a folder's header
# included by path from another folder (#include "isa/x86_sse2.h")
include_dirs = [os.path.relpath(os.path.join(csrc, "include"), here), os.path.relpath(csrc, here)]
cflags, ldflags = _flags()

setup(
    ext_modules=[
        Extension(
            "qlinear._qlnative",
            sources=sources,
            depends=headers,
            include_dirs=include_dirs,
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            libraries=[] if sys.platform == "win32" else ["m"],
            optional=not REQUIRE,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
