"""AWS on the first real try, round 2: what AWS's documents say that the fake cloud now imitates, and orch's
answer to each (docs/aws.md's table names the source of each)."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends.aws.backend import AwsBackend
from orchestrator.backends.registry import load_sweep
from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.fakecloud import IMAGE_NAME


def test_a_relaunch_uses_todays_image_not_the_templates_first(orch, cloud, identity):
    path = orch.sweep(cloud.sweep_yaml("tpl", identity, "true"))
    first = AwsBackend(load_sweep(path))
    old = first.bootstrap()
    assert old["base"]["ImageId"] == cloud.image
    time.sleep(1.1)  # a newer CreationDate: `image:` names a pattern, resolved to the newest match
    newer = cloud.register_image(IMAGE_NAME)
    again = AwsBackend(load_sweep(path)).bootstrap()  # the sweep's launch template exists from the first launch
    assert again["template"] == old["template"]
    assert again["base"]["ImageId"] == newer  # each instance's template version carries it, not version 1's image
    assert "LaunchTemplateInstanceMetadataOptions" not in str(
        again["base"]
    )  # request fields only, never a describe answer
    first.pool.shutdown(wait=False)
    from orchestrator.aws import ec2 as api
    from orchestrator.aws.teardown import teardown

    teardown(api.client("ec2", "us-east-1"), api.client("iam", "us-east-1"), "tpl")  # what the two bootstraps made


def test_private_ip_without_ssh_cidr_is_refused_with_the_fix(orch, cloud, identity):
    text = cloud.sweep_yaml("privnet", identity, "true").replace("  ssh_cidr: 127.0.0.1/32\n", "")
    r = orch("launch", str(orch.sweep(text)), "--dry-run")
    assert r.code == 2 and "aws.ssh_cidr" in r.err and "private_ip" in r.err and "Traceback" not in r.err, r.err


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


def test_a_run_is_not_packed_where_the_safety_net_shutdown_would_cut_it():
    from orchestrator.backends.aws.pack import lives_long_enough

    def fits(max_minutes, timeout_minutes, age_minutes):
        return lives_long_enough(max_minutes, timeout_minutes, 0.0, age_minutes * 60.0)

    assert fits(240, 60, 100) and not fits(240, 60, 180)  # 60 min left: not enough for a 60-min run plus its sync
    assert fits(240, None, 100) and not fits(
        240, None, 130
    )  # without a timeout: at least half the instance's life left


def test_a_bucket_encrypted_with_a_kms_key_gets_that_key_in_the_instance_profile(orch, cloud, identity, monkeypatch):
    """S3 user guide, "Using SSE-KMS": reading an SSE-KMS object needs kms:Decrypt on its key, writing needs
    kms:GenerateDataKey. Preflight reads the bucket's default encryption (s3:GetEncryptionConfiguration, in the
    documented policy) and grants the key to the instance role it creates."""
    import json as _json

    from tests.fakecloud import BUCKET

    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    cloud.client("s3").put_bucket_encryption(
        Bucket=BUCKET,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}}]
        },
    )
    for k, v in cloud.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    sweep = load_sweep(orch.sweep(cloud.sweep_yaml("kmsb", identity, "true")))
    backend = AwsBackend(sweep)
    backend.preflight()
    try:
        doc = cloud.client("iam").get_role_policy(RoleName="orch-kmsb", PolicyName="orch-sweep")["PolicyDocument"]
        doc = _json.loads(doc) if isinstance(doc, str) else doc
        granted = [s for s in doc["Statement"] if "kms:Decrypt" in s["Action"]]
        assert granted and granted[0]["Resource"] == [key] and "kms:GenerateDataKey" in granted[0]["Action"], doc
        assert "s3:GetEncryptionConfiguration" not in cloud.gate.denied
    finally:
        backend.teardown()
