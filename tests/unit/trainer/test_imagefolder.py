"""`--dataset imagefolder` on the CPU: a generated folder of JPEGs and PNGs of varied sizes (nothing is
downloaded), ResNet-18 at a quarter width, progressive resizing with a batch schedule, corrupt files
skipped and counted, clear layout errors, and a mid-epoch interruption that resumes bitwise."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from orchestrator.wait import retry_until
from tests.unit.trainer.test_train import final_weights, metrics, run_trainer, same, trainer_call, trainer_env
from trainer import checkpoint
from trainer.imagefolder import (
    center_box,
    crop_box,
    rect_shape,
    scan,
    write_imagefolder_like,
)

ARGS = [
    "--dataset",
    "imagefolder",
    "--model",
    "resnet18",
    "--width",
    "0.25",
    "--precision",
    "fp32",
    "--threads",
    "2",
    "--sizes",
    "32@0,48@0.5,64@0.8",
    "--batch-sizes",
    "32@0,16@0.5",
    "--batch-size",
    "32",
    "--lr",
    "0.4",
    "--label-smoothing",
    "0.1",
    "--ckpt-every-s",
    "0",
    "--ckpt-every-epochs",
    "1",
    "--ckpt-keep",
    "20",
    "--workers",
    "2",
    "--seed",
    "3",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_imagefolder_like(
        str(tmp_path_factory.mktemp("images") / "data"), classes=4, per_class=24, val_per_class=8
    )


def test_crops_stay_inside_the_image_and_validation_shapes():
    for draw in torch.rand(200, 4, generator=torch.Generator().manual_seed(0)):
        top, left, h, w = crop_box(50, 90, draw, 0.08)
        assert top >= 0 and top + h <= 50 and left >= 0 and left + w <= 90 and h >= 1 and w >= 1
    assert center_box(100, 200, 64, rect=False) == (6, 56, 88, 88)
    assert rect_shape(100, 200, 64) == (64, 96) and rect_shape(200, 100, 64) == (96, 64)  # aspect capped at 4:3


def test_layout_errors_name_the_folder_and_the_fix(folder, tmp_path):
    def fails(data_dir, words):
        p = trainer_call([*ARGS, "--data-dir", str(data_dir), "--out", str(tmp_path / "o")], timeout=120)
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert all(w in p.stderr for w in words), p.stderr[-2000:]

    fails(tmp_path / "nowhere", ["nowhere", "no train/ folder", "DIR/train/<class>"])
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "train" / "class_09").mkdir()
    fails(broken, ["class_09", "no JPEG or PNG images"])
    shutil.rmtree(broken / "train" / "class_09")
    (broken / "val" / "extra").mkdir()
    fails(broken, ["extra", "no folder in train/"])


@pytest.mark.timeout(700)
def test_learns_with_progressive_sizes_and_counts_corrupt_files(folder, tmp_path):
    found = scan(str(folder))
    assert found.classes == ["class_00", "class_01", "class_02", "class_03"] and found.ignored == 1  # README.txt
    out = tmp_path / "run"
    run_trainer([*ARGS, "--epochs", "8", "--data-dir", str(folder), "--out", str(out)], timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    rows = metrics(out)
    print(f"\nimagefolder: final acc {summary['final_acc']:.3f} in {summary['train_time_s']:.1f} s training")
    assert summary["final_acc"] >= 0.6, summary  # chance is 0.25
    assert {r["image_size"] for r in rows} == {32, 48, 64}
    assert {r["batch_size"] for r in rows} == {32, 16}
    # two broken training files, met (and replaced) every epoch they are not in the dropped remainder: counted once each
    assert summary["skipped_files"] == 2 and rows[-1]["skipped_files"] == summary["skipped_files"], summary
    per_epoch = [r["skipped_files"] for r in rows]
    assert per_epoch == sorted(per_epoch)


def test_skipped_files_counts_files_not_the_times_they_were_met(tmp_path):
    import torch

    from trainer.imagefolder import ImageFolderSource

    root = write_imagefolder_like(str(tmp_path / "data"), classes=2, per_class=4, val_per_class=2, corrupt=2)
    (root / "val" / "class_01" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    found = scan(str(root))
    source = ImageFolderSource(found, torch.device("cpu"), workers=1)
    broken = [i for i, (p, _) in enumerate(found.train) if "broken" in p]
    assert len(broken) == 2
    every = torch.arange(len(found.train))
    for _ in range(3):  # three epochs: each broken file met, and replaced, three times
        source.augmented(every, torch.rand(len(every), 4), torch.zeros(len(every), dtype=torch.bool), 32)
        list(source.val_batches(32))
    assert source.skipped == 3, sorted(source.bad)  # the 2 broken training files and the broken validation one


@pytest.mark.timeout(700)
def test_interrupted_mid_epoch_resumes_bitwise(folder, tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    args = [*ARGS, "--epochs", "4", "--data-dir", str(folder)]
    run_trainer([*args, "--out", str(ref)], timeout=600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *args, "--out", str(cut), "--log-every", "1"],
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def steps() -> int:
            try:  # the trainer makes the file before its first line, and a line may be half written
                return metrics(cut)[-1]["step"]
            except (OSError, ValueError, KeyError, IndexError):
                return 0

        retry_until(
            lambda: steps() >= 7, 300, 0.05, "training to pass into epoch 3"
        )  # 3 steps an epoch at batch 32, then 6 at 16
        at = steps()
        proc.send_signal(signal.SIGUSR1)

        def mid_epoch_checkpoint():
            done = [
                int(p.name)
                for p in checkpoint.candidates(cut)
                if (p / checkpoint.MANIFEST).exists() and int(p.name) > at
            ]
            mid = [s for s in done if json.loads((cut / "metrics.jsonl").read_text().splitlines()[s - 1])["epoch"] % 1]
            return min(mid) if mid else None

        ckpt_step = retry_until(mid_epoch_checkpoint, 120, 0.02, "the SIGUSR1 checkpoint")
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    for later in checkpoint.candidates(cut):
        if int(later.name) > ckpt_step:
            shutil.rmtree(later)
    run_trainer([*args, "--out", str(cut)], timeout=600)
    assert same(final_weights(ref), final_weights(cut))
    assert (
        json.loads((ref / "summary.json").read_text())["final_acc"]
        == json.loads((cut / "summary.json").read_text())["final_acc"]
    )
