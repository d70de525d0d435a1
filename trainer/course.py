"""The generic recipe's course (`Plan`: lr and momentum by progress, image and batch sizes, its steps) and its
batches (`Batches`: this rank's share of each, replayed the same on a resume, read ahead from files)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from . import data
from .presets import Config
from .schedule import Cursor, LRSchedule, parse_points, step_value

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
