"""The benchmark harness: keras-preact's networks against their peers and this machine's limit.

    python bench/harness.py                                   # ResNet-164, ResNet-50 vs ResNet50V2
    python bench/harness.py --models resnet1001 resnet152 --peers ResNet152V2
    python bench/harness.py --models resnet1001 --scan-units --rematerialize --peers
    python bench/harness.py --models resnet20 resnet164 --peers --unfused    # fused BatchNorm before/after

For each network, in a fresh process (so that peak memory is its own): seconds to build
it; seconds to the end of the first training step (SGD with momentum, the loss and
weight decay, in a `tf.function`: tracing included); training images/s (median of
`--steps` later steps); inference images/s; SavedModel export (`model.export`) and reload
seconds; the peak resident memory of the process up to the end of training (build and
training steps, before inference and export). Batch 128 at 32x32 for CIFAR networks,
batch 32 at 224x224 for ImageNet networks. FLOPs per image are counted from the traced
forward graph (TensorFlow's profiler: convolutions and matrix products), and each training
rate is set against the CPU's measured float32 matmul rate (training ~ 3 x forward FLOPs).
Keras Applications peers (`--peers`) are measured side by side, with our network of the
same depth, and so are PyTorch's (`--torch resnet50 resnet164`, `bench/torch_peers.py`,
with the `bench` extra: torch 2.13.0's CPU build); the ratios are printed. `--unfused`
measures each of `--models` again with BatchNorm's portable `keras.ops` path in place of
TensorFlow's fused kernel (`keras_preact.walks.set_fused(model, False)`), the code
before the fused path, and prints what the fused kernel gains.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow's oneDNN kernels on every processor, as keras-preact's commands train
# (keras_preact_training.tensorflow_import.use_onednn), for every benchmark that imports this one first.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# Keras Applications' pre-activation ResNets, against ours of the same depth.
PEERS = {"ResNet50V2": "resnet50", "ResNet101V2": "resnet101", "ResNet152V2": "resnet152"}
CIFAR_BATCH, IMAGENET_BATCH = 128, 32
# Training a network costs about three times its forward pass (forward, and the
# gradients with respect to activations and to weights).
TRAINING_FLOPS_PER_FORWARD = 3


def processor():
    """The processor's model name (Linux's /proc/cpuinfo; elsewhere what `platform` knows)."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor()


def machine():
    """The processor, its cores and the versions every benchmark prints with its figures."""
    import keras
    import tensorflow as tf

    return (
        f"{processor()}, {os.cpu_count()} cores, Keras {keras.__version__} on {keras.backend.backend()}, "
        f"TensorFlow {tf.__version__}, Python {platform.python_version()}"
    )


def build(name, precision="float32", unfused=False, **options):
    """A peer, or our network `name` with `keras_preact.ResNet` `options` (scan_units, ...);
    `unfused`: BatchNorm's portable path instead of TensorFlow's fused kernel."""
    import keras

    import keras_preact

    keras.config.set_dtype_policy(precision)
    if name in PEERS:
        return getattr(keras.applications, name)(weights=None, classifier_activation=None)
    model = keras_preact.get_model(name, classifier_activation=None, **options)
    keras_preact.walks.set_fused(model, not unfused)
    return model


def forward_flops(model):
    """FLOPs of one image's forward pass, from the traced graph.

    The profiler does not enter a loop's body, so the units of each `StackedUnits`
    layer are counted apart: one unit's graph, times the number of units.
    """
    import keras_preact

    flops = _graph_flops(lambda images: model(images, training=False), model.input_shape[1:])
    for layer in model.layers:
        if isinstance(layer, keras_preact.StackedUnits):
            flops += layer.count * _graph_flops(
                lambda inputs, unit=layer.unit: unit(inputs, training=False), layer.input.shape[1:]
            )
    return flops


