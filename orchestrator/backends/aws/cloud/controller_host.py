"""The instance a sweep's remote controller runs on (`orch launch --remote`): its tags, its image, finding it, and
ending it. Plain functions over a boto3 EC2 client, as in ec2.py.

It is an on-demand instance tagged `orch:sweep=NAME` (so `orch down` and `orch gc` find it like any instance of the
sweep) and `orch:role=controller` (so the sweep's controller, which lists the sweep's instances, never takes it for
a run's host: it carries no `orch:run`).
"""

from __future__ import annotations

from orchestrator.backends.aws.cloud.ec2 import sweep_instances, sweep_tags

ROLE_TAG, CONTROLLER_ROLE = "orch:role", "controller"
# Amazon Linux 2023, the newest of the type's architecture (owner amazon): what `aws.controller.image` defaults to.
DEFAULT_IMAGE = "al2023-ami-2023.*-kernel-*-{arch}"
DEFAULT_USER = "ec2-user"  # the login user of Amazon Linux images


def controller_tags(sweep: str, host_key: str) -> list[dict]:
    return sweep_tags(sweep, role=CONTROLLER_ROLE, hostkey=host_key) + [
        {"Key": "Name", "Value": f"orch {sweep} controller"}
    ]


def architecture(ec2, instance_type: str) -> str:
    """x86_64 or arm64 (DescribeInstanceTypes); x86_64 when EC2 does not say."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        found = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except (ClientError, BotoCoreError):
        found = []
    archs = found[0].get("ProcessorInfo", {}).get("SupportedArchitectures", []) if found else []
    return "arm64" if archs and "x86_64" not in archs else "x86_64"


def default_image(ec2, instance_type: str) -> str:
    return DEFAULT_IMAGE.format(arch=architecture(ec2, instance_type))


def controllers(ec2, sweep: str, states: list[str] | None = None) -> list[dict]:
    """The sweep's controller instances (normally none or one): id, state, type, addresses, pinned host key."""
    return sweep_instances(ec2, sweep, states, tags={ROLE_TAG: CONTROLLER_ROLE})
