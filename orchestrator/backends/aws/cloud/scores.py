"""AWS's Spot placement scores (GetSpotPlacementScores): how likely a spot request is to succeed, 1 to 10, in each AZ
of the sweep's regions, for its instance types together (docs/guides/costs.md, "Placement scores").

From the EC2 User Guide ("Spot placement score") and the API reference (GetSpotPlacementScores):

- a score is for the instance types of the request together, per Region or (SingleAvailabilityZone) per AZ, which
  the answer names by its AZ *id* (`use1-az6`), not the account's AZ name: the subnets' `AvailabilityZoneId` map it;
- "you must specify at least three different instance types" (with one or two "the returned placement score will
  always be low"): a sweep of fewer types is not scored, and says so;
- the answer lists the top 10 Regions or AZs; an AZ not among them has no score here (ranked without one);
- "A Spot placement score does not provide any guarantees in terms of available capacity or risk of interruption":
  cloud/worth.py takes it as a prior on a pool's reclaims, which the pool's own history outweighs as hours accrue;
- the target capacity limit follows the account's recent spot usage; the number of new request configurations in 24
  hours may be limited: orch asks one configuration per sweep (its types, regions and capacity), at most every
  REFRESH_S, and not again in the sweep once IAM refused it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_TYPES = 3
REFRESH_S = 600.0  # a controller asks again after this long (scores change with spot capacity)
REFUSED = ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException")


@dataclass(frozen=True)
class Scores:
    """A sweep's placement scores, as had (or why there are none)."""

    by_az: dict[str, int] = field(default_factory=dict)  # AZ name -> score, 1 (unlikely) to 10 (likely)
    note: str = "not asked"
    final: bool = False  # not worth asking again in this sweep (too few types, refused by IAM)
    refused: bool = False  # IAM refused the call (said once, as a warning)


def placement_scores(ec2, types: list[str], regions: list[str], capacity: int, zone_names: dict[str, str]) -> Scores:
    """The scores per AZ name of `regions` for `types` together, `capacity` instances in one AZ; never raises."""
    from botocore.exceptions import BotoCoreError, ClientError

    from orchestrator.backends.aws.cloud.ec2 import error_code

    kinds = sorted(set(types))
    if len(kinds) < MIN_TYPES:
        return Scores(
            note=f"not asked: AWS scores at least {MIN_TYPES} instance types together (this sweep lists {len(kinds)})",
            final=True,
        )
    try:
        pages = ec2.get_paginator("get_spot_placement_scores").paginate(
            InstanceTypes=kinds, TargetCapacity=max(1, capacity), SingleAvailabilityZone=True, RegionNames=regions
        )
        found = [s for page in pages for s in page.get("SpotPlacementScores") or []]
    except ClientError as exc:
        code = error_code(exc)
        if code in REFUSED:
            return Scores(
                note="refused by IAM: ranked without them (grant ec2:GetSpotPlacementScores; `orch aws policy` "
                "prints it)",
                final=True,
                refused=True,
            )
        return Scores(note=f"not had ({code or 'an error'}): ranked without them")
    except BotoCoreError as exc:
        return Scores(note=f"not had ({type(exc).__name__}): ranked without them")
    by_az: dict[str, int] = {}
    for s in found:  # (AWS's answer is input)
        name, score = zone_names.get(str(s.get("AvailabilityZoneId"))), s.get("Score")
        if name and isinstance(score, int) and not isinstance(score, bool) and 1 <= score <= 10:
            by_az[name] = score
    return Scores(by_az, f"AWS's, for {', '.join(kinds)} together: {len(by_az)} AZ(s) scored (it lists its top 10)")
