"""Our trainer side by side with a reference, in one command, on the same data and device.

    python -m trainer.bench --reference airbench94 [--preset fast] [--data-dir DIR]
    python -m trainer.bench --reference airbench94 --json > last.json
    python -m trainer.bench --reference last.json          # this measurement against the last one

`airbench94`: Keller Jordan's airbench94 from the `airbench` package (`pip install -e '.[bench]'`;
it needs a CUDA GPU) and `python -m trainer --preset fast`, one after the other, end to end, on
the same CIFAR-format data: DIR/cifar-10-batches-py (the real data set, or without --data-dir
50,000 + 10,000 generated images in its format), which airbench reads as train.pt/test.pt written
beside it. Each side's training time (ours: summary.json's train_time_s, compilation outside it;
airbench: its train94() after one warm-up run, evaluation excluded as in its own timer),
images/s and the ratio. A JSON file given as the reference is an earlier `--json` result of this
command: the same measurement is taken again and compared with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .data import CIFAR_DIR, load_cifar10, write_cifar10_like

AIRBENCH_AUG = {"flip": True, "translate": 2}  # airbench94's own augmentation (alternating flips, translate 2)


class BenchError(Exception):
    """A reference that cannot run here; the message says why and what to do."""


def prepare_data(data_dir: str | None, n_train: int = 50_000, n_test: int = 10_000) -> Path:
    """DIR with cifar-10-batches-py; generated (CIFAR format, uint8) when no DIR is given."""
    if data_dir:
        root = Path(data_dir).expanduser()
        if not (root / CIFAR_DIR / "test_batch").exists():
            raise BenchError(
                f"{root / CIFAR_DIR} not found: give --data-dir a folder holding cifar-10-batches-py, or none for "
                "generated data"
            )
        return root
    root = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    write_cifar10_like(str(root), n_train=n_train, n_test=n_test)
    return root


def airbench_files(root: Path) -> Path:
    """The same images as airbench's CifarLoader reads them: <root>/airbench/cifar10/{train,test}.pt
    (uint8 N x 32 x 32 x 3, int64 labels); returns the folder to run airbench in (it opens ./cifar10)."""
    work = root / "airbench"
    target = work / "cifar10"
    if not (target / "test.pt").exists():
        ds = load_cifar10(str(root), download=False)
        target.mkdir(parents=True, exist_ok=True)
        for name, split in (("train.pt", ds.train), ("test.pt", ds.test)):
            torch.save(
                {
                    "images": split.images.permute(0, 2, 3, 1).contiguous(),
                    "labels": split.labels,
                    "classes": [f"c{i}" for i in range(10)],
                },
                target / name,
            )
    return work


def run_airbench94(root: Path) -> dict:
    if not torch.cuda.is_available():
        raise BenchError(
            "the airbench94 reference needs a CUDA GPU (airbench times itself with CUDA events and keeps its data on "
            "GPU 0); "
            "run this on the GPU machine, or compare with an earlier result: --reference FILE.json"
        )
    try:
        import airbench
    except ImportError:
        raise BenchError(
            "the airbench package is not installed: pip install -e '.[bench]' (or pip install airbench==0.1.8)"
        ) from None
    work = airbench_files(root)
    here = os.getcwd()
    os.chdir(work)  # airbench's train() opens ./cifar10 for its test set
    try:
        loader = airbench.CifarLoader("cifar10", train=True, batch_size=1024, aug=AIRBENCH_AUG, altflip=True)
        airbench.train94(loader, verbose=False)  # warm-up: cuDNN autotuning and lazy CUDA initialisation
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        airbench.train94(loader, verbose=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        os.chdir(here)
    epochs = 9.9  # lib_airbench94's hyp['opt']['train_epochs']
    return {
        "name": "airbench94",
        "train_time_s": round(seconds, 3),
        "epochs": epochs,
        "images_per_s": round(epochs * len(loader.images) / seconds, 1),
        "device": torch.cuda.get_device_name(0),
    }


def run_ours(root: Path, preset: str, extra: list | None = None) -> dict:
    """`python -m trainer --preset PRESET` end to end in a child process; its summary.json."""
    with tempfile.TemporaryDirectory(prefix="orch-bench-ours-") as out:
        argv = [
            sys.executable,
            "-m",
            "trainer",
            "--preset",
            preset,
            "--data-dir",
            str(root),
            "--out",
            out,
            *(extra or []),
        ]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise BenchError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
        summary = json.loads((Path(out) / "summary.json").read_text())
        epochs = [
            json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if '"test_acc"' in line
        ]
    rates = sorted(
        row["images_per_s"] for row in epochs[1:] or epochs if row.get("images_per_s")
    )  # after the first epoch
    n_train = len(load_cifar10(str(root), download=False).train)
    seconds = summary["train_time_s"]
    return {
        "name": f"--preset {preset}",
        "train_time_s": seconds,
        "epochs": summary["epochs"],
        "compile_s": summary.get("compile_s"),
        "images_per_s": round(summary["epochs"] * n_train / seconds, 1) if seconds else None,
        "final_acc": summary.get("final_acc"),
        "steady_images_per_s": rates[len(rates) // 2] if rates else None,  # the median epoch after the first
        "device": summary.get("device"),
        "precision": summary.get("precision"),
        "cuda_graphs": summary.get("cuda_graphs"),
    }


def side_by_side(reference: str, preset: str, data_dir: str | None, extra: list | None = None) -> dict:
    """One measurement: ours and the reference (airbench94, or an earlier result of this command)."""
    if reference == "airbench94":
        root = prepare_data(data_dir)
        ref = run_airbench94(root)  # first: fails fast where it cannot run
    else:
        try:
            earlier = json.loads(Path(reference).read_text())
            ref = dict(earlier["ours"], name=f"{earlier['ours']['name']} ({reference})")
            sizes = (int(earlier.get("n_train", 50_000)), int(earlier.get("n_test", 10_000)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BenchError(
                f"--reference {reference}: not airbench94 and not a readable earlier `--json` result of this command "
                f"({exc})"
            ) from None
        root = prepare_data(data_dir, *sizes)
    ours = run_ours(root, preset, extra)
    ds = load_cifar10(str(root), download=False)
    ratio = round(ref["train_time_s"] / ours["train_time_s"], 3) if ours["train_time_s"] else None
    return {"reference": ref, "ours": ours, "speed_ratio": ratio, "n_train": len(ds.train), "n_test": len(ds.test)}


def text(r: dict) -> str:
    lines = []
    for side in ("reference", "ours"):
        s = r[side]
        extra = f", compile {s['compile_s']} s outside" if s.get("compile_s") else ""
        lines.append(
            f"  {side:<9}: {s['name']:<32} {s['train_time_s']:>8.2f} s training  {s['images_per_s'] or 0:>10.1f} "
            "images/s"
            f"  ({s['epochs']} epochs on {s.get('device')}{extra})"
        )
    lines.append(f"  ratio    : {r['speed_ratio']:.2f}x (reference time / our time; above 1: ours is faster)")
    return "\n".join(lines) + "\n"
