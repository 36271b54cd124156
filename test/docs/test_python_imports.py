"""The torch_recdev package imports form no cycle, and no module imports another of the package
inside a function (the way a cycle hides). Store selection lives in one module that imports none of
the others but the extension and the operations in flight."""

import ast

from doc_blocks import ROOT

PACKAGE = ROOT / "torch_recdev"


def _package_imports(tree):
    """(module names of the package a tree imports, line numbers of those inside a function)."""
    names, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found = [node.module] if node.module else [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_recdev"):
            found = [node.module.split(".")[1]] if "." in node.module else [a.name for a in node.names]
        else:
            continue
        names.update(n.split(".")[0] for n in found)
        nested.append(node)
    inside = {node.lineno for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn) if node in nested}
    return names, inside


def _graph():
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    graph, nested = {}, []
    for name, path in modules.items():
        imported, inside = _package_imports(ast.parse(path.read_text(), str(path)))
        graph[name] = {m for m in imported if m in modules and m != name}
        nested += [f"torch_recdev/{path.name}:{line}" for line in sorted(inside)]
    return graph, nested


def test_no_module_imports_the_package_inside_a_function():
    _, nested = _graph()
    assert not nested, f"imports of torch_recdev modules inside functions: {nested}"


def test_the_package_imports_form_no_cycle():
    graph, _ = _graph()
    done, on_path = set(), []

    def visit(module):
        if module in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(module):] + [module]))
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_store_selection_imports_nothing_above_it():
    graph, _ = _graph()
    assert graph["stores"] <= {"pending"}, graph["stores"]
