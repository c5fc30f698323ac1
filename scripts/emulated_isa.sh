#!/usr/bin/env bash
# Check the AMX, AVX-512 VNNI and AVX-VNNI kernels on a CPU that lacks those instructions.
#
# Builds a copy of the extension with -DQL_SIMDE: kernels_avx512vnni.c, kernels_avxvnni.c and
# kernels_amx.c then include SIMDe's portable implementations of the intrinsics they use
# (Debian's header-only libsimde-dev, SIMDE_ENABLE_NATIVE_ALIASES) instead of the CPU's,
# kernels_amx.c its own C emulation of the tile instructions, and dispatch.c offers those
# levels on any AVX2 CPU. The native tests then run at the three levels against the oracle. A check of the kernels' logic (packing, the U8S8 corrections,
# tails, the epilogue), not the shipped build: the source tree's own build is not touched.
#
# Usage: scripts/emulated_isa.sh [extra pytest args]   (with the test dependencies installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [ ! -f /usr/include/simde/x86/avx512.h ]; then
    apt-get install -y libsimde-dev
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r qlinear tests setup.py pyproject.toml README.md MANIFEST.in "$work"/
cd "$work"
find qlinear -name '*.so' -delete
QLINEAR_REQUIRE_NATIVE=1 QLINEAR_CFLAGS="-DQL_SIMDE" "$PYTHON" setup.py -q build_ext --inplace >build.log 2>&1 \
    || { cat build.log; exit 1; }
"$PYTHON" - <<'PY'
import qlinear
info = qlinear.engine_info()
print("emulated build:", info)
assert info["emulated"] and {"amx", "avx512vnni", "avxvnni"} <= set(info["isas"]), info
PY
QLINEAR_REQUIRE_NATIVE=1 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_native.py tests/test_matmul.py tests/test_quantize.py tests/test_properties.py tests/test_conv.py \
    tests/test_plain.py tests/test_gemv.py -k "native-amx or native-avx512vnni or native-avxvnni" "$@"
