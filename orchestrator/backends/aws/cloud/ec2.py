"""EC2 control-plane calls: with the rest of cloud/ (fleet.py; IAM: iam.py), the only code that talks to the EC2 API.

Plain functions over a boto3 client; what crosses out of here is dicts of plain values, never a
boto3 object. Throttling is retried by botocore's standard mode. EC2 is eventually consistent: an
instance id fresh from CreateFleet can be NotFound for a few seconds, so every call by id treats
NotFound as "not yet". Code that runs on the instance itself is in host/aws/imds.py.
"""

from __future__ import annotations

import logging

from orchestrator.errors import OrchError

log = logging.getLogger("orch.ec2")

# Errors no retry fixes: stop the sweep and say what to do.
QUOTA_ERRORS = frozenset(
    {
        "MaxSpotInstanceCountExceeded",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "MaxFleetCountExceeded",
    }
)
PERMISSION_ERRORS = frozenset({"UnauthorizedOperation", "AccessDenied", "AuthFailure", "OptInRequired", "Blocked"})
# EC2 qualifies AuthFailure (AuthFailure.ServiceLinkedRoleCreationNotPermitted, ...): every one is a permission error.
PERMISSION_PREFIXES = ("AuthFailure.", "InvalidClientTokenId")
# The fix for the one a remote controller meets in an account that never launched spot (kubernetes/kops#16475).
SLR_FIX = (
    "EC2 makes the spot service-linked role AWSServiceRoleForEC2Spot on an account's first spot request, with the "
    "caller's iam:CreateServiceLinkedRole. Create it once: `aws iam create-service-linked-role --aws-service-name "
    "spot.amazonaws.com` (an `orch launch` from your machine does it too; `--remote` does it before the controller "
    "starts)."
)
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
NOT_GONE = LIVE_STATES + ["shutting-down"]  # still holds its network interface (and so its security group)
NOT_FOUND_S = 60.0  # how long a NotFound for an id orch just got is taken as "not yet"


class AwsFatal(OrchError):
    """Credentials, permission or quota: retrying cannot help, so the sweep stops with the next step."""


class InstanceEnded(OrchError):
    """An instance ended (or stopped) before it could serve: nothing waits for it any longer."""


def is_permission(code: str) -> bool:
    return code in PERMISSION_ERRORS or code.startswith(PERMISSION_PREFIXES)


# The Service Quotas entries for EC2 instances, by the letters that start a type's family (EC2 user guide, "Amazon EC2
# instance type quotas"): each counts vCPUs of running instances (on demand) or of spot requests.
QUOTA_KINDS = {"g": "G and VT", "vt": "G and VT", "inf": "Inf", "trn": "Trn", "dl": "DL", "f": "F", "x": "X"}
STANDARD_KIND = "Standard (A, C, D, H, I, M, R, T, Z)"


def quota_name(market: str, instance_type: str) -> str:
    """The Service Quotas entry that limits this kind of instance (vCPUs per family and market). Spot P5 (and newer)
    has a quota of its own, apart from P4, P3 and P2; on demand, every P shares one."""
    import re

    found = re.match(r"([a-z]+)(\d*)", instance_type.split(".")[0].lower())
    letters, generation = (found.group(1), int(found.group(2) or 0)) if found else ("", 0)
    if letters == "p":
        kind = ("P5" if generation >= 5 else "P4, P3 and P2") if market == "spot" else "P"
    elif letters == "hpc" and market != "spot":
        kind = "HPC"
    else:
        kind = QUOTA_KINDS.get(letters, STANDARD_KIND)
    if market == "spot":
        return f"All {kind} Spot Instance Requests"
    return f"Running On-Demand {kind} instances"


def client(service: str, region: str):
    from orchestrator.store.clients import client as boto_client

    return boto_client(service, region, max_attempts=8)


