"""Schedules as plain functions of training progress: one-cycle LR/momentum, piecewise-linear, image size."""

from __future__ import annotations

import math


def parse_points(text: str) -> list[tuple[float, float]]:
    """'24@0,32@0.5' -> [(0.0, 24.0), (0.5, 32.0)]: value@progress pairs, progress in [0, 1]."""
    points = []
    for part in str(text).split(","):
        value, _, at = part.strip().partition("@")
        points.append((float(at or 0), float(value)))
    points.sort()
    if not points or points[0][0] != 0:
        raise ValueError(f"{text!r}: the first point must be at progress 0, e.g. '24@0,32@0.5'")
    return points


def piecewise_linear(points: list[tuple[float, float]], t: float) -> float:
    """Linear between (progress, value) points, flat outside them."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-12)
    return points[-1][1]


def step_value(points: list[tuple[float, float]], t: float) -> float:
    """The value of the last point whose progress is <= t (for image sizes: no in-between sizes)."""
    value = points[0][1]
    for at, v in points:
        if t >= at:
            value = v
    return value


def one_cycle(
    t: float,
    peak: float,
    warmup: float = 0.25,
    div: float = 25.0,
    final_div: float = 1e3,
    momentum: tuple[float, float] = (0.95, 0.85),
) -> tuple[float, float]:
    """Smith's one-cycle at progress t: (lr, momentum). LR rises then anneals (cosine); momentum does the inverse."""
    hi_m, lo_m = momentum
    if t < warmup:
        p = t / warmup
        lr = peak / div + (peak - peak / div) * p
        m = hi_m - (hi_m - lo_m) * p
    else:
        p = (t - warmup) / max(1 - warmup, 1e-12)
        cos = (1 + math.cos(math.pi * min(p, 1.0))) / 2
        lr = peak / final_div + (peak - peak / final_div) * cos
        m = lo_m + (hi_m - lo_m) * (1 - cos)
    return lr, m


class LRSchedule:
    """lr (and momentum) at a given progress, from a config: kind one_cycle or piecewise."""

    def __init__(self, kind: str, peak: float, warmup: float, momentum: tuple[float, float], points: str = ""):
        if kind not in ("one_cycle", "piecewise"):
            raise ValueError(f"schedule {kind!r}: use one_cycle or piecewise")
        self.kind, self.peak, self.warmup, self.momentum = kind, peak, warmup, momentum
        self.points = parse_points(points) if kind == "piecewise" else []

    def __call__(self, t: float) -> tuple[float, float]:
        if self.kind == "one_cycle":
            return one_cycle(t, self.peak, self.warmup, momentum=self.momentum)
        return self.peak * piecewise_linear(self.points, t), self.momentum[1]


class Cursor:
    """Where training stands: `pos` images into epoch `epoch`. The batch size at each point comes from
    `batch_points` (a step schedule over progress in images, like image sizes); a batch never
    crosses the end of an epoch (the remainder of the epoch's order is dropped, as before)."""

    def __init__(self, n: int, epochs: int, batch_points: list[tuple[float, float]]):
        if any(b < 1 for _, b in batch_points):  # a step of 0 images never advances: total_steps would never end
            raise ValueError(f"batch sizes must be at least 1, got {[int(b) for _, b in batch_points]}")
        self.n, self.epochs, self.points = n, epochs, batch_points

    def progress(self, epoch: int, pos: int) -> float:
        return (epoch * self.n + pos) / max(1, self.epochs * self.n)

    def batch(self, epoch: int, pos: int) -> int:
        return int(step_value(self.points, self.progress(epoch, pos)))

    def place(self, epoch: int, pos: int):
        """(epoch, pos, batch) of the step that starts at or after this point; None when training is done."""
        while epoch < self.epochs:
            b = self.batch(epoch, pos)
            if pos + b <= self.n:
                return epoch, pos, b
            if pos == 0:
                return None  # the batch is larger than the whole training set
            epoch, pos = epoch + 1, 0
        return None

    def total_steps(self) -> int:
        steps, at = 0, self.place(0, 0)
        while at is not None:
            steps += 1
            at = self.place(at[0], at[1] + at[2])
        return steps
