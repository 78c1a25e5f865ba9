#!/usr/bin/env bash
# The whole test suite: configure, build (-Werror), run every suite
# registered with ctest (one per tests/test_<suite>.c).  The environment the
# suites need (OpenBLAS's core type, the OpenMP wait policy) is decided by the
# test runner itself, as the CLI decides it (src/core/blas.c), so this works
# unchanged on any x86-64: AVX-512 or AVX2-only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSATTN_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
cd build
ctest --output-on-failure
