#!/usr/bin/env bash
# The install test (ctest "install"): `cmake --install BUILD --prefix TMP`,
# then tests/install/example.c built outside the tree against that copy -
# with `pkg-config --cflags --libs dsattn` and with CMake's
# find_package(dsattn) (shared and static) - and run, and example.cpp built
# as C++17 with pkg-config, which must print what example.c prints; the shared library must
# carry its SONAME and export only dsattn_* symbols, and the CLI installed
# beside it must run; the Python package installed with them must load
# that library and trace a golden case.
#   usage: tests/install/run.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
src="$(cd "$here/../.." && pwd)"
tmp="$(mktemp -d /tmp/dsattn_install_XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cfg="$src/tests/data/golden/v41/tiny-seed0/config.json"
case_dir="$src/tests/data/golden/v41/tiny-seed0"

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(dirname "$(find "$prefix" -name 'libdsattn.so' | head -n 1)")"
test -f "$prefix/include/dsattn.h"
test -f "$libdir/libdsattn.a"
test -x "$prefix/bin/dsattn"
"$prefix/bin/dsattn" --help >/dev/null

soname="$(readelf -d "$libdir/libdsattn.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
case "$soname" in libdsattn.so.[0-9]*) ;; *) echo "install: bad SONAME '$soname'"; exit 1 ;; esac
bad="$(nm -D --defined-only "$libdir/libdsattn.so" | awk '{print $3}' | grep -v '^dsattn_' || true)"
if [ -n "$bad" ]; then echo "install: libdsattn.so exports non-API symbols:"; echo "$bad"; exit 1; fi
n_exp="$(nm -D --defined-only "$libdir/libdsattn.so" | grep -c ' T dsattn_')"
echo "install: $soname exports $n_exp dsattn_* functions and nothing else"

# 1. pkg-config (the .pc is relocatable: it names the prefix by its own place)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags="$(pkg-config --cflags --libs dsattn)"
echo "install: pkg-config --cflags --libs dsattn -> $flags"
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/ex_pc" "$here/example.c" $flags
LD_LIBRARY_PATH="$libdir" "$tmp/ex_pc" "$cfg" "$case_dir" "$tmp/trace_pc.safetensors"
# the trace through the installed library equals the in-tree CLI's, byte for byte
"$build/dsattn" trace --case "$case_dir" --out "$tmp/trace_cli.safetensors" 2>/dev/null
cmp "$tmp/trace_pc.safetensors" "$tmp/trace_cli.safetensors"
# ... and from C++ (every public header, -pedantic): the same numbers as C
c++ -std=c++17 -Wall -Wextra -pedantic -Werror -o "$tmp/ex_cpp" "$here/example.cpp" $flags
line_c="$(LD_LIBRARY_PATH="$libdir" "$tmp/ex_pc" "$cfg")"
line_cpp="$(LD_LIBRARY_PATH="$libdir" "$tmp/ex_cpp" "$cfg")"
[ "$line_c" = "$line_cpp" ] || { echo "install: C and C++ consumers differ:"; echo "$line_c"; echo "$line_cpp"; exit 1; }
echo "install: C++ consumer (c++ -std=c++17 -pedantic): $line_cpp"

# 2. CMake find_package, shared and static
cmake -S "$here" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
      >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/example_shared" "$cfg"
"$tmp/consumer/example_static" "$cfg"
ldd "$tmp/consumer/example_shared" | grep "$libdir/$soname" >/dev/null \
  || { echo "install: example_shared does not load the installed $soname"; exit 1; }
echo "install: pkg-config and find_package consumers built and ran"

# 3. the Python package of the install (Debian's python3 has python3-numpy)
py="${PYTHON:-/usr/bin/python3}"
[ -x "$py" ] || py="$(command -v python3)"
pydir="$(dirname "$(find "$prefix" -path '*/dsattn/__init__.py' | head -n 1)")/.."
got="$(cd "$tmp" && PYTHONPATH="$pydir" DSATTN_LIBRARY= "$py" -c "
import dsattn, sys
t = dsattn.trace(sys.argv[1])
print(dsattn.library_path, t['out'].shape, len(dsattn.bill(kv_only=True)))" "$case_dir")"
echo "install: python: $got"
case "$got" in "$libdir/libdsattn.so."*" (35, 256) 7") ;;
  *) echo "install: the installed Python package did not use the installed library"; exit 1 ;;
esac
