#!/usr/bin/env bash
# Run the native tests under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds a copy of the extension with -fsanitize=address,undefined (the source tree's own
# build is not touched), preloads the ASan runtime into the Python interpreter (which is not
# itself instrumented) and runs the native engine's tests at every ISA level this CPU runs.
# Any sanitizer report aborts the run (halt_on_error / -fno-sanitize-recover).
#
# With EMULATED=1 the build also compiles the VNNI and AMX kernel files against SIMDe and the
# C tile emulation (as scripts/emulated_isa.sh does), so the AMX, AVX-512 VNNI and AVX-VNNI
# levels run under the sanitizers too on CPUs without them (on an AMX CPU they run natively).
#
# Usage: [EMULATED=1] scripts/sanitize.sh [extra pytest args]   (test dependencies installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r qlinear tests setup.py pyproject.toml README.md MANIFEST.in "$work"/
cd "$work"
find qlinear -name '*.so' -delete
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
extra=""
if [ "${EMULATED:-0}" = "1" ]; then
    [ -f /usr/include/simde/x86/avx512.h ] || apt-get install -y libsimde-dev
    extra="-DQL_SIMDE"
fi
QLINEAR_REQUIRE_NATIVE=1 QLINEAR_CFLAGS="$san -O1 $extra" QLINEAR_LDFLAGS="$san" \
    "$PYTHON" setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log; exit 1; }
asan="$(gcc -print-file-name=libasan.so)"
ubsan="$(gcc -print-file-name=libubsan.so)"
# CPython's own allocations are not instrumented: leak reports would be about the interpreter
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
LD_PRELOAD="$asan $ubsan" QLINEAR_REQUIRE_NATIVE=1 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_native.py tests/test_matmul.py tests/test_quantize.py tests/test_properties.py tests/test_conv.py \
    tests/test_plain.py tests/test_contrib.py tests/test_backend.py tests/test_matmul_nbits_native.py \
    tests/test_islands.py tests/test_formats.py tests/test_float_conv.py tests/test_transformer_native.py \
    tests/test_attention_native.py tests/test_f8mm.py tests/test_transformer_bound.py tests/test_gemv.py \
    tests/test_pool.py -k "native or island or float_conv or f8mm or bound or gemv or pool" "$@"
