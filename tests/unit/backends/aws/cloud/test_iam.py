"""Instance profiles and their role (backends/aws/cloud/iam.py) on the fake cloud: what the role may read and write, a
new profile that EC2 does not see yet, and the KMS key of an encrypted bucket granted to the role."""

from __future__ import annotations

import boto3
import pytest

from orchestrator.backends.aws.backend import AwsBackend
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, groups
from orchestrator.backends.aws.cloud import iam as iam_api
from orchestrator.backends.aws.cloud.images import resolve_image
from orchestrator.backends.registry import load_sweep
from orchestrator.store.s3 import S3Store
from tests.fakecloud import BUCKET, REGION, FakeCloud, Strictness


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


@pytest.mark.slow
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
    from orchestrator.backends.aws.cloud.teardown import teardown

    assert f"instance-profile/{profile}" in teardown(cloud.client("ec2"), iam, long_sweep)


@pytest.mark.slow
def test_b_a_new_instance_profile_is_retried_until_ec2_sees_it(tmp_path):
    with FakeCloud(tmp_path / "c", strict=Strictness(profile_s=6)) as cloud:
        ec2 = cloud.client("ec2")
        profile = iam_api.ensure_instance_profile(cloud.client("iam"), "prop", BUCKET, "sweeps")
        image = resolve_image(ec2, cloud.image, "self", REGION)
        sg = groups.ensure_security_group(ec2, "prop", cloud.vpc, "127.0.0.1/32")
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
