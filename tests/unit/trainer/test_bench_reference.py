"""`python -m trainer.bench --reference`: side by side with airbench94 (CUDA only: here its refusal
and its data, which must be our very images) or with an earlier result of the same command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.unit.trainer.test_train import trainer_env
from trainer.bench_reference import airbench_files
from trainer.data import load_cifar10, write_cifar10_like


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.bench", *args], env=trainer_env(), capture_output=True, text=True, timeout=300
    )


def test_airbench_reads_the_very_images_our_trainer_reads(tmp_path):
    write_cifar10_like(str(tmp_path), n_train=50, n_test=20)
    ours = load_cifar10(str(tmp_path), download=False)
    work = airbench_files(tmp_path)
    for name, split in (("train.pt", ours.train), ("test.pt", ours.test)):
        theirs = torch.load(work / "cifar10" / name)
        assert theirs["images"].dtype == torch.uint8 and theirs["images"].shape == (
            len(split),
            32,
            32,
            3,
        )  # airbench's NHWC
        assert torch.equal(theirs["images"].permute(0, 3, 1, 2), split.images) and torch.equal(
            theirs["labels"], split.labels
        )


def test_the_airbench_reference_says_it_needs_a_gpu_without_a_traceback(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the airbench reference runs: there is nothing to refuse")
    write_cifar10_like(str(tmp_path), n_train=50, n_test=20)
    p = bench("--reference", "airbench94", "--data-dir", str(tmp_path))
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_an_earlier_result_is_measured_again_and_compared(tmp_path):
    write_cifar10_like(str(tmp_path), n_train=500, n_test=100)
    earlier = tmp_path / "last.json"
    earlier.write_text(
        json.dumps(
            {
                "ours": {
                    "name": "--preset fast",
                    "train_time_s": 100.0,
                    "epochs": 1,
                    "images_per_s": 5.0,
                    "device": "cpu",
                },
                "n_train": 500,
                "n_test": 100,
            }
        )
    )
    p = bench(
        "--reference",
        str(earlier),
        "--data-dir",
        str(tmp_path),
        "--json",
        "--trainer-args",
        "--epochs 1 --width 0.25 --threads 1 --batch-size 100 --precision fp32",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["ours"]["epochs"] == 1 and r["ours"]["train_time_s"] > 0 and r["n_train"] == 500
    assert r["speed_ratio"] == round(100.0 / r["ours"]["train_time_s"], 3)
    bad = bench("--reference", str(tmp_path / "missing.json"), "--data-dir", str(tmp_path))
    assert bad.returncode == 2 and "not a readable earlier" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.timeout(700)
@pytest.mark.slow
def test_the_speed_table_command_runs_every_row_and_names_what_cannot_run(tmp_path):
    """`python -m trainer.figures --small`: the README table's command, wired end to end on a CPU (tiny data)."""
    out = tmp_path / "figures.json"
    p = subprocess.run(
        [sys.executable, "-m", "trainer.figures", "--small", "--json", str(out)],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["what"]: r for r in json.loads(out.read_text())}
    for preset in ("fast", "fast-muon", "resnet9", "dawnbench-rn18"):
        r = rows[f"--preset {preset}"]
        assert r["epochs"] == 1 and r["train_time_s"] > 0 and r["steady_images_per_s"] > 0, r
        assert f"| --preset {preset} | 1 |" in p.stdout
    for preset in ("fast", "resnet9", "dawnbench-rn18"):
        assert rows[f"{preset} step (trainer.bench)"]["achieved_tflops"] > 0
    reference = rows["airbench94 (reference, the airbench package)"]
    assert (
        ("needs a CUDA GPU" in reference["error"]) if not torch.cuda.is_available() else reference["train_time_s"] > 0
    )
