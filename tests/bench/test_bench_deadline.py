"""Benchmark: `deadline:`'s rule (control/schedule.py, Uniform Progress) against spot only and all on-demand, on 120
seeded spot-availability traces, in one run.

The model (documented in docs/guides/deadline.md): one zone's spot capacity alternates between available and
unavailable, each spell exponential (available: a mean of 1-6 h per trace; an outage: 10 min to 4 h), so a trace
has spot from under a third of the time to nearly always; while available, each spot instance is also reclaimed at
0.2-1 per hour; an outage reclaims every spot instance at once and refuses new ones. The sweep: 16 runs of 2 h of
work, 4 at a time, a checkpoint every 15 min (a reclaim loses the work since), 6 min to move a run (boot + restore),
spot $1/h, on-demand $3/h, a deadline 1.5x the all-on-demand time (4 rounds of 2 h 6 min: 8 h 24 min -> 12 h 36 min).
Time steps of one minute.

- spot only: a run takes spot whenever there is some, else waits;
- on-demand: every run on-demand from the start;
- deadline: each minute the controller's own `plan()` names the waiting runs that must go on-demand now; the others
  take spot when there is some; a run on on-demand stays there until it ends.

Prints the fraction of deadlines met and the dollars as a fraction of all on-demand, over every trace and over those
where spot was available at least half the time. Run it with:

    .venv/bin/python -m pytest tests/bench/test_bench_deadline.py -s -m bench
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import pytest

from orchestrator.control.schedule import RunWork, plan

pytestmark = pytest.mark.bench

RUNS, WORK_MIN, SLOTS = 16, 120, 4  # runs, minutes of work each, at once
CKPT_MIN, SWITCH_MIN = 15, 6
SPOT, OD = 1.0, 3.0  # $ per hour
TRACES = 120
ON_DEMAND_MIN = math.ceil(RUNS / SLOTS) * (WORK_MIN + SWITCH_MIN)  # the sweep all on-demand: 8 h 24 min
SLACKS = (1.5, 1.75, 2.0)  # deadlines as multiples of it


@dataclass
class Run:
    left: float = WORK_MIN  # minutes of work left
    since_ckpt: float = 0.0
    where: str = ""  # "", "spot", "od"
    booting: float = 0.0  # minutes of boot + restore left


def trace(seed: int, minutes: int) -> tuple[list[bool], float]:
    """(spot available per minute, reclaims per hour while available) of one seeded trace."""
    rng = random.Random(seed)
    up_mean, down_mean = rng.uniform(60, 360), rng.uniform(10, 240)
    up, out, t = rng.random() < up_mean / (up_mean + down_mean), [], 0
    while t < minutes:
        spell = max(1, round(rng.expovariate(1 / (up_mean if up else down_mean))))
        out += [up] * spell
        t += spell
        up = not up
    return out[:minutes], rng.uniform(0.2, 1.0)


def simulate(policy: str, seed: int, deadline_min: float) -> tuple[bool, float]:
    """(deadline met, dollars) of the sweep under `policy` on trace `seed`."""
    horizon = int(deadline_min * 4)
    spot, reclaims_h = trace(seed, horizon)
    rng = random.Random(seed * 7919 + 1)
    runs = [Run() for _ in range(RUNS)]
    dollars = 0.0
    for minute in range(horizon):
        live = [r for r in runs if r.left > 0]
        if not live:
            return minute <= deadline_min, dollars
        for r in live:  # reclaims: an outage takes every spot instance, and each may be taken on its own
            if r.where == "spot" and (not spot[minute] or rng.random() < reclaims_h / 60):
                r.left = min(WORK_MIN, r.left + r.since_ckpt)
                r.where, r.since_ckpt, r.booting = "", 0.0, 0.0
        must, move, back = _on_demand_now(policy, live, minute, deadline_min)
        for r in live:  # told to move (to on-demand, or back to spot): it checkpoints and waits for its next host
            if id(r) in move or id(r) in back:
                r.where, r.since_ckpt, r.booting = "", 0.0, 0.0
                if id(r) in move:
                    must.add(id(r))
        waiting = [r for r in live if not r.where]
        free = SLOTS - (len(live) - len(waiting))
        # as orch's controller: the runs it must buy on-demand, then those with progress (retried) before new ones
        for r in sorted(waiting, key=lambda r: (id(r) not in must, r.left))[: max(0, free)]:
            if policy == "on-demand" or id(r) in must:
                r.where = "od"
            elif spot[minute]:
                r.where = "spot"
            else:
                continue
            r.booting = SWITCH_MIN
        for r in live:
            if not r.where:
                continue
            dollars += (OD if r.where == "od" else SPOT) / 60
            if r.booting > 0:
                r.booting -= 1
                continue
            r.left -= 1
            r.since_ckpt = 0.0 if (WORK_MIN - r.left) % CKPT_MIN == 0 else r.since_ckpt + 1
            if r.left <= 0:
                r.where = ""
    return False, dollars


def _on_demand_now(policy: str, live: list[Run], minute: int, deadline_min: float) -> tuple[set, set, set]:
    """(waiting runs to buy on-demand, spot runs to move there, an on-demand run to move back to spot) as the
    controller's plan() says this minute."""
    if policy != "deadline":
        return set(), set(), set()
    # what the controller knows: a run's work left; an on-demand one's boot is part of it, a spot one's is the
    # move the schedule already counts for it
    works = [
        RunWork(str(id(r)), (r.left + (r.booting if r.where == "od" else 0)) * 60, bool(r.where), r.where == "od")
        for r in live
    ]
    s = plan(works, SLOTS, deadline_min * 60, minute * 60, SWITCH_MIN * 60)  # as the controller calls it
    return {int(rid) for rid in s.on_demand}, {int(rid) for rid in s.move}, {int(rid) for rid in s.back}


