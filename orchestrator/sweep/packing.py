"""Packing: several runs on one multi-GPU instance, when a run uses fewer GPUs than the instance has.

A sweep packs when its runs span one node and name `resources.gpus`, and some listed instance
type has at least twice that many GPUs. An instance of type T then holds gpus_of(T) // gpus runs,
each in its own slot: slot k sees GPUs k*gpus … (k+1)*gpus-1 through CUDA_VISIBLE_DEVICES. New
instances are of the type that holds the sweep's `max_parallel` runs for the least money per hour
(fewer instances on a tie); the others follow when it has no capacity. Pure functions; the aws
backend (backends/aws/pack.py) does the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.errors import OrchError

SLOTS_TAG = "orch:slots"  # slots of a packed instance
SLOT_TAG = "orch:slot:"  # + k: "<run>#<attempt>" while that run holds slot k


@dataclass(frozen=True)
class PackChoice:
    """One instance type as a home for packed runs."""

    instance_type: str
    slots: int  # runs one instance holds
    instances: int  # instances max_parallel runs need
    usd_per_h: float | None  # for those instances together (the type's cheapest spot price), None when unknown


def packs(resources, gpus_of_type: dict[str, int]) -> bool:
    gpus = resources.gpus if resources else None
    return bool(resources and resources.nodes == 1 and gpus and any(n >= 2 * gpus for n in gpus_of_type.values()))


def packed_gpus(resources) -> int:
    """The GPUs of each packed run: a sweep packs only when its runs name `resources.gpus` (packs)."""
    gpus = resources.gpus if resources else None
    if not gpus:
        raise OrchError("runs share an instance only when they name `resources.gpus`")
    return gpus


def rank(
    types: list[str], gpus_of_type: dict[str, int], price_of_type: dict[str, float | None], gpus: int, parallel: int
) -> list[PackChoice]:
    """The listed types that can hold a run, best home first: least money per hour for `parallel`
    runs, then fewest instances, then the order the sweep lists them in."""
    out = []
    for t in types:
        slots = gpus_of_type.get(t, 0) // gpus
        if slots < 1:
            continue
        n = math.ceil(parallel / slots)
        price = price_of_type.get(t)
        out.append(PackChoice(t, slots, n, round(n * price, 4) if price is not None else None))
    return sorted(
        out, key=lambda c: (c.usd_per_h is None, c.usd_per_h or 0.0, c.instances, types.index(c.instance_type))
    )


def visible_devices(slot: int, gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES of a slot."""
    return ",".join(str(slot * gpus + i) for i in range(gpus))


def describe(choices: list[PackChoice], gpus: int, parallel: int) -> list[str]:
    """The packing plan in words, for --dry-run."""
    if not choices:
        return []
    best = choices[0]
    price = f" at ${best.usd_per_h:.4f}/h" if best.usd_per_h is not None else ""
    lines = [
        f"packing: {best.slots} runs of {gpus} GPU(s) per {best.instance_type}; max_parallel {parallel} -> "
        f"{best.instances} instance(s){price} (each run sees its own CUDA_VISIBLE_DEVICES)"
    ]
    lines += [
        f"  then {c.instance_type}: {c.slots} per instance, {c.instances} instance(s)"
        + (f" at ${c.usd_per_h:.4f}/h" if c.usd_per_h is not None else "")
        for c in choices[1:]
    ]
    return lines
