"""A bought instance, from `pending` to an SSH connection: its address once it runs, then its sshd once it answers.
Either wait ends at once when the instance ends first (`orch down` meanwhile, a spot reclaim while it boots, an
instance EC2 could not start), with EC2's reason, instead of waiting out `aws.boot_timeout_s` (600 s by default)."""

from __future__ import annotations

import time

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.remote.ssh import Connection, Target, connect
from orchestrator.wait import retry_until

ENDED = ("shutting-down", "terminated", "stopping", "stopped")  # orch never starts one of these again
LOOK_S = 5.0  # while sshd does not answer, DescribeInstances at most this often


def _ended(found: dict | None, instance_id: str) -> api.InstanceEnded | None:
    if found is None or found["state"] not in ENDED:
        return None
    why = f" ({found['reason']})" if found.get("reason") else ""
    return api.InstanceEnded(f"instance {instance_id} is {found['state']}{why} before it served")


def running_address(ec2, instance_id: str, address: str, timeout_s: float) -> str:
    """Wait until the instance runs and has its address (`address`: public_ip or private_ip); returns it."""

    def ready() -> str:
        found = api.describe(ec2, instance_id)
        if (ended := _ended(found, instance_id)) is not None:
            raise ended
        return found[address] if found and found["state"] == "running" else ""

    return retry_until(ready, timeout_s, 1.0, f"{instance_id} to run")


def ssh_to(ec2, instance_id: str, target: Target, timeout_s: float) -> Connection:
    """Connect to the instance's sshd, retrying while it boots (`connect`), until `timeout_s` or its end."""
    looked = [time.monotonic() - LOOK_S]  # the first refused try looks at once

    def gone() -> None:
        if time.monotonic() - looked[0] < LOOK_S:
            return
        looked[0] = time.monotonic()
        if (ended := _ended(api.describe(ec2, instance_id), instance_id)) is not None:
            raise ended

    return connect(target, timeout=timeout_s, interval=1.0, between=gone)
