#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/*.c) with clang and run each for a
# bounded time (default 30 s per target), starting from its seed corpus in
# tests/fuzz/corpus/<target>/ when there is one.  A finding (crash, leak,
# sanitizer report, abort on a violated invariant, timeout) fails the script
# with libFuzzer's reproducer file in the current folder.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
CC=clang cmake -S . -B build-fuzz -DDSATTN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
targets=()
for f in tests/fuzz/*.c; do targets+=("$(basename "$f" .c)"); done
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
# The targets' scratch files go under one folder this script removes, even
# when a target ends by crash, timeout or signal (libFuzzer then leaves by
# _Exit and the target's own cleanup never runs).  LLVM's OpenMP runtime
# registers itself in /dev/shm by pid the same way; its files go too.
shm=/dev/shm; [ -w "$shm" ] || shm="${TMPDIR:-/tmp}"
scratch="$(mktemp -d "$shm/dsattn-fuzz-run-XXXXXX")"
pids=()
cleanup() {
  rm -rf "$scratch"
  for p in "${pids[@]}"; do rm -f /dev/shm/__KMP_REGISTERED_LIB_"$p"_*; done
}
trap cleanup EXIT
export DSATTN_FUZZ_SCRATCH="$scratch"
for n in "${targets[@]}"; do
  corpus="tests/fuzz/corpus/$n"
  work="${TMPDIR:-/tmp}/dsattn-fuzz-$n"   # kept: the corpus grows across runs
  mkdir -p "$work"
  [ -d "$corpus" ] || corpus=""
  echo "fuzz: $n for ${secs}s"
  # In the foreground (so ^C reaches it); it writes its pid first.
  bash -c 'echo $$ > "$0"; exec "$@"' "$scratch/pid" ./build-fuzz/"$n" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 "$work" $corpus &&
    pids+=("$(cat "$scratch/pid")") || { pids+=("$(cat "$scratch/pid")"); exit 1; }
done
