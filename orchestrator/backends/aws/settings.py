"""The `aws:` section of sweep.yaml (and of an image recipe): the AWS backend's settings, declared beside it.

The sweep layer validates this section only through the registry (backends/registry.py), which hands this model to
the loader; nothing below `backends/` names it.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.sweep.spec_types import Amount, Count, Strict


# These two sections are built by default_factory, so their defaults are given as `default=`: type checkers read a
# positional one as no default (PEP 681's field specifiers take it by keyword).
class SshSection(Strict):
    """How the controller reaches instances over SSH."""

    user: str = Field(default="ubuntu", description="Login user on the image.")
    port: Count = Field(default=22, ge=1, le=65535, description="sshd port.")
    address: Literal["public_ip", "private_ip"] = Field(
        default="public_ip", description="Which instance address to dial."
    )
    identity: str = Field(
        default="~/.ssh/id_ed25519", description="Private key file; its .pub goes into the instance's authorized keys."
    )


class ControllerSection(Strict):
    """The instance a sweep's controller runs on with `orch launch --remote` (on demand, in the sweep's home region:
    its store's bucket's).

    Its defaults follow tests/bench/test_bench_remote.py: a pass at 10,000 runs needs well under 1 GiB and a
    fraction of a CPU second, so the smallest burstable type serves (docs/guides/unattended.md)."""

    instance_type: str = Field(
        default="t3.micro", pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$", description="EC2 type of the controller's instance."
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "AMI id or name pattern (owner `image_owner`); default: the newest Amazon Linux 2023 image of the type's "
            "architecture."
        ),
    )
    image_owner: str = Field(default="amazon", description="Owner of `image` when it is a name pattern.")
    python: str = Field(
        default="python3.11",
        pattern=r"^[A-Za-z0-9_./+-]+$",  # a command name or path: it is run over SSH, however quoted
        description=(
            "Interpreter on the image (3.10 or newer) to run orch; installed with dnf and pip when missing (Amazon "
            "Linux 2023's python3 is 3.9)."
        ),
    )
    max_hours: Amount = Field(
        default=48, gt=0, le=24 * 30, description="Safety net: the controller's instance terminates itself after this."
    )


# An AWS region's name (us-east-1, ap-southeast-2, us-gov-west-1, eu-central-2): refused early when misspelt.
REGION_RE = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"

# A host whose agent wrote no heartbeat for this long is lost (backend.py's stale_s): aws.heartbeat_s must let three
# beats fit in it (checks.py), so one late or refused write never gets a healthy host replaced (and paid twice).
LOST_AFTER_S = 180.0
BEATS_IN_SILENCE = 3


class AwsSection(Strict):
    """Settings of the aws backend (`backend: aws`)."""

    region: str = Field("us-east-1", pattern=REGION_RE, description="AWS region (the one-region form of `regions`).")
    regions: list[Annotated[str, Field(pattern=REGION_RE)]] = Field(
        default_factory=list,
        min_length=1,
        examples=[["us-east-1", "us-west-2"]],
        description=(
            "The regions the sweep may use, in order of preference (docs/guides/regions.md); instead of `region`. "
            "Read back, it always holds the sweep's regions, first the preferred one."
        ),
    )
    instance_types: list[str] = Field(
        ["g5.xlarge", "g6.xlarge"],
        min_length=1,
        description=(
            "Acceptable instance types; EC2 picks among them by price and capacity (the order does not rank them: "
            "docs/aws.md)."
        ),
    )
    subnet_ids: list[str] = Field(
        default_factory=list, description="Subnets to launch into (one per AZ); default: the default VPC's."
    )
    image: str = Field(
        ..., min_length=1, description="An AMI id (ami-...) or a name pattern resolved to the newest match."
    )
    image_owner: str = Field("amazon", description="Owner of `image` when it is a name pattern.")
    market: Literal["spot", "on-demand", "spot-then-on-demand"] = Field("spot", description="Capacity market.")
    choose: Literal["work", "price"] = Field(
        "work",
        description="work: pools ranked by expected dollars per unit of work (measured rates, reclaims); price: by "
        "the hour.",
    )
    work_key: str | None = Field(
        None,
        min_length=1,
        description="The metrics key that counts work (default: `prune.at` when set, else epoch).",
    )
    max_minutes: Count = Field(240, ge=5, description="Safety net: every instance powers off (terminates) after this.")
    security_group: str | None = Field(None, description="Use this security group instead of creating one.")
    ssh_cidr: str | None = Field(
        None, description="Who may reach port 22 (default: this machine's public address /32)."
    )
    instance_profile: str | None = Field(
        "create",
        description=(
            "'create' (default): a profile limited to this sweep's S3 prefix and to terminating its own instances; or "
            "an existing profile's name."
        ),
    )
    python: str = Field(
        "auto",
        min_length=1,
        description=(
            "Interpreter on the instance ({python}); 'auto' finds the image's PyTorch interpreter (DLAMI: "
            "/opt/pytorch/bin/python) on the first host."
        ),
    )
    volume_gb: Count = Field(100, ge=8, description="Root volume size (deleted with the instance).")
    keep_alive: bool = Field(
        False, description="Keep an instance after its run ends (debugging); `orch down` removes it."
    )
    idle_minutes: Amount | None = Field(
        None,
        gt=0,
        description=(
            "With keep_alive: the instance terminates itself once its run ended and nobody was attached for this long."
        ),
    )
    boot_timeout_s: Amount = Field(
        600,
        gt=0,
        description="How long to wait for an instance to run and its sshd to answer (one that ends first: at once).",
    )
    switch_s: Amount = Field(
        300,
        gt=0,
        description=(
            "`deadline:` — seconds a run needs to move to a new instance (boot + restore), assumed until the sweep "
            "has measured its own; also the schedule's margin."
        ),
    )
    heartbeat_s: Amount = Field(
        60,
        gt=0,
        description=(
            f"How often the agent writes status.json to S3 (a host silent for {LOST_AFTER_S:.0f} s is lost: "
            f"{BEATS_IN_SILENCE} beats must fit, so at most {LOST_AFTER_S / BEATS_IN_SILENCE:.0f}; a rung, a notice "
            "and the end are written at once)."
        ),
    )
    sync_s: Amount = Field(
        120,
        gt=0,
        description=(
            "How often the agent syncs the run folder (metrics, log) to S3; a new checkpoint and a spot notice go at "
            "once."
        ),
    )
    ssh: SshSection = Field(default_factory=SshSection, description="SSH settings.")
    controller: ControllerSection = Field(
        default_factory=ControllerSection, description="The controller's own instance, for `orch launch --remote`."
    )
    # Both `region:` and `regions:` written: checks.py refuses it with the fix (file:line), once the model stands.
    _both_forms: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _one_list_of_regions(self) -> AwsSection:
        """`regions` holds the sweep's regions whichever form the file used, `region` the first of them."""
        given = self.model_fields_set
        self._both_forms = "region" in given and "regions" in given
        if self.regions and not self._both_forms:
            self.region = self.regions[0]
        elif not self.regions:
            self.regions = [self.region]
        return self

    @field_validator("ssh_cidr")
    @classmethod
    def _an_ipv4_network(cls, value: str | None) -> str | None:
        """What the security group's port-22 rule admits (an IpRanges CidrIp): checked here, a bad one passed the dry
        run and failed the launch with AWS's words after the group was made."""
        if value is None:
            return value
        try:
            net = ipaddress.ip_network(value.strip(), strict=False) if "/" in value else None
        except ValueError:
            net = None
        if net is None or net.version != 4:
            why = "IPv6 is not supported here (the rule is an IPv4 range)" if net is not None else "not a CIDR"
            raise PydanticCustomError(
                "ssh_cidr", "{why}: write an IPv4 network with its prefix length, e.g. 203.0.113.7/32", {"why": why}
            )
        if str(net) != value.strip():  # EC2 refuses a range with host bits set ("CIDR block … is malformed")
            raise PydanticCustomError(
                "ssh_cidr",
                "host bits set: write {net} (the network) or {one}/32 (one address)",
                {"net": str(net), "one": value.split("/")[0].strip()},
            )
        return str(net)

    @model_serializer(mode="wrap")
    def _as_written(self, handler):
        """Recorded in the form a file may hold: one region as `region`, several as `regions` (never both, which
        the loader refuses)."""
        data = handler(self)
        if len(self.regions) > 1:
            data.pop("region", None)
        else:
            data.pop("regions", None)
        return data

    @property
    def both_forms(self) -> bool:
        return self._both_forms
