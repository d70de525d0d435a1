"""Removing what orch made on AWS: one sweep's resources (`orch down`), and finding all of them (`orch gc`).

Part of the control plane with ec2.py, whose helpers it uses; nothing here runs on an instance.
"""

from __future__ import annotations

from orchestrator.backends.aws.cloud.ec2 import (
    LIVE_STATES,
    NOT_GONE,
    error_code,
    explain,
    sweep_instances,
    terminate,
)
from orchestrator.backends.aws.cloud.iam import controller_iam_name, iam_name
from orchestrator.backends.aws.cloud.placement import delete_group, sweep_groups
from orchestrator.errors import OrchError

TEARDOWN_WAIT_S = 900.0  # GPU instances can stay in shutting-down for minutes


def teardown(ec2, iam, sweep: str, wait_s: float = TEARDOWN_WAIT_S) -> list[str]:
    """Remove everything tagged with or named after the sweep, in dependency order; safe to repeat. `iam` None: the
    region's resources only (the instance profiles are global: `remove_profiles`).

    An instance in `shutting-down` still holds its network interface, and so the security group:
    wait for every instance to be gone before deleting the group, rather than hammering
    DeleteSecurityGroup into DependencyViolation.
    """
    from orchestrator.wait import Timeout, retry_until

    removed: list[str] = []

    def gone() -> bool:
        """Every instance of the sweep gone; one that runs and was not terminated here yet is terminated (bought
        after the first look, by a controller's provisioning in flight as it stopped, or not yet listed by EC2)."""
        found = sweep_instances(ec2, sweep, NOT_GONE)
        late = [i["instance_id"] for i in found if i["state"] in LIVE_STATES and i["instance_id"] not in removed]
        if late:
            terminate(ec2, late)
            removed.extend(late)
        return not found

    try:
        retry_until(gone, wait_s, 3.0, "the sweep's instances to terminate")
    except Timeout:
        raise OrchError(
            f"instances of {sweep} are still shutting down after {wait_s:.0f} s; run `orch down {sweep}` again later."
        ) from None
    name = f"orch-{sweep}"
    for lt in _all(ec2, "describe_launch_templates", "LaunchTemplates", [("launch-template-name", name)]):
        ec2.delete_launch_template(LaunchTemplateId=lt["LaunchTemplateId"])
        removed.append(lt["LaunchTemplateId"])
    for sg in _all(ec2, "describe_security_groups", "SecurityGroups", [("tag:orch:sweep", sweep)]):
        try:  # network interfaces of terminated instances detach a little later
            retry_until(
                lambda: _try_delete_sg(ec2, sg["GroupId"]), 120, 3.0, f"security group {sg['GroupId']} to be free"
            )
            removed.append(sg["GroupId"])
        except Timeout:
            raise OrchError(
                f"security group {sg['GroupId']} is still in use; run `orch down {sweep}` again in a minute."
            ) from None
    for group in sweep_groups(ec2, sweep):  # cluster placement groups of multi-node runs
        try:
            retry_until(lambda: delete_group(ec2, group), 120, 3.0, f"placement group {group} to be empty")
            removed.append(f"placement-group/{group}")
        except Timeout:
            raise OrchError(
                f"placement group {group} still holds an instance; run `orch down {sweep}` again in a minute."
            ) from None
    return removed + (remove_profiles(iam, sweep) if iam is not None else [])


def remove_profiles(iam, sweep: str) -> list[str]:
    """The sweep's instance profiles and roles (IAM is global: one set serves every region)."""
    return _delete_instance_profile(iam, iam_name(sweep)) + _delete_instance_profile(
        iam, controller_iam_name(sweep)
    )  # the hosts' and `orch launch --remote`'s controller's


def _delete_instance_profile(iam, name: str) -> list[str]:
    from botocore.exceptions import ClientError

    removed = []
    try:
        try:
            profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
            for r in profile.get("Roles", []):
                iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=r["RoleName"])
            iam.delete_instance_profile(InstanceProfileName=name)
            removed.append(f"instance-profile/{name}")
        except ClientError as exc:
            if error_code(exc) != "NoSuchEntity":
                raise
        try:
            for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
                iam.delete_role_policy(RoleName=name, PolicyName=policy)
            iam.delete_role(RoleName=name)
            removed.append(f"role/{name}")
        except ClientError as exc:
            if error_code(exc) != "NoSuchEntity":
                raise
    except ClientError as exc:
        raise explain(exc, "removing the instance profile") from None
    return removed


def orch_resources(ec2) -> dict[str, list[str]]:
    """Everything orch made in this region, by sweep: what `orch gc` lists and `orch down --all` removes (with
    `orch_profiles`, which are global)."""
    found: dict[str, list[str]] = {}
    for page in ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "tag-key", "Values": ["orch:sweep"]}, {"Name": "instance-state-name", "Values": LIVE_STATES}]
    ):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                sweep = {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get("orch:sweep", "?")
                found.setdefault(sweep, []).append(f"instance {i['InstanceId']} ({i['State']['Name']})")
    for sg in _all(ec2, "describe_security_groups", "SecurityGroups", [("tag-key", "orch:sweep")]):
        sweep = {t["Key"]: t["Value"] for t in sg.get("Tags", [])}.get("orch:sweep", "?")
        found.setdefault(sweep, []).append(f"security-group {sg['GroupId']}")
    for pg in ec2.describe_placement_groups(Filters=[{"Name": "tag-key", "Values": ["orch:sweep"]}])["PlacementGroups"]:
        sweep = {t["Key"]: t["Value"] for t in pg.get("Tags", [])}.get("orch:sweep", "?")
        found.setdefault(sweep, []).append(f"placement-group {pg['GroupName']}")
    for lt in _all(ec2, "describe_launch_templates", "LaunchTemplates", []):
        if lt["LaunchTemplateName"].startswith("orch-"):
            found.setdefault(lt["LaunchTemplateName"][5:], []).append(f"launch-template {lt['LaunchTemplateId']}")
    return found


def orch_profiles(iam) -> dict[str, list[str]]:
    """orch's instance profiles, by sweep: IAM is global, so they are listed once, not once per region."""
    found: dict[str, list[str]] = {}
    for page in iam.get_paginator("list_instance_profiles").paginate():
        for prof in page.get("InstanceProfiles", []):
            name = prof["InstanceProfileName"]
            if name.startswith("orch-"):
                full = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
                tags = {t["Key"]: t["Value"] for t in full.get("Tags", [])}
                found.setdefault(tags.get("orch:sweep", name[5:]), []).append(f"instance-profile {name}")
    return found


def _all(ec2, call: str, key: str, filters: list[tuple]) -> list[dict]:
    """Every page of a Describe call (EC2 pages them: a template or group past the first page is still orch's;
    DescribePlacementGroups alone is not paged)."""
    pages = ec2.get_paginator(call).paginate(Filters=[{"Name": k, "Values": [v]} for k, v in filters])
    return [item for page in pages for item in page.get(key, [])]


def _try_delete_sg(ec2, group_id: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        ec2.delete_security_group(GroupId=group_id)
        return True
    except ClientError as exc:
        if error_code(exc) == "InvalidGroup.NotFound":
            return True
        if error_code(exc) == "DependencyViolation":
            return False
        raise
