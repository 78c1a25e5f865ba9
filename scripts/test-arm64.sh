#!/usr/bin/env bash
# Cross-build dsattn for aarch64 (ARM64) with Debian's toolchain and run test
# suites under qemu-user: proves the build has no x86-only code and that
# every case, golden ones bit-exact in reference mode, passes on an ARM64
# CPU with the `neon` kernel table.  It says nothing about NEON speed.
#   bash scripts/test-arm64.sh [suite ...]     (default: the list below)
#   DSATTN_ARM64_SOAK=30 bash scripts/test-arm64.sh   (and 30 s soaks: tiny, odd shapes)
# Installs what it needs (as root, apt-get, only what is missing):
# gcc-aarch64-linux-gnu, the arm64 builds of OpenBLAS / cJSON / xxHash and
# of the C library (multiarch: dpkg --add-architecture arm64), qemu-user.
# .ci/run calls it.  Time on a 2-core x86-64 host (AMD EPYC Zen 5),
# 2026-12-07 19:07, other jobs running beside it, from an existing
# build-arm64, with DSATTN_ARM64_SOAK=60: 426 s in all (build 44 s;
# formats 22, golden_mla 2, golden_v4 12, v41 130, loader 41, kernels 9,
# mha 7, vmath 0, mla 12, sparse_attn 6, pgemm 4, formats on cortex-a57 15,
# soaks 61 + 61 s).
# v41 spends most of it in its fast-vs-reference statistical gates, loader
# in make_weights_every_layout.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
# the cross C library's start files and headers: only a Recommends of the
# cross compiler, which --no-install-recommends below leaves out
[ -e /usr/aarch64-linux-gnu/lib/crti.o ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
[ -e /usr/include/aarch64-linux-gnu/openblas-openmp/cblas.h ] || need+=(libopenblas-openmp-dev:arm64)
[ -e /usr/lib/aarch64-linux-gnu/libcjson.so ] || need+=(libcjson-dev:arm64)
[ -e /usr/lib/aarch64-linux-gnu/pkgconfig/libxxhash.pc ] || need+=(libxxhash-dev:arm64)
[ -e /lib/ld-linux-aarch64.so.1 ] || need+=(libc6:arm64)   # the loader qemu runs (below)
if [ ${#need[@]} -gt 0 ]; then
  echo "test-arm64: installing ${need[*]} (apt-get)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq           # the arm64 package lists, after adding the architecture
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi

echo "== cross-build for aarch64 (cmake/aarch64-linux-gnu.cmake) into build-arm64"
cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake --no-warn-unused-cli \
      -DCMAKE_BUILD_TYPE=Release -DDSATTN_WERROR=ON >/dev/null
# Only the test runner and what it needs (the library, the CLI it spawns):
# the benches and tools are not run here.
cmake --build build-arm64 -j "$(nproc)" --target dsattn_test >/dev/null
if command -v file >/dev/null 2>&1; then file build-arm64/dsattn_test | sed 's/, BuildID.*//'; fi
echo "build: $(( $(date +%s) - t0 )) s"

# Name suites, or set DSATTN_ARM64_SUITES, to run others or fewer.
suites=("$@")
[ ${#suites[@]} -gt 0 ] || read -r -a suites <<<"${DSATTN_ARM64_SUITES:-}"
[ ${#suites[@]} -gt 0 ] || suites=(formats golden_mla golden_v4 v41 loader kernels mha vmath mla sparse_attn pgemm)
# The runner must not re-exec itself (a re-exec would leave the emulator):
# say the environment is decided already.  No DSATTN_ISA: the runner picks
# the best table of the build, which on aarch64 is neon (its output names it).
export DSATTN_BLAS_REEXEC=1 OMP_NUM_THREADS=2
# The multiarch loader and libc (libc6:arm64), not `-L /usr/aarch64-linux-gnu`:
# that mixes the cross toolchain's ld.so with the multiarch libc.so.6, two
# glibc builds whose private state disagrees, and the first pthread_create
# (every OpenMP region of 2 threads, OpenBLAS's team) then spins forever.
# A suite that still hangs fails after DSATTN_ARM64_TIMEOUT seconds.
QEMU=(timeout "${DSATTN_ARM64_TIMEOUT:-900}" qemu-aarch64)
fail=0
for s in "${suites[@]}"; do
  start=$(date +%s)
  rc=0
  out=$(cd build-arm64 && "${QEMU[@]}" ./dsattn_test --suite "$s" 2>&1) || rc=$?
  if [ $rc -eq 0 ]; then
    echo "$s (qemu-aarch64, $(( $(date +%s) - start )) s): $(tail -n 2 <<<"$out" | paste -sd ' ' | sed 's/kernel table: \([a-z0-9]*\) /[\1] /')"
  else
    grep -E 'FAIL|error' <<<"$out" | tail -n 30 || true
    tail -n 2 <<<"$out"
    [ $rc -ne 124 ] || echo "$s: timed out after ${DSATTN_ARM64_TIMEOUT:-900} s (a hang?)" >&2
    echo "$s: FAILED under qemu-aarch64 ($(( $(date +%s) - start )) s)" >&2
    fail=1
  fi
done
# The formats suite once more as a CPU without the ARMv8.2 dot product
# (QEMU_CPU=cortex-a57, ARMv8.0): the neon table then takes the indexer's
# SMULL form, and an SDOT anywhere outside the SDOT form would be a SIGILL.
if [[ " ${suites[*]} " == *" formats "* ]]; then
  start=$(date +%s)
  rc=0
  out=$(cd build-arm64 && QEMU_CPU=cortex-a57 "${QEMU[@]}" ./dsattn_test --suite formats 2>&1) || rc=$?
  if [ $rc -eq 0 ]; then
    echo "formats (qemu-aarch64 -cpu cortex-a57, $(( $(date +%s) - start )) s): $(tail -n 1 <<<"$out")"
  else
    grep -E 'FAIL|error' <<<"$out" | tail -n 30 || true
    tail -n 2 <<<"$out"
    echo "formats: FAILED under qemu-aarch64 -cpu cortex-a57" >&2
    fail=1
  fi
fi
# DSATTN_ARM64_SOAK=SECONDS: then `dsattn soak` in fast mode under the
# emulator, random operations on every generation through the neon table,
# that long on the tiny models and again on the odd-shaped ones (the CLI is
# built with the runner; .ci/run asks for 30 s).
soak="${DSATTN_ARM64_SOAK:-0}"
if [ "$soak" -gt 0 ]; then
  for shapes in tiny odd; do
    start=$(date +%s)
    rc=0
    out=$(cd build-arm64 && OMP_NUM_THREADS=1 "${QEMU[@]}" ./dsattn soak --seconds "$soak" \
          --mode fast --shapes "$shapes" 2>&1) || rc=$?
    if [ $rc -eq 0 ]; then
      echo "soak --shapes $shapes (qemu-aarch64, $(( $(date +%s) - start )) s): $(tail -n 1 <<<"$out")"
    else
      tail -n 20 <<<"$out"
      echo "soak --shapes $shapes: FAILED under qemu-aarch64" >&2
      fail=1
    fi
  done
fi
echo "test-arm64: $(( $(date +%s) - t0 )) s in all"
exit $fail
