"""The AWS path against a fake cloud as strict as EC2 (issue: AWS on the first real try).

Each test names the lettered defect it guards; each fails on the code before its fix. The first one
is the acceptance test: realistic boot and cold-start delays, exactly one instance per run.
"""

from __future__ import annotations

import json
import os

import boto3
import pytest
import yaml

from orchestrator.aws import ec2 as api
from orchestrator.aws import fleet
from orchestrator.aws import iam as iam_api
from orchestrator.aws.images import resolve_image
from orchestrator.store.s3 import S3Store
from tests.conftest import ROOT
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET, REGION, FakeCloud, Strictness

pytestmark = pytest.mark.slow


def smoke(orch, identity, name, **changes):
    """experiments/fakecloud-smoke.yaml as the README runs it (python: auto, instance_profile: create)."""
    spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    spec.update(name=name, store=f"s3://{BUCKET}/sweeps")
    spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
    for k, v in changes.items():
        (spec["aws"] if k.startswith("aws_") else spec)[k.removeprefix("aws_")] = v
    return orch.sweep(yaml.safe_dump(spec), name=f"{name}.yaml")


@pytest.fixture
def slow_cloud(tmp_path, orch):
    """EC2-like timing: sshd 75 s after `running`, 15 s more for the first interpreter start."""
    with FakeCloud(
        tmp_path / "cloud",
        boot_s=75,
        cold_s=15,
        strict=Strictness(instance_s=5, profile_s=10, group_s=3, pending_s=5, terminate_s=10),
    ) as c:
        orch.env.update(c.env())
        yield c
        assert not c.all_leftovers()


@pytest.mark.timeout(900)
def test_acceptance_three_runs_with_realistic_boot_use_exactly_three_instances(orch, slow_cloud, identity):
    """(a) start timeout from the agent's start, (b) instance profile on attempt 1, (e) NotFound, (g) interpreter."""
    path = smoke(orch, identity, "real", max_parallel=3)
    r = orch("launch", str(path), timeout=800)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "real")
    assert all(v["state"] == "succeeded" and v["attempt"] == 1 and v["preemptions"] == 0 for v in final.values()), final
    used = slow_cloud.instances("real", states=("pending", "running", "shutting-down", "terminated"))
    assert len(used) == 3, used  # one per run: no replacement loop
    assert slow_cloud.gate.counts["InvalidParameterValue"] > 0  # the new profile was refused at first, as on AWS
    assert slow_cloud.gate.counts["AccessDenied"] > 0  # hosts met S3's 403 for keys that do not exist yet
    d = orch("down", "real", timeout=600)
    assert d.code == 0, d.err
    assert not any(slow_cloud.leftovers("real").values())


def test_b_role_credentials_read_missing_keys_as_missing_and_nothing_else(cloud):
    iam = cloud.client("iam")
    long_sweep = "s" * 63
    profile = iam_api.ensure_instance_profile(iam, long_sweep, BUCKET, "sweeps")
    assert len(profile) <= 64 and iam_api.ensure_instance_profile(iam, long_sweep, BUCKET, "sweeps") == profile
    role = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"][0]
    c = cloud.client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="test")["Credentials"]
    cloud.gate.delivered(c["AccessKeyId"], role["RoleName"], "i-0123456789abcdef0")  # as the fake IMDS hands them out
    s3 = boto3.client(
        "s3",
        region_name=REGION,
        aws_access_key_id=c["AccessKeyId"],
        aws_secret_access_key=c["SecretAccessKey"],
        aws_session_token=c["SessionToken"],
    )
    mine = S3Store(f"s3://{BUCKET}/sweeps", client=s3)
    assert mine.get_bytes(f"{long_sweep}/run/status.json") is None  # a 403 from S3, read as "not there yet"
    mine.put_bytes(f"{long_sweep}/run/status.json", b"{}")
    assert mine.get_bytes(f"{long_sweep}/run/status.json") == b"{}"
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):  # another sweep's prefix stays closed
        mine.put_bytes("other/run/status.json", b"{}")
    from orchestrator.aws.teardown import teardown

    assert f"instance-profile/{profile}" in teardown(cloud.client("ec2"), iam, long_sweep)


def test_b_a_new_instance_profile_is_retried_until_ec2_sees_it(tmp_path):
    with FakeCloud(tmp_path / "c", strict=Strictness(profile_s=6)) as cloud:
        ec2 = cloud.client("ec2")
        profile = iam_api.ensure_instance_profile(cloud.client("iam"), "prop", BUCKET, "sweeps")
        image = resolve_image(ec2, cloud.image, "self", REGION)
        sg = api.ensure_security_group(ec2, "prop", cloud.vpc, "127.0.0.1/32")
        lt = api.ensure_launch_template(ec2, "prop", api.launch_template_data(image, sg, 20, profile, public_ip=False))
        choices = [fleet.Choice("g5.xlarge", s, az) for s, az in zip(cloud.subnets, ("us-east-1a", "us-east-1b"))]
        got = fleet.acquire(
            ec2,
            lt,
            api.template_data(ec2, lt),
            "#cloud-config\n",
            choices,
            ["spot"],
            api.sweep_tags("prop"),
            fleet.Blocklist(),
        )
        assert got.instance_id.startswith("i-") and cloud.gate.counts["InvalidParameterValue"] >= 2
        api.terminate(ec2, [got.instance_id])  # (e) a fresh id is NotFound for a moment: asked again, not failed


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


