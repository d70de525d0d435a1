"""The regions of a sweep (docs/guides/regions.md): its home — the store's bucket's region, where a remote controller
runs — and the checks, before anything is bought, that the account may use each region it lists and that each offers
one of its instance types."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.settings import AwsSection
from orchestrator.errors import OrchError
from orchestrator.store.s3url import is_s3, parse_s3
from orchestrator.sweep.load import located, located_as
from orchestrator.sweep.spec import Sweep


def settings(sweep: Sweep) -> AwsSection:
    return sweep.spec.section_as("aws", AwsSection)


def home_region(sweep: Sweep) -> str:
    """The store's bucket's region (GetBucketLocation); a store that is no bucket: the first region."""
    if not is_s3(sweep.store_url):
        return settings(sweep).regions[0]
    from orchestrator.store.s3 import S3Store

    return S3Store(sweep.store_url).region()


def check_regions(sweep: Sweep, home: str) -> None:
    """Refuse (exit 2, file:line, the fix) a region the account does not have or has not enabled; asked in the home
    region, which is enabled (its bucket is there)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        problems = api.unusable_regions(api.client("ec2", home), settings(sweep).regions)
    except (ClientError, BotoCoreError) as exc:
        raise api.explain(exc, "looking up the sweep's regions (DescribeRegions)") from None
    if problems:
        where = located_as(sweep.path, "aws", ("regions", "region"))  # as the file spells it: `[a]` is a list too
        raise OrchError("\n".join(f"{where}: {p}" for p in problems) + "\nNothing was launched.", exit_code=2)


def check_types_offered(sweep: Sweep, ec2_of: Callable[[str], object]) -> None:
    """Refuse (exit 2, file:line, the fix) a listed region whose subnets' AZs offer none of `aws.instance_types`
    (DescribeInstanceTypeOfferings, as a launch there asks): it passed the dry run, then ended the controller when a
    failover (or, listed first, the first run) asked it. `ec2_of`: a region's EC2 client."""
    from botocore.exceptions import BotoCoreError, ClientError

    cfg, lacking = settings(sweep), []
    for region in cfg.regions:
        try:
            azs = sorted({s["AvailabilityZone"] for s in api.resolve_subnets(ec2_of(region), cfg.subnet_ids, region)})
            pools = api.offered_pools(ec2_of(region), cfg.instance_types, azs)
        except (OrchError, ClientError, BotoCoreError):  # that region's own error comes when it is prepared
            continue
        if pools is not None and not pools:
            lacking.append(f"{region} ({', '.join(azs)})")
    if lacking:
        raise OrchError(
            f"{located(sweep.path, ('aws', 'instance_types'))}: none of {', '.join(cfg.instance_types)} is offered in "
            f"{'; '.join(lacking)} (DescribeInstanceTypeOfferings): remove {', '.join(r.split()[0] for r in lacking)} "
            "from `aws.regions`, or add a type each listed region offers (`aws ec2 describe-instance-type-offerings "
            "--region REGION --location-type availability-zone`). Nothing was launched.",
            exit_code=2,
        )


def data_bytes(sweep: Sweep, region: str) -> int | None:
    """The bytes of the sweep's `data:` a host stages (S3 sources, as on aws), from the index `orch data push` leaves
    in the prefix (one GET each); None when any is unknown (not pushed by orch, or not readable)."""
    import json

    from botocore.exceptions import BotoCoreError, ClientError

    from orchestrator.store.s3 import SYNC_INDEX

    total = 0
    for e in sweep.spec.data or []:
        if not is_s3(e.source):
            return None
        where = parse_s3(e.source)
        try:
            s3 = api.client("s3", region)
            body = s3.get_object(Bucket=where.bucket, Key=where.folder + SYNC_INDEX)["Body"].read()
            total += sum(int(v.get("size", 0)) for v in json.loads(body).values())
        except (ClientError, BotoCoreError, ValueError, AttributeError, TypeError):
            return None
    return total
