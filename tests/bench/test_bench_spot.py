"""Benchmark: a spot interruption on the fake cloud, five times in a row on one run.

Measures, per interruption, the time from the notice (served by the fake IMDS) to the trainer
stepping again on a replacement instance, and the work lost (steps done twice). Prints the
median and all figures:

    .venv/bin/python -m pytest tests/bench/test_bench_spot.py -s
"""

from __future__ import annotations

import json
import statistics
import time

import pytest

from orchestrator.wait import retry_until
from tests.e2e.aws.test_spot import instance_of, status, steps_lost
from tests.unit.trainer.test_train import SMALL

pytestmark = [pytest.mark.bench, pytest.mark.slow]

FOREVER = [*SMALL, "--epochs", "400"]  # far longer than the benchmark; `orch down` ends it
TRAIN = " ".join(["{python}", "-m", "trainer", *FOREVER, "--log-every", "1"])


@pytest.mark.timeout(900)
def test_interruption_to_stepping_again(orch, cloud, identity):
    path = orch.sweep(cloud.sweep_yaml("bench-spot", identity, TRAIN, heartbeat_s="1", sync_s="2"))
    assert orch("launch", str(path), "--detach").code == 0
    recover = []
    for attempt in range(1, 6):

        def stepping():
            v = status(orch, "bench-spot").get("run", {})
            return (
                v
                if v.get("attempt") == attempt
                and v.get("state") == "running"
                and v.get("metrics", {}).get("step", 0) > 0
                else None
            )

        v = retry_until(stepping, 300, 0.2, f"attempt {attempt} to train")
        before = v["metrics"]["step"]
        retry_until(
            lambda: status(orch, "bench-spot")["run"]["metrics"].get("step", 0) >= before + 20,
            120,
            0.2,
            "20 more steps",
        )
        iid = instance_of(cloud, "bench-spot", "run", attempt)
        t0 = time.time()
        cloud.spot_notice(iid)
        retry_until(lambda: status(orch, "bench-spot")["run"]["preemptions"] >= attempt, 120, 0.2, "the interruption")
        cloud.reclaim(iid)

        def resumed():
            v = status(orch, "bench-spot")["run"]
            return v["attempt"] == attempt + 1 and v["state"] == "running" and "step" in v["metrics"]

        # the replacement's first heartbeat carrying a metrics line: its trainer is stepping
        retry_until(resumed, 300, 0.1, "the replacement to step")
        recover.append(round(time.time() - t0, 2))
    lost = steps_lost(cloud, "sweeps/bench-spot/run/metrics.jsonl")
    figures = {
        "notice_to_stepping_again_s": recover,
        "median_s": statistics.median(recover),
        "steps_lost_total_over_5": lost,
        "interruptions": 5,
    }
    print("\nspot interruption benchmark:", json.dumps(figures))
    assert orch("down", "bench-spot", timeout=600).code == 0
