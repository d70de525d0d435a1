"""`--preset fast-muon`: the recipe of Keller Jordan's airbench94_muon.py (94.01% mean on CIFAR-10 in
8 epochs; github.com/KellerJordan/cifar10-airbench), inside the trainer's conventions (config,
metrics.jsonl, summary.json, verified checkpoints, SIGUSR1/SIGTERM, exact resume).

The recipe, as published:
- the net: models.AirBench(muon=True) — 2x2 patch-whitening conv (its bias trains for the first 3
  epochs only), three conv groups of 64/256/256 with bias-only BatchNorm (momentum 0.6, eps 1e-12)
  and GELU, a 3x3 max-pool, a bias-free linear head whose output is divided by its width;
- the optimizers: Muon (trainer/muon.py) for the conv filters, lr 0.24, momentum 0.6, Nesterov;
  SGD (momentum 0.85, Nesterov) for the whitening bias and the BatchNorm biases (lr 0.053) and for
  the head (lr 0.67), weight decay 2e-6 x batch per example, decoupled (weight_decay = wd / lr);
  every lr falls linearly to 0 over training, the whitening bias's over its 3 epochs;
- the data: batch 2000 (the last partial batch dropped), 8 epochs; normalized once, flipped at
  random once, reflect-padded by 2 once; each epoch a random translation of up to 2 pixels per
  image, the whole set mirrored every other epoch (alternating flips), shuffled;
- the loss: cross-entropy summed over the batch, label smoothing 0.2;
- the evaluation: test-time augmentation level 2 (the image and its mirror, each also translated
  by one pixel up-left and down-right, reflect-padded), in batches of 2000.

Differences, all of them: arithmetic is autocast (bf16 on Ampere or newer, fp16 with loss scaling
on older GPUs, fp32 on the CPU) over fp32 weights, where the script keeps the weights in fp16;
the script compiles its model (`--compile true` does here, outside the training time); random
numbers come from generators seeded by (seed, epoch), so a resumed run draws the same crops,
flips and order; one process only (the recipe is single-GPU: for DDP use `--preset fast`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import data, models
from .loop import Checkpoints, Clock, Progress, metrics_row, record_accuracy, write_summary
from .muon import Muon
from .presets import Config
from .runtime import SGD, MetricsLog, Process, compile_net, start_run, uses_cuda_graphs

log = logging.getLogger("trainer")

FILTER_LR, BIAS_LR, HEAD_LR = 0.24, 0.053, 0.67
SGD_MOMENTUM, MUON_MOMENTUM = 0.85, 0.6
WD_PER_EXAMPLE = 2e-6
TRANSLATE = 2
EVAL_BATCH = 2000


def epoch_images(padded: torch.Tensor, size: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's training images: each a random translation (of up to the padding) of its padded,
    once-flipped self, all of them mirrored on odd epochs."""
    g = data.epoch_generator(seed, epoch)
    n, r = padded.shape[0], (padded.shape[-1] - size) // 2
    shifts = torch.randint(-r, r + 1, (n, 2), generator=g).to(padded.device)
    out = torch.empty(n, padded.shape[1], size, size, dtype=padded.dtype, device=padded.device)
    for sy in range(-r, r + 1):  # one batched copy per offset
        for sx in range(-r, r + 1):
            hit = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            out[hit] = padded[hit, :, r + sy : r + sy + size, r + sx : r + sx + size]
    return out.flip(-1) if epoch % 2 == 1 else out


