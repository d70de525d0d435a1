"""EC2 and IAM calls: the only module that talks to the EC2 API (backends/aws.py and the agent call these).

Plain functions over a boto3 client; what crosses out of here is dicts of plain values and the
dataclasses below, never a boto3 object. Throttling is retried by botocore's standard mode.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .errors import OrchError

log = logging.getLogger("orch.ec2")

# Errors that say "not here, not now": block that (type, subnet) for a while and try the next.
CAPACITY_ERRORS = {
    "InsufficientInstanceCapacity", "UnfulfillableCapacity", "InsufficientCapacity", "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet", "InsufficientHostCapacity", "capacity-not-available",
}
# Errors no retry fixes: stop and say what to do.
QUOTA_ERRORS = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotFleetRequestCountExceeded", "RequestLimitExceeded_quota"}
PERMISSION_ERRORS = {"UnauthorizedOperation", "AccessDenied", "AuthFailure", "OptInRequired", "Blocked"}
BLOCK_S = 300.0  # how long a (type, subnet) stays blocked after a capacity error
LIVE_STATES = ["pending", "running", "stopping", "stopped"]


class AwsFatal(OrchError):
    """Credentials, permission or quota: retrying cannot help, so the sweep stops with the next step."""


class CapacityUnavailable(OrchError):
    """No (type, AZ) could give an instance right now; the run stays queued and is tried again later."""


def client(service: str, region: str):
    import boto3
    from botocore.config import Config

    return boto3.client(service, region_name=region, config=Config(retries={"mode": "standard", "max_attempts": 8}))


def _code(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def explain(exc, what: str) -> OrchError:
    """A ClientError/credentials error as an OrchError with the next step."""
    from botocore.exceptions import NoCredentialsError, NoRegionError

    if isinstance(exc, NoCredentialsError):
        return AwsFatal("No AWS credentials found. Run `aws configure` or set AWS_PROFILE.")
    if isinstance(exc, NoRegionError):
        return AwsFatal("No AWS region set. Set `aws.region` in the sweep.")
    code = _code(exc)
    msg = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
    if code in PERMISSION_ERRORS or code.startswith("InvalidClientTokenId"):
        return AwsFatal(f"{what}: permission denied ({code}: {msg}). Grant the caller EC2/IAM/S3 rights for orch (see README) or use another AWS_PROFILE.")
    if code in QUOTA_ERRORS:
        return AwsFatal(f"{what}: quota reached ({code}: {msg}). Ask AWS for a higher limit (Service Quotas: 'All G and VT Spot Instance Requests') or lower max_parallel.")
    return OrchError(f"{what} failed: {code or type(exc).__name__}: {msg}")


# --- resolving what the sweep names ---------------------------------------------------------------


def resolve_image(ec2, image: str, owner: str, region: str) -> str:
    from botocore.exceptions import ClientError

    try:
        if image.startswith("ami-"):
            found = ec2.describe_images(ImageIds=[image])["Images"]
        else:
            found = ec2.describe_images(Owners=[owner], Filters=[{"Name": "name", "Values": [image]}])["Images"]
    except ClientError as exc:
        if _code(exc).startswith("InvalidAMIID"):
            found = []
        else:
            raise explain(exc, "looking up the AMI") from None
    if not found:
        raise OrchError(f"AMI {image!r} not found in {region} (owner {owner}). Check `aws.image` and `aws.region`; AMI ids differ per region.")
    return sorted(found, key=lambda i: i.get("CreationDate", ""))[-1]["ImageId"]


def resolve_subnets(ec2, subnet_ids: List[str], region: str) -> List[dict]:
    """[{SubnetId, AvailabilityZone, VpcId}] of the configured subnets, or the default VPC's."""
    from botocore.exceptions import ClientError

    try:
        if subnet_ids:
            subnets = ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]
        else:
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                raise OrchError(f"no default VPC in {region}. Set `aws.subnet_ids` to subnets of your VPC.")
            subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}])["Subnets"]
    except ClientError as exc:
        if _code(exc).startswith("InvalidSubnetID"):
            raise OrchError(f"subnet not found in {region}: {', '.join(subnet_ids)}. Check `aws.subnet_ids` (`aws ec2 describe-subnets`).") from None
        raise explain(exc, "looking up subnets") from None
    if len({s["VpcId"] for s in subnets}) > 1:
        raise OrchError("`aws.subnet_ids` span several VPCs; give subnets of one VPC.")
    return [{"SubnetId": s["SubnetId"], "AvailabilityZone": s["AvailabilityZone"], "VpcId": s["VpcId"]} for s in subnets]


