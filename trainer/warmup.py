"""What runs before the clock starts: a step of each input shape, so compilation and DDP's bucket
layout are done outside the training time, with the model put back as it was."""

from __future__ import annotations

import copy
import time

import torch

from .schedule import step_value


def warm_up(
    net, model, optimizer, places, batch_at, sizes, cursor, autocast, loss_fn, device, graphs: bool = False
) -> float:
    """torch.compile compiles on first use (once per input shape: each image and batch size of the run), and DDP lays
    out its gradient buckets by the first backward (with 3+ ranks, another layout sums in another order): a step of
    each shape at `places` before the clock starts, then the model (BatchNorm statistics too) is put back as it was,
    so warm-up changes nothing and a resumed run reduces as the run it continues. With CUDA graphs each shape runs
    twice: inductor's cudagraph trees run a new graph once before they record it, and the record is replayed later
    (load_state_dict copies into the same parameter storage the graphs read)."""
    saved = copy.deepcopy(model.state_dict())
    t0 = time.perf_counter()
    for epoch, pos, b in [p for p in places for _ in range(2 if graphs else 1)]:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        x, y = batch_at(-1, epoch, pos, b, int(step_value(sizes, cursor.progress(epoch, pos))))
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast():
            loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    model.load_state_dict(saved)
    return time.perf_counter() - t0


def shape_places(cursor, sizes, place) -> list:
    """The first step of each (image size, batch size) the run will meet from `place` on."""
    seen, firsts = set(), []
    while place is not None:
        shape = (int(step_value(sizes, cursor.progress(place[0], place[1]))), place[2])
        if shape not in seen:
            seen.add(shape)
            firsts.append(place)
        place = cursor.place(place[0], place[1] + place[2])
    return firsts
