"""What `pip install keras-preact` puts into site-packages: the library, the training code
under a name of its own, and the `keras-preact` console command (pyproject.toml)."""

import os
import subprocess
import sys
import zipfile

import pytest

import keras_preact
from tests.conftest import KERAS_PREACT, ROOT

SUBCOMMANDS = (
    "train",
    "configs",
    "diagnose",
    "evaluate",
    "publish",
    "zoo",
    "compare",
    "export",
    "serve",
    "query",
    "tune",
    "ablate",
)


def build_wheel(folder):
    """The wheel pip would install, built from the repository (no network: this Python's setuptools)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            ROOT,
            "-w",
            str(folder),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = [name for name in os.listdir(folder) if name.endswith(".whl")]
    return os.path.join(folder, wheel)


def test_the_wheel_installs_no_top_level_training_module_and_the_console_command(tmp_path):
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(next(name for name in names if name.endswith(".dist-info/entry_points.txt")))
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"keras_preact", "keras_preact_training"}
    assert "keras_preact_training/serving/server.py" in names and "keras_preact/weights/registry.json" in names
    assert "keras-preact = keras_preact_training.cli:main" in entry_points.decode()


def test_a_users_own_training_module_and_the_package_do_not_shadow_each_other(tmp_path):
    """From a folder holding the user's training.py, `import training` is theirs and the
    console command still runs ours."""
    (tmp_path / "training.py").write_text("WHOSE = 'the user'\n")
    theirs = subprocess.run(
        [
            sys.executable,
            "-c",
            "import training, keras_preact_training.train.named_configs as ours; print(training.WHOSE, sorted(ours.CONFIGS)[0])",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.split() == ["the", "user", "cifar100_paper"]
    result = subprocess.run([KERAS_PREACT, "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: keras-preact")
    assert all(subcommand in result.stdout for subcommand in SUBCOMMANDS)


def test_the_console_command_answers_configs_from_anywhere(tmp_path):
    result = subprocess.run([KERAS_PREACT, "configs"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "keras-preact train --config digits_demo" in result.stdout


def test_the_library_and_training_without_tensorflow_need_no_tensorflow(tmp_path):
    """`pip install keras-preact` and its `training-core` extra (train and evaluate under JAX or
    PyTorch) ask for no TensorFlow; the `tensorflow` and `training` extras do."""
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        metadata = wheel.read(next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")))
    requirements = [
        line.split(":", 1)[1].strip() for line in metadata.decode().splitlines() if line.startswith("Requires-Dist:")
    ]
    extras = {}
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        extra = marker.split("extra ==")[1].strip().strip("'\"") if "extra ==" in marker else None
        extras.setdefault(extra, []).append(name.strip())
    assert not any(name.startswith("tensorflow") for name in extras[None] + extras["training-core"])
    assert any(name.startswith("tensorflow") for name in extras["tensorflow"])
    assert any("tensorflow" in name for name in extras["training"])


def library_imports():
    """{module of keras_preact: the keras_preact modules it imports, at its top or in a function}."""
    import ast

    folder = os.path.join(ROOT, "keras_preact")
    graph = {}
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".py") or file == "__init__.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(open(os.path.join(folder, file)).read())):
            if isinstance(node, ast.ImportFrom) and node.module == "keras_preact":
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_preact."):
                imported.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("keras_preact.")}
        graph[file[:-3]] = imported - {file[:-3]}
    return graph


def test_the_library_has_no_import_circle():
    """Layer modules import downward (walks over whole networks live above the layers), so
    that no module needs another that needs it back."""
    graph = library_imports()
    assert graph["walks"] >= {"base_layers", "stacked"} and "walks" not in graph["base_layers"] | graph["stacked"]

    def circle_from(start, path):
        for module in sorted(graph.get(path[-1], ())):
            if module == start:
                return [*path, module]
            if module not in path and (found := circle_from(start, [*path, module])):
                return found
        return None

    circles = [circle for module in graph if (circle := circle_from(module, [module]))]
    assert circles == [], f"import circles: {circles}"


@pytest.mark.commands
@pytest.mark.parametrize("name", sorted(keras_preact._SUBMODULES))
def test_each_module_loads_first_in_a_fresh_process(name):
    """`import keras_preact` then any of its modules, before Keras is imported: the module's
    own `import keras` registers the layers (`keras_preact._register_layers`), which imports the
    model functions while that module is half-imported; none may need it whole by then. Run on
    Keras' NumPy backend, which imports in half TensorFlow's time (the import order does not
    depend on the backend)."""
    result = subprocess.run(
        [sys.executable, "-c", f"import keras_preact; print(keras_preact.{name}.__name__)"],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="numpy"),
    )
    assert result.returncode == 0 and result.stdout.strip() == f"keras_preact.{name}", result.stderr[-2000:]
