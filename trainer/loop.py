"""What both training loops share (train.py's and the muon recipe's, recipe_muon.py): the training clock, the
checkpoints (what they hold, when they are made, resuming from one), the metrics lines and summary.json."""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from . import checkpoint
from .presets import Config
from .runtime import Process, Signals, StepTimer, graphs_compiled

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
