"""What orch verifies when it brings bytes back from S3, and how it names the KMS keys of buckets it grants."""

from __future__ import annotations

import os

import pytest

from tests.fakecloud import BUCKET

BIG = 20 * 1024 * 1024  # above the 16 MB multipart threshold: uploaded in parts, fetched in ranged GETs


def _corrupt(bucket: str, key: str, at: int = 9 * 1024 * 1024) -> None:
    """Flip one byte of an object inside moto, keeping its size, ETag and stored checksum: what a bad disk, a bad
    transfer or a bug would leave."""
    from moto.s3.models import s3_backends

    from tests.fakecloud.gate import ACCOUNT, MOTO

    with MOTO:
        obj = s3_backends[ACCOUNT]["aws"].buckets[bucket].keys.get(key)
        buf = obj._value_buffer
        buf.seek(at)
        byte = buf.read(1)
        buf.seek(at)
        buf.write(bytes([byte[0] ^ 0xFF]))


def test_a_large_object_corrupted_in_s3_is_refused_by_staging_and_by_a_restore(tmp_path):
    """botocore checks no checksum of a large object (its multipart checksum is composite, its ranged GETs carry
    none): staging and a checkpoint restore hold the bytes to the SHA-256 orch recorded when it uploaded them."""
    from orchestrator.errors import OrchError
    from orchestrator.host.staging import push, stage
    from orchestrator.store.s3 import S3Store
    from tests.fakecloud import FakeCloud

    src = tmp_path / "ds"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(BIG))
    (src / "small.bin").write_bytes(b"x" * 1000)
    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        assert push(src, f"s3://{BUCKET}/ds/", s3).fetched == 2
        good = stage(f"s3://{BUCKET}/ds/", str(tmp_path / "first"), s3)
        assert good.fetched == 2 and (tmp_path / "first" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        _corrupt(BUCKET, "ds/big.bin")
        with pytest.raises(OSError, match="SHA-256"):
            stage(f"s3://{BUCKET}/ds/", str(tmp_path / "staged"), s3)
        assert not (tmp_path / "staged" / "big.bin").exists()

        store = S3Store(f"s3://{BUCKET}/pre", client=s3)
        store.sync_up(src, "sweep/run/ckpt/10")
        _corrupt(BUCKET, "pre/sweep/run/ckpt/10/big.bin")
        with pytest.raises(OrchError, match="SHA-256"):
            store.sync_down("sweep/run/ckpt/10", tmp_path / "restored")
        assert not (tmp_path / "restored" / "big.bin").exists()


def test_bucket_keys_named_by_alias_or_key_id_are_granted_by_key_arn(cloud):
    """KMS developer guide, "Specifying KMS keys in IAM policy statements": no key id, alias name or alias ARN in
    an IAM Resource. A bucket's default key given any of those ways reaches the instance role as the key's ARN,
    resolved with kms:DescribeKey under the documented policy (the gate checks the controller's calls)."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import bucket_kms_keys, instance_profile_policy

    kms = cloud.client("kms")
    one = kms.create_key()["KeyMetadata"]
    two = kms.create_key()["KeyMetadata"]
    kms.create_alias(AliasName="alias/orch-data", TargetKeyId=one["KeyId"])
    kms.create_alias(AliasName="alias/orch-other", TargetKeyId=two["KeyId"])
    admin_s3 = cloud.client("s3")
    admin_s3.create_bucket(Bucket="orch-kms")

    def encrypt(bucket: str, key: str) -> None:
        admin_s3.put_bucket_encryption(
            Bucket=bucket,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}}]
            },
        )

    s3 = api.client("s3", "us-east-1")  # the controller's credentials
    for named in ("alias/orch-data", one["KeyId"], one["Arn"]):
        encrypt(BUCKET, named)
        assert bucket_kms_keys(s3, [BUCKET]) == [one["Arn"]], named
    encrypt(BUCKET, "arn:aws:kms:us-east-1:123456789012:alias/orch-other")  # an alias ARN
    encrypt("orch-kms", one["Arn"])
    keys = bucket_kms_keys(s3, [BUCKET, "orch-kms"])
    assert keys == [two["Arn"], one["Arn"]]
    doc = instance_profile_policy(BUCKET, "pre", "s", [], keys)
    granted = [st for st in doc["Statement"] if "kms:Decrypt" in st["Action"]]
    assert granted == [
        {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [two["Arn"], one["Arn"]]}
    ]
    assert not cloud.gate.denied
