"""What runs on an instance and asks EC2 about itself: IMDSv2 and terminating itself.

Imported by the agent on hosts; it needs only the standard library and, to terminate, boto3 —
none of the control plane (orchestrator/backends/aws/cloud/).
"""

from __future__ import annotations

import os

# An orch process on an instance (the agent, a remote controller's supervisor) takes its credentials from the instance
# metadata service, which botocore asks once with 1 s to answer by default: a busy instance's late first answer left
# the process without credentials (an agent lost its attempt; a supervisor died and its instance billed on). Three
# tries of 5 s (botocore's documented settings); a setting of the user's own is kept.
PATIENT_IMDS = {"AWS_METADATA_SERVICE_TIMEOUT": "5", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "3"}


def ask_imds_patiently(environ) -> None:
    """Set PATIENT_IMDS in `environ` (os.environ at a process's entry, before any AWS client) where unset."""
    for name, value in PATIENT_IMDS.items():
        environ.setdefault(name, value)


def imds_get(path: str, timeout: float = 2.0) -> str | None:
    """IMDSv2 GET (token first), honouring AWS_EC2_METADATA_SERVICE_ENDPOINT; None on 404."""
    import urllib.error
    import urllib.request

    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    req = urllib.request.Request(
        f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    token = urllib.request.urlopen(req, timeout=timeout).read().decode()
    try:
        req = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(req, timeout=timeout).read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def own_instance_id() -> str:
    """This instance's id; an error where the metadata service has none (no instance to speak of)."""
    found = imds_get("instance-id")
    if found is None:
        raise OSError("the instance metadata service has no instance-id")
    return found


def terminate_self(instance_id: str) -> None:
    """Terminate the instance this runs on (`own_instance_id()`; the agent's last act: say so before, as nothing
    after this call is sure to run).

    The credentials are the instance profile's: its policy allows TerminateInstances only on
    instances tagged with this sweep.
    """
    import boto3

    region = imds_get("placement/region") or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("ec2", region_name=region).terminate_instances(InstanceIds=[instance_id])
