"""precision="auto": mixed bfloat16 where the device that trains computes bfloat16 natively,
float32 elsewhere, with the processor's features faked both ways (no test depends on the
machine it runs on); a run records what it resolved to and keeps it when resumed."""

import json

import keras
import pytest

from keras_preact_training.train import loop, named_configs, precision

DIGITS = named_configs.get_config(
    "digits_demo", ["duration=2", "evaluate_every=1000", "checkpoint_every=10", "log_every=10"]
)
X86_ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16\n\nprocessor\t: 1\n"
X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, native",
    [(X86_ZEN4, True), (X86_AVX2, False), (ARM_BF16, True), ("", False)],
    ids=["AVX512_BF16", "AVX2 only", "Armv8.6 BF16", "unreadable"],
)
def test_the_cpus_features_decide_from_proc_cpuinfo(tmp_path, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    features = precision.cpu_features(str(path))
    assert precision.native_bfloat16(("cpu", None), features)[0] is native
    assert precision.cpu_features(str(tmp_path / "missing")) == set()


def test_a_gpu_decides_by_its_compute_capability_and_a_tpu_always_computes_bfloat16():
    assert precision.native_bfloat16(("gpu", (9, 0))) == (
        True,
        "this GPU (compute capability 9.0) has bfloat16 tensor cores",
    )
    assert precision.native_bfloat16(("gpu", (7, 5)))[0] is False
    assert precision.native_bfloat16(("gpu", None))[0] is False
    assert precision.native_bfloat16(("tpu", None))[0] is True
    assert precision.capability_of("8.6") == (8, 6) and precision.capability_of((8, 0)) == (8, 0)


def test_auto_resolves_by_the_device_and_says_so_other_precisions_stay(capsys):
    config = DIGITS.override("precision=auto")
    native = precision.resolved(config, device=("cpu", None), features={"avx512_bf16"})
    assert native.precision == "mixed_bfloat16"
    assert capsys.readouterr().out == (
        "Precision: mixed_bfloat16 (precision=auto: this CPU has AVX512_BF16; --set precision=... chooses one).\n"
    )
    emulated = precision.resolved(config, device=("cpu", None), features={"avx2"})
    assert emulated.precision == "float32"
    assert "this CPU has no bfloat16 instructions (AVX512_BF16, AMX-BF16 or BF16)" in capsys.readouterr().out
    for forced in ("float32", "mixed_bfloat16"):
        assert precision.resolved(DIGITS.override(f"precision={forced}"), features=set()).precision == forced
    assert capsys.readouterr().out == ""
    assert named_configs.CONFIGS["cifar10_zoo"].precision == "auto"
    with pytest.raises(
        ValueError, match=r"precision must be one of \['float32', 'mixed_bfloat16', 'mixed_float16', 'auto'\]"
    ):
        DIGITS.override("precision=bfloat16")


@pytest.mark.tensorflow
def test_a_run_records_the_precision_it_chose_and_keeps_it_when_resumed(tmp_path, monkeypatch, capsys):
    """A run begun where bfloat16 is emulated trains in float32 and records it; resumed
    where bfloat16 is native, it keeps float32, as it began."""
    monkeypatch.setattr(precision, "accelerator", lambda: ("cpu", None))
    monkeypatch.setattr(precision, "cpu_features", lambda: {"avx2"})
    run_dir = tmp_path / "run"
    config = DIGITS.override("precision=auto")
    keras.backend.clear_session()  # Keras' layer names as in a new process, whatever ran before here
    try:
        loop.train(config.override("duration=1"), str(run_dir), verbose=True)
        assert json.loads((run_dir / "config.json").read_text())["precision"] == "float32"
        assert "Precision: float32 (precision=auto: this CPU has no bfloat16" in capsys.readouterr().out
        monkeypatch.setattr(precision, "cpu_features", lambda: {"avx512_bf16"})
        keras.backend.clear_session()  # Keras' layer names as in a new process, which a resume is
        summary = loop.train(config, str(run_dir), verbose=True, allow_config_changes=True)  # one epoch more
        assert "Precision: float32 (precision=auto: as the run began;" in capsys.readouterr().out
        assert summary["config"]["precision"] == "float32"
        assert json.loads((run_dir / "config.json").read_text())["precision"] == "float32"
        keras.backend.clear_session()
        fresh = loop.train(config.override("duration=1"), str(tmp_path / "fresh"), verbose=False)
        assert fresh["config"]["precision"] == "mixed_bfloat16"
        # Carried to a processor that would emulate bfloat16, it trains on in float32 where asked:
        # its checkpoint's variables are float32 under either policy.
        keras.backend.clear_session()
        switched = loop.train(
            config.override("precision=float32"), str(tmp_path / "fresh"), verbose=True, allow_config_changes=True
        )
        assert "with changed settings (--allow-config-changes): duration, precision." in capsys.readouterr().out
        assert switched["config"]["precision"] == "float32" and switched["steps"] == 2 * fresh["steps"]
        assert json.loads((tmp_path / "fresh" / "config.json").read_text())["precision"] == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
