"""The sweep's instance role and profile (IAM), and the KMS keys its buckets encrypt with: what an instance may do.

Plain functions over boto3 clients, as in ec2.py; `orch aws policy` documents the caller's side
(docs/aws.md), this module the instances' side.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.backends.aws.cloud.ec2 import AwsFatal, error_code, error_message, explain
from orchestrator.backends.aws.cloud.policy import (
    CONTROLLER_EC2_CREATE,
    CONTROLLER_ON_SWEEP,
    INSTANCES,
    ITSELF,
    boundary_arn,
    in_regions,
    pass_role_statement,
    remote_controller_statements,
)
from orchestrator.contract import RUNG_TAG
from orchestrator.store.s3url import parse_s3
from orchestrator.sweep.packing import SLOT_TAG

log = logging.getLogger("orch.ec2")

IAM_NAME_MAX = 64


def iam_name(sweep: str, suffix: str = "") -> str:
    """The sweep's role and instance profile name, within IAM's 64 characters; `suffix` (after a period, which no
    sweep name holds, so no sweep's role can be another's controller role) names the sweep's other roles."""
    tail = f".{suffix}" if suffix else ""
    name = f"orch-{sweep}{tail}"
    if len(name) <= IAM_NAME_MAX:
        return name
    digest = hashlib.sha256((sweep + tail).encode()).hexdigest()[:8]
    return f"{name[: IAM_NAME_MAX - 9 - len(tail)]}-{digest}{tail}"


CONTROLLER_SUFFIX = "controller"


def controller_iam_name(sweep: str) -> str:
    """The role and instance profile of the sweep's remote controller (`orch launch --remote`)."""
    return iam_name(sweep, CONTROLLER_SUFFIX)


def bucket_kms_keys(s3, buckets: Sequence[str], kms=None) -> list[str]:
    """The customer-managed KMS keys the buckets encrypt new objects with by default (GetBucketEncryption;
    IAM action s3:GetEncryptionConfiguration), as key ARNs: an instance must be allowed to use them to read
    (kms:Decrypt) and write (kms:GenerateDataKey) there. A bucket without SSE-KMS, or with the AWS managed key
    aws/s3 (whose key policy already lets the account use it through S3), adds nothing; one whose configuration
    orch may not read is logged and skipped. A bucket may name its key by id, alias or alias ARN, none of which
    an IAM policy accepts as a resource (KMS developer guide, "Specifying KMS keys in IAM policy statements"):
    `kms` (a KMS client; by default one of the bucket client's region) resolves those to the key ARN
    (DescribeKey); one it cannot resolve is kept as it is and granted through S3 only (kms_statements)."""
    from botocore.exceptions import ClientError

    from orchestrator.backends.aws.cloud.ec2 import client

    keys: list[str] = []
    for b in dict.fromkeys(buckets):
        try:
            rules = s3.get_bucket_encryption(Bucket=b)["ServerSideEncryptionConfiguration"]["Rules"]
        except ClientError as exc:
            if error_code(exc) not in ("ServerSideEncryptionConfigurationNotFoundError",):
                log.warning(
                    "cannot read the default encryption of bucket %s (%s): if it uses a KMS key of yours, the "
                    "instances may not read or write it. Allow s3:GetEncryptionConfiguration (see `orch aws policy`).",
                    b,
                    error_code(exc),
                )
            continue
        for rule in rules:
            default = rule.get("ApplyServerSideEncryptionByDefault") or {}
            key = default.get("KMSMasterKeyID")
            if default.get("SSEAlgorithm", "").startswith("aws:kms") and key:
                if not is_key_arn(key):
                    kms = kms or client("kms", s3.meta.region_name)
                    key = key_arn(kms, key)
                if key not in keys:
                    keys.append(key)
    return keys


def is_key_arn(key: str) -> bool:
    return key.startswith("arn:") and ":key/" in key