def caller_cidr() -> str:
    """This machine's public address as a /32, for the SSH rule."""
    import urllib.request

    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as r:
            ip = r.read().decode().strip()
    except OSError:
        raise OrchError("could not find this machine's public address. Set `aws.ssh_cidr` (e.g. 203.0.113.7/32) or `aws.security_group`.") from None
    return f"{ip}/32"


# --- per-sweep resources --------------------------------------------------------------------------


def sweep_tags(sweep: str, **extra: str) -> List[dict]:
    tags = {"orch:sweep": sweep, **{f"orch:{k}": v for k, v in extra.items()}}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def ensure_security_group(ec2, sweep: str, vpc_id: str, cidr: str) -> str:
    from botocore.exceptions import ClientError

    name = f"orch-{sweep}"
    found = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}])["SecurityGroups"]
    if found:
        return found[0]["GroupId"]
    gid = ec2.create_security_group(
        GroupName=name, Description=f"orch sweep {sweep}: ssh from one address", VpcId=vpc_id,
        TagSpecifications=[{"ResourceType": "security-group", "Tags": sweep_tags(sweep)}],
    )["GroupId"]
    try:
        ec2.authorize_security_group_ingress(
            GroupId=gid, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": cidr, "Description": "orch controller"}]}]
        )
    except ClientError as exc:
        if _code(exc) != "InvalidPermission.Duplicate":
            raise
    return gid


