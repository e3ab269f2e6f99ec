"""Input pipelines: data sets, their order, sharding over replicas and workers, batching.

The order of the training examples is a pure function of (seed, epoch, position), so a
resumed run skips exactly the examples it has seen, before decoding them, and every
worker of a multi-worker run computes the same order and keeps its own share. Epochs
use only full global batches.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from .serving import contract

# Where a pipeline's decoding runs in parallel; tf.data picks the degree.
AUTOTUNE = tf.data.AUTOTUNE
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# Examples held back as the test split of the digits (the last 360 of scikit-learn's
# 1,797, about 20 % and 33-37 of each class).
DIGITS_TEST_EXAMPLES = 360
# tensorflow-datasets splits up to this size are held in memory as encoded images and
# indexed like arrays (CIFAR's 50,000 PNGs: about 150 MB); larger ones (ImageNet) are
# streamed through a shuffle buffer of STREAM_SHUFFLE_BUFFER records.
IN_MEMORY_EXAMPLES = 100_000
STREAM_SHUFFLE_BUFFER = 20_000


@dataclasses.dataclass
class Split:
    """One split: `items` (images, or file paths), `labels`, and how to decode an item.

    `items` is an array indexed by example; `stream`, for data sets too large for
    memory, a `tf.data.Dataset` of (item, label) in a fixed order, with `size` examples.
    """

    labels: np.ndarray = None
    items: np.ndarray = None
    stream: tf.data.Dataset = None
    size: int = None
    decode: object = None

    def __post_init__(self):
        if self.size is None:
            self.size = len(self.labels)


@dataclasses.dataclass
class DataSet:
    """The splits of a data set; `validation` is held out of the training set, or `None`."""

    train: Split
    test: Split
    class_names: list
    image_shape: tuple
    validation: Split = None


def load(config):
    """The data set of `config`, its splits cut to `train_examples` and `test_examples`.

    Every file of an image folder's splits is decoded once here (about 10 s for CIFAR-10's
    60,000 JPEGs on 2 cores), so that a truncated or corrupt image is an error that names
    it before training, not a traceback of the input pipeline that does not.

    Raises:
        FileNotFoundError: for a data directory that does not exist or has no images.
        ValueError: for an unknown data set, or an image folder with an empty class
            folder, test classes that train/ has not, or files that do not decode.
    """
    loaders = {"digits": digits, "folder": image_folder, "cifar10": tfds_dataset, "cifar100": tfds_dataset,
               "imagenet2012": tfds_dataset}
    if config.dataset not in loaders:
        raise ValueError(f"dataset must be one of {sorted(loaders)}. Received: dataset={config.dataset!r}")
    data = loaders[config.dataset](config)
    if config.validation_examples is not None:
        data.train, data.validation = hold_out(data.train, config.validation_examples, config.seed)
    data.train = subset(data.train, config.train_examples, config.seed)
    data.test = subset(data.test, config.test_examples, config.seed)
    for name, split in (("train", data.train), ("validation", data.validation), ("test", data.test)):
        if split is not None:
            raise_for_unreadable(split, name)
    return data


def folder_name(data_dir):
    """A data folder as a user names it: its own name ("cifar10-jpeg"), not the machine's path to it."""
    return os.path.basename(os.path.normpath(data_dir))


def name(config):
    """The data of `config` as a plot's title names it: an image folder by its own name
    (`folder_name`), any other data set by its name."""
    return folder_name(config.data_dir) if config.dataset == "folder" else config.dataset


def validation_split(size, validation_examples, seed):
    """(training indices, validation indices): a fixed random `validation_examples` of the
    training set held out, the rest trained on. Disjoint, together every index once."""
    if not isinstance(validation_examples, int) or not 0 < validation_examples < size:
        raise ValueError(f"validation_examples must be an integer between 1 and the training set's size less one "
                         f"({size - 1}). Received: validation_examples={validation_examples!r}")
    order = np.random.default_rng(seed).permutation(size)
    return np.sort(order[validation_examples:]), np.sort(order[:validation_examples])


