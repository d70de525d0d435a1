"""The bundled trainer's generic recipe, top to bottom: the data source and evaluation, the net and what updates it
(`Net`), then `Run`: the run it sets up (its course and batches from course.py) and the hooks it hands the one loop
(`loop.run_steps`); `train(cfg)` picks the recipe --recipe names and runs the loop. Its options are a `presets.Config`
(one field a line, its default and meaning beside it), its progress a `loop.EpochProgress`, saved in each checkpoint
as a plain dict; what differs by net (airbench's whitening) is in models.py, not in the loop. What it does and how to
call it: `trainer.config.USAGE` (`python -m trainer --help` prints it).
"""

from __future__ import annotations

import copy
import gc
import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from . import data, models
from .config import resolve_config
from .course import Batches, Plan, make_plan
from .loop import (
    Checkpoints,
    Clock,
    EpochProgress,
    Place,
    Recipe,
    metrics_row,
    record_accuracy,
    run_steps,
    write_summary,
)
from .presets import DEFAULTS, PRESETS, Config
from .runtime import (
    SGD,
    Process,
    check_compile_mode,
    compile_net,
    ema_update,
    fold_loss,
    param_groups,
    start_run,
)
from .schedule import Cursor, step_value
from .warmup import shape_places, warm_up

log = logging.getLogger("trainer")


# --- data and evaluation -------------------------------------------------------------------------


def load_source(cfg: Config, device: torch.device):
    """Batches for training and evaluation: tensors held on the device, or an image folder read as it goes."""
    if cfg.dataset != "imagefolder":
        ds = data.load(cfg.dataset, cfg.data_dir, cfg.seed, cfg.image_size, synthetic_train=cfg.synthetic_train)
        return data.TensorSource(ds, device, crop_pad=cfg.crop_pad, flip=cfg.flip, seed=cfg.seed)
    from .imagefolder import DataError, ImageFolderSource, scan

    try:
        folder = scan(cfg.data_dir)
    except DataError as exc:
        raise SystemExit(f"trainer: {exc}") from None
    if folder.ignored:
        log.info("%s: %d files are not JPEG or PNG by name; ignored", folder.root, folder.ignored)
    return ImageFolderSource(
        folder,
        device,
        min_scale=cfg.min_scale,
        flip=cfg.flip,
        workers=cfg.workers,
        seed=cfg.seed,
        val_rect=cfg.val_rect,
    )


@torch.no_grad()
def evaluate(model: nn.Module, source, tta: bool, autocast, size: int, rank: int = 0, world: int = 1) -> float:
    """Accuracy on the test/validation set at `size` (each rank its shard, summed over ranks)."""
    model.eval()
    device = next(model.parameters()).device
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # hits, images: added up on the device, read once
    for x, y in source.eval_batches(size, rank, world):
        with autocast():
            logits = model(x).float()
            if tta:
                logits = logits + model(x.flip(3)).float()
        counts[0] += (logits.argmax(1) == y).sum()
        counts[1] += y.shape[0]
    if world > 1:
        counts = counts if device.type == "cuda" else counts.cpu()
        torch.distributed.all_reduce(counts)
    model.train()
    hits, seen = counts.tolist()
    return hits / max(seen, 1)


# --- the net and what trains it --------------------------------------------------------------------


