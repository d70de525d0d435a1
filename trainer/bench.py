"""Training throughput of a preset on synthetic CIFAR-shaped data, against a plain baseline in the same run.

    python -m trainer.bench --preset fast [--steps 50] [--batch-size 512] [--compile-mode reduce-overhead] [--json]
    python -m trainer.bench --dataset imagefolder --data-dir DIR [--model resnet50] [--sizes 128,224,288]
    python -m trainer.bench --reference airbench94 [--data-dir DIR]   # end to end (trainer/bench_reference.py)
    python -m trainer.bench --reference last.json                     # against an earlier --json result of that

The measured path is the trainer's own (data resident on the device, normalized and padded once,
on-device augmentation from per-epoch draws, autocast at the preset's precision, channels_last and
the fused SGD update on CUDA; --compile-mode reduce-overhead adds CUDA graphs). The baseline is the same network in
eager fp32, fed by a standard torch DataLoader with per-sample crop + flip on the CPU.
Reports images/s, step time, forward FLOPs per image and achieved TFLOP/s (3x forward for
forward + backward), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import torch
import torch.nn as nn

from . import data, models
from .presets import PRESETS, Config
from .runtime import compile_net, pick_precision, uses_cuda_graphs


def flops_per_image(model: nn.Module, size: int, device) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, size, size, device=device))
    model.train()
    return float(counter.get_total_flops())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step_fn, steps: int, warmup: int, device) -> float:
    for _ in range(warmup):
        step_fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step_fn()
    _sync(device)
    return (time.perf_counter() - t0) / steps


def measured_path(cfg, model, ds, device, precision, batch):
    """The trainer's step: its data source (normalized and padded once, per-epoch draws), channels_last,
    autocast, the fused SGD update on CUDA, and --compile / --compile-mode as the trainer applies them."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    net = compile_net(model, cfg.compile_mode) if cfg.compile else model
    graphs = uses_cuda_graphs(cfg, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, fused=device.type == "cuda" or None)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    source = data.TensorSource(ds, device, crop_pad=cfg.crop_pad, flip=cfg.flip, seed=cfg.seed)
    per_epoch = source.n_train // batch
    state = {"i": 0}

    def step():
        epoch, i = divmod(state["i"], per_epoch)
        state["i"] += 1
        idx = torch.arange(i * batch, (i + 1) * batch, device=device)
        x, y = source.train_batch(idx, state["i"], batch, slice(None), 32, epoch=epoch, pos=i * batch)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


class _PerSample(torch.utils.data.Dataset):
    """The standard recipe: uint8 images on the CPU, crop + flip one sample at a time."""

    def __init__(self, split: data.Split, mean, std, pad: int):
        self.split, self.mean, self.std, self.pad = split, mean, std, pad

    def __len__(self):
        return len(self.split)

    def __getitem__(self, i):
        x = data.normalize(self.split.images[i : i + 1], self.mean, self.std)
        x = data.augment(x, self.pad, True, torch.Generator().manual_seed(i))
        return x[0], self.split.labels[i]


