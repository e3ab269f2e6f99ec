"""The 3x3 convolution's weight gradient in bfloat16, three ways: what bounds its rate.

    python bench/weight_gradient.py
    python bench/weight_gradient.py --batch 64 --repeats 50

The weight gradient of a 3x3 convolution, dW[i, j, c, d] = sum over n, h, w of
x[n, h + i, w + j, c] dy[n, h, w, d], is the largest part of a bfloat16 training step of the
zoo's ResNet-110 (docs/benchmarks.md). For each of the pre-activation ResNet-110's three
stage shapes (32 x 32 x 16, 16 x 16 x 32, 8 x 8 x 64), at the zoo's batch, it times:

- TensorFlow's own kernel (`Conv2DBackpropFilter`, oneDNN's choice for this processor);
- one matmul of the nine shifted inputs against the output gradient (im2col: (9c x NHW) by
  (NHW x d));
- a forward convolution of the transposed input (batch c, channels N) with the output
  gradient as its filter (H x W x N x d), the form oneDNN's forward kernels run fastest.

Each prints its milliseconds, its bfloat16 GFLOP/s and its largest difference from
TensorFlow's kernel relative to that kernel's largest value (bfloat16 sums in other orders).
"""

import argparse
import time

import tensorflow as tf

# bench/, the script's folder
from harness import machine

# (height and width, channels) of the pre-activation ResNet-110's three stages (Sec. 4.1's CIFAR networks).
STAGES = ((32, 16), (16, 32), (8, 64))


def milliseconds(function, repeats):
    """The mean time of `function()` over `repeats` calls, after one untimed call."""
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function().numpy()
    return (time.perf_counter() - started) / repeats * 1000


def ways(inputs, output_gradient):
    """{name: tf.function computing the 3x3 weight gradient of `inputs` and `output_gradient` (NHWC, SAME)}."""
    _, size, _, channels = inputs.shape
    filters = output_gradient.shape[-1]

    @tf.function
    def kernel():
        return tf.raw_ops.Conv2DBackpropFilter(
            input=inputs,
            filter_sizes=[3, 3, channels, filters],
            out_backprop=output_gradient,
            strides=[1, 1, 1, 1],
            padding="SAME",
        )

    @tf.function
    def im2col_matmul():
        padded = tf.pad(inputs, [[0, 0], [1, 1], [1, 1], [0, 0]])
        shifted = tf.concat([padded[:, i : i + size, j : j + size, :] for i in range(3) for j in range(3)], axis=-1)
        columns = tf.reshape(shifted, [-1, 9 * channels])
        gradient = tf.matmul(columns, tf.reshape(output_gradient, [-1, filters]), transpose_a=True)
        return tf.reshape(gradient, [3, 3, channels, filters])

    @tf.function
    def forward_convolution():
        padded = tf.pad(inputs, [[0, 0], [1, 1], [1, 1], [0, 0]])
        images = tf.transpose(padded, [3, 1, 2, 0])  # channels, height, width, batch
        kernel_of_gradients = tf.transpose(output_gradient, [1, 2, 0, 3])  # height, width, batch, filters
        return tf.transpose(tf.nn.conv2d(images, kernel_of_gradients, 1, "VALID"), [1, 2, 0, 3])

    return {"TensorFlow's kernel": kernel, "im2col matmul": im2col_matmul, "forward convolution": forward_convolution}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128, help="images a step (the zoo's: 128)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls of each way")
    arguments = parser.parse_args()
    if arguments.batch < 1 or arguments.repeats < 1:
        parser.error(f"--batch and --repeats must be positive. Received: {arguments.batch}, {arguments.repeats}")
    print(machine())
    print("| activation | way | ms | bfloat16 GFLOP/s | largest difference from the kernel |")
    print("|---|---|---|---|---|")
    random = tf.random.Generator.from_seed(0)
    for size, channels in STAGES:
        shape = (arguments.batch, size, size, channels)
        inputs = tf.cast(random.normal(shape), tf.bfloat16)
        output_gradient = tf.cast(random.normal(shape), tf.bfloat16)
        flops = 2 * arguments.batch * size * size * channels * channels * 9
        reference = None
        for name, function in ways(inputs, output_gradient).items():
            result = tf.cast(function(), tf.float32)
            reference = result if reference is None else reference
            difference = float(tf.reduce_max(tf.abs(result - reference)) / tf.reduce_max(tf.abs(reference)))
            time_ms = milliseconds(function, arguments.repeats)
            print(
                f"| {size} x {size} x {channels} | {name} | {time_ms:.2f} | {flops / time_ms / 1e6:.0f} | "
                f"{difference:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
