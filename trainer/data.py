"""Datasets resident on the device, with augmentation done on the device.

No DataLoader in the hot path: a whole data set is moved to the device once, normalized and
reflect-padded once (CIFAR-10: 150 MB as uint8, under 1 GB as padded float32); batches are an index,
a crop and a flip on the device, with each epoch's random draws made once per epoch.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
CIFAR_DIR = "cifar-10-batches-py"


@dataclass
class Split:
    """Images as uint8 N x C x H x W and labels as int64 N, on one device."""

    images: torch.Tensor
    labels: torch.Tensor

    def to(self, device) -> Split:
        return Split(self.images.to(device, non_blocking=True), self.labels.to(device, non_blocking=True))

    def __len__(self) -> int:
        return self.labels.shape[0]


@dataclass
class Dataset:
    train: Split
    test: Split
    num_classes: int
    mean: tuple  # per-channel, of images scaled to [0, 1]
    std: tuple


# --- CIFAR-10 (the standard python-pickle format) -------------------------------------------------


def _read_batch(path: Path):
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    data = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return data, np.asarray(d[b"labels"], dtype=np.int64)


def load_cifar10(data_dir: str, download: bool = True) -> Dataset:
    """Read cifar-10-batches-py under data_dir; download it with torchvision when it is missing."""
    root = Path(data_dir).expanduser()
    folder = root / CIFAR_DIR
    if not (folder / "test_batch").exists():
        if not download:
            raise FileNotFoundError(f"{folder} not found and download is off")
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            str(root),
            md5="c58f30108f718f92721af3b95e74349a",
        )
    parts = [_read_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    x_test, y_test = _read_batch(folder / "test_batch")
    train = Split(
        torch.from_numpy(np.concatenate([p[0] for p in parts])), torch.from_numpy(np.concatenate([p[1] for p in parts]))
    )
    return Dataset(train, Split(torch.from_numpy(x_test), torch.from_numpy(y_test)), 10, CIFAR_MEAN, CIFAR_STD)


def write_cifar10_like(root: str, n_train: int = 500, n_test: int = 100, seed: int = 0) -> Path:
    """Write files in the real cifar-10-batches-py format (for tests; nothing is downloaded)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / CIFAR_DIR
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name: str, n: int):
        labels = rng.integers(0, 10, n).tolist()
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump(
                {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": [b"x.png"] * n}, f
            )

    per = max(1, n_train // 5)
    for i in range(1, 6):
        dump(f"data_batch_{i}", per)
    dump("test_batch", n_test)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"c%d" % i for i in range(10)], b"num_cases_per_batch": per}, f)
    return folder


# --- synthetic and digits -----------------------------------------------------------------------


