"""A training step's parts, each timed alone: what bounds a network's training rate.

    python bench/step_parts.py                          # ResNet-164, batch 128
    python bench/step_parts.py --model resnet20

Reads every convolution and every BatchNorm (with the ReLU that follows it, where one
does) from the network's traced forward graph, times each distinct shape alone (forward
and gradients, on inputs rotated among a few so that they do not stay in the cache),
and sets the sum over the network against its measured training step
(`harness.random_batch_training`). Convolutions are set against the machine's float32
matmul rate; BatchNorm, which does little arithmetic per byte, against the bytes it moves.
"""

import argparse
import collections
import math
import statistics
import time

# bench/, the script's folder
from harness import TRAINING_FLOPS_PER_FORWARD, machine, matmul_flops_per_second, random_batch_training

# Distinct inputs each part is timed on, in turn: a stage-1 activation of ResNet-164 at
# batch 128 is 8 to 34 MB, so four of them with their gradients exceed a 32 MB cache.
ROTATED_INPUTS = 4
# BatchNorm and ReLU forward and gradient pass over an activation-sized tensor about six
# times: read x, write y; read x, y (ReLU's mask) and the incoming gradient, write dx.
BATCH_NORM_PASSES = 6
BYTES_PER_FLOAT32 = 4


def graph_parts(model, batch):
    """{("convolution", input shape, filter shape, strides, padding): count,
    ("batch_norm", input shape, followed by ReLU): count} of the training forward graph."""
    import tensorflow as tf

    forward = tf.function(lambda images: model(images, training=True))
    graph = forward.get_concrete_function(tf.TensorSpec((batch, *model.input_shape[1:]), tf.float32)).graph
    parts = collections.Counter()
    for operation in graph.get_operations():
        if operation.type == "Conv2D":
            parts[
                (
                    "convolution",
                    tuple(operation.inputs[0].shape),
                    tuple(operation.inputs[1].shape),
                    tuple(operation.get_attr("strides")),
                    operation.get_attr("padding").decode(),
                )
            ] += 1
        elif operation.type == "FusedBatchNormV3":
            followed_by_relu = any(consumer.type == "Relu" for consumer in operation.outputs[0].consumers())
            parts[("batch_norm", tuple(operation.inputs[0].shape), followed_by_relu)] += 1
    if not parts:
        raise SystemExit(
            f"{model.name}: no Conv2D or FusedBatchNormV3 in its graph (TensorFlow's fused BatchNorm "
            "is what this benchmark reads; units as loops are not entered)"
        )
    return parts


def part_seconds(part, repeats):
    """Median seconds of one part's forward pass and gradients (with respect to its input
    and its weights), alone in a `tf.function`."""
    import tensorflow as tf

    kind, input_shape = part[0], part[1]
    inputs = [tf.random.normal(input_shape) for _ in range(ROTATED_INPUTS)]
    if kind == "convolution":
        _, _, filter_shape, strides, padding = part
        weights = tf.Variable(tf.random.normal(filter_shape) * 0.1)

        def forward(images):
            return tf.nn.conv2d(images, weights, strides, padding)
    else:
        followed_by_relu = part[2]
        scale, offset = tf.Variable(tf.ones(input_shape[-1])), tf.Variable(tf.zeros(input_shape[-1]))

        def forward(images):
            normalized, _, _ = tf.compat.v1.nn.fused_batch_norm(images, scale, offset, is_training=True)
            return tf.nn.relu(normalized) if followed_by_relu else normalized

    output_shape = forward(inputs[0]).shape
    output_gradients = [tf.random.normal(output_shape) for _ in range(ROTATED_INPUTS)]

    @tf.function
    def forward_and_gradients(images, output_gradient):
        with tf.GradientTape() as tape:
            tape.watch(images)
            outputs = forward(images)
        return tape.gradient(outputs, [images, *tape.watched_variables()], output_gradients=output_gradient)

    seconds = []
    for repeat in range(repeats + ROTATED_INPUTS):
        which = repeat % ROTATED_INPUTS
        started = time.perf_counter()
        forward_and_gradients(inputs[which], output_gradients[which])
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[ROTATED_INPUTS:])  # the first round traces and warms up