@pytest.mark.timeout(400)
def test_c_spot_quota_stops_the_sweep_with_the_quota_to_raise(orch, cloud, identity):
    cloud.gate.fleet_errors[("spot", "*", "*")] = "MaxSpotInstanceCountExceeded"
    path = smoke(orch, identity, "quota", command="true")
    r = orch("launch", str(path), timeout=300)
    assert r.code != 0 and "All G and VT Spot Instance Requests" in r.err and "Traceback" not in r.err, r.out + r.err
    assert cloud.instances("quota") == []
    orch("down", "quota")


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
    from orchestrator.aws.pricing import ON_DEMAND_USD_PER_H

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


@pytest.mark.timeout(400)
def test_f_an_exception_after_createfleet_loses_no_instance(orch, cloud, identity):
    cloud.gate.garbled.add("DeleteLaunchTemplateVersions")  # the SDK raises a parser error, not a ClientError
    path = smoke(orch, identity, "orphans", command="true", grid={"lr": [1, 2]})
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    assert cloud.gate.counts["garbled:DeleteLaunchTemplateVersions"] >= 2
    used = cloud.instances("orphans", states=("pending", "running", "shutting-down", "terminated"))
    assert len(used) == 2 and cloud.instances("orphans") == []  # each used by its run, then gone
    orch("down", "orphans")


@pytest.mark.timeout(400)
def test_g_an_interpreter_without_torch_stops_the_sweep_once_with_the_fix(orch, cloud, identity):
    path = smoke(orch, identity, "interp", aws_python="python3", max_parallel=1)
    r = orch("launch", str(path), timeout=300)
    assert r.code != 0 and "/opt/pytorch/bin/python" in r.err and "torch" in r.err and "Traceback" not in r.err, (
        r.out + r.err
    )
    used = cloud.instances("interp", states=("pending", "running", "shutting-down", "terminated"))
    assert len(used) == 1 and cloud.instances("interp") == []  # one host told us; it was terminated
    orch("down", "interp")


def test_h_an_instance_without_a_profile_is_refused_at_validation(orch, cloud, identity):
    path = smoke(orch, identity, "noprof", aws_instance_profile=None)
    r = orch("launch", str(path))
    assert (
        r.code == 2 and "aws.instance_profile" in r.err and "terminate itself" in r.err and "Traceback" not in r.err
    ), r.err
    assert not cloud.all_leftovers()


def test_i_root_volume_follows_the_image(cloud):
    ec2 = cloud.client("ec2")
    al = cloud.register_image("al2023-dl", root_device="/dev/xvda", snapshot_gb=75)
    image = resolve_image(ec2, al, "self", REGION)
    data = api.launch_template_data(image, "sg-1", 20, None, public_ip=False)
    assert data["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 75  # never below the snapshot
    assert (
        api.launch_template_data(image, "sg-1", 200, None, public_ip=False)["BlockDeviceMappings"][0]["Ebs"][
            "VolumeSize"
        ]
        == 200
    )


def test_j_reused_group_gets_the_current_cidr_and_public_ip_is_asked_for(orch, cloud, identity):
    ec2 = cloud.client("ec2")
    sg = api.ensure_security_group(ec2, "netw", cloud.vpc, "203.0.113.7/32")
    assert api.ensure_security_group(ec2, "netw", cloud.vpc, "198.51.100.9/32") == sg
    api.ensure_security_group(ec2, "netw", cloud.vpc, "198.51.100.9/32")  # a duplicate rule is fine
    cidrs = {
        r["CidrIp"]
        for p in ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]
        for r in p["IpRanges"]
    }
    assert cidrs == {"203.0.113.7/32", "198.51.100.9/32"}

    from orchestrator.backends.aws.backend import AwsBackend
    from orchestrator.backends.registry import load_sweep

    path = smoke(
        orch,
        identity,
        "netw",
        aws_ssh={"address": "public_ip", "identity": str(identity), "user": "root", "port": 2222},
    )
    backend = AwsBackend(load_sweep(path))
    try:
        setup = backend.bootstrap()  # the fake's subnets, like most custom VPCs', do not map public IPs
        nic = setup["base"]["NetworkInterfaces"][0]
        assert (
            nic["AssociatePublicIpAddress"] is True
            and nic["Groups"] == [sg]
            and "SecurityGroupIds" not in setup["base"]
        )
    finally:
        from orchestrator.aws.teardown import teardown

        teardown(ec2, cloud.client("iam"), "netw")


@pytest.mark.timeout(400)
def test_k_down_waits_for_shutting_down_instead_of_hammering_the_group(orch, tmp_path, identity):
    with FakeCloud(tmp_path / "c", strict=Strictness(terminate_s=8)) as cloud:
        orch.env.update(cloud.env())
        path = smoke(orch, identity, "slowdown", command="sleep 600", grid={"lr": [1]})
        assert orch("launch", str(path), "--detach").code == 0
        from orchestrator.wait import retry_until

        retry_until(
            lambda: status(orch, "slowdown").get("lr=1", {}).get("state") == "running", 120, 0.5, "the run to start"
        )
        d = orch("down", "slowdown", timeout=300)
        assert d.code == 0, d.out + d.err  # one go
        assert cloud.gate.counts["DependencyViolation"] == 0
        assert not any(cloud.leftovers("slowdown").values())


def test_no_default_vpc_is_a_clear_error(orch, tmp_path, identity):
    with FakeCloud(tmp_path / "c", default_vpc=False) as cloud:
        orch.env.update(cloud.env())
        r = orch("launch", str(smoke(orch, identity, "novpc", command="true")))
        assert r.code != 0 and "no default VPC" in r.err and "aws.subnet_ids" in r.err and "Traceback" not in r.err, (
            r.err
        )
        assert not cloud.all_leftovers()
