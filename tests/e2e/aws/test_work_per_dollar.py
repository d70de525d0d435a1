"""Buying work, not hours (`aws.choose`), through `orch launch` on the fake cloud: two types, the cheaper one by the
hour doing a third of the work per second (the run's command reads its instance type from the instance metadata and
reports its epochs at that pace). After the first attempts measured both, the next ones go to the lower $ per epoch;
with `choose: price` they go by the hour. The fake cloud chooses among the overrides as EC2 documents (per unit hour
with weights), never by their order."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states
from tests.fakecloud import BUCKET
from tests.fakecloud.cloud import AZS

pytestmark = pytest.mark.slow

PACED = """
import json, os, urllib.request
ep = os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"].rstrip("/")
ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
put = urllib.request.Request(ep + "/latest/api/token", method="PUT", headers=ttl)
token = urllib.request.urlopen(put).read().decode()
ask = urllib.request.Request(ep + "/latest/meta-data/instance-type", headers={"X-aws-ec2-metadata-token": token})
itype = urllib.request.urlopen(ask).read().decode()
speed = 3.0 if itype == "g5.xlarge" else 1.0  # epochs per second: g6.xlarge does a third of g5.xlarge's work
with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
    for epoch in range(1, 7):
        f.write(json.dumps({"epoch": epoch, "elapsed_s": epoch / speed, "itype": itype}) + "\\n")
"""


def paced_sweep(orch, cloud, identity, name: str, runs: str = "[1, 2, 3, 4]", **aws: str):
    (orch.tmp / "paced.py").write_text(PACED)
    for (
        az
    ) in AZS:  # g6.xlarge: cheaper by the hour, dearer by the epoch ($0.30 a third of an epoch-rate: $0.90 per unit)
        cloud.gate.spot_prices[("g6.xlarge", az)] = 0.30
        cloud.gate.spot_prices[("g5.xlarge", az)] = 0.45
    extra = f"grid:\n  run: {runs}\nmax_parallel: 1\nmax_restarts: 0\n"
    return orch.sweep(cloud.sweep_yaml(name, identity, "python3 paced.py", extra=extra, **aws), name=f"{name}.yaml")


def types_run(orch, cloud, name: str, runs: int = 4) -> list[str]:
    """Each run's instance type, in the order the runs ran (what its command read from the metadata service)."""
    out = []
    for run in (f"run={k}" for k in range(1, runs + 1)):
        body = cloud.client("s3").get_object(Bucket=BUCKET, Key=f"sweeps/{name}/{run}/metrics.jsonl")["Body"].read()
        out.append(json.loads(body.splitlines()[-1])["itype"])
    return out


@pytest.mark.timeout(600)
def test_later_attempts_go_to_the_lower_dollars_per_epoch_and_by_price_they_would_not(orch, cloud, identity):
    path = paced_sweep(orch, cloud, identity, "work")
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "pools, by $ per useful hour (no epoch rate measured yet" in dry.out, dry.out + dry.err
    r = orch("launch", str(path), timeout=500)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert {s["state"] for s in run_states(orch, "work").values()} == {"succeeded"}
    # 1: nothing measured, the cheaper hour; 2: g5.xlarge tried first to measure it; 3, 4: the lower $ per epoch
    assert types_run(orch, cloud, "work") == ["g6.xlarge", "g5.xlarge", "g5.xlarge", "g5.xlarge"]
    # `orch status` names where each run went and why (the pool's rank when it was bought)
    whys = {r["run_id"]: r["why"] for r in json.loads(orch("status", "work", "--json").out)["runs"]}
    assert whys["run=2"].startswith("g5.xlarge in ") and "tried first, to measure it" in whys["run=2"], whys
    assert "ranked 1 of " in whys["run=4"] and "by $ per epoch: measured (" in whys["run=4"], whys
    rates = json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key="sweeps/work/rates.json")["Body"].read())
    per_type: dict[str, float] = {}
    for entry in rates["attempts"].values():
        per_type[entry["type"]] = entry["work"] / entry["seconds"]
    assert per_type == pytest.approx({"g6.xlarge": 1.0, "g5.xlarge": 3.0})
    again = orch("launch", str(path), "--dry-run")  # the measured ranking, as a relaunch would use it
    assert "pools, by expected $ per epoch" in again.out, again.out
    first = next(line for line in again.out.splitlines() if line.strip().startswith("1. "))
    assert "g5.xlarge" in first and "measured (3 attempts)" in first, again.out
    col = orch("collect", "work", "--out", str(orch.tmp / "res"))
    assert col.code == 0, col.err
    assert "work on g5.xlarge: 10,800/h measured (3 attempt(s))" in col.out, col.out
    assert "work on g6.xlarge: 3,600/h measured (1 attempt(s))" in col.out, col.out
    assert "by the hour alone (all on g6.xlarge, at its measured rate)" in col.out, col.out
    # 15 epochs on g5.xlarge at $0.45/h and 3/s + 5 on g6.xlarge at $0.30/h and 1/s, against 20 at $0.30/h and 1/s:
    # $0.00104 against $0.00167, 37.5% saved
    saved = re.search(r"ranking by \$ per unit saved (\d+)%", col.out)
    assert saved and int(saved.group(1)) in (37, 38), col.out
    work = json.loads((orch.tmp / "res" / "runs.json").read_text())["work"]
    assert work["units"] == pytest.approx(4 * 5)  # 5 epochs measured per run (6 lines: the first is the start)
    assert orch("down", "work").code == 0

    by_price = paced_sweep(orch, cloud, identity, "hours", choose="price")
    assert orch("launch", str(by_price), timeout=500).code == 0
    assert types_run(orch, cloud, "hours") == ["g6.xlarge"] * 4
    assert orch("down", "hours").code == 0


