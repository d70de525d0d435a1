"""A sweep's security group in one region: port 22 from the controller's address, all traffic between the sweep's
own instances; and the rules a remote controller's address adds (one per controller instance, stale ones removed)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.backends.aws.cloud.ec2 import NOT_FOUND_S, error_code, sweep_tags


def ensure_security_group(ec2, sweep: str, vpc_id: str, cidr: str) -> str:
    """The sweep's group: port 22 from `cidr` (a reused group gets the current cidr too), and all
    traffic between the sweep's own instances (the rendezvous and collectives of multi-node runs)."""
    from botocore.exceptions import ClientError

    from orchestrator.wait import retry_until

    name = f"orch-{sweep}"

    def found() -> list:
        return ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
        )["SecurityGroups"]

    existing = found()
    if existing:
        gid = existing[0]["GroupId"]
    else:
        existing = []
        try:
            gid = ec2.create_security_group(
                GroupName=name,
                Description=f"orch sweep {sweep}: ssh from one address, and its own instances",
                VpcId=vpc_id,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": sweep_tags(sweep)}],
            )["GroupId"]
        except ClientError as exc:  # a racing launch of the sweep made it meanwhile: use that one
            existing = found() if error_code(exc) == "InvalidGroup.Duplicate" else []
            if not existing:
                raise
            gid = existing[0]["GroupId"]
    rules = [
        {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [{"CidrIp": cidr, "Description": "orch controller"}],
        },
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid, "Description": "orch: the sweep's own instances"}]},
    ]

    have = existing[0].get("IpPermissions", []) if existing else []
    # a rule the group has already is not asked for again: a remote controller, whose role may not change groups,
    # finds the groups the laptop made with its rules in place (backends/aws/remote.py)
    rules = [r for r in rules if not _has_rule(have, r)]

    def authorize() -> bool:
        for rule in rules:  # one call each: a rule already there must not keep the other out
            try:
                ec2.authorize_security_group_ingress(GroupId=gid, IpPermissions=[rule])
            except ClientError as exc:
                if error_code(exc) == "InvalidGroup.NotFound":  # a new group is not visible everywhere yet
                    return False
                if error_code(exc) != "InvalidPermission.Duplicate":
                    raise
        return True

    retry_until(authorize, NOT_FOUND_S, 1.0, f"security group {gid} to exist")
    return gid


def _has_rule(have: list[dict], rule: dict) -> bool:
    """The group's permissions (DescribeSecurityGroups' IpPermissions) admit already what `rule` would."""
    want_cidrs = {r["CidrIp"] for r in rule.get("IpRanges", [])}
    want_groups = {g["GroupId"] for g in rule.get("UserIdGroupPairs", [])}
    for perm in have:
        if perm.get("IpProtocol") != rule["IpProtocol"] or perm.get("FromPort") != rule.get("FromPort"):
            continue
        cidrs = {r.get("CidrIp") for r in perm.get("IpRanges", [])}
        groups = {g.get("GroupId") for g in perm.get("UserIdGroupPairs", [])}
        if want_cidrs <= cidrs and want_groups <= groups:
            return True
    return False


CONTROLLER_RULE = "orch controller "  # a remote controller's SSH rule's description, followed by its instance id


def allow_ssh_from(ec2, group_id: str, cidr: str, instance_id: str = "", live: Sequence[str] = ()) -> None:
    """Port 22 of the group from one more address (a remote controller's `instance_id`), once; the rules of earlier
    controllers that are no longer `live` go first, so relaunches do not pile rules up to the group's limit, and an
    address released with its instance opens nothing for whoever gets it next."""
    from botocore.exceptions import ClientError

    stale = [
        r
        for r in controller_rules(ec2, group_id)
        if r["Description"][len(CONTROLLER_RULE) :] not in {*live, instance_id}
    ]
    if stale:
        ec2.revoke_security_group_ingress(
            GroupId=group_id,
            IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": stale}],
        )
    described = {"CidrIp": cidr, "Description": f"{CONTROLLER_RULE}{instance_id}" if instance_id else "orch"}
    rule = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [described]}
    try:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
    except ClientError as exc:
        if error_code(exc) != "InvalidPermission.Duplicate":
            raise


def controller_rules(ec2, group_id: str) -> list[dict]:
    """The group's port-22 ranges that remote controllers were given: [{CidrIp, Description}]."""
    groups = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    return [
        {"CidrIp": r["CidrIp"], "Description": r["Description"]}
        for g in groups
        for perm in g.get("IpPermissions", [])
        if perm.get("FromPort") == 22
        for r in perm.get("IpRanges", [])
        if r.get("Description", "").startswith(CONTROLLER_RULE)
    ]
