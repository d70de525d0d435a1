"""The bundled trainer on the CPU: models, data, schedules, DDP, exact resume, checkpoints, metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from orchestrator.wait import retry_until
from trainer import checkpoint, data, models
from trainer.schedule import one_cycle, parse_points, step_value

ROOT = Path(__file__).resolve().parents[3]

# Small but real: 16 steps per epoch of a narrow resnet9 at 16 px, fp32, one thread (bitwise reproducible).
SMALL = [
    "--dataset",
    "synthetic",
    "--synthetic-train",
    "1024",
    "--image-size",
    "16",
    "--model",
    "resnet9",
    "--width",
    "0.25",
    "--batch-size",
    "64",
    "--epochs",
    "3",
    "--precision",
    "fp32",
    "--threads",
    "1",
    "--ckpt-every-s",
    "0",
    "--ckpt-every-epochs",
    "1",
    "--ckpt-keep",
    "10",
    "--seed",
    "5",
    "--lr",
    "0.2",
]
STEPS_PER_EPOCH = 16
# Where a test compares weights only (a resume, a world size, a rendezvous): 8 px. The same net and parameters (resnet9
# pools to 1x1 either way: DDP's buckets are the same), a step at about 40% of 16 px's CPU.
EIGHT_PX = [("8" if before == "--image-size" else a) for before, a in zip(["", *SMALL], SMALL)]


def trainer_env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("ORCH_PARAMS_JSON", None)
    env.pop("ORCH_RUN_DIR", None)
    env.update(extra)
    return env


def trainer_call(args, timeout=240, **env) -> subprocess.CompletedProcess:
    """`python -m trainer ARGS` to its end, whatever its exit status; forked from the worker's trainer fork server
    (tests/zygote.py) when it fits the environment: a process of its own, without importing torch again."""
    from tests.zygote import zygote_for

    full, argv = trainer_env(**env), [sys.executable, "-m", "trainer", *args]
    zygote = zygote_for(full, "trainer")
    if zygote is None:
        return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout)
    code, out, err, stuck = zygote.run(args, full, Path.cwd(), timeout)
    assert not stuck, f"the trainer still ran after {timeout} s; its stacks:\n{err[-6000:]}"
    return subprocess.CompletedProcess(argv, code, out, err)


def run_trainer(args, timeout=240, **env):
    p = trainer_call(args, timeout=timeout, **env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def metrics(out: Path):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path):
    return checkpoint.load(checkpoint.latest(out))["model"]


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_same_weights(a, b):
    assert same(a, b), [k for k in a if not torch.equal(a[k], b.get(k, torch.empty(0)))][:5]


# --- pieces ---------------------------------------------------------------------------------------


def test_the_trainers_sgd_steps_bitwise_as_torchs():
    from trainer.runtime import SGD

    def steps(cls):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        groups = [dict(params=list(net[0].parameters()), weight_decay=5e-4), dict(params=list(net[1:].parameters()))]
        opt = cls(groups, lr=0.1, momentum=0.9, nesterov=True)
        for i in range(4):
            opt.zero_grad()
            F.cross_entropy(net(torch.randn(16, 8)), torch.arange(16) % 3).backward()
            opt.param_groups[0]["lr"] = 0.1 / (i + 1)
            opt.step()
        return net.state_dict(), opt.state_dict()

    (ours, ours_opt), (theirs, theirs_opt) = steps(SGD), steps(torch.optim.SGD)
    assert_same_weights(ours, theirs)
    assert all(
        torch.equal(ours_opt["state"][k]["momentum_buffer"], v["momentum_buffer"])
        for k, v in theirs_opt["state"].items()
    )


STARTS_WITHOUT_DYNAMO = """
import runpy, sys
sys.argv = ["trainer", *sys.argv[1:]]
try:
    runpy.run_module("trainer", run_name="__main__")
finally:
    print("torch._dynamo imported:", "torch._dynamo" in sys.modules)
