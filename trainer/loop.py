"""The trainer's one loop over steps (`run_steps`) and what it keeps: the progress, the training clock, the
checkpoints (what they hold, when they are made, resuming from one), the metrics lines and summary.json. A recipe —
train.py's (a net and SGD as the options say) or recipe_muon.py's (airbench94_muon, as published) — hands the loop a
`Recipe`: its steps' course, and hooks for what differs (warm-up, the step and what precedes it, a metrics line and
its evaluation, the summary). The loop names no recipe."""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from . import checkpoint
from .presets import Config
from .runtime import MetricsLog, Process, Signals, StepTimer, graphs_compiled, uses_cuda_graphs
from .schedule import Cursor

log = logging.getLogger("trainer")


# --- the progress ----------------------------------------------------------------------------------


@dataclass
class Progress:
    """How far a run has come: what a checkpoint restores besides the weights (saved as a dict of these fields,
    so a checkpoint holds plain data)."""

    step: int = 0  # optimizer steps taken
    train_time: float = 0.0  # seconds of training steps, over every attempt (not evaluation, checkpoints, compiling)
    best_acc: float = 0.0  # the best test accuracy so far
    acc: float | None = None  # the last test accuracy (None: none yet)
    time_to_target: float | None = None  # train_time when the test accuracy first reached --target-acc

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, saved: dict) -> None:
        """A checkpoint's progress; a field it lacks (written by an earlier version) keeps its value."""
        for f in fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])


@dataclass
class EpochProgress(Progress):
    """The progress of a run through epochs of a data set: where the next batch starts in its epoch's order, and the
    loss summed since the last epoch's line (a checkpoint taken mid-epoch keeps it, so the line is the same)."""

    epoch: int = 0  # the epoch of the next step
    pos: int = 0  # where in the epoch's order the next batch starts
    loss_sum: float = 0.0  # the training loss summed over this epoch's steps so far
    loss_n: int = 0  # those steps

    def place_old_checkpoint(self, saved: dict | None, steps_per_epoch: int, batch: int) -> None:
        """A checkpoint of a version without batch schedules (no `pos`) was made at a constant batch: where its step
        is in its epoch."""
        if saved is not None and "pos" not in saved["progress"]:
            self.epoch, i = divmod(self.step, steps_per_epoch)
            self.pos = i * batch


# --- the clock -------------------------------------------------------------------------------------


class Clock:
    """Training time — the steps only, not evaluation, checkpoints or compilation — added to the progress's
    `train_time` whenever it is taken (one device sync on CUDA: StepTimer), and the images per second of a window
    of steps (since the last `reset`)."""

    def __init__(self, device: torch.device, progress: Progress):
        self.timer, self.progress = StepTimer(device), progress
        self.images, self.seconds = 0, 0.0

    def start(self) -> None:
        self.timer.start()

    def stop(self, images: int) -> None:
        self.timer.stop()
        self.images += images

    def take(self) -> None:
        dt = self.timer.take()
        self.progress.train_time += dt
        self.seconds += dt

    def rate(self) -> float:
        return round(self.images / max(self.seconds, 1e-9), 1)

    def reset(self) -> None:
        self.images, self.seconds = 0, 0.0


# --- checkpoints -----------------------------------------------------------------------------------


