"""The CIFAR-10 image folder's one place and `keras-preact data`, which makes it from an archive;
commands that read an image folder refuse a missing or misshapen one at once, saying how a
folder is laid out and made; offline, a data set that would be downloaded fails at once."""

import os
import shutil
import subprocess
import tarfile
import zipfile

import pytest

from keras_preact_training import data_folder
from tests.conftest import KERAS_PREACT, ROOT

SAMPLES = os.path.join(ROOT, "docs", "cifar10")
pytestmark = pytest.mark.commands


def sample_folder(root):
    """`root/{train,test}/<class>/<class>_0000.jpg`: the ten docs JPEGs in both splits."""
    for split in ("train", "test"):
        for name in sorted(os.listdir(SAMPLES)):
            if name.endswith(".jpg"):
                folder = root / split / name.rsplit("_", 1)[0]
                folder.mkdir(parents=True)
                shutil.copy(os.path.join(SAMPLES, name), folder / name)
    return root


def archive_of(folder, path, top=None):
    """A tar.xz or zip of `folder`'s contents, under the top folder `top` where given."""
    if str(path).endswith(".zip"):
        with zipfile.ZipFile(path, "w") as archive:
            for directory, _, files in os.walk(folder):
                for name in files:
                    relative = os.path.relpath(os.path.join(directory, name), folder)
                    archive.write(os.path.join(directory, name), os.path.join(top or "", relative))
    else:
        with tarfile.open(path, "w:xz") as archive:
            for entry in sorted(os.listdir(folder)):
                archive.add(folder / entry, os.path.join(top or "", entry))
    return str(path)


def run(*arguments):
    return subprocess.run([KERAS_PREACT, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name, top", [("images.tar.xz", "cifar10-jpeg"), ("images.zip", None)])
def test_data_makes_the_folder_from_an_archive_once(tmp_path, name, top):
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / name, top)
    destination = str(tmp_path / "cache" / "cifar10-jpeg")
    made = run("data", archive, "--data-dir", destination)
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"Made: {destination}, 10 training and 10 test images in 10 classes.\n"
    assert sorted(os.listdir(os.path.join(destination, "train"))) == sorted(os.listdir(tmp_path / "source" / "train"))
    assert sorted(os.listdir(tmp_path / "cache")) == ["cifar10-jpeg", "cifar10-jpeg.done", "cifar10-jpeg.lock"]
    again = run("data", archive, "--data-dir", destination)
    assert again.stdout.startswith(f"Already made: {destination}, 10 training")


def test_an_extraction_stopped_midway_is_made_again(tmp_path):
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / "images.tar.xz")
    destination = tmp_path / "cifar10-jpeg"
    (destination / "train" / "cat").mkdir(parents=True)  # left by an extraction that never finished
    assert data_folder.extract(archive, str(destination)) == str(destination)
    assert data_folder.counts(str(destination)) == {"train": (10, 10), "test": (10, 10)}


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda tmp_path: str(tmp_path / "missing.tar.xz"),
            "No archive at {tmp}/missing.tar.xz: an archive of an image "
            "folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one folder per class) is expected.",
        ),
        (
            lambda tmp_path: (tmp_path / "notes.txt").write_text("not an archive") and str(tmp_path / "notes.txt"),
            "{tmp}/notes.txt is neither a tar nor a zip archive.",
        ),
        (
            lambda tmp_path: archive_of(sample_folder(tmp_path / "source") / "train", tmp_path / "train-only.zip"),
            "{tmp}/train-only.zip holds no image folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one "
            "folder per class) at its top or in its one top folder.",
        ),
    ],
    ids=["missing", "not an archive", "no train and test"],
)
def test_data_refuses_what_is_not_an_archive_of_an_image_folder(tmp_path, make, message):
    result = run("data", make(tmp_path), "--data-dir", str(tmp_path / "cifar10-jpeg"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "cifar10-jpeg").exists() and not (tmp_path / "cifar10-jpeg.done").exists()
    assert [name for name in os.listdir(tmp_path) if name.startswith(".extracting")] == []


@pytest.mark.parametrize(
    "arguments",
    [
        ["evaluate", "--model", "resnet20"],
        ["train", "--config", "cifar10_zoo", "--set", "dataset=folder"],
    ],
    ids=["evaluate", "train"],
)
def test_commands_refuse_a_missing_image_folder_before_loading_tensorflow(tmp_path, arguments):
    """In a process where TensorFlow cannot be imported, the folder's error comes first: it is
    checked before anything loads (0.1 s against 4-29 s)."""
    hidden = os.path.join(ROOT, "tests", "without_tensorflow")
    result = subprocess.run(
        [KERAS_PREACT, *arguments, "--data-dir", str(tmp_path / "nowhere")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": hidden, "KERAS_BACKEND": "tensorflow"},
    )
    assert result.returncode == 2
    assert result.stderr == (
        "error: dataset=folder needs --data-dir to be an image folder (DIR/train/<class>/<image> and "
        "DIR/test/<class>/<image>, one folder per class; `keras-preact data ARCHIVE` makes "
        f"{data_folder.CIFAR10_FOLDER} from an archive of one, docs/training.md#data). "
        f"Received: data_dir={str(tmp_path / 'nowhere')!r}\n"
    )


def test_evaluate_refuses_weights_that_do_not_ship_before_reading_the_data(tmp_path):
    root = sample_folder(tmp_path / "images")
    (root / "test" / "cat" / "cat_0000.jpg").write_bytes(b"not an image: an error, were the data read first")
    result = run("evaluate", "--model", "resnet1202", "--data-dir", str(root))  # the paper's overfit example
    assert result.returncode == 2
    assert result.stderr.startswith("error: keras-preact ships cifar10 weights for these networks only")
    assert "Received: model='resnet1202'" in result.stderr


@pytest.mark.tensorflow
def test_offline_a_data_set_to_download_fails_at_once_with_the_route_to_local_data(tmp_path, monkeypatch):
    from keras_preact_training import configs, input_tensorflow

    # A name that never resolves (RFC 2606), as every name does offline.
    monkeypatch.setitem(input_tensorflow.DOWNLOAD_HOSTS, "cifar10", "download.invalid")
    config = configs.CONFIGS["cifar10_paper"].override(f"data_dir={tmp_path}")
    with pytest.raises(FileNotFoundError) as error:
        input_tensorflow.tfds_dataset(config)
    assert str(error.value).startswith(f"'cifar10' is not prepared in {tmp_path}/cifar10/")
    assert "its download server download.invalid cannot be reached" in str(error.value)
    assert "or train with --set dataset=folder on an image folder (DIR/train/<class>/<image>" in str(error.value)


def test_the_errors_send_users_to_a_place_that_exists():
    assert "docs/training.md#data" in data_folder.ROUTE
    with open(os.path.join(ROOT, "docs", "training.md")) as file:
        assert "\n{: #data }\n" in file.read()
