#!/usr/bin/env bash
# The main job on the built-in default: build, then `dsattn` with no
# arguments (the seven-generation bill, measured) - or pass a subcommand.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p build
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j "$(nproc)"; } \
     > build/run-build.log 2>&1; then
  cat build/run-build.log
  echo "run.sh: build failed (log above)" >&2
  exit 1
fi
exec ./build/dsattn "$@"
