"""Networks only. Every one ends in adaptive pooling, so any image size works (progressive resizing)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


# --- ResNet-9 (David Page, "How to train your ResNet") ----------------------------------------------


class Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c, c), conv_bn(c, c))

    def forward(self, x):
        return x + self.body(x)


class ResNet9(nn.Module):
    def __init__(self, num_classes: int = 10, width: float = 1.0, scale: float = 0.125):
        super().__init__()
        c = [max(8, int(w * width)) for w in (64, 128, 256, 512)]
        self.net = nn.Sequential(
            conv_bn(3, c[0]),
            conv_bn(c[0], c[1]),
            nn.MaxPool2d(2),
            Residual(c[1]),
            conv_bn(c[1], c[2]),
            nn.MaxPool2d(2),
            conv_bn(c[2], c[3]),
            nn.MaxPool2d(2),
            Residual(c[3]),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(c[3], num_classes, bias=False)
        self.scale = scale

    def forward(self, x):
        return self.fc(self.net(x)) * self.scale


# --- pre-activation ResNet-18 (fast.ai DAWNBench, with optional concat pooling) ---------------------


class PreActBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c_in), nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(c_out), nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = None if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride, bias=False)

    def forward(self, x):
        out = F.relu(self.bn1(x))
        short = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + short


class PreActResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, concat_pool: bool = True, width: float = 1.0):
        super().__init__()
        c = [max(8, int(w * width)) for w in (64, 128, 256, 512)]
        self.stem = nn.Conv2d(3, c[0], 3, 1, 1, bias=False)
        layers, c_in = [], c[0]
        for i, c_out in enumerate(c):
            for j in range(2):
                layers.append(PreActBlock(c_in, c_out, 2 if (i > 0 and j == 0) else 1))
                c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(c_in)
        self.concat_pool = concat_pool
        self.fc = nn.Linear(c_in * (2 if concat_pool else 1), num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.layers(self.stem(x))))
        pooled = F.adaptive_avg_pool2d(x, 1).flatten(1)
        if self.concat_pool:
            pooled = torch.cat([pooled, F.adaptive_max_pool2d(x, 1).flatten(1)], 1)
        return self.fc(pooled)


# --- Wide ResNet (Zagoruyko & Komodakis), WRN-depth-width --------------------------------------------


class WideResNet(nn.Module):
    def __init__(self, num_classes: int = 10, depth: int = 22, width: int = 6):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WRN depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        widths = [16 * width, 32 * width, 64 * width]
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        layers, c_in = [], 16
        for i, c_out in enumerate(widths):
            for j in range(n):
                layers.append(PreActBlock(c_in, c_out, 2 if (i > 0 and j == 0) else 1))
                c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(c_in)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.layers(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


# --- airbench94-style (Keller Jordan) ---------------------------------------------------------------


class BiasOnlyBN(nn.BatchNorm2d):
    """BatchNorm with the scale frozen at 1; only the bias trains."""

    def __init__(self, c: int, momentum: float = 0.6):
        super().__init__(c, momentum=1 - momentum, eps=1e-12)
        self.weight.requires_grad_(False)


class ConvGroup(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, c_out, 3, padding="same", bias=False), BiasOnlyBN(c_out)
        self.conv2, self.bn2 = nn.Conv2d(c_out, c_out, 3, padding="same", bias=False), BiasOnlyBN(c_out)

    def forward(self, x):
        x = F.gelu(self.bn1(F.max_pool2d(self.conv1(x), 2)))
        return F.gelu(self.bn2(self.conv2(x)))


class AirBench(nn.Module):
    """airbench94's net. `muon=True`: airbench94_muon's variant of it (conv filters start as the
    identity on their first c_in outputs (dirac), the head's weights are scaled to unit std, and its
    output is divided by its width; its MaxPool2d(3) of the last map, 3x3 at 32 px, is the global max)."""

    def __init__(
        self,
        num_classes: int = 10,
        widths=(64, 256, 256),
        whiten_width: int = 24,
        scale: float = 1 / 9,
        muon: bool = False,
        whiten_bias_epochs: int = 3,
    ):
        super().__init__()
        self.whiten = nn.Conv2d(3, whiten_width, 2, padding=0, bias=True)
        self.whiten_bias_epochs = whiten_bias_epochs  # the whitening bias trains for these first epochs
        groups, c_in = [], whiten_width
        for w in widths:
            groups.append(ConvGroup(c_in, w))
            c_in = w
        self.groups = nn.Sequential(*groups)
        self.fc = nn.Linear(c_in, num_classes, bias=False)
        self.muon = muon
        self.scale = 1 / c_in if muon else scale
        if muon:
            with torch.no_grad():
                for g in groups:
                    for conv in (g.conv1, g.conv2):
                        nn.init.dirac_(conv.weight[: conv.weight.size(1)])
                self.fc.weight.mul_(1 / self.fc.weight.std())

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Patch-whitening init of the first conv from 2x2 patches of (normalized) training images."""
        c, h, w = images.shape[1], 2, 2
        patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
        flat = patches.view(len(patches), -1)
        est = (flat.T @ flat) / len(flat)
        eigvals, eigvecs = torch.linalg.eigh(est)
        eigvecs = eigvecs.T.reshape(-1, c, h, w).flip(0)
        eigvals = eigvals.flip(0)
        k = self.whiten.weight.shape[0] // 2
        filt = eigvecs[:k] / torch.sqrt(eigvals[:k] + eps).view(-1, 1, 1, 1)
        self.whiten.weight.copy_(torch.cat([filt, -filt]).to(self.whiten.weight.dtype))
        self.whiten.weight.requires_grad_(False)

    def start_epoch(self, epoch: int) -> None:
        """The whitening bias freezes once its epochs are over (and stays frozen: a resumed run freezes it again)."""
        if self.whiten.bias.requires_grad:
            self.whiten.bias.requires_grad_(epoch < self.whiten_bias_epochs)

    def forward(self, x):
        x = F.gelu(self.whiten(x))
        x = self.groups(x)
        return (
            self.fc(F.adaptive_max_pool2d(x, 1).flatten(1)) * self.scale
        )  # muon's MaxPool2d(3) of the 3x3 map at 32 px


