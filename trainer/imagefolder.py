"""Folders of images of any size: DIR/train/<class>/* and DIR/val/<class>/* (JPEG, PNG).

Classes are the folder names, sorted. Nothing is held in memory but the file list: every batch is
read, decoded and augmented when it is needed (a few steps ahead, on a worker pool). Augmentation
is random-resized-crop + horizontal flip at the current image size; every random draw is a
function of (seed, step, position in the global batch), so a resumed run replays exactly the
same batches, and under DDP each rank reads and augments only its own share of a batch.

On CUDA, JPEGs are decoded on the GPU in batches (torchvision.io.decode_jpeg(..., device="cuda"))
from bytes read by the workers, and cropped and resized there; on the CPU the workers decode,
crop and resize. A file that does not decode is skipped and counted, never fatal mid-epoch.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EXTENSIONS = (".jpg", ".jpeg", ".png")
LAYOUT = "DIR/train/<class>/*.jpg|png and DIR/val/<class>/*.jpg|png"


REFILL_TRIES = 32  # next files tried in place of one that does not decode


class DataError(ValueError):
    """The data folder is not usable; the message names the folder and the fix."""


@dataclass
class Folder:
    root: Path
    classes: list[str]
    train: list[tuple[str, int]]  # (path, label)
    val: list[tuple[str, int]]
    ignored: int = 0  # files that are not JPEG or PNG by name


def scan(data_dir: str) -> Folder:
    root = Path(data_dir).expanduser()
    for part in ("train", "val"):
        if not (root / part).is_dir():
            raise DataError(f"{root}: no {part}/ folder. An image folder data set is laid out as {LAYOUT}.")
    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"{root / 'train'}: no class folders. Put each class's images in train/<class>/ ({LAYOUT}).")
    if len(classes) < 2:
        raise DataError(
            f"{root / 'train'}: one class ({classes[0]}); a classifier needs at least two class folders ({LAYOUT})."
        )
    unknown = sorted(d.name for d in (root / "val").iterdir() if d.is_dir() and d.name not in classes)
    if unknown:
        raise DataError(
            f"{root / 'val'}: classes {', '.join(unknown)} have no folder in train/. The classes of val/ must be those "
            "of train/."
        )
    ignored = [0]

    def files(folder: Path) -> list[str]:
        if not folder.is_dir():
            return []
        names = sorted(p for p in folder.iterdir() if p.is_file())
        good = [str(p) for p in names if p.suffix.lower() in EXTENSIONS]
        ignored[0] += len(names) - len(good)
        return good

    train, val = [], []
    for label, name in enumerate(classes):
        found = files(root / "train" / name)
        if not found:
            raise DataError(
                f"{root / 'train' / name}: no JPEG or PNG images. Every class needs training images; remove the folder "
                "or fill it."
            )
        train += [(p, label) for p in found]
        val += [(p, label) for p in files(root / "val" / name)]
    if not val:
        raise DataError(f"{root / 'val'}: no JPEG or PNG images. Put validation images in val/<class>/.")
    return Folder(root, classes, train, val, ignored[0])


def decode(data: bytes) -> torch.Tensor | None:
    """uint8 3 x H x W (RGB), or None for bytes that are not a readable image."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except Exception:  # torchvision raises RuntimeError (and others) for a bad file; a bad file is skipped
        return None


def crop_box(h: int, w: int, draw: torch.Tensor, min_scale: float) -> tuple[int, int, int, int]:
    """Random-resized-crop from four uniform draws: area fraction, log aspect, x and y offsets. (top, left, height,
    width)"""
    scale = min_scale + (1 - min_scale) * float(draw[0])
    ratio = math.exp(math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * float(draw[1]))
    area = scale * h * w
    cw, ch = min(w, max(1, round(math.sqrt(area * ratio)))), min(h, max(1, round(math.sqrt(area / ratio))))
    return int(float(draw[3]) * (h - ch)), int(float(draw[2]) * (w - cw)), ch, cw


def center_box(h: int, w: int, size: int, rect: bool) -> tuple[int, int, int, int]:
    """Validation crop: the central square of side short/0.875 scaled to size, or (rect) the whole image's
    central region with the aspect ratio kept, up to 4:3."""
    if rect:
        ar = min(max(w / h, 3 / 4), 4 / 3)
        ch, cw = (h, min(w, round(h * ar))) if w >= h else (min(h, round(w / ar)), w)
    else:
        side = round(min(h, w) * 0.875)
        ch = cw = side
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def crop_resize(img: torch.Tensor, box: tuple[int, int, int, int], out_hw: tuple[int, int]) -> torch.Tensor:
    top, left, ch, cw = box
    x = img[:, top : top + ch, left : left + cw].unsqueeze(0).float()
    return F.interpolate(x, size=out_hw, mode="bilinear", align_corners=False, antialias=True)[0]


