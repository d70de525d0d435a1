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
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import data, models
from .loop import Checkpoints, Clock, EpochProgress, Place, metrics_row, record_accuracy, write_summary
from .muon import Muon
from .presets import Config
from .runtime import SGD, Process, compile_net, start_run
from .schedule import Cursor

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


# --- the recipe the loop runs: data, net, optimizers and hooks -------------------------------------


@dataclass
class MuonRecipe:
    """One run of the recipe (a `loop.Recipe`): its data on the device, the net and its two optimizers, and its step
    counts; its hooks set the whitening bias's training and the lrs by step, translate and mirror the images once an
    epoch, step both optimizers and evaluate with TTA."""

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
    schedule_steps: int  # the lrs fall to 0 over these (max_steps ends the run earlier, not the schedule)
    bias_steps: int  # the whitening bias trains for these first steps
    total: int  # the steps this run takes
    course: Cursor
    progress: EpochProgress
    ckpts: Checkpoints
    loss_fn: nn.Module
    epoch_cache: dict = field(default_factory=dict)  # epoch: (its translated, mirrored images, its order)
    idx: torch.Tensor | None = None  # the next step's images in its epoch's order

    @property
    def device(self) -> torch.device:
        return self.proc.device

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None)

    def warm_up(self, place: Place | None, graphs: bool) -> float:
        return compile_first(self, self.progress.step < self.bias_steps, graphs) if self.cfg.compile else 0.0

    def before_clock(self, step: int, place: Place) -> None:
        epoch, pos, B = place
        if epoch not in self.epoch_cache:  # the epoch's translated (and on odd epochs mirrored) images, and its order
            self.epoch_cache.clear()
            g = torch.Generator().manual_seed(self.cfg.seed * 31 + epoch)
            order = torch.randperm(len(self.padded), generator=g).to(self.device)
            size = self.padded.shape[-1] - 2 * TRANSLATE
            self.epoch_cache[epoch] = (epoch_images(self.padded, size, self.cfg.seed, epoch), order)
        self.idx = self.epoch_cache[epoch][1][pos : pos + B]
        self.model.whiten.bias.requires_grad_(step < self.bias_steps)
        self.sgd.param_groups[0]["lr"] = BIAS_LR * max(0.0, 1 - step / self.bias_steps)
        for group in self.sgd.param_groups[1:] + self.muon.param_groups:
            group["lr"] = group["initial_lr"] * (1 - step / self.schedule_steps)

    def step(self, step: int, place: Place, nxt: Place | None) -> torch.Tensor:
        """One step of both optimizers; the loss, not read on the host."""
        images, idx = self.epoch_cache[place[0]][0], self.idx
        x, y = images[idx], self.train_y[idx]
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with self.autocast():
            loss = self.loss_fn(self.net(x), y)
        self.scaler.scale(loss).backward()
        for opt in (self.sgd, self.muon):
            self.scaler.step(opt)
        self.scaler.update()
        self.model.zero_grad(set_to_none=True)
        return loss.detach()

    def metrics_row(self, clock: Clock, loss_acc: torch.Tensor, place: Place, end_of_epoch: bool) -> dict:
        """The loss and images/s since the last line; at each epoch's end the test accuracy (TTA)."""
        st = self.progress
        loss = float(loss_acc) / clock.images
        row = metrics_row(st, st.step / self.per_epoch, self.muon.param_groups[0]["lr"], loss, clock)
        loss_acc.zero_()
        clock.reset()
        if end_of_epoch:
            acc = evaluate(self.model, self.test_x, self.test_y, self.autocast)
            record_accuracy(st, acc, self.cfg.target_acc)
            row["test_acc"] = acc
            log.info("epoch %.2f step %d/%d loss %.4f acc %.4f", row["epoch"], st.step, self.schedule_steps, loss, acc)
        return row

    def before_checkpoint(self, loss_acc: torch.Tensor) -> None:
        """Nothing: the recipe's line loss restarts at a resume."""

    def finish(self, compiled: dict) -> dict:
        about = dict(world_size=1, device=str(self.device), precision=self.proc.precision, model="airbench_muon")
        about.update(dataset=self.cfg.dataset, recipe="airbench94_muon")
        return write_summary(self.proc.out, self.progress, self.cfg, about, compiled)


def setup(cfg: Config) -> MuonRecipe:
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
    scaler = torch.amp.GradScaler(device.type, enabled=proc.precision == "fp16")
    net = compile_net(model, cfg.compile_mode) if cfg.compile else model
    per_epoch = len(train_x) // B
    if per_epoch < 1:
        raise SystemExit(f"trainer: batch size {B} is larger than the training set ({len(train_x)} images)")
    schedule_steps = math.ceil(cfg.epochs * per_epoch)
    progress = EpochProgress()
    ckpts = Checkpoints(cfg, proc, dict(model=model, sgd=sgd, muon=muon, scaler=scaler), progress)
    progress.place_old_checkpoint(ckpts.resume(schedule_steps), per_epoch, B)
    return MuonRecipe(
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
        amp={"bf16": torch.bfloat16, "fp16": torch.float16}.get(proc.precision),
        per_epoch=per_epoch,
        schedule_steps=schedule_steps,
        bias_steps=math.ceil(cfg.whiten_bias_epochs * per_epoch),
        total=min(schedule_steps, cfg.max_steps) if cfg.max_steps else schedule_steps,
        course=Cursor(len(train_x), cfg.epochs, [(0.0, float(B))]),
        progress=progress,
        ckpts=ckpts,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing, reduction="sum"),
    )


def compile_first(r: MuonRecipe, trains_bias_now: bool, graphs: bool) -> float:
    """Compile before the clock, on a throwaway copy of the state: a graph with the whitening bias trained and one
    with it frozen, as the run will meet them. Returns the seconds it took."""
    t0, saved_sd = time.perf_counter(), {k: v.clone() for k, v in r.model.state_dict().items()}
    B, T = r.cfg.batch_size, TRANSLATE
    for trains_bias in sorted({trains_bias_now, r.total - 1 < r.bias_steps}, reverse=True):
        for _ in range(1 + graphs):  # cudagraph trees run a graph once before recording it: both happen here
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            r.model.whiten.bias.requires_grad_(trains_bias)
            with r.autocast():
                r.loss_fn(r.net(r.padded[:B, :, T:-T, T:-T]), r.train_y[:B]).backward()
            r.model.zero_grad(set_to_none=True)
    if r.device.type == "cuda":
        torch.cuda.synchronize()
    r.model.load_state_dict(saved_sd)
    return time.perf_counter() - t0
