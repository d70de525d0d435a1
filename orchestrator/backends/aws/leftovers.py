"""What orch made in AWS and still exists, over the regions of the sweeps launched here and those `orch ami build`
ran in (the registry's `leftovers`): `orch gc` lists it, `orch down --all` removes what belongs to no sweep known
here, `orch down ami-RECIPE` what an interrupted image build left."""

from __future__ import annotations

from orchestrator.aws import ec2 as api
from orchestrator.aws.teardown import orch_resources, teardown
from orchestrator.backends.aws.regions import settings
from orchestrator.sweep.spec import Sweep, orch_home

NAMES = r"ami-.+"  # an image build's leftovers (builder, its group, template) carry `ami-RECIPE` as their sweep


def regions_of(sweeps: list[Sweep]) -> set[str]:
    """Every region of the sweeps, and every region `orch ami build` ran in (its builders are found there too)."""
    regions: set[str] = set()
    for sweep in sweeps:
        regions.update(settings(sweep).regions)
    built = orch_home() / "ami-regions"
    return regions | (set(built.read_text().split()) if built.exists() else set())


def scan(sweeps: list[Sweep], problems: list[str] | None = None) -> dict[str, dict[str, list[str]]]:
    """{region: {sweep: [resource, ...]}} over the regions of `sweeps`. A region that cannot be searched raises, or
    with `problems` given adds a line saying why to it and is left out."""
    out = {}
    for region in sorted(regions_of(sweeps)):
        try:
            out[region] = orch_resources(api.client("ec2", region), api.client("iam", region))
        except Exception as exc:  # botocore errors: say which region
            if problems is None:
                raise api.explain(exc, f"scanning {region}") from None
            problems.append(f"{region}: not searched for orch's resources: {api.explain(exc, f'scanning {region}')}")
    return out


def remove(region: str, name: str) -> list[str]:
    """Remove what `name` (a sweep, or an image build's `ami-RECIPE`) holds in `region`; returns what went."""
    return teardown(api.client("ec2", region), api.client("iam", region), name)
