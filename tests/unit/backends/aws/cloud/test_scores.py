"""cloud/scores.py against botocore's own client (Stubber checks each request against EC2's service model): the AZ
ids of the answer mapped to the account's AZ names, AWS's answer taken as input, and the cases where no score is had
— too few types (not asked), refused by IAM (not asked again), another error (asked again later)."""

from __future__ import annotations

import boto3
from botocore.stub import Stubber

from orchestrator.backends.aws.cloud import worth
from orchestrator.backends.aws.cloud.scores import placement_scores

TYPES = ["g6.xlarge", "g5.xlarge", "g4dn.xlarge"]
NAMES = {"use1-az6": "us-east-1a", "use1-az1": "us-east-1b"}


def stubbed():
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return ec2, Stubber(ec2)


def test_scores_are_per_az_name_and_what_is_not_a_score_is_passed_over():
    ec2, stub = stubbed()
    asked = {
        "InstanceTypes": sorted(TYPES),
        "TargetCapacity": 2,
        "SingleAvailabilityZone": True,
        "RegionNames": ["us-east-1"],
    }
    answer = [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 3},
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az1", "Score": 9},
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az9", "Score": 7},  # not one of the sweep's subnets
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 11},  # out of AWS's range: not taken
    ]
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": answer[:2]}, asked | {})
    with stub:
        got = placement_scores(ec2, TYPES, ["us-east-1"], 2, NAMES)
    assert got.by_az == {"us-east-1a": 3, "us-east-1b": 9} and not got.final
    ec2, stub = stubbed()
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": answer[2:]}, asked)
    with stub:
        assert placement_scores(ec2, TYPES, ["us-east-1"], 2, NAMES).by_az == {}


def test_no_score_too_few_types_or_refused_is_final_another_error_is_asked_again():
    ec2, stub = stubbed()
    with stub:  # no request at all: AWS wants three types at least
        few = placement_scores(ec2, TYPES[:2], ["us-east-1"], 1, NAMES)
    assert few.final and not few.refused and few.by_az == {} and "at least 3 instance types" in few.note
    ec2, stub = stubbed()
    stub.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", http_status_code=403)
    with stub:
        refused = placement_scores(ec2, TYPES, ["us-east-1"], 1, NAMES)
    assert (
        refused.final
        and refused.refused
        and "refused by IAM" in refused.note
        and "ec2:GetSpotPlacementScores" in refused.note
    )
    ec2, stub = stubbed()
    stub.add_client_error("get_spot_placement_scores", "RequestLimitExceeded")
    with stub:
        busy = placement_scores(ec2, TYPES, ["us-east-1"], 1, NAMES)
    assert not busy.final and "RequestLimitExceeded" in busy.note


def test_a_score_moves_a_pools_prior_and_its_own_history_outweighs_it():
    assert worth.prior_per_h(None) == worth.PRIOR_RECLAIMS == worth.prior_per_h(worth.SCORE_MID)
    assert worth.prior_per_h(10) < worth.prior_per_h(7) < worth.prior_per_h(3) < worth.prior_per_h(1)
    seen = worth.Reclaims(count=0, hours=50.0)  # 50 quiet hours: the score hardly matters any more
    assert worth.reclaims_per_h(seen, None, 0.0, 1) < 0.01
    pools = [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b")]
    ranked = worth.rank(pools, lambda t, az: 0.30, {}, {}, {}, 0.0, 480.0, {"us-east-1a": 2, "us-east-1b": 9})
    assert [w.az for w in ranked] == ["us-east-1b", "us-east-1a"] and "placement score 9" in ranked[0].note
