"""Benchmark: does the image-folder loader keep up with training? `python -m trainer.bench --dataset
imagefolder` on a generated folder, reported as the ratio of training images/s fed from files
(read, decoded, augmented one step ahead) to images/s fed from pre-decoded tensors, in one process.

On a 2-core CPU the loader and the model share the cores, so the ratio is below 1 by design; the
figure that matters is on a GPU host (there the loader runs on CPU threads and nvJPEG)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.trainer.test_train import trainer_env
from trainer.imagefolder import write_imagefolder_like

pytestmark = [pytest.mark.bench, pytest.mark.slow]


@pytest.mark.timeout(700)
def test_bench_imagefolder_loader_vs_predecoded(tmp_path):
    folder = write_imagefolder_like(str(tmp_path / "data"), classes=8, per_class=60, val_per_class=5)
    p = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-m",
            "trainer.bench",
            "--dataset",
            "imagefolder",
            "--data-dir",
            str(folder),
            "--model",
            "resnet18",
            "--width",
            "0.25",
            "--sizes",
            "64,128",
            "--batch-size",
            "32",
            "--steps",
            "10",
            "--json",
        ],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    print(f"\nloader on {r['device']}: {r['loader']}")
    for row in r["training"]:
        print(
            f"  {row['size']} px: {row['train_images_per_s_real_loader']} images/s from files, "
            f"{row['train_images_per_s_predecoded']} pre-decoded, ratio {row['ratio_real_to_predecoded']}"
        )
    assert all(row["ratio_real_to_predecoded"] > 0 for row in r["training"])
