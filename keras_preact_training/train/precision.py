"""`precision="auto"`: bfloat16 where the device that trains computes it natively, float32 elsewhere.

Mixed bfloat16 halves the memory traffic of a step where the hardware multiplies bfloat16
numbers itself, and makes the step several times slower where it does not: the backend then
emulates it (docs/benchmarks.md, "Which processor"). What is checked, for the device the
backend trains on:

- a CPU (every backend): its instruction set, from the `flags` (x86-64) or `Features`
  (AArch64) line of Linux's /proc/cpuinfo: AVX512_BF16 or AMX-BF16 on x86-64, BF16 (Armv8.6)
  on AArch64. Elsewhere, or where the file cannot be read, bfloat16 counts as emulated.
- an NVIDIA GPU: compute capability 8.0 or more (Ampere and later), as the backend reports
  it (JAX's device, PyTorch's `torch.cuda`, TensorFlow's device details).
- a TPU: always native.

A run records the precision it resolved to in its config.json, and a resumed `auto` run
keeps what it started with, whatever machine resumes it.
"""

import dataclasses
import json
import os

import keras

AUTOMATIC = "auto"
NATIVE = "mixed_bfloat16"
EMULATED = "float32"
CPU_INFORMATION = "/proc/cpuinfo"
# The CPU features (as Linux names them) that compute bfloat16 natively.
BFLOAT16_FEATURES = ("avx512_bf16", "amx_bf16", "bf16")
# The first NVIDIA compute capability with bfloat16 tensor cores (Ampere).
BFLOAT16_COMPUTE_CAPABILITY = (8, 0)


def cpu_features(path=CPU_INFORMATION):
    """The feature names of the first processor in Linux's `path` (empty where it cannot be read)."""
    try:
        with open(path) as file:
            for line in file:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def accelerator():
    """(kind, compute capability) of the device Keras' backend trains on: ("cpu", None),
    ("gpu", (major, minor)) or ("tpu", None)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "tpu":
            return "tpu", None
        if device.platform in ("gpu", "cuda", "rocm"):
            return "gpu", capability_of(getattr(device, "compute_capability", None))
        return "cpu", None
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return "gpu", tuple(torch.cuda.get_device_capability())
        return "cpu", None
    import tensorflow as tf

    if tf.config.list_logical_devices("TPU"):
        return "tpu", None
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return "gpu", capability_of(tf.config.experimental.get_device_details(gpus[0]).get("compute_capability"))
    return "cpu", None


def capability_of(value):
    """A compute capability as (major, minor) from "8.6" or (8, 6); None where unknown."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(".")
    return tuple(int(part) for part in value)


def native_bfloat16(device=None, features=None):
    """(whether the training device computes bfloat16 natively, the reason in words).

    Args:
        device: `accelerator()`'s (kind, capability); found where None.
        features: the CPU's feature names; read from /proc/cpuinfo where None.
    """
    kind, capability = accelerator() if device is None else device
    if kind == "tpu":
        return True, "a TPU computes bfloat16 natively"
    if kind == "gpu":
        if capability is not None and capability >= BFLOAT16_COMPUTE_CAPABILITY:
            return True, f"this GPU (compute capability {capability[0]}.{capability[1]}) has bfloat16 tensor cores"
        return False, "this GPU has no bfloat16 tensor cores (compute capability under 8.0)"
    features = cpu_features() if features is None else features
    found = [name for name in BFLOAT16_FEATURES if name in features]
    if found:
        return True, f"this CPU has {found[0].upper()}"
    return False, "this CPU has no bfloat16 instructions (AVX512_BF16, AMX-BF16 or BF16) and would emulate them"


def recorded_precision(run_dir):
    """The precision a begun run in `run_dir` recorded (None for a run not begun)."""
    if run_dir is None:
        return None
    path, checkpoints = os.path.join(run_dir, "config.json"), os.path.join(run_dir, "checkpoints")
    if not (os.path.isfile(path) and os.path.isdir(checkpoints) and os.listdir(checkpoints)):
        return None
    with open(path) as file:
        precision = json.load(file).get("precision")
    return None if precision == AUTOMATIC else precision


def resolved(config, run_dir=None, verbose=True, device=None, features=None):
    """`config` with `precision="auto"` replaced by what trains: the precision a resumed run in
    `run_dir` started with, else `NATIVE` where `native_bfloat16`, else `EMULATED`; said in
    one line where `verbose`. Any other precision is returned as it is."""
    if config.precision != AUTOMATIC:
        return config
    precision = recorded_precision(run_dir)
    if precision is not None:
        reason = "as the run began"
    else:
        native, reason = native_bfloat16(device, features)
        precision = NATIVE if native else EMULATED
    if verbose:
        print(f"Precision: {precision} (precision=auto: {reason}; --set precision=... chooses one).")
    return dataclasses.replace(config, precision=precision)
