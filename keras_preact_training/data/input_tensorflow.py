"""The tf.data input pipeline: the splits of `keras_preact_training.data.datasets` decoded with TensorFlow, in the
order of `keras_preact_training.data.datasets.example_indices`, sharded over replicas and workers, batched.

The default where TensorFlow is installed, and the pipeline of `tf.distribute`
(`tensorflow_steps.TensorFlowSteps`); `input_numpy` gives the same batches without TensorFlow.
"""

import socket

import numpy as np
import tensorflow as tf

from . import cifar10_folder, datasets, images

# Where a pipeline's decoding runs in parallel; tf.data picks the degree.
AUTOTUNE = tf.data.AUTOTUNE
# tensorflow-datasets splits up to this size are held in memory as encoded images and
# indexed like arrays (CIFAR's 50,000 PNGs: about 150 MB); larger ones (ImageNet) are
# streamed through a shuffle buffer of STREAM_SHUFFLE_BUFFER records.
IN_MEMORY_EXAMPLES = 100_000
STREAM_SHUFFLE_BUFFER = 20_000
# The servers tensorflow-datasets downloads from (its cifar.py); ImageNet's archives are the
# user's own (a manual download).
DOWNLOAD_HOSTS = {"cifar10": "www.cs.toronto.edu", "cifar100": "www.cs.toronto.edu"}


def prepare(split, name):
    """`split` as this pipeline reads it: itself, once every file it names has been decoded,
    so that a truncated or corrupt image is an error that names it before training, not a
    traceback of the pipeline.

    Raises:
        ValueError: naming the files of `split` (`name`: "train", "test", ...) that do not decode.
    """
    datasets.raise_for_unreadable(unreadable_files(split), name)
    return split


def unreadable_files(split, limit=datasets.UNREADABLE_LISTED):
    """Up to `limit` files of an image-folder split that do not decode as images
    (truncated, corrupt, or not an image at all); [] for splits held in memory."""
    if not datasets.holds_files(split):
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


def decode_image(encoded, channels):
    """Encoded JPEG, PNG, GIF or BMP bytes -> uint8 pixels [height, width, channels]: the
    TensorFlow graph's decoder of training, evaluation and the SavedModel's `serving_default`
    (`images.decode` computes the same with NumPy and Pillow for the NumPy pipeline,
    calibration and the onnxruntime server).

    JPEGs are decoded with libjpeg's accurate integer DCT (`dct_method="INTEGER_ACCURATE"`,
    libjpeg's own default and Pillow's), where `tf.io.decode_image` uses the fast one,
    which is up to 5 levels off. JPEG and PNG decoders convert to `channels` themselves; GIF
    and BMP decode to their own channels (GIF: RGB; BMP: grey, RGB or RGBA), converted here
    (`to_channels`)."""
    jpeg = tf.equal(tf.strings.substr(encoded, 0, 3), b"\xff\xd8\xff")  # the JPEG signature
    own_channels = tf.logical_or(
        tf.equal(tf.strings.substr(encoded, 0, 3), b"GIF"), tf.equal(tf.strings.substr(encoded, 0, 2), b"BM")
    )
    image = tf.cond(
        jpeg,
        lambda: tf.io.decode_jpeg(encoded, channels, dct_method="INTEGER_ACCURATE"),
        lambda: tf.cond(
            own_channels,
            lambda: to_channels(tf.io.decode_image(encoded, expand_animations=False), channels),
            lambda: tf.io.decode_image(encoded, channels, expand_animations=False),
        ),
    )
    # The channels known while the graph is built, as the layers after it need them:
    # `to_channels` computes them at run time.
    return tf.ensure_shape(image, (None, None, channels))


def to_channels(image, channels):
    """uint8 pixels [height, width, 1 to 4 channels] as 1 (grey) or 3 (RGB) channels: alpha
    dropped, grey repeated to RGB, RGB to grey with `tf.image.rgb_to_grayscale`'s weights."""
    have = tf.shape(image)[-1]
    rgb = tf.cond(have >= 3, lambda: image[..., :3], lambda: tf.image.grayscale_to_rgb(image[..., :1]))
    if channels == 3:
        return rgb
    return tf.cond(have >= 3, lambda: tf.image.rgb_to_grayscale(rgb), lambda: image[..., :1])


