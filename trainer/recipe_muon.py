"""`--preset fast-muon`: the recipe of Keller Jordan's airbench94_muon.py (94.01% mean on CIFAR-10 in
8 epochs; github.com/KellerJordan/cifar10-airbench), inside the trainer's conventions (config,
metrics.jsonl, summary.json, verified checkpoints, SIGUSR1/SIGTERM, exact resume).

The recipe, as published:
- the net: models.AirBench(muon=True) — 2x2 patch-whitening conv (its bias trains for the first 3
  epochs only), three conv groups of 64/256/256 with bias-only BatchNorm (momentum 0.6, eps 1e-12)
  and GELU, a 3x3 max-pool, a bias-free linear head whose output is divided by its width;
- the optimizers: Muon (trainer/muon.py) for the conv filters, lr 0.24, momentum 0.6, Nesterov;
  SGD (momentum 0.85, Nesterov) for the whitening bias and the BatchNorm biases (lr 0.053) and for
  the head (lr 0.67), weight decay 2e-6 x batch per example, decoupled (weight_decay = wd / lr);
  every lr falls linearly to 0 over training, the whitening bias's over its 3 epochs;
- the data: batch 2000 (the last partial batch dropped), 8 epochs; normalized once, flipped at
  random once, reflect-padded by 2 once; each epoch a random translation of up to 2 pixels per
  image, the whole set mirrored every other epoch (alternating flips), shuffled;
- the loss: cross-entropy summed over the batch, label smoothing 0.2;
- the evaluation: test-time augmentation level 2 (the image and its mirror, each also translated
  by one pixel up-left and down-right, reflect-padded), in batches of 2000.

Differences, all of them: arithmetic is autocast (bf16 on Ampere or newer, fp16 with loss scaling
on older GPUs, fp32 on the CPU) over fp32 weights, where the script keeps the weights in fp16;
the script compiles its model (`--compile true` does here, outside the training time); random
numbers come from generators seeded by (seed, epoch), so a resumed run draws the same crops,
flips and order; one process only (the recipe is single-GPU: for DDP use `--preset fast`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import checkpoint, data, models
from .muon import Muon
from .runtime import MetricsLog, Signals, StepTimer, compile_net, graphs_compiled, start_run, uses_cuda_graphs

log = logging.getLogger("trainer")

FILTER_LR, BIAS_LR, HEAD_LR = 0.24, 0.053, 0.67
SGD_MOMENTUM, MUON_MOMENTUM = 0.85, 0.6
WD_PER_EXAMPLE = 2e-6
TRANSLATE = 2
EVAL_BATCH = 2000


def epoch_images(padded: torch.Tensor, size: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's training images: each a random translation (of up to the padding) of its padded,
    once-flipped self, all of them mirrored on odd epochs."""
    g = data.epoch_generator(seed, epoch)
    n, r = padded.shape[0], (padded.shape[-1] - size) // 2
    shifts = torch.randint(-r, r + 1, (n, 2), generator=g).to(padded.device)
    out = torch.empty(n, padded.shape[1], size, size, dtype=padded.dtype, device=padded.device)
    for sy in range(-r, r + 1):  # one batched copy per offset
        for sx in range(-r, r + 1):
            hit = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            out[hit] = padded[hit, :, r + sy : r + sy + size, r + sx : r + sx + size]
    return out.flip(-1) if epoch % 2 == 1 else out