def rect_shape(h: int, w: int, size: int) -> tuple[int, int]:
    """Output shape of a rectangular validation image: short side `size`, long side rounded to 32."""
    ar = min(max(w / h, 3 / 4), 4 / 3)
    long = max(size, int(round(size * max(ar, 1 / ar) / 32)) * 32)
    return (size, long) if w >= h else (long, size)


@dataclass
class Batch:
    x: torch.Tensor  # float, normalized, n x 3 x size x size, on the device
    y: torch.Tensor
    skipped: int = 0  # files of this batch that did not decode


@dataclass
class ImageFolderSource:
    """Training and validation batches read from an image folder."""

    on_device = False  # batches are read and decoded on the host: prepared a step ahead

    folder: Folder
    device: torch.device
    min_scale: float = 0.35
    flip: bool = True
    workers: int = 0
    gpu_decode: bool = True
    seed: int = 0
    val_rect: bool = False
    bad: set = field(default_factory=set)  # paths of the files that did not decode, so far (each counted once)
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def skipped(self) -> int:
        """Files that did not decode so far: each once, however often an epoch or a refill met it again."""
        return len(self.bad)

    @property
    def num_classes(self) -> int:
        return len(self.folder.classes)

    @property
    def n_train(self) -> int:
        return len(self.folder.train)

    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.workers or min(16, os.cpu_count() or 1), thread_name_prefix="imagefolder"
            )
        return self._pool

    def _read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def _decoded(self, paths: list[str]) -> list[torch.Tensor | None]:
        """Decoded images (None where a file does not decode), on the device when decoding there."""
        blobs = list(self.pool().map(self._read, paths))
        if self.device.type == "cuda" and self.gpu_decode:
            return _decode_on_gpu(blobs, self.device)
        return list(self.pool().map(decode, blobs))

    def train_batch(
        self, idx: torch.Tensor, step: int, batch: int, share: slice, size: int, epoch: int = 0, pos: int = 0
    ):
        """This rank's `share` of a global batch of `batch` images: the draws are made for the whole
        batch from (seed, step) on the host (this path is host work anyway, one step ahead on a
        thread) and this share's are used, so every rank crops an image as one process would."""
        from .data import step_generator

        gen = step_generator(self.seed, step)
        draws, flips = torch.rand(batch, 4, generator=gen)[share], (torch.rand(batch, generator=gen) < 0.5)[share]
        b = self.augmented(idx.cpu(), draws, flips, size)
        return b.x, b.y

    def eval_batches(self, size: int, rank: int = 0, world: int = 1):
        yield from self.val_batches(size, self.val_rect, shard=(rank, world))

    def augmented(self, indices: torch.Tensor, draws: torch.Tensor, flips: torch.Tensor, size: int) -> Batch:
        """Images `indices` of the training set, each cropped with its own draws (4 uniforms) and flip."""
        items = [self.folder.train[int(i)] for i in indices]
        images = self._decoded([p for p, _ in items])
        self._refill(images, items, [int(i) for i in indices])

        def one(k: int) -> torch.Tensor | None:
            img = images[k]
            if img is None:
                return None
            out = crop_resize(img, crop_box(img.shape[1], img.shape[2], draws[k], self.min_scale), (size, size))
            return out.flip(2) if self.flip and bool(flips[k]) else out

        done = (
            [one(k) for k in range(len(items))]
            if self.device.type == "cuda"
            else list(self.pool().map(one, range(len(items))))
        )
        if sum(img is not None for img in done) < 2:  # BatchNorm needs two; an empty batch makes the loss NaN
            raise DataError(
                f"{self.folder.root}: {len(done)} training files and the next {REFILL_TRIES} after each do not decode; "
                f"is the data set corrupt? ({self.skipped} unreadable files so far)"
            )
        return self._batch(done, [label for _, label in items])

    def _refill(self, images: list[torch.Tensor | None], items: list, indices: list[int]) -> None:
        """A file that does not decode is counted and replaced by the next training file that does (same crop
        draws), so a batch keeps its size: BatchNorm never sees one image, the loss never averages nothing."""
        n = len(self.folder.train)
        for k, img in enumerate(images):
            if img is not None:
                continue
            j = indices[k]
            with self._lock:
                self.bad.add(self.folder.train[j][0])
            for _ in range(REFILL_TRIES):
                j = (j + 1) % n
                images[k] = self._decoded([self.folder.train[j][0]])[0]
                if images[k] is not None:
                    items[k] = self.folder.train[j]
                    break
                with self._lock:
                    self.bad.add(self.folder.train[j][0])

    def val_batches(self, size: int, rect: bool = False, batch: int = 256, shard: tuple[int, int] = (0, 1)):
        """(x, y) batches of the validation set (this rank's shard) at `size`: center crop, or
        rectangular (aspect kept), grouped by shape."""
        val = self.folder.val[shard[0] :: shard[1]]
        for start in range(0, len(val), batch):
            items = val[start : start + batch]
            images = self._decoded([p for p, _ in items])
            groups: dict = {}
            unreadable = [p for img, (p, _) in zip(images, items) if img is None]
            if unreadable:  # counted like training files (summary.json: skipped_files)
                with self._lock:
                    self.bad.update(unreadable)
            for img, (_, label) in zip(images, items):
                if img is None:
                    continue
                h, w = img.shape[1:]
                shape = rect_shape(h, w, size) if rect else (size, size)
                groups.setdefault(shape, []).append((crop_resize(img, center_box(h, w, size, rect), shape), label))
            for pairs in groups.values():
                b = self._batch([p for p, _ in pairs], [lab for _, lab in pairs])
                yield b.x, b.y

    def _batch(self, images: list[torch.Tensor | None], labels: list[int]) -> Batch:
        """The decoded images of a batch (the callers counted those that did not decode, by path)."""
        keep = [k for k, img in enumerate(images) if img is not None]
        skipped = len(images) - len(keep)
        if not keep:
            return Batch(
                torch.zeros(0, 3, 1, 1, device=self.device),
                torch.zeros(0, dtype=torch.long, device=self.device),
                skipped,
            )
        x = torch.stack([images[k] for k in keep]).to(self.device, non_blocking=True)
        m = torch.tensor(self.mean, device=self.device).view(1, 3, 1, 1) * 255
        s = torch.tensor(self.std, device=self.device).view(1, 3, 1, 1) * 255
        y = torch.tensor([labels[k] for k in keep], dtype=torch.long).to(self.device, non_blocking=True)
        return Batch((x - m) / s, y, skipped)


