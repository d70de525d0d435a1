"""Benchmark: what failover between regions adds to the time to the first instance, on the fake cloud with two
regions and an EC2-like boot (sshd answers 30 s after `running`).

Ratios against a baseline in the same command: the sweep in us-west-2 alone (capacity at once), and the same sweep
with `regions: [us-east-1, us-west-2]` whose us-east-1 refuses capacity in every pool (orch asks us-east-1 first,
then us-west-2 in the same pass). Prints launch -> first instance `running` and launch -> first run started:

    .venv/bin/python -m pytest tests/bench/test_bench_regions.py -s
"""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.e2e.aws.test_regions import WEST, no_capacity, with_regions
from tests.fakecloud import REGION

pytestmark = [pytest.mark.bench, pytest.mark.slow]
BOOT_S = 30.0  # EC2: 30-120 s from `running` to sshd


def first_instance(cloud, orch, name: str, regions: str, job) -> dict:
    text = cloud.sweep_yaml(name, orch.identity, job(steps=1, release=True), extra="max_restarts: 0")
    path = orch.sweep(with_regions(text, regions), name=f"{name}.yaml")
    t0 = time.perf_counter()
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: cloud.instances(name, states=("running",)), 300, 0.1, "an instance running")
    running = time.perf_counter() - t0
    retry_until(lambda: status(orch, name, gap=0.5).get("run", {}).get("state") == "running", 600, 0.2, "the run")
    started = time.perf_counter() - t0
    assert orch("down", name, timeout=600).code == 0
    return {"to_instance_running_s": round(running, 2), "to_run_started_s": round(started, 2)} | asked(cloud, t0)


def asked(cloud, t0: float) -> dict:
    """When each region was first asked (CreateFleet, from launch), and what failover added between them: the most
    that asking both regions at once could save. `second_region_calls_between`: the EC2 calls the second region got
    after the first refused and before it was asked itself (its parts, were they made only then: security group,
    launch template, image lookup)."""
    calls = [c for c in cloud.gate.calls if c.began >= t0]
    fleets = [c for c in calls if c.action == "CreateFleet" and c.run == "run"]
    first = {}
    for c in fleets:
        first.setdefault(c.region, c)
    out = {f"{r}_asked_s": round(c.began - t0, 2) for r, c in first.items()}
    if REGION in first and WEST in first:
        refused, west = max(c.answered for c in fleets if c.region == REGION), first[WEST]
        out["first_region_asked_to_second_asked_s"] = round(west.began - first[REGION].began, 3)
        out["second_region_calls_between"] = [
            c.action for c in calls if c.region == WEST and refused <= c.began < west.began and c.run != "run"
        ]
    return out


@pytest.mark.timeout(1500)
def test_failover_adds_at_most_a_pass_to_the_first_instance(orch, tmp_path, identity, job):
    from tests.fakecloud import FakeCloud

    orch.identity = identity
    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST), boot_s=BOOT_S) as cloud:
        orch.env.update(cloud.env())
        base = first_instance(cloud, orch, "one-region", f"[{WEST}]", job)
        no_capacity(cloud, REGION)
        failover = first_instance(cloud, orch, "failover", f"[{REGION}, {WEST}]", job)
    figures = {
        "baseline_us_west_2_alone": base,
        "us_east_1_full_then_us_west_2": failover,
        "ratio_to_instance_running": round(failover["to_instance_running_s"] / base["to_instance_running_s"], 2),
        "ratio_to_run_started": round(failover["to_run_started_s"] / base["to_run_started_s"], 2),
    }
    print("\nregions:", json.dumps(figures, indent=2))
