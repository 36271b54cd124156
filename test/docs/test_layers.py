"""The layer rules of docs/architecture.md, checked on every include: each layer of csrc/ includes only
the layers below it; csrc/net is three layers, the wire format both sides share and the client and
the server, which never include each other; csrc/store, csrc/net and csrc/server include nothing of
torch or Python, and only csrc/python includes pybind11. csrc/python/testing (the test module,
torch_recdev._testing) is a layer of its own that nothing of _C includes. And two rules of the table
interface (store/table_handle.h): kernels ask a table's row path what it can do instead of reading its
policy or where it lives, and the bindings reach a table's facets without dynamic_cast."""

import re

import pytest

from doc_blocks import ROOT

# What each layer may include of the others (with -I csrc: "store/table.h", "net/wire/protocol.h", ...).
WIRE, CLIENT, SERVER, TESTING = "net/wire", "net/client", "net/server", "python/testing"
MAY_INCLUDE = {
    "store": set(),
    WIRE: {"store"},
    CLIENT: {"store", WIRE},
    SERVER: {"store", WIRE},
    # The recdev-server executable: a shard's server, and a client for --stats.
    "server": {"store", WIRE, SERVER, CLIENT},
    "device": {"store", WIRE, CLIENT},
    "kernels": {"store", WIRE, CLIENT, "device"},
    "python": {"store", WIRE, CLIENT, "device", "kernels"},
    # Built without torch from the store's sources (build_native.py --testing), with two of
    # csrc/python's files that include no torch (store_errors, table_policy_binding).
    TESTING: {"store", WIRE, "python"},
}
TORCH = re.compile(r"#include\s*<(torch|ATen|c10|caffe2)/")
# torch/csrc/ is mostly the Python bindings; the autograd engine's C++ headers are not (a backward
# pass's final callback, csrc/kernels/embedding_autograd.cpp).
PYTHON = re.compile(r"#include\s*<(pybind11/|Python\.h|torch/extension\.h|torch/python\.h|"
                    r"torch/csrc/(?!autograd/(engine|graph_task)\.h>))")
LOCAL = re.compile(r'#include\s*"(net/\w+|python/testing|\w+)/')


def sources(layer):
    return sorted(p for p in (ROOT / "csrc" / layer).iterdir() if p.suffix in (".h", ".cpp"))


def test_the_layers_are_the_folders_of_csrc():
    folders = {p.name for p in (ROOT / "csrc").iterdir() if p.is_dir() and p.name != "net"}
    folders |= {f"net/{p.name}" for p in (ROOT / "csrc" / "net").iterdir() if p.is_dir()}
    folders |= {f"python/{p.name}" for p in (ROOT / "csrc" / "python").iterdir() if p.is_dir()}
    assert folders == set(MAY_INCLUDE)
    assert not sources("net"), "csrc/net holds its three folders only"


@pytest.mark.parametrize("layer", sorted(MAY_INCLUDE))
def test_includes_go_down_only(layer):
    upward = [f"{path.relative_to(ROOT)} includes {included}/"
              for path in sources(layer)
              for included in LOCAL.findall(path.read_text())
              if included != layer and included not in MAY_INCLUDE[layer]]
    assert not upward, upward


def test_client_and_server_never_include_each_other_and_the_wire_neither():
    assert CLIENT not in MAY_INCLUDE[SERVER] and SERVER not in MAY_INCLUDE[CLIENT]
    assert not {CLIENT, SERVER} & MAY_INCLUDE[WIRE]


@pytest.mark.parametrize("layer", ["store", WIRE, CLIENT, SERVER, "server"])
def test_store_net_and_server_know_nothing_of_torch_or_python(layer):
    found = [str(path.relative_to(ROOT)) for path in sources(layer)
             if TORCH.search(path.read_text()) or PYTHON.search(path.read_text())]
    assert not found, found


@pytest.mark.parametrize("layer", ["device", "kernels"])
def test_only_csrc_python_binds_to_python(layer):
    found = [str(path.relative_to(ROOT)) for path in sources(layer) if PYTHON.search(path.read_text())]
    assert not found, found


def test_the_test_module_knows_nothing_of_torch():
    found = [str(path.relative_to(ROOT)) for path in sources(TESTING) if TORCH.search(path.read_text())]
    assert not found, found


def test_the_test_module_uses_no_torch_file_of_csrc_python():
    # It links csrc/python's store_errors and table_policy_binding; the rest of csrc/python is _C's.
    python_files = {m for path in sources(TESTING) for m in re.findall(r'#include\s*"python/(\w+)\.h"', path.read_text())}
    assert python_files <= {"store_errors", "table_policy_binding"}, python_files
    for name in python_files:
        for suffix in (".h", ".cpp"):
            text = (ROOT / "csrc" / "python" / (name + suffix)).read_text()
            assert not TORCH.search(text) and "torch/" not in text, name + suffix


def test_kernels_ask_the_row_path_what_a_table_can_do():
    # RowPathTraits (store/table_handle.h) answers whether a table pools rows, pools gradients and
    # wants a batch whole; a kernel that read the policy or the table's location would decide it
    # again, differently.
    found = [f"{path.relative_to(ROOT)}: {m}" for path in sources("kernels")
             for m in re.findall(r"\.(policy|policy_state|in_process|pools_gradients)\(", path.read_text())]
    assert not found, found


def test_the_bindings_reach_table_facets_without_dynamic_cast():
    found = [str(path.relative_to(ROOT)) for layer in ("python", TESTING) for path in sources(layer)
             if "dynamic_cast" in path.read_text()]
    assert not found, found
