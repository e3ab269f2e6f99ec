"""The training recipe (schedule, augmentation, configs, model.fit) on every backend."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import defaults
from keras_preact_training.train import augmentation, configs, named_configs, recipe

PAPER = named_configs.CONFIGS["cifar10_paper"]


def learning_rates(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_paper_schedule_by_hand():
    """0.01 for iterations 0-399, 0.1 until 32k, 0.01 until 48k, 0.001 after (appendix)."""
    schedule = recipe.schedule(PAPER, steps_per_epoch=390)
    steps = [0, 399, 400, 31999, 32000, 47999, 48000, 63999]
    assert learning_rates(schedule, steps) == pytest.approx([0.01, 0.01, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    assert PAPER.total_steps(390) == 64000


def test_batch_size_scales_the_rate_and_keeps_the_epochs():
    config = PAPER.override("batch_size=64")
    schedule = recipe.schedule(config, steps_per_epoch=781)
    assert config.total_steps(781) == 128000
    assert learning_rates(schedule, [0, 799, 800, 63999, 64000, 96000]) == pytest.approx(
        [0.005, 0.005, 0.05, 0.05, 0.005, 0.0005]
    )


def test_epoch_schedule_of_the_resnet1001_torch_run():
    """Batch 64, lr 0.1, /10 at epochs 81 and 122, 200 epochs: 781 steps per epoch."""
    config = named_configs.CONFIGS["cifar10_resnet1001_torch"]
    assert configs.steps_per_epoch(50000, config.batch_size) == 781
    schedule = recipe.schedule(config, 781)
    assert learning_rates(schedule, [0, 63260, 63261, 95281, 95282]) == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])
    assert config.total_steps(781) == 156200
    assert config.nesterov


def test_cosine_schedule_by_hand():
    """0.01 for the warm-up epoch, then 0.1 (1 + cos(pi t)) / 2, t from 0 at its end to 1 at the last step."""
    config = named_configs.CONFIGS["cifar10_cpu"].override("schedule=cosine", "duration=10")
    schedule = recipe.schedule(config, steps_per_epoch=100)
    assert config.total_steps(100) == 1000 and config.to_steps(config.warmup, 100) == 100
    assert learning_rates(schedule, [0, 99, 100, 325, 550, 775, 1000]) == pytest.approx(
        [0.01, 0.01, 0.1, 0.1 * (1 + np.cos(np.pi / 4)) / 2, 0.05, 0.1 * (1 - np.cos(np.pi / 4)) / 2, 0.0], abs=1e-7
    )
    assert recipe.WarmupCosineDecay(**schedule.get_config()).get_config() == schedule.get_config()
    with pytest.raises(
        ValueError,
        match="warmup_steps must be at least 0 and less than total_steps .1000.. Received: warmup_steps=1000",
    ):
        recipe.WarmupCosineDecay(0.1, total_steps=1000, warmup_steps=1000)


def test_cpu_config_shortens_the_paper_schedule_in_proportion():
    """30 epochs, /10 at half and three quarters, as the paper's 32k and 48k of 64k."""
    config = named_configs.CONFIGS["cifar10_cpu"]
    schedule = recipe.schedule(config, steps_per_epoch=390)
    assert config.total_steps(390) == 11700
    assert learning_rates(schedule, [389, 390, 5849, 5850, 8774, 8775]) == pytest.approx(
        [0.01, 0.1, 0.1, 0.01, 0.01, 0.001]
    )
    assert (config.decay_boundaries[0] / config.duration, config.decay_boundaries[1] / config.duration) == (
        PAPER.decay_boundaries[0] / PAPER.duration,
        PAPER.decay_boundaries[1] / PAPER.duration,
    )