def hold_out(split, validation_examples, seed):
    """(training split, validation split): `validation_split` applied to an indexed split."""
    if split.items is None:
        raise ValueError("validation_examples needs a data set held in memory (CIFAR, the digits, an image folder), "
                         f"not a streamed one. Received: a split of {split.size} streamed examples")
    training, validation = validation_split(split.size, validation_examples, seed)
    return tuple(dataclasses.replace(split, items=split.items[keep], labels=split.labels[keep], size=len(keep))
                 for keep in (training, validation))


def subset(split, examples, seed, shuffled=False):
    """`examples` of the split (all for `None`): a fixed random subset of indexed data, not
    the first files of the first classes, in the split's order (or, `shuffled`, in a random
    order: every batch of it a mix of classes); the first records of a stream."""
    if examples is None or examples >= split.size and not shuffled:
        return split
    if split.items is None:
        return dataclasses.replace(split, stream=split.stream.take(examples), size=min(examples, split.size))
    keep = np.random.default_rng(seed).permutation(split.size)[:examples]
    keep = keep if shuffled else np.sort(keep)
    return dataclasses.replace(split, items=split.items[keep], labels=split.labels[keep], size=len(keep))


def digits(config):
    """scikit-learn's 1,797 8x8 handwritten digits (UCI), shipped inside the package.

    Pixels of 0-16 are scaled to 0-255 so that the pipeline is the same as for photos.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * 255 / 16).astype("uint8")[..., None]
    labels = bunch.target.astype("int64")
    cut = len(images) - DIGITS_TEST_EXAMPLES
    return DataSet(
        train=Split(items=images[:cut], labels=labels[:cut]),
        test=Split(items=images[cut:], labels=labels[cut:]),
        class_names=[str(digit) for digit in range(10)],
        image_shape=(8, 8, 1),
    )


def image_folder(config):
    """An image folder `data_dir/{train,test}/<class>/<image>`, the layout that
    `tfds.folder_dataset.ImageFolder` and `keras.utils.image_dataset_from_directory` read.

    Classes are the sorted folder names of `train/`. Images are decoded to RGB and, where
    their size differs from `image_size`, resized.
    """
    root = config.data_dir
    if root is None or not os.path.isdir(os.path.join(root, "train")) or not os.path.isdir(os.path.join(root, "test")):
        raise FileNotFoundError(
            "dataset=folder needs data_dir to be a folder with train/ and test/ subfolders of "
            f"class folders of images. Received: data_dir={root!r}"
        )
    class_names = sorted(entry.name for entry in os.scandir(os.path.join(root, "train")) if entry.is_dir())
    test_classes = sorted(entry.name for entry in os.scandir(os.path.join(root, "test")) if entry.is_dir())
    unknown = [name for name in test_classes if name not in class_names]
    if unknown:
        raise ValueError(f"{os.path.join(root, 'test')} has classes that train/ has not, which the network could "
                         f"never predict: {unknown}. Received: data_dir={root!r}")
    splits = {}
    for split in ("train", "test"):
        paths, labels = [], []
        for label, name in enumerate(class_names):
            folder = os.path.join(root, split, name)
            files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            paths += [os.path.join(folder, file) for file in files if file.lower().endswith(IMAGE_EXTENSIONS)]
            if split == "train" and len(paths) == len(labels):
                raise ValueError(f"The class folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}): "
                                 f"every folder of train/ is a class. Remove it or add its images. "
                                 f"Received: data_dir={root!r}")
            labels += [label] * (len(paths) - len(labels))
        if not paths:
            raise FileNotFoundError(f"No images in {os.path.join(root, split)}/<class>/. Received: data_dir={root!r}")
        splits[split] = Split(items=np.array(paths), labels=np.array(labels, "int64"), decode=decode_file(config.image_size))
    return DataSet(splits["train"], splits["test"], class_names, (config.image_size, config.image_size, 3))


# How many unreadable files an error lists.
UNREADABLE_LISTED = 3


def unreadable_files(split, limit=UNREADABLE_LISTED):
    """Up to `limit` files of an image-folder split that do not decode as images
    (truncated, corrupt, or not an image at all); [] for splits held in memory."""
    if split.items is None or split.items.dtype.kind not in "SU":
        return []
    unreadable = []
    for path in split.items:
        try:
            decode_image(tf.io.read_file(path), 3)
        except tf.errors.OpError:
            unreadable.append(str(path))
            if len(unreadable) == limit:
                break
    return unreadable


def raise_for_unreadable(split, name):
    """Raises a ValueError naming the files of `split` (`name`: "train", "test", ...)
    that do not decode as images, if there are any."""
    unreadable = unreadable_files(split)
    if unreadable:
        raise ValueError(f"The {name} split holds files that do not decode as images (truncated or corrupt): "
                         f"{unreadable}{' ...' if len(unreadable) == UNREADABLE_LISTED else ''}. Replace or remove them.")


def decode_image(encoded, channels):
    """Encoded JPEG, PNG, GIF or BMP bytes -> uint8 pixels [height, width, channels].

    JPEGs are decoded with libjpeg's accurate integer DCT (`dct_method="INTEGER_ACCURATE"`,
    libjpeg's own default and Pillow's), where `tf.io.decode_image` uses the fast one,
    which is up to 5 levels off: training, evaluation, the SavedModel and the onnxruntime
    server (Pillow) then see the same pixels."""
    jpeg = tf.equal(tf.strings.substr(encoded, 0, 3), b"\xff\xd8\xff")  # the JPEG signature
    return tf.cond(jpeg, lambda: tf.io.decode_jpeg(encoded, channels, dct_method="INTEGER_ACCURATE"),
                   lambda: tf.io.decode_image(encoded, channels, expand_animations=False))


def decode_file(image_size):
    def decode(path):
        image = decode_image(tf.io.read_file(path), 3)
        return resize(image, image_size)

    return decode


def resize(image, image_size):
    """`image` at image_size x image_size: unchanged if it already is, else resized."""
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], image_size), tf.equal(shape[1], image_size))
    resized = tf.cond(
        same, lambda: tf.cast(image, tf.float32), lambda: tf.image.resize(image, (image_size, image_size))
    )
    return tf.ensure_shape(resized, (image_size, image_size, None))


def tfds_dataset(config):
    """CIFAR-10, CIFAR-100 or ImageNet through tensorflow-datasets.

    Downloads where the network allows it and nothing is prepared in `data_dir`;
    ImageNet needs its archives in `data_dir/downloads/manual` (tensorflow-datasets'
    manual download). Records are read in a fixed order and kept encoded: splits of up
    to IN_MEMORY_EXAMPLES are held in memory and indexed like arrays, larger ones are
    streamed. Images are decoded after shuffling and sharding.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    try:
        builder.download_and_prepare()
    except Exception as error:
        raise FileNotFoundError(
            f"Could not find or prepare {config.dataset!r} in {builder.data_dir}: {error}. Download it on a machine "
            "with internet access (python -m tensorflow_datasets.scripts.download_and_prepare "
            f"--datasets={config.dataset}) and pass its data directory with --data-dir."
        ) from error
    image_feature = builder.info.features["image"]
    splits = {}
    for name, split in (("train", "train"), ("test", "test" if "test" in builder.info.splits else "validation")):
        stream = builder.as_dataset(
            split=split, shuffle_files=False, as_supervised=True, decoders={"image": tfds.decode.SkipDecoding()}
        )
        decode = decoder(config, image_feature, training=name == "train")
        size = builder.info.splits[split].num_examples
        if size <= IN_MEMORY_EXAMPLES:
            encoded, labels = zip(*stream.as_numpy_iterator())
            splits[name] = Split(items=np.array(encoded, dtype=object), labels=np.array(labels, "int64"), decode=decode)
        else:
            splits[name] = Split(stream=stream, size=size, decode=decode)
    class_names = builder.info.features["label"].names
    return DataSet(splits["train"], splits["test"], class_names, (config.image_size, config.image_size, 3))


