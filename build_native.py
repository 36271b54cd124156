"""The native builds besides torch's extension, each with ninja in a folder of build/ (incremental:
ninja tracks headers), from sources that include no torch header:

- recdev-server (csrc/store, csrc/net/wire, csrc/net/server, csrc/server and the client's connection,
  for `recdev-server --stats ADDRESS`): built with _C by setup.py and installed on PATH.
- torch_recdev._testing, the test bindings (the store engine alone and the wire protocol's
  constants, csrc/python/testing): `python build_native.py --testing`, which `make test` and
  `make bench` run. It is never part of _C or of an installed package.

The objects of the store, the wire and the client's connection are compiled once, here
(position-independent), and linked into recdev-server, the test module and torch's extension _C
(setup.py builds them first), which compiled them a second time with torch's flags before (127 of
814 compiler seconds).
"""

import argparse
import glob
import os
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.join(ROOT, "build", "native")
SERVER = os.path.join("torch_recdev", "recdev-server")
FLAGS = "-std=c++20 -O2 -g0 -Wall -Werror -Wno-unused-parameter -pthread -fPIC"
STORE = ["csrc/store/*.cpp"]
WIRE = ["csrc/net/wire/*.cpp", "csrc/net/client/connection.cpp"]
SERVER_ONLY = ["csrc/net/server/*.cpp", "csrc/server/*.cpp"]
TESTING_ONLY = ["csrc/python/testing/*.cpp", "csrc/python/table_policy_binding.cpp", "csrc/python/store_errors.cpp"]


def _sources(patterns):
    found = []
    for pattern in patterns:
        found += sorted(glob.glob(pattern, root_dir=ROOT))
    return found


def server_sources():
    return _sources(STORE + WIRE + SERVER_ONLY)


def shared_with_extension():
    """The sources whose objects _C links from here instead of compiling them itself."""
    return _sources(STORE + WIRE)


def object_path(source):
    return os.path.join(BUILD_DIR, _object_name(source))


def testing_sources():
    return _sources(STORE + TESTING_ONLY)


def testing_module():
    return os.path.join("torch_recdev", "_testing" + sysconfig.get_config_var("EXT_SUFFIX"))


def _object_name(source):
    return source.replace("/", "_") + ".o"


def _ninja_file(testing):
    import pybind11

    python_includes = f"-I{pybind11.get_include()} -I{sysconfig.get_paths()['include']}"
    lines = [
        f"cxx = {os.environ.get('CXX', 'c++')}",
        f"flags = {FLAGS} -I{os.path.join(ROOT, 'csrc')}",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $flags $extra -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule link",
        "  command = $cxx -pthread $in -o $out",
        "rule link_module",
        "  command = $cxx -pthread -shared $in -o $out",
    ]

    def objects(sources, extra=""):
        names = []
        for source in sources:
            names.append(_object_name(source))
            lines.append(f"build {names[-1]}: cxx {os.path.join(ROOT, source)}")
            if extra:
                lines.append(f"  extra = {extra}")
        return names

    store = objects(_sources(STORE))
    server = store + objects(_sources(WIRE + SERVER_ONLY))
    lines.append(f"build {os.path.join(ROOT, SERVER)}: link {' '.join(server)}")
    if testing:
        module = store + objects(_sources(TESTING_ONLY), python_includes)
        lines.append(f"build {os.path.join(ROOT, testing_module())}: link_module {' '.join(module)}")
    return "\n".join(lines) + "\n"


def build(testing=False):
    """Compiles recdev-server, and with testing=True the test module too, in build/native."""
    import ninja

    os.makedirs(BUILD_DIR, exist_ok=True)
    with open(os.path.join(BUILD_DIR, "build.ninja"), "w") as f:
        f.write(_ninja_file(testing))
    subprocess.run([os.path.join(ninja.BIN_DIR, "ninja"), "-C", BUILD_DIR], check=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testing", action="store_true", help="also build torch_recdev._testing")
    build(parser.parse_args().testing)
    sys.exit(0)
