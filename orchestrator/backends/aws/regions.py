"""The regions of a sweep (docs/guides/regions.md): its home — the store's bucket's region, where a remote controller
runs — and the check, before anything is bought, that the account may use each region it lists."""

from __future__ import annotations

from orchestrator.aws import ec2 as api
from orchestrator.backends.aws.settings import AwsSection
from orchestrator.errors import OrchError
from orchestrator.store.s3url import is_s3
from orchestrator.sweep.load import located
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
        where = located(sweep.path, ("aws", "regions" if len(settings(sweep).regions) > 1 else "region"))
        raise OrchError("\n".join(f"{where}: {p}" for p in problems) + "\nNothing was launched.", exit_code=2)
