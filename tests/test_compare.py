"""`keras-preact compare`: finished runs side by side, error against hours."""

import json

import pytest

from keras_preact_training import cli
from keras_preact_training.experiments import compare

HEADER = (
    "step,epoch,loss,accuracy,learning_rate,test_loss,test_error,images_per_second,validation_loss,"
    "validation_error,hours\n"
)


def write_run(directory, schedule, errors, hours, averages=None, **settings):
    """A finished run that evaluated on validation after steps 100, 200, ... with `errors`,
    its config `settings` besides the schedule and length, and the final validation error of
    each of `averages` ({prefix: error}) of its weights."""
    directory.mkdir()
    rows = [
        f"{100 * (index + 1)},{index + 1},0.5,0.8,0.1,,,100,0.6,{error},{hours * (index + 1) / len(errors)}"
        for index, error in enumerate(errors)
    ]
    (directory / "log.csv").write_text(HEADER + "\n".join(rows) + "\n")
    summary = dict(
        evaluated_on="validation",
        validation_error=errors[-1],
        steps=100 * len(errors),
        training_hours=hours,
        config=dict(schedule=schedule, duration=len(errors), schedule_unit="epochs", batch_size=128, **settings),
        **{f"{kind}_validation_error": error for kind, error in (averages or {}).items()},
    )
    (directory / "summary.json").write_text(json.dumps(summary))
    return str(directory)


def test_compare_tables_final_error_and_hours_to_come_close(tmp_path, capsys):
    step = write_run(tmp_path / "step", "step", [0.40, 0.30, 0.10], hours=3.0)
    cosine = write_run(tmp_path / "cosine", "cosine", [0.30, 0.105, 0.095], hours=6.0)
    table = compare.compare([step, cosine], str(tmp_path / "out"))
    # The best final error is 9.5 %; within a point: 10.5 %, reached at step 200 by cosine
    # (2 of its 3 equal hours) and at step 300 by step.
    assert [(row["run"], row["schedule"], row["duration"]) for row in table] == [
        ("step", "step", "3 epochs"),
        ("cosine", "cosine", "3 epochs"),
    ]
    assert [row["error"] for row in table] == pytest.approx([10.0, 9.5])
    assert [row["hours"] for row in table] == pytest.approx([3.0, 6.0])
    assert [row["hours_to_close"] for row in table] == pytest.approx([3.0, 4.0])
    # A measured rate replaces the logged hours: 300 steps of 128 images at 3,600 images/s.
    table = compare.compare([step, cosine], str(tmp_path / "out"), images_per_second=3600)
    assert [row["hours"] for row in table] == pytest.approx([128 * 300 / 3600 / 3600] * 2)
    assert (tmp_path / "out" / "time_to_accuracy.png").stat().st_size > 10_000
    markdown = (tmp_path / "out" / "comparison.md").read_text().splitlines()
    assert markdown[0] == "| run | settings | duration | final validation error | hours | hours to 10.50 % |"
    assert markdown[2] == "| step | schedule=step | 3 epochs | 10.00 % | 0.00 | 0.00 |"
    # A target error: the hours to the first evaluation at or below it (cosine: step 200 of 300).
    table = compare.compare([step, cosine], str(tmp_path / "target"), target=12.0)
    assert [row["hours_to_target"] for row in table] == pytest.approx([3.0, 4.0])
    assert compare.compare([step], str(tmp_path / "never"), target=5.0)[0]["hours_to_target"] is None
    markdown = (tmp_path / "target" / "comparison.md").read_text().splitlines()
    assert markdown[0].endswith("| hours to 10.50 % | hours to 12.00 % |") and markdown[3].endswith("| 4.00 | 4.00 |")

    assert cli.main(["compare", step, cosine, "--output", str(tmp_path / "cli")]) == 0
    assert "cosine: cosine schedule, 3 epochs, final error 9.50 %, 6.00 hours" in capsys.readouterr().out


def test_compare_gives_each_average_of_the_weights_beside_the_trained_weights(tmp_path, capsys):
    """Runs that kept averages of their weights: each average's final error in a column of its
    own beside the trained weights' ("-" for a run that did not keep it), and in the command's lines."""
    plain = write_run(tmp_path / "plain", "cosine", [0.2, 0.1], hours=1.0)
    averaged = write_run(
        tmp_path / "averaged", "cosine", [0.2, 0.1], 1.0, {"average": 0.09, "swa": 0.085}, swa_start=0.75
    )
    table = compare.compare([plain, averaged], str(tmp_path / "out"))
    assert [row["averages"] for row in table] == [
        {"average": None, "swa": None},
        {"average": pytest.approx(9.0), "swa": pytest.approx(8.5)},
    ]
    markdown = (tmp_path / "out" / "comparison.md").read_text().splitlines()
    assert markdown[:4] == [
        "| run | settings | duration | final validation error | final validation error, weights' average | final "
        "validation error, weights' equal average (SWA) | hours | hours to 11.00 % |",
        "|---|---|---|---|---|---|---|---|",
        "| plain | swa_start=0.0 | 2 epochs | 10.00 % | - | - | 1.00 | 1.00 |",
        "| averaged | swa_start=0.75 | 2 epochs | 10.00 % | 9.00 % | 8.50 % | 1.00 | 1.00 |",
    ]
    assert cli.main(["compare", plain, averaged, "--output", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "plain: cosine schedule, 2 epochs, final error 10.00 %, 1.00 hours",
        "averaged: cosine schedule, 2 epochs, final error 10.00 % (weights' average 9.00 %, weights' equal "
        "average (SWA) 8.50 %), 1.00 hours",
    ]


def test_compare_gives_a_setting_a_run_predates_its_default(tmp_path):
    """A run whose config.json was written before a field existed had that field's default:
    cutout=0, not None, beside a run with Cutout."""
    before = write_run(tmp_path / "before", "cosine", [0.1], hours=1.0)
    cutout = write_run(tmp_path / "cutout", "cosine", [0.1], hours=1.0, cutout=16, learning_rate=0.2)
    table = compare.compare([before, cutout], str(tmp_path / "out"))
    assert [row["settings"] for row in table] == ["cutout=0, learning_rate=0.1", "cutout=16, learning_rate=0.2"]


def test_compare_refuses_unfinished_runs_and_bad_rates(tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "compare needs finished runs (summary.json and log.csv)" in capsys.readouterr().err
    run = write_run(tmp_path / "run", "step", [0.2], hours=1.0)
    assert cli.main(["compare", run, "--images-per-second", "0"]) == 2
    assert "images_per_second must be positive. Received: 0.0" in capsys.readouterr().err
    assert cli.main(["compare", run, "--target", "120"]) == 2
    assert "target must be an error in percent, between 0 and 100. Received: 120.0" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert cli.main(["compare", run, "--output", str(tmp_path / "a_file" / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: Cannot make the output folder {tmp_path}/a_file/out: {tmp_path}/a_file is a file, not a folder. "
        f"Choose another path. Received: '{tmp_path}/a_file/out'\n"
    )