def decode_encoded(preprocessing, encoded):
    """Encoded bytes -> float32 pixels (0-255) of the network's size, as `preprocessing` (a
    `contract.Preprocessing`: its channels, size and crop) asks: the SavedModel's
    `serving_default` before normalisation."""
    image = decode_image(encoded, preprocessing.channels)
    return tf.ensure_shape(CROPS[preprocessing.crop](image, preprocessing.image_size), preprocessing.shape)


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
    remedy = (
        f"Download it on a machine with internet access (python -m tensorflow_datasets.scripts."
        f"download_and_prepare --datasets={config.dataset}) and pass its data directory with --data-dir, or "
        f"train with --set dataset=folder on {cifar10_folder.ROUTE}"
    )
    if not builder.is_prepared() and config.dataset in DOWNLOAD_HOSTS:
        # Offline, tensorflow-datasets retries its download for minutes before it fails.
        try:
            socket.create_connection((DOWNLOAD_HOSTS[config.dataset], 443), timeout=10).close()
        except OSError as error:
            raise FileNotFoundError(
                f"{config.dataset!r} is not prepared in {builder.data_dir}, and its download server "
                f"{DOWNLOAD_HOSTS[config.dataset]} cannot be reached ({error}). {remedy}."
            ) from None
    try:
        builder.download_and_prepare()
    except Exception as error:
        raise FileNotFoundError(
            f"Could not find or prepare {config.dataset!r} in {builder.data_dir}: {error}. {remedy}."
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
            splits[name] = datasets.Split(
                items=np.array(encoded, dtype=object), labels=np.array(labels, "int64"), decode=decode
            )
        else:
            splits[name] = datasets.Split(stream=stream, size=size, decode=decode)
    class_names = builder.info.features["label"].names
    return datasets.DataSet(splits["train"], splits["test"], class_names, (config.image_size, config.image_size, 3))


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
        tf.shape(image),
        tf.zeros((1, 0, 4)),
        area_range=CROP_AREA,
        aspect_ratio_range=CROP_ASPECT_RATIO,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.image.resize(tf.slice(image, begin, size), (image_size, image_size))


def central_crop(image, image_size):
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = image_size * images.RESIZE_RATIO / tf.reduce_min(shape)
    resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
    return tf.image.resize_with_crop_or_pad(resized, image_size, image_size)


# How encoded images reach the network's size (`images.CROPS`), as in training.
CROPS = {"resize": resize, "central_crop": central_crop}


def examples_from(split, seed, used, first_position, end_position):
    """(item, label) at positions first_position .. end_position - 1 of the stream of epochs.

    Each epoch is the first `used` examples of a permutation of the split: for indexed
    data `datasets.epoch_order` of (seed, epoch), computed in NumPy as `input_numpy` reads it,
    which a resumed run skips into without reading what it skips; for a stream a seeded
    shuffle buffer, reshuffled each epoch, which a resumed run reads (without decoding) up to
    its position.
    """
    if split.items is None:
        epochs = split.stream.shuffle(STREAM_SHUFFLE_BUFFER, seed=seed).take(used).repeat()
        return epochs.skip(first_position).take(end_position - first_position)
    items, labels = tf.constant(split.items), tf.constant(split.labels)

    def order(epoch):
        return datasets.epoch_order(split.size, used, seed, int(epoch)).astype(np.int64)

    def epoch_examples(epoch):
        indices = tf.ensure_shape(tf.numpy_function(order, [epoch], tf.int64, stateful=False), (used,))
        return tf.data.Dataset.from_tensor_slices(indices).map(
            lambda index: (tf.gather(items, index), tf.gather(labels, index))
        )

    epochs = tf.data.Dataset.range(first_position // used, -(-end_position // used))
    examples = epochs.flat_map(epoch_examples).skip(first_position % used)
    return examples.take(end_position - first_position)


def decoding(split):
    """The split's item -> float32 image: its own `decode` (tensorflow-datasets'), a file's
    decoding at the split's `image_size`, or pixels cast."""
    if split.decode is not None:
        return split.decode
    if datasets.holds_files(split):
        return decode_file(split.image_size)
    return lambda image: tf.cast(image, tf.float32)


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
    decode = decoding(split)
    images = mine.map(lambda position, example: (decode(example[0]), example[1]), num_parallel_calls=AUTOTUNE)
    return images.batch(per_replica, drop_remainder=True).prefetch(AUTOTUNE)


def evaluation_batches(split, batch_size):
    """Every example of `split` in its order, in batches of `batch_size` (the last one smaller)."""
    if split.items is None:
        examples = split.stream
    else:
        examples = tf.data.Dataset.from_tensor_slices((split.items, split.labels))
    decode = decoding(split)
    examples = examples.map(lambda item, label: (decode(item), label), num_parallel_calls=AUTOTUNE)
    return examples.batch(batch_size).prefetch(AUTOTUNE)


def training_arrays(split, config, steps_per_epoch, first_step, total_steps, shard=(0, 1)):
    """`training_batches` as NumPy (images float32, labels int64): the whole batch, or with
    `shard` (index, count), of count processes that share each batch, this one's part, as
    `input_numpy.training_arrays` gives it."""
    index, count = shard
    context = tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=index, num_replicas_in_sync=count)
    return training_batches(split, config, steps_per_epoch, first_step, total_steps, context).as_numpy_iterator()


def evaluation_arrays(split, batch_size):
    """`evaluation_batches` as NumPy (images float32, labels int64)."""
    return evaluation_batches(split, batch_size).as_numpy_iterator()
