"""test_install.py - the package installs offline and works from outside the
tree: `pip install --no-build-isolation --no-index` into a fresh venv (over
Debian's numpy, pip and setuptools) of a copy of python/, then import it
from another folder and trace a golden case, equal to the in-tree package's
trace byte for byte."""
import os
import shutil
import subprocess
import sys

import dsattn
from conftest import BUILD, GOLDEN, ROOT, py_traced

CASE = os.path.join(GOLDEN, "v41", "tiny-seed0")


def test_pip_install_offline(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__",
                                                  "_native", ".pytest_cache"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = dict(os.environ, DSATTN_SOURCE_DIR=ROOT, DSATTN_BUILD_DIR=BUILD)
    env.pop("DSATTN_LIBRARY", None)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                        str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out.npy"
    code = ("import dsattn, numpy; t = dsattn.trace(%r); numpy.save(%r, t['out']); "
            "print(dsattn.library_path)") % (CASE, str(out))
    env.pop("DSATTN_SOURCE_DIR")
    env.pop("DSATTN_BUILD_DIR")
    r = subprocess.run([py, "-c", code], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout and "_native" in r.stdout, r.stdout
    import numpy as np
    assert np.load(out).tobytes() == py_traced(CASE)["out"].tobytes()
