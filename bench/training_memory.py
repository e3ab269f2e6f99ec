"""Peak memory and time of the first training steps, with and without rematerialization.

    python bench/training_memory.py --model resnet1001 --batch-size 128

Each configuration runs in a fresh process: build the network, then `--steps` training
steps of SGD on random images (a `tf.function`, tracing included in the first), and
report the process's peak resident memory (the kernel's high-water mark, VmHWM), the
seconds to build and to the end of the first step, and the seconds per later step.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness import peak_resident_gibibytes, random_batch_training


def measure(model_name, batch_size, rematerialize, steps):
    import keras_preact

    started = time.perf_counter()
    model = keras_preact.get_model(model_name, classes=10, classifier_activation=None, rematerialize=rematerialize)
    build_seconds = time.perf_counter() - started
    step, _ = random_batch_training(model, batch_size)

    started = time.perf_counter()
    step().numpy()
    first_step_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps - 1):
        step().numpy()
    step_seconds = (time.perf_counter() - started) / max(steps - 1, 1)
    return dict(
        model=model_name,
        batch_size=batch_size,
        rematerialize=rematerialize,
        build_s=round(build_seconds, 1),
        first_step_s=round(first_step_seconds, 1),
        step_s=round(step_seconds, 2) if steps > 1 else None,
        peak_gib=round(peak_resident_gibibytes(), 2),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet1001")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rematerialize", choices=["both", "on", "off"], default="both")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process
    arguments = parser.parse_args()
    if arguments.one:
        print(
            json.dumps(measure(arguments.model, arguments.batch_size, arguments.rematerialize == "on", arguments.steps))
        )
        return
    from harness import machine

    print(f"machine: {machine()}")
    print("| model | batch | rematerialize | peak memory GiB | build s | first step s | later step s |")
    print("|---|---|---|---|---|---|---|")
    for setting in ["off", "on"] if arguments.rematerialize == "both" else [arguments.rematerialize]:
        result = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--one",
                "--model",
                arguments.model,
                "--batch-size",
                str(arguments.batch_size),
                "--steps",
                str(arguments.steps),
                "--rematerialize",
                setting,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            print(
                f"| {arguments.model} | {arguments.batch_size} | {setting} | failed: "
                f"{(result.stderr.strip().splitlines() or ['killed'])[-1][:120]} | | | |",
                flush=True,
            )
            continue
        row = json.loads(result.stdout.strip().splitlines()[-1])
        print(
            f"| {row['model']} | {row['batch_size']} | {setting} | {row['peak_gib']} | {row['build_s']} | "
            f"{row['first_step_s']} | {row['step_s']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
