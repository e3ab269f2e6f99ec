"""What `pip install keras-preact` puts into site-packages: the library, the training code
under a name of its own, and the `keras-preact` console command (pyproject.toml)."""

import ast
import glob
import os
import re
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
    assert not any(name.startswith("tensorflow") for name in extras[None] + extras["training-core"] + extras["serve"])
    assert any(name.startswith("tensorflow") for name in extras["tensorflow"])
    assert any("tensorflow" in name for name in extras["training"])
    # Keras' upper bound is the application's (its optimizer overrides private methods), not the library's.
    assert "keras>=3.5" in extras[None] and "keras<3.16" in extras["training"]


def requirement_name(requirement):
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def wheel_extras():
    """{extra or None: [requirement names]} of the repository's pyproject.toml."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        project = tomllib.load(file)["project"]
    return {
        None: [requirement_name(requirement) for requirement in project["dependencies"]],
        **{
            extra: [requirement_name(requirement) for requirement in requirements]
            for extra, requirements in project["optional-dependencies"].items()
        },
    }


@pytest.mark.commands
def test_the_serve_extra_holds_what_the_onnxruntime_server_imports(tmp_path):
    """Every distribution whose modules the onnxruntime server imports (its command, application,
    runtime and decoders, in a process where TensorFlow cannot be imported) is the library's own
    requirement, the `serve` extra's, or installed by one of them."""
    from importlib import metadata

    probe = (
        "import sys\n"
        "from keras_preact_training.commands import serve\n"
        "from keras_preact_training.serving import application, image_formats, onnx_runtime, server\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    environment = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "without_tensorflow"))
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=environment, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tensorflow" not in result.stdout.split()
    # And what the server's files import inside functions, where it starts or loads a model.
    lazily = set()
    for file in glob.glob(os.path.join(ROOT, "keras_preact_training", "serving", "*.py")):
        if not file.endswith("tensorflow_runtime.py"):
            for node in ast.walk(ast.parse(open(file).read())):
                if isinstance(node, ast.Import):
                    lazily |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    lazily.add(node.module.split(".")[0])
    distributions = metadata.packages_distributions()
    imported = {
        requirement_name(distribution)
        # Not the private modules a .pth file loads into every process (setuptools' _distutils_hack).
        for module in set(result.stdout.split()) | (lazily - {"tensorflow"})
        if not module.startswith("_")
        for distribution in distributions.get(module, ())
    } - {"keras-preact"}
    extras = wheel_extras()
    installed, waiting = set(), extras[None] + extras["serve"]
    while waiting:
        name = waiting.pop()
        if name in installed:
            continue
        try:
            requires = metadata.requires(name) or ()
        except metadata.PackageNotFoundError:  # a requirement of another Python (its marker), not installed
            continue
        installed.add(name)
        waiting += [requirement_name(requirement) for requirement in requires if "extra ==" not in requirement]
    assert "onnxruntime" in imported and "hypercorn" in imported and "tensorflow" not in imported
    assert sorted(imported - installed) == []


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
