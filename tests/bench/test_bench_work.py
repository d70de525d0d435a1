"""Benchmark: buying work vs buying hours (backends/aws/cloud/worth.py), on a simulated sweep of 40 runs over 4 pools
with known prices, work rates and reclaim rates, both policies on the same seeded reclaims, in one run.

Each pool gives an attempt its instance at once (capacity never runs out here); an attempt works at its pool's rate
until its run is done or the pool reclaims it (exponential, per pool's rate); a reclaim loses the work since the last
checkpoint, and every attempt pays a boot and restore. `price` takes the cheapest pool by the hour (EC2's own
ranking); `work` asks backends/aws/cloud/worth.py what each pool is worth given only what the sweep has measured so
far (its finished attempts' rates per type, the ledger's reclaims) and takes the lowest price per weight, as EC2 does
with WeightedCapacity. Prints dollars and wall time of each, and the ratio. Run it with:

    .venv/bin/python -m pytest tests/bench/test_bench_work.py -s -m bench
"""

from __future__ import annotations

import heapq
import json
import random

import pytest

from orchestrator.backends.aws.cloud import worth

pytestmark = pytest.mark.bench

RUNS, WORK, PARALLEL = 40, 10.0, 4  # runs, units of work each, at once
BOOT_H, CKPT_H = 0.05, 0.1  # boot and restore of each attempt; hours between checkpoints
SEEDS = range(5)

# (type, AZ, $/h, units/h, reclaims/h)
MIXED = [
    ("g6.xlarge", "a", 0.40, 10.0, 0.2),  # cheapest hour, half the speed
    ("g6.xlarge", "b", 0.38, 10.0, 3.0),  # cheaper still, and reclaimed every 20 minutes
    ("g5.xlarge", "a", 0.45, 20.0, 0.2),
    ("g5.xlarge", "b", 0.48, 20.0, 0.2),
]
EQUAL = [(t, az, price, 10.0, 0.2) for t, az, price, _, _ in MIXED]  # price alone is right: every rate alike
CALM = [(t, az, price, rate, 0.2) for t, az, price, rate, _ in MIXED]  # the rates alone: no pool reclaimed more


def simulate(pools, policy: str, seed: int) -> tuple[float, float]:
    """(dollars, wall hours) of the sweep under `policy` ("price" or "work")."""
    rng = random.Random(seed)
    spec = {(t, az): (price, rate, lam) for t, az, price, rate, lam in pools}
    left = {r: WORK for r in range(RUNS)}
    queue = list(range(RUNS))
    events: list[tuple[float, int, int]] = []  # (end, slot, run)
    measured: dict[str, dict] = {}  # rates.json's attempts, as the controller knows them when it acquires
    ledger: dict[str, dict] = {}
    ended: list[tuple[float, str, dict, dict]] = []  # (end, key, measurement, ledger entry): known from `end` on
    dollars, n = 0.0, 0

    def choose(now: float) -> tuple[str, str]:
        for end, key, m, entry in list(ended):
            if end <= now:
                measured[key] = m
                ledger[key] = entry
                ended.remove((end, key, m, entry))
        if policy == "price":
            return min(spec, key=lambda p: spec[p][0])
        tried: dict[str, int] = {}
        for e in ledger.values():
            tried[e["type"]] = tried.get(e["type"], 0) + 1
        for _end, _k, _m, e in ended:  # attempts still running count as tried (the ledger has their instance)
            tried[e["type"]] = tried.get(e["type"], 0) + 1
        ranked = worth.rank(
            list(spec), lambda t, az: spec[(t, az)][0], worth.rates(measured), tried, ledger, now * 3600,
            worth.loss_seconds([BOOT_H * 3600], CKPT_H * 3600),
        )  # fmt: skip
        weights = worth.weights(ranked)
        return min(spec, key=lambda p: spec[p][0] / weights.get(p, 1.0))

    def start(slot: int, run: int, now: float) -> None:
        nonlocal dollars, n
        pool = choose(now)
        price, rate, lam = spec[pool]
        need = left[run] / rate
        reclaim = rng.expovariate(lam) if lam > 0 else float("inf")
        worked = min(need, reclaim)
        done = rate * worked
        kept = done if worked == need else (done // (rate * CKPT_H)) * rate * CKPT_H
        left[run] -= kept
        end = now + BOOT_H + worked
        dollars += price * (BOOT_H + worked)
        n += 1
        key = f"{run}#{n}"
        entry = {"type": pool[0], "az": pool[1], "start": now * 3600, "end": end * 3600}
        if worked < need:
            entry["reclaimed"] = end * 3600
        ended.append((end, key, {"type": pool[0], "work": done, "seconds": worked * 3600}, entry))
        heapq.heappush(events, (end, slot, run))

    for slot in range(PARALLEL):
        start(slot, queue.pop(0), 0.0)
    wall = 0.0
    while events:
        now, slot, run = heapq.heappop(events)
        wall = max(wall, now)
        if left[run] > 1e-9:
            queue.insert(0, run)  # reclaimed: the run goes on, first
        if queue:
            start(slot, queue.pop(0), now)
    return dollars, wall


def figures(pools) -> dict:
    out = {}
    for policy in ("price", "work"):
        runs = [simulate(pools, policy, seed) for seed in SEEDS]
        out[policy] = {
            "dollars": round(sum(d for d, _ in runs) / len(runs), 2),
            "wall_h": round(sum(w for _, w in runs) / len(runs), 2),
        }
    out["work_over_price_dollars"] = round(out["work"]["dollars"] / out["price"]["dollars"], 3)
    return out


def test_work_per_dollar_against_price_on_a_mixed_and_an_equal_mix():
    mixed, equal, calm = figures(MIXED), figures(EQUAL), figures(CALM)
    print(
        json.dumps({"mixed rates (4 pools)": mixed, "equal rates": equal, "mixed rates, no pool reclaimed more": calm})
    )
    assert mixed["work_over_price_dollars"] <= 0.75  # the goal: at least 25% fewer dollars for the same runs
    assert equal["work_over_price_dollars"] <= 1.05  # and never more than 5% worse where price alone is right
