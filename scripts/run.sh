#!/usr/bin/env bash
# The main job on the built-in default: build, then `dsattn` with no
# arguments (the seven-generation bill, measured) - or pass a subcommand.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
exec ./build/dsattn "$@"
