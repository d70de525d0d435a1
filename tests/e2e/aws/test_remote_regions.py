"""`orch launch --remote` over several regions (docs/guides/regions.md): the controller in the sweep's home region
(its store's bucket's, here a region the sweep does not list), its hosts in the listed regions, each with that
region's own security group, and `orch down` leaving nothing in any of them."""

from __future__ import annotations

import re

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.e2e.aws.test_regions import WEST, no_capacity, with_regions
from tests.e2e.aws.test_remote_launch import CONTROLLER
from tests.fakecloud import REGION

pytestmark = pytest.mark.slow

HOME = "eu-west-1"  # the store's bucket's region, listed nowhere in the sweep
EVERY = ("pending", "running", "shutting-down", "terminated")


@pytest.fixture
def clouds(tmp_path, orch):
    """A fake cloud with three regions: the sweep's two, and its bucket's."""
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST, HOME), bucket_region=HOME) as c:
        orch.env.update(c.env())
        yield c
        leaks = c.all_leftovers()
        assert not leaks, f"left behind: {leaks}"
        assert not c.gate.denied, f"the policy `orch aws policy` prints refused: {c.gate.denied}"
        assert not [d for d in c.gate.role_denied if d[0].endswith(".controller")], c.gate.role_denied


def split(cloud, sweep: str) -> tuple[list[dict], list[dict]]:
    """(controller instances, host instances) of the sweep in every region, in any state."""
    found = cloud.instances(sweep, states=EVERY)
    ctl = [i for i in found if i["tags"].get("orch:role") == "controller"]
    return ctl, [i for i in found if i not in ctl]


@pytest.mark.timeout(1200)
def test_a_remote_controller_runs_in_the_home_region_and_its_hosts_in_the_listed_ones(orch, clouds, identity, job):
    no_capacity(clouds, REGION)  # every pool of the first region refuses: the hosts go to the second
    extra = "grid:\n  a: [1, 2]\nmax_parallel: 2\nmax_restarts: 0"
    text = clouds.sweep_yaml("homed", identity, job(steps=3), extra=extra, controller=CONTROLLER)
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))

    dry = orch("launch", str(path), "--dry-run", "--remote")
    assert dry.code == 0, dry.out + dry.err
    [line] = [x for x in dry.out.splitlines() if x.startswith("controller:")]
    assert f"it runs in the home region {HOME}" in line, line

    r = orch("launch", str(path), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    [ctl], _ = split(clouds, "homed")
    assert ctl["region"] == HOME, ctl  # DescribeInstances in the home region finds it
    assert not clouds.instances("homed", region=REGION) and f"({'t3.micro'}, {HOME})" in r.out, r.out
    assert f"instance {ctl['id']} (t3.micro, {HOME})" in orch("status", "homed").out

    retry_until(
        lambda: [v["state"] for v in status(orch, "homed", gap=ENDED_GAP_S).values()] == ["succeeded"] * 2,
        400,
        1.0,
        "both runs to succeed on the remote controller",
    )
    _, hosts = split(clouds, "homed")
    assert hosts and {i["region"] for i in hosts} == {WEST}, hosts  # refused in us-east-1, bought in us-west-2
    assert clouds.gate.counts["InsufficientInstanceCapacity"] >= 2, clouds.gate.counts
    west = clouds.client("ec2", WEST)  # each host has its own region's group of the sweep (not the first region's)
    [group] = west.describe_security_groups(Filters=[{"Name": "tag:orch:sweep", "Values": ["homed"]}])["SecurityGroups"]
    had = [clouds.gate.groups_of[h["id"]] for h in hosts]  # as launched (moto's fleets show the VPC's default group)
    assert had == [[group["GroupId"]]] * len(hosts), had
    retry_until(lambda: not clouds.instances("homed"), 180, 1.0, "the controller to terminate its own instance")

    down = orch("down", "homed")
    assert down.code == 0, down.out + down.err
    for region in (REGION, WEST, HOME):
        assert not any(clouds.leftovers("homed", region).values()), (region, clouds.leftovers("homed", region))


def test_a_security_group_of_another_region_than_the_buckets_is_refused_with_remote(orch, clouds, identity, job):
    """`aws.security_group` names a group of the sweep's region; the remote controller would run in the bucket's:
    refused (exit 2, the field and the fix named), no instance bought."""
    ec2 = clouds.client("ec2", REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    sg = ec2.create_security_group(GroupName="mine", Description="a user's", VpcId=vpc)["GroupId"]
    text = clouds.sweep_yaml("grouped", identity, job(steps=1), controller=CONTROLLER)
    path = orch.sweep(text.replace("aws:\n", f"aws:\n  security_group: {sg}\n", 1))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "security_group:" in text)
    for dry in (["--dry-run"], []):  # the dry run refuses what the launch refuses
        r = orch("launch", str(path), "--remote", *dry, timeout=200)
        assert r.code == 2 and "Traceback" not in r.out + r.err, (dry, r.out + r.err)
        assert f"{path}:{line}: aws.security_group: {sg} is a group of {REGION}" in r.err and HOME in r.err, r.err
    assert not clouds.instances("grouped", states=EVERY)
    made = {region: clouds.leftovers("grouped", region) for region in (REGION, WEST, HOME)}
    assert not any(any(left.values()) for left in made.values()), made  # nothing made
    assert "grouped" not in orch("status").out  # and no sweep recorded
    assert orch("down", str(path)).code == 0
    ec2.delete_security_group(GroupId=sg)


@pytest.fixture
def west_store(tmp_path, orch):
    """A fake cloud with two regions whose store's bucket is in the second (us-west-2): the sweep's home is not the
    region it lists first."""
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST), bucket_region=WEST) as c:
        orch.env.update(c.env())
        yield c
        leaks = c.all_leftovers()
        assert not leaks, f"left behind: {leaks}"
        assert not c.gate.denied and not c.gate.role_denied, (c.gate.denied, c.gate.role_denied)