def key_arn(kms, key: str) -> str:
    """The ARN of the KMS key that `key` (a key id, key ARN, alias name or alias ARN) names; `key` itself when
    KMS does not say (the caller may not describe it, or it is gone)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if is_key_arn(key):
        return key
    try:
        return kms.describe_key(KeyId=key)["KeyMetadata"]["Arn"]
    except (ClientError, BotoCoreError) as exc:
        log.warning(
            "cannot resolve the KMS key %s to its ARN (%s): the instances may use it only through S3 "
            "(kms:ViaService). Allow kms:DescribeKey (see `orch aws policy`).",
            key,
            error_code(exc) or type(exc).__name__,
        )
        return key


def kms_statements(keys: Sequence[str]) -> list[dict]:
    """kms:Decrypt and kms:GenerateDataKey on the keys, by key ARN; a key known only by id or alias (which
    cannot be a policy resource) is allowed on any key, only when S3 calls KMS."""
    actions = ["kms:Decrypt", "kms:GenerateDataKey"]
    arns = [k for k in keys if is_key_arn(k)]
    out = [{"Effect": "Allow", "Action": actions, "Resource": arns}] if arns else []
    if len(arns) < len(keys):
        out.append(
            {
                "Effect": "Allow",
                "Action": actions,
                "Resource": "*",
                "Condition": {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}},
            }
        )
    return out


def instance_profile_policy(
    bucket: str,
    prefix: str,
    sweep: str,
    data: Sequence[str] = (),
    kms_keys: Sequence[str] = (),
    regions: Sequence[str] = (),
) -> dict:
    """What an instance of the sweep may do: its own S3 prefix, read its `data:` prefixes (and use the
    KMS keys those buckets encrypt with), and terminate itself and remove its own slot and rung tags (a packed
    run gives its slot back; a `prune:` run says it reported a rung); EC2 only in the sweep's `regions`."""
    reads = []
    for url in data:
        where = parse_s3(url)
        b, p = where.bucket, where.prefix
        reads += [
            {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{b}/{p + '/' if p else ''}*"]},
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{b}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{p}/*" if p else "*"]}},
            },
        ]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            *store_statements(bucket, prefix, sweep),
            {  # only the instance whose credentials these are: never the remote controller's, nor another run's
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances"],
                "Resource": INSTANCES,
                "Condition": {"StringEquals": {"aws:ResourceTag/orch:sweep": sweep}, **ITSELF},
            },
            {  # only the tags a host gives back, on itself; named (DeleteTags without tags would remove every tag,
                # orch:sweep too, and hide the instance from the controller)
                "Effect": "Allow",
                "Action": ["ec2:DeleteTags"],
                "Resource": INSTANCES,
                "Condition": {
                    **ITSELF,
                    "StringEquals": {"aws:ResourceTag/orch:sweep": sweep},
                    "ForAllValues:StringLike": {"aws:TagKeys": [f"{SLOT_TAG}*", f"{RUNG_TAG}*"]},
                    "Null": {"aws:TagKeys": "false"},
                },
            },
        ],
    }
    policy["Statement"] += reads + kms_statements(kms_keys) + _unnamed(in_regions(regions))
    return policy


def _unnamed(statements: list[dict]) -> list[dict]:
    return [{k: v for k, v in st.items() if k != "Sid"} for st in statements]


def store_statements(bucket: str, prefix: str, sweep: str) -> list[dict]:
    """Objects under the sweep's prefix, and listing only there."""
    base = f"{prefix}/{sweep}" if prefix else sweep
    return [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            "Resource": [f"arn:aws:s3:::{bucket}/{base}/*"],
        },
        {
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{bucket}"],
            "Condition": {"StringLike": {"s3:prefix": [f"{base}/*"]}},
        },
    ]


def controller_role_policy(
    bucket: str,
    prefix: str,
    sweep: str,
    host_role_arn: str,
    kms_keys: Sequence[str] = (),
    scope: LaunchScope | None = None,
) -> dict:
    """What the sweep's remote controller may do: its sweep's S3 prefix; read EC2, launch hosts through the sweep's
    launch template (only its instance types, images of its owners, subnets of its VPCs, in its regions: `scope`)
    and change or remove only what carries its sweep's tag; pass exactly its sweep's host role, to EC2. No other IAM
    call: the laptop made every role and profile before it started the controller."""
    scope = scope or LaunchScope()
    launch = remote_controller_statements(sweep, scope.instance_types, scope.owners, scope.vpcs)
    statements = store_statements(bucket, prefix, sweep) + _unnamed(launch)
    statements.append({k: v for k, v in pass_role_statement([host_role_arn]).items() if k != "Sid"})
    statements += kms_statements(kms_keys) + _unnamed(in_regions(scope.allowed()))
    if scope.regions and scope.home and scope.home not in scope.regions:
        statements += _unnamed(no_launch_in(scope.home))
    return {"Version": "2012-10-17", "Statement": statements}


@dataclass(frozen=True)
class LaunchScope:
    """What a sweep's remote controller may launch: its instance types, images of these owners (ec2:Owner values),
    subnets of these VPCs (ids), in these regions; empty: any."""

    instance_types: tuple[str, ...] = ()
    owners: tuple[str, ...] = ("amazon",)
    vpcs: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    home: str = ""  # where the controller runs: when no listed region, EC2 there too, but no launch

    def allowed(self) -> tuple[str, ...]:
        """Where its EC2 calls go: its regions and its home (none: any)."""
        return tuple(dict.fromkeys([*self.regions, self.home])) if self.regions and self.home else self.regions


def no_launch_in(region: str) -> list[dict]:
    """A Deny, in `region`, of every EC2 change a controller's role allows but ending instances: a --remote
    controller's home that is no listed region holds the controller (which ends itself there), never its hosts."""
    changes = [a for a in [*CONTROLLER_EC2_CREATE, *CONTROLLER_ON_SWEEP] if a != "ec2:TerminateInstances"]
    return [
        {
            "Sid": "NoLaunchInHome",
            "Effect": "Deny",
            "Resource": "*",
            "Action": changes,
            "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
        }
    ]


SPOT_SERVICE = "spot.amazonaws.com"


def ensure_spot_service_role(iam) -> None:
    """The spot service-linked role (AWSServiceRoleForEC2Spot), made now with the caller's rights (the laptop's
    policy allows iam:CreateServiceLinkedRole for spot; a remote controller's role has no IAM write). IAM answers
    InvalidInput "... has been taken in this account" when it exists: that is success."""
    from botocore.exceptions import ClientError

    try:
        iam.create_service_linked_role(AWSServiceName=SPOT_SERVICE)
    except ClientError as exc:
        if error_code(exc) == "InvalidInput" and "has been taken" in error_message(exc):
            return
        raise explain(exc, "creating the spot service-linked role AWSServiceRoleForEC2Spot") from None


def account_boundary(iam) -> str:
    """The ARN of orch's permissions boundary in the caller's account (STS GetCallerIdentity, which needs no
    permission)."""
    return boundary_arn(_account(iam))


def _account(iam) -> str:
    import boto3

    return boto3.client("sts", region_name=iam.meta.region_name).get_caller_identity()["Account"]


def ensure_instance_profile(
    iam,
    sweep: str,
    bucket: str,
    prefix: str,
    data: Sequence[str] = (),
    kms_keys: Sequence[str] = (),
    regions: Sequence[str] = (),
) -> str:
    """The sweep's role + instance profile (created or updated), found by name; returns the profile name. The
    role carries orch's permissions boundary (`orch aws boundary`): the documented policy allows no other."""
    policy = instance_profile_policy(bucket, prefix, sweep, data, kms_keys, regions)
    return ensure_role_profile(iam, iam_name(sweep), sweep, policy, "the sweep's instance profile")


def ensure_controller_profile(
    iam,
    sweep: str,
    bucket: str,
    prefix: str,
    host_role: str,
    kms_keys: Sequence[str] = (),
    scope: LaunchScope | None = None,
) -> str:
    """The remote controller's role + instance profile, under the same boundary; returns the profile name."""
    role_arn = f"arn:aws:iam::{_account(iam)}:role/{host_role}"
    policy = controller_role_policy(bucket, prefix, sweep, role_arn, kms_keys, scope)
    return ensure_role_profile(iam, controller_iam_name(sweep), sweep, policy, "the sweep's controller profile")


def _profile_with_role(iam, name: str, tags: list) -> None:
    """The instance profile `name` holding the role `name`. Two launches of one sweep may race here: the one that
    finds the profile or its role already made by the other uses them (AWS answers EntityAlreadyExists, or
    LimitExceeded for a second role, one role being a profile's quota)."""
    from botocore.exceptions import ClientError

    def current() -> dict:
        try:
            return iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        except ClientError as exc:
            if error_code(exc) != "NoSuchEntity":
                raise
        try:
            return iam.create_instance_profile(InstanceProfileName=name, Tags=tags)["InstanceProfile"]
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            return iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]

    if any(r["RoleName"] == name for r in current().get("Roles", [])):
        return
    try:
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    except ClientError as exc:
        if error_code(exc) != "LimitExceeded" or not any(r["RoleName"] == name for r in current().get("Roles", [])):
            raise


def ensure_role_profile(iam, name: str, sweep: str, policy: dict, what: str) -> str:
    """A role and instance profile of that name with this inline policy and orch's boundary (created or updated)."""
    from botocore.exceptions import ClientError

    boundary = account_boundary(iam)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    tags = [{"Key": "orch:sweep", "Value": sweep}]
    try:
        try:
            iam.create_role(
                RoleName=name, AssumeRolePolicyDocument=json.dumps(trust), Tags=tags, PermissionsBoundary=boundary
            )
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
        iam.put_role_policy(RoleName=name, PolicyName="orch-sweep", PolicyDocument=json.dumps(policy))
        _profile_with_role(iam, name, tags)
    except ClientError as exc:
        if error_code(exc) == "AccessDenied":
            raise AwsFatal(
                f"creating {what}: permission denied ({error_message(exc)}). orch creates roles only "
                f"with the permissions boundary {boundary}: an admin creates it once (`orch aws boundary`, "
                "docs/aws.md); a role orch-* made without it cannot be changed by orch (remove it, or name your own "
                "profile in `aws.instance_profile`)."
            ) from None
        raise explain(exc, f"creating {what}") from None
    return name
