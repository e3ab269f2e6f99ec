"""The repository's layout: its folders are floors, each importing only its own floor and those
below it, and no module imports itself back through others, so that the design reads from the
library up to the commands, the benchmarks, the zoo's scripts and the tests."""

import ast
import os

from tests.conftest import ROOT

# The repository's packages, lowest first: a module may import its own package and lower ones.
FLOORS = ["keras_preact", "keras_preact_training", "bench", "scripts", "tests"]
# keras_preact_training's folders (or base modules), lowest first, the same way: the data, then
# training, export, serving, the experiments and the commands that run them all.
ROOMS = {
    "checked_files": 0,
    "plots": 0,
    "defaults": 0,
    "failures": 0,
    "tensorflow_import": 0,
    "data": 1,
    "train": 2,
    "export": 3,
    "serving": 4,
    "experiments": 5,
    "commands": 6,
    "cli": 7,
    "__main__": 8,
}
# bench/'s scripts run as `python bench/NAME.py`: Python puts bench/ itself on the path, so they
# import each other by bare name (`from harness import machine`).
SCRIPT_FOLDERS = {"bench"}


def modules():
    """{dotted name: path} of every Python module of the repository's packages."""
    found = {}
    for floor in FLOORS:
        for directory, folders, names in os.walk(os.path.join(ROOT, floor)):
            folders[:] = [folder for folder in folders if not folder.startswith((".", "__pycache__"))]
            for name in names:
                if name.endswith(".py"):
                    relative = os.path.relpath(os.path.join(directory, name), ROOT)[: -len(".py")]
                    found[relative.replace(os.sep, ".").removesuffix(".__init__")] = os.path.join(directory, name)
    return found


def imports(module, path, known):
    """The repository's modules that `module` imports anywhere in its file (a lazy import inside a
    function counts: it runs as surely), as dotted names of `known`."""
    with open(path) as file:
        tree = ast.parse(file.read())
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    floor = module.split(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            names += [f"{base}.{alias.name}" for alias in node.names] + [base]
    for name in names:
        if floor in SCRIPT_FOLDERS and name.split(".")[0] not in FLOORS:
            name = f"{floor}.{name}"
        # The longest known module the name starts with (`from a.b import c` names a.b.c or a.b).
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            target = ".".join(parts[:end])
            if target in known:
                if target != module:
                    yield target
                break


def graph():
    """{module: the modules it imports}. A package's `__init__` that imports its own modules (to
    register them, or as a facade that names their functions) is their front, not their user: those
    edges are left out, so that a module importing its package's shared names makes no circle."""
    known = modules()
    return {
        module: {target for target in imports(module, path, known) if not target.startswith(f"{module}.")}
        for module, path in known.items()
    }


def height(module):
    """(floor, room): where a module stands."""
    parts = module.split(".")
    floor = FLOORS.index(parts[0])
    room = ROOMS[parts[1]] if parts[0] == "keras_preact_training" and len(parts) > 1 else 0
    return floor, room


def circles(edges):
    """Each import circle once, as the list of its modules (Tarjan's strongly connected components
    of more than one module)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(edges[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_every_application_module_has_a_room():
    rooms = {module.split(".")[1] for module in modules() if module.startswith("keras_preact_training.")}
    assert sorted(rooms - set(ROOMS)) == []


def test_no_module_imports_a_higher_floor():
    edges = graph()
    upward = [
        f"{module} imports {target}"
        for module in sorted(edges)
        for target in sorted(edges[module])
        if height(target) > height(module)
    ]
    assert upward == []


def test_no_import_circle():
    assert circles(graph()) == []


def test_the_checks_see_an_upward_import_and_a_circle():
    """The two checks on a made-up graph: they find what they are there to find."""
    edges = {
        "keras_preact.a": {"keras_preact_training.serving.b"},
        "keras_preact_training.serving.b": {"keras_preact.a"},
    }
    assert circles(edges) == [["keras_preact.a", "keras_preact_training.serving.b"]]
    assert height("keras_preact_training.serving.b") > height("keras_preact.a")
