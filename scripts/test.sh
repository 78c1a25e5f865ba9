#!/usr/bin/env bash
# The whole test suite: configure, build (-Werror), run every suite
# registered with ctest (one per tests/test_<suite>.c).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSATTN_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
cd build
OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" ctest --output-on-failure
