"""Packing across regions (docs/guides/regions.md): runs that share an instance move regions as single runs do, and
each region's shared instances are of the type that region's own spot prices make the best home — on the fake cloud
with two regions."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.e2e.aws import test_regions as regions
from tests.e2e.aws.test_regions import WEST, no_capacity, with_regions
from tests.fakecloud import BUCKET, REGION

pytestmark = pytest.mark.slow

clouds = regions.clouds  # the same fixture: a fake cloud with two regions (us-east-1, us-west-2)
EVER = ("pending", "running", "shutting-down", "terminated")
PACKED = "max_restarts: 0\nresources:\n  gpus: 1"


def attempts_on_hosts(cloud, sweep: str) -> dict[tuple[str, int], list[str]]:
    """(run, attempt) -> the instances whose disk holds that attempt's task (the controller puts it there before it
    starts the attempt's agent): more than one is a run with two live copies of one attempt."""
    out: dict[tuple[str, int], list[str]] = {}
    for task in (cloud.root / "hosts").glob(f"*/home/orch/runs/{sweep}/*/ctl/task-*.json"):
        iid, run = task.parts[-8], task.parts[-3]
        out.setdefault((run, int(task.stem.split("-")[1])), []).append(iid)
    return out


@pytest.mark.timeout(900)
def test_a_reclaimed_shared_instance_resumes_its_runs_in_another_region(orch, clouds, identity, tmp_path):
    """Two runs share one instance in us-west-2 (us-east-1 is full); us-west-2 takes it back as us-east-1's capacity
    returns: both runs resume in us-east-1 from their checkpoints, sharing an instance there."""
    from tests.e2e.aws.test_spot import FAST_SYNC, TRAIN, each_resumed_once_as_if_never_interrupted

    no_capacity(clouds, REGION)
    extra = f"seeds: 2\nmax_parallel: 2\n{PACKED}"
    text = clouds.sweep_yaml("packmove", identity, TRAIN, extra=extra, instance_types="[g5.12xlarge]", **FAST_SYNC)
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    assert orch("launch", str(path), "--detach").code == 0
    runs = ("seed=0", "seed=1")
    retry_until(lambda: all(clouds.step_on_hosts("packmove", r) >= 60 for r in runs), 300, 0.2, "both at step 60")
    (shared,) = clouds.instances("packmove")
    assert shared["region"] == WEST and shared["tags"]["orch:slots"] == "4", shared
    held = sorted(v for k, v in shared["tags"].items() if k.startswith("orch:slot:"))
    assert held == ["seed=0#1", "seed=1#1"], shared  # both runs on the one instance
    no_capacity(clouds, REGION, on=False)  # us-east-1's capacity returns ...
    clouds.reclaim(shared["id"])  # ... as us-west-2 takes the shared instance back
    final = each_resumed_once_as_if_never_interrupted(orch, clouds, "packmove", runs, tmp_path)
    assert {final[run]["region"] for run in runs} == {REGION}, final  # `orch status`: where its current attempt ran
    ran = clouds.instances("packmove", states=EVER)
    where = {i["id"]: i["region"] for i in ran}
    placed = attempts_on_hosts(clouds, "packmove")
    assert sorted(placed) == [(r, a) for r in runs for a in (1, 2)], placed
    assert all(len(ids) == 1 for ids in placed.values()), placed  # no attempt ran on two instances
    assert {where[placed[(r, 1)][0]] for r in runs} == {WEST}, (placed, where)
    assert {where[placed[(r, 2)][0]] for r in runs} == {REGION}, (placed, where)
    assert all(i["tags"].get("orch:slots") == "4" for i in ran), ran  # shared instances only, in both regions
    out = tmp_path / "out"
    r = orch("collect", str(path), "--out", str(out))
    assert r.code == 0, r.out + r.err
    rows = {row["run_id"]: row for row in csv.DictReader(open(out / "runs.csv"))}
    assert {run: rows[run]["region"] for run in runs} == {run: f"{WEST},{REGION}" for run in runs}, rows
    ledger = json.loads(clouds.client("s3").get_object(Bucket=BUCKET, Key="sweeps/packmove/cost.json")["Body"].read())
    assert Counter(e["region"] for e in ledger.values()) == Counter(where.values()), ledger
    assert orch("down", "packmove").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("packmove", region).values()), region


@pytest.mark.timeout(600)
def test_each_region_buys_the_packing_type_its_own_prices_make_the_best_home(orch, clouds, identity):
    """g5.12xlarge is the cheaper home for the runs in us-east-1, g6.12xlarge in us-west-2 (set in the fake's spot
    history): with us-east-1 full, the shared instance bought in us-west-2 is a g6.12xlarge."""
    types = ("g5.12xlarge", "g6.12xlarge")  # 4 GPUs each: one instance holds both runs, so price alone decides
    for az in ("us-east-1a", "us-east-1b"):
        clouds.gate.spot_prices[("g5.12xlarge", az)] = 1.0
    price = {(t, r): min(clouds.gate.price_of(t, f"{r}{z}") for z in "ab") for t in types for r in (REGION, WEST)}
    assert price[types[0], REGION] < price[types[1], REGION] and price[types[1], WEST] < price[types[0], WEST], price
    no_capacity(clouds, REGION)
    extra = f"grid:\n  k: [0, 1]\nmax_parallel: 2\n{PACKED}"
    text = clouds.sweep_yaml("packprice", identity, "true", extra=extra, instance_types=f"[{', '.join(types)}]")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.out + dry.err
    for region, best in ((REGION, types[0]), (WEST, types[1])):
        said = f"packing in {region}: 4 runs of 1 GPU(s) per {best}; max_parallel 2 -> 1 instance(s) at "
        assert f"{said}${price[best, region]:.4f}/h" in dry.out, dry.out
    r = orch("launch", str(path), timeout=500)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "packprice")
    assert [(v["state"], v["attempt"]) for v in final.values()] == [("succeeded", 1)] * 2, final
    ledger = json.loads(clouds.client("s3").get_object(Bucket=BUCKET, Key="sweeps/packprice/cost.json")["Body"].read())
    bought = [(e["type"], e["region"]) for e in ledger.values()]
    assert bought == [(types[1], WEST)], ledger  # us-west-2's best home, not us-east-1's
    (entry,) = ledger.values()
    assert entry["price_per_h"] == pytest.approx(clouds.gate.price_of(types[1], entry["az"])), entry
    assert orch("down", "packprice").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("packprice", region).values()), region