@pytest.mark.timeout(1800)  # 3 slacks x 120 traces x 3 policies: ~5 minutes alone on one core
def test_the_deadline_rule_meets_every_deadline_at_a_fraction_of_on_demand():
    figures = {}
    for slack in SLACKS:
        deadline_min = slack * ON_DEMAND_MIN
        rows = []
        for seed in range(TRACES):
            spot, _ = trace(seed, int(deadline_min))
            runs = {p: simulate(p, seed, deadline_min) for p in ("spot", "on-demand", "deadline")}
            rows.append({"spot_share": sum(spot) / len(spot), **runs})
        for label, chosen in (("all", rows), ("spot >= half", [r for r in rows if r["spot_share"] >= 0.5])):
            od = sum(r["on-demand"][1] for r in chosen)
            figures[f"deadline {slack}x, {label}"] = {"traces": len(chosen)} | {
                p: {
                    "met": round(sum(r[p][0] for r in chosen) / len(chosen), 3),
                    "usd_vs_on_demand": round(sum(r[p][1] for r in chosen) / od, 3),
                }
                for p in ("spot", "on-demand", "deadline")
            }
    print("\n" + json.dumps(figures, indent=1))
    for slack in SLACKS:
        every, half = figures[f"deadline {slack}x, all"], figures[f"deadline {slack}x, spot >= half"]
        assert every["on-demand"]["met"] == 1.0  # feasible by construction
        assert every["deadline"]["met"] == 1.0  # the goal: every deadline met
        assert every["spot"]["met"] < 1.0  # spot alone is late on some traces: the rule is needed
        assert half["deadline"]["usd_vs_on_demand"] < half["on-demand"]["usd_vs_on_demand"]
    # the goal of <= 0.5 of on-demand where spot is there half the time: met from a deadline 1.75x the all-on-demand
    # time; at 1.5x it is not (README and docs/guides/deadline.md give every figure)
    assert figures["deadline 1.75x, spot >= half"]["deadline"]["usd_vs_on_demand"] <= 0.5
