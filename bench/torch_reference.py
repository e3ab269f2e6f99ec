"""An independent reference for the zoo's accuracy: He et al. 2015's ResNet-20 in PyTorch,
trained on the same CIFAR-10 images with the same recipe.

    python bench/torch_reference.py --arrays cifar10.npz --epochs 30 --seed 1

The network and recipe as akamaster/pytorch_resnet_cifar10 writes them (the issue's
reference): the original (post-activation) ResNet-20 with option A shortcuts (stride-2
subsampling and zero channels), Kaiming-normal weights; 4-pixel crops and horizontal
flips. The recipe's numbers are the zoo's config's (`cifar10_cpu`, schedule=cosine: SGD,
momentum 0.9, coupled weight decay 1e-4, batch 128, one epoch at 0.01, then 0.1 annealed
to 0 by a cosine; its CIFAR-10 mean and standard deviation).
If this network misses He et al.'s 8.75 % by as much as the zoo's, the data is the cause,
not keras-preact. `--arrays` is the .npz that bench/precision_accuracy.py writes. Prints
the final-epoch test error and appends one JSON line to `--output`.
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as functional
from torch import nn

from keras_preact_training.train.configs import CONFIGS  # no Keras import: the configs are data

CONFIG = CONFIGS["cifar10_cpu"]


class BasicBlock(nn.Module):
    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.pad = channels - in_channels

    def forward(self, x):
        residual = functional.relu(self.bn1(self.conv1(x)))
        residual = self.bn2(self.conv2(residual))
        shortcut = x
        if self.pad:  # option A: subsample, then zero channels on both sides
            shortcut = functional.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad // 2, self.pad // 2))
        return functional.relu(residual + shortcut)


class ResNet(nn.Module):
    def __init__(self, units_per_stage=3, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, channels = [], 16
        for stage, width in enumerate((16, 32, 64)):
            for unit in range(units_per_stage):
                blocks.append(BasicBlock(channels, width, 2 if stage and not unit else 1))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.linear = nn.Linear(64, classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x):
        x = self.blocks(functional.relu(self.bn(self.conv(x))))
        return self.linear(x.mean((2, 3)))


def augment(images, generator):
    """4-pixel zero-padded random crops and horizontal flips, one draw per image."""
    batch = images.shape[0]
    padded = functional.pad(images, (4, 4, 4, 4))
    offsets = torch.randint(0, 9, (batch, 2), generator=generator, device=images.device)
    rows = (offsets[:, 0:1] + torch.arange(32, device=images.device))[:, None, :, None].expand(batch, 3, 32, 40)
    cropped = padded.gather(2, rows)
    columns = (offsets[:, 1:2] + torch.arange(32, device=images.device))[:, None, None, :].expand(batch, 3, 32, 32)
    cropped = cropped.gather(3, columns)
    flip = torch.rand(batch, generator=generator, device=images.device) < 0.5
    return torch.where(flip[:, None, None, None], cropped.flip(3), cropped)


def learning_rate(step, warmup_steps, total_steps):
    if step < warmup_steps:
        return CONFIG.warmup_learning_rate
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return CONFIG.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", required=True, help="the .npz of bench/precision_accuracy.py")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output")
    arguments = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(arguments.seed)
    generator = torch.Generator(device).manual_seed(arguments.seed)
    mean = torch.tensor(CONFIG.normalization_mean, device=device)[:, None, None]
    std = torch.tensor(CONFIG.normalization_std, device=device)[:, None, None]
    with np.load(arguments.arrays) as saved:

        def tensor(name):
            return torch.from_numpy(saved[name]).to(device)

        train_images = (tensor("train_images").permute(0, 3, 1, 2).float() - mean) / std
        test_images = (tensor("test_images").permute(0, 3, 1, 2).float() - mean) / std
        train_labels, test_labels = tensor("train_labels").long(), tensor("test_labels").long()
    model = ResNet().to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=CONFIG.learning_rate, momentum=CONFIG.momentum, weight_decay=CONFIG.weight_decay
    )
    batch_size = CONFIG.batch_size
    steps_per_epoch = -(-len(train_images) // batch_size)
    warmup_steps, total_steps = round(CONFIG.warmup * steps_per_epoch), arguments.epochs * steps_per_epoch
    step, started = 0, time.perf_counter()
    for epoch in range(arguments.epochs):
        model.train()
        order = torch.randperm(len(train_images), generator=generator, device=device)
        correct = 0
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, warmup_steps, total_steps)
            logits = model(augment(train_images[batch], generator))
            loss = functional.cross_entropy(logits, train_labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += (logits.argmax(1) == train_labels[batch]).sum().item()
            step += 1
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}, accuracy {correct / len(order):.4f}", flush=True)
    model.eval()
    with torch.no_grad():

        def error(images, labels):
            predictions = torch.cat(
                [model(images[first : first + 1000]).argmax(1) for first in range(0, len(images), 1000)]
            )
            return round(100 * (predictions != labels).float().mean().item(), 2)

        result = dict(
            model="torch resnet20 (original, option A)",
            epochs=arguments.epochs,
            seed=arguments.seed,
            test_error=error(test_images, test_labels),
            train_error=error(train_images, train_labels),
            training_seconds=round(time.perf_counter() - started, 1),
            device=torch.cuda.get_device_name() if device == "cuda" else "CPU",
            torch=torch.__version__,
        )
    print(f"final-epoch test error {result['test_error']:.2f} % (training images: {result['train_error']:.2f} %)")
    if arguments.output:
        with open(arguments.output, "a") as output:
            output.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