@pytest.mark.timeout(600)
def test_a_later_sweep_of_the_same_command_starts_from_the_rates_earlier_ones_measured(orch, cloud, identity):
    """Rates are the command's, not only the sweep's: a second sweep of the same command in the store buys its first
    run on the type the first sweep measured cheaper per epoch (without them: the cheaper hour, to measure it);
    `orch aws rates --forget` makes later sweeps of it start unmeasured."""
    first = paced_sweep(orch, cloud, identity, "first", runs="[1, 2]")
    assert orch("launch", str(first), timeout=300).code == 0
    assert types_run(orch, cloud, "first", runs=2) == ["g6.xlarge", "g5.xlarge"]  # nothing measured, then explored
    later = paced_sweep(orch, cloud, identity, "later", runs="[1]")
    dry = orch("launch", str(later), "--dry-run")
    top = next(line for line in dry.out.splitlines() if line.strip().startswith("1. "))
    assert "g5.xlarge" in top and "measured (1 attempt, 1 in earlier sweeps)" in top, dry.out
    # an estimate beside the bound: each run of the command did 5 epochs (6 lines: the first is the start)
    assert "expected about $" in dry.out and "1 run(s) x ~5 epoch each (the median of 2 measured run(s)" in dry.out
    shown = orch("aws", "rates", str(later))
    assert shown.code == 0 and "earlier sweeps of this command: first" in shown.out, shown.out + shown.err
    assert "g5.xlarge: 10,800/h over 1 attempt(s), 1 in earlier sweeps" in shown.out, shown.out
    assert orch("launch", str(later), timeout=300).code == 0
    assert types_run(orch, cloud, "later", runs=1) == ["g5.xlarge"]  # measured already: no type explored again
    forgot = orch("aws", "rates", str(later), "--forget")
    assert forgot.code == 0 and "forgot 2 sweep(s) of this command (" in forgot.out, forgot.out + forgot.err
    fresh = orch("launch", str(paced_sweep(orch, cloud, identity, "fresh", runs="[1]")), "--dry-run")
    assert "no epoch rate measured yet" in fresh.out, fresh.out
    other = orch("aws", "rates", str(later))
    assert "no earlier sweep of this command" in other.out, other.out
    assert "g5.xlarge: 10,800/h over 1 attempt(s), 0 in earlier sweeps" in other.out, other.out  # its own
    for name in ("first", "later"):
        assert orch("down", name).code == 0