def error_code(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def error_message(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", "") or str(exc)


def _not_found(exc) -> bool:
    return error_code(exc).endswith(".NotFound") or error_code(exc) == "NoSuchEntity"


def explain(exc, what: str, market: str = "spot", instance_type: str = "") -> OrchError:
    """A ClientError/credentials error as an OrchError with the next step."""
    from botocore.exceptions import NoCredentialsError, NoRegionError

    if isinstance(exc, NoCredentialsError):
        return AwsFatal("No AWS credentials found. Run `aws configure` or set AWS_PROFILE.")
    if isinstance(exc, NoRegionError):
        return AwsFatal("No AWS region set. Set `aws.region` in the sweep.")
    code = error_code(exc)
    msg = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
    if code == "AuthFailure.ServiceLinkedRoleCreationNotPermitted":
        return AwsFatal(f"{what}: permission denied ({code}: {msg}). {SLR_FIX}")
    if is_permission(code):
        return AwsFatal(
            f"{what}: permission denied ({code}: {msg}). Grant the caller EC2/IAM/S3 rights for orch "
            "(orch aws policy; see docs/getting-started/admin.md) or use another AWS_PROFILE."
        )
    if code in QUOTA_ERRORS:
        market = "spot" if code.startswith("MaxSpot") else market
        quota = quota_name(market, instance_type or "g5.xlarge")
        return AwsFatal(
            f"{what}: quota reached ({code}: {msg}). Ask AWS for a higher limit (Service Quotas > Amazon EC2 > "
            f"'{quota}', in vCPUs) or lower max_parallel."
        )
    return OrchError(f"{what} failed: {code or type(exc).__name__}: {msg}")


# --- resolving what the sweep names ---------------------------------------------------------------


def unusable_regions(ec2, regions: list[str]) -> list[str]:
    """Each of `regions` the account cannot launch in, with why and how to enable it (DescribeRegions with
    AllRegions: an opt-in region not enabled reads `not-opted-in`)."""
    status = {
        r["RegionName"]: r.get("OptInStatus", "opt-in-not-required")
        for r in ec2.describe_regions(AllRegions=True)["Regions"]
    }
    out = []
    for region in regions:
        if region not in status:
            out.append(f"{region} is not an AWS region this account has (it has: {', '.join(sorted(status))})")
        elif status[region] == "not-opted-in":
            out.append(
                f"{region} is an opt-in region not enabled for this account. Enable it: `aws account enable-region "
                f"--region-name {region}` (or the console: Account > AWS Regions), wait until `aws account "
                f"get-region-opt-status --region-name {region}` reads ENABLED, then launch again"
            )
    return out


def resolve_subnets(ec2, subnet_ids: list[str], region: str) -> list[dict]:
    """[{SubnetId, AvailabilityZone(Id), VpcId}] of the configured subnets, or the default VPC's."""
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
        if error_code(exc).startswith("InvalidSubnetID"):
            raise OrchError(
                f"subnet not found in {region}: {', '.join(subnet_ids)}. Check `aws.subnet_ids` (`aws ec2 "
                "describe-subnets`)."
            ) from None
        raise explain(exc, "looking up subnets") from None
    if len({s["VpcId"] for s in subnets}) > 1:
        raise OrchError("`aws.subnet_ids` span several VPCs; give subnets of one VPC.")
    return [
        {
            "SubnetId": s["SubnetId"],
            "AvailabilityZone": s["AvailabilityZone"],
            "AvailabilityZoneId": s.get("AvailabilityZoneId", ""),
            "VpcId": s["VpcId"],
            "MapPublicIpOnLaunch": bool(s.get("MapPublicIpOnLaunch")),
        }
        for s in subnets
    ]


def caller_cidr() -> str:
    """This machine's public address as a /32, for the SSH rule."""
    import urllib.request

    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as r:
            ip = r.read().decode().strip()
    except OSError:
        raise OrchError(
            "could not find this machine's public address. Set `aws.ssh_cidr` (e.g. 203.0.113.7/32) or "
            "`aws.security_group`."
        ) from None
    return f"{ip}/32"


# --- per-sweep resources --------------------------------------------------------------------------


def sweep_tags(sweep: str, **extra: str) -> list[dict]:
    tags = {"orch:sweep": sweep, **{f"orch:{k}": v for k, v in extra.items()}}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def launch_template_data(image: dict, sg_id: str, volume_gb: int, profile: str | None, public_ip: bool) -> dict:
    """What every instance of the sweep gets; the root volume as the image names it, never smaller than its snapshot."""
    data = {
        "ImageId": image["ImageId"],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [
            {
                "DeviceName": image["RootDeviceName"],
                "Ebs": {
                    "VolumeSize": max(volume_gb, image.get("SnapshotGb") or 0),
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                    "Encrypted": True,
                },
            }
        ],
    }
    if public_ip:  # the subnets do not map one: ask for it on the instance's network interface
        data["NetworkInterfaces"] = [
            {"DeviceIndex": 0, "AssociatePublicIpAddress": True, "Groups": [sg_id], "DeleteOnTermination": True}
        ]
    else:
        data["SecurityGroupIds"] = [sg_id]
    if profile:
        data["IamInstanceProfile"] = {"Name": profile}
    return data


def ensure_launch_template(ec2, sweep: str, data: dict) -> str:
    from botocore.exceptions import ClientError

    name = f"orch-{sweep}"

    def found() -> list:
        return ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [name]}])[
            "LaunchTemplates"
        ]

    existing = found()
    if existing:
        return existing[0]["LaunchTemplateId"]
    try:
        return ec2.create_launch_template(
            LaunchTemplateName=name,
            LaunchTemplateData=data,
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": sweep_tags(sweep)}],
        )["LaunchTemplate"]["LaunchTemplateId"]
    except ClientError as exc:  # a racing launch of the sweep made it meanwhile: use that one
        existing = found() if error_code(exc) == "InvalidLaunchTemplateName.AlreadyExistsException" else []
        if not existing:
            raise
        return existing[0]["LaunchTemplateId"]


