"""CreateFleet's answers to whole sweeps on the fake cloud: a quota reached while runs go (or still counting
terminated instances) makes runs wait, an error orch does not know fails the run in AWS's words, a spot quota stops
the sweep, on-demand launches, spot then on-demand falls back, and an SDK error after CreateFleet loses no instance."""

from __future__ import annotations

import json

import pytest

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET
from tests.fakecloud.sweeps import smoke


@pytest.mark.timeout(900)
def test_a_quota_reached_while_runs_go_makes_runs_wait_not_the_sweep_fail(orch, cloud, identity):
    cloud.gate.spot_quota = 1  # one spot instance at a time: the second run must wait for the first, not end the sweep
    path = orch.sweep(
        cloud.sweep_yaml("quota", identity, "sleep 45", extra="max_parallel: 2\ngrid:\n  k: [1, 2]", market="spot")
    )
    assert orch("launch", str(path), "--detach").code == 0

    # the quota refuses the second run while the first holds the only spot instance: it waits (not a fatal stop of
    # the sweep) and starts once the first instance is gone
    retry_until(
        lambda: [v["state"] for v in status(orch, "quota", gap=ENDED_GAP_S).values()] == ["succeeded"] * 2,
        600,
        1.0,
        "both runs to succeed",
    )
    runs = status(orch, "quota")
    assert cloud.gate.counts["MaxSpotInstanceCountExceeded"] >= 1, runs
    assert orch("down", "quota", timeout=300).code == 0


@pytest.mark.timeout(900)
def test_terminated_instances_still_counting_toward_a_quota_make_the_next_run_wait_not_the_sweep_fail(
    orch, cloud, identity
):
    """A quota of one spot instance runs a sweep serially: the first run's instance, terminated, goes on counting
    toward the limit for a while, when none of the sweep's instances is listed any more; the next run waits."""
    cloud.gate.spot_quota = 1
    cloud.gate.strict.quota_linger_s = 45.0  # longer than orch waits between two asks (fleet.QUOTA_BLOCK_S)
    path = orch.sweep(
        cloud.sweep_yaml("serial", identity, "true", extra="max_parallel: 1\ngrid:\n  k: [1, 2]", market="spot")
    )
    assert orch("launch", str(path), "--detach").code == 0

    def settled() -> bool:
        runs = status(orch, "serial", gap=ENDED_GAP_S).values()
        fatal = any("quota" in (r.get("reason") or "") and "waiting" not in r["reason"] for r in runs)
        return fatal or (len(runs) == 2 and {r["state"] for r in runs} == {"succeeded"})

    try:
        retry_until(settled, 600, 1.0, "both runs to succeed, or the sweep to stop")
        runs = status(orch, "serial")
        assert {r["state"] for r in runs.values()} == {"succeeded"}, runs
        assert cloud.gate.counts["MaxSpotInstanceCountExceeded"] >= 2  # the second run met the lingering instance
    finally:
        assert orch("down", "serial", timeout=300).code == 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_c_unknown_createfleet_error_fails_the_run_with_awss_words(orch, cloud, identity):
    cloud.gate.fleet_errors[("*", "*", "*")] = "InvalidFleetConfiguration"
    path = smoke(orch, identity, "unknown", command="true", grid={"lr": [1]}, max_restarts=0)
    r = orch("launch", str(path), timeout=300)
    assert r.code == 1, r.out + r.err
    v = status(orch, "unknown")["lr=1"]
    assert v["state"] == "failed" and "InvalidFleetConfiguration" in v["reason"] and "capacity" not in v["reason"], v
    d = orch("down", "unknown")
    assert d.code == 0, d.out + d.err


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_c_spot_quota_stops_the_sweep_with_the_quota_to_raise(orch, cloud, identity):
    cloud.gate.fleet_errors[("spot", "*", "*")] = "MaxSpotInstanceCountExceeded"
    path = smoke(orch, identity, "quota", command="true")
    r = orch("launch", str(path), timeout=300)
    assert r.code != 0 and "All G and VT Spot Instance Requests" in r.err and "Traceback" not in r.err, r.out + r.err
    assert cloud.instances("quota") == []
    orch("down", "quota")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_d_spot_then_on_demand_falls_back_on_the_fake_cloud(orch, cloud, identity):
    cloud.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"
    path = smoke(orch, identity, "fallback", command="true", grid={"lr": [1]}, aws_market="spot-then-on-demand")
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    ledger = json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key="sweeps/fallback/cost.json")["Body"].read())
    assert [e["market"] for e in ledger.values()] == ["on-demand"]
    # on-demand is priced at the type's published price where orch knows it, else 3x the newest spot price of
    # that (type, AZ), as the README says
    from orchestrator.backends.aws.cloud.pricing import ON_DEMAND_USD_PER_H

    (entry,) = ledger.values()
    spot = api.spot_prices(cloud.client("ec2"), [entry["type"]], [entry["az"]])[(entry["type"], entry["az"])]
    assert (
        entry["price_per_h"] == pytest.approx(ON_DEMAND_USD_PER_H.get(entry["type"], 3 * spot))
        and entry["price_per_h"] > spot
    )
    # the root volume the instances were launched with is encrypted and goes with the instance (moto does not
    # apply a template's block devices to the volumes it makes, so this reads what EC2 was asked for)
    versions = cloud.client("ec2").describe_launch_template_versions(LaunchTemplateName="orch-fallback")[
        "LaunchTemplateVersions"
    ]
    ebs = [m["Ebs"] for v in versions for m in v["LaunchTemplateData"]["BlockDeviceMappings"]]
    assert ebs and all(e["Encrypted"] and e["DeleteOnTermination"] for e in ebs), ebs
    orch("down", "fallback")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_an_on_demand_sweep_launches_on_the_fake_cloud(orch, cloud, identity):
    # EC2 refuses an on-demand launch whose template tags spot requests (the fake does too: docs/aws.md)
    path = smoke(orch, identity, "ondemand", command="true", grid={"lr": [1]}, aws_market="on-demand")
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    ledger = json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key="sweeps/ondemand/cost.json")["Body"].read())
    assert [e["market"] for e in ledger.values()] == ["on-demand"]
    orch("down", "ondemand")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_f_an_exception_after_createfleet_loses_no_instance(orch, cloud, identity):
    cloud.gate.garbled.add("DeleteLaunchTemplateVersions")  # the SDK raises a parser error, not a ClientError
    path = smoke(orch, identity, "orphans", command="true", grid={"lr": [1, 2]})
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    assert cloud.gate.counts["garbled:DeleteLaunchTemplateVersions"] >= 2
    used = cloud.instances("orphans", states=("pending", "running", "shutting-down", "terminated"))
    # each used by its run, then ended by its agent: `orch launch` returns once none runs (control/ended.py; before,
    # it could return a moment before an agent's TerminateInstances landed, seen in a fresh-clone run)
    assert len(used) == 2 and cloud.instances("orphans") == [], used
    orch("down", "orphans")
