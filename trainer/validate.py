"""Every option checked before anything runs: a bad value is one `trainer: …` line naming the option,
what it got and what it takes (exit 2), never a traceback, a hang or a run that burns GPU time.

The choices here are also what `python -m trainer --help` shows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

CHOICES = {
    "dataset": ("cifar10", "synthetic", "digits", "imagefolder"),
    "model": ("resnet9", "preact_resnet18", "wide_resnet", "airbench", "airbench_muon", "resnet18", "resnet50"),
    "schedule": ("one_cycle", "piecewise"),
    "precision": ("auto", "fp32", "fp16", "bf16"),
    "compile_mode": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "device": ("auto", "cpu", "cuda"),
    "recipe": ("", "airbench94_muon"),
}
# (lowest, highest) allowed; None: unbounded on that side. Inclusive unless named in OPEN.
RANGES = {
    "epochs": (1, 100_000),
    "batch_size": (1, 1 << 24),
    "image_size": (4, 4096),
    "width": (0.01, 64.0),
    "depth": (10, 1000),
    "widen": (1, 64),
    "lr": (0.0, 1e4),
    "warmup": (0.0, 1.0),
    "momentum_max": (0.0, 1.0),
    "momentum_min": (0.0, 1.0),
    "weight_decay": (0.0, 10.0),
    "label_smoothing": (0.0, 1.0),
    "crop_pad": (0, 1024),
    "min_scale": (0.0, 1.0),
    "val_size": (0, 4096),
    "workers": (0, 1024),
    "ema": (0.0, 1.0),
    "whiten_bias_epochs": (0, 100_000),
    "threads": (0, 4096),
    "ckpt_every_s": (0.0, None),
    "ckpt_every_epochs": (0, None),
    "ckpt_keep": (1, 1000),
    "target_acc": (0.0, 1.0),
    "log_every": (0, None),
    "max_steps": (0, None),
    "synthetic_train": (1, 10_000_000),
    "seed": (0, 2**63 - 1),
}
OPEN = {"min_scale": "low", "width": "low", "ema": "high", "label_smoothing": "high"}  # (0, 1]: 0 is no crop at all
SIZE_RANGE = (4, 4096)  # image sides in --sizes
# The smallest side each net takes: its unpadded downsampling (resnet9's three 2x2 max-pools, airbench's 2x2 whitening
# conv then three) must leave one pixel for the global pooling. The others halve with padding, so any side works.
MIN_SIDE = {"resnet9": 8, "airbench": 9, "airbench_muon": 9}
CIFAR_SIDE = 32  # cifar10 is loaded as it is, whatever --image-size (which then only resizes the batches)
MAX_PROGRESS_POINTS = 64


def check_config(cfg: dict[str, Any], explicit: Iterable[str] = ()) -> None:
    """Raise SystemExit(2) with every problem of a resolved config, one per line."""
    problems = problems_of(cfg, set(explicit))
    if problems:
        import sys

        print("\n".join(f"trainer: {p}" for p in problems), file=sys.stderr)
        raise SystemExit(2)


def problems_of(cfg: dict[str, Any], explicit: set) -> list[str]:
    out: list[str] = []
    for key, allowed in CHOICES.items():
        if key in cfg and cfg[key] not in allowed:
            shown = ", ".join(a for a in allowed if a) or "''"
            out.append(f"--{_flag(key)} {cfg[key]!r} is not one of {shown}")
    for key, (lo, hi) in RANGES.items():
        if key not in cfg:
            continue
        v = cfg[key]
        if isinstance(v, float) and not math.isfinite(v):
            out.append(f"--{_flag(key)} {v!r} must be a finite number")
            continue
        open_side = OPEN.get(key)
        low_bad = lo is not None and (v <= lo if open_side == "low" else v < lo)
        high_bad = hi is not None and (v >= hi if open_side == "high" else v > hi)
        if low_bad or high_bad:
            left = "(" if open_side == "low" else "["
            right = ")" if open_side == "high" else "]"
            what = f"{left}{lo}, {hi}{right}" if hi is not None else f"at least {lo}"
            out.append(f"--{_flag(key)} {v!r} is out of range: it takes {what}")
    if cfg.get("model") == "wide_resnet" and (cfg.get("depth", 22) - 4) % 6:
        out.append(f"--depth {cfg['depth']!r}: wide_resnet's depth is 6n+4 (e.g. 16, 22, 28)")
    sizes = _points(cfg.get("sizes", ""), "sizes", out, whole=True, lo=SIZE_RANGE[0], hi=SIZE_RANGE[1])
    if not out:  # the sides are only worth checking once each option is valid on its own
        _check_sides(cfg, sizes, out)
    batches = _points(cfg.get("batch_sizes", ""), "batch-sizes", out, whole=True, lo=1, hi=RANGES["batch_size"][1])
    if cfg.get("schedule") == "piecewise":
        _points(cfg.get("lr_points", ""), "lr-points", out, whole=False, lo=0.0, hi=1e4)
    if (
        batches
        and "batch_size" in explicit
        and "batch_sizes" not in explicit
        and int(batches[0][1]) != cfg.get("batch_size")
    ):
        out.append(
            f"--batch-size {cfg['batch_size']} disagrees with the batch-size schedule {cfg['batch_sizes']!r} (from the "
            "preset "
            f"or a config), which starts at {int(batches[0][1])}: give --batch-sizes as well (e.g. "
            f"'{cfg['batch_size']}@0'), "
            f"or --batch-sizes '' for one batch size"
        )
    return out


def _sides(cfg: dict[str, Any], sizes: list[tuple[float, float]] | None) -> list[tuple[str, int]]:
    """(option, side) for every image side the net is given, as train.py and recipe_muon.py pick them."""
    if cfg.get("recipe"):  # the recipe trains and evaluates at the loaded side
        return [("image-size", CIFAR_SIDE if cfg["dataset"] == "cifar10" else cfg["image_size"])]
    train = [("sizes", int(v)) for _, v in sizes] if sizes else [("image-size", cfg["image_size"])]
    if cfg.get("val_size"):
        return [*train, ("val-size", cfg["val_size"])]
    return train if cfg.get("dataset") == "imagefolder" else [*train, ("image-size", cfg["image_size"])]


def _check_sides(cfg: dict[str, Any], sizes, out: list[str]) -> None:
    """A side a net cannot take, or padding not smaller than the image, fails at the first step or at the first
    evaluation (after an epoch of GPU time): refused before the run starts instead."""
    model = "airbench_muon" if cfg.get("recipe") else cfg.get("model", "")  # the recipe builds its own net
    least, smallest = MIN_SIDE.get(model, 0), {}
    for name, side in _sides(cfg, sizes):
        smallest[name] = min(side, smallest.get(name, side))
    for name, small in smallest.items():
        if small < least:
            shown = f"{cfg['sizes']!r} has {small}" if name == "sizes" else str(small)
            out.append(
                f"--{name} {shown}: --model {model} takes images of at least {least} pixels a side; "
                f"use a larger --{name} or another model (e.g. preact_resnet18)"
            )
    loaded = CIFAR_SIDE if cfg.get("dataset") == "cifar10" else cfg.get("image_size", CIFAR_SIDE)
    if cfg.get("dataset") != "imagefolder" and cfg.get("crop_pad", 0) >= loaded:
        source = "cifar10's 32-pixel images" if cfg.get("dataset") == "cifar10" else f"--image-size {loaded}"
        out.append(
            f"--crop-pad {cfg['crop_pad']}: the images are reflect-padded by it, so it must be smaller than {source}"
        )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _flag(key: str) -> str:
    return key.replace("_", "-")


def _points(
    text: str, name: str, out: list[str], whole: bool, lo: float, hi: float
) -> list[tuple[float, float]] | None:
    """'value@progress,...' as written: progress from 0, rising, within [0, 1]; values finite, in [lo, hi]."""
    if not text:
        return None
    example = "'24@0,32@0.5'" if name == "sizes" else "'512@0,256@0.5'" if name == "batch-sizes" else "'0@0,1@0.2,0@1'"
    points = []
    parts = str(text).split(",")
    if len(parts) > MAX_PROGRESS_POINTS:
        out.append(f"--{name} {text!r}: at most {MAX_PROGRESS_POINTS} points")
        return None
    for part in parts:
        value, sep, at = part.strip().partition("@")
        try:
            v, t = float(value), float(at) if sep else 0.0
        except ValueError:
            out.append(f"--{name} {text!r}: {part.strip()!r} is not value@progress (e.g. {example})")
            return None
        if not (math.isfinite(v) and math.isfinite(t)):
            out.append(f"--{name} {text!r}: {part.strip()!r} is not a finite value@progress")
            return None
        if whole and not v.is_integer():
            out.append(f"--{name} {text!r}: {part.strip()!r}: the value must be a whole number")
            return None
        if not lo <= v <= hi:
            out.append(f"--{name} {text!r}: {part.strip()!r}: the value must be in [{_num(lo)}, {_num(hi)}]")
            return None
        if not 0.0 <= t <= 1.0:
            out.append(
                f"--{name} {text!r}: {part.strip()!r}: the progress must be in [0, 1] (0 = start, 1 = end of training)"
            )
            return None
        points.append((t, v))
    if points[0][0] != 0.0:
        out.append(f"--{name} {text!r}: the first point must be at progress 0 (e.g. {example})")
        return None
    if any(b[0] < a[0] for a, b in zip(points, points[1:])):
        out.append(f"--{name} {text!r}: the points must be in order of progress (e.g. {example})")
        return None
    return points


def option_help(source: str) -> dict[str, str]:
    """Each option's trailing comment in presets.py's `class Config` block: the one text both read."""
    import re

    block = source.split("class Config:", 1)[-1].split("# fmt: on", 1)[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s+(\w+): \w+ = .*?#\s*(.*)$", block, re.M)}
