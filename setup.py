"""Build torch_recdev: one torch C++ extension compiled with ninja, one
translation unit per source file so that builds run in parallel."""

import glob
import os

# Importing torch autoloads an installed torch_recdev; a stale or half-built
# one must not break the build that replaces it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources():
    patterns = ["csrc/store/*.cpp", "csrc/net/*.cpp", "csrc/device/*.cpp", "kernels/*.cpp"]
    found = []
    for pattern in patterns:
        found += sorted(glob.glob(pattern, root_dir=ROOT))
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
            # -fopenmp: at::parallel_for is a header template whose `#pragma omp parallel` is compiled
            # into this extension; without the flag every parallel_for here runs on one thread. The
            # libgomp it links is the one torch ships and has already loaded (same soname).
            extra_compile_args=["-O2", "-g0", "-Wall", "-Wno-unused-parameter", "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy"],
    entry_points={
        # `import torch` imports torch_recdev (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off).
        "torch.backends": ["recdev = torch_recdev:_autoload"],
        "console_scripts": ["recdev-server = torch_recdev.server:main"],
    },
)
