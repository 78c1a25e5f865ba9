# Cross-build dsattn for 64-bit ARM Linux with Debian's toolchain
# (gcc-aarch64-linux-gnu) and the arm64 builds of its libraries (multiarch:
# dpkg --add-architecture arm64; libopenblas-dev:arm64, libcjson-dev:arm64,
# libxxhash-dev:arm64).  scripts/test-arm64.sh installs them, builds with
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# and runs the tests under qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Libraries and headers of the target only: Debian's multiarch keeps them in
# /usr/lib/aarch64-linux-gnu and /usr/include/aarch64-linux-gnu, and the
# architecture-independent headers in /usr/include.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config reads the target's .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Tests and the CLI run under user-mode emulation, with the multiarch arm64
# loader and C library (libc6:arm64, /lib/ld-linux-aarch64.so.1), which the
# arm64 libraries come with.  No `-L /usr/aarch64-linux-gnu`: that takes the
# cross toolchain's ld.so but still the multiarch libc.so.6, and when the two
# glibc builds differ (Debian 12: 2.36-8cross1 against 2.36-9+deb12uN) their
# private shared state disagrees and the first pthread_create spins forever.
find_program(DSATTN_QEMU_AARCH64 qemu-aarch64)
if(DSATTN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${DSATTN_QEMU_AARCH64})
endif()
