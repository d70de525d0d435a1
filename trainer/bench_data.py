"""Image-folder throughput: is the loader what limits training?

    python -m trainer.bench --dataset imagefolder --data-dir DIR [--model resnet50] [--sizes 128,224,288]

Measures, on this machine: decoded + augmented images/s of the loader (the CPU path, and the GPU
path on CUDA), then training images/s at each size twice in the same process — fed by the real
loader (files read, decoded and augmented one step ahead, as the trainer does) and fed by
pre-decoded tensors already on the device — and reports their ratio (1.0: the loader costs nothing).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

from . import models
from .imagefolder import ImageFolderSource, scan
from .runtime import pick_precision


def _rate(fn, n_images: int, repeats: int) -> float:
    fn()  # warm up (pool start, first allocations)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return n_images * repeats / (time.perf_counter() - t0)


def loader_rates(data_dir: str, size: int, batch: int, repeats: int, workers: int) -> dict:
    folder = scan(data_dir)
    idx = torch.arange(min(batch, len(folder.train)))
    draws, flips = torch.rand(len(idx), 4), torch.rand(len(idx)) < 0.5
    out = {}
    cpu = ImageFolderSource(folder, torch.device("cpu"), workers=workers)
    out["cpu_loader_images_per_s"] = round(_rate(lambda: cpu.augmented(idx, draws, flips, size), len(idx), repeats), 1)
    if torch.cuda.is_available():
        gpu = ImageFolderSource(folder, torch.device("cuda"), workers=workers)
        out["gpu_loader_images_per_s"] = round(
            _rate(lambda: gpu.augmented(idx, draws, flips, size), len(idx), repeats), 1
        )
    return out


def training_rates(
    data_dir: str, model_name: str, width: float, sizes: list[int], batch: int, steps: int, workers: int
) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder = scan(data_dir)
    source = ImageFolderSource(folder, device, workers=workers)
    precision = pick_precision("auto", device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    model = models.build(model_name, len(folder.classes), width).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss()
    n = len(folder.train)

    def train_step(x, y):
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    rows = []
    for size in sizes:

        def batch_of(step: int):
            idx = torch.arange(step * batch, (step + 1) * batch) % n
            x, y = source.train_batch(idx, step, batch, slice(None), size)
            if len(y) < batch:  # a file that did not decode: keep the batch full, so both paths train equal batches
                x, y = torch.cat([x, x[: batch - len(y)]]), torch.cat([y, y[: batch - len(y)]])
            return x, y

        x0, y0 = batch_of(0)
        fixed = (x0.clone(), y0.clone())

        def run(real: bool) -> float:
            ahead = ThreadPoolExecutor(1)
            pending = ahead.submit(batch_of, 1) if real else None
            for _ in range(3):  # warm-up: kernels picked and memory allocated for this shape
                train_step(*fixed)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for step in range(1, steps + 1):
                if real:
                    x, y = pending.result()
                    pending = ahead.submit(batch_of, step + 1)
                else:
                    x, y = fixed
                train_step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ahead.shutdown(wait=True)
            return batch * steps / (time.perf_counter() - t0)

        run(False)  # the first pass at a new shape pays for its set-up: not measured
        tensors, real = run(False), run(True)
        rows.append(
            dict(
                size=size,
                batch=batch,
                train_images_per_s_real_loader=round(real, 1),
                train_images_per_s_predecoded=round(tensors, 1),
                ratio_real_to_predecoded=round(real / tensors, 3),
            )
        )
    return rows


def run(data_dir: str, model: str, width: float, sizes: list[int], batch: int, steps: int, workers: int) -> dict:
    torch.set_flush_denormal(
        True
    )  # a model trained on one fixed batch drifts into denormals, which the CPU computes slowly
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return dict(
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        model=model,
        width=width,
        loader=loader_rates(data_dir, 224 if 224 in sizes else sizes[-1], batch, max(2, steps // 5), workers),
        training=training_rates(data_dir, model, width, sizes, batch, steps, workers),
    )


def text(r: dict) -> str:
    lines = [f"image folder on {r['device']}, {r['model']} (width {r['width']}):"]
    for k, v in r["loader"].items():
        lines.append(f"  {k:<28}: {v:>10.1f}")
    for row in r["training"]:
        lines.append(
            f"  {row['size']:>4} px, batch {row['batch']}: {row['train_images_per_s_real_loader']:>9.1f} images/s from "
            "files, "
            f"{row['train_images_per_s_predecoded']:>9.1f} from pre-decoded tensors: ratio "
            f"{row['ratio_real_to_predecoded']:.3f}"
        )
    return "\n".join(lines) + "\n"
