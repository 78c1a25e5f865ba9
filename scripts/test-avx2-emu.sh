#!/usr/bin/env bash
# Run test suites as a CPU with AVX2 but no AVX-512 would: the release build's
# dsattn_test under qemu-user with -cpu Haswell (AVX2 + FMA + F16C).  QEMU
# raises SIGILL on any AVX-512 instruction, so an AVX-512 leak into the code
# an AVX2 CPU runs fails here even on an AVX-512 host.  Emulation is ~50x
# slower than the host, so only suites that finish in a few minutes run:
#   bash scripts/test-avx2-emu.sh [suite ...]   (default: the list below)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "test-avx2-emu: installing qemu-user (apt-get)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
fi
[ -x build/dsattn_test ] || { echo "test-avx2-emu: build/dsattn_test missing (run scripts/test.sh)" >&2; exit 1; }
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(formats kernels golden_mla golden_v4)
# The runner must not re-exec itself (a re-exec would leave the emulator and
# run on the host CPU): say the environment is decided already.
export DSATTN_BLAS_REEXEC=1 OMP_NUM_THREADS=2
fail=0
for s in "${suites[@]}"; do
  start=$(date +%s)
  if out=$(cd build && qemu-x86_64 -cpu Haswell ./dsattn_test --suite "$s" 2>&1); then
    echo "$s (emulated Haswell, $(( $(date +%s) - start )) s): $(tail -n 1 <<<"$out")"
  else
    echo "$out" | tail -n 30
    echo "$s: FAILED under qemu-x86_64 -cpu Haswell" >&2
    fail=1
  fi
done
exit $fail
