"""setup.py - packages python/dsattn with the native parts it runs on:
libdsattn.so.N, the dsattn CLI (dsattn.bill runs it) and the published
configs, copied into dsattn/_native/ of the wheel.

They come from an existing CMake build ($DSATTN_BUILD_DIR, default build/
of the source tree: $DSATTN_SOURCE_DIR, default the folder above this one);
when it has no shared library yet, this builds one there first (cmake,
Release).  Nothing is downloaded:
    pip install --no-build-isolation ./python
"""
import glob
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DSATTN_SOURCE_DIR") or os.path.dirname(HERE)


def _version():
    v = {}
    with open(os.path.join(ROOT, "include", "dsattn.h")) as f:
        for line in f:
            p = line.split()
            if len(p) == 3 and p[0] == "#define" and p[1].startswith("DSATTN_VERSION_"):
                v[p[1][15:]] = p[2]
    return f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}"


def _built(build):
    libs = sorted(glob.glob(os.path.join(build, "libdsattn.so.[0-9]*")), key=len)
    cli = os.path.join(build, "dsattn")
    return (libs[0], cli) if libs and os.path.exists(cli) else (None, None)


class build_with_native(build_py):
    def run(self):
        super().run()
        build = os.environ.get("DSATTN_BUILD_DIR") or os.path.join(ROOT, "build")
        lib, cli = _built(build)
        if not lib:
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
            subprocess.check_call(["cmake", "--build", build, "-j", "2", "--target",
                                   "dsattn_shared", "dsattn_cli"])
            lib, cli = _built(build)
        if not lib:
            raise RuntimeError(f"no libdsattn.so in {build} after building")
        native = os.path.join(self.build_lib, "dsattn", "_native")
        os.makedirs(os.path.join(native, "configs"), exist_ok=True)
        shutil.copy2(lib, os.path.join(native, os.path.basename(lib)))   # the SONAME name
        shutil.copy2(cli, os.path.join(native, "dsattn"))
        for c in glob.glob(os.path.join(ROOT, "configs", "*.json")):
            shutil.copy2(c, os.path.join(native, "configs"))


class NativeDistribution(Distribution):
    def has_ext_modules(self):      # a platform wheel: it carries a .so
        return True


setup(
    name="dsattn",
    version=_version(),
    description="DeepSeek's attention generations in C, from Python (ctypes + NumPy)",
    packages=["dsattn"],
    python_requires=">=3.9",
    install_requires=["numpy"],
    cmdclass={"build_py": build_with_native},
    distclass=NativeDistribution,
)
