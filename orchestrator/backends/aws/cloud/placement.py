"""The sweep's cluster placement groups: where the nodes of a multi-node run are launched together.

A cluster group packs instances close on one network, and holds instances of one Availability
Zone only; so a sweep gets one group per AZ it launches multi-node runs in (`orch-<sweep>-<az>`),
made on first use, tagged with the sweep, and removed by `orch down`.
"""

from __future__ import annotations

import threading

from orchestrator.backends.aws.cloud.ec2 import error_code, sweep_tags

_lock = threading.Lock()


def group_name(sweep: str, az: str) -> str:
    return f"orch-{sweep}-{az}"


def ensure_group(ec2, sweep: str, az: str, made: dict[str, str]) -> str:
    """The sweep's cluster group in `az`, created when missing; `made` remembers it for the controller's life."""
    from botocore.exceptions import ClientError

    name = group_name(sweep, az)
    with _lock:
        if az in made:
            return made[az]
        try:
            ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": sweep_tags(sweep)}],
            )
        except ClientError as exc:
            if error_code(exc) != "InvalidPlacementGroup.Duplicate":  # made by an earlier controller of this sweep
                raise
        made[az] = name
        return name


def sweep_groups(ec2, sweep: str) -> list[str]:
    """Names of the sweep's placement groups (by tag)."""
    found = ec2.describe_placement_groups(Filters=[{"Name": "tag:orch:sweep", "Values": [sweep]}])["PlacementGroups"]
    return [g["GroupName"] for g in found]


def delete_group(ec2, name: str) -> bool:
    """True once it is gone; False while an instance in it is still shutting down."""
    from botocore.exceptions import ClientError

    try:
        ec2.delete_placement_group(GroupName=name)
        return True
    except ClientError as exc:
        if error_code(exc) == "InvalidPlacementGroup.Unknown":
            return True
        if error_code(exc) == "InvalidPlacementGroup.InUse":
            return False
        raise