@pytest.mark.timeout(600)
def test_a_pool_reclaimed_in_an_earlier_sweep_loses_its_rank_and_by_price_it_would_not(orch, cloud, identity):
    """A pool's reclaims are the pool's: after the first sweep's instance in the cheapest AZ is reclaimed, a later
    sweep (another command, its own controller: no block carried over) buys in the other AZ, and names why; ranked by
    the hour (`choose: price`) it buys in the reclaimed one."""
    cheap, dear = AZS
    cloud.gate.spot_prices[("g5.xlarge", cheap)], cloud.gate.spot_prices[("g5.xlarge", dear)] = 0.30, 0.31

    def sweep(name: str, command: str, **aws: str):
        text = cloud.sweep_yaml(name, identity, command, instance_types="[g5.xlarge]", **aws)
        return orch.sweep(text, name=f"{name}.yaml")

    ctl = orch.popen("launch", str(sweep("shaky", "sleep 15")))
    [first] = retry_until(lambda: cloud.instances("shaky"), 120, 0.2, "the first sweep's instance")
    assert first["az"] == cheap
    retry_until(lambda: [s["state"] for s in run_states(orch, "shaky").values()] == ["running"], 120, 0.2, "the run")
    cloud.reclaim(first["id"])
    out, _ = ctl.communicate(timeout=300)
    assert ctl.returncode == 0, out[-3000:]
    assert [s["attempt"] for s in run_states(orch, "shaky").values()] == [2]
    later = sweep("steady", "sleep 1")
    dry = orch("launch", str(later), "--dry-run")
    ranks = [line for line in dry.out.splitlines() if re.match(r"\s+\d\. g5.xlarge", line)]
    assert dear in ranks[0] and cheap in ranks[1], dry.out  # the reclaimed pool second, though cheaper by the hour
    assert orch("launch", str(later), timeout=300).code == 0
    why = json.loads(orch("status", "steady", "--json").out)["runs"][0]["why"]
    assert why.startswith(f"g5.xlarge in {dear}") and "ranked 1 of 2" in why, why
    by_price = sweep("hourly", "sleep 1", choose="price")
    assert orch("launch", str(by_price), timeout=300).code == 0
    assert [e["az"] for e in _ledger(cloud, "hourly")] == [cheap]
    for name in ("shaky", "steady", "hourly"):
        assert orch("down", name).code == 0


def _ledger(cloud, sweep: str) -> list[dict]:
    body = cloud.client("s3").get_object(Bucket=BUCKET, Key=f"sweeps/{sweep}/cost.json")["Body"].read()
    return [e for e in json.loads(body).values() if not e.get("role")]


@pytest.mark.timeout(600)
def test_placement_scores_rank_the_likelier_az_and_refused_by_iam_the_sweep_runs_without_them(orch, cloud, identity):
    """AWS's Spot placement scores (the fake answers GetSpotPlacementScores as the EC2 User Guide describes it, per AZ
    id, for three types at least): at equal prices the AZ scored likelier ranks first and is bought. A user whose
    policy predates the call: the dry run says so, the sweep runs, ranked without them, and asks once."""
    types = ["g4dn.xlarge", "g5.xlarge", "g6.xlarge"]
    low, high = AZS
    for t in types:
        for az in AZS:
            cloud.gate.spot_prices[(t, az)] = 0.30
    cloud.gate.placement_scores.update({low: 2, high: 9})

    def sweep(name: str):
        text = cloud.sweep_yaml(name, identity, "sleep 1", instance_types=f"[{', '.join(types)}]")
        return orch.sweep(text, name=f"{name}.yaml")

    scored = sweep("scored")
    dry = orch("launch", str(scored), "--dry-run")
    assert f"spot placement scores: AWS's, for {', '.join(types)} together: 2 AZ(s) scored" in dry.out, dry.out
    top = next(line for line in dry.out.splitlines() if line.strip().startswith("1. "))
    assert high in top and "placement score 9" in top, dry.out
    assert orch("launch", str(scored), timeout=300).code == 0
    assert [e["az"] for e in _ledger(cloud, "scored")] == [high]

    policy = json.loads(json.dumps(cloud.gate.controller_policy))  # last month's policy: without the call
    for statement in policy["Statement"]:
        actions = statement.get("Action")
        if isinstance(actions, list) and "ec2:GetSpotPlacementScores" in actions:
            actions.remove("ec2:GetSpotPlacementScores")
    cloud.gate.controller_policy = policy
    unscored = sweep("unscored")
    dry = orch("launch", str(unscored), "--dry-run")
    assert "spot placement scores: refused by IAM: ranked without them (grant ec2:GetSpotPlacementScores" in dry.out
    r = orch("launch", str(unscored), timeout=300)
    assert r.code == 0 and [s["state"] for s in run_states(orch, "unscored").values()] == ["succeeded"], r.out
    assert cloud.gate.denied == ["ec2:GetSpotPlacementScores"] * 2  # the dry run's and the launch's: once each
    cloud.gate.denied.clear()  # (refused on purpose: the fixture fails a test whose calls the policy refused)
    for name in ("scored", "unscored"):
        assert orch("down", name).code == 0