def tta_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Level 2: the mirror-averaged logits of the image, averaged with those of its two one-pixel translations."""

    def mirrored(v):
        return 0.5 * model(v).float() + 0.5 * model(v.flip(-1)).float()

    padded = F.pad(x, (1,) * 4, "reflect")
    size = x.shape[-1]
    shifted = 0.5 * (mirrored(padded[:, :, :size, :size]) + mirrored(padded[:, :, 2 : size + 2, 2 : size + 2]))
    return 0.5 * mirrored(x) + 0.5 * shifted


@torch.no_grad()
def evaluate(model, images, labels, autocast) -> float:
    model.eval()
    hits = torch.zeros((), dtype=torch.int64, device=labels.device)
    for x, y in zip(images.split(EVAL_BATCH), labels.split(EVAL_BATCH)):
        with autocast():
            hits += (tta_logits(model, x).argmax(1) == y).sum()
    model.train()
    return hits.item() / len(labels)


def optimizers(model: models.AirBench, batch: int, device: torch.device):
    wd = WD_PER_EXAMPLE * batch
    norm_biases = [p for n, p in model.named_parameters() if ".bn" in n and p.requires_grad]
    filters = [p for p in model.parameters() if p.ndim == 4 and p.requires_grad]
    groups = [
        dict(params=[model.whiten.bias], lr=BIAS_LR, weight_decay=wd / BIAS_LR),
        dict(params=norm_biases, lr=BIAS_LR, weight_decay=wd / BIAS_LR),
        dict(params=[model.fc.weight], lr=HEAD_LR, weight_decay=wd / HEAD_LR),
    ]
    sgd = SGD(groups, momentum=SGD_MOMENTUM, nesterov=True, **({"fused": True} if device.type == "cuda" else {}))
    muon = Muon(filters, lr=FILTER_LR, momentum=MUON_MOMENTUM, nesterov=True)
    for opt in (sgd, muon):
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return sgd, muon


# --- the run: data, net and optimizers -------------------------------------------------------------


@dataclass
class Recipe:
    """One run of the recipe: its data on the device, the net and its two optimizers, and its step counts."""

    cfg: Config
    proc: Process
    padded: torch.Tensor  # the training images, flipped at random once and reflect-padded by TRANSLATE
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    model: models.AirBench
    net: nn.Module  # the model as a step calls it (compiled or not)
    sgd: torch.optim.Optimizer
    muon: Muon
    scaler: torch.amp.GradScaler
    amp: torch.dtype | None
    per_epoch: int
    total: int  # the schedule's steps (max_steps ends the run earlier, not the schedule)
    bias_steps: int  # the whitening bias trains for these first steps
    stop_at: int

    @property
    def device(self) -> torch.device:
        return self.proc.device

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None)


def setup(cfg: Config) -> Recipe:
    if cfg.recipe != "airbench94_muon":
        raise SystemExit(f"trainer: unknown --recipe {cfg.recipe!r}: use airbench94_muon (--preset fast-muon), or none")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit(
            "trainer: --preset fast-muon is the single-GPU airbench94_muon recipe; under torchrun use --preset fast"
        )
    proc = start_run(cfg)
    device = proc.device
    torch.manual_seed(cfg.seed)
    ds = data.load(cfg.dataset, cfg.data_dir, cfg.seed, cfg.image_size, synthetic_train=cfg.synthetic_train)
    B = cfg.batch_size
    train_x = data.normalize(ds.train.images.to(device), ds.mean, ds.std)
    flip_once = torch.rand(len(train_x), generator=torch.Generator().manual_seed(cfg.seed)).to(device) < 0.5
    padded = F.pad(torch.where(flip_once.view(-1, 1, 1, 1), train_x.flip(-1), train_x), (TRANSLATE,) * 4, "reflect")
    test_x = data.normalize(ds.test.images.to(device), ds.mean, ds.std)
    model = models.build("airbench_muon", ds.num_classes, cfg.width).to(device)
    model.init_whitening(train_x[:5000])
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    sgd, muon = optimizers(model, B, device)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(proc.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=proc.precision == "fp16")
    net = compile_net(model, cfg.compile_mode) if cfg.compile else model
    per_epoch = len(train_x) // B
    if per_epoch < 1:
        raise SystemExit(f"trainer: batch size {B} is larger than the training set ({len(train_x)} images)")
    total = math.ceil(cfg.epochs * per_epoch)
    bias_steps = math.ceil(cfg.whiten_bias_epochs * per_epoch)
    stop_at = min(total, cfg.max_steps) if cfg.max_steps else total
    return Recipe(
        cfg=cfg,
        proc=proc,
        padded=padded,
        train_y=ds.train.labels.to(device),
        test_x=test_x,
        test_y=ds.test.labels.to(device),
        model=model,
        net=net,
        sgd=sgd,
        muon=muon,
        scaler=scaler,
        amp=amp,
        per_epoch=per_epoch,
        total=total,
        bias_steps=bias_steps,
        stop_at=stop_at,
    )


def compile_first(r: Recipe, loss_fn, trains_bias_now: bool, graphs: bool) -> float:
    """Compile before the clock, on a throwaway copy of the state: a graph with the whitening bias trained and one
    with it frozen, as the run will meet them. Returns the seconds it took."""
    t0, saved_sd = time.perf_counter(), {k: v.clone() for k, v in r.model.state_dict().items()}
    B, T = r.cfg.batch_size, TRANSLATE
    for trains_bias in sorted({trains_bias_now, r.stop_at - 1 < r.bias_steps}, reverse=True):
        for _ in range(1 + graphs):  # cudagraph trees run a graph once before recording it: both happen here
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            r.model.whiten.bias.requires_grad_(trains_bias)
            with r.autocast():
                loss_fn(r.net(r.padded[:B, :, T:-T, T:-T]), r.train_y[:B]).backward()
            r.model.zero_grad(set_to_none=True)
    if r.device.type == "cuda":
        torch.cuda.synchronize()
    r.model.load_state_dict(saved_sd)
    return time.perf_counter() - t0


# --- training --------------------------------------------------------------------------------------


def train_recipe(cfg: Config) -> dict:
    r = setup(cfg)
    B, size, graphs = cfg.batch_size, r.padded.shape[-1] - 2 * TRANSLATE, uses_cuda_graphs(cfg, r.device)
    st = Progress()
    ckpts = Checkpoints(cfg, r.proc, dict(model=r.model, sgd=r.sgd, muon=r.muon, scaler=r.scaler), st)
    ckpts.resume(r.total)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing, reduction="sum")
    metrics, clock = MetricsLog(r.proc.out / "metrics.jsonl", True), Clock(r.device, st)
    compile_s = compile_first(r, loss_fn, st.step < r.bias_steps, graphs) if cfg.compile else 0.0
    loss_acc, epoch_cache = torch.zeros((), device=r.device, dtype=torch.float64), {}
    ckpts.begin()
    while st.step < r.stop_at:
        step = st.step
        epoch, i = divmod(step, r.per_epoch)
        if epoch not in epoch_cache:  # the epoch's translated (and on odd epochs mirrored) images, and its order
            epoch_cache.clear()
            g = torch.Generator().manual_seed(cfg.seed * 31 + epoch)
            order = torch.randperm(len(r.padded), generator=g).to(r.device)
            epoch_cache[epoch] = (epoch_images(r.padded, size, cfg.seed, epoch), order)
        images, order = epoch_cache[epoch]
        idx = order[i * B : (i + 1) * B]
        r.model.whiten.bias.requires_grad_(step < r.bias_steps)
        r.sgd.param_groups[0]["lr"] = BIAS_LR * max(0.0, 1 - step / r.bias_steps)
        for group in r.sgd.param_groups[1:] + r.muon.param_groups:
            group["lr"] = group["initial_lr"] * (1 - step / r.total)
        clock.start()
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss_acc += step_once(r, loss_fn, images[idx], r.train_y[idx])
        clock.stop(B)
        st.step = step + 1
        end_of_epoch = st.step % r.per_epoch == 0 or st.step == r.stop_at
        if end_of_epoch or (cfg.log_every and st.step % cfg.log_every == 0):
            metrics_line(r, st, clock, loss_acc, metrics, end_of_epoch)
        save, leave = ckpts.due(end_of_epoch, st.step // r.per_epoch)
        if save:
            clock.take()
            ckpts.save()
        if leave:
            ckpts.leave()
    about = dict(world_size=1, device=str(r.device), precision=r.proc.precision, model="airbench_muon")
    about.update(dataset=cfg.dataset, recipe="airbench94_muon")
    return write_summary(r.proc.out, st, cfg, about, dict(compile_s=compile_s, cuda_graphs=graphs))


def step_once(r: Recipe, loss_fn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One step of both optimizers on (x, y); the loss, not read on the host."""
    if r.device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    with r.autocast():
        loss = loss_fn(r.net(x), y)
    r.scaler.scale(loss).backward()
    for opt in (r.sgd, r.muon):
        r.scaler.step(opt)
    r.scaler.update()
    r.model.zero_grad(set_to_none=True)
    return loss.detach()


def metrics_line(
    r: Recipe, st: Progress, clock: Clock, loss_acc: torch.Tensor, metrics: MetricsLog, end_of_epoch: bool
):
    """A metrics line: the loss and images/s since the last one; at each epoch's end the test accuracy (TTA)."""
    clock.take()
    loss = float(loss_acc) / clock.images
    row = metrics_row(st, st.step / r.per_epoch, r.muon.param_groups[0]["lr"], loss, clock)
    loss_acc.zero_()
    clock.reset()
    if end_of_epoch:
        acc = evaluate(r.model, r.test_x, r.test_y, r.autocast)
        record_accuracy(st, acc, r.cfg.target_acc)
        row["test_acc"] = acc
        log.info("epoch %.2f step %d/%d loss %.4f acc %.4f", row["epoch"], st.step, r.total, loss, acc)
    metrics.write(row)
