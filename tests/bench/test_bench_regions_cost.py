"""Benchmark: the sweep's total dollars and time to finish with one region against three, when the cheapest region
fills up — on the fake cloud with three regions (us-east-1, us-west-2, eu-west-1; the store's bucket in us-east-1).

The fake cloud's spot prices are per AZ (tests/fakecloud/gate.py `spot_price`, examples, not quotes); for g6.xlarge the
cheapest AZ of each region is us-east-1a $0.2929/h, us-west-2a $0.3109/h, eu-west-1b $0.3590/h, so the regions are
listed in that order. us-east-1 holds at most 2 live spot instances (`region_capacity`); the sweep is 4 runs at once,
each a fixed 30 s of work that writes 16 MiB to its folder (synced to the store: moved across regions when it runs
outside us-east-1). The same sweep twice, in the same command:

- `regions: [us-east-1]`: 2 runs start; the other 2 are refused (InsufficientInstanceCapacity) and wait until orch
  asks that region again (a refused pool is left alone for 5 minutes);
- `regions: [us-east-1, us-west-2, eu-west-1]`: the other 2 run at once in us-west-2.

Prints, for each: launch -> every run ended (s), the instances' dollars and the inter-region transfer's dollars as
`orch collect` counts them (runs.json `spend_usd`, `transfer_usd`), and where the runs ran. Nothing timed is asserted:

    .venv/bin/python -m pytest tests/bench/test_bench_regions_cost.py -s -m bench
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.aws.test_regions import WEST, with_regions
from tests.fakecloud import REGION

pytestmark = [pytest.mark.bench, pytest.mark.slow]
EU = "eu-west-1"
RUNS, ROOM, WORK_S, MIB = 4, 2, 30, 16
WORK = f"""
import os, time
with open(os.path.join(os.environ["ORCH_RUN_DIR"], "weights.bin"), "wb") as f:
    f.write(os.urandom({MIB} << 20))
time.sleep({WORK_S})
"""


def finish(cloud, orch, tmp_path, name: str, regions: str) -> dict:
    script = tmp_path / "work.py"
    script.write_text(WORK)
    grid = ", ".join(str(k) for k in range(RUNS))
    extra = f"grid:\n  k: [{grid}]\nmax_parallel: {RUNS}\nmax_restarts: 0"
    text = cloud.sweep_yaml(name, orch.identity, f"{{python}} {script}", extra=extra, instance_types="[g6.xlarge]")
    path = orch.sweep(with_regions(text, regions), name=f"{name}.yaml")
    t0 = time.perf_counter()
    r = orch("launch", str(path), timeout=1500)
    took = time.perf_counter() - t0
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    out = tmp_path / name
    c = orch("collect", name, "--out", str(out), "--wide")
    assert c.code == 0, c.out + c.err
    doc = json.loads((out / "runs.json").read_text())
    assert sorted(row["state"] for row in doc["runs"]) == ["succeeded"] * RUNS, doc["runs"]
    assert orch("down", name, timeout=600).code == 0
    where: dict[str, int] = {}
    for row in doc["runs"]:
        where[row["region"]] = where.get(row["region"], 0) + 1
    spend, transfer = doc.get("spend_usd") or 0.0, doc.get("transfer_usd") or 0.0
    return {
        "launch_to_all_ended_s": round(took, 1),
        "instances_usd": round(spend, 4),
        "transfer_usd": round(transfer, 4),
        "total_usd": round(spend + transfer, 4),
        "runs_per_region": where,
    }


@pytest.mark.timeout(2400)
def test_three_regions_finish_sooner_when_the_cheapest_fills_up(orch, tmp_path, identity):
    from tests.fakecloud import FakeCloud

    orch.identity = identity
    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST, EU)) as cloud:
        orch.env.update(cloud.env())
        cloud.gate.region_capacity[REGION] = ROOM
        one = finish(cloud, orch, tmp_path, "one-region", f"[{REGION}]")
        three = finish(cloud, orch, tmp_path, "three-regions", f"[{REGION}, {WEST}, {EU}]")
    figures = {
        "one_region_us_east_1": one,
        "three_regions": three,
        "ratio_time": round(three["launch_to_all_ended_s"] / one["launch_to_all_ended_s"], 2),
        "ratio_total_usd": round(three["total_usd"] / one["total_usd"], 3) if one["total_usd"] else None,
    }
    print("\nregions cost:", json.dumps(figures, indent=2))
