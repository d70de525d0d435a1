"""What orch made in AWS and still exists, over the regions of the sweeps launched here and those `orch ami build`
ran in (the registry's `leftovers`): `orch gc` lists it, `orch down --all` removes what belongs to no sweep known
here, `orch down ami-RECIPE` what an interrupted image build left."""

from __future__ import annotations

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud.teardown import orch_profiles, orch_resources, remove_profiles, teardown
from orchestrator.backends.aws.regions import settings
from orchestrator.sweep.spec import Sweep, orch_home

GLOBAL = "iam"  # the place of what is no region's: instance profiles (IAM is global)
NAMES = r"ami-.+"
# the region the last scan asked IAM through (one of the sweeps'; IAM answers alike in every region of a partition)
_iam_region = [
    "us-east-1"
]  # an image build's leftovers (builder, its group, template) carry `ami-RECIPE` as their sweep


def regions_of(sweeps: list[Sweep]) -> set[str]:
    """Every region of the sweeps, and every region `orch ami build` ran in (its builders are found there too)."""
    regions: set[str] = set()
    for sweep in sweeps:
        regions.update(settings(sweep).regions)
    built = orch_home() / "ami-regions"
    return regions | (set(built.read_text().split()) if built.exists() else set())


def scan(sweeps: list[Sweep], problems: list[str] | None = None) -> dict[str, dict[str, list[str]]]:
    """{region: {sweep: [resource, ...]}} over the regions of `sweeps`, and the instance profiles once under
    `GLOBAL` (IAM is global). A region that cannot be searched raises, or with `problems` given adds a line saying
    why to it and is left out."""
    out = {}
    regions = sorted(regions_of(sweeps))
    for region in regions:
        try:
            out[region] = orch_resources(api.client("ec2", region))
        except Exception as exc:  # botocore errors: say which region
            if problems is None:
                raise api.explain(exc, f"scanning {region}") from None
            problems.append(f"{region}: not searched for orch's resources: {api.explain(exc, f'scanning {region}')}")
    if regions:
        _iam_region[0] = regions[0]
        try:
            out[GLOBAL] = orch_profiles(api.client("iam", regions[0]))
        except Exception as exc:
            if problems is None:
                raise api.explain(exc, "listing instance profiles") from None
            problems.append(f"{GLOBAL}: not searched: {api.explain(exc, 'listing instance profiles')}")
    return out


def remove(place: str, name: str) -> list[str]:
    """Remove what `name` (a sweep, or an image build's `ami-RECIPE`) holds in `place`: a region, or `GLOBAL` (its
    instance profiles, listed last by scan: after the instances that used them); returns what went."""
    if place == GLOBAL:
        return remove_profiles(api.client("iam", _iam_region[0]), name)
    return teardown(api.client("ec2", place), None, name)
