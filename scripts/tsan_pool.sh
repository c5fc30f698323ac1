#!/usr/bin/env bash
# Run the thread pool's tests under ThreadSanitizer.
#
# Builds a copy of the extension with -fsanitize=thread (the source tree's own build is not
# touched), preloads the TSan runtime into the (uninstrumented) Python interpreter and runs
# tests/test_pool.py: the pool's own self-check (pool_check: jobs of counting tasks, nested
# and concurrent calls, fork, resizing, a worker off its CPU mid-task) and every native path
# on 1-4 threads. Any data race TSan sees in the engine's code aborts the run
# (halt_on_error). Races between the engine and NumPy's or CPython's own (uninstrumented)
# accesses are not seen; the pool hands memory to and from the caller through its atomics,
# which TSan does see.
#
# Usage: scripts/tsan_pool.sh [extra pytest args]   (test dependencies installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r qlinear tests setup.py pyproject.toml README.md MANIFEST.in "$work"/
cd "$work"
find qlinear -name '*.so' -delete
san="-fsanitize=thread -fno-omit-frame-pointer -g"
QLINEAR_REQUIRE_NATIVE=1 QLINEAR_CFLAGS="$san -O1" QLINEAR_LDFLAGS="$san" \
    "$PYTHON" setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log; exit 1; }
# reports to a file: pytest captures stderr, and an abort loses what it captured. The fork test
# is left out: TSan does not support starting threads in a child forked from a threaded process
export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:report_signal_unsafe=0:log_path=$work/tsan"
LD_PRELOAD="$(gcc -print-file-name=libtsan.so)" QLINEAR_REQUIRE_NATIVE=1 "$PYTHON" -m pytest -q \
    -p no:cacheprovider tests/test_pool.py --deselect tests/test_pool.py::test_the_pool_after_fork "$@" || { cat "$work"/tsan* 2>/dev/null; exit 1; }
