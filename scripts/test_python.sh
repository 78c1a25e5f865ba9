#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest) over a build's
# libdsattn.so and CLI; ctest runs it as the `python` test, so
# scripts/test.sh and CI do.  Debian's python3 is the one with
# python3-numpy and python3-pytest ($PYTHON overrides): a python3 earlier
# on PATH (pyenv, a venv) may lack them.  Fails loudly when pytest collects
# no tests (its exit status 5) or the modules are missing - never a silent
# pass, never an unexplained failure.
#   usage: scripts/test_python.sh [BUILD_DIR]   (default build)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
py="${PYTHON:-/usr/bin/python3}"
[ -x "$py" ] || py="$(command -v python3)"
if ! "$py" -c "import numpy, pytest" 2>/dev/null; then
  echo "test_python: $py lacks numpy or pytest (Debian: python3-numpy python3-pytest;" \
       "scripts/setup.sh installs them)" >&2
  exit 1
fi
cd "$root/python"
DSATTN_BUILD_DIR="$build" "$py" -m pytest -q -p no:cacheprovider tests
rc=$?
if [ $rc -eq 5 ]; then
  echo "test_python: pytest collected no tests in python/tests - that is a failure" >&2
  exit 1
fi
exit $rc
