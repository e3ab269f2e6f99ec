"""The README's first block, timed: a model function, `compile`, then `fit` on a tf.data pipeline.

    python bench/first_step.py                                          # ResNet-1001, default layout
    python bench/first_step.py --models resnet110 resnet164 resnet1001 --layouts separate loops
    python bench/first_step.py --models resnet20 resnet164 --layouts separate --batch 128 --phases

What a new user meets: for each network and layout, in a fresh process,
the seconds to build it (`keras_preact.get_model`), and through `model.fit` on 32x32
random images in a `tf.data` pipeline at `--batch` (8, the README's): the seconds from
calling `fit` to the end of its first step (tracing included), the median seconds of
the later steps, and the process's peak resident memory. Layouts: `default` (the
model function's own choice, `scan_units=None`), `separate` (`scan_units=False`, a
layer per unit) and `loops` (`scan_units=True`).

`--phases`: where the first step of the training loop's own step goes (the step
of `keras-preact` and of bench/harness.py, built before its first call as the loop
builds it): seconds to trace it (Python building the graph) and the operations traced,
seconds of the first call (graph optimization by Grappler, kernel creation, the step
itself), of which Grappler is the difference to a first call in a process with
Grappler's meta-optimizer off, and the median later step; beside each call, the CPU
seconds the operating system spent for the process (on all cores) and its page faults:
the first call is where the step's tensors first take their memory.
"""

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness import peak_resident_gibibytes

LAYOUTS = {"default": None, "separate": False, "loops": True}


def measure(name, layout, batch, steps):
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_preact

    started = time.perf_counter()
    model = keras_preact.get_model(name, scan_units=LAYOUTS[layout])
    build_seconds = time.perf_counter() - started
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    random = np.random.default_rng(0)
    images = random.normal(size=(batch * (steps + 1), *model.input_shape[1:])).astype("float32")
    labels = random.integers(0, model.output_shape[-1], size=len(images))
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch)

    ends = []

    class StepEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    started = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=0, callbacks=[StepEnds()])
    later = [after - before for before, after in itertools.pairwise(ends)]
    loops = any(isinstance(layer, keras_preact.StackedUnits) for layer in model.layers)
    return dict(
        model=name,
        layout=layout,
        loops=loops,
        batch=batch,
        build_s=build_seconds,
        first_step_s=ends[0] - started,
        step_s=statistics.median(later) if later else None,
        peak_gib=peak_resident_gibibytes(),
    )


def phases(name, layout, batch, steps, grappler):
    import tensorflow as tf
    from harness import random_batch_training

    import keras_preact

    if not grappler:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    model = keras_preact.get_model(name, scan_units=LAYOUTS[layout], classifier_activation=None)
    step, _ = random_batch_training(model, batch)
    started = time.perf_counter()
    operations = len(step.get_concrete_function().graph.get_operations())
    trace_seconds = time.perf_counter() - started
    started, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    step().numpy()
    first_call_seconds = time.perf_counter() - started
    first_call_system = _system_usage_since(usage)
    later, later_system = [], []
    for _ in range(steps):
        started, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        step().numpy()
        later.append(time.perf_counter() - started)
        later_system.append(_system_usage_since(usage))
    return dict(
        model=name,
        layout=layout,
        batch=batch,
        trace_s=trace_seconds,
        operations=operations,
        first_call_s=first_call_seconds,
        step_s=statistics.median(later),
        first_call_system_s=first_call_system[0],
        first_call_page_faults=first_call_system[1],
        step_system_s=statistics.median(seconds for seconds, _ in later_system),
        step_page_faults=statistics.median(faults for _, faults in later_system),
    )


def _system_usage_since(usage):
    """(system CPU seconds, page faults) of this process since `usage` (a `getrusage`)."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return now.ru_stime - usage.ru_stime, now.ru_minflt + now.ru_majflt - usage.ru_minflt - usage.ru_majflt


def run(arguments, *options):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        *options,
        "--batch",
        str(arguments.batch),
        "--steps",
        str(arguments.steps),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{options} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def print_phases(arguments):
    print(
        "| model | layout | batch | trace s | operations | first call s | of which Grappler s | trace + first call s "
        "| later step s | system CPU s, first call / later step | page faults, first call / later step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in arguments.models:
        for layout in arguments.layouts:
            row = run(arguments, "--phase", name, layout, "on")
            without = run(arguments, "--phase", name, layout, "off")
            print(
                f"| {name} | {layout} | {row['batch']} | {row['trace_s']:.1f} | {row['operations']:,} | "
                f"{row['first_call_s']:.1f} | {row['first_call_s'] - without['first_call_s']:.1f} | "
                f"{row['trace_s'] + row['first_call_s']:.1f} | {row['step_s']:.3f} | "
                f"{row['first_call_system_s']:.1f} / {row['step_system_s']:.2f} | "
                f"{row['first_call_page_faults']:,} / {row['step_page_faults']:,.0f} |",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet1001"], help="keras-preact networks")
    parser.add_argument("--layouts", nargs="+", default=["default"], choices=sorted(LAYOUTS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the first")
    parser.add_argument("--phases", action="store_true", help="the training loop's step, phase by phase")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--phase", nargs=3, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.one:
        print(json.dumps(measure(*arguments.one, arguments.batch, arguments.steps)))
        return
    if arguments.phase:
        name, layout, grappler = arguments.phase
        print(json.dumps(phases(name, layout, arguments.batch, arguments.steps, grappler == "on")))
        return
    from harness import machine

    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d')}")
    if arguments.phases:
        print_phases(arguments)
        return
    print("| model | layout | units as loops | batch | build s | fit to first step s | later step s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name in arguments.models:
        for layout in arguments.layouts:
            row = run(arguments, "--one", name, layout)
            print(
                f"| {row['model']} | {row['layout']} | {'yes' if row['loops'] else 'no'} | {row['batch']} | "
                f"{row['build_s']:.1f} | {row['first_step_s']:.1f} | {row['step_s']:.3f} | {row['peak_gib']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
