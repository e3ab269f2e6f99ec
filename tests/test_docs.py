"""The README and the documentation pages: every Python block runs as written, the site
builds with MkDocs in strict mode, and the README stays the short front door.

Each ```python block of README.md and docs/*.md runs in a fresh namespace, from the
repository's root (where `docs/cifar10/` is), with only the values on lines marked
`# yours` replaced: the CIFAR-10 folder by a folder of the ten JPEGs of `docs/cifar10/`
(one per class), the epochs by one, the export's folder by a temporary one. A block that
loads the zoo's CIFAR-10 weights is skipped, with the reason, while none are shipped.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from keras_preact import pretrained
from keras_preact_training.train import configs
from tests.conftest import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
DOCUMENTS = [README] + sorted(os.path.join(DOCS, name) for name in os.listdir(DOCS) if name.endswith(".md"))
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
YOURS = "# yours"
SAMPLES = os.path.join(DOCS, "cifar10")
README_MOST_LINES = 250
# The blocks use tf.data and export SavedModels; the site and the README's checks need no
# backend, and run once, in the TensorFlow run.
pytestmark = pytest.mark.tensorflow


def substitutions(tmp_path):
    """{text on a `# yours` line: what the test runs instead}."""
    return {
        '"~/.cache/keras-preact/cifar10-png/train"': repr(str(sample_folder(tmp_path))),
        '"cifar10-png/train"': repr(str(tmp_path / "train")),
        "epochs=200": "epochs=1",
        "epochs=60": "epochs=1",
        '"saved_models/my_resnet20"': repr(str(tmp_path / "saved_models" / "my_resnet20")),
        '"presets/my_resnet20"': repr(str(tmp_path / "presets" / "my_resnet20")),
    }


def sample_folder(tmp_path):
    """`<tmp>/train/<class>/<class>_0000.jpg`: the ten docs JPEGs as an image folder."""
    folder = tmp_path / "train"
    if not folder.exists():
        for name in sorted(os.listdir(SAMPLES)):
            if name.endswith(".jpg"):
                (folder / name.rsplit("_", 1)[0]).mkdir(parents=True)
                shutil.copy(os.path.join(SAMPLES, name), folder / name.rsplit("_", 1)[0] / name)
    return folder


def read(path):
    with open(path) as file:
        return file.read()


def python_blocks():
    """[(document's path relative to the root, block number from 1, code)] of every document."""
    return [
        (os.path.relpath(path, ROOT), number, code)
        for path in DOCUMENTS
        for number, code in enumerate(BLOCK.findall(read(path)), start=1)
    ]


def substituted(block, replacements):
    """`block` with `replacements` applied, each only on the lines marked `# yours`."""
    lines = []
    for line in block.splitlines(keepends=True):
        if YOURS in line:
            for text, replacement in replacements.items():
                line = line.replace(text, replacement)
        lines.append(line)
    return "".join(lines)


def test_the_documents_have_their_blocks_and_each_substitution_is_on_a_yours_line(tmp_path):
    blocks = python_blocks()
    assert len(blocks) >= 10 and sum(path == "README.md" for path, _, _ in blocks) == 3
    yours_lines = [line for _, _, block in blocks for line in block.splitlines() if YOURS in line]
    for text in substitutions(tmp_path):
        assert any(text in line for line in yours_lines), f"{text} is on no line a document marks {YOURS!r}"


@pytest.mark.parametrize(
    "path, number, block", python_blocks(), ids=[f"{path}:{number}" for path, number, _ in python_blocks()]
)
def test_every_python_block_runs_as_written(path, number, block, tmp_path, monkeypatch):
    if 'weights="cifar10"' in block and "resnet20" not in pretrained.shipped_networks("cifar10"):
        pytest.skip("the zoo ships no CIFAR-10 ResNet-20 yet (keras_preact/weights/registry.json)")
    monkeypatch.chdir(ROOT)
    code = substituted(block, substitutions(tmp_path))
    exec(compile(code, f"{path} block {number}", "exec"), {"__name__": "documentation"})


def test_the_readme_is_the_short_front_door_with_a_map_of_every_page():
    text = read(README)
    assert len(text.splitlines()) <= README_MOST_LINES
    with open(os.path.join(ROOT, "mkdocs.yml")) as file:
        navigation = yaml.safe_load(file)["nav"]
    pages = [page for entry in navigation for page in entry.values()]
    for page in pages:
        if page != "index.md":
            assert f"(docs/{page})" in text, f"the README's map does not link docs/{page}"


def test_the_zoo_tables_are_the_registrys(tmp_path):
    """The README's tables are what `keras-preact zoo` and `zoo --units` print from the registry,
    in at most 100 columns a line; the zoo page's every data set's `zoo --wide` and `zoo --units`:
    a network's row lands with its entry."""
    from keras_preact_training.experiments import zoo_tables

    readme = read(README)
    assert zoo_tables.short_table() in readme, "the README's table is not `keras-preact zoo`'s"
    assert zoo_tables.unit_comparison_table() in readme, "the README's units table is not `keras-preact zoo --units`'s"
    assert max(len(line) for line in zoo_tables.short_table().splitlines()) <= zoo_tables.SHORT_WIDTH
    zoo_page = read(os.path.join(DOCS, "zoo.md"))
    for dataset in ("cifar10", "cifar100"):
        assert zoo_tables.markdown_table(dataset=dataset) in zoo_page, (
            f"zoo.md's is not `zoo --wide --dataset {dataset}`'s"
        )
        assert zoo_tables.unit_comparison_table(dataset=dataset) in zoo_page, dataset
        assert f"\n\n{zoo_tables.curve_images(dataset=dataset)}\n\n" in zoo_page, dataset


def test_the_zoo_page_shows_every_shipped_networks_curves_in_the_tables_order():
    from keras_preact_training.experiments import zoo_tables

    images = zoo_tables.curve_images()
    assert images.splitlines()[:3] == [
        "![Test error and training loss of the zoo's pre-activation ResNet-20](zoo_resnet20_curves.png)",
        "![Test error and training loss of the zoo's original ResNet-20](zoo_resnet20_original_curves.png)",
        "![Test error and training loss of the zoo's pre-activation ResNet-56](zoo_resnet56_curves.png)",
    ]
    assert f"\n\n{images}\n\n" in read(os.path.join(DOCS, "zoo.md"))
    for name, _ in zoo_tables.in_table_order():
        assert os.path.exists(os.path.join(DOCS, f"zoo_{name}_curves.png")), name


def load_land_zoo_run():
    from scripts import land_zoo_run

    return land_zoo_run


def test_landing_a_zoo_run_replaces_each_table_and_nothing_else():
    """scripts/land_zoo_run.py rewrites a document's table from its header line to the blank line."""
    land_zoo_run = load_land_zoo_run()
    text = "Intro.\n\n| network | error |\n|---|---|\n| resnet20 | 14.87 |\n\nAfter.\n\n| other |\n|---|\n"
    table = "| network | error |\n|---|---|\n| resnet20 | 11.50 |\n| resnet56 | 9.00 |"
    assert land_zoo_run.replace_table(text, table) == (
        "Intro.\n\n| network | error |\n|---|---|\n| resnet20 | 11.50 |\n| resnet56 | 9.00 |\n\nAfter.\n\n"
        "| other |\n|---|\n"
    )
    with pytest.raises(ValueError, match=re.escape("no table with the header '| network | parameters |' to replace")):
        land_zoo_run.replace_table(text, "| network | parameters |\n|---|---|")


def test_landing_a_zoo_run_replaces_the_paragraph_of_curve_images():
    land_zoo_run = load_land_zoo_run()
    start = land_zoo_run.zoo_tables.CURVE_IMAGE_START
    text = f"Table.\n\n{start} pre-activation ResNet-20](zoo_resnet20_curves.png)\n\n**Status.**\n"
    images = (
        f"{start} pre-activation ResNet-20](zoo_resnet20_curves.png)\n"
        f"{start} original ResNet-20](zoo_resnet20_original_curves.png)"
    )
    assert land_zoo_run.replace_curve_images(text, images) == f"Table.\n\n{images}\n\n**Status.**\n"
    with pytest.raises(ValueError, match="no paragraph of images beginning"):
        land_zoo_run.replace_curve_images("Table.\n\n**Status.**\n", images)


def test_landing_a_zoo_run_draws_its_curves_from_its_log_titled_with_the_data_folder(tmp_path, monkeypatch):
    land_zoo_run = load_land_zoo_run()
    drawn = []
    monkeypatch.setattr(
        land_zoo_run.plots, "training_curves", lambda *arguments, **options: drawn.append((arguments, options))
    )
    run_dir = tmp_path / "zoo-resnet20"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"dataset": "folder", "data_dir": "/home/user/.cache/cifar10-png"}))
    land_zoo_run.draw_curves(str(run_dir), "resnet20", str(tmp_path / "curves.png"))
    assert drawn == [
        (
            (str(run_dir / "log.csv"), str(tmp_path / "curves.png")),
            {"title": "resnet20 on cifar10-png", "averages": configs.AVERAGE_NAMES},
        )
    ]


def mkdocs_build(folder, site):
    """`mkdocs build --strict` of the project in `folder` (the Material theme's notice off)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=folder,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )


def test_the_site_builds_in_strict_mode_and_a_broken_link_fails_it(tmp_path):
    """`mkdocs build --strict`: every page of the nav, every link and anchor resolved, and the
    home page holding the README's quick starts."""
    built = mkdocs_build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    for page in ("networks", "zoo", "training", "serving", "paper", "benchmarks", "tests"):
        assert (tmp_path / "site" / page / "index.html").exists(), page
    home = (tmp_path / "site" / "index.html").read_text()
    for line in ("keras-preact query --model cifar10_resnet20", "Trained networks load the Keras Applications way"):
        assert line in home, f"the site's home page lacks the README's quick starts: {line!r}"
    assert "--8&lt;--" not in home and "--8<--" not in home
    broken = tmp_path / "broken"
    shutil.copytree(DOCS, broken / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), broken)
    shutil.copy(README, broken)
    with open(broken / "docs" / "zoo.md", "a") as file:
        file.write("\nSee [the missing section](networks.md#no-such-section).\n")
    failed = mkdocs_build(broken, tmp_path / "other")
    assert failed.returncode != 0 and "no-such-section" in failed.stderr
