"""The trainer refuses bad input at once (issue: Trust, items 11-13): every bad option is one `trainer:` line
and exit 2 (a batch size of 0 used to loop forever), a data set that cannot be read on ends the run with
a clear line, a diverged loss fails the run, and unreadable files are counted, validation ones too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.unit.trainer.test_train import SMALL, metrics, run_trainer, trainer_call, trainer_env
from trainer.imagefolder import write_imagefolder_like


def trainer(args, tmp_path, timeout=120):
    return trainer_call([*args, "--out", str(tmp_path / "out")], timeout=timeout)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--batch-size", "0"], ["--batch-size 0"]),
        (["--batch-size=-4"], ["--batch-size -4"]),
        (["--batch-sizes=0@0"], ["--batch-sizes '0@0'"]),
        (["--batch-sizes=4@0,-2@0.5"], ["'-2@0.5'"]),
        (["--sizes", "abc@0"], ["--sizes 'abc@0'", "value@progress"]),
        (["--sizes", "0@0"], ["--sizes '0@0'", "[4, 4096]"]),
        (["--sizes", "32@0,nan@0.5"], ["nan@0.5", "finite"]),
        (["--sizes", "1e9@0"], ["1e9@0", "[4, 4096]"]),
        (["--sizes", "128@0.5,64@0.2"], ["--sizes", "progress 0"]),
        (["--sizes", "32@0,64@0.5,16@0.2"], ["in order of progress"]),
        (["--sizes", "32@0,64@5"], ["'64@5'", "[0, 1]"]),
        (["--model", "resnet51"], ["--model 'resnet51'", "resnet50"]),
        (["--val-size=-5"], ["--val-size -5"]),
        (["--workers=-1"], ["--workers -1"]),
        (["--min-scale", "2"], ["--min-scale 2.0"]),
        (["--dataset", "imagefolderx"], ["--dataset 'imagefolderx'", "imagefolder"]),
        (["--epochs", "0"], ["--epochs 0"]),
        (["--lr", "nan"], ["--lr nan", "finite"]),
        (["--preset", "imagenet-rn50", "--batch-size", "256"], ["--batch-size 256 disagrees", "1024"]),
    ],
)
def test_every_bad_option_is_one_clear_line_and_exit_2(tmp_path, args, words):
    # Without --print-config: the real start. A batch size of 0 used to loop forever here (the timeout would fail the
    # test).
    p = trainer([*SMALL, *args], tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.startswith("trainer: "), p.stderr[-2000:]
    for w in words:
        assert w in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()  # nothing started


def test_help_describes_every_option_with_its_choices(tmp_path):
    p = trainer_call(["--help"], timeout=60)
    assert p.returncode == 0
    assert "{cifar10,synthetic,digits,imagefolder}" in p.stdout and "resnet50}" in p.stdout
    assert "progressive resizing" in p.stdout and "global batch, split evenly over DDP ranks" in p.stdout
    from trainer.train import DEFAULTS

    for key in DEFAULTS:
        assert f"--{key.replace('_', '-')}" in p.stdout


def test_a_bad_option_fails_before_pytorch_is_imported():
    """A typo costs a blink, not seconds of imports (on a loaded CI machine: 6 s each, now under 0.5 s)."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['trainer', '--epochs', '0']\n"
        "try:\n"
        "    runpy.run_module('trainer', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=trainer_env(), capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "exit 2 False" and "--epochs 0 is out of range" in p.stderr, p.stdout + p.stderr


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_a_diverged_loss_fails_the_run_and_metrics_stay_strict_json(tmp_path):
    p = trainer(
        [*SMALL, "--epochs", "2", "--lr", "1e4", "--weight-decay", "10", "--warmup", "0"], tmp_path, timeout=300
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "trainer: the training loss is nan" in p.stderr, p.stderr[-2000:]
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1], parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))["train_loss"] is None


FOLDER = [
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
    "32@0",
    "--batch-size",
    "8",
    "--epochs",
    "2",
    "--ckpt-every-s",
    "0",
    "--ckpt-every-epochs",
    "0",
    "--workers",
    "2",
]


