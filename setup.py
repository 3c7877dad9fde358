"""The wheel's native part (pyproject.toml holds the metadata): libqlink.so, its backends,
the torch bridge and the native CLI copied into qlink/lib/, where the package finds them
at run time. They come from QLINK_NATIVE_DIR where set (tools/wheel.sh, the wheel test),
else from an optimized Bazel build of this checkout. The wheel is tagged cp310-abi3 for
linux_x86_64: the torch bridge uses CPython's limited API 3.10, the libraries are x86-64."""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = ["libqlink.so", "libqlink_backend_cpu.so", "libqlink_torch.so", "qlink"]
NATIVE_IF_BUILT = ["libqlink_backend_cuda.so", "libqlink_backend_hip.so"]  # where their toolkits were found


def native_dir():
    given = os.environ.get("QLINK_NATIVE_DIR")
    if given:
        return given
    subprocess.check_call(["bazel", "build", "-c", "opt", "//:plugin", "//:qlink"], cwd=HERE)
    return os.path.join(HERE, "bazel-bin")


class BuildWithNative(build_py):
    def run(self):
        super().run()
        source = native_dir()
        missing = [n for n in NATIVE if not os.path.isfile(os.path.join(source, n))]
        if missing:
            raise SystemExit("setup.py: %s missing from %s" % (", ".join(missing), source))
        target = os.path.join(self.build_lib, "qlink", "lib")
        os.makedirs(target, exist_ok=True)
        for name in NATIVE + [n for n in NATIVE_IF_BUILT if os.path.isfile(os.path.join(source, n))]:
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            os.chmod(os.path.join(target, name), 0o755)


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries x86-64 libraries


setup(cmdclass={"build_py": BuildWithNative}, distclass=NativeDistribution,
      options={"bdist_wheel": {"py_limited_api": "cp310"}})