def _graph_flops(function, shape):
    """The float operations (convolutions and matrix products) of `function` on one example of `shape`."""
    import tensorflow as tf

    graph = tf.function(function).get_concrete_function(tf.TensorSpec((1, *shape), tf.float32)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def peak_resident_gibibytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 2**20


def measure(name, steps, precision="float32", xla=False, batch=None, unfused=False, **options):
    import tensorflow as tf

    started = time.perf_counter()
    model = build(name, precision, unfused, **options)
    build_seconds = time.perf_counter() - started
    shape = model.input_shape[1:]
    batch = batch or (CIFAR_BATCH if shape[0] == 32 else IMAGENET_BATCH)
    train_step, images = random_batch_training(model, batch, xla)

    predict = tf.function(lambda batch_images: model(batch_images, training=False), jit_compile=xla)
    started = time.perf_counter()
    train_step().numpy()
    first_step = time.perf_counter() - started
    step_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step().numpy()
        step_seconds.append(time.perf_counter() - started)
    training_peak = peak_resident_gibibytes()  # the process's high-water mark, build and training steps
    predict(images).numpy()
    inference_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        predict(images).numpy()
        inference_seconds.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        model.export(os.path.join(directory, "1"), verbose=False)
        export_seconds = time.perf_counter() - started
        started = time.perf_counter()
        tf.saved_model.load(os.path.join(directory, "1"))
        reload_seconds = time.perf_counter() - started
    label = name + "".join(f" {option}" for option, value in options.items() if value)
    label += (f" {precision}" if precision != "float32" else "") + (" XLA" if xla else "")
    label += " unfused BatchNorm" if unfused else ""
    return dict(
        name=label,
        batch=batch,
        image_size=shape[0],
        build_s=build_seconds,
        first_step_s=first_step,
        train_images_per_s=batch / statistics.median(step_seconds),
        inference_images_per_s=batch / statistics.median(inference_seconds),
        export_s=export_seconds,
        reload_s=reload_seconds,
        forward_flops=forward_flops(model),
        peak_gib=training_peak,
    )


def random_batch_training(model, batch, xla=False):
    """(train_step, images): the training loop's step (`keras_preact_training.train.tensorflow_steps.replica_step_function`:
    the loss, SGD with momentum taking over the network's weight decay, `recipe.CoupledSGD`)
    on one batch of random images, as a `tf.function` (what every benchmark here times).
    The optimizer is built before the first step, as the training loop builds it."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_preact_training.train import recipe, tensorflow_steps

    images = tf.constant(np.random.default_rng(0).normal(size=(batch, *model.input_shape[1:])).astype("float32"))
    labels = tf.constant(np.arange(batch) % model.output_shape[-1])
    optimizer = recipe.CoupledSGD(0.1, momentum=0.9)
    optimizer.take_weight_decay(model)
    optimizer.build(model.trainable_variables)
    per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    step = tensorflow_steps.replica_step_function(model, optimizer, batch, per_example_loss, xla)

    @tf.function
    def train_step():
        loss, _ = step(images, labels)
        return loss

    return train_step, images


def matmul_flops_per_second(size=4096, repeats=10, dtype="float32"):
    """The CPU's matmul rate through TensorFlow in `dtype` (the best of `repeats`): the
    limit of a network's convolutions in that precision (bfloat16's for mixed precision)."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal((size, size)), dtype)
    b = tf.cast(tf.random.normal((size, size)), dtype)
    tf.matmul(a, b).numpy()
    best = min(_timed(lambda: tf.matmul(a, b).numpy()) for _ in range(repeats))
    return 2 * size**3 / best