def _corrupt(path):
    path.write_bytes(b"\xff\xd8 not really a jpeg")


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_unreadable_files_are_replaced_in_the_batch_and_counted_validation_too(tmp_path):
    root = write_imagefolder_like(str(tmp_path / "data"), classes=2, per_class=8, val_per_class=3, corrupt=0)
    for k in range(6):  # most of class 0's training files: batches would be left with one image, or none
        _corrupt(root / "train" / "class_00" / f"bad{k}.jpg")
    for k in range(2):
        _corrupt(root / "val" / "class_01" / f"bad{k}.jpg")
    out = tmp_path / "run"
    run_trainer([*FOLDER, "--data-dir", str(root), "--out", str(out)], timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    rows = metrics(out)
    assert all(r["batch_size"] == 8 for r in rows)
    # 6 bad training files (each replaced by a readable neighbour or the next bad one) and 2 bad validation files,
    # each counted once however many epochs and evaluations meet it
    assert summary["skipped_files"] == 6 + 2, summary
    assert rows[-1]["skipped_files"] == summary["skipped_files"]


@pytest.mark.timeout(460)  # two trainer runs: up to 300 s and 120 s
@pytest.mark.slow
def test_a_folder_where_nothing_decodes_fails_clearly_and_one_class_is_refused(tmp_path):
    root = write_imagefolder_like(str(tmp_path / "data"), classes=2, per_class=4, val_per_class=2, corrupt=0)
    for f in (root / "train").rglob("*.*"):
        _corrupt(f)
    p = trainer([*FOLDER, "--data-dir", str(root)], tmp_path, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "do not decode" in p.stderr and "corrupt" in p.stderr, p.stderr[-2000:]

    one = tmp_path / "one"
    shutil.copytree(
        write_imagefolder_like(str(tmp_path / "d2"), classes=2, per_class=4, val_per_class=2, corrupt=0), one
    )
    shutil.rmtree(one / "train" / "class_01")
    shutil.rmtree(one / "val" / "class_01", ignore_errors=True)
    p = trainer([*FOLDER, "--data-dir", str(one)], tmp_path)
    assert p.returncode != 0 and "Traceback" not in p.stderr and "at least two class folders" in p.stderr, p.stderr[
        -2000:
    ]


@pytest.mark.parametrize(
    "files, args, words",
    [
        ({}, ["--config", "missing.yaml"], ["--config missing.yaml: cannot be read", "No such file"]),
        ({"bad.yaml": "lr: 0.1\nepochs: [1, 2\n"}, ["--config", "bad.yaml"], ["bad.yaml:3: not valid YAML"]),
        ({"bad.json": '{"lr": 0.1,\n'}, ["--config", "bad.json"], ["bad.json:2: not valid JSON"]),
        ({"list.json": "[1, 2]"}, ["--config", "list.json"], ["list.json: expected a mapping", "got a list"]),
        ({"list.yaml": "- lr\n"}, ["--config", "list.yaml"], ["list.yaml: expected a mapping", "got a list"]),
        ({"typo.yaml": "learning_rate: 0.1\n"}, ["--config", "typo.yaml"], ["unknown option 'learning_rate'"]),
        ({"type.yaml": "epochs: abc\n"}, ["--config", "type.yaml"], ["epochs='abc' is not a valid int"]),
    ],
)
def test_a_config_file_that_cannot_be_used_is_one_clear_line_and_exit_2(tmp_path, monkeypatch, files, args, words):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    p = trainer([*SMALL, *args], tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.startswith("trainer: ") and p.stderr.count("\n") == 1, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("params", ['{"lr": 0.1', '["lr"]'])
def test_orch_params_that_are_not_a_json_mapping_are_one_clear_line_and_exit_2(tmp_path, params):
    p = trainer_call([*SMALL, "--out", str(tmp_path / "out")], timeout=120, ORCH_PARAMS_JSON=params)
    assert p.returncode == 2 and p.stderr.startswith("trainer: ORCH_PARAMS_JSON") and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--image-size", "4", "--crop-pad", "2"], ["--image-size 4: --model resnet9", "at least 8"]),
        # trains at --sizes 12 and 16, then evaluated at --image-size 4: this one used to crash after an epoch
        (["--preset", "digits", "--image-size", "4"], ["--image-size 4: --model resnet9"]),
        (["--sizes", "4@0,16@0.5"], ["--sizes '4@0,16@0.5' has 4", "at least 8"]),
        (["--val-size", "6"], ["--val-size 6: --model resnet9"]),
        (["--model", "airbench", "--image-size", "8", "--crop-pad", "2"], ["--model airbench", "at least 9"]),
        (["--preset", "fast-muon", "--image-size", "8"], ["--model airbench_muon", "at least 9"]),
        (["--crop-pad", "16"], ["--crop-pad 16", "smaller than --image-size 16"]),
    ],
)
def test_an_image_side_the_net_cannot_take_is_refused_before_training(tmp_path, args, words):
    p = trainer([*SMALL, *args], tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.startswith("trainer: ") and p.stderr.count("\n") == 1, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_each_net_takes_its_smallest_side_and_no_smaller():
    import torch

    from trainer import models
    from trainer.validate import MIN_SIDE, RANGES

    for name in models.MODELS:
        net = models.build(name, 10, width=0.125, depth=10, widen=1).eval()
        least = MIN_SIDE.get(name, RANGES["image_size"][0])
        with torch.no_grad():
            assert net(torch.zeros(2, 3, least, least)).shape == (2, 10), name
            if name in MIN_SIDE:
                with pytest.raises(RuntimeError):
                    net(torch.zeros(2, 3, least - 1, least - 1))