"""


def test_a_run_and_its_resume_do_not_import_torch_dynamo(tmp_path):
    # torch imports torch._dynamo lazily at an optimizer's first step or state_dict (1.8 s of CPU at every start of
    # every attempt); without --compile the trainer never needs it
    args = [*SMALL, "--epochs", "2", "--ema", "0.9", "--out", str(tmp_path / "run")]
    for extra in (["--max-steps", "20"], []):  # stop mid-epoch 2 with a checkpoint, then resume from it
        p = subprocess.run(
            [sys.executable, "-c", STARTS_WITHOUT_DYNAMO, *args, *extra, "--ckpt-every-s", "0.001"],
            env=trainer_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert "torch._dynamo imported: False" in p.stdout, p.stdout + p.stderr[-2000:]
    assert "resumed from" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("name", models.MODELS)
@pytest.mark.parametrize("size", [16, 24])
def test_models_forward_backward(name, size):
    torch.manual_seed(0)
    model = models.build(name, 10, width=0.25, depth=10, widen=1)
    x = torch.randn(4, 3, size, size)
    if isinstance(model, models.AirBench):
        model.init_whitening(x)
    out = model(x)
    assert out.shape == (4, 10)
    F.cross_entropy(out, torch.tensor([0, 1, 2, 3])).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_one_cycle_and_sizes():
    lrs = [one_cycle(t / 100, peak=1.0, warmup=0.25)[0] for t in range(101)]
    moms = [one_cycle(t / 100, peak=1.0, warmup=0.25)[1] for t in range(101)]
    assert lrs[0] == pytest.approx(0.04) and max(lrs) == pytest.approx(1.0) and lrs.index(max(lrs)) == 25
    assert (
        lrs[-1] < 0.01
        and moms[0] == pytest.approx(0.95)
        and moms[25] == pytest.approx(0.85)
        and moms[-1] == pytest.approx(0.95)
    )
    pts = parse_points("24@0,32@0.5")
    assert step_value(pts, 0.2) == 24 and step_value(pts, 0.5) == 32
    with pytest.raises(ValueError):
        parse_points("32@0.5")


def test_augment_is_a_function_of_the_step():
    x = torch.rand(8, 3, 16, 16)
    a = data.augment(x, 2, True, data.step_generator(1, 7))
    b = data.augment(x, 2, True, data.step_generator(1, 7))
    c = data.augment(x, 2, True, data.step_generator(1, 8))
    assert torch.equal(a, b) and not torch.equal(a, c) and a.shape == x.shape
    assert torch.equal(data.epoch_order(100, 3, 2), data.epoch_order(100, 3, 2))


def test_cifar10_loader_reads_the_real_format(tmp_path):
    data.write_cifar10_like(str(tmp_path), n_train=500, n_test=100)
    ds = data.load_cifar10(str(tmp_path), download=False)
    assert ds.train.images.shape == (500, 3, 32, 32) and ds.train.images.dtype == torch.uint8
    assert ds.test.labels.shape == (100,) and ds.test.labels.dtype == torch.int64
    with pytest.raises(FileNotFoundError):
        data.load_cifar10(str(tmp_path / "empty"), download=False)
    out = tmp_path / "run"
    run_trainer(
        [
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path),
            "--width",
            "0.125",
            "--batch-size",
            "100",
            "--epochs",
            "1",
            "--out",
            str(out),
            "--ckpt-every-epochs",
            "0",
        ]
    )
    assert metrics(out)[-1]["step"] == 5


# --- runs -----------------------------------------------------------------------------------------


def test_metrics_and_summary_schema(tmp_path):
    out = tmp_path / "run"
    run_trainer([*SMALL, "--epochs", "2", "--out", str(out), "--sizes", "24@0,32@0.5"])
    rows = metrics(out)
    assert len(rows) == 2
    for row in rows:
        assert {"step", "epoch", "elapsed_s", "lr", "train_loss", "test_acc", "images_per_s", "image_size"} <= set(row)
        assert 0 <= row["test_acc"] <= 1 and row["images_per_s"] > 0
    assert [r["image_size"] for r in rows] == [24, 32]
    summary = json.loads((out / "summary.json").read_text())
    assert {"final_acc", "best_acc", "time_to_target_s", "train_time_s", "world_size", "device", "precision"} <= set(
        summary
    )
    assert summary["precision"] == "fp32" and summary["world_size"] == 1 and summary["device"] == "cpu"
    config = json.loads((out / "config.json").read_text())
    assert config["sizes"] == "24@0,32@0.5" and config["code_sha256"]


def test_config_precedence_and_errors(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("epochs: 5\nlr: 0.3\n")
    params = json.dumps({"lr": 0.7, "seed": 3, "preset": "digits"})
    p = trainer_call(["--config", str(cfg_file), "--seed", "9", "--print-config"], timeout=60, ORCH_PARAMS_JSON=params)
    cfg = json.loads(p.stdout)
    assert (cfg["preset"], cfg["dataset"], cfg["epochs"], cfg["lr"], cfg["seed"]) == ("digits", "digits", 5, 0.7, 9)
    bad = trainer_call(["--print-config"], timeout=60, ORCH_PARAMS_JSON='{"learning_rate": 1}')
    assert bad.returncode != 0 and "unknown option 'learning_rate'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.timeout(600)  # two trainer runs, one after the other
@pytest.mark.parametrize("extra", [[], ["--ema", "0.9"]], ids=["plain", "ema"])
def test_resume_after_sigusr1_then_sigkill_is_bitwise_identical(tmp_path, extra):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    args = [
        *SMALL,
        "--epochs",
        "6",
        *extra,
    ]  # room for the signal to land mid-epoch however late a loaded machine sends it
    run_trainer([*args, "--out", str(ref)])

    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *args, "--out", str(cut), "--log-every", "1"],
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def step_now():  # the file may exist with no whole line yet (seen once in a fresh-clone run)
            try:
                rows = metrics(cut) if (cut / "metrics.jsonl").exists() else []
            except ValueError:
                return 0
            return rows[-1]["step"] if rows else 0

        retry_until(lambda: step_now() >= STEPS_PER_EPOCH + 3, 120, 0.05, "training to pass into epoch 2")
        at = step_now()
        proc.send_signal(signal.SIGUSR1)

        def sigusr1_checkpoint():  # the one mid-epoch (the epoch-end ones are there too)
            done = [
                int(p.name)
                for p in checkpoint.candidates(cut)
                if (p / checkpoint.MANIFEST).exists() and int(p.name) > at and int(p.name) % STEPS_PER_EPOCH
            ]
            return min(done) if done else None

        ckpt_step = retry_until(sigusr1_checkpoint, 60, 0.02, "the SIGUSR1 checkpoint")
        proc.kill()  # SIGKILL right after the checkpoint
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ckpt_step % STEPS_PER_EPOCH != 0, "the checkpoint should be mid-epoch"
    assert not (cut / "summary.json").exists()

    for later in checkpoint.candidates(cut):  # as if killed right after the SIGUSR1 checkpoint
        if int(later.name) > ckpt_step:
            shutil.rmtree(later)
    run_trainer([*args, "--out", str(cut)])  # --resume auto
    assert_same_weights(final_weights(ref), final_weights(cut))
    if extra:  # the evaluated weights are the EMA's: a resume that does not restore them ends elsewhere
        ema_ref, ema_cut = (checkpoint.load(checkpoint.latest(o))["ema"] for o in (ref, cut))
        assert ema_ref is not None and same(ema_ref, ema_cut)
    r, c = metrics(ref)[-1], metrics(cut)[-1]
    assert (r["step"], r["test_acc"], r["train_loss"]) == (c["step"], c["test_acc"], c["train_loss"])
    assert (
        json.loads((ref / "summary.json").read_text())["final_acc"]
        == json.loads((cut / "summary.json").read_text())["final_acc"]
    )


@pytest.mark.timeout(600)  # two trainer runs
def test_sigterm_checkpoints_and_exits_then_resumes(tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    run_trainer([*SMALL, "--out", str(ref)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *SMALL, "--out", str(cut), "--log-every", "1"],
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    retry_until(
        lambda: (cut / "metrics.jsonl").exists() and len((cut / "metrics.jsonl").read_text().splitlines()) >= 5,
        120,
        0.05,
        "steps",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143
    assert checkpoint.latest(cut) is not None
    run_trainer([*SMALL, "--out", str(cut)])
    assert_same_weights(final_weights(ref), final_weights(cut))


def test_corrupted_or_incomplete_newest_checkpoint_is_skipped(tmp_path):
    out = tmp_path / "run"
    run_trainer([*SMALL, "--epochs", "2", "--out", str(out)])
    newest, previous = checkpoint.candidates(out)[:2]
    assert int(newest.name) == 2 * STEPS_PER_EPOCH
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated upload
    assert checkpoint.latest(out) == previous
    ok, why = checkpoint.verify(newest)
    assert not ok and "bytes" in why
    # same size, flipped bytes: only the checksum can tell
    prev_state = previous / "state.pt"
    blob = bytearray(prev_state.read_bytes())
    blob[-100] ^= 0xFF
    (out / "ckpt" / "7").mkdir()
    (out / "ckpt" / "7" / "state.pt").write_bytes(b"no manifest: never committed")
    good = previous
    assert checkpoint.latest(out) == good
    prev_state.write_bytes(bytes(blob))
    assert checkpoint.latest(out) is None
    assert "checksum" in checkpoint.verify(previous)[1]


@pytest.mark.timeout(800)  # three trainer runs
def test_resume_skips_a_broken_checkpoint_and_still_matches(tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    run_trainer([*SMALL, "--out", str(ref)])
    run_trainer([*SMALL, "--out", str(cut)])
    newest = checkpoint.candidates(cut)[0]
    (newest / checkpoint.MANIFEST).unlink()  # as if the host died before the commit marker
    (newest / "state.pt").write_bytes(b"garbage")
    p = run_trainer([*SMALL, "--out", str(cut)])
    assert "skipping checkpoint" in p.stderr and f"resumed from {cut}/ckpt/{2 * STEPS_PER_EPOCH}" in p.stderr
    assert_same_weights(final_weights(ref), final_weights(cut))


@pytest.mark.timeout(600)  # the heaviest single trainer run here (about 40 s alone): room for a loaded machine
def test_digits_preset_reaches_97_percent(tmp_path):
    out = tmp_path / "digits"
    p = run_trainer(["--preset", "digits", "--out", str(out)], timeout=540)
    summary = json.loads((out / "summary.json").read_text())
    print(
        f"\ndigits: final {summary['final_acc']:.4f} best {summary['best_acc']:.4f} in {summary['train_time_s']:.1f} s "
        "training"
    )
    assert summary["final_acc"] >= 0.97, p.stderr[-2000:]


@pytest.mark.timeout(600)  # two trainer runs
def test_bf16_autocast_runs_on_cpu(tmp_path):
    out = tmp_path / "bf16"
    # 256 images, not SMALL's 1024: what is checked is the dtype autocast ran in (bf16 on a CPU without bf16
    # instructions is emulated, ~4x slower than fp32 — this test took 77 s of a 2-core suite)
    few = [*SMALL, "--epochs", "1", "--synthetic-train", "256"]
    run_trainer([*few, "--precision", "bf16", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "bf16" and summary["compute_dtype"] == "bfloat16"  # autocast really ran in bf16
    fp32 = tmp_path / "fp32"
    run_trainer([*few, "--out", str(fp32)])
    assert json.loads((fp32 / "summary.json").read_text())["compute_dtype"] == "float32"


def test_fp16_trains_with_loss_scaling(tmp_path):
    """fp16 autocast with a GradScaler that really scales (its state is in the checkpoint), on the CPU too."""
    out = tmp_path / "fp16"
    run_trainer([*SMALL, "--epochs", "1", "--synthetic-train", "256", "--precision", "fp16", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "fp16" and summary["compute_dtype"] == "float16"
    state = torch.load(checkpoint.latest(out) / "state.pt", weights_only=False)
    assert state["scaler"].get("scale", 0) > 1, state["scaler"]  # a disabled scaler saves {}


# Its C++ compile (inductor) is the suite's heaviest single step: 54 s of the whole machine alone, and it ran past
# pytest's 300 s beside two CPU hogs and three other workers (stop 40's loaded run). Each run gets what it needs.
# Inductor's cache goes to the test's own folder: torch's default (/tmp/torchinductor_$USER) outlives the test, so a
# second run on the same machine compiled nothing (48 s instead of 116-143 s): a time CI, always cold, never sees.
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_compile_trains_and_matches_eager_closely(tmp_path):
    """--compile goes through torch.compile (inductor, C++ on the CPU) and learns what eager learns; every
    image size of a progressive-resize run is compiled before the clock starts (none inside it), and the
    CUDA-graph mode is accepted and reported as not in use on the CPU."""
    args = [*SMALL, "--epochs", "2", "--synthetic-train", "256", "--sizes", "12@0,16@0.5"]
    run_trainer([*args, "--out", str(tmp_path / "eager")], timeout=240)
    p = run_trainer(
        [*args, "--compile", "true", "--compile-mode", "reduce-overhead", "--out", str(tmp_path / "compiled")],
        timeout=600,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    eager = json.loads((tmp_path / "eager" / "summary.json").read_text())
    compiled = json.loads((tmp_path / "compiled" / "summary.json").read_text())
    assert compiled.get("compiled") is True, p.stderr[-2000:]
    assert compiled["compile_mode"] == "reduce-overhead" and compiled["cuda_graphs"] is False
    assert compiled["late_compiles"] == 0 and compiled["compile_s"] > 0, compiled
    assert abs(compiled["final_acc"] - eager["final_acc"]) <= 0.1, (compiled, eager)


def test_an_unknown_compile_mode_is_refused_before_anything_runs(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            *SMALL,
            "--compile",
            "true",
            "--compile-mode",
            "fastest",
            "--out",
            str(tmp_path / "x"),
        ],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and "--compile-mode 'fastest'" in p.stderr and "reduce-overhead" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x").exists()


def test_warm_up_meets_every_shape_of_the_run_once():
    from trainer.schedule import Cursor, parse_points
    from trainer.warmup import shape_places

    cursor = Cursor(1000, 4, parse_points("200@0,100@0.5"))
    places = shape_places(cursor, parse_points("24@0,32@0.25"), cursor.place(0, 0))
    assert places == [(0, 0, 200), (1, 0, 200), (2, 0, 100)]  # (24, 200), (32, 200), (32, 100)
    assert shape_places(cursor, parse_points("24@0,32@0.25"), cursor.place(3, 0)) == [(3, 0, 100)]  # resumed late


def test_no_host_sync_inside_the_training_step(tmp_path, monkeypatch):
    """Reading a tensor on the host (.item(), float(), bool(), .tolist()) waits for the device, and so does
    moving a host tensor to it (.to(device), .cuda(), torch.tensor(..., device=)): on CUDA a pageable copy
    synchronises the stream. The step must do neither: over one epoch, a run of twice the steps makes
    exactly as many reads and as many moves. (On the CPU the moves are no-ops, but the calls are the
    same ones that would wait on a GPU.)"""
    from trainer.config import resolve_config
    from trainer.train import DEFAULTS, PRESETS, train

    reads, moves = [], []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _o=original, _n=name: (reads.append(_n), _o(self, *a))[1]
        )

    def is_device(v) -> bool:
        return isinstance(v, torch.device) or (isinstance(v, str) and v.split(":")[0] in ("cpu", "cuda"))

    def counted(original, name, kind):
        def call(*a, **k):
            if (
                kind == "method"
                and (name == "cuda" or any(is_device(v) for v in a[1:]) or k.get("device") is not None)
                or kind == "factory"
                and k.get("device") is not None
            ):
                moves.append(name)
            return original(*a, **k)

        return call

    for name in ("to", "cuda"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), name, "method"))
    for name in ("tensor", "as_tensor"):
        monkeypatch.setattr(torch, name, counted(getattr(torch, name), name, "factory"))

    def count(n_train: int, out: Path):
        cfg = resolve_config(
            DEFAULTS,
            PRESETS,
            [*SMALL, "--epochs", "1", "--synthetic-train", str(n_train), "--ema", "0.9", "--out", str(out)],
        )
        reads.clear(), moves.clear()
        train(cfg)
        return len(reads), len(moves)

    small, large = count(1024, tmp_path / "a"), count(2048, tmp_path / "b")  # 16 and 32 steps
    assert small[1] > 0, "the move counter saw nothing: the test no longer measures"
    assert small == large, f"(reads, moves) with 16 steps {small}, with 32 steps {large}"


# --- DDP ------------------------------------------------------------------------------------------


def _ddp_grads(rank, world, init, x, y, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = models.build("resnet9", 10, width=0.25).eval()  # BN on running stats: per-rank batch stats differ by design
    net = DDP(model)
    F.cross_entropy(net(x[rank::world]), y[rank::world]).backward()  # the trainer's sharding
    if rank == 0:
        torch.save({k: p.grad for k, p in model.named_parameters()}, out)
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_gradient_equals_single_process_gradient(tmp_path):
    import torch.multiprocessing as mp

    torch.manual_seed(1)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    torch.manual_seed(0)
    model = models.build("resnet9", 10, width=0.25).eval()
    F.cross_entropy(model(x), y).backward()
    single = {k: p.grad for k, p in model.named_parameters()}

    ctx = mp.get_context("spawn")
    init, out = f"file://{tmp_path}/rendezvous", tmp_path / "grads.pt"
    procs = [ctx.Process(target=_ddp_grads, args=(r, 2, init, x, y, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    got = torch.load(out)
    for k in single:
        assert torch.allclose(single[k], got[k], atol=1e-6, rtol=1e-5), k


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(400)
def test_two_process_torchrun_lands_in_the_same_band(tmp_path):
    args = ["--preset", "digits", "--epochs", "8", "--ckpt-every-epochs", "0"]
    one, two = tmp_path / "one", tmp_path / "two"
    run_trainer([*args, "--out", str(one)])
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "-m",
            "trainer",
            *args,
            "--out",
            str(two),
        ],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    print(f"\n1 process: {s1['final_acc']:.4f}, 2 processes: {s2['final_acc']:.4f}")
    assert s1["final_acc"] >= 0.95 and s2["final_acc"] >= 0.95
    assert abs(s1["final_acc"] - s2["final_acc"]) <= 0.03
    assert len(metrics(two)) == 8  # rank 0 alone writes metrics


@pytest.mark.timeout(400)
def test_bench_reports_throughput_and_ratio():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.bench",
            "--preset",
            "fast",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--batch-size",
            "32",
            "--width",
            "0.25",
            "--json",
        ],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["images_per_s"] > 0 and r["baseline_images_per_s"] > 0 and r["gflops_per_image_fwd"] > 0
    assert r["speedup_vs_baseline"] == pytest.approx(r["images_per_s"] / r["baseline_images_per_s"], rel=0.02)


def test_no_host_tensor_indexes_device_data(tmp_path):
    """Structural, so it holds on the CPU too: a tensor made on the host (a factory call without `device=`, or
    from numpy) and never moved is "host"; what is computed from it is host too. Indexing a tensor that is not
    host (the model's device) with a host index copies the index to the device and waits for it on CUDA: no
    such indexing anywhere in a run (a host-side permutation or crop index sliced into the step would be)."""
    import weakref

    from torch.overrides import TorchFunctionMode

    from trainer.config import resolve_config
    from trainer.train import DEFAULTS, PRESETS, train

    factories = {
        torch.tensor,
        torch.as_tensor,
        torch.arange,
        torch.randperm,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.full,
        torch.from_numpy,
        torch.linspace,
    }
    indexing = {
        torch.Tensor.__getitem__,
        torch.Tensor.index_select,
        torch.index_select,
        torch.gather,
        torch.Tensor.gather,
        torch.take,
        torch.Tensor.take,
        torch.Tensor.index_put_,
        torch.Tensor.__setitem__,
    }
    moves = {torch.Tensor.to, torch.Tensor.cuda}

    class HostTaint(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.host = {}  # id -> weakref: tensors compare elementwise, so no WeakSet
            self.bad = []
            self.made = 0

        def is_host(self, t) -> bool:
            ref = self.host.get(id(t))
            return ref is not None and ref() is t

        def _tensors(self, obj):
            if isinstance(obj, torch.Tensor):
                yield obj
            elif isinstance(obj, (list, tuple)):
                for o in obj:
                    yield from self._tensors(o)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in indexing and args and isinstance(args[0], torch.Tensor) and not self.is_host(args[0]):
                if any(
                    self.is_host(t) for t in self._tensors(args[1:]) if t.dtype in (torch.long, torch.int, torch.bool)
                ):
                    self.bad.append(getattr(func, "__name__", str(func)))
            out = func(*args, **kwargs)
            tensors_in = list(self._tensors(args)) + list(self._tensors(list(kwargs.values())))
            if func in factories and kwargs.get("device") is None:
                tainted = True
                self.made += 1
            elif func in moves:
                tainted = False  # moved to a device on purpose (a no-op on the CPU, a copy on CUDA)
            else:
                tainted = any(self.is_host(t) for t in tensors_in)
            for t in self._tensors(out):
                if tainted:
                    self.host[id(t)] = weakref.ref(t)
                else:
                    self.host.pop(id(t), None)
            return out

    cfg = resolve_config(DEFAULTS, PRESETS, [*SMALL, "--epochs", "1", "--ema", "0.9", "--out", str(tmp_path / "o")])
    mode = HostTaint()
    with mode:
        train(cfg)
    assert mode.made > 0, "no host tensor was seen: the test no longer measures"
    assert mode.bad == [], f"device data indexed by a host tensor: {mode.bad[:5]}"


def test_no_function_in_orch_or_the_trainer_is_over_80_lines():
    """A function longer than a screen is two functions (DESIGN, style)."""
    import ast

    long = []
    for path in sorted([*(ROOT / "trainer").glob("*.py"), *(ROOT / "orchestrator").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                where = path.relative_to(ROOT)
                long.append(f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


# --- checkpoints written by earlier versions ------------------------------------------------------

OLD_CHECKPOINTS = ROOT / "tests" / "trainer_checkpoints"


def _digest(state: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.timeout(300)  # one short trainer run
@pytest.mark.parametrize("name", ["resnet9-ema", "fast-muon"])
def test_a_checkpoint_an_earlier_trainer_wrote_resumes_to_the_weights_that_trainer_reached(tmp_path, name):
    """tests/trainer_checkpoints/<name>/ckpt/<step>/ was written mid-run by the trainer before its config and
    progress became dataclasses; expected.json holds what that trainer's uninterrupted run ended with. Resumed by
    today's trainer, the run continues from that step and ends with the same weights (bitwise, with the torch that
    wrote them), the same last metrics line and the same best accuracy."""
    expected = json.loads((OLD_CHECKPOINTS / name / "expected.json").read_text())
    out = tmp_path / "out"
    shutil.copytree(OLD_CHECKPOINTS / name, out, ignore=shutil.ignore_patterns("expected.json"))
    (saved,) = checkpoint.candidates(out)
    saved_step, saved_time = int(saved.name), checkpoint.load(saved)["progress"]["train_time"]
    p = run_trainer([*expected["args"], "--out", str(out)])
    assert f"(step {saved_step} of {expected['final_step']})" in p.stderr, p.stderr[-2000:]
    last = metrics(out)[-1]
    assert (last["step"], last["test_acc"]) == (expected["final_step"], expected["final_test_acc"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == expected["final_step"] and summary["best_acc"] == expected["best_acc"]
    assert summary["train_time_s"] > round(saved_time, 3)  # the training time goes on from the checkpoint's
    final = checkpoint.load(checkpoint.latest(out))
    # The same bits where the arithmetic is the writer's: its torch, on a CPU that rounds as its did — told by the
    # final train loss's bits, or, for a recipe whose loss restarts at a resume (None), by the CPU's kernels
    # (torch's capability): an AVX-512 AMD EPYC with the same torch already differs in the 7th digit.
    loss = expected["final_train_loss"]
    # An AVX2 AMD EPYC with that torch differs too (seen: another digest): the kernels alone do not tell, the vendor
    # with them does (inferred: every machine the bits matched on was an Intel one).
    same_cpu = (
        loss == last["train_loss"]
        if loss is not None
        else (cpu_kernels(), cpu_vendor()) == (expected.get("cpu", "AVX2"), expected.get("cpu_vendor", "GenuineIntel"))
    )
    if torch.__version__ == expected["torch"] and same_cpu:
        assert _digest(final["model"]) == expected["final_model_sha256"]
        if expected["final_ema_sha256"] is not None:
            assert _digest(final["ema"]) == expected["final_ema_sha256"]
    elif loss is not None:  # another torch or CPU rounds differently, but not by much
        assert last["train_loss"] == pytest.approx(loss, rel=1e-3)


def cpu_kernels() -> str:
    """The CPU kernels torch picked here (AVX2, AVX512, ...): one input to its rounding."""
    return torch.backends.cpu.get_cpu_capability()


def cpu_vendor() -> str:
    """The CPU's vendor (GenuineIntel, AuthenticAMD): another input (the math libraries pick code paths by it)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), "")