def template_data(ec2, template_id: str) -> dict:
    """The base launch template data (version 1), which each per-instance version repeats with its user data."""
    return ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=["1"])[
        "LaunchTemplateVersions"
    ][0]["LaunchTemplateData"]


# --- watching and releasing ------------------------------------------------------------------------


def sweep_instances(ec2, sweep: str, states: list[str] | None = None, tags: dict[str, str] | None = None) -> list[dict]:
    """Instances tagged with the sweep (and with `tags`, if given), in one paginated DescribeInstances, as plain
    dicts."""
    out = []
    filters = [
        {"Name": "tag:orch:sweep", "Values": [sweep]},
        *({"Name": f"tag:{k}", "Values": [v]} for k, v in (tags or {}).items()),
        {"Name": "instance-state-name", "Values": states or LIVE_STATES},
    ]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                out.append(
                    {
                        "instance_id": i["InstanceId"],
                        "state": i["State"]["Name"],
                        "type": i.get("InstanceType", ""),
                        "az": i.get("Placement", {}).get("AvailabilityZone", ""),
                        "private_ip": i.get("PrivateIpAddress", ""),
                        "public_ip": i.get("PublicIpAddress", ""),
                        "run": tags.get("orch:run", ""),
                        "attempt": tags.get("orch:attempt", ""),
                        "host_key": tags.get("orch:hostkey", ""),
                        "launch_time": i.get("LaunchTime").timestamp() if i.get("LaunchTime") else None,
                        "state_reason": i.get("StateReason", {}).get("Code", ""),
                        "slot_count": int(
                            tags.get("orch:slots") or 0
                        ),  # a packed instance: its runs are in orch:slot:<k> tags
                        "slots": {
                            int(k[10:]): v for k, v in tags.items() if k.startswith("orch:slot:") and k[10:].isdigit()
                        },
                        "rungs_left": rungs_left(tags),
                    }
                )
    return out


def rungs_left(tags: dict[str, str]) -> str | None:
    """A `prune:` instance's rungs not yet reported, as its tags say (contract.RUNGS_TAG); None: it does not say."""
    from orchestrator.contract import RUNG_TAG, RUNGS_TAG

    if RUNGS_TAG not in tags:
        return None
    return ",".join(sorted(k[len(RUNG_TAG) :] for k in tags if k.startswith(RUNG_TAG)))


def describe(ec2, instance_id: str) -> dict | None:
    """State and addresses of one instance; None while EC2 does not know the new id yet."""
    from botocore.exceptions import ClientError

    try:
        res = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    except ClientError as exc:
        if _not_found(exc):
            return None
        raise
    if not res:
        return None
    i = res[0]["Instances"][0]
    return {
        "state": i["State"]["Name"],
        "private_ip": i.get("PrivateIpAddress", ""),
        "public_ip": i.get("PublicIpAddress", ""),
        "type": i.get("InstanceType", ""),
        "subnet_id": i.get("SubnetId", ""),
        "reason": (i.get("StateReason") or {}).get("Message", ""),  # why it stopped or ended (EC2's words)
    }