def instance_profile_policy(bucket: str, prefix: str, sweep: str) -> dict:
    """What an instance of the sweep may do: its own S3 prefix, and terminate instances of its sweep."""
    base = f"{prefix}/{sweep}" if prefix else sweep
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
             "Resource": [f"arn:aws:s3:::{bucket}/{base}/*"]},
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{base}/*"]}}},
            {"Effect": "Allow", "Action": ["ec2:TerminateInstances"], "Resource": "*",
             "Condition": {"StringEquals": {"aws:ResourceTag/orch:sweep": sweep}}},
        ],
    }


def ensure_instance_profile(iam, sweep: str, bucket: str, prefix: str) -> str:
    from botocore.exceptions import ClientError

    name = f"orch-{sweep}"
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    try:
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust), Tags=[{"Key": "orch:sweep", "Value": sweep}])
    except ClientError as exc:
        if _code(exc) != "EntityAlreadyExists":
            raise explain(exc, "creating the instance role") from None
    iam.put_role_policy(RoleName=name, PolicyName="orch-sweep", PolicyDocument=json.dumps(instance_profile_policy(bucket, prefix, sweep)))
    try:
        iam.create_instance_profile(InstanceProfileName=name, Tags=[{"Key": "orch:sweep", "Value": sweep}])
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    except ClientError as exc:
        if _code(exc) != "EntityAlreadyExists":
            raise explain(exc, "creating the instance profile") from None
    return name


def ensure_launch_template(ec2, sweep: str, image_id: str, sg_id: str, volume_gb: int, profile: Optional[str]) -> str:
    name = f"orch-{sweep}"
    found = ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [name]}])["LaunchTemplates"]
    if found:
        return found[0]["LaunchTemplateId"]
    data = {
        "ImageId": image_id,
        "SecurityGroupIds": [sg_id],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": volume_gb, "VolumeType": "gp3",
                                                                   "DeleteOnTermination": True, "Encrypted": True}}],
    }
    if profile:
        data["IamInstanceProfile"] = {"Name": profile}
    return ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData=data,
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": sweep_tags(sweep)}],
    )["LaunchTemplate"]["LaunchTemplateId"]


# --- acquiring one instance -----------------------------------------------------------------------


@dataclass
class Choice:
    """An (instance type, subnet) pair CreateFleet may use."""

    instance_type: str
    subnet_id: str
    az: str


@dataclass
class Acquired:
    instance_id: str
    instance_type: str
    subnet_id: str
    az: str
    market: str  # spot | on-demand


@dataclass
class Blocklist:
    """(type, subnet) pairs to avoid for a while.

    Hard blocks follow a capacity error (AWS just said no). Soft blocks follow a reclaim: that
    pool is tight, so other choices go first, but it is still tried when nothing else is left.
    """

    until: Dict[Tuple[str, str], float] = field(default_factory=dict)
    soft_until: Dict[Tuple[str, str], float] = field(default_factory=dict)

    def block(self, instance_type: str, subnet_id: str, seconds: float = BLOCK_S) -> None:
        self.until[(instance_type, subnet_id)] = time.time() + seconds

    def avoid(self, instance_type: str, subnet_id: str, seconds: float = BLOCK_S) -> None:
        self.soft_until[(instance_type, subnet_id)] = time.time() + seconds

    def allowed(self, choices: List[Choice]) -> List[Choice]:
        now = time.time()
        open_ = [c for c in choices if self.until.get((c.instance_type, c.subnet_id), 0) <= now]
        preferred = [c for c in open_ if self.soft_until.get((c.instance_type, c.subnet_id), 0) <= now]
        return preferred or open_


def _fleet(ec2, template_id: str, version: str, choices: List[Choice], market: str, tags: List[dict]) -> dict:
    return ec2.create_fleet(
        Type="instant",
        ClientToken=str(uuid.uuid4()),
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": market},
        SpotOptions={"AllocationStrategy": "price-capacity-optimized"},
        OnDemandOptions={"AllocationStrategy": "lowest-price"},
        LaunchTemplateConfigs=[{
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": version},
            "Overrides": [{"InstanceType": c.instance_type, "SubnetId": c.subnet_id} for c in choices],
        }],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
    )


def template_data(ec2, template_id: str) -> dict:
    """The base launch template data (version 1), which each per-instance version repeats with its user data."""
    return ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=["1"])["LaunchTemplateVersions"][0]["LaunchTemplateData"]


def acquire(ec2, template_id: str, base: dict, user_data: str, choices: List[Choice], markets: List[str], tags: List[dict],
            blocklist: Blocklist) -> Acquired:
    """One instance from the first market and (type, subnet) that has capacity.

    The user data (it holds this instance's host key) lives in a template version that is
    deleted as soon as the fleet answered.
    """
    from botocore.exceptions import ClientError

    if not blocklist.allowed(choices):  # everything just refused: wait without calling the API
        raise CapacityUnavailable(f"no capacity for {', '.join(sorted({c.instance_type for c in choices}))} right now (all choices cooling down); will retry")
    try:
        version = str(ec2.create_launch_template_version(
            LaunchTemplateId=template_id,
            LaunchTemplateData={**base, "UserData": base64.b64encode(user_data.encode()).decode()},
        )["LaunchTemplateVersion"]["VersionNumber"])
    except ClientError as exc:
        raise explain(exc, "creating a launch template version") from None
    try:
        for market in markets:
            while True:
                allowed = blocklist.allowed(choices)
                if not allowed:
                    break
                try:
                    answer = _fleet(ec2, template_id, version, allowed, market, tags)
                except ClientError as exc:
                    code = _code(exc)
                    if code in CAPACITY_ERRORS:  # the whole request was refused: block what it offered
                        log.info("capacity error %s for %s; trying the next choice", code, [(c.instance_type, c.az) for c in allowed])
                        for c in allowed[:1]:
                            blocklist.block(c.instance_type, c.subnet_id)
                        continue
                    raise explain(exc, "CreateFleet") from None
                for inst in answer.get("Instances", []):
                    if inst.get("InstanceIds"):
                        o = inst.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
                        chosen = next((c for c in allowed if c.instance_type == o.get("InstanceType") and c.subnet_id == o.get("SubnetId")), allowed[0])
                        return Acquired(inst["InstanceIds"][0], o.get("InstanceType", chosen.instance_type), chosen.subnet_id, chosen.az,
                                        inst.get("Lifecycle", market))
                errors = answer.get("Errors", [])
                if not errors:
                    raise CapacityUnavailable("CreateFleet answered with neither instances nor errors")
                for err in errors:  # a 200 answer with Errors and no instances is a capacity failure
                    code = err.get("ErrorCode", "")
                    if code in QUOTA_ERRORS or code in PERMISSION_ERRORS:
                        raise explain(_as_client_error(code, err.get("ErrorMessage", "")), "CreateFleet")
                    o = err.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
                    hit = [c for c in allowed if c.instance_type == o.get("InstanceType") and c.subnet_id == o.get("SubnetId")]
                    for c in hit or allowed:
                        blocklist.block(c.instance_type, c.subnet_id)
                log.info("CreateFleet gave no instance (%s); trying the next choices", ", ".join(e.get("ErrorCode", "?") for e in errors))
        raise CapacityUnavailable(f"no capacity for {', '.join(sorted({c.instance_type for c in choices}))} in {', '.join(sorted({c.az for c in choices}))} right now; will retry")
    finally:
        try:
            ec2.delete_launch_template_versions(LaunchTemplateId=template_id, Versions=[version])
        except ClientError as exc:  # never fatal: the version dies with the template at `orch down`
            log.warning("could not delete launch template version %s: %s", version, exc)


def _as_client_error(code: str, message: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, "CreateFleet")


# --- watching and releasing ------------------------------------------------------------------------


def sweep_instances(ec2, sweep: str, states: Optional[List[str]] = None) -> List[dict]:
    """Instances tagged with the sweep, in one paginated DescribeInstances, as plain dicts."""
    out = []
    filters = [{"Name": "tag:orch:sweep", "Values": [sweep]}, {"Name": "instance-state-name", "Values": states or LIVE_STATES}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                out.append({
                    "instance_id": i["InstanceId"], "state": i["State"]["Name"], "type": i.get("InstanceType", ""),
                    "az": i.get("Placement", {}).get("AvailabilityZone", ""), "private_ip": i.get("PrivateIpAddress", ""),
                    "public_ip": i.get("PublicIpAddress", ""), "run": tags.get("orch:run", ""),
                    "attempt": tags.get("orch:attempt", ""), "host_key": tags.get("orch:hostkey", ""),
                    "launch_time": i.get("LaunchTime").timestamp() if i.get("LaunchTime") else None,
                    "state_reason": i.get("StateReason", {}).get("Code", ""),
                })
    return out


def describe(ec2, instance_id: str) -> dict:
    i = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {"state": i["State"]["Name"], "private_ip": i.get("PrivateIpAddress", ""), "public_ip": i.get("PublicIpAddress", "")}


def instance_placement(ec2, instance_id: str) -> Optional[Tuple[str, str]]:
    """(instance type, subnet id) of an instance, terminated ones included (while EC2 still lists them)."""
    res = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    if not res:
        return None
    i = res[0]["Instances"][0]
    return i.get("InstanceType", ""), i.get("SubnetId", "")


def terminate(ec2, instance_ids: List[str]) -> None:
    if instance_ids:
        ec2.terminate_instances(InstanceIds=instance_ids)


def spot_prices(ec2, instance_types: List[str], azs: List[str]) -> Dict[Tuple[str, str], float]:
    """Newest spot price per (type, AZ) for Linux."""
    prices: Dict[Tuple[str, str], Tuple[float, float]] = {}
    answer = ec2.describe_spot_price_history(InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"], StartTime=time.time() - 3600)
    for p in answer.get("SpotPriceHistory", []):
        key = (p["InstanceType"], p["AvailabilityZone"])
        ts = p["Timestamp"].timestamp() if hasattr(p["Timestamp"], "timestamp") else 0
        if (not azs or key[1] in azs) and (key not in prices or ts > prices[key][1]):
            prices[key] = (float(p["SpotPrice"]), ts)
    return {k: v[0] for k, v in prices.items()}


def teardown(ec2, iam, sweep: str) -> List[str]:
    """Remove everything tagged with or named after the sweep, in dependency order; safe to repeat."""
    from botocore.exceptions import ClientError

    from .wait import Timeout, retry_until

    removed = []
    ids = [i["instance_id"] for i in sweep_instances(ec2, sweep)]
    if ids:
        terminate(ec2, ids)
        removed += ids
        try:
            retry_until(lambda: not sweep_instances(ec2, sweep), 600, 2.0, "the sweep's instances to terminate")
        except Timeout:
            raise OrchError(f"instances of {sweep} are still shutting down; run `orch down {sweep}` again in a minute.") from None
    name = f"orch-{sweep}"
    for lt in ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [name]}])["LaunchTemplates"]:
        ec2.delete_launch_template(LaunchTemplateId=lt["LaunchTemplateId"])
        removed.append(lt["LaunchTemplateId"])
    for sg in ec2.describe_security_groups(Filters=[{"Name": "tag:orch:sweep", "Values": [sweep]}])["SecurityGroups"]:
        try:
            retry_until(lambda: _try_delete_sg(ec2, sg["GroupId"]), 120, 3.0, f"security group {sg['GroupId']} to be free")
            removed.append(sg["GroupId"])
        except Timeout:
            raise OrchError(f"security group {sg['GroupId']} is still in use; run `orch down {sweep}` again in a minute.") from None
    try:
        for role in iam.list_instance_profiles().get("InstanceProfiles", []):
            if role["InstanceProfileName"] != name:
                continue
            for r in role.get("Roles", []):
                iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=r["RoleName"])
            iam.delete_instance_profile(InstanceProfileName=name)
            removed.append(f"instance-profile/{name}")
        try:
            iam.delete_role_policy(RoleName=name, PolicyName="orch-sweep")
            iam.delete_role(RoleName=name)
            removed.append(f"role/{name}")
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise
    except ClientError as exc:
        raise explain(exc, "removing the instance profile") from None
    return removed


def orch_resources(ec2, iam) -> Dict[str, List[str]]:
    """Everything orch made in this region, by sweep: what `orch gc` lists and `orch down --all` removes."""
    found: Dict[str, List[str]] = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=[{"Name": "tag-key", "Values": ["orch:sweep"]},
                                                                         {"Name": "instance-state-name", "Values": LIVE_STATES}]):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                sweep = {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get("orch:sweep", "?")
                found.setdefault(sweep, []).append(f"instance {i['InstanceId']} ({i['State']['Name']})")
    for sg in ec2.describe_security_groups(Filters=[{"Name": "tag-key", "Values": ["orch:sweep"]}])["SecurityGroups"]:
        sweep = {t["Key"]: t["Value"] for t in sg.get("Tags", [])}.get("orch:sweep", "?")
        found.setdefault(sweep, []).append(f"security-group {sg['GroupId']}")
    for lt in ec2.describe_launch_templates()["LaunchTemplates"]:
        if lt["LaunchTemplateName"].startswith("orch-"):
            found.setdefault(lt["LaunchTemplateName"][5:], []).append(f"launch-template {lt['LaunchTemplateId']}")
    for prof in iam.list_instance_profiles().get("InstanceProfiles", []):
        if prof["InstanceProfileName"].startswith("orch-"):
            found.setdefault(prof["InstanceProfileName"][5:], []).append(f"instance-profile {prof['InstanceProfileName']}")
    return found


def _try_delete_sg(ec2, group_id: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        ec2.delete_security_group(GroupId=group_id)
        return True
    except ClientError as exc:
        if _code(exc) == "InvalidGroup.NotFound":
            return True
        if _code(exc) == "DependencyViolation":
            return False
        raise


# --- on the instance ------------------------------------------------------------------------------


def imds_get(path: str, timeout: float = 2.0) -> Optional[str]:
    """IMDSv2 GET (token first), honouring AWS_EC2_METADATA_SERVICE_ENDPOINT; None on 404."""
    import urllib.error
    import urllib.request

    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    req = urllib.request.Request(f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    token = urllib.request.urlopen(req, timeout=timeout).read().decode()
    try:
        req = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(req, timeout=timeout).read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def terminate_self() -> str:
    """Terminate the instance this runs on (the agent's last act); returns its id."""
    instance_id = imds_get("instance-id")
    region = imds_get("placement/region") or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    client("ec2", region).terminate_instances(InstanceIds=[instance_id])
    return instance_id
