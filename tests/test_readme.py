"""Every Python block of the README runs as written (issue 16).

Each ```python block of README.md runs in a fresh namespace, from the repository's root
(where `docs/cifar10/` is), with only the values on lines the README marks `# yours`
replaced: the CIFAR-10 folder by a folder of the ten JPEGs of `docs/cifar10/` (one per
class), the epochs by one, the export's folder by a temporary one. A block that loads
the zoo's CIFAR-10 weights is skipped, with the reason, while none are shipped.
"""

import os
import re
import shutil

import pytest

from keras_preact import pretrained
from tests.conftest import ROOT

pytestmark = pytest.mark.tensorflow  # the blocks use tf.data and export SavedModels

README = os.path.join(ROOT, "README.md")
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
YOURS = "# yours"
SAMPLES = os.path.join(ROOT, "docs", "cifar10")


def substitutions(tmp_path):
    """{text on a `# yours` line: what the test runs instead}."""
    return {
        '"cifar10-jpeg/train"': repr(str(sample_folder(tmp_path))),
        "epochs=200": "epochs=1",
        "epochs=30": "epochs=1",
        '"saved_models/my_resnet20"': repr(str(tmp_path / "saved_models" / "my_resnet20")),
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


def readme_blocks():
    with open(README) as file:
        return BLOCK.findall(file.read())


def substituted(block, replacements):
    """`block` with `replacements` applied, each only on the lines marked `# yours`."""
    lines = []
    for line in block.splitlines(keepends=True):
        if YOURS in line:
            for text, replacement in replacements.items():
                line = line.replace(text, replacement)
        lines.append(line)
    return "".join(lines)


def test_the_readme_has_its_blocks_and_each_substitution_is_on_a_yours_line(tmp_path):
    blocks = readme_blocks()
    assert len(blocks) >= 8
    yours_lines = [line for block in blocks for line in block.splitlines() if YOURS in line]
    for text in substitutions(tmp_path):
        assert any(text in line for line in yours_lines), f"{text} is on no line the README marks {YOURS!r}"


@pytest.mark.parametrize("index", range(len(readme_blocks())),
                         ids=[block.splitlines()[-1][:40] for block in readme_blocks()])
def test_readme_block_runs_as_written(index, tmp_path, monkeypatch):
    block = readme_blocks()[index]
    if 'weights="cifar10"' in block and "resnet20" not in pretrained.shipped_networks("cifar10"):
        pytest.skip("the zoo ships no CIFAR-10 ResNet-20 yet (keras_preact/weights/registry.json)")
    monkeypatch.chdir(ROOT)
    code = substituted(block, substitutions(tmp_path))
    exec(compile(code, f"README.md block {index + 1}", "exec"), {"__name__": "readme"})