def convolution_flops(part):
    """Forward FLOPs of one convolution part (2 per multiply-add)."""
    from keras_preact.base_layers import strided_size

    _, input_shape, filter_shape, strides, padding = part
    batch, height, width, _ = input_shape
    kernel_height, kernel_width, channels, filters = filter_shape
    if padding == "SAME":
        output_height, output_width = strided_size(height, strides[1]), strided_size(width, strides[2])
    else:  # VALID: the units pad explicitly before a strided convolution
        output_height = (height - kernel_height) // strides[1] + 1
        output_width = (width - kernel_width) // strides[2] + 1
    return 2 * batch * output_height * output_width * kernel_height * kernel_width * channels * filters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet164", help="a keras-preact network (separate units)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls of each part and training steps")
    arguments = parser.parse_args()
    if arguments.batch < 1 or arguments.repeats < 1:
        parser.error(f"--batch and --repeats must be positive; received {arguments.batch} and {arguments.repeats}")
    import keras_preact

    model = keras_preact.get_model(arguments.model, scan_units=False, classifier_activation=None)
    parts = graph_parts(model, arguments.batch)
    matmul_rate = matmul_flops_per_second()
    print(
        f"machine: {machine()}; float32 matmul {matmul_rate / 1e9:.0f} GFLOP/s; {arguments.model}, "
        f"batch {arguments.batch}"
    )
    print("| part | input | count | ms each, forward and gradients | s per step | rate |")
    print("|---|---|---|---|---|---|")
    totals = collections.Counter()
    # BatchNorms, then convolutions; each by stage (the largest images first), then by channels.
    for part, count in sorted(parts.items(), key=lambda item: (item[0][0], -item[0][1][1], item[0][1][3])):
        seconds = part_seconds(part, arguments.repeats)
        totals[part[0]] += seconds * count
        if part[0] == "convolution":
            flops = TRAINING_FLOPS_PER_FORWARD * convolution_flops(part)
            kernel = "x".join(map(str, part[2][:2]))
            label = f"convolution {kernel}, {part[2][2]} -> {part[2][3]}, stride {part[3][1]}"
            rate = f"{flops / seconds / 1e9:.0f} GFLOP/s ({flops / seconds / matmul_rate:.0%} of matmul)"
        else:
            label = "BatchNorm and ReLU" if part[2] else "BatchNorm"
            moved = BATCH_NORM_PASSES * BYTES_PER_FLOAT32 * math.prod(part[1])
            rate = f"{moved / seconds / 1e9:.0f} GB/s"
        print(
            f"| {label} | {'x'.join(map(str, part[1]))} | {count} | {seconds * 1e3:.1f} | {seconds * count:.3f} "
            f"| {rate} |"
        )

    train_step, _ = random_batch_training(model, arguments.batch)
    train_step().numpy()
    step_seconds = []
    for _ in range(arguments.repeats):
        started = time.perf_counter()
        train_step().numpy()
        step_seconds.append(time.perf_counter() - started)
    step = statistics.median(step_seconds)
    convolutions, batch_norms = totals["convolution"], totals["batch_norm"]
    print(
        f"training step {step:.3f} s (median of {arguments.repeats}); its convolutions alone {convolutions:.3f} s "
        f"({convolutions / step:.0%}), its BatchNorms alone {batch_norms:.3f} s ({batch_norms / step:.0%}), "
        f"the rest {step - convolutions - batch_norms:.3f} s"
    )
    network_flops = sum(
        TRAINING_FLOPS_PER_FORWARD * convolution_flops(part) * count
        for part, count in parts.items()
        if part[0] == "convolution"
    )
    print(
        f"of the matmul peak: the step {network_flops / step / matmul_rate:.0%}; with nothing but its convolutions "
        f"{network_flops / convolutions / matmul_rate:.0%}; with its convolutions and BatchNorms "
        f"{network_flops / (convolutions + batch_norms) / matmul_rate:.0%}"
    )


if __name__ == "__main__":
    main()
