#!/usr/bin/env bash
# Build the libFuzzer targets with clang and run each for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-45}"
CC=clang cmake -S . -B build-fuzz -DDSATTN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j "$(nproc)"
for f in tests/fuzz/*.c; do
  n=$(basename "$f" .c)
  corpus="tests/fuzz/corpus/$n"
  mkdir -p "/tmp/dsattn-fuzz-$n"
  [ -d "$corpus" ] || corpus=""
  echo "fuzz: $n for ${secs}s"
  ./build-fuzz/"$n" -max_total_time="$secs" -rss_limit_mb=2048 "/tmp/dsattn-fuzz-$n" $corpus
done