def test_the_zoo_recipe_is_the_cpu_recipe_with_the_search_choices():
    """cifar10_zoo differs from cifar10_cpu by what the validation search chose (docs/zoo.md) and
    its length; its optimizer is Nesterov SGD taking over weight decay 5e-4."""
    zoo, cpu = named_configs.CONFIGS["cifar10_zoo"], named_configs.CONFIGS["cifar10_cpu"]
    changed = {
        field.name: getattr(zoo, field.name)
        for field in dataclasses.fields(zoo)
        if getattr(zoo, field.name) != getattr(cpu, field.name)
    }
    assert changed == dict(
        schedule="cosine",
        nesterov=True,
        weight_decay=5e-4,
        precision="auto",
        duration=60,
        learning_rate=0.2,
        cutout=16,
    )
    model = recipe.training_model(zoo, (32, 32, 3), 10)
    optimizer = recipe.optimizer(zoo, 390, model)
    assert (optimizer.momentum, optimizer.nesterov) == (0.9, True)
    assert [optimizer.weight_decay_of(variable) for variable in model.trainable_variables] == pytest.approx(
        [5e-4] * len(model.trainable_variables)
    )
    assert learning_rates(recipe.schedule(zoo, 390), [0, 389, 390, 23400]) == pytest.approx([0.01, 0.01, 0.2, 0.0])


def test_optimizer_is_sgd_with_the_paper_momentum_taking_over_the_weight_decay():
    optimizer = recipe.optimizer(PAPER, 390)
    assert isinstance(optimizer, recipe.CoupledSGD)
    assert (optimizer.momentum, optimizer.nesterov) == (0.9, False)
    model = recipe.training_model(PAPER.override("model=resnet20"), (32, 32, 3), 10)
    optimizer = recipe.optimizer(PAPER, 390, model)
    assert [optimizer.weight_decay_of(variable) for variable in model.trainable_variables] == pytest.approx(
        [PAPER.weight_decay] * len(model.trainable_variables)
    )
    assert model.losses == []
    assert isinstance(
        recipe.optimizer(PAPER.override("precision=mixed_float16"), 390), keras.optimizers.LossScaleOptimizer
    )


def test_random_padded_crop_shifts_each_image_within_the_padding():
    images = np.arange(16 * 6 * 6, dtype="float32").reshape(16, 6, 6, 1) + 1
    cropped = keras.ops.convert_to_numpy(augmentation.RandomPaddedCrop(2, seed=1)(images, training=True))
    assert cropped.shape == images.shape
    offsets = set()
    for original, crop in zip(images, cropped):
        padded = np.pad(original, [(2, 2), (2, 2), (0, 0)])
        matches = [
            (dy, dx) for dy in range(5) for dx in range(5) if np.array_equal(padded[dy : dy + 6, dx : dx + 6], crop)
        ]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 5  # each image its own offset
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(augmentation.RandomPaddedCrop(2)(images, training=False)), images
    )


def test_random_cutout_zeroes_one_square_per_image_clipped_at_the_borders():
    images = np.ones((64, 12, 10, 2), dtype="float32")
    cut = keras.ops.convert_to_numpy(augmentation.RandomCutout(4, seed=2)(images, training=True))
    centres = set()
    for image in cut:
        zeros = image == 0
        np.testing.assert_array_equal(zeros[..., 0], zeros[..., 1])  # every channel alike
        rows, columns = np.flatnonzero(zeros[..., 0].any(1)), np.flatnonzero(zeros[..., 0].any(0))
        # One rectangle: the square of side 4 starting 2 before its centre, cut by the borders.
        assert zeros[..., 0].sum() == len(rows) * len(columns)
        assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)) and 2 <= len(rows) <= 4
        assert np.array_equal(columns, np.arange(columns[0], columns[-1] + 1)) and 2 <= len(columns) <= 4
        centre = (rows[-1] - 1 if rows[0] == 0 else rows[0] + 2, columns[-1] - 1 if columns[0] == 0 else columns[0] + 2)
        assert 0 <= centre[0] < 12 and 0 <= centre[1] < 10
        centres.add(centre)
        np.testing.assert_array_equal(image[~zeros], 1)
    assert len(centres) > 30  # each image its own square
    assert any(len(np.flatnonzero((image == 0).any((1, 2)))) < 4 for image in cut)  # some cut by a border
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(augmentation.RandomCutout(4)(images, training=False)), images
    )
    with pytest.raises(ValueError, match="size must be an integer >= 0. Received: size=-1"):
        augmentation.RandomCutout(-1)


