#!/usr/bin/env bash
# Install the Debian packages dsattn needs, only when missing (as root).
#   cmake, gcc, make          the build
#   g++                       the install test's C++ consumer (tests only: the library is C)
#   libopenblas-openmp-dev    fp32 GEMM for prefill (OpenMP variant: one thread pool)
#   libcjson-dev              the JSON parser for safetensors headers and config.json
#   libxxhash-dev             the XXH3 checksums of session files (found through pkg-config)
#   clang, libclang-rt-14-dev libFuzzer and sanitizer runtimes (tests only)
#   libomp-dev                OpenMP for the clang (fuzzing) build
#   pkg-config                finds libxxhash for the build; the install test builds a program
#                             with `pkg-config --libs dsattn`
#   python3-numpy             the Python package (python/dsattn): arrays in and out
#   python3-pytest            the Python package's tests (scripts/test_python.sh)
#   python3-pip, python3-setuptools  `pip install --no-build-isolation ./python`, offline
#   python3-venv              the pip install test installs into a throwaway venv
#   valgrind                  the CLI test that runs `dsattn run` under memcheck (tests only)
# Not here: the ARM64 cross-build's packages (gcc-aarch64-linux-gnu, the :arm64 libraries,
# qemu-user), which scripts/test-arm64.sh installs for itself.
set -euo pipefail
need=()
# Installed for this machine's architecture (or "all"): once scripts/test-arm64.sh has added
# the :arm64 instances of the libraries, `dpkg -s libcjson-dev` refuses the name as ambiguous
# and would send every later run to apt-get.
arch="$(dpkg --print-architecture)"
installed() {
  dpkg-query -W -f='${Architecture}:${db:Status-Abbrev}\n' "$1" 2>/dev/null | grep -qE "^($arch|all):ii"
}
for p in cmake gcc g++ make libopenblas-openmp-dev libcjson-dev libxxhash-dev clang libclang-rt-14-dev \
         libomp-dev pkg-config python3-numpy python3-pytest python3-pip python3-setuptools \
         python3-venv valgrind; do
  installed "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} (apt-get)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
