"""Capacity fallback and fail-fast errors of CreateFleet, injected with botocore's Stubber
(the spot market's answers cannot exist here), plus the security settings, checked on moto (a reused group gets the
current CIDR, a public address is asked for where the subnet maps none)."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.stub import ANY, Stubber

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, groups
from orchestrator.backends.aws.cloud import iam as iam_api
from orchestrator.backends.aws.cloud.images import resolve_image
from orchestrator.backends.aws.cloud.teardown import teardown
from tests.fakecloud.sweeps import smoke

CHOICES = [
    fleet.Choice("g5.xlarge", "subnet-a", "us-east-1a"),
    fleet.Choice("g5.xlarge", "subnet-b", "us-east-1b"),
    fleet.Choice("g6.xlarge", "subnet-a", "us-east-1a"),
]
BASE = {"ImageId": "ami-12345678"}


def stubbed():
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response(
        "create_launch_template_version",
        {"LaunchTemplateVersion": {"VersionNumber": 7}},
        {"LaunchTemplateId": "lt-1", "LaunchTemplateData": ANY},
    )
    return client, stub


def fleet_ok(itype, subnet):
    return {
        "FleetId": "fleet-1",
        "Instances": [
            {
                "InstanceIds": ["i-0123456789abcdef0"],
                "InstanceType": itype,
                "Lifecycle": "spot",
                "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": itype, "SubnetId": subnet}},
            }
        ],
    }


def fleet_error(code, itype, subnet):
    return {
        "FleetId": "fleet-1",
        "Instances": [],
        "Errors": [
            {
                "ErrorCode": code,
                "ErrorMessage": "no",
                "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": itype, "SubnetId": subnet}},
            }
        ],
    }


def overrides(choices):
    return [{"InstanceType": c.instance_type, "SubnetId": c.subnet_id} for c in choices]


def expect_version(stub, number: int, market: str):
    """The template version of the second market asked: spot requests are tagged only where a launch makes one."""
    kinds = ["network-interface"] + (["spot-instances-request"] if market == "spot" else [])
    stub.add_response(
        "create_launch_template_version",
        {"LaunchTemplateVersion": {"VersionNumber": number}},
        {
            "LaunchTemplateId": "lt-1",
            "LaunchTemplateData": {
                **BASE,
                "UserData": ANY,
                "TagSpecifications": [{"ResourceType": k, "Tags": []} for k in kinds],
            },
        },
    )


def expect_fleet(stub, choices, answer, market="spot", version="7"):
    stub.add_response(
        "create_fleet",
        answer,
        {
            "Type": "instant",
            "ClientToken": ANY,
            "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": market},
            "SpotOptions": {"AllocationStrategy": "price-capacity-optimized"},
            "OnDemandOptions": {"AllocationStrategy": "lowest-price"},
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-1", "Version": version},
                    "Overrides": overrides(choices),
                }
            ],
            "TagSpecifications": ANY,
        },
    )


def expect_cleanup(stub, versions=("7",)):
    stub.add_response("delete_launch_template_versions", {}, {"LaunchTemplateId": "lt-1", "Versions": list(versions)})


# Every capacity code EC2 documents for CreateFleet (written out: a code dropped from fleet.CAPACITY_ERRORS must fail
# here)
CAPACITY_CODES = [
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "SpotMaxPriceTooLow",
    "InsufficientFreeAddressesInSubnet",
]


@pytest.mark.parametrize("code", CAPACITY_CODES)
def test_a_200_with_errors_and_no_instances_falls_back_to_the_next_choice(code):
    client, stub = stubbed()
    expect_fleet(stub, CHOICES, fleet_error(code, "g5.xlarge", "subnet-a"))
    expect_fleet(stub, CHOICES[1:], fleet_ok("g5.xlarge", "subnet-b"))
    expect_cleanup(stub)
    blocklist = fleet.Blocklist()
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "#cloud-config\n", CHOICES, ["spot"], [], blocklist)
    stub.assert_no_pending_responses()
    assert (got.instance_type, got.az, got.market) == ("g5.xlarge", "us-east-1b", "spot")
    assert blocklist.allowed(CHOICES, "spot") == CHOICES[1:]  # (g5, us-east-1a) stays blocked for a while
    assert blocklist.allowed(CHOICES, "on-demand") == CHOICES  # on-demand capacity was never asked


def test_an_unsupported_pool_is_a_configuration_error_never_asked_again_not_capacity_retried_forever():
    """`Unsupported` for one pool: the next pool is asked and that one never again (in either market); once every
    pool was refused so, the run's attempt fails with AWS's words at once, with no API call and no "will retry"."""
    client, stub = stubbed()
    unsupported = fleet_error("Unsupported", "g5.xlarge", "subnet-a")
    unsupported["Errors"][0]["ErrorMessage"] = "The requested configuration is currently not supported."
    expect_fleet(stub, CHOICES, unsupported)
    expect_fleet(stub, CHOICES[1:], fleet_ok("g5.xlarge", "subnet-b"))
    expect_cleanup(stub)
    blocklist = fleet.Blocklist()
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "#cloud-config\n", CHOICES, ["spot"], [], blocklist)
    stub.assert_no_pending_responses()
    assert (got.instance_type, got.az) == ("g5.xlarge", "us-east-1b")
    for market in ("spot", "on-demand"):
        assert CHOICES[0] not in blocklist.allowed(CHOICES, market)
    client, stub = stubbed()
    for c in CHOICES[1:]:
        one = fleet_error("Unsupported", c.instance_type, c.subnet_id)
        one["Errors"][0]["ErrorMessage"] = "The requested configuration is currently not supported."
        expect_fleet(stub, [x for x in CHOICES[CHOICES.index(c) :] if x != CHOICES[0]], one)
    expect_cleanup(stub)
    with stub, pytest.raises(Exception) as err:
        fleet.acquire(client, "lt-1", BASE, "#cloud-config\n", CHOICES, ["spot"], [], blocklist)
    stub.assert_no_pending_responses()
    assert not isinstance(err.value, fleet.CapacityUnavailable) and "not supported" in str(err.value), err.value
    assert "aws:" in str(err.value)


def test_insufficient_capacity_exception_for_one_choice_falls_back():
    client, stub = stubbed()
    stub.add_client_error("create_fleet", "InsufficientInstanceCapacity", "no g5 in 1a")
    expect_fleet(stub, CHOICES[1:], fleet_ok("g6.xlarge", "subnet-a"))
    expect_cleanup(stub)
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", CHOICES, ["spot"], [], fleet.Blocklist())
    assert got.instance_type == "g6.xlarge"


def test_spot_then_on_demand_when_spot_is_exhausted():
    """(d) capacity blocks are per market: a spot refusal says nothing about on-demand capacity."""
    client, stub = stubbed()
    one = CHOICES[:1]
    expect_fleet(stub, one, fleet_error("UnfulfillableCapacity", "g5.xlarge", "subnet-a"))
    expect_version(stub, 8, "on-demand")
    expect_fleet(
        stub,
        one,
        fleet_ok("g5.xlarge", "subnet-a")
        | {"Instances": [{**fleet_ok("g5.xlarge", "subnet-a")["Instances"][0], "Lifecycle": "on-demand"}]},
        market="on-demand",
        version="8",
    )
    expect_cleanup(stub, ("7", "8"))
    blocklist = fleet.Blocklist()
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", one, ["spot", "on-demand"], [], blocklist)
    stub.assert_no_pending_responses()
    assert got.market == "on-demand"
    # spot stays blocked for a while, without an API call
    with pytest.raises(fleet.CapacityUnavailable):
        fleet.acquire(client, "lt-1", BASE, "x", one, ["spot"], [], blocklist)


@pytest.mark.parametrize(
    "code, words", [("VcpuLimitExceeded", "quota reached"), ("UnauthorizedOperation", "permission denied")]
)
def test_quota_and_permission_fail_fast_with_the_next_step(code, words):
    client, stub = stubbed()
    expect_fleet(stub, CHOICES, fleet_error(code, "g5.xlarge", "subnet-a"))
    expect_cleanup(stub)
    with stub, pytest.raises(api.AwsFatal) as info:
        fleet.acquire(client, "lt-1", BASE, "x", CHOICES, ["spot"], [], fleet.Blocklist())
    assert words in str(info.value)
    stub.assert_no_pending_responses()  # no second CreateFleet


def test_quota_as_an_exception_also_fails_fast():
    client, stub = stubbed()
    stub.add_client_error("create_fleet", "VcpuLimitExceeded", "You have requested more vCPU capacity")
    expect_cleanup(stub)
    with stub, pytest.raises(api.AwsFatal, match="Service Quotas"):
        fleet.acquire(client, "lt-1", BASE, "x", CHOICES, ["spot"], [], fleet.Blocklist())


def test_nodes_come_from_one_pool_all_at_once_and_a_partial_fill_is_released():
    """A pool that gives fewer than the run's nodes (EC2 should not, under MinTargetCapacity): those
    are terminated at once, the pool is blocked, and the next pool is asked for all of them."""
    client, stub = stubbed()
    together = {"MinTargetCapacity": 2, "SingleInstanceType": True, "SingleAvailabilityZone": True}

    def expect(choice, ids):
        answer = {
            "FleetId": "fleet-1",
            "Instances": [
                {
                    "InstanceIds": ids,
                    "InstanceType": choice.instance_type,
                    "Lifecycle": "spot",
                    "LaunchTemplateAndOverrides": {
                        "Overrides": {"InstanceType": choice.instance_type, "SubnetId": choice.subnet_id}
                    },
                }
            ],
        }
        stub.add_response(
            "create_fleet",
            answer,
            {
                "Type": "instant",
                "ClientToken": ANY,
                "TargetCapacitySpecification": {"TotalTargetCapacity": 2, "DefaultTargetCapacityType": "spot"},
                "SpotOptions": {"AllocationStrategy": "price-capacity-optimized", **together},
                "OnDemandOptions": {
                    "AllocationStrategy": "lowest-price"
                },  # MinTargetCapacity only for the market asked
                "LaunchTemplateConfigs": [
                    {
                        "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-1", "Version": "7"},
                        "Overrides": [
                            {
                                "InstanceType": choice.instance_type,
                                "SubnetId": choice.subnet_id,
                                "Placement": {"GroupName": f"pg-{choice.az}"},
                            }
                        ],
                    }
                ],
                "TagSpecifications": ANY,
            },
        )

    expect(CHOICES[0], ["i-1"])  # one of two
    expect(CHOICES[1], ["i-3", "i-2"])
    expect_cleanup(stub)
    released, blocklist = [], fleet.Blocklist()
    with stub:
        got = fleet.acquire_nodes(
            client,
            "lt-1",
            BASE,
            "x",
            CHOICES,
            ["spot"],
            [],
            blocklist,
            count=2,
            group_of=lambda az: f"pg-{az}",
            release=released.extend,
        )
    stub.assert_no_pending_responses()
    assert released == ["i-1"] and sorted(g.instance_id for g in got) == ["i-2", "i-3"]
    assert {(g.instance_type, g.az) for g in got} == {("g5.xlarge", "us-east-1b")}
    assert CHOICES[0] not in blocklist.allowed(CHOICES, "spot")


# --- security settings, on moto --------------------------------------------------------------------


def test_security_group_launch_template_and_instance_profile(cloud):
    ec2, iam = cloud.client("ec2"), cloud.client("iam")
    sg = groups.ensure_security_group(ec2, "sec", cloud.vpc, "203.0.113.7/32")
    assert groups.ensure_security_group(ec2, "sec", cloud.vpc, "203.0.113.7/32") == sg  # idempotent
    perms = sorted(
        ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"], key=lambda p: p["IpProtocol"]
    )
    own = [{"Description": "orch: the sweep's own instances", "UserId": "123456789012", "GroupId": sg}]
    # ssh from the controller's address only, and anything between the sweep's own instances (multi-node rendezvous)
    assert perms == [
        {"IpProtocol": "-1", "IpRanges": [], "Ipv6Ranges": [], "PrefixListIds": [], "UserIdGroupPairs": own},
        {
            "FromPort": 22,
            "ToPort": 22,
            "IpProtocol": "tcp",
            "IpRanges": [{"CidrIp": "203.0.113.7/32", "Description": "orch controller"}],
            "Ipv6Ranges": [],
            "PrefixListIds": [],
            "UserIdGroupPairs": [],
        },
    ]

    profile = iam_api.ensure_instance_profile(iam, "sec", "bucket", "team/orch")
    policy = iam.get_role_policy(RoleName=profile, PolicyName="orch-sweep")["PolicyDocument"]
    policy = policy if isinstance(policy, dict) else json.loads(policy)
    objects, listing, terminate, untag = policy["Statement"]
    assert objects["Resource"] == ["arn:aws:s3:::bucket/team/orch/sec/*"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["team/orch/sec/*"]}}
    itself = {"ArnLike": {"ec2:SourceInstanceARN": "arn:aws:ec2:*:*:instance/${ec2:InstanceID}"}}
    assert terminate["Action"] == ["ec2:TerminateInstances"] and terminate["Condition"] == {
        "StringEquals": {"aws:ResourceTag/orch:sweep": "sec"},
        **itself,
    }
    assert untag["Action"] == ["ec2:DeleteTags"] and untag["Condition"] == {
        **itself,
        "StringEquals": {"aws:ResourceTag/orch:sweep": "sec"},
        "ForAllValues:StringLike": {"aws:TagKeys": ["orch:slot:*", "orch:rung:*"]},
        "Null": {"aws:TagKeys": "false"},
    }

    image = resolve_image(ec2, cloud.image, "self", "us-east-1")
    lt = api.ensure_launch_template(ec2, "sec", api.launch_template_data(image, sg, 50, profile, public_ip=False))
    data = api.template_data(ec2, lt)
    assert (
        data["MetadataOptions"]["HttpTokens"] == "required" and data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    )
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert all(b["Ebs"]["DeleteOnTermination"] for b in data["BlockDeviceMappings"])
    assert "UserData" not in data  # the host keys live only in short-lived per-instance versions

    removed = teardown(ec2, iam, "sec")
    assert lt in removed and sg in removed and "instance-profile/orch-sec" in removed
    assert not any(cloud.leftovers("sec").values())
    assert teardown(ec2, iam, "sec") == []


def test_a_reclaimed_pool_is_avoided_but_not_refused():
    blocklist = fleet.Blocklist()
    for c in CHOICES[:2]:
        blocklist.avoid(c.instance_type, c.subnet_id)
    assert blocklist.allowed(CHOICES, "spot") == CHOICES[2:]
    blocklist.avoid(CHOICES[2].instance_type, CHOICES[2].subnet_id)
    assert blocklist.allowed(CHOICES, "spot") == CHOICES  # all avoided: all still worth a try
    blocklist.block("spot", CHOICES[0].instance_type, CHOICES[0].subnet_id)
    assert blocklist.allowed(CHOICES, "spot") == CHOICES[1:]  # a capacity error is a hard no


def test_a_fresh_profiles_capacity_error_blocks_no_pool():
    # A real answer for a profile IAM has not propagated yet (karpenter-provider-aws issue 3051): the propagation error
    # *and* UnfulfillableCapacity. The capacity error is the profile's: no pool may be blocked for it.
    client, stub = stubbed()
    profile = {
        "ErrorCode": "InvalidParameterValue",
        "ErrorMessage": "Value (orch-x) for parameter iamInstanceProfile.name is invalid. "
        "Invalid IAM Instance Profile name",
        "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-a"}},
    }
    capacity = {
        "ErrorCode": "UnfulfillableCapacity",
        "ErrorMessage": "Unable to fulfill capacity due to your request configuration.",
        "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-a"}},
    }
    expect_fleet(stub, CHOICES, {"FleetId": "fleet-1", "Instances": [], "Errors": [profile, capacity]})
    expect_fleet(stub, CHOICES, fleet_ok("g5.xlarge", "subnet-a"))
    expect_cleanup(stub)
    blocklist, slept = fleet.Blocklist(), []
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", CHOICES, ["spot"], [], blocklist, sleep=slept.append)
    stub.assert_no_pending_responses()
    assert got.instance_type == "g5.xlarge" and slept  # asked again after a pause, for the same pools
    assert blocklist.allowed(CHOICES, "spot") == CHOICES


def test_one_fleet_request_names_one_subnet_per_az():
    # EC2 Fleet quotas: "An EC2 Fleet request can't span different subnets from the same Availability Zone"
    two_in_1a = [
        fleet.Choice("g5.xlarge", "subnet-a", "us-east-1a"),
        fleet.Choice("g5.xlarge", "subnet-a2", "us-east-1a"),
        fleet.Choice("g5.xlarge", "subnet-b", "us-east-1b"),
    ]
    client, stub = stubbed()
    expect_fleet(
        stub, [two_in_1a[0], two_in_1a[2]], fleet_error("InsufficientInstanceCapacity", "g5.xlarge", "subnet-a")
    )
    expect_fleet(
        stub, [two_in_1a[1], two_in_1a[2]], fleet_ok("g5.xlarge", "subnet-a2")
    )  # the AZ's next subnet, once the first is blocked
    expect_cleanup(stub)
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", two_in_1a, ["spot"], [], fleet.Blocklist())
    stub.assert_no_pending_responses()
    assert got.subnet_id == "subnet-a2"


@pytest.mark.parametrize(
    "code, message",
    [
        ("InvalidPlacementGroup.Unknown", "The Placement Group 'orch-x-us-east-1a' is unknown."),
        ("InvalidGroup.NotFound", "The security group 'sg-0123' does not exist"),
    ],
)
def test_a_new_group_not_yet_visible_is_asked_again_not_fatal(code, message):
    client, stub = stubbed()
    err = {
        "ErrorCode": code,
        "ErrorMessage": message,
        "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-a"}},
    }
    expect_fleet(stub, CHOICES, {"FleetId": "fleet-1", "Instances": [], "Errors": [err]})
    expect_fleet(stub, CHOICES, fleet_ok("g5.xlarge", "subnet-a"))
    expect_cleanup(stub)
    slept, blocklist = [], fleet.Blocklist()
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", CHOICES, ["spot"], [], blocklist, sleep=slept.append)
    assert got.subnet_id == "subnet-a" and slept and blocklist.allowed(CHOICES, "spot") == CHOICES


def test_a_spot_quota_still_tries_on_demand_and_then_says_quota():
    client, stub = stubbed()
    one = CHOICES[:1]
    expect_fleet(stub, one, fleet_error("MaxSpotInstanceCountExceeded", "g5.xlarge", "subnet-a"))
    expect_version(stub, 8, "on-demand")
    expect_fleet(
        stub,
        one,
        {
            "FleetId": "fleet-2",
            "Instances": [
                {
                    "InstanceIds": ["i-0123456789abcdef1"],
                    "InstanceType": "g5.xlarge",
                    "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-a"}},
                    "Lifecycle": "on-demand",
                }
            ],
        },
        market="on-demand",
        version="8",
    )
    expect_cleanup(stub, ("7", "8"))
    blocklist = fleet.Blocklist()
    with stub:
        got = fleet.acquire(client, "lt-1", BASE, "x", one, ["spot", "on-demand"], [], blocklist)
    assert got.market == "on-demand"  # the quota of one market is no reason not to ask the other
    with pytest.raises(fleet.CapacityUnavailable, match="waiting for quota"):  # asked again soon, without an API call
        fleet.acquire(client, "lt-1", BASE, "x", one, ["spot"], [], blocklist)


# --- pools an AZ does not offer, on the fake cloud ---------------------------------------------------


def test_a_pool_the_az_does_not_offer_is_skipped_and_a_multi_node_run_gets_the_next(cloud):
    """EC2 does not offer every type in every AZ. DescribeInstanceTypeOfferings leaves such a pool out before any
    CreateFleet; and where CreateFleet is asked for it anyway, its `InvalidFleetConfiguration` ("not supported in
    your requested Availability Zone") blocks that pool for the sweep and the next one is asked, never fatal."""
    from orchestrator.backends.aws.cloud.placement import ensure_group

    ec2 = api.client("ec2", "us-east-1")  # the controller's own credentials: the documented policy is checked
    cloud.gate.unoffered = {("g5.xlarge", "us-east-1a")}
    subnets = api.resolve_subnets(ec2, [], "us-east-1")
    offered = fleet.offered_choices(ec2, ["g5.xlarge"], subnets, "us-east-1")
    assert [(c.instance_type, c.az) for c in offered] == [("g5.xlarge", "us-east-1b")]
    cloud.gate.unoffered = {("*", "*")}
    with pytest.raises(api.AwsFatal, match="offered"):
        fleet.offered_choices(ec2, ["g5.xlarge"], subnets, "us-east-1")
    cloud.gate.unoffered = {("g5.xlarge", "us-east-1a")}

    sg = groups.ensure_security_group(ec2, "offer", subnets[0]["VpcId"], "127.0.0.1/32")
    image = resolve_image(ec2, cloud.image, "self", "us-east-1")
    data = api.launch_template_data(image, sg, 50, None, public_ip=False)
    lt = api.ensure_launch_template(ec2, "offer", data)
    every = sorted(fleet.choices(["g5.xlarge"], subnets), key=lambda c: c.az)  # 1a (not offered) first
    blocklist, placed = fleet.Blocklist(), {}
    try:
        got = fleet.acquire_nodes(
            ec2,
            lt,
            data,
            "#cloud-config\n",
            every,
            ["spot"],
            api.sweep_tags("offer"),
            blocklist,
            count=2,
            group_of=lambda az: ensure_group(ec2, "offer", az, placed),
            release=lambda ids: api.terminate(ec2, ids),
        )
        assert {g.az for g in got} == {"us-east-1b"} and len(got) == 2
        assert cloud.gate.counts["InvalidFleetConfiguration"] == 1
        assert every[0] not in blocklist.allowed(every, "spot") + blocklist.allowed(every, "on-demand")
        assert every[0].subnet_id not in {c.subnet_id for c in blocklist.allowed(every, "spot")}
    finally:
        teardown(ec2, api.client("iam", "us-east-1"), "offer")


def test_spot_prices_are_those_in_effect_now_and_on_demand_hours_have_their_published_price(cloud):
    """DescribeSpotPriceHistory lists the price in effect at StartTime only when EndTime is given too (the fake
    lists its last change 0-12 h ago, as EC2 may); an on-demand hour is priced even where a pool has no spot
    history, else the ledger counts it $0 and `budget_usd` never stops the sweep."""
    from orchestrator.backends.aws.cloud.pricing import ON_DEMAND_USD_PER_H, PriceBook
    from tests.fakecloud.gate import spot_price

    ec2 = api.client("ec2", "us-east-1")
    assert api.spot_prices(ec2, ["g5.xlarge"], ["us-east-1a"]) == {
        ("g5.xlarge", "us-east-1a"): spot_price("g5.xlarge", "us-east-1a")
    }
    cloud.gate.unoffered = {("p5.48xlarge", "us-east-1a")}  # a pool without any spot history
    book = PriceBook(lambda types, azs: api.spot_prices(ec2, types, azs))
    assert book.price("p5.48xlarge", "us-east-1a", "spot") is None
    assert book.price("p5.48xlarge", "us-east-1a", "on-demand") == ON_DEMAND_USD_PER_H["p5.48xlarge"]


def test_the_ledger_saved_at_the_end_is_the_spend_the_controller_printed(tmp_path):
    """Passes save the ledger only on a change or every 30 s; the loop's end saves the newest times too."""
    from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook, ledger_cost
    from orchestrator.store.base import get_json
    from orchestrator.store.folder import LocalStore
    from orchestrator.store.layout import cost_key

    store = LocalStore(str(tmp_path / "store"))
    ledger = CostLedger(store, "s", PriceBook(lambda types, azs: {("g5.xlarge", "us-east-1a"): 3600.0}))
    ledger.acquired("i-1", "g5.xlarge", "us-east-1a", "spot", run="r")
    ledger.observe(["i-1"])  # the instance is seen running: a change, saved
    time.sleep(0.05)  # a dollar a second: the next pass adds a visible amount
    ledger.observe(["i-1"])  # the same live set within 30 s: kept in memory only
    saved = ledger_cost(get_json(store, cost_key("s")))
    assert saved < ledger.spend()
    ledger.flush()
    assert ledger_cost(get_json(store, cost_key("s"))) == ledger.spend()


@pytest.mark.parametrize(
    "market, instance_type, quota",
    [
        ("spot", "g5.xlarge", "All G and VT Spot Instance Requests"),
        ("spot", "vt1.3xlarge", "All G and VT Spot Instance Requests"),
        ("spot", "p3.2xlarge", "All P4, P3 and P2 Spot Instance Requests"),
        ("spot", "p4d.24xlarge", "All P4, P3 and P2 Spot Instance Requests"),
        ("spot", "p5.48xlarge", "All P5 Spot Instance Requests"),
        ("spot", "p5en.48xlarge", "All P5 Spot Instance Requests"),
        ("spot", "dl1.24xlarge", "All DL Spot Instance Requests"),
        ("spot", "x2iedn.xlarge", "All X Spot Instance Requests"),
        ("spot", "f1.2xlarge", "All F Spot Instance Requests"),
        ("spot", "inf2.xlarge", "All Inf Spot Instance Requests"),
        ("spot", "trn1.2xlarge", "All Trn Spot Instance Requests"),
        ("spot", "c5.xlarge", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
        ("spot", "z1d.large", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
        ("on-demand", "p5.48xlarge", "Running On-Demand P instances"),
        ("on-demand", "x1e.xlarge", "Running On-Demand X instances"),
        ("on-demand", "g6.xlarge", "Running On-Demand G and VT instances"),
        ("on-demand", "hpc7g.4xlarge", "Running On-Demand HPC instances"),
    ],
)
def test_a_quota_error_names_the_quota_as_the_ec2_user_guide_names_it(market, instance_type, quota):
    """EC2 user guide, "Amazon EC2 instance type quotas": P5 apart from P4/P3/P2 for spot; DL, X and F are not
    Standard. The name a quota refusal gives is the one to look up in Service Quotas."""
    assert api.quota_name(market, instance_type) == quota
    from botocore.exceptions import ClientError

    refused = ClientError({"Error": {"Code": "VcpuLimitExceeded", "Message": "no"}}, "CreateFleet")
    assert f"'{quota}'" in str(api.explain(refused, "CreateFleet", market=market, instance_type=instance_type))


def test_the_spot_service_linked_role_refusal_is_a_permission_error_that_names_the_fix():
    """`AuthFailure.ServiceLinkedRoleCreationNotPermitted` in a fleet's Errors (an account that never launched spot,
    a caller without iam:CreateServiceLinkedRole): fatal at once, with the command that makes the role, not a
    generic refusal or a capacity wait."""
    client, stub = stubbed()
    refused = fleet_error("AuthFailure.ServiceLinkedRoleCreationNotPermitted", "g5.xlarge", "subnet-a")
    expect_fleet(stub, CHOICES, refused)
    expect_cleanup(stub)
    with stub, pytest.raises(api.AwsFatal) as err:
        fleet.acquire(client, "lt-1", BASE, "#cloud-config\n", CHOICES, ["spot"], [], fleet.Blocklist())
    assert "permission denied" in str(err.value) and "create-service-linked-role" in str(err.value), err.value
    assert "spot.amazonaws.com" in str(err.value)


def test_gc_and_teardown_read_every_page_of_each_describe():
    """EC2 pages DescribeLaunchTemplates and DescribeSecurityGroups: what sits past the first page is still orch's,
    and `orch gc` lists it (teardown reads the same pages)."""
    from orchestrator.backends.aws.cloud.teardown import orch_profiles, orch_resources

    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    iam = boto3.client("iam", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub, iam_stub = Stubber(ec2), Stubber(iam)
    stub.add_response("describe_instances", {"Reservations": []}, {"Filters": ANY})
    tagged = [{"Name": "tag-key", "Values": ["orch:sweep"]}]
    stub.add_response("describe_security_groups", {"SecurityGroups": [], "NextToken": "2"}, {"Filters": tagged})
    group = {"GroupId": "sg-2", "GroupName": "g", "Tags": [{"Key": "orch:sweep", "Value": "late"}]}
    stub.add_response("describe_security_groups", {"SecurityGroups": [group]}, {"Filters": tagged, "NextToken": "2"})
    stub.add_response("describe_placement_groups", {"PlacementGroups": []}, {"Filters": tagged})
    stub.add_response("describe_launch_templates", {"LaunchTemplates": [], "NextToken": "2"}, {"Filters": []})
    template = {"LaunchTemplateId": "lt-2", "LaunchTemplateName": "orch-late"}
    stub.add_response("describe_launch_templates", {"LaunchTemplates": [template]}, {"Filters": [], "NextToken": "2"})
    iam_stub.add_response("list_instance_profiles", {"InstanceProfiles": []}, {})
    with stub, iam_stub:
        found = orch_resources(ec2)
        profiles = orch_profiles(iam)
    stub.assert_no_pending_responses()
    iam_stub.assert_no_pending_responses()
    assert found == {"late": ["security-group sg-2", "launch-template lt-2"]} and profiles == {}, (found, profiles)


def test_a_remote_controllers_ssh_rule_replaces_those_of_controllers_no_longer_running(cloud):
    """Each `--remote` with public addresses opens port 22 to its controller's /32; the rules of controllers that are
    gone are revoked first (under the documented policy), so relaunches leave one rule per live controller, not a
    pile up to the group's limit, and a released address opens nothing for its next holder."""
    ec2 = api.client("ec2", "us-east-1")
    sg = groups.ensure_security_group(ec2, "rules", cloud.vpc, "127.0.0.1/32")
    for n, instance in enumerate(["i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"]):
        groups.allow_ssh_from(ec2, sg, f"198.51.100.{n}/32", instance, live=[])
    groups.allow_ssh_from(ec2, sg, "198.51.100.9/32", "i-0000000000000000d", live=["i-0000000000000000c"])
    rules = groups.controller_rules(ec2, sg)
    assert sorted(r["CidrIp"] for r in rules) == ["198.51.100.2/32", "198.51.100.9/32"], rules
    teardown(ec2, api.client("iam", "us-east-1"), "rules")


@pytest.mark.slow
def test_j_reused_group_gets_the_current_cidr_and_public_ip_is_asked_for(orch, cloud, identity):
    ec2 = cloud.client("ec2")
    sg = groups.ensure_security_group(ec2, "netw", cloud.vpc, "203.0.113.7/32")
    assert groups.ensure_security_group(ec2, "netw", cloud.vpc, "198.51.100.9/32") == sg
    groups.ensure_security_group(ec2, "netw", cloud.vpc, "198.51.100.9/32")  # a duplicate rule is fine
    cidrs = {
        r["CidrIp"]
        for p in ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]
        for r in p["IpRanges"]
    }
    assert cidrs == {"203.0.113.7/32", "198.51.100.9/32"}

    from orchestrator.backends.aws.backend import AwsBackend
    from orchestrator.backends.registry import load_sweep

    path = smoke(
        orch,
        identity,
        "netw",
        aws_ssh={"address": "public_ip", "identity": str(identity), "user": "root", "port": 2222},
    )
    backend = AwsBackend(load_sweep(path))
    try:
        setup = backend.bootstrap()  # the fake's subnets, like most custom VPCs', do not map public IPs
        nic = setup["base"]["NetworkInterfaces"][0]
        assert (
            nic["AssociatePublicIpAddress"] is True
            and nic["Groups"] == [sg]
            and "SecurityGroupIds" not in setup["base"]
        )
    finally:
        from orchestrator.backends.aws.cloud.teardown import teardown

        teardown(ec2, cloud.client("iam"), "netw")


def test_teardown_terminates_an_instance_of_the_sweep_that_appears_while_it_waits():
    """`orch down` lists the sweep's instances, terminates them and waits for them to go. One that shows up meanwhile
    (bought by a controller's CreateFleet in flight as it stopped, or not yet listed by EC2's eventually consistent
    DescribeInstances) is terminated too, not waited for until the 900 s limit while it runs and bills (seen in a
    fresh-clone run: `orch down` of a remote sweep hung in this wait, its worker instance running)."""

    def listed(*instances: tuple[str, str]) -> dict:
        return {
            "Reservations": [
                {"Instances": [{"InstanceId": iid, "State": {"Name": state}, "Tags": []} for iid, state in instances]}
            ]
            if instances
            else []
        }

    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(ec2)
    first, late = "i-0000000000000000a", "i-0000000000000000b"
    stub.add_response("describe_instances", listed((first, "running")), {"Filters": ANY})
    stub.add_response("terminate_instances", {}, {"InstanceIds": [first]})
    stub.add_response("describe_instances", listed((first, "shutting-down"), (late, "running")), {"Filters": ANY})
    stub.add_response("terminate_instances", {}, {"InstanceIds": [late]})
    stub.add_response("describe_instances", listed((first, "running")), {"Filters": ANY})  # (EC2: eventually)
    stub.add_response("describe_instances", listed(), {"Filters": ANY})
    stub.add_response("describe_launch_templates", {"LaunchTemplates": []}, {"Filters": ANY})
    stub.add_response("describe_security_groups", {"SecurityGroups": []}, {"Filters": ANY})
    stub.add_response("describe_placement_groups", {"PlacementGroups": []}, {"Filters": ANY})
    with stub:
        removed = teardown(ec2, None, "late", wait_s=60)
    stub.assert_no_pending_responses()
    assert removed == [first, late]  # and the first, listed `running` again by a lagging read, was not asked twice
