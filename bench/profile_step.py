"""Where a training step's time goes: TensorFlow's profiler over a few steps, by kind of op.

    python bench/profile_step.py                        # ResNet-164, batch 128
    python bench/profile_step.py --model resnet50 --batch 32
    python bench/profile_step.py --model resnet110 --precision mixed_bfloat16   # as the zoo trains

Traces `--steps` training steps (after two untimed ones) with `tf.profiler`, reads the
op statistics of the trace (the profiler's own `framework_op_stats` tool) and prints the
self time of each kind of op: convolutions and their gradients, matrix products,
BatchNorm's arithmetic, ReLU, additions, the optimizer's updates, data movement.
"""

import argparse
import collections
import glob
import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness import random_batch_training

# Kinds of TensorFlow ops, by the op type names that the profiler reports.
KINDS = {
    "convolution (forward)": ("Conv2D", "_FusedConv2D", "DepthwiseConv2dNative"),
    "convolution (input gradient)": ("Conv2DBackpropInput",),
    "convolution (weight gradient)": ("Conv2DBackpropFilter",),
    "matrix product": ("MatMul", "_FusedMatMul", "BatchMatMulV2"),
    "BatchNorm, fused kernel (forward and gradient)": ("FusedBatchNormV3", "FusedBatchNormGradV3", "_FusedBatchNormEx"),
    "BatchNorm statistics (reductions)": ("Mean", "Sum", "SquaredDifference", "Prod"),
    "elementwise arithmetic (BatchNorm, loss)": (
        "Mul",
        "AddV2",
        "Sub",
        "Rsqrt",
        "RsqrtGrad",
        "RealDiv",
        "Neg",
        "AddN",
        "Square",
        "Reciprocal",
        "BiasAdd",
        "BiasAddGrad",
        "_FusedMulAdd",
        "_MklFusedMish",
        "Maximum",
        "Minimum",
    ),
    "ReLU and its gradient": ("Relu", "ReluGrad"),
    "optimizer updates": (
        "ResourceApplyKerasMomentum",
        "ResourceApplyMomentum",
        "AssignSubVariableOp",
        "AssignAddVariableOp",
        "AssignVariableOp",
    ),
    "data movement (pad, slice, copy, broadcast)": (
        "Pad",
        "PadV2",
        "Slice",
        "StridedSlice",
        "StridedSliceGrad",
        "Identity",
        "Reshape",
        "Transpose",
        "Tile",
        "BroadcastTo",
        "ConcatV2",
        "ReadVariableOp",
        "Cast",
        "Fill",
        "ZerosLike",
        "OnesLike",
    ),
}


# oneDNN's kernels carry a prefix: _MklNativeConv2D is Conv2D.
ONEDNN_PREFIXES = ("_MklNative", "_Mkl")
# The profiler's name for time the op threads spent waiting.
IDLE = "IDLE"


def kind_of(op_type):
    for prefix in ONEDNN_PREFIXES:
        if op_type.startswith(prefix):
            op_type = op_type[len(prefix) :]
            break
    return next((kind for kind, types in KINDS.items() if op_type in types or f"_{op_type}" in types), "other")


def profile(model_name, batch, steps, options, precision="float32"):
    import keras
    import tensorflow as tf
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    import keras_preact

    keras.config.set_dtype_policy(precision)
    model = keras_preact.get_model(model_name, classifier_activation=None, **options)
    train_step, _ = random_batch_training(model, batch)

    for _ in range(2):
        train_step().numpy()
    with tempfile.TemporaryDirectory() as directory:
        tf.profiler.experimental.start(directory)
        for _ in range(steps):
            train_step().numpy()
        tf.profiler.experimental.stop()
        traces = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
        data, _ = _pywrap_profiler_plugin.xspace_to_tools_data(traces, "framework_op_stats", {"tqx": ""})
    return op_times(json.loads(data))


def op_times(tables):
    """Self time (microseconds) per op type, from the profiler's framework_op_stats tables."""
    table = tables[0] if isinstance(tables, list) else tables
    columns = [column["id"] for column in table["cols"]]
    type_column, time_column = columns.index("type"), columns.index("total_self_time")
    host_column = columns.index("host_or_device") if "host_or_device" in columns else None
    times = collections.Counter()
    for row in table["rows"]:
        cells = [cell["v"] if isinstance(cell, dict) else cell for cell in row["c"]]
        if host_column is not None and cells[host_column] != "Host":
            continue
        times[cells[type_column]] += float(cells[time_column])
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet164")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scan-units", action="store_true", help="build the network with scan_units=True")
    parser.add_argument("--precision", default="float32", help="Keras' dtype policy: float32, mixed_bfloat16, ...")
    arguments = parser.parse_args()
    from harness import machine

    times = profile(
        arguments.model, arguments.batch, arguments.steps, dict(scan_units=arguments.scan_units), arguments.precision
    )
    idle = times.pop(IDLE, 0.0)
    total = sum(times.values())
    by_kind = collections.Counter()
    for op_type, microseconds in times.items():
        by_kind[kind_of(op_type)] += microseconds
    print(
        f"machine: {machine()}; {arguments.model} in {arguments.precision}, batch {arguments.batch}, "
        f"{arguments.steps} steps, "
        f"{total / 1e6 / arguments.steps:.2f} s of op time per step (and {idle / 1e6 / arguments.steps:.2f} s "
        "of the op threads idle)"
    )
    print("| kind of op | share of op time | largest op types |")
    print("|---|---|---|")
    for kind, microseconds in by_kind.most_common():
        largest = sorted((op for op in times if kind_of(op) == kind), key=times.get, reverse=True)[:3]
        print(
            f"| {kind} | {microseconds / total:.1%} | {', '.join(f'{op} {times[op] / total:.1%}' for op in largest)} |"
        )


if __name__ == "__main__":
    main()