def instance_placement(ec2, instance_id: str) -> tuple[str, str] | None:
    """(instance type, subnet id) of an instance, terminated ones included (while EC2 still lists them)."""
    found = describe(ec2, instance_id)
    return (found["type"], found["subnet_id"]) if found else None


def terminate(ec2, instance_ids: list[str], patience_s: float = NOT_FOUND_S) -> None:
    """Terminate; an id EC2 does not know yet (it just came from CreateFleet) is asked again until it does."""
    from botocore.exceptions import ClientError

    from orchestrator.wait import Timeout, retry_until

    if not instance_ids:
        return

    def once() -> bool:
        try:
            ec2.terminate_instances(InstanceIds=instance_ids)
            return True
        except ClientError as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":
                return False
            raise

    try:
        retry_until(once, patience_s, 2.0, f"EC2 to know {', '.join(instance_ids)}")
    except Timeout:
        raise OrchError(
            f"EC2 still does not know {', '.join(instance_ids)} after {patience_s:.0f} s; "
            "if it exists, `orch down` removes it."
        ) from None


def gpu_counts(ec2, instance_types: list[str]) -> dict[str, int]:
    """GPUs per instance type: DescribeInstanceTypes' GpuInfo, else orch's table (gpus.GPUS_OF_TYPE), else 0."""
    from orchestrator.backends.aws.cloud.gpus import GPUS_OF_TYPE

    counts = {t: GPUS_OF_TYPE.get(t, 0) for t in instance_types}
    try:
        answer = ec2.describe_instance_types(InstanceTypes=list(instance_types))
    except Exception as exc:  # an endpoint that does not know a type: the table answers
        log.info("DescribeInstanceTypes: %s; using orch's table of GPU counts", exc)
        return counts
    for it in answer.get("InstanceTypes", []):
        info = it.get("GpuInfo")
        if info:
            counts[it["InstanceType"]] = sum(g.get("Count", 0) for g in info.get("Gpus", []))
    return counts


def offered_pools(ec2, instance_types: list[str], azs: list[str]) -> set | None:
    """The (type, AZ) pairs EC2 offers among these (DescribeInstanceTypeOfferings, LocationType=availability-zone):
    not every type is in every AZ, and CreateFleet refuses a pool that is not offered. None when EC2 would not say
    (then every pool is asked, and CreateFleet's own refusal blocks it)."""
    from botocore.exceptions import BotoCoreError, ClientError

    found = set()
    try:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": list(instance_types)}, {"Name": "location", "Values": azs}],
        )
        for page in pages:
            found |= {(o["InstanceType"], o["Location"]) for o in page.get("InstanceTypeOfferings", [])}
    except (ClientError, BotoCoreError) as exc:
        log.warning("DescribeInstanceTypeOfferings: %s; asking every (type, AZ) pool", exc)
        return None
    return found


def spot_prices(ec2, instance_types: list[str], azs: list[str]) -> dict[tuple[str, str], float]:
    """The spot price in effect now per (type, AZ) for Linux.

    StartTime and EndTime both: only then does EC2 promise "the last price change before the start time, which
    is the effective price as of the start time" (DescribeSpotPriceHistory); with StartTime alone a price that has
    not moved since then is not listed. Paginated: an answer holds at most 1000 entries."""
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc)
    prices: dict[tuple[str, str], tuple[float, float]] = {}
    where = [{"Name": "availability-zone", "Values": list(azs)}] if azs else []
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"], StartTime=now, EndTime=now, Filters=where
    )
    for page in pages:
        for p in page.get("SpotPriceHistory", []):
            key = (p["InstanceType"], p["AvailabilityZone"])
            ts = p["Timestamp"].timestamp() if hasattr(p["Timestamp"], "timestamp") else 0
            if (not azs or key[1] in azs) and (key not in prices or ts > prices[key][1]):
                prices[key] = (float(p["SpotPrice"]), ts)
    return {k: v[0] for k, v in prices.items()}
