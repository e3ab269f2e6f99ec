"""PyTorch peers for the harness: pre-activation ResNet-50, ResNet-110 and ResNet-164 written
as keras-preact builds them, trained on this CPU with PyTorch's own CPU build.

    pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
    python bench/torch_peers.py --model resnet164
    python bench/torch_peers.py --model resnet110 --precision bfloat16 --compile --steps 10

The networks follow `keras_preact.ResNet` exactly (their trainable parameter counts are
checked against it): full pre-activation bottleneck units (BN-ReLU-conv x 3), the first
unit of the network reading the stem's activation, the first unit of a later stage
activating once before both paths, 1x1 projection shortcuts without BatchNorm where a
unit changes shape, a final BN-ReLU; CIFAR: a 3x3 stem of 16 filters, stride on the
first 1x1 convolution; ImageNet: a 7x7/2 stem of 64 filters and 3x3/2 max pooling,
stride on the 3x3 convolution. Prints one JSON line of figures.
"""

import argparse
import json
import statistics
import time

import torch
from harness import peak_resident_gibibytes  # bench/, the script's folder
from torch import nn

BATCH_NORM = dict(eps=1e-5, momentum=0.1)  # keras-preact's: Keras momentum 0.9
NETWORKS = {
    # name: (stem, units per stage, widths, stride on, input size, classes, Keras trainable parameters)
    "resnet110": ("cifar", (18, 18, 18), (16, 32, 64), "basic", 32, 10, 1_727_962),
    "resnet164": ("cifar", (18, 18, 18), (16, 32, 64), "first", 32, 10, 1_703_258),
    "resnet50": ("imagenet", (3, 4, 6, 3), (64, 128, 256, 512), "3x3", 224, 1000, 25_549_352),
}


class PreActivationBottleneck(nn.Module):
    def __init__(self, in_channels, width, stride, stride_on, preactivation):
        super().__init__()
        out_channels = 4 * width
        strides = (stride, 1, 1) if stride_on == "first" else (1, stride, 1)
        self.preactivation = preactivation
        self.norm1 = nn.BatchNorm2d(in_channels, **BATCH_NORM) if preactivation != "none" else None
        self.conv1 = nn.Conv2d(in_channels, width, 1, strides[0], bias=False)
        self.norm2 = nn.BatchNorm2d(width, **BATCH_NORM)
        self.conv2 = nn.Conv2d(width, width, 3, strides[1], padding=1, bias=False)
        self.norm3 = nn.BatchNorm2d(width, **BATCH_NORM)
        self.conv3 = nn.Conv2d(width, out_channels, 1, strides[2], bias=False)
        changes_shape = stride != 1 or in_channels != out_channels
        self.projection = nn.Conv2d(in_channels, out_channels, 1, stride, bias=False) if changes_shape else None

    def forward(self, x):
        activated = x if self.norm1 is None else torch.relu(self.norm1(x))
        shortcut_input = x if self.preactivation == "residual" else activated
        residual = self.conv1(activated)
        residual = self.conv2(torch.relu(self.norm2(residual)))
        residual = self.conv3(torch.relu(self.norm3(residual)))
        shortcut = shortcut_input if self.projection is None else self.projection(shortcut_input)
        return shortcut + residual


class PreActivationBasic(nn.Module):
    def __init__(self, in_channels, width, stride, preactivation):
        super().__init__()
        self.stride, self.padding = stride, width - in_channels
        self.preactivation = preactivation
        self.norm1 = nn.BatchNorm2d(in_channels, **BATCH_NORM) if preactivation != "none" else None
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(width, **BATCH_NORM)
        self.conv2 = nn.Conv2d(width, width, 3, 1, padding=1, bias=False)

    def forward(self, x):
        activated = x if self.norm1 is None else torch.relu(self.norm1(x))
        shortcut = x if self.preactivation == "residual" else activated
        residual = self.conv2(torch.relu(self.norm2(self.conv1(activated))))
        if self.stride != 1 or self.padding:  # subsampled, the new channels zeros
            shortcut = nn.functional.pad(shortcut[:, :, :: self.stride, :: self.stride], (0, 0, 0, 0, 0, self.padding))
        return shortcut + residual


class PreActivationResNet(nn.Module):
    def __init__(self, stem, units_per_stage, widths, stride_on, classes):
        super().__init__()
        if stem == "cifar":
            self.stem = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16, **BATCH_NORM), nn.ReLU()
            )
            channels = 16
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, padding=3, bias=False),
                nn.BatchNorm2d(64, **BATCH_NORM),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, padding=1),
            )
            channels = 64
        units = []
        for stage, (count, width) in enumerate(zip(units_per_stage, widths), start=1):
            for index in range(1, count + 1):
                stride = 2 if index == 1 and stage > 1 else 1
                preactivation = "residual" if index > 1 else ("none" if stage == 1 else "shared")
                if stride_on == "basic":
                    units.append(PreActivationBasic(channels, width, stride, preactivation))
                    channels = width
                else:
                    units.append(PreActivationBottleneck(channels, width, stride, stride_on, preactivation))
                    channels = 4 * width
        self.units = nn.Sequential(*units)
        self.final = nn.Sequential(
            nn.BatchNorm2d(channels, **BATCH_NORM), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        return self.classifier(self.final(self.units(self.stem(x))))


def measure(name, steps, precision="float32", compiled=False):
    stem, units_per_stage, widths, stride_on, size, classes, keras_parameters = NETWORKS[name]
    torch.manual_seed(0)
    started = time.perf_counter()
    model = PreActivationResNet(stem, units_per_stage, widths, stride_on, classes)
    build_seconds = time.perf_counter() - started
    parameters = sum(parameter.numel() for parameter in model.parameters())
    if parameters != keras_parameters:
        raise AssertionError(f"{name}: {parameters} trainable parameters, keras-preact has {keras_parameters}")
    batch = 128 if size == 32 else 32
    model = model.to(memory_format=torch.channels_last)
    images = torch.randn(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    labels = torch.arange(batch) % classes
    network = torch.compile(model) if compiled else model
    # Coupled weight decay 1e-4 on every parameter, as the paper's Torch code.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss = nn.CrossEntropyLoss()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            value = loss(network(images), labels)
        value.backward()
        optimizer.step()
        return value.item()

    model.train()
    started = time.perf_counter()
    train_step()
    first_step = time.perf_counter() - started
    step_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step()
        step_seconds.append(time.perf_counter() - started)
    model.eval()
    inference_seconds = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        network(images)
        for _ in range(steps):
            started = time.perf_counter()
            network(images)
            inference_seconds.append(time.perf_counter() - started)
    return dict(
        name=f"torch_{name}",
        precision=precision,
        compiled=compiled,
        batch=batch,
        image_size=size,
        build_s=build_seconds,
        first_step_s=first_step,
        train_images_per_s=batch / statistics.median(step_seconds),
        inference_images_per_s=batch / statistics.median(inference_seconds),
        parameters=parameters,
        peak_gib=peak_resident_gibibytes(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(NETWORKS), default="resnet164")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--compile", action="store_true", help="train the torch.compile'd network")
    arguments = parser.parse_args()
    print(json.dumps(measure(arguments.model, arguments.steps, arguments.precision, arguments.compile)))


if __name__ == "__main__":
    main()
