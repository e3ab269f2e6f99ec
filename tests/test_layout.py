"""The training package's layout: each folder imports only folders below it (and itself), so
that its design reads from the data up to the commands."""

import ast
import os

from tests.conftest import ROOT

PACKAGE = os.path.join(ROOT, "training")
# Each folder (or base module) with its place, lowest first: a module may import its own
# folder's modules and those of lower places, never higher ones.
PLACES = {
    "checked_files": 0,
    "plots": 0,
    "defaults": 0,
    "data": 1,
    "train": 2,
    "export": 3,
    "serving": 4,
    "experiments": 5,
    "commands": 6,
    "cli": 6,
    "__main__": 6,
}


def modules():
    """(dotted name under the package, path) of every module."""
    for directory, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                relative = os.path.relpath(os.path.join(directory, name), PACKAGE)[: -len(".py")]
                yield relative.replace(os.sep, "."), os.path.join(directory, name)


def imported(module, path):
    """The package's modules and packages that `module` imports, as dotted names."""
    with open(path) as file:
        tree = ast.parse(file.read())
    here = module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names if not node.module else [None]:
                    yield f"{target}.{alias.name}".strip(".") if alias else target
            elif node.module and node.module.startswith("keras_preact_training"):
                yield node.module.removeprefix("keras_preact_training").strip(".")


def place(module):
    return PLACES[module.split(".")[0]]


def test_every_module_has_a_place():
    assert sorted({name.split(".")[0] for name, _ in modules()} - {"__init__"}) == sorted(
        set(PLACES) & {name.split(".")[0] for name, _ in modules()}
    )


def test_no_folder_imports_a_higher_one():
    upward = [
        f"{module} imports {target}"
        for module, path in modules()
        if module != "__init__"
        for target in imported(module, path)
        if target and place(target) > place(module)
    ]
    assert upward == []
