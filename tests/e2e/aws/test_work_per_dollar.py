"""Buying work, not hours (`aws.choose`), through `orch launch` on the fake cloud: two types, the cheaper one by the
hour doing a third of the work per second (the run's command reads its instance type from the instance metadata and
reports its epochs at that pace). After the first attempts measured both, the next ones go to the lower $ per epoch;
with `choose: price` they go by the hour. The fake cloud chooses among the overrides as EC2 documents (per unit hour
with weights), never by their order."""

from __future__ import annotations

import json
import re

import pytest

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


def paced_sweep(orch, cloud, identity, name: str, **aws: str):
    (orch.tmp / "paced.py").write_text(PACED)
    for (
        az
    ) in AZS:  # g6.xlarge: cheaper by the hour, dearer by the epoch ($0.30 a third of an epoch-rate: $0.90 per unit)
        cloud.gate.spot_prices[("g6.xlarge", az)] = 0.30
        cloud.gate.spot_prices[("g5.xlarge", az)] = 0.45
    extra = "grid:\n  run: [1, 2, 3, 4]\nmax_parallel: 1\nmax_restarts: 0\n"
    return orch.sweep(cloud.sweep_yaml(name, identity, "python3 paced.py", extra=extra, **aws), name=f"{name}.yaml")


def types_run(orch, cloud, name: str) -> list[str]:
    """Each run's instance type, in the order the runs ran (what its command read from the metadata service)."""
    out = []
    for run in ("run=1", "run=2", "run=3", "run=4"):
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