@pytest.mark.timeout(1200)
def test_a_remote_controller_charges_transfer_to_the_run_outside_the_stores_region(
    orch, west_store, identity, job, tmp_path
):
    """The remote controller's ledger knows the home region as the laptop's does (the store's bucket's, not the first
    listed region): the run bought in us-east-1 pays for what it moved to the store in us-west-2, the run bought in
    us-west-2 pays nothing."""
    import csv

    west_store.gate.region_capacity[REGION] = 1  # one run in the first listed region, the other in the store's
    extra = "grid:\n  a: [1, 2]\nmax_parallel: 2\nmax_restarts: 0"
    blob = "head -c 40000000 /dev/zero > $ORCH_RUN_DIR/blob && "  # bytes enough to show in runs.csv (4 decimals)
    text = west_store.sweep_yaml("billed", identity, blob + job(steps=3), extra=extra, controller=CONTROLLER)
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    r = orch("launch", str(path), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    retry_until(
        lambda: [v["state"] for v in status(orch, "billed", gap=ENDED_GAP_S).values()] == ["succeeded"] * 2,
        400,
        1.0,
        "both runs to succeed on the remote controller",
    )
    retry_until(lambda: not west_store.instances("billed"), 180, 1.0, "the controller to terminate its own instance")
    hosts = {i["tags"]["orch:run"]: i["region"] for i in split(west_store, "billed")[1]}
    assert sorted(hosts.values()) == [REGION, WEST], hosts
    c = orch("collect", str(path), "--out", str(tmp_path / "out"), "--wide")
    assert c.code == 0, c.out + c.err
    rows = {row["run_id"]: row for row in csv.DictReader(open(tmp_path / "out" / "runs.csv"))}
    away, home = (next(run for run, region in hosts.items() if region == r) for r in (REGION, WEST))
    # what the hosts moved is in the ranking too: the pools outside the store's region carry its transfer per hour
    pools = [line for line in orch("launch", str(path), "--dry-run").out.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert pools and all(("/h transfer" in line) == (f" in {REGION}" in line) for line in pools), pools
    assert orch("down", "billed").code == 0
    paid = {run: (rows[run]["region"], rows[run]["transfer_gb"], rows[run]["transfer_usd"]) for run in (away, home)}
    assert float(paid[away][1]) > 0 and float(paid[away][2]) > 0, paid  # it crossed regions
    assert float(paid[home][1]) == float(paid[home][2]) == 0.0, paid  # it ran beside the store