def tta_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Level 2: the mirror-averaged logits of the image, averaged with those of its two one-pixel translations."""

    def mirrored(v):
        return 0.5 * model(v).float() + 0.5 * model(v.flip(-1)).float()

    padded = F.pad(x, (1,) * 4, "reflect")
    size = x.shape[-1]
    shifted = 0.5 * (mirrored(padded[:, :, :size, :size]) + mirrored(padded[:, :, 2 : size + 2, 2 : size + 2]))
    return 0.5 * mirrored(x) + 0.5 * shifted


@torch.no_grad()
def evaluate(model, images, labels, autocast) -> float:
    model.eval()
    hits = torch.zeros((), dtype=torch.int64, device=labels.device)
    for x, y in zip(images.split(EVAL_BATCH), labels.split(EVAL_BATCH)):
        with autocast():
            hits += (tta_logits(model, x).argmax(1) == y).sum()
    model.train()
    return hits.item() / len(labels)


def optimizers(model: models.AirBench, batch: int, device: torch.device):
    wd = WD_PER_EXAMPLE * batch
    norm_biases = [p for n, p in model.named_parameters() if ".bn" in n and p.requires_grad]
    filters = [p for p in model.parameters() if p.ndim == 4 and p.requires_grad]
    groups = [
        dict(params=[model.whiten.bias], lr=BIAS_LR, weight_decay=wd / BIAS_LR),
        dict(params=norm_biases, lr=BIAS_LR, weight_decay=wd / BIAS_LR),
        dict(params=[model.fc.weight], lr=HEAD_LR, weight_decay=wd / HEAD_LR),
    ]
    sgd = torch.optim.SGD(
        groups, momentum=SGD_MOMENTUM, nesterov=True, **({"fused": True} if device.type == "cuda" else {})
    )
    muon = Muon(filters, lr=FILTER_LR, momentum=MUON_MOMENTUM, nesterov=True)
    for opt in (sgd, muon):
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return sgd, muon


def train_recipe(cfg: dict) -> dict:
    if cfg["recipe"] != "airbench94_muon":
        raise SystemExit(
            f"trainer: unknown --recipe {cfg['recipe']!r}: use airbench94_muon (--preset fast-muon), or none"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit(
            "trainer: --preset fast-muon is the single-GPU airbench94_muon recipe; under torchrun use --preset fast"
        )
    _, _, _, device, precision, out = start_run(cfg)
    torch.manual_seed(cfg["seed"])
    ds = data.load(
        cfg["dataset"], cfg["data_dir"], cfg["seed"], cfg["image_size"], synthetic_train=cfg["synthetic_train"]
    )
    size, B = ds.train.images.shape[-1], cfg["batch_size"]
    train_x = data.normalize(ds.train.images.to(device), ds.mean, ds.std)
    flip_once = torch.rand(len(train_x), generator=torch.Generator().manual_seed(cfg["seed"])).to(device) < 0.5
    padded = F.pad(torch.where(flip_once.view(-1, 1, 1, 1), train_x.flip(-1), train_x), (TRANSLATE,) * 4, "reflect")
    train_y, test_x, test_y = (
        ds.train.labels.to(device),
        data.normalize(ds.test.images.to(device), ds.mean, ds.std),
        ds.test.labels.to(device),
    )
    model = models.build("airbench_muon", ds.num_classes, cfg["width"]).to(device)
    model.init_whitening(train_x[:5000])
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    sgd, muon = optimizers(model, B, device)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def autocast():
        return torch.autocast(device.type, dtype=amp, enabled=amp is not None)

    net = compile_net(model, cfg["compile_mode"]) if cfg["compile"] else model
    graphs = uses_cuda_graphs(cfg, device)
    per_epoch = len(train_x) // B
    if per_epoch < 1:
        raise SystemExit(f"trainer: batch size {B} is larger than the training set ({len(train_x)} images)")
    total = math.ceil(cfg["epochs"] * per_epoch)
    bias_steps = math.ceil(cfg["whiten_bias_epochs"] * per_epoch)
    stop_at = (
        min(total, cfg["max_steps"]) if cfg["max_steps"] else total
    )  # max_steps ends early; the schedule stays the recipe's
    st = dict(step=0, train_time=0.0, best_acc=0.0, acc=None, time_to_target=None)
    found = checkpoint.to_resume(cfg["resume"], out)
    if found is not None:
        saved = checkpoint.load(found, map_location=device)
        model.load_state_dict(saved["model"])
        sgd.load_state_dict(saved["sgd"])
        muon.load_state_dict(saved["muon"])
        scaler.load_state_dict(saved["scaler"])
        st.update(saved["progress"])
        log.info("resumed from %s (step %d of %d)", found, st["step"], total)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg["label_smoothing"], reduction="sum")
    metrics, sig, timer = MetricsLog(out / "metrics.jsonl", True), Signals(), StepTimer(device)
    compile_s = 0.0
    if cfg[
        "compile"
    ]:  # compiled before the clock, on a throwaway copy of the state: with the whitening bias trained and frozen
        t0, saved_sd = time.perf_counter(), {k: v.clone() for k, v in model.state_dict().items()}
        for trains_bias in [
            t
            for t in sorted({st["step"] < bias_steps, stop_at - 1 < bias_steps}, reverse=True)
            for _ in range(1 + graphs)
        ]:
            if graphs:  # cudagraph trees run a graph once before recording it: twice each, so both happen here
                torch.compiler.cudagraph_mark_step_begin()
            model.whiten.bias.requires_grad_(trains_bias)
            with autocast():
                loss_fn(net(padded[:B, :, TRANSLATE:-TRANSLATE, TRANSLATE:-TRANSLATE]), train_y[:B]).backward()
            model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        model.load_state_dict(saved_sd)
        compile_s = time.perf_counter() - t0

    def save():
        state = {
            "model": model.state_dict(),
            "sgd": sgd.state_dict(),
            "muon": muon.state_dict(),
            "scaler": scaler.state_dict(),
            "progress": dict(st),
            "config": cfg,
        }
        log.info("checkpoint %s", checkpoint.save(out, st["step"], state, keep=cfg["ckpt_keep"]))

    loss_acc, last_ckpt, epoch_cache = torch.zeros((), device=device, dtype=torch.float64), time.time(), {}
    window = [0, 0.0]  # steps and seconds since the last metrics line
    while st["step"] < stop_at:
        step = st["step"]
        epoch, i = divmod(step, per_epoch)
        if epoch not in epoch_cache:
            epoch_cache.clear()
            order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(cfg["seed"] * 31 + epoch)).to(
                device
            )
            epoch_cache[epoch] = (epoch_images(padded, size, cfg["seed"], epoch), order)
        images, order = epoch_cache[epoch]
        idx = order[i * B : (i + 1) * B]
        model.whiten.bias.requires_grad_(step < bias_steps)
        sgd.param_groups[0]["lr"] = BIAS_LR * max(0.0, 1 - step / bias_steps)
        for group in sgd.param_groups[1:] + muon.param_groups:
            group["lr"] = group["initial_lr"] * (1 - step / total)
        timer.start()
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        x = images[idx]
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            loss = loss_fn(net(x), train_y[idx])
        scaler.scale(loss).backward()
        for opt in (sgd, muon):
            scaler.step(opt)
        scaler.update()
        model.zero_grad(set_to_none=True)
        loss_acc += loss.detach()
        timer.stop()
        st["step"] = step + 1
        end_of_epoch = st["step"] % per_epoch == 0 or st["step"] == stop_at
        window[0] += 1
        if end_of_epoch or (cfg["log_every"] and st["step"] % cfg["log_every"] == 0):
            dt = timer.take()
            st["train_time"] += dt
            window[1] += dt
            row = dict(
                step=st["step"],
                epoch=round(st["step"] / per_epoch, 4),
                elapsed_s=round(st["train_time"], 3),
                lr=muon.param_groups[0]["lr"],
                train_loss=float(loss_acc) / (B * window[0]),
                images_per_s=round(window[0] * B / max(window[1], 1e-9), 1),
                time=round(time.time(), 3),
            )  # wall clock: orch's wall time to a target
            loss_acc.zero_()
            window[:] = [0, 0.0]
            if end_of_epoch:
                acc = evaluate(model, test_x, test_y, autocast)
                st["acc"], st["best_acc"] = acc, max(st["best_acc"], acc)
                if st["time_to_target"] is None and acc >= cfg["target_acc"]:
                    st["time_to_target"] = st["train_time"]
                row["test_acc"] = acc
                log.info(
                    "epoch %.2f step %d/%d loss %.4f acc %.4f", row["epoch"], st["step"], total, row["train_loss"], acc
                )
            metrics.write(row)
        by_epoch = (
            end_of_epoch and cfg["ckpt_every_epochs"] and (st["step"] // per_epoch) % cfg["ckpt_every_epochs"] == 0
        )
        by_time = bool(cfg["ckpt_every_s"]) and time.time() - last_ckpt >= cfg["ckpt_every_s"]
        if sig.checkpoint or by_epoch or by_time:
            sig.checkpoint = False
            dt = timer.take()
            st["train_time"] += dt
            window[1] += dt
            save()
            last_ckpt = time.time()
        if sig.exit:
            log.info("SIGTERM: checkpointed at step %d, exiting", st["step"])
            raise SystemExit(143)
    summary = dict(
        final_acc=st["acc"],
        best_acc=st["best_acc"],
        target_acc=cfg["target_acc"],
        time_to_target_s=st["time_to_target"],
        train_time_s=round(st["train_time"], 3),
        steps=st["step"],
        epochs=cfg["epochs"],
        world_size=1,
        device=str(device),
        precision=precision,
        model="airbench_muon",
        dataset=cfg["dataset"],
        recipe="airbench94_muon",
        compiled=bool(cfg["compile"]) and graphs_compiled() > 0,
        compile_s=round(compile_s, 3),
        compile_mode=cfg["compile_mode"] if cfg["compile"] else "",
        cuda_graphs=graphs,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info(
        "done: final acc %.4f, best %.4f, %.1f s training",
        summary["final_acc"] or 0,
        summary["best_acc"],
        summary["train_time_s"],
    )
    return summary
