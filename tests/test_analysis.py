"""keras_preact.analysis and `keras-preact diagnose`: the paper's Eqns. 4-5 and 7-8."""

import os
import subprocess

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import analysis
from keras_preact_training.experiments import diagnose
from tests.conftest import KERAS_PREACT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES, LABELS = diagnose.real_images(16)


def gradient_ratio(statistics):
    """||dE/dx|| at the first unit's input over that at the last unit's input."""
    return statistics[0].input_gradient_norm / statistics[-1].input_gradient_norm


@pytest.mark.tensorflow
def test_preactivation_resnet164_propagates_gradients_far_better_than_a_plain_net():
    """At initialisation, in training mode, on 16 real digits (seed 1603):

    measured: pre-activation ResNet-164, gradient at the first unit's input / at the last
    unit's input = 836 over 54 units, 1.135 per unit; the plain network of the same
    depth 3.1e11, 1.647 per unit, 3.7e8 times more. With BatchNorm the gradient does not
    vanish but grows towards the input; identity shortcuts keep that growth close to 1
    per unit. The bounds leave room on either side of the measured values.
    """
    preactivation = analysis.propagation(kp.ResNet164(), IMAGES, LABELS)
    plain = analysis.propagation(kp.ResNet164(unit="original", merge=kp.NoShortcut()), IMAGES, LABELS)
    per_unit = gradient_ratio(preactivation) ** (1 / 53)
    assert len(preactivation) == 54
    assert 1 / 1.2 < per_unit < 1.2
    assert gradient_ratio(plain) > 1e5 * gradient_ratio(preactivation)


def test_propagation_measures_every_unit_and_leaves_the_model_unchanged():
    model = kp.ResNet20()
    before = [np.array(variable) for variable in model.weights]
    statistics = analysis.propagation(model, IMAGES[:4], LABELS[:4])
    assert [unit.name for unit in statistics] == [f"stage{s}_unit{u}" for s in (1, 2, 3) for u in (1, 2, 3)]
    for unit in statistics:
        values = (
            unit.output_norm,
            unit.shortcut_norm,
            unit.residual_norm,
            unit.input_gradient_norm,
            unit.weight_gradient_norm,
        )
        assert all(np.isfinite(value) and value > 0 for value in values), unit
    assert all(np.array_equal(old, np.array(new)) for old, new in zip(before, model.weights))


def test_propagation_matches_the_unit_outputs():
    """The output norm of the last unit is that of the network's features before the head."""
    model = kp.ResNet20()
    statistics = analysis.propagation(model, IMAGES[:4], LABELS[:4])
    features = keras.Model(model.input, model.get_layer("stage3_unit3").output)(IMAGES[:4], training=True)
    expected = np.linalg.norm(keras.ops.convert_to_numpy(features).astype("float64")) / 2.0
    assert statistics[-1].output_norm == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("scale", [0.5, 0.9])
def test_scaled_shortcuts_attenuate_by_lambda_to_the_number_of_units(scale):
    """Eqn. 8: with F = 0, dE/dx_l = lambda^(L-l) dE/dx_L (9 units: 0.5^9 = 0.00195)."""
    model = kp.ResNet56(merge=kp.ConstantScaling(scale, 1.0))
    units = analysis.stage_units(model, 1)
    gains = analysis.shortcut_gains(units, np.random.default_rng(0).normal(size=(2, 8, 8, 16)))
    assert len(units) == 9
    np.testing.assert_allclose(gains, [scale ** (9 - index) for index in range(10)], rtol=1e-5)


def test_identity_shortcuts_pass_the_gradient_unchanged():
    gains = analysis.shortcut_gains(
        analysis.stage_units(kp.ResNet56(), 1), np.random.default_rng(0).normal(size=(2, 8, 8, 16))
    )
    np.testing.assert_allclose(gains, np.ones(10), rtol=1e-6)


@pytest.mark.parametrize("form", ["basic", "bottleneck"])
def test_identity_mapping_is_exact_for_preactivation_units_only(form):
    model_of = {"basic": kp.ResNet20, "bottleneck": kp.ResNet164}[form]
    x_l = np.random.default_rng(0).normal(size=(1, 4, 4, 16 if form == "basic" else 64)).astype("float32")
    preactivation = analysis.identity_mapping(analysis.stage_units(model_of(), 1), x_l)
    original = analysis.identity_mapping(analysis.stage_units(model_of(unit="original"), 1), x_l)
    assert preactivation.passed and (preactivation.output_error, preactivation.jacobian_error) == (0.0, 0.0)
    assert not original.passed and original.output_error > 0.1 and original.jacobian_error == 1.0


def test_bad_input():
    with pytest.raises(ValueError, match="inputs must be a batch of one example"):
        analysis.identity_mapping(analysis.stage_units(kp.ResNet20(), 1), np.zeros((2, 4, 4, 16)))
    with pytest.raises(ValueError, match="Received: stage=4"):
        analysis.stage_units(kp.ResNet20(), 4)
    inputs = keras.Input((8, 8, 3))
    branched = keras.Model(inputs, keras.layers.Add()([keras.layers.Conv2D(3, 1)(inputs), inputs]))
    with pytest.raises(ValueError, match="needs a model whose layers form a chain"):
        analysis.propagation(branched, np.zeros((1, 8, 8, 3)), np.zeros(1))
    with pytest.raises(ValueError, match="needs a model with residual units"):
        analysis.propagation(
            keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]),
            np.zeros((1, 8, 8, 3)),
            np.zeros(1),
        )


@pytest.mark.tensorflow
def test_diagnose_command_writes_its_plots_and_tables(tmp_path):
    result = subprocess.run(
        [KERAS_PREACT, "diagnose", "--depths", "20", "--depth", "20", "--batch-size", "8", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("gradients.png", "forward.png", "shortcut_gains.png"):
        assert (tmp_path / name).stat().st_size > 20000
    table = (tmp_path / "propagation.md").read_text().splitlines()
    assert len(table) == 2 + 9 and "ResNet-20 plain" in table[4]
    identity = (tmp_path / "identity.md").read_text()
    assert "| preactivation | 3 | 0 | 0 | exact |" in identity and "| original | 3 |" in identity


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(batch_size=0), "batch_size must be a positive integer. Received: batch_size=0"),
        (dict(batch_size=2.5), "batch_size must be a positive integer. Received: batch_size=2.5"),
        (dict(seed=-1), r"seed must be an integer from 0 to 2\*\*32 - 1. Received: seed=-1"),
    ],
)
def test_diagnose_refuses_a_bad_batch_size_or_seed_before_writing(tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        diagnose.diagnose(str(tmp_path / "plots"), depths=(20,), depth=20, **arguments)
    assert not (tmp_path / "plots").exists()


def test_diagnose_refuses_an_output_folder_it_cannot_make(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(
        ValueError,
        match=f"Cannot make the output folder {tmp_path}/a_file/plots: {tmp_path}/a_file is a file, not a folder",
    ):
        diagnose.diagnose(str(tmp_path / "a_file" / "plots"), depths=(20,), depth=20, batch_size=2)
