"""Build torch_recdev: one torch C++ extension and the native recdev-server executable
(build_native.py), both compiled with ninja, one translation unit per source file so that builds
run in parallel."""

import glob
import os
import sys

# Importing torch autoloads an installed torch_recdev; a stale or half-built
# one must not break the build that replaces it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import find_packages, setup
from distutils.command.build_scripts import build_scripts
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

import build_native  # noqa: E402  (recdev-server and the test module: no torch)


class IncrementalBuildExtension(BuildExtension.with_options(use_ninja=True)):
    """pip's editable builds compile in a new temporary directory each time; compiling in build/temp
    instead keeps ninja's object files, so a rebuild after a one-file change compiles one file."""

    def build_extensions(self):
        self.build_temp = os.path.join(ROOT, "build", "temp")
        build_native.build()  # first: _C links its objects of the store and the wire (extra_objects)
        super().build_extensions()


class CopyNativeScripts(build_scripts):
    """Installs recdev-server on PATH as it is: setuptools reads scripts as text to fix their #! line,
    and the editable install that `make build` runs skips data files."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        copied = []
        for script in self.scripts:
            copied.append(os.path.join(self.build_dir, os.path.basename(script)))
            self.copy_file(script, copied[-1])
        return copied, copied


def sources():
    """_C's own sources: those of the store and the wire are build_native's objects (extra_objects)."""
    patterns = ["csrc/net/client/*.cpp", "csrc/device/*.cpp", "csrc/kernels/*.cpp", "csrc/python/*.cpp"]
    shared = set(build_native.shared_with_extension())
    found = []
    for pattern in patterns:
        found += [source for source in sorted(glob.glob(pattern, root_dir=ROOT)) if source not in shared]
    return found


setup(
    name="torch_recdev",
    version="0.1.0",
    description="recdev: a PyTorch device whose memory is a parameter server",
    packages=find_packages(include=["torch_recdev", "torch_recdev.*"]),
    ext_modules=[
        CppExtension(
            name="torch_recdev._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_objects=[build_native.object_path(source) for source in build_native.shared_with_extension()],
            # -fopenmp: at::parallel_for is a header template whose `#pragma omp parallel` is compiled
            # into this extension; without the flag every parallel_for here runs on one thread. The
            # libgomp it links is the one torch ships and has already loaded (same soname).
            extra_compile_args=["-O2", "-g0", "-Wall", "-Werror", "-Wno-unused-parameter", "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": IncrementalBuildExtension, "build_scripts": CopyNativeScripts},
    scripts=[build_native.SERVER],
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy"],
    entry_points={
        # `import torch` imports torch_recdev (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off).
        "torch.backends": ["recdev = torch_recdev:_autoload"],
    },
)