def imagenet_resnet(name: str, num_classes: int, width: float = 1.0) -> nn.Module:
    """torchvision's ResNet-18/50 (its BasicBlock/Bottleneck, stem and init), every stage's channels
    scaled by `width` (for small CPU checks), and the last BatchNorm of each residual block
    initialised to zero (each block starts as the identity: Goyal et al.)."""
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    block, layers = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet50": (Bottleneck, [3, 4, 6, 3])}[name]

    class ScaledResNet(ResNet):
        def __init__(self):
            nn.Module.__init__(self)
            c = [max(8, int(round(64 * width * m))) for m in (1, 2, 4, 8)]
            self._norm_layer, self.dilation, self.groups, self.base_width, self.inplanes = (
                nn.BatchNorm2d,
                1,
                1,
                64,
                c[0],
            )
            self.conv1 = nn.Conv2d(3, c[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(c[0]), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(block, c[0], layers[0])
            self.layer2 = self._make_layer(block, c[1], layers[1], stride=2)
            self.layer3 = self._make_layer(block, c[2], layers[2], stride=2)
            self.layer4 = self._make_layer(block, c[3], layers[3], stride=2)
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c[3] * block.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    return ScaledResNet()


def build(
    name: str,
    num_classes: int = 10,
    width: float = 1.0,
    concat_pool: bool = True,
    depth: int = 22,
    widen: int = 6,
    whiten_bias_epochs: int = 3,
) -> nn.Module:
    """width scales the channels of resnet9/preact_resnet18/airbench/resnet18/resnet50; WRN takes depth and widen
    (WRN-22-6); airbench's whitening bias trains for the first `whiten_bias_epochs`."""
    if name in ("resnet18", "resnet50"):
        return imagenet_resnet(name, num_classes, width)
    if name == "resnet9":
        return ResNet9(num_classes, width=width)
    if name == "preact_resnet18":
        return PreActResNet18(num_classes, concat_pool=concat_pool, width=width)
    if name == "wide_resnet":
        return WideResNet(num_classes, depth=depth, width=widen)
    if name in ("airbench", "airbench_muon"):
        widths = tuple(max(8, int(w * width)) for w in (64, 256, 256))
        return AirBench(num_classes, widths, muon=name == "airbench_muon", whiten_bias_epochs=whiten_bias_epochs)
    raise ValueError(f"unknown model {name!r}: use {', '.join(MODELS)}")


def init_from_data(model: nn.Module, images: Callable[[], torch.Tensor]) -> None:
    """Before training, what a net takes from the data: airbench its patch-whitening filters, from the normalized
    training images `images()` returns (called only for a net that needs them)."""
    if isinstance(model, AirBench):
        model.init_whitening(images())


def start_epoch(model: nn.Module, epoch: int) -> None:
    """At each step, what a net changes by epoch: airbench freezes its whitening bias after its epochs."""
    if isinstance(model, AirBench):
        model.start_epoch(epoch)


from .validate import CHOICES  # noqa: E402  (one list of models: --help and validation read it too)

MODELS = CHOICES["model"]