def load_synthetic(
    n_train: int = 2048, n_test: int = 512, size: int = 32, num_classes: int = 10, seed: int = 0
) -> Dataset:
    """CIFAR-shaped, learnable: each class is a fixed random low-frequency pattern plus noise."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.rand(num_classes, 3, 4, 4, generator=g)
    protos = F.interpolate(protos, size=(size, size), mode="bilinear", align_corners=False)

    def make(n: int) -> Split:
        y = torch.randint(0, num_classes, (n,), generator=g)
        x = protos[y] * 0.6 + torch.rand(n, 3, size, size, generator=g) * 0.4
        return Split((x * 255).round().to(torch.uint8), y)

    return Dataset(make(n_train), make(n_test), num_classes, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


def load_digits(size: int = 16, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1,797 images), upscaled to size x size, 3 channels."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1).repeat(1, 3, 1, 1)
    x = (x * 255).round().to(torch.uint8)
    y = torch.from_numpy(d.target.astype(np.int64))
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # one fixed split for every run
    n_test = int(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    mean = tuple(float(v) for v in (x[train].float() / 255).mean(dim=(0, 2, 3)))
    std = tuple(float(v) for v in (x[train].float() / 255).std(dim=(0, 2, 3)))
    return Dataset(Split(x[train], y[train]), Split(x[test], y[test]), 10, mean, std)


def load(name: str, data_dir: str, seed: int, size: int, synthetic_train: int = 2048) -> Dataset:
    if name == "cifar10":
        return load_cifar10(data_dir)
    if name == "synthetic":
        return load_synthetic(n_train=synthetic_train, n_test=max(64, synthetic_train // 4), size=size, seed=seed)
    if name == "digits":
        return load_digits(size=size)
    raise ValueError(f"unknown dataset {name!r}: use cifar10, synthetic or digits")


# --- on-device batches ----------------------------------------------------------------------------


def normalize(images: torch.Tensor, mean: tuple, std: tuple, dtype=torch.float32) -> torch.Tensor:
    m = torch.tensor(mean, device=images.device, dtype=dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, device=images.device, dtype=dtype).view(1, -1, 1, 1)
    return (images.to(dtype) / 255.0 - m) / s


def crop(padded: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """An h x w window of each padded image, at its own offset (dy, dx), as two gathers on the device."""
    n, c = padded.shape[0], padded.shape[1]
    rows = (dy.view(n, 1) + torch.arange(h, device=padded.device).view(1, h)).view(n, 1, h, 1)
    x = padded.gather(2, rows.expand(n, c, h, padded.shape[3]))
    cols = (dx.view(n, 1) + torch.arange(w, device=padded.device).view(1, w)).view(n, 1, 1, w)
    return x.gather(3, cols.expand(n, c, h, w))


def augment(
    x: torch.Tensor, pad: int, flip: bool, generator: torch.Generator, batch: int = 0, share: slice = slice(None)
) -> torch.Tensor:
    """Random crop after reflect padding, and random horizontal flip, of one float batch (draws on the host:
    the benchmarks' per-step path; the trainer draws once per epoch, see EpochDraws).

    Under DDP, x is this rank's `share` (e.g. rank::world) of a global batch of `batch` images:
    the random draws are made for the whole batch and this share's are used, so each rank augments
    only its images and every image gets the same crop and flip as in a one-process run.
    """
    n, _, h, w = x.shape
    whole = batch or n
    if pad > 0:
        padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        dx = torch.randint(0, 2 * pad + 1, (whole,), generator=generator)[share].to(x.device)
        dy = torch.randint(0, 2 * pad + 1, (whole,), generator=generator)[share].to(x.device)
        x = crop(padded, dy, dx, h, w)
    if not flip:
        return x
    mirrored = (torch.rand(whole, generator=generator)[share] < 0.5).to(x.device).view(n, 1, 1, 1)
    return torch.where(mirrored, x.flip(3), x)


@dataclass
class EpochDraws:
    """One epoch's augmentation: each position of the epoch's order gets a crop offset and a flip, drawn
    from (seed, epoch) on the host and moved to the device once, so a step only indexes them."""

    epoch: int
    shifts: torch.Tensor | None  # n x 2: (dy, dx) in [0, 2 * pad], or None without cropping
    mirror: torch.Tensor | None  # n bool, or None without flips

    @classmethod
    def draw(cls, n: int, pad: int, flip: bool, seed: int, epoch: int, device) -> EpochDraws:
        g = epoch_generator(seed, epoch)
        shifts = torch.randint(0, 2 * pad + 1, (n, 2), generator=g).to(device) if pad > 0 else None
        mirror = (torch.rand(n, generator=g) < 0.5).to(device) if flip else None
        return cls(epoch, shifts, mirror)


def resize(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of one epoch: a function of (seed, epoch) only, so a resumed run replays it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """Augmentation randomness of one epoch, a function of (seed, epoch) only (drawn once per epoch)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch * 7919 + 17)


def step_generator(seed: int, step: int) -> torch.Generator:
    """Augmentation randomness of one step, a function of (seed, step) only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step + 17)


EVAL_BATCH = {"cpu": 1000, "cuda": 2500}  # images per evaluation batch (no gradients: larger on a GPU)


class TensorSource:
    """A data set held on the device (CIFAR-10, synthetic, digits), normalized and reflect-padded once:
    a step's batch is an index, a crop (two gathers) and a flip, all on the device, with the epoch's
    draws made once per epoch: nothing in a step waits for the host."""

    on_device = True  # batches cost no host work: nothing to prepare ahead

    def __init__(self, ds: Dataset, device, crop_pad: int, flip: bool, seed: int):
        self.train, self.test = ds.train.to(device), ds.test.to(device)
        self.num_classes, self.mean, self.std, self.n_train = ds.num_classes, ds.mean, ds.std, len(ds.train)
        self.pad, self.flip, self.seed = crop_pad, flip, seed
        self.skipped = 0
        x = normalize(self.train.images, self.mean, self.std)
        self.train_x = F.pad(x, (self.pad,) * 4, mode="reflect") if self.pad > 0 else x
        self.side = tuple(x.shape[2:])  # (h, w) of an image before padding
        self.test_x = normalize(self.test.images, self.mean, self.std)
        self.eval_batch = EVAL_BATCH.get(torch.device(device).type, 1000)
        self.draws: EpochDraws | None = None

    def train_batch(
        self, idx: torch.Tensor, step: int, batch: int, share: slice, size: int, epoch: int = 0, pos: int = 0
    ):
        """This rank's `share` of the global batch of `batch` images at `pos` in `epoch`'s order.

        idx: their indices.
        """
        if self.draws is None or self.draws.epoch != epoch:
            self.draws = EpochDraws.draw(self.n_train, self.pad, self.flip, self.seed, epoch, self.train_x.device)
        x = self.train_x[idx]
        if self.pad > 0:
            dy, dx = self.draws.shifts[pos : pos + batch][share].unbind(1)
            x = crop(x, dy, dx, *self.side)
        if self.flip:
            x = torch.where(self.draws.mirror[pos : pos + batch][share].view(-1, 1, 1, 1), x.flip(3), x)
        return resize(x, size), self.train.labels[idx]

    def eval_batches(self, size: int, rank: int = 0, world: int = 1):
        images, labels, b = self.test_x[rank::world], self.test.labels[rank::world], self.eval_batch
        for i in range(0, len(labels), b):
            yield resize(images[i : i + b], size), labels[i : i + b]
