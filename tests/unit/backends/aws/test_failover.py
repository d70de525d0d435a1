"""Region failover (docs/guides/regions.md): which refusals hand a run to the next region in the sweep's order, and
which one is reported when every region refused. The real `first_region_with_capacity` and the real refusals of
backends/aws/cloud/fleet.py; each region's attempt answers as CreateFleet's outcome would be read."""

from __future__ import annotations

import pytest

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet
from orchestrator.backends.aws.provision import first_region_with_capacity

REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]


def _attempts(answers: dict[str, Exception | str]):
    asked: list[str] = []

    def attempt(region: str) -> str:
        asked.append(region)
        answer = answers[region]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return attempt, asked


@pytest.mark.parametrize(
    "refusal",
    [fleet.QuotaReached("vCPU quota of 32 reached"), fleet.CapacityUnavailable("no spot capacity")],
    ids=["quota", "capacity"],
)
def test_a_region_at_its_quota_or_without_capacity_hands_the_run_to_the_next(refusal):
    attempt, asked = _attempts({"us-east-1": refusal, "us-west-2": "i-0west", "eu-west-1": "i-0eu"})
    assert first_region_with_capacity(REGIONS, attempt) == ("us-west-2", "i-0west")
    assert asked == ["us-east-1", "us-west-2"]  # in the sweep's order, and no further than the first that gave


def test_when_every_region_refused_the_quota_is_what_is_reported():
    """Nothing frees by waiting in a region at its quota: that refusal wins over another region's lack of capacity."""
    answers = {
        "us-east-1": fleet.CapacityUnavailable("no spot capacity"),
        "us-west-2": fleet.QuotaReached("vCPU quota of 32 reached"),
        "eu-west-1": fleet.CapacityUnavailable("no spot capacity"),
    }
    attempt, asked = _attempts(answers)
    with pytest.raises(fleet.QuotaReached, match="vCPU quota"):
        first_region_with_capacity(REGIONS, attempt)
    assert asked == REGIONS


def test_any_other_error_stops_at_its_region():
    """An error that is no capacity or quota verdict (the account, the image, a bug) is the sweep's to see: another
    region would hide it, and buy there."""
    attempt, asked = _attempts({"us-east-1": api.AwsFatal("UnauthorizedOperation"), "us-west-2": "i-0west"})
    with pytest.raises(api.AwsFatal, match="UnauthorizedOperation"):
        first_region_with_capacity(REGIONS, attempt)
    assert asked == ["us-east-1"]
