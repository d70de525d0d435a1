"""`--preset fast-muon` (airbench94_muon's recipe, trainer/recipe_muon.py) and its optimizer, on the CPU:
Muon's orthogonalized step, learning a real data set (scikit-learn's digits), resuming mid-epoch to
the same weights as a run never stopped, and no host read inside its training step."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.unit.trainer.test_train import final_weights, same, trainer_call
from trainer.muon import Muon, orthogonalize

DIGITS = [
    "--preset",
    "fast-muon",
    "--dataset",
    "digits",
    "--image-size",
    "32",
    "--batch-size",
    "200",
    "--width",
    "0.25",
    "--threads",
    "1",
    "--precision",
    "fp32",
]


def trainer(*args: str) -> subprocess.CompletedProcess:
    return trainer_call(list(args), timeout=600)


def test_muon_steps_along_an_orthogonalized_update():
    torch.manual_seed(0)
    for shape in ((64, 200), (200, 64)):
        s = torch.linalg.svdvals(orthogonalize(torch.randn(*shape)).float())
        assert s.shape[0] == 64 and s.min() > 0.3 and s.max() < 1.6, s  # pushed towards 1 (not exactly: 3 steps)
    w = torch.nn.Parameter(torch.randn(16, 8, 3, 3) * 5)
    w.grad = torch.randn_like(w)
    before = w.detach().clone()
    Muon([w], lr=0.1, momentum=0.6).step()
    rescaled = before * (16**0.5 / before.norm())  # the weight is renormalized to norm sqrt(out) first
    step = (rescaled - w.detach()).reshape(16, -1) / 0.1
    assert torch.allclose(step, orthogonalize(w.grad.add(w.grad, alpha=0.6).reshape(16, -1)).float(), atol=1e-2)


def test_fast_muon_learns_digits(tmp_path):
    p = trainer(*DIGITS, "--epochs", "3", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["recipe"] == "airbench94_muon" and summary["final_acc"] >= 0.9, summary
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [round(line["epoch"]) for line in lines] == [1, 2, 3] and all(line["images_per_s"] > 0 for line in lines)


@pytest.mark.slow
def test_fast_muon_resumed_mid_epoch_ends_with_the_weights_of_a_run_never_stopped(tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert trainer(*DIGITS, "--epochs", "2", "--out", str(whole)).returncode == 0
    # stop at step 10 of 14 (mid-epoch 2) with a checkpoint there, then go on from it
    first = trainer(*DIGITS, "--epochs", "2", "--max-steps", "10", "--ckpt-every-s", "0.001", "--out", str(stopped))
    assert first.returncode == 0, first.stderr[-2000:]
    assert (stopped / "ckpt" / "10" / "MANIFEST.json").exists()
    second = trainer(*DIGITS, "--epochs", "2", "--out", str(stopped))
    assert second.returncode == 0 and "resumed from" in second.stderr and "step 10 of 14" in second.stderr, (
        second.stderr[-2000:]
    )
    assert same(final_weights(whole), final_weights(stopped))


def test_no_host_sync_inside_the_fast_muon_step(tmp_path, monkeypatch):
    from trainer.config import resolve_config
    from trainer.train import DEFAULTS, PRESETS, train

    reads = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _o=original, _n=name: (reads.append(_n), _o(self, *a))[1]
        )

    def count(batch: int, out: Path) -> int:  # one epoch of the same data: 14 steps, then 7
        cfg = resolve_config(
            DEFAULTS,
            PRESETS,
            [
                *DIGITS,
                "--epochs",
                "1",
                "--batch-size",
                str(batch),
                "--ckpt-every-epochs",
                "0",
                "--ckpt-every-s",
                "0",
                "--out",
                str(out),
            ],
        )
        reads.clear()
        train(cfg)
        return len(reads)

    assert count(100, tmp_path / "a") == count(200, tmp_path / "b")