def baseline_path(model, ds, device, batch, pad):
    loader = torch.utils.data.DataLoader(
        _PerSample(ds.train, ds.mean, ds.std, pad),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=min(4, os.cpu_count() or 1),
        pin_memory=device.type == "cuda",
        persistent_workers=True,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss()
    it = {"it": iter(loader)}

    def step():
        try:
            x, y = next(it["it"])
        except StopIteration:
            it["it"] = iter(loader)
            x, y = next(it["it"])
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def run(
    preset: str,
    steps: int,
    warmup: int,
    batch: int | None,
    device_name: str,
    width: float | None,
    compile_mode: str = "",
) -> dict:
    cfg = replace(Config(), **PRESETS[preset])
    if width is not None:
        cfg.width = width
    if compile_mode:
        cfg.compile, cfg.compile_mode = True, compile_mode
    device = torch.device(device_name if device_name != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    precision = pick_precision("auto", device)
    batch = batch or cfg.batch_size
    size = 32
    ds = data.load_synthetic(n_train=max(4 * batch, 2048), n_test=64, size=size)

    def fresh():
        torch.manual_seed(0)
        m = models.build(cfg.model, 10, cfg.width, cfg.concat_pool, cfg.depth, cfg.widen).to(device)
        models.init_from_data(m, lambda: data.normalize(ds.train.images[:2000].to(device), ds.mean, ds.std))
        return m

    flops = flops_per_image(fresh(), size, device)
    fast_s = time_steps(measured_path(cfg, fresh(), ds, device, precision, batch), steps, warmup, device)
    base_s = time_steps(baseline_path(fresh(), ds, device, batch, cfg.crop_pad), steps, warmup, device)
    ips, base_ips = batch / fast_s, batch / base_s
    return dict(
        preset=preset,
        model=cfg.model,
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        precision=precision,
        compile_mode=cfg.compile_mode if cfg.compile else "",
        batch_size=batch,
        steps=steps,
        images_per_s=round(ips, 1),
        step_ms=round(fast_s * 1e3, 2),
        gflops_per_image_fwd=round(flops / 1e9, 4),
        achieved_tflops=round(3 * flops * ips / 1e12, 3),
        baseline_images_per_s=round(base_ips, 1),
        baseline_step_ms=round(base_s * 1e3, 2),
        speedup_vs_baseline=round(ips / base_ips, 2),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="fast", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=30, help="timed steps per path")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--batch-size", type=int, help="default: the preset's")
    p.add_argument("--width", type=float, help="channel multiplier override (small CPU checks)")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--compile-mode",
        default="",
        help="compile the trainer path with this torch.compile mode (default: the preset's, "
        "uncompiled); reduce-overhead = CUDA graphs",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument(
        "--dataset",
        default="synthetic",
        choices=["synthetic", "imagefolder"],
        help="imagefolder: loader and training throughput on DIR's images (trainer/bench_data.py)",
    )
    p.add_argument("--data-dir", help="the image folder (DIR/train/<class>/*), with --dataset imagefolder")
    p.add_argument("--model", default="resnet50", help="imagefolder: the model (default resnet50)")
    p.add_argument("--sizes", default="128,224,288", help="imagefolder: image sides to measure training at")
    p.add_argument("--workers", type=int, default=0, help="imagefolder: reader/decoder threads (0 = min(16, cores))")
    p.add_argument(
        "--reference",
        help="airbench94 (Keller Jordan's, the `bench` extra, CUDA only), or an earlier --json result of "
        "--reference: train --preset end to end beside it on the same data and print the ratio",
    )
    p.add_argument(
        "--trainer-args",
        default="",
        help="--reference: extra arguments for our run, e.g. '--epochs 1' (small CPU checks)",
    )
    a = p.parse_args(argv)
    if a.reference:
        import shlex

        from . import bench_reference

        try:
            r = bench_reference.side_by_side(a.reference, a.preset, a.data_dir, shlex.split(a.trainer_args))
        except bench_reference.BenchError as exc:
            sys.stderr.write(f"trainer.bench: {exc}\n")
            return 2
        sys.stdout.write(json.dumps(r) + "\n" if a.json else bench_reference.text(r))
        return 0
    if a.dataset == "imagefolder":
        from . import bench_data

        if not a.data_dir:
            p.error("--dataset imagefolder needs --data-dir DIR")
        r = bench_data.run(
            a.data_dir,
            a.model,
            a.width or 1.0,
            [int(s) for s in a.sizes.split(",")],
            a.batch_size or 64,
            a.steps,
            a.workers,
        )
        sys.stdout.write(json.dumps(r) + "\n" if a.json else bench_data.text(r))
        return 0
    r = run(a.preset, a.steps, a.warmup, a.batch_size, a.device, a.width, a.compile_mode)
    if a.json:
        sys.stdout.write(json.dumps(r) + "\n")
    else:
        sys.stdout.write(
            f"{r['preset']} ({r['model']}) on {r['device_name']}, {r['precision']}, batch {r['batch_size']}:\n"
            f"  trainer path : {r['images_per_s']:>10.1f} images/s  {r['step_ms']:>8.2f} ms/step  "
            f"{r['achieved_tflops']:.3f} TFLOP/s ({r['gflops_per_image_fwd']} GFLOP/image forward)\n"
            f"  baseline     : {r['baseline_images_per_s']:>10.1f} images/s  {r['baseline_step_ms']:>8.2f} ms/step  "
            "(eager fp32 + DataLoader)\n"
            f"  ratio        : {r['speedup_vs_baseline']:.2f}x\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
