"""conftest.py - where the tests find the source tree, the golden cases, the
package under test and the dsattn CLI of the build the package loads
(scripts/test_python.sh sets DSATTN_BUILD_DIR; default build/ of this tree)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden")
BUILD = os.path.abspath(os.environ.get("DSATTN_BUILD_DIR") or os.path.join(ROOT, "build"))
CLI = os.path.join(BUILD, "dsattn")

# The package under test: this tree's python/dsattn, unless
# DSATTN_TEST_INSTALLED=1 asks for whichever dsattn the path gives.
if os.environ.get("DSATTN_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(ROOT, "python"))


def golden_cases():
    """(case_dir, expected file, index_k) for every golden case folder."""
    out = []
    for gen in sorted(os.listdir(GOLDEN)):
        gdir = os.path.join(GOLDEN, gen)
        if not os.path.isdir(gdir):
            continue
        for case in sorted(os.listdir(gdir)):
            d = os.path.join(gdir, case)
            if not os.path.exists(os.path.join(d, "config.json")):
                continue
            for exp, ik in (("expected.safetensors", "owner"),
                            ("expected_intended.safetensors", "owner"),
                            ("expected_bugcompat.safetensors", "reference")):
                if os.path.exists(os.path.join(d, exp)):
                    out.append((d, exp, ik))
    return out


def cli_trace(case_dir, out, *args):
    subprocess.run([CLI, "trace", "--case", case_dir, "--out", str(out), *args], check=True,
                   capture_output=True)


_cli_cache, _py_cache = {}, {}


def cli_traced(case_dir, index_k="owner"):
    """{name: array} of `dsattn trace --case case_dir --index-k index_k`
    (reference mode), run once per session."""
    key = (case_dir, index_k)
    if key not in _cli_cache:
        import tempfile
        import dsattn
        fd, out = tempfile.mkstemp(suffix=".safetensors")
        os.close(fd)
        try:
            cli_trace(case_dir, out, "--index-k", index_k)
            _cli_cache[key] = dsattn.read_safetensors(out)
        finally:
            os.unlink(out)
    return _cli_cache[key]


def py_traced(case_dir, index_k="owner"):
    """dsattn.trace(case_dir, reference mode), run once per session."""
    key = (case_dir, index_k)
    if key not in _py_cache:
        import dsattn
        _py_cache[key] = dsattn.trace(case_dir, mode="reference", index_k=index_k)
    return _py_cache[key]


@pytest.fixture(scope="session")
def cli():
    if not os.access(CLI, os.X_OK):
        pytest.fail(f"the dsattn CLI is not built at {CLI} (set DSATTN_BUILD_DIR)")
    return CLI