def test_cutout_follows_normalisation_and_is_checked():
    layers = recipe.preprocessing(PAPER.override("cutout=16"), seed=3)
    assert [layer.name for layer in layers] == ["random_padded_crop", "random_flip", "normalization", "random_cutout"]
    assert layers[-1].size == 16
    assert "random_cutout" not in [layer.name for layer in recipe.preprocessing(PAPER)]
    with pytest.raises(ValueError, match="cutout must be an integer >= 0 \\(0: none\\). Received: cutout=-2"):
        PAPER.override("cutout=-2")


def test_flips_happen_per_image_and_values_stay_in_range():
    layers = recipe.preprocessing(PAPER, seed=3)
    assert [layer.name for layer in layers] == ["random_padded_crop", "random_flip", "normalization"]
    images = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3)).astype("float32")
    flipped = np.array(layers[1](images, training=True))
    is_flipped = [np.array_equal(flip, image[:, ::-1]) for flip, image in zip(flipped, images)]
    is_same = [np.array_equal(flip, image) for flip, image in zip(flipped, images)]
    assert all(a or b for a, b in zip(is_flipped, is_same))
    assert 16 < sum(is_flipped) < 48
    normalized = np.array(layers[2](images))
    expected = (images - np.array(defaults.CIFAR10_MEAN)) / np.array(defaults.CIFAR10_STD)
    np.testing.assert_allclose(normalized, expected, rtol=1e-4, atol=1e-4)
    assert normalized.min() > -2.2 and normalized.max() < 2.3


def test_digits_config_has_no_flips():
    config = named_configs.CONFIGS["digits_demo"]
    assert [layer.name for layer in recipe.preprocessing(config)] == ["random_padded_crop", "normalization"]