class Checkpoints:
    """Checkpoints of `parts` (name: an object with state_dict/load_state_dict, or None), the progress, the torch
    RNG when `rng`, and the config, each saved as plain data ({"model": ..., "progress": {"step": ...}, "config":
    {...}}). Made every --ckpt-every-epochs epochs, every --ckpt-every-s seconds of training, at SIGUSR1 (then training
    goes on) and at SIGTERM (then the run exits 143); a run starts from the one --resume names. Under DDP rank 0 writes
    and every rank waits for it."""

    def __init__(self, cfg: Config, proc: Process, parts: dict[str, Any], progress: Progress, rng: bool = False):
        self.cfg, self.out, self.device, self.parts, self.progress = cfg, proc.out, proc.device, parts, progress
        self.rng, self.is_main, self.world = rng, proc.is_main, proc.world
        self.signals = Signals()  # from here on, compilation included: a SIGTERM is a checkpoint and exit 143
        self.last = time.time()

    def resume(self, total: int, optional=("ema",)) -> dict | None:
        """Load the checkpoint --resume names into the parts and the progress; return it (None: a fresh start). A part
        named in `optional` that the checkpoint holds nothing for keeps its fresh state (e.g. --ema added on resume)."""
        found = checkpoint.to_resume(self.cfg.resume, self.out)
        if found is None:
            return None
        saved = checkpoint.load(found, map_location=self.device)
        for name, part in self.parts.items():
            if part is not None and (name not in optional or saved.get(name) is not None):
                part.load_state_dict(saved[name])
        self.progress.load_state_dict(saved["progress"])
        if self.rng:
            torch.set_rng_state(saved["rng"]["torch"])
        if self.is_main:
            log.info("resumed from %s (step %d of %d)", found, self.progress.step, total)
        return saved

    def begin(self) -> None:
        """Training starts now: --ckpt-every-s counts from here, not from before compilation."""
        self.last = time.time()

    def due(self, end_of_epoch: bool, epochs_done: int, agree: bool = True) -> tuple[bool, bool]:
        """(checkpoint now, then exit). Under DDP, signals and clocks are each rank's own: the ranks decide together,
        at the steps where `agree` (the epoch cadence they share already)."""
        every = self.cfg.ckpt_every_epochs
        by_epoch = bool(end_of_epoch and every and epochs_done % every == 0)
        by_time = bool(self.cfg.ckpt_every_s) and time.time() - self.last >= self.cfg.ckpt_every_s
        asked, leave = self.signals.checkpoint or by_time, self.signals.exit
        if self.world > 1 and agree:
            flags = torch.tensor([int(asked), int(leave)], device=self.device if self.device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            asked, leave = bool(flags[0]), bool(flags[1])
        elif self.world > 1:
            asked = leave = False  # decided together at the next agreement step
        if asked or by_epoch:
            self.signals.checkpoint = False
        return asked or by_epoch, leave

    def save(self) -> None:
        if self.is_main:
            state = {name: part.state_dict() if part is not None else None for name, part in self.parts.items()}
            state["progress"] = self.progress.state_dict()
            if self.rng:
                state["rng"] = {"torch": torch.get_rng_state()}
            state["config"] = asdict(self.cfg)
            folder = checkpoint.save(self.out, self.progress.step, state, keep=self.cfg.ckpt_keep)
            log.info("checkpoint %s", folder)
        if self.world > 1:
            torch.distributed.barrier()
        self.last = time.time()

    def leave(self) -> None:
        log.info("SIGTERM: checkpointed at step %d, exiting", self.progress.step)
        raise SystemExit(143)


# --- metrics lines and the summary -----------------------------------------------------------------


def metrics_row(progress: Progress, epoch: float, lr: float, train_loss: float, clock: Clock, **shape) -> dict:
    """A metrics line: `shape` (image and batch size) where the run varies it; `time` is the wall clock, for orch's
    wall time to a target."""
    return dict(
        step=progress.step,
        epoch=round(epoch, 4),
        elapsed_s=round(progress.train_time, 3),
        lr=lr,
        train_loss=train_loss,
        **shape,
        images_per_s=clock.rate(),
        time=round(time.time(), 3),
    )


def record_accuracy(progress: Progress, acc: float, target: float) -> None:
    progress.acc, progress.best_acc = acc, max(progress.best_acc, acc)
    if progress.time_to_target is None and acc >= target:
        progress.time_to_target = progress.train_time


def write_summary(
    out: Path, progress: Progress, cfg: Config, about: dict, compiled: dict, is_main: bool = True
) -> dict:
    """summary.json (rank 0 writes it): the accuracies and times, what ran (`about`: world size, device, model, …),
    then how it was compiled (`compiled`: compile_s and cuda_graphs at least)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a late notice must not kill a finished run on its way out
    summary = dict(
        final_acc=progress.acc,
        best_acc=progress.best_acc,
        target_acc=cfg.target_acc,
        time_to_target_s=progress.time_to_target,
        train_time_s=round(progress.train_time, 3),
        steps=progress.step,
        epochs=cfg.epochs,
        **about,
        compiled=cfg.compile and graphs_compiled() > 0,  # torch.compile really produced graphs
        compile_s=round(compiled.pop("compile_s"), 3),  # the compilation before the clock, outside train_time_s
        compile_mode=cfg.compile_mode if cfg.compile else "",
        **compiled,
    )
    if is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(
            "done: final acc %.4f, best %.4f, %.1f s training",
            summary["final_acc"] or 0,
            summary["best_acc"],
            summary["train_time_s"],
        )
    return summary


# --- the one loop ----------------------------------------------------------------------------------

Place = tuple[int, int, int]  # (epoch, pos, batch size) of a step: where its batch starts in its epoch's order


class Recipe(Protocol):
    """What a recipe hands the loop: its run's options and process, its progress and checkpoints, the course of its
    steps (`course.place`: the place of the step at or after a point) and how many it takes, and the hooks below."""

    cfg: Config
    proc: Process
    progress: EpochProgress
    ckpts: Checkpoints

    @property
    def course(self) -> Cursor: ...

    @property
    def total(self) -> int:
        """The steps this run takes (--max-steps included)."""
        ...

    def warm_up(self, place: Place | None, graphs: bool) -> float:
        """Before the clock starts (compiling, DDP's buckets), leaving the state as it was; the seconds compiling."""
        ...

    def before_clock(self, step: int, place: Place) -> None:
        """Host-side preparations of a step, outside the training time (schedules that need no device work, data
        made once an epoch)."""
        ...

    def step(self, step: int, place: Place, nxt: Place | None) -> torch.Tensor:
        """One training step at `place` (`nxt`: the next step's, None if none): its loss, not read on the host."""
        ...

    def metrics_row(self, clock: Clock, loss_acc: torch.Tensor, place: Place, end_of_epoch: bool) -> dict:
        """The metrics line after the step at `place` (the clock taken; the losses since the last line added up in
        `loss_acc`): at an epoch's end with the test accuracy."""
        ...

    def before_checkpoint(self, loss_acc: torch.Tensor) -> None:
        """What the progress must keep before a checkpoint is made mid-line."""
        ...

    def finish(self, compiled: dict) -> dict:
        """summary.json (write_summary) with what ran; `compiled`: compile_s, cuda_graphs, late_compiles."""
        ...


AGREE_EVERY = 8  # DDP: steps between the ranks' agreement on signals and the checkpoint clock


def run_steps(recipe: Recipe) -> dict:
    """Train: every step of the recipe's course from its progress on, with a metrics line every --log-every steps
    and at each epoch's end, and checkpoints when due; then summary.json. Nothing in a step waits for the device: the
    loss adds up there and the clock is CUDA events, both read once per metrics line; DDP ranks agree on signals every
    AGREE_EVERY steps."""
    cfg, st, course, device = recipe.cfg, recipe.progress, recipe.course, recipe.proc.device
    place = course.place(st.epoch, st.pos)
    graphs = uses_cuda_graphs(cfg, device)
    compile_s = recipe.warm_up(place, graphs)
    compiled_before_clock = graphs_compiled() if cfg.compile else 0
    clock, loss_acc = Clock(device, st), torch.zeros((), device=device, dtype=torch.float64)
    metrics = MetricsLog(recipe.proc.out / "metrics.jsonl", recipe.proc.is_main)
    recipe.ckpts.begin()
    while st.step < recipe.total and place is not None:
        step, (epoch, pos, B) = st.step, place
        recipe.before_clock(step, place)
        clock.start()
        if graphs:  # the last step's graph outputs (its loss, read below) are done with
            torch.compiler.cudagraph_mark_step_begin()
        nxt = course.place(epoch, pos + B)
        loss_acc += recipe.step(step, place, nxt if step + 1 < recipe.total else None)
        clock.stop(B)
        st.loss_n += 1
        st.step = step + 1
        st.epoch, st.pos = (nxt[0], nxt[1]) if nxt is not None else (cfg.epochs, 0)
        end_of_epoch = nxt is None or nxt[0] != epoch or st.step == recipe.total
        if end_of_epoch or (cfg.log_every and st.step % cfg.log_every == 0):
            clock.take()
            write_line(metrics, recipe.metrics_row(clock, loss_acc, place, end_of_epoch))
        save, leave = recipe.ckpts.due(end_of_epoch, epoch + 1, agree=end_of_epoch or st.step % AGREE_EVERY == 0)
        if save:
            clock.take()
            recipe.before_checkpoint(loss_acc)
            recipe.ckpts.save()
        if leave:
            recipe.ckpts.leave()
        place = nxt
    late = graphs_compiled() - compiled_before_clock if cfg.compile else 0  # inside the clock: should be 0
    return recipe.finish(dict(compile_s=compile_s, cuda_graphs=graphs, late_compiles=late))


def write_line(metrics: MetricsLog, row: dict) -> None:
    metrics.write(row)
    if not math.isfinite(row["train_loss"]):  # every later step would be NaN too: a failed run, not a "succeeded" one
        raise SystemExit(
            f"trainer: the training loss is {row['train_loss']} at step {row['step']} (epoch {row['epoch']}); "
            f"the run failed. Lower --lr, check the data (skipped_files: {row.get('skipped_files', 0)}), or try "
            "--precision fp32"
        )