@dataclass
class Net:
    """The model (its weights), its EMA copy, what updates them, and `net`: the model as a step calls it (compiled,
    DDP-wrapped)."""

    model: nn.Module
    ema: nn.Module | None
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    net: nn.Module | None
    fused: bool
    amp_dtype: torch.dtype | None
    device: torch.device
    ema_decay: float
    ema_pairs: list = field(default_factory=list)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def step(self, x: torch.Tensor, y: torch.Tensor, loss_fn) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on (x, y): (logits, loss), neither read on the host."""
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with self.autocast():
            logits = self.net(x)
            loss = loss_fn(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.ema is not None:
            ema_update(self.ema, self.model, self.ema_decay, self.ema_pairs)
        return logits, loss


def build_net(cfg: Config, source, proc: Process) -> Net:
    device = proc.device
    model = models.build(
        cfg.model, source.num_classes, cfg.width, cfg.concat_pool, cfg.depth, cfg.widen, cfg.whiten_bias_epochs
    ).to(device)
    models.init_from_data(model, lambda: data.normalize(source.train.images[:5000], source.mean, source.std))
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    ema = copy.deepcopy(model).eval() if cfg.ema > 0 else None
    fused = device.type == "cuda"  # one kernel for the whole update on a GPU; the CPU keeps for-each (bitwise tests)
    optimizer = SGD(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        momentum=cfg.momentum_max,
        nesterov=cfg.nesterov,
        fused=fused or None,
    )
    # on the CPU too: fp16 needs loss scaling
    scaler = torch.amp.GradScaler(device.type, enabled=proc.precision == "fp16")
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(proc.precision)
    net: nn.Module = compile_net(model, cfg.compile_mode) if cfg.compile else model
    if proc.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(net, device_ids=[proc.local_rank] if device.type == "cuda" else None)
    return Net(model, ema, optimizer, scaler, net, fused, amp_dtype, device, cfg.ema)


# --- the recipe the loop runs ----------------------------------------------------------------------


@dataclass
class Run:
    """One run of the generic recipe (a `loop.Recipe`), set up by `setup`: its data, its net and what trains it, its
    course; its hooks set the scheduled lr and momentum, take each batch and step the optimizer."""

    cfg: Config
    proc: Process
    source: Any
    m: Net
    plan: Plan
    progress: EpochProgress  # what a checkpoint restores besides the weights
    ckpts: Checkpoints
    loss_fn: nn.Module
    batches: Batches
    lr: float = 0.0  # the last step's lr and image size, for its metrics line
    size: int = 0
    compute_dtype: str = ""  # what autocast ran in (read from the first step's logits: no sync)

    @property
    def course(self) -> Cursor:
        return self.plan.cursor

    @property
    def total(self) -> int:
        return self.plan.total

    def warm_up(self, place: Place | None, graphs: bool) -> float:
        """Compiled, a step of each shape before the clock starts; under DDP one step, for the gradient buckets'
        layout. Returns the seconds compiling."""
        cfg, m, plan = self.cfg, self.m, self.plan
        warm = (
            shape_places(plan.cursor, plan.sizes, place)
            if cfg.compile
            else [place]
            if self.proc.world > 1 and place
            else []
        )
        if not warm:
            return 0.0
        seconds = warm_up(
            m.net,
            m.model,
            m.optimizer,
            warm,
            self.batches.at,
            plan.sizes,
            plan.cursor,
            m.autocast,
            self.loss_fn,
            self.proc.device,
            graphs,
        )
        return seconds if cfg.compile else 0.0  # the DDP-only warm-up is not compilation

    def before_clock(self, step: int, place: Place) -> None:
        models.start_epoch(self.m.model, place[0])

    def step(self, step: int, place: Place, nxt: Place | None) -> torch.Tensor:
        epoch, pos, B = place
        progress = self.plan.cursor.progress(epoch, pos)
        lr, momentum = self.plan.sched(progress)
        self.lr = lr = lr * (
            B / self.plan.B0
        )  # the linear scaling rule, when the batch size changes with the image size
        for group in self.m.optimizer.param_groups:
            group["lr"], group["momentum"] = lr, momentum
        self.size = int(step_value(self.plan.sizes, progress))
        x, y = self.batches.take(step, place, self.size, nxt)
        logits, loss = self.m.step(x, y, self.loss_fn)
        self.compute_dtype = self.compute_dtype or str(logits.dtype).removeprefix("torch.")
        return loss.detach()

    def metrics_row(self, clock: Clock, loss_acc: torch.Tensor, place: Place, end_of_epoch: bool) -> dict:
        """The mean loss of the epoch's steps so far; at each epoch's end the test accuracy."""
        st, cfg, m, proc = self.progress, self.cfg, self.m, self.proc
        epoch, pos, B = place
        done = epoch + 1 if st.epoch != epoch else epoch + (pos + B) / self.source.n_train
        st.loss_sum += fold_loss(loss_acc, proc.world)
        row = metrics_row(st, done, self.lr, st.loss_sum / max(st.loss_n, 1), clock, image_size=self.size, batch_size=B)
        if end_of_epoch:
            model = m.ema if m.ema is not None else m.model
            acc = evaluate(model, self.source, cfg.tta, m.autocast, self.plan.eval_size, proc.rank, proc.world)
            record_accuracy(st, acc, cfg.target_acc)
            row["test_acc"] = acc
            st.loss_sum, st.loss_n = 0.0, 0
            clock.reset()
            if proc.is_main:
                log.info(
                    "epoch %.2f step %d/%d loss %.4f acc %.4f lr %.4f size %d %.0f img/s",
                    *(
                        row["epoch"],
                        st.step,
                        self.total,
                        row["train_loss"],
                        acc,
                        self.lr,
                        self.size,
                        row["images_per_s"],
                    ),
                )
        if self.source.skipped:  # after the evaluation: its unreadable files count too
            row["skipped_files"] = self.source.skipped
        return row

    def before_checkpoint(self, loss_acc: torch.Tensor) -> None:
        self.progress.loss_sum += fold_loss(loss_acc, self.proc.world)  # the epoch's line is the same after a resume

    def finish(self, compiled: dict) -> dict:
        self.batches.close()
        proc = self.proc
        about = dict(
            world_size=proc.world,
            device=str(proc.device),
            precision=proc.precision,
            model=self.cfg.model,
            dataset=self.cfg.dataset,
            compute_dtype=self.compute_dtype,
            skipped_files=self.source.skipped,
        )
        summary = write_summary(proc.out, self.progress, self.cfg, about, compiled, is_main=proc.is_main)
        # the DDP reducer (its pending gloo work) goes first, then, all ranks done, the group: else gloo can abort
        if proc.world > 1:
            self.m.net = None
            gc.collect()
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        return summary


def setup(cfg: Config) -> Run:
    proc = start_run(cfg)
    torch.manual_seed(cfg.seed)
    source = load_source(cfg, proc.device)
    m = build_net(cfg, source, proc)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    plan = make_plan(cfg, source.n_train, proc.world)
    progress = EpochProgress()
    parts = dict(model=m.model, optimizer=m.optimizer, scaler=m.scaler, ema=m.ema)
    ckpts = Checkpoints(cfg, proc, parts, progress, rng=True)
    saved = ckpts.resume(plan.total)
    if saved is not None:
        for group in m.optimizer.param_groups:  # a checkpoint made on another kind of device keeps this one's update
            group["fused"] = m.fused or None
    progress.place_old_checkpoint(saved, source.n_train // plan.B0, plan.B0)
    batches = Batches(cfg.seed, source, plan, proc.rank, proc.world, proc.device)
    return Run(cfg, proc, source, m, plan, progress, ckpts, loss_fn, batches)


# --- training: a recipe, then the one loop ---------------------------------------------------------

# --recipe: the module whose `setup(cfg)` makes the run's `loop.Recipe` ('': this module's, as the options say)
RECIPES = {"": "trainer.train", "airbench94_muon": "trainer.recipe_muon"}


def train(cfg: Config) -> dict:
    check_compile_mode(cfg.compile_mode)
    if cfg.recipe not in RECIPES:
        raise SystemExit(f"trainer: unknown --recipe {cfg.recipe!r}: use one of {sorted(RECIPES)}")
    recipe: Recipe = importlib.import_module(RECIPES[cfg.recipe]).setup(cfg)
    return run_steps(recipe)


def main(argv=None) -> int:
    cfg = resolve_config(DEFAULTS, PRESETS, sys.argv[1:] if argv is None else argv)
    return 0 if cfg is None else run(cfg)


def run(cfg: Config) -> int:
    """Train with a resolved, checked configuration (`python -m trainer` checks it before PyTorch is imported)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    from .imagefolder import DataError

    try:
        train(cfg)
    except DataError as exc:  # a data set that cannot be read on: a clear line, exit 1, no traceback
        raise SystemExit(f"trainer: {exc}") from None
    return 0
