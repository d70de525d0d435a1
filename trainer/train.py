"""The bundled trainer's main loop, top to bottom: the data source, the net and what updates it (`Net`), the run's
course (`Plan`: schedules, sizes, steps), its batches, then `train`: one loop over steps. Its options are a
`presets.Config` (one field a line, its default and meaning beside it), its progress an `EpochProgress`, saved in
each checkpoint as a plain dict; what differs by net (airbench's whitening) is in models.py, not in the loop. What it
does and how to call it: `trainer.config.USAGE` (`python -m trainer --help` prints it).
"""

from __future__ import annotations

import copy
import gc
import logging
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from . import data, models
from .config import resolve_config
from .loop import Checkpoints, Clock, Progress, metrics_row, record_accuracy, write_summary
from .presets import DEFAULTS, PRESETS, Config
from .runtime import (
    SGD,
    MetricsLog,
    Process,
    check_compile_mode,
    compile_net,
    ema_update,
    fold_loss,
    graphs_compiled,
    param_groups,
    start_run,
    uses_cuda_graphs,
)
from .schedule import Cursor, LRSchedule, parse_points, step_value
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


# --- the plan: schedules, sizes and steps ----------------------------------------------------------


@dataclass
class Plan:
    """The run's course, from its options: lr and momentum by progress, image and batch sizes, and its steps."""

    sched: LRSchedule
    sizes: list
    eval_size: int
    B0: int
    cursor: Cursor
    total: int

    def size_at(self, epoch: int, pos: int) -> int:
        return int(step_value(self.sizes, self.cursor.progress(epoch, pos)))


def make_plan(cfg: Config, n: int, world: int) -> Plan:
    sched = LRSchedule(cfg.schedule, cfg.lr, cfg.warmup, (cfg.momentum_max, cfg.momentum_min), cfg.lr_points)
    sizes = parse_points(cfg.sizes or f"{cfg.image_size}@0")
    eval_size = cfg.val_size or (int(sizes[-1][1]) if cfg.dataset == "imagefolder" else cfg.image_size)
    B0 = cfg.batch_size
    batches = parse_points(cfg.batch_sizes or f"{B0}@0")
    for _, b in batches:
        if int(b) % world:
            raise SystemExit(f"trainer: batch size {int(b)} must divide evenly over {world} ranks")
    cursor = Cursor(n, cfg.epochs, batches)
    total = cursor.total_steps()
    if total < 1:
        raise SystemExit(f"trainer: batch size {int(batches[0][1])} is larger than the training set ({n} images)")
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    return Plan(sched, sizes, eval_size, B0, cursor, total)


# --- batches -----------------------------------------------------------------------------------------


class Batches:
    """This rank's share of each global batch: the images at a position of the epoch's order (a function of seed
    and epoch), so a resumed run replays them. Read from files, the next batch is made on a thread while the current
    step computes."""

    def __init__(self, seed: int, source, plan: Plan, rank: int, world: int, device: torch.device):
        self.source, self.plan, self.seed, self.rank, self.world = source, plan, seed, rank, world
        self.order_device = device if source.on_device else "cpu"
        self.orders: dict = {}
        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="next-batch") if not source.on_device else None
        self.pending = None

    def at(self, step: int, epoch: int, pos: int, b: int, size: int):
        """The `b` images at `pos` in the epoch's order, this rank's share, at `size`."""
        if epoch not in self.orders:
            self.orders.clear()
            self.orders[epoch] = data.epoch_order(self.source.n_train, self.seed, epoch).to(self.order_device)
        idx = self.orders[epoch][pos : pos + b][self.rank :: self.world]
        share = slice(self.rank, None, self.world)
        return self.source.train_batch(idx, step, b, share, size, epoch=epoch, pos=pos)

    def take(self, step: int, place, size: int, nxt):
        """The batch of `step` at `place` (epoch, pos, batch size); the one at `nxt` (None: no next step) started."""
        key = (step, *place, size)
        x, y = self.pending[1].result() if self.pending is not None and self.pending[0] == key else self.at(*key)
        self.pending = None
        if self.ahead is not None and nxt is not None:
            after = (step + 1, *nxt, self.plan.size_at(nxt[0], nxt[1]))
            self.pending = (after, self.ahead.submit(self.at, *after))
        return x, y

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.shutdown(wait=True)


