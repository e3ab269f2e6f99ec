import contextlib
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow's oneDNN kernels on every processor, as keras-preact's commands have them
# (keras_preact_training.tensorflow_import.use_onednn), so that the tests compute alike where TensorFlow's
# own default would leave them off (a processor with AVX2 alone).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# PyTorch's CPU threads (OpenMP) wait for work spinning: two xdist workers' pools of a thread a
# core each, on the same cores, spend most of their time waiting for one another. So each
# worker, and each command it starts (they inherit the variable), computes on its share of
# the cores (docs/benchmarks.md, "The test suite's time", gives the times before and after).
# TensorFlow's and XLA's pools keep every core: limited the same way, the TensorFlow and JAX
# suites took as long, and the digits demo trained to other weights (oneDNN splits its sums by
# thread).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

import keras
import numpy as np
import pytest

# JAX's persistent compilation cache for the commands the tests start (`keras-preact train`
# under JAX, and the like), one folder for the whole test run: the pytest process makes it, and
# its xdist workers and every command they start inherit it, so that a computation one command
# compiles (a network's initializers, a training step) the next reads back instead of compiling
# it again. The program is the same, so are the results (a digits run's weights keep their
# SHA-256). Not in the test processes themselves, whose computations compile once each:
# writing them all cost more than it saved (docs/benchmarks.md, "The test suite's time"). A
# size bound turns on JAX's file lock, which processes writing the folder at once need. Removed
# at the end.
JAX_CACHE_OWNER = "KERAS_PREACT_TEST_JAX_CACHE" not in os.environ
if JAX_CACHE_OWNER:
    os.environ["KERAS_PREACT_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="keras-preact-jax-cache-")
os.environ.update(
    JAX_COMPILATION_CACHE_DIR=os.environ["KERAS_PREACT_TEST_JAX_CACHE"],
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    JAX_COMPILATION_CACHE_MAX_SIZE=str(4 * 2**30),
)
if "jax" in sys.modules:  # an xdist worker under JAX, which read the variables as it imported JAX
    sys.modules["jax"].config.update("jax_enable_compilation_cache", False)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIFAR_ARCHIVE = os.path.join(ROOT, "..", "shared", "data", "cifar10-png.tar.xz")
CIFAR100_ARCHIVE = os.path.join(ROOT, "..", "shared", "data", "cifar100-png.tar.xz")
# The console command (pyproject's [project.scripts]) as a user runs it: installed beside
# the Python that runs the tests, in the virtual environment's bin/.
KERAS_PREACT = os.path.join(os.path.dirname(sys.executable), "keras-preact")


# Saving and loading the deepest networks takes about 20 s each on a 2-core CPU (their units
# as loops, the default; 60-90 s with separate units): those four run with -m slow (the
# other 26 registered networks' save and load stay in the default run).
SLOW_PARAMETERS = {
    "test_keras_save_and_load_give_identical_outputs": {
        "resnet1001",
        "resnet1001_original",
        "resnet1202",
        "resnet1202_original",
    }
}


# A short digits run for the commands' tests: 2 epochs of 22 steps, checkpointed every 5,
# evaluated every 20, logged at every step (the settings, then the whole run).
SHORT_DIGITS_SETTINGS = [
    "--set",
    "duration=2",
    "--set",
    "checkpoint_every=5",
    "--set",
    "evaluate_every=20",
    "--set",
    "log_every=1",
]
SHORT_DIGITS_RUN = ["--config", "digits_demo", *SHORT_DIGITS_SETTINGS]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Marks the parameters of SLOW_PARAMETERS slow, before `-m` selects, and puts the tests
    on the CIFAR-10 images first: the longest (networks evaluated on 10,000 images, runs on
    thousands), which, started last, would leave one xdist worker running them alone."""
    for item in items:
        name, _, parameter = item.name.partition("[")
        if parameter.rstrip("]") in SLOW_PARAMETERS.get(name, ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: "cifar_folder" not in getattr(item, "fixturenames", ()))


def pytest_unconfigure(config):
    """Removes the JAX compilation cache in the process that made it (the run's, not a worker's)."""
    if JAX_CACHE_OWNER:
        shutil.rmtree(os.environ["KERAS_PREACT_TEST_JAX_CACHE"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(1603)


@contextlib.contextmanager
def dtype_policy(name):
    """Keras' global policy `name` (float64 also as floatx, as `keras.config.set_floatx`
    users set it, and with JAX's 64-bit types on), put back after."""
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    sixty_four_bits = contextlib.nullcontext()
    if name == "float64":
        keras.config.set_floatx("float64")
        if keras.backend.backend() == "jax":
            import jax

            sixty_four_bits = jax.enable_x64(True)
    keras.config.set_dtype_policy(name)
    try:
        with sixty_four_bits:
            yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def random_images(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def variable_values(layer_or_model):
    return [np.array(variable) for variable in layer_or_model.trainable_variables]


def gradients(model, inputs, loss_of_outputs, training=True):
    """d loss_of_outputs(model(inputs)) / d w for each trainable variable w (no regularization)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_of_outputs(model(inputs, training=training))
        return [
            None if gradient is None else np.array(gradient)
            for gradient in tape.gradient(loss, model.trainable_variables)
        ]
    if backend == "jax":
        import jax

        non_trainable = [variable.value for variable in model.non_trainable_variables]

        def loss(trainable):
            return loss_of_outputs(model.stateless_call(trainable, non_trainable, inputs, training=training)[0])

        return [
            np.array(gradient)
            for gradient in jax.grad(loss)([variable.value for variable in model.trainable_variables])
        ]
    import torch

    values = [variable.value for variable in model.trainable_variables]
    with torch.enable_grad():
        loss = loss_of_outputs(model(inputs, training=training))
        return [
            None if gradient is None else keras.ops.convert_to_numpy(gradient)
            for gradient in torch.autograd.grad(loss, values, allow_unused=True)
        ]


def output_gradients(model, inputs, training=True, seed=0):
    """Gradients of sum(outputs * R), R fixed random, for each trainable variable.

    A random projection, not a plain sum: the sum of softmax outputs is constant and
    would give every weight a zero gradient.
    """
    projection = keras.ops.convert_to_tensor(
        np.random.default_rng(seed)
        .normal(size=(inputs.shape[0],) + tuple(model.compute_output_shape(inputs.shape)[1:]))
        .astype("float32")
    )
    return gradients(model, inputs, lambda outputs: keras.ops.sum(outputs * projection), training)


def jacobian(layer, inputs, training=True):
    """d layer(inputs) / d inputs as a (size, size) matrix, for one example."""
    backend = keras.backend.backend()
    size = int(np.prod(inputs.shape))
    if backend == "tensorflow":
        import tensorflow as tf

        inputs = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = layer(inputs, training=training)
        return np.array(tape.jacobian(outputs, inputs)).reshape(size, -1)
    if backend == "jax":
        import jax

        # Through a model, as in training: stateless_call on the layer itself would skip
        # the call context that hands `training` to its BatchNorms.
        model = keras.Sequential([keras.Input(inputs.shape[1:]), layer])
        trainable = [variable.value for variable in model.trainable_variables]
        non_trainable = [variable.value for variable in model.non_trainable_variables]

        def function(x):
            return model.stateless_call(trainable, non_trainable, x, training=training)[0]

        return np.array(jax.jacfwd(function)(inputs)).reshape(size, -1)
    import torch

    with torch.enable_grad():
        jacobian = torch.autograd.functional.jacobian(
            lambda x: layer(x, training=training), keras.ops.convert_to_tensor(inputs), vectorize=True
        )
    return keras.ops.convert_to_numpy(jacobian).reshape(size, -1)


def config_round_trip(layer):
    """get_config -> from_config -> get_config, both configs as JSON-ready dicts."""
    config = layer.get_config()
    rebuilt = type(layer).from_config(config)
    return config, rebuilt.get_config()


@pytest.fixture(scope="session")
def cifar_folder():
    """CIFAR-10 with its original pixels as PNG folders, extracted once into the user's cache, where
    `keras-preact data` puts it (pytest-xdist's workers take turns: the first extracts, the others
    find it done)."""
    from keras_preact_training.data import cifar10_folder

    if not os.path.exists(CIFAR_ARCHIVE):
        pytest.skip(f"CIFAR-10 PNG archive not found at {os.path.normpath(CIFAR_ARCHIVE)} (see shared/data/README.md)")
    return cifar10_folder.extract(CIFAR_ARCHIVE)


@pytest.fixture(scope="session")
def cifar100_folder():
    """CIFAR-100 with its original pixels as PNG folders of its fine classes, extracted once into
    the user's cache, where `keras-preact data` puts it (as `cifar_folder`)."""
    from keras_preact_training.data import cifar10_folder

    if not os.path.exists(CIFAR100_ARCHIVE):
        pytest.skip(
            f"CIFAR-100 PNG archive not found at {os.path.normpath(CIFAR100_ARCHIVE)} (see shared/data/README.md)"
        )
    return cifar10_folder.extract(CIFAR100_ARCHIVE, cifar10_folder.CIFAR100_FOLDER)
