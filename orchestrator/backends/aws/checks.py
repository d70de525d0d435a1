"""The AWS backend's rules for a sweep (docs/aws.md): its section, an S3 store, a way in over SSH, credentials on the
host, data from S3, shapes its instance types can hold. Run by the loader after the generic rules, each problem
(location, message with the fix) becomes a `file:line: field: message` error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.backends.aws.cloud.gpus import GPUS_OF_TYPE
from orchestrator.backends.aws.settings import BEATS_IN_SILENCE, LOST_AFTER_S, AwsSection
from orchestrator.sweep.sections import Problems


def check(spec: Any, base: Path) -> Problems:
    out: Problems = []
    aws = spec.section("aws")
    if aws is None:
        out.append(
            (
                ("backend",),
                "backend aws needs an `aws:` section (at least `image:`); see docs/getting-started/first-aws-sweep.md",
            )
        )
    if not spec.store.startswith("s3://"):
        out.append(
            (
                ("store",) if spec.store else ("backend",),
                "backend aws needs `store: s3://bucket/prefix`: instances sync results there",
            )
        )
    for i, entry in enumerate(spec.data or []):
        if not entry.source.startswith("s3://"):
            out.append(
                (
                    ("data", i, "from"),
                    "on aws, data comes from S3: `from: s3://bucket/prefix/` (`orch data push DIR s3://…` uploads a "
                    "folder)",
                )
            )
    return out if aws is None else out + _section_problems(spec, aws)


def _section_problems(spec: Any, aws: Any) -> Problems:
    out: Problems = _region_problems(aws)
    if aws.ssh.address == "private_ip" and not aws.ssh_cidr and not aws.security_group:
        # the default rule admits this machine's *public* address, which never reaches a private IP
        out.append(
            (
                ("aws", "ssh", "address"),
                "private_ip needs `aws.ssh_cidr`: the range this machine reaches the VPC from "
                "(e.g. the VPC's CIDR, 10.0.0.0/16, from a bastion or VPN), or a `security_group` that admits it",
            )
        )
    if aws.heartbeat_s * BEATS_IN_SILENCE > LOST_AFTER_S:
        default = AwsSection.model_fields["heartbeat_s"].default
        out.append(
            (
                ("aws", "heartbeat_s"),
                f"{aws.heartbeat_s:g} s is too long: a host whose agent is silent for {LOST_AFTER_S:.0f} s is lost and "
                f"replaced, so {BEATS_IN_SILENCE} beats must fit in that. Write at most "
                f"{LOST_AFTER_S / BEATS_IN_SILENCE:.0f}, or leave it out for the default ({default:g})",
            )
        )
    if not (aws.instance_profile or "").strip():
        out.append(
            (
                ("aws", "instance_profile"),
                "an instance without a profile has no AWS credentials: it can neither sync results to S3 "
                "nor terminate itself. Use `create` (the default) or the name of a profile that may do both",
            )
        )
    out += _profile_problems(aws.instance_profile)
    if aws.idle_minutes is not None and not aws.keep_alive:
        out.append(
            (
                ("aws", "idle_minutes"),
                "acts only with `keep_alive: true`: without it an instance terminates itself as soon as its run ends. "
                "Add `keep_alive: true` (the instance then waits that long for someone to attach), or remove "
                "`idle_minutes`",
            )
        )
    r = spec.resources
    if r is not None and r.gpus:
        known = [GPUS_OF_TYPE[t] for t in aws.instance_types if t in GPUS_OF_TYPE]
        if known and len(known) == len(aws.instance_types) and r.gpus > max(known):
            out.append(
                (
                    ("resources", "gpus"),
                    f"{r.gpus} GPUs per node, but the most any of {', '.join(aws.instance_types)} "
                    f"has is {max(known)}; lower `gpus:` or list a larger type (e.g. p4d.24xlarge: 8)",
                )
            )
    return out


# IAM API reference, CreateInstanceProfile: InstanceProfileName is 1-128 of letters, digits and _+=,.@- (no spaces)
PROFILE_NAME = re.compile(r"[\w+=,.@-]{1,128}", re.ASCII)


def _profile_problems(profile: str | None) -> Problems:
    """A name EC2 cannot take: CreateFleet answers it as "Invalid IAM Instance Profile name", which reads like a
    profile not visible yet, so the launch waited two minutes before failing."""
    name = (profile or "").strip()
    if not name or PROFILE_NAME.fullmatch(name):
        return []
    tail = name.rsplit("/", 1)[-1]
    fix = (
        f"write its name, `{tail}`, not its ARN"
        if name.startswith("arn:") and ":instance-profile/" in name and PROFILE_NAME.fullmatch(tail)
        else "write `create` (orch makes one for the sweep) or an existing profile's name"
    )
    return [
        (
            ("aws", "instance_profile"),
            f"{name!r} is no instance profile name (1-128 of letters, digits, _+=,.@-): {fix}",
        )
    ]


def _region_problems(aws: Any) -> Problems:
    """`region:` or `regions:` (docs/guides/regions.md), and what belongs to one region only."""
    out: Problems = []
    if aws.both_forms:
        out.append(
            (
                ("aws", "regions"),
                f"`region: {aws.region}` and `regions:` both given; keep one. Fix: `regions: "
                f"[{', '.join(dict.fromkeys([aws.region, *aws.regions]))}]` (in order of preference) and remove "
                "`region:`, or keep `region:` alone for one region",
            )
        )
        return out
    twice = sorted({r for r in aws.regions if aws.regions.count(r) > 1})
    if twice:
        out.append((("aws", "regions"), f"{', '.join(twice)} listed twice; list each region once"))
    if len(aws.regions) > 1 and aws.image.startswith("ami-"):
        out.append(
            (
                ("aws", "image"),
                f"{aws.image} is an image id of one region, but the sweep may run in {len(aws.regions)} "
                f"({', '.join(aws.regions)}): each region has its own ids. Use a name pattern (each region's newest "
                "match, e.g. `Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *`) or `recipe:NAME` "
                "(`orch ami build --region R` puts it in each region)",
            )
        )
    if len(aws.regions) > 1 and aws.subnet_ids:
        out.append(
            (
                ("aws", "subnet_ids"),
                f"subnets belong to one region, but the sweep may run in {', '.join(aws.regions)}. A sweep over "
                "several regions launches into each region's default VPC: remove `subnet_ids`, or list one region",
            )
        )
    if len(aws.regions) > 1 and aws.security_group:
        out.append(
            (
                ("aws", "security_group"),
                f"a security group belongs to one region, but the sweep may run in {', '.join(aws.regions)}: remove "
                "`security_group` (orch makes one per region, port 22 from `ssh_cidr`), or list one region",
            )
        )
    return out