# --- training --------------------------------------------------------------------------------------


@dataclass
class EpochProgress(Progress):
    """The progress of a run through epochs of a data set: where the next batch starts in its epoch's order, and the
    loss summed since the last epoch's line (a checkpoint taken mid-epoch keeps it, so the line is the same)."""

    epoch: int = 0  # the epoch of the next step
    pos: int = 0  # where in the epoch's order the next batch starts
    loss_sum: float = 0.0  # the training loss summed over this epoch's steps so far
    loss_n: int = 0  # those steps


@dataclass
class Run:
    """Everything one training run holds, set up by `setup`."""

    cfg: Config
    proc: Process
    source: Any
    m: Net
    plan: Plan
    progress: EpochProgress  # what a checkpoint restores besides the weights
    ckpts: Checkpoints
    loss_fn: nn.Module
    metrics: MetricsLog
    batches: Batches


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
        if "pos" not in saved["progress"]:  # a checkpoint of a version without batch schedules: constant batch
            progress.epoch, i = divmod(progress.step, source.n_train // plan.B0)
            progress.pos = i * plan.B0
    metrics = MetricsLog(proc.out / "metrics.jsonl", proc.is_main)
    batches = Batches(cfg.seed, source, plan, proc.rank, proc.world, proc.device)
    return Run(cfg, proc, source, m, plan, progress, ckpts, loss_fn, metrics, batches)


AGREE_EVERY = 8  # DDP: steps between the ranks' agreement on signals and the checkpoint clock


def train(cfg: Config) -> dict:
    check_compile_mode(cfg.compile_mode)
    if cfg.recipe:  # a published recipe with a loop of its own
        from .recipe_muon import train_recipe

        return train_recipe(cfg)
    run = setup(cfg)
    st, m, plan, cursor, device = run.progress, run.m, run.plan, run.plan.cursor, run.proc.device
    place = cursor.place(st.epoch, st.pos)
    compile_s, graphs = warm_up_before_clock(run, place)
    compiled_before_clock = graphs_compiled() if cfg.compile else 0
    # Nothing in the step waits for the device: the loss adds up there and the clock is CUDA events, both read once
    # per metrics line; DDP ranks agree on signals every AGREE_EVERY steps.
    clock, loss_acc, compute_dtype = Clock(device, st), torch.zeros((), device=device, dtype=torch.float64), ""
    run.ckpts.begin()
    while st.step < plan.total and place is not None:
        step, (epoch, pos, B) = st.step, place
        models.start_epoch(m.model, epoch)
        clock.start()
        if graphs:  # the last step's graph outputs (its loss, read below) are done with
            torch.compiler.cudagraph_mark_step_begin()
        progress = cursor.progress(epoch, pos)
        lr, momentum = plan.sched(progress)
        lr *= B / plan.B0  # the linear scaling rule, when the batch size changes with the image size
        for group in m.optimizer.param_groups:
            group["lr"], group["momentum"] = lr, momentum
        size = int(step_value(plan.sizes, progress))
        nxt = cursor.place(epoch, pos + B)
        x, y = run.batches.take(step, place, size, nxt if step + 1 < plan.total else None)
        logits, loss = m.step(x, y, run.loss_fn)
        compute_dtype = compute_dtype or str(logits.dtype).removeprefix("torch.")  # what autocast ran in (no sync)
        loss_acc += loss.detach()
        clock.stop(B)
        st.loss_n += 1
        st.step, place = step + 1, nxt
        st.epoch, st.pos = (place[0], place[1]) if place is not None else (cfg.epochs, 0)
        end_of_epoch = place is None or place[0] != epoch or st.step == plan.total
        if end_of_epoch or (cfg.log_every and st.step % cfg.log_every == 0):
            done = epoch + 1 if place is None or place[0] != epoch else epoch + (pos + B) / run.source.n_train
            metrics_line(run, clock, loss_acc, done, lr, size, B, end_of_epoch)
        save, leave = run.ckpts.due(end_of_epoch, epoch + 1, agree=end_of_epoch or st.step % AGREE_EVERY == 0)
        if save:
            clock.take()
            st.loss_sum += fold_loss(loss_acc, run.proc.world)
            run.ckpts.save()
        if leave:
            run.ckpts.leave()
    late = graphs_compiled() - compiled_before_clock if cfg.compile else 0  # inside the clock: should be 0
    return finish(run, compute_dtype, dict(compile_s=compile_s, cuda_graphs=graphs, late_compiles=late))


def warm_up_before_clock(run: Run, place) -> tuple[float, bool]:
    """Compiled, a step of each shape before the clock starts; under DDP one step, for the gradient buckets' layout.
    Returns (seconds compiling, whether steps replay CUDA graphs)."""
    cfg, m, plan = run.cfg, run.m, run.plan
    warm = (
        shape_places(plan.cursor, plan.sizes, place) if cfg.compile else [place] if run.proc.world > 1 and place else []
    )
    graphs = uses_cuda_graphs(cfg, run.proc.device)
    if not warm:
        return 0.0, graphs
    seconds = warm_up(
        m.net,
        m.model,
        m.optimizer,
        warm,
        run.batches.at,
        plan.sizes,
        plan.cursor,
        m.autocast,
        run.loss_fn,
        run.proc.device,
        graphs,
    )
    return (seconds if cfg.compile else 0.0), graphs  # the DDP-only warm-up is not compilation


def metrics_line(run: Run, clock: Clock, loss_acc, epoch: float, lr: float, size: int, B: int, end_of_epoch: bool):
    """A metrics line (every --log-every steps, and at each epoch's end with the test accuracy)."""
    st, cfg, m, proc = run.progress, run.cfg, run.m, run.proc
    clock.take()
    st.loss_sum += fold_loss(loss_acc, proc.world)
    row = metrics_row(st, epoch, lr, st.loss_sum / max(st.loss_n, 1), clock, image_size=size, batch_size=B)
    if end_of_epoch:
        model = m.ema if m.ema is not None else m.model
        acc = evaluate(model, run.source, cfg.tta, m.autocast, run.plan.eval_size, proc.rank, proc.world)
        record_accuracy(st, acc, cfg.target_acc)
        row["test_acc"] = acc
        st.loss_sum, st.loss_n = 0.0, 0
        clock.reset()
        if proc.is_main:
            log.info(
                "epoch %.2f step %d/%d loss %.4f acc %.4f lr %.4f size %d %.0f img/s",
                *(row["epoch"], st.step, run.plan.total, row["train_loss"], acc, lr, size, row["images_per_s"]),
            )
    if run.source.skipped:  # after the evaluation: its unreadable files count too
        row["skipped_files"] = run.source.skipped
    run.metrics.write(row)
    if not math.isfinite(row["train_loss"]):  # every later step would be NaN too: a failed run, not a "succeeded" one
        raise SystemExit(
            f"trainer: the training loss is {row['train_loss']} at step {st.step} (epoch {row['epoch']}); "
            f"the run failed. Lower --lr, check the data (skipped_files: {run.source.skipped}), or try --precision "
            "fp32"
        )


def finish(run: Run, compute_dtype: str, compiled: dict) -> dict:
    run.batches.close()
    proc = run.proc
    about = dict(
        world_size=proc.world,
        device=str(proc.device),
        precision=proc.precision,
        model=run.cfg.model,
        dataset=run.cfg.dataset,
        compute_dtype=compute_dtype,
        skipped_files=run.source.skipped,
    )
    summary = write_summary(proc.out, run.progress, run.cfg, about, compiled, is_main=proc.is_main)
    # the DDP reducer (its pending gloo work) goes first, then, all ranks done, the group: else gloo can abort at exit
    if proc.world > 1:
        run.m.net = None
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


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