def _decode_on_gpu(blobs: list[bytes], device: torch.device) -> list[torch.Tensor | None]:
    """JPEGs decoded on the GPU in one batched call; PNGs and files nvJPEG refuses decoded on the CPU."""
    from torchvision.io import ImageReadMode, decode_jpeg

    out: list[torch.Tensor | None] = [None] * len(blobs)
    jpegs = [k for k, b in enumerate(blobs) if b[:3] == b"\xff\xd8\xff"]
    is_jpeg = set(jpegs)
    if jpegs:
        data = [torch.frombuffer(bytearray(blobs[k]), dtype=torch.uint8) for k in jpegs]
        try:
            for k, img in zip(jpegs, decode_jpeg(data, mode=ImageReadMode.RGB, device=device)):
                out[k] = img
        except RuntimeError:  # one bad file fails the batched call: decode one by one
            for k, d in zip(jpegs, data):
                try:
                    out[k] = decode_jpeg(d, mode=ImageReadMode.RGB, device=device)
                except RuntimeError:
                    out[k] = None
    for k, b in enumerate(blobs):
        if out[k] is None and k not in is_jpeg:
            img = decode(b)
            out[k] = img.to(device) if img is not None else None
    return out


def write_imagefolder_like(
    root: str, classes: int = 4, per_class: int = 40, val_per_class: int = 10, seed: int = 0, corrupt: int = 2
) -> Path:
    """A small learnable image folder for tests (nothing is downloaded): each class is a colour and an
    orientation of stripes, at varied sizes and aspect ratios, JPEG and PNG; plus `corrupt` files that
    do not decode and one file that is not an image."""
    from torchvision.io import encode_jpeg, encode_png

    gen = torch.Generator().manual_seed(seed)
    base = Path(root)
    for part, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = base / part / f"class_{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = (int(v) for v in torch.randint(48, 112, (2,), generator=gen))
                yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
                period = 6 + 2 * (c % 3)
                stripes = ((xx if c % 2 else yy) // period) % 2
                colour = torch.tensor([(c * 67) % 256, (c * 131 + 40) % 256, (255 - c * 53) % 256]).view(3, 1, 1)
                noise = torch.randint(0, 60, (3, h, w), generator=gen)
                img = (stripes.unsqueeze(0) * colour + noise).clamp(0, 255).to(torch.uint8)
                if i % 3 == 0:
                    (folder / f"{i:04d}.png").write_bytes(encode_png(img).numpy().tobytes())
                else:
                    (folder / f"{i:04d}.jpg").write_bytes(encode_jpeg(img, quality=90).numpy().tobytes())
    for k in range(corrupt):
        (base / "train" / f"class_{k % classes:02d}" / f"broken_{k}.jpg").write_bytes(
            b"\xff\xd8\xff\xe0 not really a jpeg"
        )
    (base / "train" / "class_00" / "README.txt").write_text("not an image\n")
    return base