def _timed(function):
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def run_one(name, steps, options=()):
    """Measures one network in a fresh process; `options` are this script's flags."""
    if name.startswith("torch_"):
        command = [
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peers.py"),
            "--model",
            name[len("torch_") :],
        ]
    else:
        command = [os.path.abspath(__file__), "--one", name, *options]
    result = subprocess.run([sys.executable, *command, "--steps", str(steps)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet164"], help="keras-preact networks")
    parser.add_argument(
        "--peers",
        nargs="*",
        default=["ResNet50V2"],
        choices=sorted(PEERS),
        help="Keras Applications peers, each measured with our network of its depth",
    )
    parser.add_argument(
        "--torch",
        nargs="*",
        default=[],
        choices=["resnet50", "resnet164"],
        help="PyTorch peers of our networks (needs torch, the `bench` extra)",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed training steps after the first")
    parser.add_argument(
        "--variants", action="store_true", help="also measure --models with mixed_bfloat16, with XLA, and with both"
    )
    parser.add_argument(
        "--scan-units", action="store_true", help="build --models with scan_units=True (each stage's units as one loop)"
    )
    parser.add_argument("--rematerialize", action="store_true", help="build --models with rematerialize=True")
    parser.add_argument("--batch", type=int, help="the batch size of --models (default 128 for CIFAR nets, 32 else)")
    parser.add_argument(
        "--unfused",
        action="store_true",
        help="also measure --models with BatchNorm's portable path instead of the fused kernel",
    )
    parser.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--xla", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.one:
        ours = (
            {}
            if arguments.one in PEERS
            else dict(
                scan_units=arguments.scan_units,
                rematerialize=arguments.rematerialize,
                batch=arguments.batch,
                unfused=arguments.unfused,
            )
        )
        print(json.dumps(measure(arguments.one, arguments.steps, arguments.precision, arguments.xla, **ours)))
        return
    from harness import machine

    peak = matmul_flops_per_second()
    print(f"machine: {machine()}; float32 matmul {peak / 1e9:.0f} GFLOP/s; {time.strftime('%Y-%m-%d')}")
    names = list(
        dict.fromkeys(
            arguments.models
            + [name for peer in arguments.peers for name in (PEERS[peer], peer)]
            + [name for model in arguments.torch for name in (model, f"torch_{model}")]
        )
    )
    ours = [
        flag
        for flag, value in (("--scan-units", arguments.scan_units), ("--rematerialize", arguments.rematerialize))
        if value
    ]
    ours += ["--batch", str(arguments.batch)] if arguments.batch else []
    results = {name: run_one(name, arguments.steps, ours) for name in names}
    if arguments.unfused:
        for name in arguments.models:
            results[f"{name} unfused"] = run_one(name, arguments.steps, ours + ["--unfused"])
    if arguments.variants:
        for name in arguments.models:
            for options in (["--precision", "mixed_bfloat16"], ["--xla"], ["--precision", "mixed_bfloat16", "--xla"]):
                row = run_one(name, arguments.steps, ours + options)
                results[row["name"]] = row
    for name in names:  # the same network in PyTorch does the same work
        if name.startswith("torch_"):
            results[name]["forward_flops"] = results[name[len("torch_") :]]["forward_flops"]
    print(
        "| network | batch x size | build s | first step s | train img/s | infer img/s | export s | "
        "reload s | peak GiB | GFLOPs/img | of matmul peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results.values():
        fraction = row["train_images_per_s"] * TRAINING_FLOPS_PER_FORWARD * row["forward_flops"] / peak
        optional = [f"{row[field]:.1f}" if field in row else "-" for field in ("export_s", "reload_s")]
        optional.append(f"{row['peak_gib']:.2f}" if "peak_gib" in row else "-")
        print(
            f"| {row['name']} | {row['batch']} x {row['image_size']} | {row['build_s']:.1f} | {row['first_step_s']:.1f} | "
            f"{row['train_images_per_s']:.1f} | {row['inference_images_per_s']:.1f} | {' | '.join(optional)} | "
            f"{row['forward_flops'] / 1e9:.2f} | {fraction:.0%} |"
        )
    for peer in arguments.peers:
        ours, theirs = results[PEERS[peer]], results[peer]
        print(
            f"{PEERS[peer]} / {peer}: training {ours['train_images_per_s'] / theirs['train_images_per_s']:.2f}x, "
            f"inference {ours['inference_images_per_s'] / theirs['inference_images_per_s']:.2f}x, "
            f"first step {theirs['first_step_s'] / ours['first_step_s']:.2f}x as fast"
        )
    if arguments.unfused:
        for name in arguments.models:
            fused, unfused = results[name], results[f"{name} unfused"]
            print(
                f"{name}, fused / unfused BatchNorm: training "
                f"{fused['train_images_per_s'] / unfused['train_images_per_s']:.2f}x, inference "
                f"{fused['inference_images_per_s'] / unfused['inference_images_per_s']:.2f}x, first step "
                f"{unfused['first_step_s'] / fused['first_step_s']:.2f}x as fast"
            )
    for model in arguments.torch:
        ours, theirs = results[model], results[f"torch_{model}"]
        print(
            f"{model} / PyTorch {theirs['torch']} ({theirs['threads']} threads): training "
            f"{ours['train_images_per_s'] / theirs['train_images_per_s']:.2f}x, inference "
            f"{ours['inference_images_per_s'] / theirs['inference_images_per_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