def decoder(config, image_feature, training):
    """Encoded image -> float image of image_size: ImageNet's random-resized crop (training)
    or central crop (evaluation); other data sets resized only where their size differs."""
    if config.dataset != "imagenet2012":
        crop = resize
    else:
        crop = random_resized_crop if training else central_crop
    return lambda encoded: crop(image_feature.decode_example(encoded), config.image_size)


# Scale augmentation of fb.resnet.torch ("Inception-style", as the paper's best
# ResNet-200 result uses): a crop of 8 %-100 % of the area with aspect ratio 3/4-4/3.
CROP_AREA = (0.08, 1.0)
CROP_ASPECT_RATIO = (3 / 4, 4 / 3)


def random_resized_crop(image, image_size):
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image), tf.zeros((1, 0, 4)), area_range=CROP_AREA, aspect_ratio_range=CROP_ASPECT_RATIO,
        max_attempts=10, use_image_if_no_bounding_boxes=True,
    )
    return tf.image.resize(tf.slice(image, begin, size), (image_size, image_size))


def central_crop(image, image_size):
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = image_size * contract.RESIZE_RATIO / tf.reduce_min(shape)
    resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
    return tf.image.resize_with_crop_or_pad(resized, image_size, image_size)


def examples_from(split, seed, used, first_position, end_position):
    """(item, label) at positions first_position .. end_position - 1 of the stream of epochs.

    Each epoch is the first `used` examples of a permutation of the split: for indexed
    data a stateless index shuffle of (seed, epoch), which a resumed run skips into
    without reading what it skips; for a stream a seeded shuffle buffer, reshuffled each
    epoch, which a resumed run reads (without decoding) up to its position.
    """
    if split.items is None:
        epochs = split.stream.shuffle(STREAM_SHUFFLE_BUFFER, seed=seed).take(used).repeat()
        return epochs.skip(first_position).take(end_position - first_position)
    items, labels = tf.constant(split.items), tf.constant(split.labels)

    def epoch_examples(epoch):
        order = tf.data.Dataset.range(used).map(
            lambda position: tf.random.experimental.index_shuffle(
                position, seed=tf.stack([tf.constant(seed, tf.int64), epoch]), max_index=split.size - 1
            )
        )
        return order.map(lambda index: (tf.gather(items, index), tf.gather(labels, index)))

    epochs = tf.data.Dataset.range(first_position // used, -(-end_position // used))
    examples = epochs.flat_map(epoch_examples).skip(first_position % used)
    return examples.take(end_position - first_position)


def training_batches(split, config, steps_per_epoch, first_step, total_steps, input_context=None):
    """Per-replica batches of `split` for the training steps first_step .. total_steps - 1.

    Global step s uses positions [s G, (s + 1) G) of the stream of epochs, G the global
    batch; replica r takes [s G + r P, s G + (r + 1) P), P the per-replica batch. A
    worker keeps its replicas' positions; its replicas take its batches in turn.
    """
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline = input_context.input_pipeline_id if input_context else 0
    replicas = input_context.num_replicas_in_sync if input_context else 1
    per_replica = config.batch_size // replicas
    replicas_per_pipeline = replicas // pipelines
    used = steps_per_epoch * config.batch_size
    first_position = first_step * config.batch_size

    stream = examples_from(split, config.seed, used, first_position, total_steps * config.batch_size)
    mine = stream.enumerate(start=first_position).filter(
        lambda position, example: (position % config.batch_size) // per_replica // replicas_per_pipeline == pipeline
    )
    decode = split.decode or (lambda image: tf.cast(image, tf.float32))
    images = mine.map(lambda position, example: (decode(example[0]), example[1]), num_parallel_calls=AUTOTUNE)
    return images.batch(per_replica, drop_remainder=True).prefetch(AUTOTUNE)


def evaluation_batches(split, batch_size):
    """Every example of `split` in its order, in batches of `batch_size` (the last one smaller)."""
    if split.items is None:
        examples = split.stream
    else:
        examples = tf.data.Dataset.from_tensor_slices((split.items, split.labels))
    decode = split.decode or (lambda image: tf.cast(image, tf.float32))
    examples = examples.map(lambda item, label: (decode(item), label), num_parallel_calls=AUTOTUNE)
    return examples.batch(batch_size).prefetch(AUTOTUNE)