def test_model_fit_on_arrays_with_the_recipe():
    """The recipe without tf.distribute or tf.data: plain model.fit (this runs on JAX too)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * 255 / 16).astype("float32")[..., None]
    config = dataclasses.replace(named_configs.CONFIGS["digits_demo"], model="resnet20")
    model = recipe.training_model(config, (8, 8, 1), 10, seed=0)
    model.compile(recipe.optimizer(config, 22, model), recipe.loss(), metrics=["accuracy"])
    history = model.fit(images[:1400], digits.target[:1400], batch_size=64, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    _, accuracy = model.evaluate(images[1400:], digits.target[1400:], verbose=0)
    # Chance is 0.1; three epochs measured 0.68 on TensorFlow and 0.87 on JAX (seed 1603).
    assert accuracy > 0.5


def test_label_smoothing_by_hand():
    """Smoothed targets (1 - e) one-hot + e / K: the loss is (1 - e) CE(label) + e mean_k(-log p_k)."""
    logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]], "float32")
    labels = np.array([0, 1])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    plain = -log_p[[0, 1], labels]
    expected = 0.9 * plain + 0.1 * -log_p.mean(-1)
    smoothed = keras.ops.convert_to_numpy(recipe.loss(0.1, reduction=None)(labels, logits))
    np.testing.assert_allclose(smoothed, expected, rtol=1e-6)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(recipe.loss(0.0, reduction=None)(labels, logits)), plain, rtol=1e-6
    )
    assert float(recipe.loss(0.1)(labels, logits)) == pytest.approx(expected.mean(), rel=1e-6)


def test_the_cifar100_recipe_is_the_cifar10_zoos_with_its_own_normalization_and_cutout():
    """cifar100_zoo: CIFAR-100's per-channel statistics (fb.resnet.torch) and Cutout of 8 x 8
    (DeVries and Taylor's size for CIFAR-100), everything else the CIFAR-10 recipe's."""
    cifar10, cifar100 = named_configs.CONFIGS["cifar10_zoo"], named_configs.CONFIGS["cifar100_zoo"]
    changed = {
        field.name: getattr(cifar100, field.name)
        for field in dataclasses.fields(cifar100)
        if getattr(cifar100, field.name) != getattr(cifar10, field.name)
    }
    assert changed == dict(cutout=8, normalization_mean=(129.3, 124.1, 112.4), normalization_std=(68.2, 65.4, 70.4))
    assert named_configs.CONFIGS["cifar100_paper"].normalization_mean == (129.3, 124.1, 112.4)


def test_the_weights_average_follows_each_step_of_the_coupled_update():
    """`average_momentum`: after every step w_avg <- m w_avg + (1 - m) w (w_avg starts at the
    first step's weights), through CoupledSGD's own update; finalize puts it in the model."""
    config = dataclasses.replace(named_configs.CONFIGS["digits_demo"], average_momentum=0.5)
    network = keras_preact.CifarResNet(8, input_shape=(8, 8, 1), classes=3, classifier_activation=None)
    optimizer = recipe.optimizer(config, 22, network)
    assert (optimizer.use_ema, optimizer.ema_momentum) == (True, 0.5)
    network.compile(optimizer, recipe.loss())
    images, labels = np.random.default_rng(0).normal(size=(4, 8, 8, 1)).astype("float32"), np.array([0, 1, 2, 1])
    average = None
    for _ in range(3):
        network.train_on_batch(images, labels)
        weights = [np.array(variable) for variable in network.trainable_variables]
        average = weights if average is None else [0.5 * a + 0.5 * w for a, w in zip(average, weights)]
    optimizer.finalize_variable_values(network.trainable_variables)
    for got, want in zip(network.trainable_variables, average, strict=True):
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-7)
    assert not recipe.optimizer(named_configs.CONFIGS["digits_demo"], 22).use_ema


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["batch_size=0"], "batch_size must be a positive integer. Received: batch_size=0"),
        (["strategy=horovod"], "Received: strategy='horovod'"),
        (["depth=110"], "Each override must be field=value with a field of"),
        (["learning_rate=fast"], "learning_rate takes a float. Received: learning_rate='fast'"),
        (["precision=float16"], "Received: precision='float16'"),
        (["schedule=linear"], "schedule must be one of ['step', 'cosine']. Received: schedule='linear'"),
        (["learning_rate=-0.1"], "learning_rate must be a finite number > 0. Received: learning_rate=-0.1"),
        (["learning_rate=inf"], "Received: learning_rate=inf"),
        (["warmup=-1"], "warmup must be a finite number >= 0. Received: warmup=-1.0"),
        (["momentum=1"], "momentum must be a finite number in [0, 1). Received: momentum=1.0"),
        (["decay_factor=0"], "decay_factor must be a finite number in (0, 1]. Received: decay_factor=0.0"),
        (
            ["normalization_std=0,62.1,66.7"],
            "normalization_std must hold finite numbers > 0. Received: normalization_std=(0, 62.1, 66.7)",
        ),
        (["test_examples=0"], "test_examples must be None (all) or a positive integer. Received: test_examples=0"),
        (["label_smoothing=1"], "label_smoothing must be a finite number in [0, 1). Received: label_smoothing=1.0"),
        (
            ["average_momentum=-0.5"],
            "average_momentum must be a finite number in [0, 1). Received: average_momentum=-0.5",
        ),
        (["swa_start=1"], "swa_start must be a finite number in [0, 1). Received: swa_start=1.0"),
        (["train_examples=-5"], "train_examples must be None (all) or a positive integer. Received: train_examples=-5"),
        (["nesterov=none"], "nesterov takes a bool. Received: nesterov='none'"),
        (["seed=-1"], "seed must be an integer from 0 to 2**32 - 1. Received: seed=-1"),
        (["seed=4294967296"], "seed must be an integer from 0 to 2**32 - 1. Received: seed=4294967296"),
        (
            ["normalization_mean=1,2"],
            "normalization_mean needs one value (for every channel) or one per channel of the cifar10 images (3). "
            "Received: normalization_mean=(1, 2)",
        ),
        (
            ["dataset=digits"],
            "normalization_mean needs one value (for every channel) or one per channel of the digits images (1). "
            "Received: normalization_mean=(125.3, 123.0, 113.9)",
        ),
        (
            ["normalization_mean=120"],
            "normalization_mean and normalization_std need as many values each. Received: "
            "normalization_mean=(120,), normalization_std=(63.0, 62.1, 66.7)",
        ),
    ],
)
def test_bad_overrides(overrides, message):
    with pytest.raises(ValueError) as error:
        named_configs.get_config("cifar10_paper", overrides)
    assert message in str(error.value)


def test_unknown_config():
    with pytest.raises(ValueError, match="Received: config='cifar10'"):
        named_configs.get_config("cifar10")


def test_override_parses_each_field_as_its_declared_type():
    """A float field whose default is written as an int takes a fraction; "none" is None."""
    config = named_configs.get_config("cifar10_cpu", ["duration=0.5", "warmup=0", "unit=none", "train_examples=none"])
    assert (config.duration, config.warmup, config.unit, config.train_examples) == (0.5, 0.0, None, None)
    assert type(config.duration) is float
    assert named_configs.get_config("cifar10_resnet1001_torch", ["scan_units=none"]).scan_units is None


@pytest.mark.large
@pytest.mark.parametrize(
    "overrides, loops",
    [([], True), (["scan_units=false"], False), (["synchronized_batch_norm=true"], False)],
    ids=["the model function's choice", "separate units asked", "synchronized BatchNorm"],
)
def test_scan_units_none_is_the_model_functions_choice_but_with_synchronized_batch_norm(overrides, loops):
    """ResNet-1001 trains with its units as loops by default, except where BatchNorm's
    statistics are reduced across replicas, which a loop cannot do."""
    config = named_configs.get_config("cifar10_paper", ["model=resnet1001", *overrides])
    network = recipe.network_of(config, (32, 32, 3), 10)
    assert any(isinstance(layer, keras_preact.StackedUnits) for layer in network.layers) is loops


def test_override_parses_types():
    config = named_configs.get_config(
        "cifar10_paper",
        ["model=resnet164", "nesterov=true", "decay_boundaries=10,20", "train_examples=100", "learning_rate=0.2"],
    )
    assert (config.model, config.nesterov, config.decay_boundaries, config.train_examples, config.learning_rate) == (
        "resnet164",
        True,
        (10, 20),
        100,
        0.2,
    )


@pytest.mark.parametrize(
    "command, backend",
    [("ablate", "torch"), ("tune", "jax"), ("tune", "torch"), ("export", "jax"), ("export", "torch")],
)
def test_commands_stop_at_once_on_a_backend_they_do_not_run_on(monkeypatch, capsys, command, backend):
    """ablate runs on TensorFlow and JAX, tune and export on TensorFlow alone (train on every
    backend): under another backend (made to look so here) they exit 2 naming the backend
    and what to do."""
    from keras_preact_training import cli

    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    arguments = {
        "train": ["--config", "digits_demo"],
        "tune": ["--config", "digits_demo"],
        "ablate": ["--table", "1"],
        "export": ["--model", "resnet20", "--weights", "cifar10"],
    }[command]
    assert cli.main([command, *arguments]) == 2
    if command == "ablate":
        assert capsys.readouterr().err == (
            f"error: keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute) or on JAX (one device). "
            "Received: KERAS_BACKEND=torch. Set KERAS_BACKEND=tensorflow or jax (on a GPU: TensorFlow's CUDA build, "
            "pip install 'keras-preact[gpu]', or JAX's, pip install 'jax[cuda12]'); train, evaluate and the model "
            "functions run on every backend.\n"
        )
    else:
        assert capsys.readouterr().err == (
            f"error: keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute, SavedModels). "
            f"Received: KERAS_BACKEND={backend}. Unset KERAS_BACKEND (on a GPU: pip install 'keras-preact[gpu]', "
            "TensorFlow's CUDA build); ablate runs on JAX too, and train, evaluate and the model functions on "
            "every backend.\n"
        )
