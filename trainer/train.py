"""The bundled trainer's main loop. What it does and how to call it: `trainer.config.USAGE`
(`python -m trainer --help` prints it).
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

from . import checkpoint, data, models
from .config import resolve_config
from .runtime import (
    MetricsLog,
    Signals,
    StepTimer,
    check_compile_mode,
    compile_net,
    ema_update,
    fold_loss,
    graphs_compiled,
    param_groups,
    start_run,
    uses_cuda_graphs,
)
from .schedule import Cursor, LRSchedule, parse_points, step_value
from .warmup import shape_places, warm_up

# fmt: off
DEFAULTS = dict(
    dataset="cifar10",            # cifar10 | synthetic | digits | imagefolder (DIR/train/<class>/*, DIR/val/<class>/*)
    data_dir="~/.cache/orch/data",  # cifar-10-batches-py is there (downloaded when missing), or the image folder
    image_size=32,                # side the data set is loaded at (digits and synthetic are resized to it)
    model="resnet9",              # resnet9 | preact_resnet18 | wide_resnet | airbench | resnet18 | resnet50
    width=1.0,                    # channel multiplier (all but wide_resnet)
    depth=22,                     # wide_resnet depth (6n+4)
    widen=6,                      # wide_resnet widening factor
    concat_pool=True,             # preact_resnet18: concat average and max pooling
    epochs=24,                    # passes over the training set
    batch_size=512,               # global batch, split evenly over DDP ranks
    batch_sizes="",               # progressive batch 'B@progress,...' e.g. '512@0,224@0.45' (lr scales by B/batch_size)
    lr=0.4,                       # peak learning rate
    schedule="one_cycle",         # one_cycle | piecewise
    lr_points="0@0,1@0.2,0@1",    # piecewise: lr multiplier at progress points
    warmup=0.25,                  # one_cycle: fraction of training spent rising to the peak
    momentum_max=0.95,            # one_cycle: momentum at the start and end (cycled inversely to lr)
    momentum_min=0.85,            # one_cycle: momentum at the lr peak (also piecewise's momentum)
    nesterov=True,                # Nesterov momentum
    weight_decay=5e-4,            # on conv/linear weights only
    label_smoothing=0.0,          # cross-entropy label smoothing
    sizes="",                     # progressive resizing 'side@progress,...' e.g. '24@0,32@0.5' ('' = image_size)
    crop_pad=4,                   # random-crop reflect padding (0 = no crop); tensor data sets
    min_scale=0.35,               # imagefolder: random-resized-crop's smallest area fraction
    val_size=0,                   # imagefolder: validation side (0 = the last of --sizes)
    val_rect=False,               # imagefolder: validate aspect-preserving rectangles, not a center crop
    workers=0,                    # imagefolder: reader/decoder threads (0 = min(16, cores))
    flip=True,                    # random horizontal flips
    tta=False,                    # evaluate on image + its mirror
    ema=0.0,                      # EMA decay of weights used for evaluation (0 = off)
    whiten_bias_epochs=3,         # airbench: epochs the whitening conv's bias trains before it freezes
    precision="auto",             # auto | fp32 | fp16 | bf16 (auto: bf16 on Ampere+, fp16 older GPUs, fp32 CPU)
    compile=False,                # torch.compile the model (compiled before the clock starts: summary.json's compile_s)
    # default | reduce-overhead (CUDA graphs) | max-autotune (graphs + tuned kernels) | max-autotune-no-cudagraphs
    compile_mode="default",
    device="auto",                # auto | cpu | cuda
    threads=0,                    # CPU threads (0 = torch's default / OMP_NUM_THREADS)
    seed=0,                       # seeds init, data order and augmentation
    out="",                       # output folder ('' = $ORCH_RUN_DIR, else runs/trainer)
    resume="auto",                # auto (newest verified checkpoint in out) | never | a checkpoint folder
    ckpt_every_s=300.0,           # checkpoint at least this often (0 = not by time)
    ckpt_every_epochs=1,          # checkpoint every N epochs (0 = not by epoch)
    ckpt_keep=2,                  # checkpoints kept in out/ckpt
    target_acc=0.94,              # summary.json reports the training time to reach it
    log_every=0,                  # also write a metrics line every N steps (0 = once per epoch)
    max_steps=0,                  # stop after this many steps (0 = run all epochs); for tests
    synthetic_train=2048,         # synthetic: training images (test: a quarter)
    # airbench94_muon: the whole published recipe (trainer/recipe_muon.py), --preset fast-muon
    recipe="",
)
# fmt: on

PRESETS = {
    "dawnbench-rn18": dict(
        model="preact_resnet18",
        concat_pool=True,
        epochs=30,
        batch_size=512,
        lr=0.4,
        weight_decay=5e-4,
        sizes="24@0,32@0.5",
        label_smoothing=0.0,
    ),
    "dawnbench-wrn": dict(model="wide_resnet", depth=22, widen=6, epochs=30, batch_size=512, lr=0.4, weight_decay=5e-4),
    "resnet9": dict(model="resnet9", epochs=24, batch_size=512, lr=0.4, weight_decay=5e-4, label_smoothing=0.2),
    "fast-muon": dict(
        recipe="airbench94_muon",
        model="airbench_muon",
        epochs=8,
        batch_size=2000,
        label_smoothing=0.2,
        whiten_bias_epochs=3,
        crop_pad=2,
        flip=True,
        tta=True,
        ema=0.0,
    ),  # trainer/recipe_muon.py: the published recipe
    "fast": dict(
        model="airbench",
        epochs=10,
        batch_size=1024,
        lr=0.6,
        weight_decay=5e-4,
        label_smoothing=0.2,
        tta=True,
        ema=0.99,
        crop_pad=2,
        warmup=0.2,
    ),
    "imagenet-rn50": dict(
        dataset="imagefolder",
        model="resnet50",
        epochs=30,
        batch_size=1024,
        lr=1.0,
        warmup=0.15,
        batch_sizes="1024@0,512@0.45,256@0.9",
        sizes="128@0,224@0.45,288@0.9",
        val_size=288,
        label_smoothing=0.1,
        weight_decay=5e-5,
        min_scale=0.35,
        crop_pad=0,
        ckpt_every_s=900.0,
        target_acc=0.76,
    ),
    "imagenette-rn18": dict(
        dataset="imagefolder",
        model="resnet18",
        epochs=20,
        batch_size=256,
        lr=1.0,
        warmup=0.2,
        sizes="128@0,160@0.5,192@0.85",
        val_size=192,
        label_smoothing=0.1,
        weight_decay=5e-5,
        min_scale=0.35,
        crop_pad=0,
        target_acc=0.9,
    ),
    "digits": dict(
        dataset="digits",
        image_size=16,
        model="resnet9",
        width=0.25,
        epochs=12,
        batch_size=64,
        lr=0.2,
        crop_pad=1,
        flip=False,
        label_smoothing=0.1,
        weight_decay=5e-4,
        sizes="12@0,16@0.4",
        ckpt_every_s=0.0,
        ckpt_every_epochs=2,
    ),
}

log = logging.getLogger("trainer")


# --- data and evaluation -------------------------------------------------------------------------


def load_source(cfg: dict, device: torch.device):
    """Batches for training and evaluation: tensors held on the device, or an image folder read as it goes."""
    if cfg["dataset"] != "imagefolder":
        return data.TensorSource(
            data.load(
                cfg["dataset"], cfg["data_dir"], cfg["seed"], cfg["image_size"], synthetic_train=cfg["synthetic_train"]
            ),
            device,
            cfg,
        )
    from .imagefolder import DataError, ImageFolderSource, scan

    try:
        folder = scan(cfg["data_dir"])
    except DataError as exc:
        raise SystemExit(f"trainer: {exc}") from None
    if folder.ignored:
        log.info("%s: %d files are not JPEG or PNG by name; ignored", folder.root, folder.ignored)
    return ImageFolderSource(
        folder,
        device,
        min_scale=cfg["min_scale"],
        flip=cfg["flip"],
        workers=cfg["workers"],
        seed=cfg["seed"],
        val_rect=cfg["val_rect"],
    )


@torch.no_grad()
def evaluate(model: nn.Module, source, cfg, autocast, size: int, rank: int = 0, world: int = 1) -> float:
    """Accuracy on the test/validation set at `size` (each rank its shard, summed over ranks)."""
    model.eval()
    device = next(model.parameters()).device
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # hits, images: added up on the device, read once
    for x, y in source.eval_batches(size, rank, world):
        with autocast():
            logits = model(x).float()
            if cfg["tta"]:
                logits = logits + model(x.flip(3)).float()
        counts[0] += (logits.argmax(1) == y).sum()
        counts[1] += y.shape[0]
    if world > 1:
        counts = counts if device.type == "cuda" else counts.cpu()
        torch.distributed.all_reduce(counts)
    model.train()
    hits, seen = counts.tolist()
    return hits / max(seen, 1)


AGREE_EVERY = 8  # DDP: steps between the ranks' agreement on signals and the checkpoint clock


# --- training --------------------------------------------------------------------------------------


def train(cfg: dict) -> dict:
    check_compile_mode(cfg["compile_mode"])
    if cfg["recipe"]:  # a published recipe with a loop of its own
        from .recipe_muon import train_recipe

        return train_recipe(cfg)
    rank, world, local_rank, device, precision, out = start_run(cfg)
    is_main = rank == 0

    torch.manual_seed(cfg["seed"])
    source = load_source(cfg, device)
    model = models.build(
        cfg["model"], source.num_classes, cfg["width"], cfg["concat_pool"], cfg["depth"], cfg["widen"]
    ).to(device)
    if isinstance(model, models.AirBench):
        model.init_whitening(data.normalize(source.train.images[:5000], source.mean, source.std))
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    ema_model = copy.deepcopy(model).eval() if cfg["ema"] > 0 else None
    fused = (
        device.type == "cuda"
    )  # one kernel for the whole update on a GPU; the CPU keeps the for-each path (bitwise tests)
    optimizer = torch.optim.SGD(
        param_groups(model, cfg["weight_decay"]),
        lr=cfg["lr"],
        momentum=cfg["momentum_max"],
        nesterov=cfg["nesterov"],
        fused=fused or None,
    )
    scaler = torch.amp.GradScaler(
        device.type, enabled=precision == "fp16"
    )  # on the CPU too: fp16 needs loss scaling anywhere
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    net: nn.Module = model
    if cfg["compile"]:
        net = compile_net(net, cfg["compile_mode"])
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg["label_smoothing"])
    sched = LRSchedule(
        cfg["schedule"], cfg["lr"], cfg["warmup"], (cfg["momentum_max"], cfg["momentum_min"]), cfg["lr_points"]
    )
    sizes = parse_points(cfg["sizes"] or f"{cfg['image_size']}@0")
    eval_size = cfg["val_size"] or (int(sizes[-1][1]) if cfg["dataset"] == "imagefolder" else cfg["image_size"])
    B0, n = cfg["batch_size"], source.n_train
    batches = parse_points(cfg["batch_sizes"] or f"{B0}@0")
    for _, b in batches:
        if int(b) % world:
            raise SystemExit(f"trainer: batch size {int(b)} must divide evenly over {world} ranks")
    cursor = Cursor(n, cfg["epochs"], batches)
    total = cursor.total_steps()
    if total < 1:
        raise SystemExit(f"trainer: batch size {int(batches[0][1])} is larger than the training set ({n} images)")
    if cfg["max_steps"]:
        total = min(total, cfg["max_steps"])

    st = dict(
        step=0, epoch=0, pos=0, loss_sum=0.0, loss_n=0, train_time=0.0, best_acc=0.0, time_to_target=None, acc=None
    )
    resume_from = checkpoint.to_resume(cfg["resume"], out)
    if resume_from is not None:
        saved = checkpoint.load(resume_from, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        for group in optimizer.param_groups:  # a checkpoint made on another kind of device keeps this one's update path
            group["fused"] = fused or None
        scaler.load_state_dict(saved["scaler"])
        if ema_model is not None and saved.get("ema") is not None:
            ema_model.load_state_dict(saved["ema"])
        st.update(saved["progress"])
        if "pos" not in saved["progress"]:  # a checkpoint of a version without batch schedules: constant batch
            st["epoch"], i = divmod(st["step"], n // B0)
            st["pos"] = i * B0
        torch.set_rng_state(saved["rng"]["torch"])
        if is_main:
            log.info("resumed from %s (step %d of %d)", resume_from, st["step"], total)

    metrics = MetricsLog(out / "metrics.jsonl", is_main)
    sig = Signals()
    last_ckpt = time.time()

    def save_checkpoint():
        nonlocal last_ckpt
        if is_main:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "ema": ema_model.state_dict() if ema_model is not None else None,
                "progress": dict(st),
                "rng": {"torch": torch.get_rng_state()},
                "config": cfg,
            }
            folder = checkpoint.save(out, st["step"], state, keep=cfg["ckpt_keep"])
            log.info("checkpoint %s", folder)
        if world > 1:
            torch.distributed.barrier()
        last_ckpt = time.time()

    orders: dict = {}

    def batch_at(step: int, epoch: int, pos: int, b: int, size: int):
        """This rank's share of the global batch of `b` images at `pos` in the epoch's order (a function of seed and
        epoch)."""
        if epoch not in orders:
            orders.clear()
            orders[epoch] = data.epoch_order(n, cfg["seed"], epoch).to(device if source.on_device else "cpu")
        idx = orders[epoch][pos : pos + b][rank::world]
        return source.train_batch(idx, step, b, slice(rank, None, world), size, epoch=epoch, pos=pos)

    # Batches read from files are made one step ahead, on a thread, while the current step computes.
    ahead = ThreadPoolExecutor(1, thread_name_prefix="next-batch") if not source.on_device else None
    pending = None
    compute_dtype = ""
    epoch_images, epoch_time = 0, 0.0
    # Nothing in the step waits for the device: the loss adds up there and the clock is CUDA events,
    # both read once per metrics line; DDP ranks agree on signals every AGREE_EVERY steps.
    timer, loss_acc, ema_pairs = StepTimer(device), torch.zeros((), device=device, dtype=torch.float64), []
    place = cursor.place(st["epoch"], st["pos"])
    warm = shape_places(cursor, sizes, place) if cfg["compile"] else [place] if world > 1 and place else []
    graphs = uses_cuda_graphs(cfg, device)
    warm_s = (
        warm_up(net, model, optimizer, warm, batch_at, sizes, cursor, autocast, loss_fn, device, graphs)
        if warm
        else 0.0
    )
    compile_s = warm_s if cfg["compile"] else 0.0  # the DDP-only warm-up is not compilation
    compiled_before_clock = graphs_compiled() if cfg["compile"] else 0
    while st["step"] < total and place is not None:
        step = st["step"]
        epoch, pos, B = place
        if (
            isinstance(model, models.AirBench)
            and model.whiten.bias.requires_grad
            and epoch >= cfg["whiten_bias_epochs"]
        ):
            model.whiten.bias.requires_grad_(False)
        timer.start()
        if graphs:
            # the last step's graph outputs (its loss, read below) are done with
            torch.compiler.cudagraph_mark_step_begin()
        progress = cursor.progress(epoch, pos)
        lr, momentum = sched(progress)
        lr *= B / B0  # the linear scaling rule, when the batch size changes with the image size
        for group in optimizer.param_groups:
            group["lr"], group["momentum"] = lr, momentum
        size = int(step_value(sizes, progress))
        key = (step, epoch, pos, B, size)
        x, y = pending[1].result() if pending is not None and pending[0] == key else batch_at(*key)
        nxt = cursor.place(epoch, pos + B)
        pending = None
        if ahead is not None and nxt is not None and step + 1 < total:
            nkey = (step + 1, nxt[0], nxt[1], nxt[2], int(step_value(sizes, cursor.progress(nxt[0], nxt[1]))))
            pending = (nkey, ahead.submit(batch_at, *nkey))
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            logits = net(x)
            loss = loss_fn(logits, y)
        compute_dtype = compute_dtype or str(logits.dtype).removeprefix(
            "torch."
        )  # what autocast really ran in (no sync)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if ema_model is not None:
            ema_update(ema_model, model, cfg["ema"], ema_pairs)
        loss_acc += loss.detach()
        timer.stop()
        epoch_images += B
        st["loss_n"] += 1
        st["step"] = step + 1
        place = nxt
        st["epoch"], st["pos"] = (place[0], place[1]) if place is not None else (cfg["epochs"], 0)
        end_of_epoch = place is None or place[0] != epoch or st["step"] == total
        row = None
        if end_of_epoch or (cfg["log_every"] and st["step"] % cfg["log_every"] == 0):
            dt = timer.take()
            st["train_time"] += dt
            epoch_time += dt
            st["loss_sum"] += fold_loss(loss_acc, world)
            row = dict(
                step=st["step"],
                epoch=round(epoch + 1 if place is None or place[0] != epoch else epoch + (pos + B) / n, 4),
                elapsed_s=round(st["train_time"], 3),
                lr=lr,
                train_loss=st["loss_sum"] / max(st["loss_n"], 1),
                image_size=size,
                batch_size=B,
                images_per_s=round(epoch_images / max(epoch_time, 1e-9), 1),
                time=round(time.time(), 3),
            )  # wall clock: orch's wall time to a target
        if end_of_epoch:
            acc = evaluate(ema_model if ema_model is not None else model, source, cfg, autocast, eval_size, rank, world)
            st["acc"], st["best_acc"] = acc, max(st["best_acc"], acc)
            if st["time_to_target"] is None and acc >= cfg["target_acc"]:
                st["time_to_target"] = st["train_time"]
            row["test_acc"] = acc
            st["loss_sum"], st["loss_n"] = 0.0, 0
            epoch_images, epoch_time = 0, 0.0
            if is_main:
                log.info(
                    "epoch %.2f step %d/%d loss %.4f acc %.4f lr %.4f size %d %.0f img/s",
                    row["epoch"],
                    st["step"],
                    total,
                    row["train_loss"],
                    acc,
                    lr,
                    size,
                    row["images_per_s"],
                )
        if row is not None:
            if source.skipped:  # after the evaluation: its unreadable files count too
                row["skipped_files"] = source.skipped
            metrics.write(row)
            if not math.isfinite(
                row["train_loss"]
            ):  # every later step would be NaN too: a failed run, not a "succeeded" one
                raise SystemExit(
                    f"trainer: the training loss is {row['train_loss']} at step {st['step']} (epoch {row['epoch']}); "
                    f"the run failed. Lower --lr, check the data (skipped_files: {source.skipped}), or try --precision "
                    "fp32"
                )
        by_epoch = end_of_epoch and cfg["ckpt_every_epochs"] and (epoch + 1) % cfg["ckpt_every_epochs"] == 0
        by_time = bool(cfg["ckpt_every_s"]) and time.time() - last_ckpt >= cfg["ckpt_every_s"]
        want_ckpt, want_exit = sig.checkpoint or by_time, sig.exit
        if world > 1 and (end_of_epoch or st["step"] % AGREE_EVERY == 0):  # signals and clocks are per rank: agree
            flags = torch.tensor([int(want_ckpt), int(want_exit)], device=device if device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            want_ckpt, want_exit = bool(flags[0]), bool(flags[1])
        elif world > 1:
            want_ckpt = want_exit = False  # decided together at the next agreement step
        if want_ckpt or by_epoch:
            sig.checkpoint = False
            st["train_time"] += timer.take()
            st["loss_sum"] += fold_loss(loss_acc, world)
            save_checkpoint()
        if want_exit:
            log.info("SIGTERM: checkpointed at step %d, exiting", st["step"])
            sys.exit(143)

    if ahead is not None:
        ahead.shutdown(wait=True)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a late notice must not kill a finished run on its way out
    summary = dict(
        final_acc=st["acc"],
        best_acc=st["best_acc"],
        target_acc=cfg["target_acc"],
        time_to_target_s=st["time_to_target"],
        train_time_s=round(st["train_time"], 3),
        steps=st["step"],
        epochs=cfg["epochs"],
        world_size=world,
        device=str(device),
        precision=precision,
        model=cfg["model"],
        dataset=cfg["dataset"],
        compute_dtype=compute_dtype,
        skipped_files=source.skipped,
        compiled=bool(cfg["compile"]) and graphs_compiled() > 0,  # torch.compile really produced graphs
        compile_s=round(compile_s, 3),  # the warm-up compilation (each shape), outside train_time_s
        compile_mode=cfg["compile_mode"] if cfg["compile"] else "",
        cuda_graphs=graphs,
        late_compiles=graphs_compiled() - compiled_before_clock if cfg["compile"] else 0,
    )  # inside the clock: should be 0
    if is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(
            "done: final acc %.4f, best %.4f, %.1f s training",
            summary["final_acc"] or 0,
            summary["best_acc"],
            summary["train_time_s"],
        )
    # the DDP reducer (its pending gloo work) goes first, then, all ranks done, the group: else gloo can abort at exit
    if world > 1:
        del net
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    cfg = resolve_config(DEFAULTS, PRESETS, sys.argv[1:] if argv is None else argv)
    if cfg is None:
        return 0
    from .imagefolder import DataError

    try:
        train(cfg)
    except DataError as exc:  # a data set that cannot be read on: a clear line, exit 1, no traceback
        raise SystemExit(f"trainer: {exc}") from None
    return 0
